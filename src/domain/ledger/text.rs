//! The ledger's text form, bounded by a token cap, and reading its paths back.

use std::collections::{BTreeMap, HashSet};

use super::derive::bound;
use super::{FileUse, HEADER, Ledger, MODIFIED_TITLE, READ_TITLE, REQUEST_CHARS};
use crate::tokens::{Count, Tokens};

impl Ledger {
    /// The text form rendered after a summary's text; "" for an empty ledger. `cap`: a token
    /// budget for the whole text (None: only the per-category caps). Counts tokens with
    /// `counter`.
    ///
    /// Over `cap`, the text degrades by fixed steps: first the commands, errors
    /// and sub-agents shown shrink to their header counts, then file annotations go, then user
    /// requests are shortened and then reduced to their count, then the file tree is written
    /// as one line per root. Paths are never dropped, so a ledger that does not fit even then
    /// renders at its smallest.
    pub fn render(&self, cap: Option<Tokens>, counter: &dyn Count) -> String {
        if self.is_empty() {
            return String::new();
        }
        let Some(cap) = cap else {
            return self.render_at(&LEVELS[0]);
        };
        let mut text = String::new();
        for level in &LEVELS {
            text = self.render_at(level);
            if counter.count(&text) <= cap {
                break;
            }
        }
        text
    }

    pub(super) fn render_at(&self, level: &Level) -> String {
        let mut out = String::new();
        out.push_str(HEADER);
        out.push('\n');
        file_section(&mut out, MODIFIED_TITLE, &self.files_modified, level);
        file_section(&mut out, READ_TITLE, &self.files_read, level);
        list_section(
            &mut out,
            "Commands",
            &self.commands,
            level.commands,
            |c| match (c.exit_code, c.is_error) {
                (Some(code), _) if code != 0 => format!("{} → exit {code}", c.command),
                (None, true) => format!("{} → error", c.command),
                _ => c.command.clone(),
            },
        );
        list_section(&mut out, "Errors", &self.errors, level.errors, |e| {
            format!("{}: {}", e.tool, e.line)
        });
        list_section(
            &mut out,
            "User requests",
            &self.user_requests,
            level.requests,
            |r| format!("\"{}\"", bound(r, level.request_chars)),
        );
        list_section(
            &mut out,
            "Sub-agents",
            &self.functions,
            level.functions,
            |f| {
                let head = if f.input.is_empty() {
                    f.name.clone()
                } else {
                    format!("{}: {}", f.name, f.input)
                };
                match (f.is_error, f.output.is_empty()) {
                    (true, true) => format!("{head} → error"),
                    (true, false) => format!("{head} → error: {}", f.output),
                    (false, true) => head,
                    (false, false) => format!("{head} → {}", f.output),
                }
            },
        );
        out.truncate(out.trim_end().len());
        out
    }
}

/// The file paths a rendered ledger text names (directory groups expanded), in order of
/// appearance, each once; the inverse of [`Ledger::render`]'s file sections (exact for paths
/// without line breaks, commas, braces or parentheses).
pub fn paths_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut in_files = false;
    for line in text.lines() {
        if let Some(entry) = line.strip_prefix("  ") {
            if in_files {
                for path in expand(entry) {
                    if seen.insert(path.clone()) {
                        out.push(path);
                    }
                }
            }
            continue;
        }
        in_files = [MODIFIED_TITLE, READ_TITLE]
            .iter()
            .any(|t| line.starts_with(&format!("{t} (")))
            && line.ends_with(':');
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Rendering

/// One step of degradation: how much of each category shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Level {
    commands: usize,
    errors: usize,
    functions: usize,
    requests: usize,
    request_chars: usize,
    /// Tools and counts after each file.
    annotate: bool,
    /// Most files on one line before a directory is split into lines of its own.
    per_line: usize,
}

const FULL: Level = Level {
    commands: 12,
    errors: 8,
    functions: 8,
    requests: 8,
    request_chars: REQUEST_CHARS,
    annotate: true,
    per_line: 10,
};

const fn shown(commands: usize, errors: usize, functions: usize) -> Level {
    Level {
        commands,
        errors,
        functions,
        ..FULL
    }
}

const BARE: Level = Level {
    commands: 0,
    errors: 0,
    functions: 0,
    annotate: false,
    ..FULL
};

const fn requests(requests: usize, request_chars: usize) -> Level {
    Level {
        requests,
        request_chars,
        ..BARE
    }
}

/// The degrade order, largest first; every level keeps every path.
pub(super) const LEVELS: [Level; 13] = [
    FULL,
    shown(6, 4, 4),
    shown(3, 2, 2),
    shown(1, 1, 1),
    shown(0, 0, 0),
    BARE,
    requests(8, 150),
    requests(8, 80),
    requests(8, 40),
    requests(4, 40),
    requests(1, 40),
    requests(0, 40),
    Level {
        per_line: usize::MAX,
        ..requests(0, 40)
    },
];

/// A category: its header with counts, the first items and the newest, "+N more" between.
fn list_section<T>(
    out: &mut String,
    title: &str,
    items: &[T],
    cap: usize,
    line: impl Fn(&T) -> String,
) {
    let n = items.len();
    if n == 0 {
        return;
    }
    // One line per item whatever the item holds: a stray line break could fake a section.
    let line = |item: &T| format!("  {}", line(item).replace(['\n', '\r'], " "));
    let mut lines: Vec<String> = Vec::new();
    if cap >= n {
        lines.push(format!("{title} ({n}):"));
        lines.extend(items.iter().map(line));
    } else if cap == 0 {
        lines.push(format!("{title} ({n}, none shown)"));
    } else {
        // The first items say how the range began, the newest where it ended.
        let head = (cap / 2).min(2);
        let tail = cap - head;
        lines.push(format!("{title} ({n}, {cap} shown):"));
        lines.extend(items[..head].iter().map(line));
        lines.push(format!("  +{} more", n - cap));
        lines.extend(items[n - tail..].iter().map(line));
    }
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
}

fn file_section(out: &mut String, title: &str, files: &[FileUse], level: &Level) {
    if files.is_empty() {
        return;
    }
    let mut tree = Tree::default();
    for f in files {
        let note = if level.annotate {
            note(f)
        } else {
            String::new()
        };
        tree.insert(&f.path, note);
    }
    let mut lines = Vec::new();
    tree.lines("", level.per_line, &mut lines);
    out.push_str(&format!("{title} ({}):\n", tree.leaves()));
    for line in lines {
        out.push_str("  ");
        out.push_str(&line);
        out.push('\n');
    }
}

/// ` (Read+Edit ×3)`: the tools, without the characters of the group syntax.
fn note(f: &FileUse) -> String {
    let tools: Vec<String> = f
        .tools
        .iter()
        .map(|t| {
            t.chars()
                .filter(|c| !matches!(c, '(' | ')' | '{' | '}' | ',' | '\n' | '\r'))
                .collect::<String>()
        })
        .filter(|t| !t.trim().is_empty())
        .collect();
    let tools = tools.join("+");
    match (tools.is_empty(), f.count > 1) {
        (true, false) => String::new(),
        (true, true) => format!(" (×{})", f.count),
        (false, false) => format!(" ({tools})"),
        (false, true) => format!(" ({tools} ×{})", f.count),
    }
}

/// Paths by `/`-separated segment; a node is a file (`note` set), a directory, or both.
#[derive(Default)]
struct Tree {
    note: Option<String>,
    children: BTreeMap<String, Tree>,
}

impl Tree {
    fn insert(&mut self, path: &str, note: String) {
        let mut node = self;
        for segment in path.split('/') {
            node = node.children.entry(segment.to_owned()).or_default();
        }
        node.note.get_or_insert(note);
    }

    fn leaves(&self) -> usize {
        usize::from(self.note.is_some()) + self.children.values().map(Tree::leaves).sum::<usize>()
    }

    /// The expressions naming this node's files, each starting with `label`: the node's own
    /// file, then its subtree as `label/child` or `label/{a, b}`.
    fn items(&self, label: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(note) = &self.note {
            out.push(format!("{label}{note}"));
        }
        let inner: Vec<String> = self
            .children
            .iter()
            .flat_map(|(segment, child)| child.items(segment))
            .collect();
        match inner.as_slice() {
            [] => {}
            [one] => out.push(format!("{label}/{one}")),
            many => out.push(format!("{label}/{{{}}}", many.join(", "))),
        }
        out
    }

    /// Lines for the children of this node (whose path is `prefix`): small subtrees share a
    /// line as one brace group, up to `per_line` files; larger ones get lines of their own.
    fn lines(&self, prefix: &str, per_line: usize, out: &mut Vec<String>) {
        let mut group: Vec<String> = Vec::new();
        let mut files = 0usize;
        let flush = |group: &mut Vec<String>, out: &mut Vec<String>| {
            match group.as_slice() {
                [] => {}
                [one] => out.push(format!("{prefix}{one}")),
                // At the root there is no prefix to share: one line each.
                many if prefix.is_empty() => out.extend(many.iter().cloned()),
                many => out.push(format!("{prefix}{{{}}}", many.join(", "))),
            }
            group.clear();
        };
        for (segment, child) in &self.children {
            let n = child.leaves();
            if n <= per_line {
                if files.saturating_add(n) > per_line {
                    flush(&mut group, out);
                    files = 0;
                }
                group.extend(child.items(segment));
                files += n;
            } else {
                flush(&mut group, out);
                files = 0;
                if let Some(note) = &child.note {
                    out.push(format!("{prefix}{segment}{note}"));
                }
                child.lines(&format!("{prefix}{segment}/"), per_line, out);
            }
        }
        flush(&mut group, out);
    }
}

/// Expands one file entry: brace groups into their alternatives, notes (`(…)`) dropped.
fn expand(entry: &str) -> Vec<String> {
    let chars: Vec<char> = entry.chars().collect();
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        out.extend(item(&chars, &mut at));
        match chars.get(at) {
            Some(',') => {
                at += 1;
                if chars.get(at) == Some(&' ') {
                    at += 1;
                }
            }
            // A stray closing brace: skip it rather than stop.
            Some('}') => at += 1,
            _ => break,
        }
    }
    out
}

/// One alternative: literal characters and brace groups, concatenated.
fn item(chars: &[char], at: &mut usize) -> Vec<String> {
    let mut acc = vec![String::new()];
    while let Some(&c) = chars.get(*at) {
        match c {
            ',' | '}' => break,
            '{' => {
                *at += 1;
                let alternatives = group(chars, at);
                acc = acc
                    .iter()
                    .flat_map(|a| alternatives.iter().map(move |b| format!("{a}{b}")))
                    .collect();
            }
            ' ' if chars.get(*at + 1) == Some(&'(') => {
                *at += 1;
                skip_note(chars, at);
            }
            '(' => skip_note(chars, at),
            c => {
                for a in &mut acc {
                    a.push(c);
                }
                *at += 1;
            }
        }
    }
    acc
}

/// The alternatives of a brace group, after its `{`, through its `}`.
fn group(chars: &[char], at: &mut usize) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        out.extend(item(chars, at));
        match chars.get(*at) {
            Some(',') => {
                *at += 1;
                if chars.get(*at) == Some(&' ') {
                    *at += 1;
                }
            }
            Some('}') => {
                *at += 1;
                break;
            }
            _ => break,
        }
    }
    out
}

fn skip_note(chars: &[char], at: &mut usize) {
    let mut depth = 0usize;
    while let Some(&c) = chars.get(*at) {
        *at += 1;
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return;
                }
            }
            _ => {}
        }
    }
}
