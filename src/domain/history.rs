//! A history to write in one go: nodes in chain order, with function scopes and summaries.
//!
//! Importers produce it (`crate::import`); the store writes it whole (`Store::import`). The
//! other way, the store reads a session whole (`Store::snapshot`) and exporters write it out. A
//! linear history (a transcript) is a run of `Node` and `Summary` ops on `main`; a whole
//! session (ctxd JSONL) adds `Fork` (top-level nodes continue from any earlier node),
//! `Overlay` (a summary with all its fields), `Pin` and `Branch`.

use std::sync::Arc;

use super::{BranchName, Ledger, Node, NodeContent, NodeId, Session, Summary, SummaryKind};

/// One step of an import. `usize` fields name earlier ops of the same plan.
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
    /// The top-level nodes that follow continue from node op `from` (`None`: a new root)
    /// instead of the previous top-level node.
    Fork { from: Option<usize>, line: usize },
    /// A summary exactly as stored elsewhere: its covered nodes, range and base head are node
    /// ops, the summaries it rolls over earlier `Overlay` ops.
    Overlay {
        overlay: Box<ImportedOverlay>,
        line: usize,
    },
    /// Node op `node` is pinned.
    Pin { node: usize, line: usize },
    /// After every node: branch `name` points at node op `head`. A plan with any `Branch` op
    /// has exactly those branches (`main` only if named).
    Branch {
        name: BranchName,
        head: Option<usize>,
        line: usize,
    },
}

/// An exported summary's fields, with ids replaced by op indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedOverlay {
    pub kind: SummaryKind,
    pub covers: Vec<usize>,
    pub range: Option<(usize, usize)>,
    pub text: String,
    pub rolls_over: Vec<usize>,
    pub ledger: Option<Ledger>,
    pub model: String,
    pub base_head: usize,
    pub tokens_before: u32,
    pub tokens_after: u32,
    pub created_at_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    /// Session metadata the file carries (ctxd JSONL); the request's own metadata wins.
    pub metadata: std::collections::BTreeMap<String, String>,
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
            .filter(|op| matches!(op, Op::Summary { .. } | Op::Overlay { .. }))
            .count()
    }
}

/// A session as of one set of branch heads.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its metadata, and the branches with the heads the snapshot is consistent at.
    pub session: Session,
    /// Every node the heads reach, each after its parent and its function's call, and every
    /// function's chain before the result that closes it.
    pub nodes: Vec<Arc<Node>>,
    /// The summaries over exported nodes only, oldest first (the order they apply in).
    pub summaries: Vec<Summary>,
    /// The exported nodes that are pinned, in pin order.
    pub pinned: Vec<NodeId>,
    /// What was read but left out, and why.
    pub warnings: Vec<String>,
}
