//! The evidence ledger: what a summarized range did (files, commands, errors, user asks,
//! sub-agents), derived from its nodes so a summary never loses it.

use serde::{Deserialize, Serialize};

use super::Node;

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

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FileUse {
    pub path: String,
    pub tools: Vec<String>,
    pub count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Command {
    pub command: String,
    pub exit_code: Option<i32>,
    pub is_error: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ErrorLine {
    pub tool: String,
    pub line: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FunctionUse {
    pub name: String,
    pub input: String,
    pub output: String,
    pub is_error: bool,
}

impl Ledger {
    pub fn derive<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Ledger {
        let _ = nodes.into_iter().count();
        Ledger::default()
    }

    pub fn merge(&mut self, newer: Ledger) {
        self.files_read.extend(newer.files_read);
        self.files_modified.extend(newer.files_modified);
        self.commands.extend(newer.commands);
        self.errors.extend(newer.errors);
        self.user_requests.extend(newer.user_requests);
        self.functions.extend(newer.functions);
    }

    pub fn is_empty(&self) -> bool {
        *self == Ledger::default()
    }

    pub fn paths(&self) -> Vec<&str> {
        let mut p: Vec<&str> = self
            .files_read
            .iter()
            .chain(&self.files_modified)
            .map(|f| f.path.as_str())
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    }
}
