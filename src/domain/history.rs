//! A history to write in one go: nodes in chain order, with function scopes and summaries.
//!
//! Importers produce it (`crate::import`); the store writes it whole (`Store::import`).

use super::NodeContent;

/// One step of an import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A node on the main branch (`scope: None`) or inside the function opened by op `scope`.
    Node {
        scope: Option<usize>,
        content: NodeContent,
        line: usize,
    },
    /// A summary over every top-level node before it (an imported compaction).
    Summary { text: String, line: usize },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    pub warnings: Vec<String>,
}

impl History {
    pub fn nodes(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op, Op::Node { .. }))
            .count()
    }

    pub fn functions(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| {
                matches!(
                    op,
                    Op::Node {
                        content: NodeContent::FunctionCall { .. },
                        ..
                    }
                )
            })
            .count()
    }

    pub fn summaries(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op, Op::Summary { .. }))
            .count()
    }
}
