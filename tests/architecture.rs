//! The rules of ARCHITECTURE.md, read from the source: which room names which (its `crate::`
//! paths, `use` lines and inline alike), which crates a room uses, which provider field names
//! it spells, how long it is. Each rule is a function over the files, so the tests below also
//! plant a violation in a copy and see the rule catch it.

use std::collections::BTreeMap;
use std::path::Path;

/// The front doors: each parses its transport, calls the workflows and presents the outcome.
const DOORS: [&str; 4] = ["api", "gateway", "inspector", "cli"];

/// The pure engine: no I/O, nothing from the floors above it.
const ENGINE: [&str; 4] = ["domain", "render", "compact", "tokens"];

/// What the engine may not use: crates and modules that do I/O, and the floors above it.
const IO: [&str; 11] = [
    "tokio",
    "sqlx",
    "rusqlite",
    "axum",
    "tonic",
    "hyper",
    "reqwest",
    "std::fs",
    "std::net",
    "std::process",
    "std::env",
];
const ABOVE_ENGINE: [&str; 9] = [
    "store",
    "workflow",
    "provider",
    "api",
    "gateway",
    "inspector",
    "cli",
    "server",
    "proto",
];

/// JSON field names only a provider's wire format has (ctxd's own formats share none of them),
/// spelled as string literals.
const PROVIDER_FIELDS: [&str; 20] = [
    "tool_use",
    "tool_use_id",
    "cache_control",
    "image_url",
    "input_text",
    "output_text",
    "function_call_output",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "prompt_tokens",
    "completion_tokens",
    "content_block_delta",
    "stop_reason",
    "max_tokens",
    "redacted_thinking",
    "server_tool_use",
    "prompt_cache_key",
    "previous_response_id",
    "input_json_delta",
    "max_completion_tokens",
];

/// The longest a file may be, its test module aside.
const MAX_LINES: usize = 600;

type Files = BTreeMap<String, String>;

/// A rule: what breaks it, one line each.
type Rule = fn(&Files) -> Vec<String>;

/// Every `.rs` file under `src/`, by its path from `src/`.
fn sources() -> Files {
    fn walk(dir: &Path, root: &Path, out: &mut Files) {
        for entry in std::fs::read_dir(dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path
                    .strip_prefix(root)
                    .expect("under src/")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(name, std::fs::read_to_string(&path).expect("a source file"));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Files::new();
    walk(&root, &root, &mut files);
    files
}

/// The room a file belongs to: its top-level module (`None` for the crate roots).
fn room(path: &str) -> Option<&str> {
    match path.split_once('/') {
        Some((dir, _)) => Some(dir),
        None => match path.strip_suffix(".rs") {
            Some("lib" | "main") => None,
            other => other,
        },
    }
}

/// A file's code: its test module (the `#[cfg(test)]` at the start of a line that ends it) and
/// its comments left out.
fn code(text: &str) -> String {
    let body = match text.find("\n#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string (a URL) is not a comment: kept when a quote precedes it.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a file's code names through `crate::`, grouped uses included.
fn named_rooms(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::c, d::{e, f}}`: the first name of each top-level member.
            let mut depth = 0;
            let mut member = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(first_name(&member));
                        member.clear();
                        continue;
                    }
                    _ => {}
                }
                member.push(c);
            }
            names.push(first_name(&member));
        } else {
            names.push(first_name(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

fn first_name(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Rule: no door names another door (a door reaches the others only through the workflows and
/// the contract, and the assembly, `server`, wires them).
fn doors_apart(files: &Files) -> Vec<String> {
    let mut broken = Vec::new();
    for (path, text) in files {
        let Some(door) = room(path).filter(|r| DOORS.contains(r)) else {
            continue;
        };
        for name in named_rooms(&code(text)) {
            if name != door && DOORS.contains(&name.as_str()) {
                broken.push(format!("{path}: the {door} door names the {name} door"));
            }
        }
    }
    broken
}

/// Rule: the engine does no I/O and names nothing above it.
fn engine_pure(files: &Files) -> Vec<String> {
    let mut broken = Vec::new();
    for (path, text) in files {
        let Some(engine) = room(path).filter(|r| ENGINE.contains(r)) else {
            continue;
        };
        // Tests may read their fixtures.
        if path.ends_with("/tests.rs") {
            continue;
        }
        let code = code(text);
        for name in named_rooms(&code) {
            if ABOVE_ENGINE.contains(&name.as_str()) {
                broken.push(format!("{path}: the engine ({engine}) names {name}"));
            }
        }
        for krate in IO {
            let used = code.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with(&format!("use {krate}"))
                    || l.contains(&format!(" {krate}::"))
                    || l.contains(&format!("({krate}::"))
            });
            if used {
                broken.push(format!("{path}: the engine ({engine}) uses {krate}"));
            }
        }
    }
    broken
}

/// Rule: only `store/` names sqlx (or SQLite's own crate).
fn sql_in_store(files: &Files) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| room(path) != Some("store"))
        .filter(|(_, text)| {
            let code = code(text);
            code.contains("sqlx") || code.contains("rusqlite")
        })
        .map(|(path, _)| format!("{path}: names sqlx outside store/"))
        .collect()
}

/// Rule: only `provider/` spells a provider's JSON field names.
fn provider_fields_in_provider(files: &Files) -> Vec<String> {
    let mut broken = Vec::new();
    for (path, text) in files {
        if room(path) == Some("provider") || path.ends_with("/tests.rs") {
            continue;
        }
        let code = code(text);
        for field in PROVIDER_FIELDS {
            if code.contains(&format!("\"{field}\"")) {
                broken.push(format!("{path}: spells the provider field {field:?}"));
            }
        }
    }
    broken
}

/// Rule: every module opens with a `//!` line saying what it owns.
fn modules_say_what_they_own(files: &Files) -> Vec<String> {
    files
        .iter()
        .filter(|(_, text)| !text.trim_start().starts_with("//!"))
        .map(|(path, _)| format!("{path}: does not open with a //! line"))
        .collect()
}

/// Rule: rooms sized for one concern: no file over [`MAX_LINES`], its tests aside (test-only
/// files are tests).
fn rooms_sized(files: &Files) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| !path.ends_with("/tests.rs") && !path.ends_with("/props.rs"))
        .filter_map(|(path, text)| {
            let body = match text.find("\n#[cfg(test)]") {
                Some(i) => &text[..i],
                None => text.as_str(),
            };
            let lines = body.lines().count();
            (lines > MAX_LINES).then(|| format!("{path}: {lines} lines (at most {MAX_LINES})"))
        })
        .collect()
}

const RULES: [(&str, Rule); 6] = [
    ("no door imports another door", doors_apart),
    ("the engine does no I/O", engine_pure),
    ("only store/ names sqlx", sql_in_store),
    (
        "only provider/ knows a provider's JSON field names",
        provider_fields_in_provider,
    ),
    ("every module says what it owns", modules_say_what_they_own),
    ("no file over 600 lines", rooms_sized),
];

#[test]
fn the_source_keeps_every_stated_rule() {
    let files = sources();
    assert!(files.len() > 50, "read the whole source tree");
    let broken: Vec<String> = RULES
        .iter()
        .flat_map(|(rule, check)| {
            check(&files)
                .into_iter()
                .map(move |b| format!("{rule}: {b}"))
        })
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// `files` with `line` added to the top of `path`.
fn planted(files: &Files, path: &str, line: &str) -> Files {
    let mut files = files.clone();
    let text = files
        .get_mut(path)
        .unwrap_or_else(|| panic!("{path} exists"));
    *text = format!("{}\n{line}\n{}", text.lines().next().unwrap_or(""), text);
    files
}

#[test]
fn each_rule_catches_a_planted_violation() {
    let files = sources();
    let cases: [(&str, &str, Rule); 8] = [
        ("gateway/mod.rs", "use crate::api::pb;", doors_apart),
        (
            "inspector/mod.rs",
            "use crate::{domain::Tenant, gateway::Gateway};",
            doors_apart,
        ),
        (
            "cli/mod.rs",
            "fn f() { crate::inspector::serve; }",
            doors_apart,
        ),
        ("render/mod.rs", "use tokio::task;", engine_pure),
        ("domain/mod.rs", "use crate::store::Store;", engine_pure),
        ("workflow/mod.rs", "use sqlx::Row;", sql_in_store),
        (
            "export/mod.rs",
            "const F: &str = \"tool_use_id\";",
            provider_fields_in_provider,
        ),
        ("workflow/mod.rs", "", modules_say_what_they_own),
    ];
    for (path, line, rule) in cases {
        let before = rule(&files);
        assert!(
            !before.iter().any(|b| b.starts_with(path)),
            "{path}: the rule holds before: {before:?}"
        );
        let bad = if line.is_empty() {
            // A module without its `//!` line.
            let mut bad = files.clone();
            bad.insert(path.to_owned(), "use std::sync::Arc;\n".to_owned());
            bad
        } else {
            planted(&files, path, line)
        };
        let found = rule(&bad);
        assert!(
            found.iter().any(|b| b.starts_with(path)),
            "{path}: `{line}` is caught: {found:?}"
        );
    }
    let mut long = files.clone();
    long.insert(
        "render/long.rs".to_owned(),
        "//! long\n".repeat(MAX_LINES + 1),
    );
    assert!(
        rooms_sized(&long)
            .iter()
            .any(|b| b.starts_with("render/long.rs"))
    );
}
