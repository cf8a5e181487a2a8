//! Deriving a ledger from nodes: one pass pairs each tool call with its result and records what
//! the pair did. What a call or a result says is read generically by `tools`, `paths`,
//! `commands` and `errors`; the rules for each tool style (editors, shells, patches, SWE-agent
//! commands, results naming a file) meet here, where the pairing is.

use std::collections::HashMap;

use serde_json::Value;

use super::REQUEST_CHARS;
use super::commands::{Aci, aci, exit_code, shell_command};
use super::errors::error_line;
use super::paths::{FILE_KEYS, SEARCH_KEYS, editor_command, normalize, opened_path};
use super::paths::{patch_paths, path_values, resolve, result_paths};
use super::tools::{Class, agent_input, classify, is_agent, top_strings, words};
use super::{COMMAND_CHARS, Command, ErrorLine, FUNCTION_CHARS, FileUse, FunctionUse, Ledger};
use crate::domain::{FunctionStatus, NodeContent, Part, Role, ToolCall};

/// What a call left to its result.
struct Pending {
    tool: String,
    /// Index of its command in `commands`.
    command: Option<usize>,
    /// Paths its arguments named, so a result naming one again is not a second use.
    touched: Vec<String>,
    /// Relative paths its arguments named: moved to the absolute path the result shows, if
    /// it shows one.
    relative: Vec<(Use, String)>,
    /// It modifies a file its arguments do not name (SWE-agent's `edit`): the result names it.
    path_from_result: bool,
}

#[derive(Default)]
pub(super) struct Deriver {
    pub(super) ledger: Ledger,
    calls: HashMap<String, Pending>,
    read_at: HashMap<String, usize>,
    modified_at: HashMap<String, usize>,
    /// call_id → index in `functions`: a sub-agent's tool call and its function node are one.
    functions_at: HashMap<String, usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    Read,
    Modify,
}

impl Deriver {
    pub(super) fn node(&mut self, content: &NodeContent) {
        match content {
            NodeContent::Message {
                role: Role::User,
                parts,
                ..
            } => self.request(parts),
            NodeContent::Message { tool_calls, .. } => {
                for call in tool_calls {
                    self.call(call);
                }
            }
            NodeContent::ToolResult {
                call_id,
                name,
                parts,
                is_error,
            } => self.result(call_id, name, &Part::text_of(parts), *is_error),
            NodeContent::FunctionCall {
                call_id,
                name,
                input,
                ..
            } => {
                let input = first_line(input, FUNCTION_CHARS);
                match self.functions_at.get(call_id) {
                    // The sub-agent's tool call came first: it already named the task.
                    Some(&i) => {
                        let f = &mut self.ledger.functions[i];
                        if f.input.is_empty() {
                            f.input = input;
                        }
                    }
                    None => self.function(call_id, name, input),
                }
            }
            NodeContent::FunctionResult(result) => {
                let failed = result.status == FunctionStatus::Error;
                let tool = self
                    .function_done(&result.call_id, &result.output, failed)
                    .unwrap_or_else(|| "function".to_owned());
                if failed {
                    self.ledger.errors.push(ErrorLine {
                        tool,
                        line: error_line(&result.output),
                    });
                }
            }
        }
    }

    /// A sub-agent `call_id` started, by its tool call or its function node, whichever came
    /// first.
    fn function(&mut self, call_id: &str, name: &str, input: String) {
        self.functions_at
            .insert(call_id.to_owned(), self.ledger.functions.len());
        self.ledger.functions.push(FunctionUse {
            name: name.to_owned(),
            input,
            output: String::new(),
            is_error: false,
        });
    }

    /// The output and failure of the sub-agent `call_id` started, if one did; its name.
    fn function_done(&mut self, call_id: &str, output: &str, is_error: bool) -> Option<String> {
        let &i = self.functions_at.get(call_id)?;
        let f = &mut self.ledger.functions[i];
        f.output = first_line(output, FUNCTION_CHARS);
        f.is_error = is_error;
        Some(f.name.clone())
    }

    fn request(&mut self, parts: &[Part]) {
        let text = Part::text_of(parts)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if !text.is_empty() {
            self.ledger.user_requests.push(bound(&text, REQUEST_CHARS));
        } else if parts.iter().any(|p| matches!(p, Part::Media { .. })) {
            self.ledger.user_requests.push("[media]".to_owned());
        }
    }

    fn call(&mut self, call: &ToolCall) {
        let args: Value = serde_json::from_str(&call.arguments_json).unwrap_or(Value::Null);
        let words = words(&call.name);
        let mut pending = Pending {
            tool: call.name.clone(),
            command: None,
            touched: Vec::new(),
            relative: Vec::new(),
            path_from_result: false,
        };
        let mut wants_path = false;
        // A patch body names its files wherever it is passed (its own tool, a heredoc).
        for text in top_strings(&args) {
            for path in patch_paths(text) {
                self.arg_path(&mut pending, Use::Modify, path);
            }
        }
        if is_agent(&call.name) {
            self.function(&call.call_id, &call.name, agent_input(&args));
        } else if let Some(how) = editor_command(&args) {
            for path in path_values(&args, FILE_KEYS) {
                self.arg_path(&mut pending, how, path);
            }
        } else if let Some(text) = shell_command(&words, &args) {
            let line = first_line(&text, COMMAND_CHARS);
            match aci(&line) {
                Some(Aci::Open(path)) => self.arg_path(&mut pending, Use::Read, path),
                Some(Aci::Create(path)) => self.arg_path(&mut pending, Use::Modify, path),
                Some(Aci::Edit) => wants_path = true,
                None if line.is_empty() => {}
                None => {
                    pending.command = Some(self.ledger.commands.len());
                    self.ledger.commands.push(Command {
                        command: line,
                        exit_code: None,
                        is_error: false,
                    });
                }
            }
        } else {
            let class = classify(&words);
            let keys = if class == Class::Search {
                SEARCH_KEYS
            } else {
                FILE_KEYS
            };
            let how = if class == Class::Modify {
                Use::Modify
            } else {
                Use::Read
            };
            for path in path_values(&args, keys) {
                self.arg_path(&mut pending, how, path);
            }
            wants_path = class == Class::Modify;
        }
        pending.path_from_result = wants_path && pending.touched.is_empty();
        self.calls.insert(call.call_id.clone(), pending);
    }

    /// Records a path a call's arguments name. A relative one is kept in mind: its result may
    /// show where it is (SWE-agent's `[File: /repo/x.py (9 lines total)]`), and the other
    /// calls on that file may name only that absolute form.
    fn arg_path(&mut self, pending: &mut Pending, how: Use, path: &str) {
        let Some(path) = normalize(path) else {
            return;
        };
        self.file(how, &path, &pending.tool);
        if !path.starts_with('/') {
            pending.relative.push((how, path.clone()));
        }
        pending.touched.push(path);
    }

    fn result(&mut self, call_id: &str, name: &str, text: &str, is_error: bool) {
        let mut pending = self.calls.remove(call_id);
        if let Some(p) = pending.as_mut() {
            for (how, relative) in std::mem::take(&mut p.relative) {
                if let Some(absolute) = resolve(&relative, text) {
                    self.unrecord(how, &relative);
                    self.file(how, &absolute, &p.tool);
                    p.touched.push(absolute);
                }
            }
        }
        let tool = match &pending {
            Some(p) => p.tool.clone(),
            None => name.to_owned(),
        };
        if let Some(i) = pending.as_ref().and_then(|p| p.command) {
            let command = &mut self.ledger.commands[i];
            command.exit_code = exit_code(text);
            command.is_error = is_error;
        }
        self.function_done(call_id, text, is_error);
        if is_error {
            self.ledger.errors.push(ErrorLine {
                tool,
                line: error_line(text),
            });
            return;
        }
        let mut named = result_paths(text);
        if named.is_empty() && pending.as_ref().is_some_and(|p| p.path_from_result) {
            named.extend(opened_path(text));
        }
        for path in named {
            let already = normalize(path)
                .is_some_and(|p| pending.as_ref().is_some_and(|c| c.touched.contains(&p)));
            if !already {
                self.file(Use::Modify, path, &tool);
            }
        }
    }

    fn files(&mut self, how: Use) -> (&mut Vec<FileUse>, &mut HashMap<String, usize>) {
        match how {
            Use::Read => (&mut self.ledger.files_read, &mut self.read_at),
            Use::Modify => (&mut self.ledger.files_modified, &mut self.modified_at),
        }
    }

    /// Records one use of `path`, if it is a path.
    fn file(&mut self, how: Use, path: &str, tool: &str) {
        let Some(path) = normalize(path) else {
            return;
        };
        let (list, index) = self.files(how);
        match index.get(&path) {
            Some(&i) => {
                let f = &mut list[i];
                f.count = f.count.saturating_add(1);
                if !f.tools.iter().any(|t| t == tool) {
                    f.tools.push(tool.to_owned());
                }
            }
            None => {
                index.insert(path.clone(), list.len());
                list.push(FileUse {
                    path,
                    tools: vec![tool.to_owned()],
                    count: 1,
                });
            }
        }
    }

    /// Takes back one use of normalised `path`: its file was found under another name.
    fn unrecord(&mut self, how: Use, path: &str) {
        let (list, index) = self.files(how);
        let Some(&i) = index.get(path) else {
            return;
        };
        list[i].count = list[i].count.saturating_sub(1);
        if list[i].count == 0 {
            list.remove(i);
            index.remove(path);
            for (j, f) in list.iter().enumerate().skip(i) {
                index.insert(f.path.clone(), j);
            }
        }
    }
}

pub(super) fn merge_files(older: &mut Vec<FileUse>, newer: Vec<FileUse>) {
    let mut at: HashMap<String, usize> = older
        .iter()
        .enumerate()
        .map(|(i, f)| (f.path.clone(), i))
        .collect();
    for f in newer {
        match at.get(&f.path) {
            Some(&i) => {
                let old = &mut older[i];
                old.count = old.count.saturating_add(f.count);
                for tool in f.tools {
                    if !old.tools.contains(&tool) {
                        old.tools.push(tool);
                    }
                }
            }
            None => {
                at.insert(f.path.clone(), older.len());
                older.push(f);
            }
        }
    }
}

/// The first non-blank line, trimmed and bounded.
pub(super) fn first_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    bound(line, max)
}

/// At most `max` characters, the last one "…" when cut.
pub(super) fn bound(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}
