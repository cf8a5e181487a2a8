//! The paths a call and its result name: normalised lexically, read from the arguments by key
//! or from a patch body, and from what a result says it wrote or has open.

use serde_json::Value;

use super::derive::Use;
use super::tools::get_key;

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

/// Argument keys naming files, for all but search tools.
pub(super) const FILE_KEYS: &[&str] = &[
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
pub(super) const SEARCH_KEYS: &[&str] = &[
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

/// The values of `keys` (strings or arrays of strings), at the top and one level into arrays
/// of objects (a multi-file edit's entries).
pub(super) fn path_values<'a>(args: &'a Value, keys: &[&str]) -> Vec<&'a str> {
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

pub(super) fn editor_command(args: &Value) -> Option<Use> {
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

/// Files a patch body (`*** Begin Patch` format) adds, updates, deletes or moves.
pub(super) fn patch_paths(text: &str) -> Vec<&str> {
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
pub(super) fn result_paths(text: &str) -> Vec<&str> {
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
pub(super) fn opened_path(text: &str) -> Option<&str> {
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
pub(super) fn resolve(relative: &str, text: &str) -> Option<String> {
    let tail = format!("/{relative}");
    banner_path(text)
        .into_iter()
        .chain(open_file(text))
        .chain(result_paths(text))
        .filter_map(normalize)
        .find(|p| p.starts_with('/') && p.ends_with(&tail))
}
