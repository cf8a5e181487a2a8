//! The telling line of a failed tool or function: an error or exception line, or the first
//! line with an error word, past wrappers and markup.

use super::commands::code_in;
use super::derive::bound;
use super::{ERROR_CHARS, ERROR_SCAN_LINES};

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
