//! What a tool call says of itself: its name as words and the class they give it (modifies,
//! searches, reads), whether it launches a sub-agent and on what task, and its arguments read
//! by key.

use serde_json::Value;

use super::FUNCTION_CHARS;
use super::derive::first_line;

/// How a tool's name says it uses the paths its arguments name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Modify,
    /// Glob, grep, find, list: only a directory-ish argument is a path, never the pattern.
    Search,
    /// Reads, and whatever else names a path.
    Read,
}

const MODIFY_WORDS: &[&str] = &[
    "write", "edit", "create", "patch", "replace", "insert", "delete", "remove", "rm", "move",
    "mv", "rename", "append", "update", "save", "apply", "touch", "mkdir",
];
const SEARCH_WORDS: &[&str] = &["glob", "grep", "search", "find", "rg", "ls", "list"];
/// A tool name as lowercase words: split at non-alphanumerics and lower→upper case changes.
pub(super) fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut after_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            after_lower = false;
            continue;
        }
        if c.is_uppercase() && after_lower && !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        after_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Whether a word list holds a verb: whole short words (`ls`, `rm`), prefixes of longer ones
/// (`editor` holds `edit`).
pub(super) fn has_word(words: &[String], verbs: &[&str]) -> bool {
    words.iter().any(|w| {
        verbs
            .iter()
            .any(|v| w == v || (v.len() >= 4 && w.starts_with(v)))
    })
}

pub(super) fn classify(words: &[String]) -> Class {
    // Modify first: a search-and-replace tool modifies.
    if has_word(words, MODIFY_WORDS) {
        Class::Modify
    } else if has_word(words, SEARCH_WORDS) {
        Class::Search
    } else {
        Class::Read
    }
}

/// Sub-agent launchers (Claude Code's `Task`, `dispatch_agent`, `spawn_agent`…), but not
/// tools about tasks (`TaskOutput`, `TodoWrite`).
pub(super) fn is_agent(name: &str) -> bool {
    let words = words(name);
    match words.as_slice() {
        [only] => matches!(only.as_str(), "task" | "agent" | "subagent"),
        [.., last] => matches!(last.as_str(), "agent" | "subagent"),
        [] => false,
    }
}

pub(super) fn agent_input(args: &Value) -> String {
    let text = match args {
        Value::String(s) => Some(s.as_str()),
        Value::Object(map) => ["description", "prompt", "task", "input", "message"]
            .iter()
            .find_map(|k| get_key(map, k).and_then(Value::as_str)),
        _ => None,
    };
    first_line(text.unwrap_or_default(), FUNCTION_CHARS)
}

pub(super) fn get_key<'a>(map: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// The string values at the top of the arguments (and in their top arrays).
pub(super) fn top_strings(args: &Value) -> Vec<&str> {
    let values: Vec<&Value> = match args {
        Value::Object(map) => map.values().collect(),
        other => vec![other],
    };
    values
        .into_iter()
        .flat_map(|v| match v {
            Value::String(s) => vec![s.as_str()],
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        })
        .collect()
}
