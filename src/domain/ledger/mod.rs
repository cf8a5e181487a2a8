//! The evidence ledger: what a summarized range did (files, commands, errors, user asks,
//! sub-agents), derived from its nodes so a summary never loses it.
//!
//! [`Ledger::derive`] reads tool calls and results generically: tool names are split into
//! lowercase words (`NotebookEdit` → `notebook edit`, `str_replace_editor` → `str replace
//! editor`) and matched against verbs, arguments are read by common keys, so Claude Code,
//! SWE-agent, OpenAI-style and MCP tools are all covered without a table of names.
//!
//! [`Ledger::render`] writes the text shown after a summary:
//!
//! ```text
//! [Evidence kept from the summarized range]
//! Files modified (3):
//!   README.md (Edit)
//!   src/render/{mod.rs (Edit ×2), tiers.rs (Write)}
//! Files read (2):
//!   /testbed/astropy/io/fits/{card.py (Read), header.py (Read+Grep ×3)}
//! Commands (14, 12 shown):
//!   cargo build
//!   cargo test → exit 101
//!   +2 more
//!   …the newest ten…
//! Errors (1):
//!   Bash: error[E0425]: cannot find value `x` in this scope
//! User requests (1):
//!   "fix the failing test in card.py"
//! Sub-agents (1):
//!   Task: explore the repo → Found 3 call sites
//! ```
//!
//! File entries are brace groups over a directory tree (`a/{b, c/{d, e}}` names `a/b`, `a/c/d`
//! and `a/c/e`), each leaf optionally followed by ` (tools ×count)`. Every path is always
//! written, whatever the budget; [`paths_in`] reads them back. That inverse is exact for paths
//! without line breaks, commas, braces or parentheses (the group syntax); other paths are still
//! written, but may not read back as they were.

mod commands;
mod derive;
mod errors;
mod paths;
#[cfg(test)]
mod tests;
mod text;
mod tools;

use serde::{Deserialize, Serialize};

use super::Node;
use derive::{Deriver, merge_files};

pub use paths::normalize;
pub use text::paths_in;

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ledger {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_read: Vec<FileUse>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_modified: Vec<FileUse>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<Command>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ErrorLine>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_requests: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<FunctionUse>,
}

/// A file the range read or modified.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FileUse {
    /// Normalised lexically (see [`normalize`]).
    pub path: String,
    /// The distinct tools that used it, in first-use order.
    pub tools: Vec<String>,
    /// How many uses.
    pub count: u32,
}

/// A shell command the range ran.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Command {
    /// Its first non-empty line, bounded.
    pub command: String,
    /// As its result states it, when it does.
    pub exit_code: Option<i32>,
    pub is_error: bool,
}

/// A failed tool or function, by its most telling line.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ErrorLine {
    pub tool: String,
    pub line: String,
}

/// A sub-agent (function) the range called.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FunctionUse {
    pub name: String,
    /// The first line of its input.
    pub input: String,
    /// The first line of its output; empty when no result is among the nodes.
    pub output: String,
    pub is_error: bool,
}

/// Bounds, in characters, of the lines the ledger keeps.
const COMMAND_CHARS: usize = 200;
const ERROR_CHARS: usize = 200;
const FUNCTION_CHARS: usize = 200;
const REQUEST_CHARS: usize = 300;
/// Lines of an error result searched for its telling line: tracebacks end late, but a
/// multi-megabyte log must not cost a scan per render.
const ERROR_SCAN_LINES: usize = 500;

const HEADER: &str = "[Evidence kept from the summarized range]";
const MODIFIED_TITLE: &str = "Files modified";
const READ_TITLE: &str = "Files read";

impl Ledger {
    /// Derives the ledger of `nodes`, given in path order (oldest first). Deterministic: the
    /// same nodes give the same ledger.
    pub fn derive<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Ledger {
        let mut d = Deriver::default();
        for node in nodes {
            d.node(&node.content);
        }
        d.ledger
    }

    /// Appends `newer`'s evidence after this (older) ledger's: files merged by path (tools
    /// unioned in order, counts summed), other lists concatenated. `merge(derive(a),
    /// derive(b))` equals `derive(a ++ b)` except for pairing across the boundary (a call in
    /// `a` and its result in `b`).
    pub fn merge(&mut self, newer: Ledger) {
        merge_files(&mut self.files_read, newer.files_read);
        merge_files(&mut self.files_modified, newer.files_modified);
        self.commands.extend(newer.commands);
        self.errors.extend(newer.errors);
        self.user_requests.extend(newer.user_requests);
        self.functions.extend(newer.functions);
    }

    pub fn is_empty(&self) -> bool {
        self.files_read.is_empty()
            && self.files_modified.is_empty()
            && self.commands.is_empty()
            && self.errors.is_empty()
            && self.user_requests.is_empty()
            && self.functions.is_empty()
    }

    /// Every file path read or modified, deduplicated, sorted.
    pub fn paths(&self) -> Vec<&str> {
        let mut paths: Vec<&str> = self
            .files_read
            .iter()
            .chain(&self.files_modified)
            .map(|f| f.path.as_str())
            .collect();
        paths.sort_unstable();
        paths.dedup();
        paths
    }
}
