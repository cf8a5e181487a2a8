//! Stubs for old tool-call arguments: valid JSON that keeps what identifies the call.
//!
//! Once a call is older than the last step, its arguments (file bodies of an edit, a long
//! script) are the largest thing left of it. A stub keeps every short field whole (a file path, a pattern,
//! a flag) and the head of every long string (the first line of a command), and says in place
//! how much was elided. A stub is its own fixed point: stubbing it again changes nothing.

use serde_json::{Map, Value};

/// A field whose key names what the call was about (a path, a pattern, a command) is kept whole
/// up to this many characters, and its first line's head beyond.
const IDENTIFYING_CHARS: usize = 200;
/// Any other string field is kept whole up to this many characters...
const KEEP_CHARS: usize = 40;
/// ...and its first line's head beyond.
const HEAD_CHARS: usize = 20;
/// Keys (or parts of keys) that identify a call.
const IDENTIFYING: &[&str] = &[
    "path", "file", "pattern", "glob", "url", "query", "command", "cmd", "name", "id",
];
/// What an elided string says after its count: stubbing it again leaves it alone.
const ELIDED: &str = " chars elided";

/// The stub of `arguments_json`, or `None` when it is not JSON or nothing in it is long. Each
/// elided string names `reference`, by which `Recall` gives the whole call back.
pub fn stub_arguments(arguments_json: &str, reference: Option<&str>) -> Option<String> {
    let mut value: Value = serde_json::from_str(arguments_json).ok()?;
    let end = match reference {
        Some(r) => format!("{ELIDED}: recall {r}]"),
        None => format!("{ELIDED}]"),
    };
    if !shorten(&mut value, false, &end) {
        return None;
    }
    serde_json::to_string(&value).ok()
}

/// Whether `s` is a stub's elided string: `…[N chars elided]`, with or without a reference.
fn elided(s: &str) -> bool {
    s.ends_with(']')
        && s.rfind("…[").is_some_and(|at| {
            let rest = &s[at + "…[".len()..];
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            digits > 0 && rest[digits..].starts_with(ELIDED)
        })
}

fn identifying(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    IDENTIFYING.iter().any(|k| key.contains(k))
}

/// Shortens every long string inside `value`, ending each with `end`; whether any was.
fn shorten(value: &mut Value, identifies: bool, end: &str) -> bool {
    match value {
        Value::String(s) => {
            let (keep, head) = if identifies {
                (IDENTIFYING_CHARS, IDENTIFYING_CHARS / 2)
            } else {
                (KEEP_CHARS, HEAD_CHARS)
            };
            let chars = s.chars().count();
            if chars <= keep || elided(s) {
                return false;
            }
            let line = s.lines().next().unwrap_or_default();
            let head: String = line.chars().take(head).collect();
            let cut = chars - head.chars().count();
            *s = format!("{head}…[{cut}{end}");
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |any, v| shorten(v, identifies, end) | any),
        Value::Object(fields) => shorten_fields(fields, end),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn shorten_fields(fields: &mut Map<String, Value>, end: &str) -> bool {
    fields
        .iter_mut()
        .fold(false, |any, (k, v)| shorten(v, identifying(k), end) | any)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_identifying_fields_and_the_head_of_long_ones() {
        let body = "fn main() {\n".to_owned() + &"    println!(\"x\");\n".repeat(40) + "}\n";
        let path = "/home/someone/projects/ctxd/src/render/some/deeply/nested/module.rs";
        let args = serde_json::json!({
            "file_path": path,
            "content": body,
            "replace_all": false,
        })
        .to_string();
        let stub = stub_arguments(&args, Some("3f9a2c1b7d04")).expect("a long field");
        let v: Value = serde_json::from_str(&stub).expect("valid JSON");
        assert_eq!(v["file_path"], path);
        assert_eq!(v["replace_all"], false);
        let content = v["content"].as_str().expect("a string");
        assert!(content.starts_with("fn main() {…["), "{content}");
        assert!(
            content.ends_with(" chars elided: recall 3f9a2c1b7d04]"),
            "{content}"
        );
        assert!(stub.len() < args.len());
    }

    #[test]
    fn a_stub_is_its_own_fixed_point() {
        let args = serde_json::json!({
            "command": "x".repeat(500),
            "description": "y ".repeat(30),
            "nested": [{"text": "y".repeat(1000)}],
        })
        .to_string();
        for reference in [None, Some("3f9a2c1b7d04")] {
            let stub = stub_arguments(&args, reference).expect("long fields");
            assert_eq!(stub_arguments(&stub, reference), None);
            assert_eq!(stub_arguments(&stub, None), None);
        }
    }

    #[test]
    fn short_or_non_json_arguments_are_left_alone() {
        assert_eq!(stub_arguments(r#"{"pattern":"fn main"}"#, None), None);
        assert_eq!(stub_arguments(&"not json ".repeat(100), None), None);
    }
}
