//! The commands a shell-like call runs (SWE-agent's file commands among them), and the exit
//! code its result states.

use serde_json::Value;

use super::tools::{get_key, has_word};

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
/// The command a shell-like call runs: a `command`/`cmd` argument on any tool, a few more keys
/// (or the whole argument) on tools named like shells.
pub(super) fn shell_command(words: &[String], args: &Value) -> Option<String> {
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
pub(super) enum Aci<'a> {
    Open(&'a str),
    Create(&'a str),
    /// Edits the open file, which only the result names.
    Edit,
}

pub(super) fn aci(line: &str) -> Option<Aci<'_>> {
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

/// The exit code a result states on one of its first or last three non-blank lines.
pub(super) fn exit_code(text: &str) -> Option<i32> {
    let filled = |l: &&str| !l.trim().is_empty();
    let first = text.lines().filter(filled).take(3);
    let last = text.lines().rev().filter(filled).take(3);
    first.chain(last).find_map(code_in)
}

pub(super) fn code_in(line: &str) -> Option<i32> {
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
