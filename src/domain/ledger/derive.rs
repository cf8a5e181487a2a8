//! Deriving a ledger from nodes: tool calls and results read generically.
//!
//! Longer than most modules on purpose: one pass pairs each call with its result, and the rules
//! for each tool style (editors, shells, patches, SWE-agent commands, results naming a file)
//! read that pairing; split apart, they would each need it passed around.

use std::collections::HashMap;

use serde_json::Value;

use super::{
    COMMAND_CHARS, Command, ERROR_CHARS, ERROR_SCAN_LINES, ErrorLine, FUNCTION_CHARS, FileUse,
    FunctionUse, Ledger, REQUEST_CHARS,
};
use crate::domain::{FunctionStatus, NodeContent, Part, Role, ToolCall};

/// Normalises a path lexically: trimmed, `//` collapsed, `.` segments dropped, `a/../b`
/// resolved, no trailing `/`; absolute or relative as given. `None` for what is no path (empty,
/// multi-line, a URL).
pub fn normalize(path: &str) -> Option<String> {
    let path = path.trim();
    if path.is_empty() || path.contains(['\n', '\r', '\0']) || path.contains("://") {
        return None;
    }
    let absolute = path.starts_with('/');
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => match segments.last() {
                Some(&last) if last != ".." => {
                    segments.pop();
                }
                // Above the root is the root; above a relative start stays relative.
                _ if absolute => {}
                _ => segments.push(".."),
            },
            s => segments.push(s),
        }
    }
    let joined = segments.join("/");
    Some(match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    })
}

// ---------------------------------------------------------------------------------------------
// Derivation

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
enum Use {
    Read,
    Modify,
}

/// How a tool's name says it uses the paths its arguments name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
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
const SHELL_WORDS: &[&str] = &[
    "bash",
    "shell",
    "sh",
    "zsh",
    "terminal",
    "exec",
    "powershell",
    "cmd",
    "command",
    "console",
];
/// Argument keys naming files, for all but search tools.
const FILE_KEYS: &[&str] = &[
    "file_path",
    "filepath",
    "path",
    "paths",
    "notebook_path",
    "filename",
    "file_name",
    "target_file",
    "target_path",
    "file",
    "files",
    "file_paths",
    "source_path",
    "destination_path",
    "dest_path",
    "old_path",
    "new_path",
];
/// Argument keys of search tools that name where they searched (read), not what.
const SEARCH_KEYS: &[&str] = &[
    "path",
    "paths",
    "dir",
    "directory",
    "file_path",
    "filepath",
    "target_directory",
];
/// Editor-style tools (str_replace_editor) say what they do in a `command` argument.
const EDITOR_COMMANDS: &[(&str, Use)] = &[
    ("view", Use::Read),
    ("read", Use::Read),
    ("create", Use::Modify),
    ("str_replace", Use::Modify),
    ("insert", Use::Modify),
    ("undo_edit", Use::Modify),
    ("write", Use::Modify),
    ("edit", Use::Modify),
    ("delete", Use::Modify),
    ("rename", Use::Modify),
    ("append", Use::Modify),
];

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
                    None => {
                        self.functions_at
                            .insert(call_id.clone(), self.ledger.functions.len());
                        self.ledger.functions.push(FunctionUse {
                            name: name.clone(),
                            input,
                            output: String::new(),
                            is_error: false,
                        });
                    }
                }
            }
            NodeContent::FunctionResult(result) => {
                let failed = result.status == FunctionStatus::Error;
                let mut tool = "function".to_owned();
                if let Some(&i) = self.functions_at.get(&result.call_id) {
                    let f = &mut self.ledger.functions[i];
                    f.output = first_line(&result.output, FUNCTION_CHARS);
                    f.is_error = failed;
                    tool.clone_from(&f.name);
                }
                if failed {
                    self.ledger.errors.push(ErrorLine {
                        tool,
                        line: error_line(&result.output),
                    });
                }
            }
        }
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
            self.functions_at
                .insert(call.call_id.clone(), self.ledger.functions.len());
            self.ledger.functions.push(FunctionUse {
                name: call.name.clone(),
                input: agent_input(&args),
                output: String::new(),
                is_error: false,
            });
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
        if let Some(&i) = self.functions_at.get(call_id) {
            let f = &mut self.ledger.functions[i];
            f.output = first_line(text, FUNCTION_CHARS);
            f.is_error = is_error;
        }
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

/// A tool name as lowercase words: split at non-alphanumerics and lower→upper case changes.
fn words(name: &str) -> Vec<String> {
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
fn has_word(words: &[String], verbs: &[&str]) -> bool {
    words.iter().any(|w| {
        verbs
            .iter()
            .any(|v| w == v || (v.len() >= 4 && w.starts_with(v)))
    })
}

fn classify(words: &[String]) -> Class {
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
fn is_agent(name: &str) -> bool {
    let words = words(name);
    match words.as_slice() {
        [only] => matches!(only.as_str(), "task" | "agent" | "subagent"),
        [.., last] => matches!(last.as_str(), "agent" | "subagent"),
        [] => false,
    }
}

fn agent_input(args: &Value) -> String {
    let text = match args {
        Value::String(s) => Some(s.as_str()),
        Value::Object(map) => ["description", "prompt", "task", "input", "message"]
            .iter()
            .find_map(|k| get_key(map, k).and_then(Value::as_str)),
        _ => None,
    };
    first_line(text.unwrap_or_default(), FUNCTION_CHARS)
}

fn get_key<'a>(map: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// The string values at the top of the arguments (and in their top arrays).
fn top_strings(args: &Value) -> Vec<&str> {
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

/// The values of `keys` (strings or arrays of strings), at the top and one level into arrays
/// of objects (a multi-file edit's entries).
fn path_values<'a>(args: &'a Value, keys: &[&str]) -> Vec<&'a str> {
    fn collect<'a>(map: &'a serde_json::Map<String, Value>, keys: &[&str], out: &mut Vec<&'a str>) {
        for (k, v) in map {
            if !keys.iter().any(|key| k.eq_ignore_ascii_case(key)) {
                continue;
            }
            match v {
                Value::String(s) => out.push(s),
                Value::Array(items) => out.extend(items.iter().filter_map(Value::as_str)),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    let Value::Object(map) = args else {
        return out;
    };
    collect(map, keys, &mut out);
    for v in map.values() {
        if let Value::Array(items) = v {
            for item in items {
                if let Value::Object(m) = item {
                    collect(m, keys, &mut out);
                }
            }
        }
    }
    out
}

fn editor_command(args: &Value) -> Option<Use> {
    let Value::Object(map) = args else {
        return None;
    };
    let command = get_key(map, "command")?
        .as_str()?
        .trim()
        .to_ascii_lowercase();
    let how = EDITOR_COMMANDS
        .iter()
        .find(|(name, _)| *name == command)
        .map(|&(_, how)| how)?;
    (!path_values(args, FILE_KEYS).is_empty()).then_some(how)
}

/// The command a shell-like call runs: a `command`/`cmd` argument on any tool, a few more keys
/// (or the whole argument) on tools named like shells.
fn shell_command(words: &[String], args: &Value) -> Option<String> {
    let shell = has_word(words, SHELL_WORDS);
    match args {
        Value::Object(map) => {
            let keys: &[&str] = if shell {
                &["command", "cmd", "script", "commands", "input", "code"]
            } else {
                &["command", "cmd"]
            };
            keys.iter()
                .find_map(|k| get_key(map, k).and_then(command_text))
        }
        Value::String(_) | Value::Array(_) if shell => command_text(args),
        _ => None,
    }
}

fn command_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => {
            let argv: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            match argv.as_slice() {
                [] => None,
                // `["bash", "-lc", "script"]`: the script is the command.
                [_, flag, .., script] if matches!(*flag, "-c" | "-lc" | "-ic") => {
                    Some((*script).to_owned())
                }
                _ => Some(argv.join(" ")),
            }
        }
        _ => None,
    }
}

/// SWE-agent's file commands, issued through its shell tool.
enum Aci<'a> {
    Open(&'a str),
    Create(&'a str),
    /// Edits the open file, which only the result names.
    Edit,
}

fn aci(line: &str) -> Option<Aci<'_>> {
    let plausible = |p: &str| !p.starts_with('-') && !p.contains("://");
    let number = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == ':');
    let args: Vec<&str> = line.split_whitespace().collect();
    match args.as_slice() {
        ["open", path] | ["open", path, _] if plausible(path) => {
            if args.len() == 3 && !number(args[2]) {
                return None;
            }
            Some(Aci::Open(path.trim_matches(['"', '\''])))
        }
        ["create", path] if plausible(path) => Some(Aci::Create(path.trim_matches(['"', '\'']))),
        ["edit"] | ["append"] => Some(Aci::Edit),
        ["edit" | "insert", at] if number(at) => Some(Aci::Edit),
        _ => None,
    }
}

/// Files a patch body (`*** Begin Patch` format) adds, updates, deletes or moves.
fn patch_paths(text: &str) -> Vec<&str> {
    if !text.contains("*** ") {
        return Vec::new();
    }
    const MARKERS: [&str; 4] = [
        "*** Update File: ",
        "*** Add File: ",
        "*** Delete File: ",
        "*** Move to: ",
    ];
    text.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            MARKERS
                .iter()
                .find_map(|m| line.strip_prefix(m))
                .map(str::trim)
        })
        .collect()
}

/// Paths a successful result says it wrote ("File created successfully at: p", "The file p
/// has been updated").
fn result_paths(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in text.lines().take(3) {
        let line = line.trim();
        if let Some(path) = line.strip_prefix("File created successfully at: ") {
            out.push(path.trim());
        } else if let Some(rest) = line.strip_prefix("The file ")
            && let Some(end) = rest.find(" has been ")
        {
            let verb = &rest[end + " has been ".len()..];
            let wrote = [
                "updated",
                "edited",
                "created",
                "modified",
                "written",
                "saved",
                "overwritten",
            ]
            .iter()
            .any(|v| verb.starts_with(v));
            if wrote {
                out.push(&rest[..end]);
            }
        }
    }
    out
}

/// The file a SWE-agent result shows: its `[File: p (n lines total)]` banner, else the
/// `(Open file: p)` status line.
fn opened_path(text: &str) -> Option<&str> {
    banner_path(text).or_else(|| open_file(text))
}

fn banner_path(text: &str) -> Option<&str> {
    text.lines().take(3).find_map(|line| {
        let rest = line.trim().strip_prefix("[File: ")?;
        rest.rfind(" (").map(|end| &rest[..end])
    })
}

fn open_file(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .take(6)
        .find_map(|line| {
            line.trim()
                .strip_prefix("(Open file: ")
                .and_then(|r| r.strip_suffix(')'))
        })
        .filter(|p| *p != "n/a")
}

/// The absolute form of relative path `relative` that a result shows, if it shows one.
fn resolve(relative: &str, text: &str) -> Option<String> {
    let tail = format!("/{relative}");
    banner_path(text)
        .into_iter()
        .chain(open_file(text))
        .chain(result_paths(text))
        .filter_map(normalize)
        .find(|p| p.starts_with('/') && p.ends_with(&tail))
}

/// The exit code a result states on one of its first or last three non-blank lines.
pub(super) fn exit_code(text: &str) -> Option<i32> {
    let filled = |l: &&str| !l.trim().is_empty();
    let first = text.lines().filter(filled).take(3);
    let last = text.lines().rev().filter(filled).take(3);
    first.chain(last).find_map(code_in)
}

fn code_in(line: &str) -> Option<i32> {
    const MARKERS: [&str; 7] = [
        "exit code",
        "exit status",
        "exited with code",
        "exited with status",
        "exit_code",
        "exitcode",
        "return code",
    ];
    // ASCII lowercasing keeps byte offsets.
    let lower = line.to_ascii_lowercase();
    MARKERS.iter().find_map(|m| {
        let at = lower.find(m)?;
        let rest = lower[at + m.len()..].trim_start_matches([' ', ':', '=', '[', '(']);
        let digits = rest.strip_prefix('-').unwrap_or(rest);
        let len = digits.chars().take_while(char::is_ascii_digit).count();
        if len == 0 || len > 10 {
            return None;
        }
        let sign = rest.len() - digits.len();
        rest[..sign + len].parse().ok()
    })
}

/// The line of a failure that says what went wrong: an error or exception line if there is
/// one, else the first line with an error word, else the first line that is no wrapper.
pub(super) fn error_line(text: &str) -> String {
    let mut keyword = None;
    let mut first = None;
    for raw in text.lines().take(ERROR_SCAN_LINES) {
        let line = strip_tags(raw.trim());
        if line.is_empty() || is_wrapper(line) {
            continue;
        }
        if is_exception(line) {
            return bound(line, ERROR_CHARS);
        }
        if keyword.is_none() && has_error_word(line) {
            keyword = Some(line);
        }
        first.get_or_insert(line);
    }
    bound(keyword.or(first).unwrap_or_default(), ERROR_CHARS)
}

/// A line without its enclosing markup tags (`<tool_use_error>…</tool_use_error>`).
fn strip_tags(mut line: &str) -> &str {
    let tag = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/'))
    };
    while line.starts_with('<')
        && let Some(end) = line.find('>')
        && tag(&line[1..end])
    {
        line = line[end + 1..].trim_start();
    }
    while line.ends_with('>')
        && let Some(start) = line.rfind('<')
        && tag(&line[start + 1..line.len() - 1])
    {
        line = line[..start].trim_end();
    }
    line
}

fn is_wrapper(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let plain = lower.trim_end_matches(':');
    matches!(
        plain,
        "error" | "errors" | "traceback (most recent call last)" | "stderr" | "stdout" | "output"
    ) || lower.starts_with("```")
        || lower.chars().all(|c| matches!(c, '-' | '=' | '~' | '*'))
        // "Exit code 1", "[exit code 1]": the code is kept with the command.
        || (line.len() <= 32 && code_in(line).is_some())
}

fn is_exception(line: &str) -> bool {
    let lower = line.to_lowercase();
    const STARTS: [&str; 10] = [
        "error:",
        "error[",
        "error ",
        "fatal:",
        "fatal error",
        "panic:",
        "** (",
        "e   ",
        "failed:",
        "exception:",
    ];
    if STARTS.iter().any(|s| lower.starts_with(s))
        || lower.contains("panicked at")
        || lower.contains("[error]")
    {
        return true;
    }
    // Python-style `module.KindError: message`.
    let head = line.split(':').next().unwrap_or_default();
    !head.is_empty()
        && head
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.'))
        && (head.ends_with("Error") || head.ends_with("Exception"))
}

fn has_error_word(line: &str) -> bool {
    const WORDS: [&str; 22] = [
        "error",
        "fail",
        "exception",
        "not found",
        "no such",
        "denied",
        "cannot",
        "can't",
        "could not",
        "couldn't",
        "undefined",
        "does not exist",
        "doesn't exist",
        "invalid",
        "unexpected",
        "refused",
        "timed out",
        "exceeds",
        "not allowed",
        "rejected",
        "fatal",
        "panic",
    ];
    let lower = line.to_lowercase();
    WORDS.iter().any(|w| lower.contains(w))
}

/// The first non-blank line, trimmed and bounded.
fn first_line(text: &str, max: usize) -> String {
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
