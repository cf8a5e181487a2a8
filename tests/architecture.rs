//! The rules of ARCHITECTURE.md, read from the source. Each file of `src/` is read as tokens
//! (comments left out, strings apart), every item under `#[cfg(test)]` is cut (the item alone:
//! a test module, a `mod tests;` line, a function, a `use`), and every path the rest names is
//! resolved to what it means: `crate::`, `self::` and `super::` paths, grouped and absolute
//! `use` trees, names a `use` brought in, re-exports followed to where they lead. Each rule is
//! a function over the files and the map and its own test; `each_rule_catches_a_planted_violation`
//! plants violations in a copy, where a reading by lines would miss them, and sees them caught.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::OnceLock;

/// The floors of ARCHITECTURE.md's "Floors" block, top down (the `map_places_every_module`
/// rule holds the block to this table). A room names only rooms on floors below its own;
/// rooms on one floor never name each other.
const FLOORS: [&[&str]; 17] = [
    &["main"],
    &["cli"],
    &["server"],
    &["api", "gateway", "inspector"],
    &["proto"],
    &["workflow"],
    &["auth", "limits", "metrics", "tls"],
    &["hook"],
    &["import"],
    &["export"],
    &["summarizer"],
    &["provider"],
    &["store"],
    &["compact", "economy", "recall"],
    &["render"],
    &["domain"],
    &["tokens"],
];

/// The front doors: no door names another, straight or through a re-export (`cli` stands above
/// the assembly; the others share a floor).
const DOORS: [&str; 4] = ["api", "gateway", "inspector", "cli"];

/// The pure engine: no I/O, no clock.
const ENGINE: [&str; 4] = ["domain", "render", "compact", "tokens"];

/// What the engine may not name, as path prefixes: crates and modules that do I/O or read the
/// clock.
#[rustfmt::skip]
const IMPURE: [&str; 19] = [
    "tokio", "sqlx", "rusqlite", "axum", "tonic", "hyper", "reqwest", "tower", "chrono", "time",
    "std::fs", "std::net", "std::io", "std::process", "std::env", "std::thread",
    "std::time::SystemTime", "std::time::Instant", "std::time::UNIX_EPOCH",
];

/// Calls that read the clock (or the system's randomness), however their type was brought in.
#[rustfmt::skip]
const CLOCK_CALLS: [&str; 7] = [
    "Instant::now", "SystemTime::now", "Utc::now", "Local::now", "OffsetDateTime::now_utc",
    "Uuid::now_v7", "Uuid::new_v4",
];

/// Macros that write to the process's output.
const PRINTS: [&str; 5] = ["print", "println", "eprint", "eprintln", "dbg"];

/// Crates and rooms only some files may name (by path under `src/`): SQL in the store's
/// backends; protobuf in the contract, the doors that speak gRPC and the assembly.
const CONFINED: [(&str, &[&str]); 4] = [
    ("sqlx", &SQL),
    ("rusqlite", &SQL),
    ("prost", &GRPC),
    ("crate::proto", &GRPC),
];
const SQL: [&str; 3] = ["store/sqlite/", "store/postgres/", "store/sql/"];
const GRPC: [&str; 5] = ["proto/", "api/", "cli/", "inspector/", "server.rs"];

/// The files outside `provider/` that spell JSON member names because the JSON is ctxd's own,
/// and which. Any other file's spelled name (read with `.get("…")` or `["…"]`, written as a
/// `json!` key, declared as a serde field or rename) is a provider's field: a member of JSON
/// ctxd does not define (a provider's requests and answers, the tools and tool inputs in them,
/// an agent's session files).
#[rustfmt::skip]
const OWN_JSON: [(&str, &str); 11] = [
    ("export/mod.rs", "ctxd JSONL's parts (`part_json`)"),
    ("export/ctxd.rs", "ctxd JSONL"),
    ("import/ctxd.rs", "ctxd JSONL, read back"),
    ("import/neutral.rs", "the neutral JSONL ctxd keeps its trace corpus in (docs/api.md)"),
    ("proto/json.rs", "the contract's JSON form: the inspector's API, the CLI's --json"),
    ("inspector/", "the inspector's answers and errors"),
    ("cli/", "the command line's --json output"),
    ("api/watch.rs", "the Watch cursor ctxd issues"),
    ("store/", "stored rows and node bodies"),
    ("domain/ledger/", "the evidence ledger as stored, exported and shown"),
    ("gateway/ledger.rs", "the conversation state the gateway stores"),
];

/// What still breaks a rule, each to be moved out by a change of its own: (rule, file, what
/// breaks it, as the rule says it). An entry that no longer breaks fails `not_yet_is_current`
/// until it is taken off.
#[rustfmt::skip]
const NOT_YET: &[(&str, &str, &str)] = &[
];

/// The longest a file may be, its inline tests included.
const MAX_LINES: usize = 600;

// ----------------------------------------------------------------------------------------
// Reading the source

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Ident,
    Punct,
    Str,
    Other,
}

#[derive(Clone, Debug)]
struct Tok {
    kind: Kind,
    text: String,
    line: usize,
}

impl Tok {
    fn is(&self, s: &str) -> bool {
        self.kind != Kind::Str && self.text == s
    }
}

fn is(toks: &[Tok], i: usize, s: &str) -> bool {
    toks.get(i).is_some_and(|t| t.is(s))
}

fn ident(toks: &[Tok], i: usize) -> Option<&str> {
    toks.get(i)
        .filter(|t| t.kind == Kind::Ident)
        .map(|t| t.text.as_str())
}

/// A file as tokens: comments left out, strings (raw, byte) as one token each.
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let n = c.len();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let push = |out: &mut Vec<Tok>, kind, text: String, line| out.push(Tok { kind, text, line });
    while i < n {
        let ch = c[i];
        let start = line;
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < n && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < n {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some((body, end)) = raw_string(&c, i) {
            line += body.matches('\n').count();
            push(&mut out, Kind::Str, body, start);
            i = end;
        } else if ch == '"' || (matches!(ch, 'b' | 'c') && at(i + 1) == '"') {
            let mut j = if ch == '"' { i + 1 } else { i + 2 };
            let from = j;
            while j < n && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            let body: String = c[from..j.min(n)].iter().collect();
            line += body.matches('\n').count();
            push(&mut out, Kind::Str, body, start);
            i = j + 1;
        } else if ch == '\'' || (ch == 'b' && at(i + 1) == '\'') {
            let q = if ch == '\'' { i } else { i + 1 };
            if at(q + 1) == '\\' {
                let mut j = q + 3;
                while j < n && c[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if at(q + 2) == '\'' {
                i = q + 3;
            } else {
                // A lifetime or a label.
                i = q + 1;
                while i < n && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
            push(&mut out, Kind::Other, "'".into(), start);
        } else if ch.is_alphabetic() || ch == '_' {
            let from = i;
            while i < n && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[from..i].iter().collect();
            // A raw identifier (`r#type`) is its name.
            if word == "r" && at(i) == '#' && (at(i + 1).is_alphabetic() || at(i + 1) == '_') {
                continue;
            }
            push(&mut out, Kind::Ident, word, start);
        } else if ch.is_ascii_digit() {
            let from = i;
            while i < n
                && (c[i].is_alphanumeric()
                    || c[i] == '_'
                    || (c[i] == '.' && at(i + 1).is_ascii_digit() && at(i - 1) != '.'))
            {
                i += 1;
            }
            push(&mut out, Kind::Other, c[from..i].iter().collect(), start);
        } else if ch == ':' && at(i + 1) == ':' {
            push(&mut out, Kind::Punct, "::".into(), start);
            i += 2;
        } else {
            push(&mut out, Kind::Punct, ch.to_string(), start);
            i += 1;
        }
    }
    out
}

/// A raw string (`r"…"`, `r#"…"#`, `br"…"`, `cr"…"`) at `i`: its body and where it ends.
fn raw_string(c: &[char], i: usize) -> Option<(String, usize)> {
    let r = match c.get(i)? {
        'r' => i,
        'b' | 'c' if c.get(i + 1) == Some(&'r') => i + 1,
        _ => return None,
    };
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut k = r + 1;
    while c.get(k) == Some(&'#') {
        k += 1;
    }
    let hashes = k - r - 1;
    if c.get(k) != Some(&'"') {
        return None;
    }
    let from = k + 1;
    let mut j = from;
    while j < c.len() {
        if c[j] == '"' && (1..=hashes).all(|h| c.get(j + h) == Some(&'#')) {
            return Some((c[from..j].iter().collect(), j + 1 + hashes));
        }
        j += 1;
    }
    Some((c[from..].iter().collect(), c.len()))
}

/// The index just past the group that opens at `i` (`(`, `[` or `{`).
fn close(toks: &[Tok], i: usize) -> usize {
    let mut depth = 0usize;
    for (k, t) in toks.iter().enumerate().skip(i) {
        if t.kind != Kind::Punct {
            continue;
        }
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// Whether the attribute whose `[` is at `i` compiles its item for tests only: `cfg(test)` or
/// `cfg(all(…, test, …))`.
fn test_only_attr(toks: &[Tok], i: usize) -> bool {
    let words: Vec<&str> = toks[i..close(toks, i)]
        .iter()
        .map(|t| t.text.as_str())
        .collect();
    match words.as_slice() {
        ["[", "cfg", "(", "test", ")", "]"] => true,
        ["[", "cfg", "(", "all", "(", rest @ ..] => {
            let mut depth = 0;
            rest.iter().enumerate().any(|(k, w)| {
                match *w {
                    "(" => depth += 1,
                    ")" => depth -= 1,
                    _ => {}
                }
                depth == 0 && *w == "test" && matches!(rest.get(k + 1), Some(&"," | &")"))
            })
        }
        _ => false,
    }
}

/// Where the item (or statement, field, variant) that begins at `i` ends.
fn item_end(toks: &[Tok], mut i: usize) -> usize {
    while is(toks, i, "#") && is(toks, i + 1, "[") {
        i = close(toks, i + 1);
    }
    // After its visibility, a `use`, `const`, `static`, `type` or `let` ends at its `;`.
    let mut kw = i;
    if is(toks, kw, "pub") {
        kw += 1;
        if is(toks, kw, "(") {
            kw = close(toks, kw);
        }
    }
    let to_semicolon = matches!(ident(toks, kw), Some("use" | "static" | "type" | "let"))
        || (is(toks, kw, "const") && !is(toks, kw + 1, "fn"));
    let mut k = i;
    while k < toks.len() {
        let t = &toks[k];
        if t.kind == Kind::Punct {
            match t.text.as_str() {
                "{" if !to_semicolon => return close(toks, k),
                "(" | "[" | "{" => {
                    k = close(toks, k);
                    continue;
                }
                ")" | "]" | "}" => return k,
                ";" | "," => return k + 1,
                _ => {}
            }
        }
        k += 1;
    }
    k
}

/// A file's code with every `#[cfg(test)]` item cut, the modules so cut (by name), and
/// whether the whole file is for tests (`#![cfg(test)]`).
fn cut_tests(toks: &[Tok]) -> (Vec<Tok>, Vec<String>, bool) {
    let (mut kept, mut cut_mods) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < toks.len() {
        if is(toks, i, "#") && is(toks, i + 1, "!") && is(toks, i + 2, "[") {
            if test_only_attr(toks, i + 2) {
                return (Vec::new(), Vec::new(), true);
            }
        } else if is(toks, i, "#") && is(toks, i + 1, "[") && test_only_attr(toks, i + 1) {
            let end = item_end(toks, i);
            let item = &toks[i..end];
            if let Some(m) = item.iter().position(|t| t.is("mod"))
                && let Some(name) = ident(item, m + 1)
            {
                cut_mods.push(name.to_owned());
            }
            i = end;
            continue;
        }
        kept.push(toks[i].clone());
        i += 1;
    }
    (kept, cut_mods, false)
}

/// The module a file is, `crate` first: `store/append/batch.rs` is `crate::store::append::batch`.
fn module_of(path: &str) -> Vec<String> {
    let mut segs: Vec<String> = std::iter::once("crate")
        .chain(path.trim_end_matches(".rs").split('/'))
        .map(String::from)
        .collect();
    if segs.last().is_some_and(|s| s == "mod") || matches!(path, "lib.rs" | "main.rs") {
        segs.pop();
    }
    segs
}

/// The room a file stands in: its top-level module (`main` for the binary, none for `lib.rs`).
fn room_of(path: &str) -> Option<String> {
    match path {
        "lib.rs" => None,
        "main.rs" => Some("main".into()),
        _ => module_of(path).get(1).cloned(),
    }
}

fn join(path: &[String]) -> String {
    path.join("::")
}

fn starts(path: &[String], prefix: &str) -> bool {
    let want: Vec<&str> = prefix.split("::").collect();
    path.len() >= want.len() && path.iter().zip(&want).all(|(a, b)| a == b)
}

/// One leaf of a `use` tree: its path as written (a leading `::` kept as a segment), and the
/// name it brings in (`None` for `*` and `_`).
struct Leaf {
    path: Vec<String>,
    name: Option<String>,
    glob: bool,
}

/// Reads the `use` tree at `*i` (after `use`) into `out`.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Leaf>) {
    let mut path = prefix.to_vec();
    if is(toks, *i, "::") {
        path.push("::".into());
        *i += 1;
    }
    loop {
        if is(toks, *i, "*") {
            *i += 1;
            out.push(Leaf {
                path,
                name: None,
                glob: true,
            });
            return;
        }
        if is(toks, *i, "{") {
            *i += 1;
            while *i < toks.len() && !is(toks, *i, "}") {
                use_tree(toks, i, &path, out);
                if is(toks, *i, ",") {
                    *i += 1;
                }
            }
            *i += 1;
            return;
        }
        let Some(seg) = ident(toks, *i) else {
            return;
        };
        path.push(seg.to_owned());
        *i += 1;
        if is(toks, *i, "::") {
            *i += 1;
            continue;
        }
        if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        let mut name = path.last().cloned();
        if is(toks, *i, "as") {
            name = ident(toks, *i + 1).map(String::from);
            *i += 2;
        }
        out.push(Leaf {
            path,
            name: name.filter(|n| n != "_"),
            glob: false,
        });
        return;
    }
}

/// Whether the `use` or `type` at `i` is public (`pub`, `pub(crate)`, …): a re-export.
fn public(toks: &[Tok], i: usize) -> bool {
    if i >= 1 && toks[i - 1].is("pub") {
        return true;
    }
    if i >= 1 && toks[i - 1].is(")") {
        let mut k = i - 1;
        while k > 0 && !toks[k].is("(") {
            k -= 1;
        }
        return k >= 1 && toks[k - 1].is("pub");
    }
    false
}

/// A file's reading: every path its code names (resolved), the macros it calls, the names it
/// defines, its re-exports.
#[derive(Default)]
struct Reading {
    names: Vec<(usize, Vec<String>)>,
    macros: Vec<(usize, String)>,
    defines: BTreeSet<String>,
    reexports: Vec<(Vec<String>, Vec<String>)>,
    globs: Vec<(Vec<String>, Vec<String>)>,
}

struct Resolver<'a> {
    modules: &'a BTreeSet<Vec<String>>,
    uses: HashMap<String, Vec<String>>,
    main: bool,
}

impl Resolver<'_> {
    /// What a path written in module `ctx` names: `crate` first for this crate's items.
    fn resolve(&self, raw: &[String], ctx: &[String]) -> Vec<String> {
        let with = |base: &[String], rest: &[String]| [base, rest].concat();
        match raw[0].as_str() {
            "::" => raw[1..].to_vec(),
            "crate" => raw.to_vec(),
            "ctxd" if self.main => with(&["crate".into()], &raw[1..]),
            "self" | "super" => {
                let own = usize::from(raw[0] == "self");
                let ups = raw[own..].iter().take_while(|s| *s == "super").count();
                let base = &ctx[..ctx.len().saturating_sub(ups).max(1)];
                with(base, &raw[own + ups..])
            }
            first => match self.uses.get(first) {
                Some(to) if to.as_slice() != &raw[..1] => with(to, &raw[1..]),
                _ if self.modules.contains(&with(ctx, &raw[..1])) => with(ctx, raw),
                _ => raw.to_vec(),
            },
        }
    }
}

/// Reads a file's code in module `module`.
fn read(code: &[Tok], module: &[String], main: bool, modules: &BTreeSet<Vec<String>>) -> Reading {
    let mut r = Reading::default();
    let mut leaves: Vec<(usize, Vec<String>, Leaf, bool)> = Vec::new();
    let mut paths: Vec<(usize, Vec<String>, Vec<String>)> = Vec::new();
    let mut aliases: Vec<(Vec<String>, Vec<String>, Vec<String>)> = Vec::new();
    // Inline modules open here: (brace depth, name).
    let mut inline: Vec<(usize, String)> = Vec::new();
    let within = |inline: &[(usize, String)]| -> Vec<String> {
        let inner = inline.iter().map(|(_, n)| n.clone());
        module.iter().cloned().chain(inner).collect()
    };
    let mut depth = 0usize;
    let mut i = 0;
    while i < code.len() {
        let t = &code[i];
        if t.is("{") {
            depth += 1;
        } else if t.is("}") {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|(d, _)| *d == depth) {
                inline.pop();
            }
        } else if t.is("mod") && is(code, i + 2, "{") {
            if let Some(name) = ident(code, i + 1) {
                inline.push((depth, name.to_owned()));
                r.defines.insert(name.to_owned());
                depth += 1;
                i += 3;
                continue;
            }
        } else if t.is("use") {
            let public = public(code, i);
            let mut out = Vec::new();
            i += 1;
            use_tree(code, &mut i, &[], &mut out);
            for leaf in out {
                leaves.push((t.line, within(&inline), leaf, public));
            }
            continue;
        } else if matches!(
            t.text.as_str(),
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "mod" | "union"
        ) && t.kind == Kind::Ident
        {
            if let Some(name) = ident(code, i + 1) {
                r.defines.insert(name.to_owned());
                // `pub type X = path;` hands on what the path names, as a re-export does.
                if t.is("type") && is(code, i + 2, "=") && public(code, i) {
                    let (raw, _) = path_at(code, i + 3);
                    if !raw.is_empty() {
                        aliases.push((within(&inline), vec![name.to_owned()], raw));
                    }
                }
            }
        } else if t.is("macro_rules")
            && is(code, i + 1, "!")
            && let Some(name) = ident(code, i + 2)
        {
            r.defines.insert(name.to_owned());
        }
        let starts_path = (t.kind == Kind::Ident
            || (t.is("::") && ident(code, i + 1).is_some())
            || (t.is("$") && is(code, i + 1, "crate")))
            && !(i >= 1 && (code[i - 1].is(".") || code[i - 1].is("::")));
        if starts_path {
            let (raw, end) = path_at(code, i);
            if is(code, end, "!") {
                r.macros
                    .push((t.line, raw.last().cloned().unwrap_or_default()));
            }
            if raw.len() >= 2 {
                paths.push((t.line, within(&inline), raw));
            }
            i = end.max(i + 1);
            continue;
        }
        i += 1;
    }
    // `use` names first (twice, so a `use` may build on another), then the paths in the code.
    let mut resolver = Resolver {
        modules,
        uses: HashMap::new(),
        main,
    };
    for _ in 0..2 {
        let mut uses = HashMap::new();
        for (_, ctx, leaf, _) in &leaves {
            if let Some(name) = &leaf.name {
                uses.insert(name.clone(), resolver.resolve(&leaf.path, ctx));
            }
        }
        resolver.uses = uses;
    }
    for (line, ctx, leaf, public) in &leaves {
        let to = resolver.resolve(&leaf.path, ctx);
        if *public {
            match &leaf.name {
                Some(name) if !leaf.glob => {
                    r.defines.insert(name.clone());
                    let at = [ctx.as_slice(), std::slice::from_ref(name)].concat();
                    r.reexports.push((at, to.clone()));
                }
                _ if leaf.glob => r.globs.push((ctx.clone(), to.clone())),
                _ => {}
            }
        }
        r.names.push((*line, to));
    }
    for (ctx, name, raw) in aliases {
        r.reexports.push((
            [ctx.as_slice(), &name].concat(),
            resolver.resolve(&raw, &ctx),
        ));
    }
    for (line, ctx, raw) in paths {
        r.names.push((line, resolver.resolve(&raw, &ctx)));
    }
    r
}

/// The path written at `i` (`a::b::c`, `::std::fs`, `$crate::x`) and the index after it.
fn path_at(code: &[Tok], mut i: usize) -> (Vec<String>, usize) {
    let mut raw = Vec::new();
    if is(code, i, "::") {
        raw.push("::".to_owned());
        i += 1;
    } else if is(code, i, "$") {
        i += 1;
    }
    while let Some(seg) = ident(code, i) {
        raw.push(seg.to_owned());
        i += 1;
        if is(code, i, "::") && ident(code, i + 1).is_some() {
            i += 1;
        } else {
            break;
        }
    }
    (raw, i)
}

/// One file of `src/`, read.
struct File {
    text: String,
    room: Option<String>,
    /// Compiled only for tests: declared under `#[cfg(test)]`, or inside such a module.
    test_only: bool,
    /// Its code: no comments, no `#[cfg(test)]` items.
    code: Vec<Tok>,
    reading: Reading,
}

/// The source tree and its map.
struct Tree {
    files: BTreeMap<String, File>,
    /// Every module, `crate` first: the files, and inline modules.
    modules: BTreeSet<Vec<String>>,
    /// Re-exports: what `crate::a::X` stands for.
    reexports: HashMap<Vec<String>, Vec<String>>,
    /// Glob re-exports: what each module hands on whole.
    globs: Vec<(Vec<String>, Vec<String>)>,
    /// What each module defines or re-exports, and whether it re-exports a glob.
    defines: HashMap<Vec<String>, (BTreeSet<String>, bool)>,
    /// ARCHITECTURE.md.
    map: String,
}

/// A file's code with its tests cut, kept by text: a planted copy re-reads only what changed.
fn cut(text: &str) -> std::sync::Arc<(Vec<Tok>, Vec<String>, bool)> {
    type Cuts = HashMap<String, std::sync::Arc<(Vec<Tok>, Vec<String>, bool)>>;
    static CUTS: OnceLock<std::sync::Mutex<Cuts>> = OnceLock::new();
    let cuts = CUTS.get_or_init(Default::default);
    if let Some(done) = cuts.lock().expect("the cuts").get(text) {
        return done.clone();
    }
    let done = std::sync::Arc::new(cut_tests(&lex(text)));
    cuts.lock()
        .expect("the cuts")
        .insert(text.to_owned(), done.clone());
    done
}

impl Tree {
    fn new(texts: &BTreeMap<String, String>, map: &str) -> Tree {
        let mut lexed = BTreeMap::new();
        let mut modules = BTreeSet::new();
        let mut tests: Vec<Vec<String>> = Vec::new();
        for (path, text) in texts {
            let module = module_of(path);
            let cut = cut(text);
            let (code, cut_mods, whole) = &*cut;
            if *whole {
                tests.push(module.clone());
            }
            tests.extend(
                cut_mods
                    .iter()
                    .map(|m| [module.as_slice(), std::slice::from_ref(m)].concat()),
            );
            for k in 0..code.len() {
                if code[k].is("mod")
                    && is(code, k + 2, "{")
                    && let Some(name) = ident(code, k + 1)
                {
                    modules.insert([module.as_slice(), &[name.to_owned()]].concat());
                }
            }
            modules.insert(module.clone());
            lexed.insert(path.clone(), (module, cut));
        }
        let mut tree = Tree {
            files: BTreeMap::new(),
            modules,
            reexports: HashMap::new(),
            globs: Vec::new(),
            defines: HashMap::new(),
            map: map.to_owned(),
        };
        for (path, (module, cut)) in lexed {
            let test_only = tests.iter().any(|t| module.starts_with(t));
            let code = if test_only { Vec::new() } else { cut.0.clone() };
            let reading = read(&code, &module, path == "main.rs", &tree.modules);
            tree.reexports.extend(reading.reexports.iter().cloned());
            tree.globs.extend(reading.globs.iter().cloned());
            let defines = tree.defines.entry(module).or_default();
            defines.0.extend(reading.defines.iter().cloned());
            defines.1 |= !reading.globs.is_empty();
            let file = File {
                text: texts[&path].clone(),
                room: room_of(&path),
                test_only,
                code,
                reading,
            };
            tree.files.insert(path, file);
        }
        tree
    }

    /// The files that are compiled outside tests.
    fn code(&self) -> impl Iterator<Item = (&String, &File)> {
        self.files.iter().filter(|(_, f)| !f.test_only)
    }

    /// A path with every re-export on it followed to where it leads.
    fn follow(&self, path: &[String]) -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let hop = (2..=path.len())
                .rev()
                .find_map(|k| self.reexports.get(&path[..k]).map(|to| (k, to)));
            match hop {
                Some((k, to)) if to.as_slice() != &path[..k] => path = [to, &path[k..]].concat(),
                _ => break,
            }
        }
        path
    }
}

fn floor_of(room: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&room))
}

/// What breaks a rule: where, and what (the part `NOT_YET` names).
struct Break {
    path: String,
    line: usize,
    what: String,
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let dir = if self.path.ends_with(".md") {
            ""
        } else {
            "src/"
        };
        write!(f, "{dir}{}:{}: {}", self.path, self.line, self.what)
    }
}

fn broke(path: &str, line: usize, what: String) -> Break {
    Break {
        path: path.to_owned(),
        line,
        what,
    }
}

type Rule = fn(&Tree) -> Vec<Break>;

// ----------------------------------------------------------------------------------------
// The rules

/// Rule: dependencies point down the floors; rooms on one floor never name each other.
fn floors_point_down(tree: &Tree) -> Vec<Break> {
    let mut broken = Vec::new();
    for (path, file) in tree.code() {
        let Some(room) = &file.room else { continue };
        let Some(floor) = floor_of(room) else {
            broken.push(broke(path, 1, format!("the room {room} is on no floor")));
            continue;
        };
        for (line, name) in &file.reading.names {
            let Some(other) = name.get(1).filter(|_| name[0] == "crate") else {
                continue;
            };
            if other == room || !tree.modules.contains(&name[..2]) {
                continue;
            }
            match floor_of(other) {
                Some(below) if below > floor => {}
                Some(at) => broken.push(broke(
                    path,
                    *line,
                    format!(
                        "{room} (floor {}) names {other} (floor {}): {}",
                        floor + 1,
                        at + 1,
                        join(name)
                    ),
                )),
                None => broken.push(broke(path, *line, format!("names {other}, on no floor"))),
            }
        }
    }
    broken
}

/// Rule: no door names another door, straight or through a re-export.
fn doors_apart(tree: &Tree) -> Vec<Break> {
    let door_of = |name: &[String]| -> Option<String> {
        (name.len() >= 2 && name[0] == "crate" && DOORS.contains(&name[1].as_str()))
            .then(|| name[1].clone())
    };
    let mut broken = Vec::new();
    for (path, file) in tree.code() {
        let Some(door) = file.room.as_ref().filter(|r| DOORS.contains(&r.as_str())) else {
            continue;
        };
        for (line, name) in &file.reading.names {
            let led = tree.follow(name);
            let through_glob = (2..name.len()).find_map(|k| {
                tree.globs
                    .iter()
                    .find(|(m, to)| m.as_slice() == &name[..k] && door_of(to).is_some())
                    .and_then(|(_, to)| door_of(to))
            });
            let (other, via) = match (door_of(&led), through_glob) {
                (Some(other), _) if led == *name => (other, String::new()),
                (Some(other), _) => (other, format!(" (re-exported as {})", join(name))),
                (None, Some(other)) => (other.clone(), format!(" (a glob re-export of {other})")),
                (None, None) => continue,
            };
            if other != *door {
                broken.push(broke(
                    path,
                    *line,
                    format!(
                        "the {door} door names the {other} door: {}{via}",
                        join(&led)
                    ),
                ));
            }
        }
    }
    broken
}

/// Rule: the engine does no I/O and never reads the clock.
fn engine_pure(tree: &Tree) -> Vec<Break> {
    let mut broken = Vec::new();
    for (path, file) in tree.code() {
        let Some(room) = file.room.as_ref().filter(|r| ENGINE.contains(&r.as_str())) else {
            continue;
        };
        for (line, name) in &file.reading.names {
            let written = join(name);
            let impure = IMPURE
                .iter()
                .find(|p| starts(name, p))
                .copied()
                .or_else(|| {
                    CLOCK_CALLS
                        .iter()
                        .find(|c| written == **c || written.ends_with(&format!("::{c}")))
                        .copied()
                });
            if let Some(what) = impure {
                broken.push(broke(
                    path,
                    *line,
                    format!("the engine ({room}) names {what}: {written}"),
                ));
            }
        }
        for (line, mac) in &file.reading.macros {
            if PRINTS.contains(&mac.as_str()) {
                broken.push(broke(
                    path,
                    *line,
                    format!("the engine ({room}) prints: {mac}!"),
                ));
            }
        }
    }
    broken
}

/// Rule: a confined crate (or room) is named only in the files it is confined to.
fn confined(tree: &Tree) -> Vec<Break> {
    let mut broken = Vec::new();
    for (path, file) in tree.code() {
        for (line, name) in &file.reading.names {
            for (what, within) in CONFINED {
                if starts(name, what) && !within.iter().any(|w| path.starts_with(w)) {
                    let why = format!("names {what} outside {}", within.join(", "));
                    broken.push(broke(path, *line, why));
                }
            }
        }
    }
    broken
}

/// The JSON member names a file's code spells, with how: read (`.get("…")`, `["…"]`), written
/// (`json!` keys), or declared (serde renames, fields of serde structs).
fn json_members(code: &[Tok]) -> Vec<(usize, String, &'static str)> {
    const ACCESSORS: [&str; 8] = [
        "with_entries",
        "get",
        "get_mut",
        "pointer",
        "insert",
        "remove",
        "contains_key",
        "entry",
    ];
    const NOT_VALUES: [&str; 6] = ["return", "in", "break", "else", "match", "if"];
    let member = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_alphanumeric() || c == '_')
    };
    let mut out = Vec::new();
    for (i, t) in code.iter().enumerate() {
        if t.kind == Kind::Str && i >= 3 && member(&t.text) {
            let prev = &code[i - 2];
            if code[i - 1].is("(") && code[i - 3].is(".") && ACCESSORS.contains(&prev.text.as_str())
            {
                out.push((t.line, t.text.clone(), "accessed"));
            }
            if code[i - 1].is("[")
                && is(code, i + 1, "]")
                && (prev.is(")")
                    || prev.is("]")
                    || (prev.kind == Kind::Ident && !NOT_VALUES.contains(&prev.text.as_str())))
            {
                out.push((t.line, t.text.clone(), "indexed"));
            }
        }
        // `json!({"key": …})`: a string followed by `:` is a key.
        if t.is("json") && is(code, i + 1, "!") {
            let end = close(code, i + 2);
            for k in i + 2..end {
                if code[k].kind == Kind::Str && is(code, k + 1, ":") {
                    out.push((code[k].line, code[k].text.clone(), "a json! key"));
                }
            }
        }
        if t.is("#") && is(code, i + 1, "[") {
            let end = close(code, i + 1);
            let attr = &code[i + 1..end];
            if is(attr, 1, "serde") {
                for k in 2..attr.len() {
                    let key = attr[k.saturating_sub(2)].text.as_str();
                    if attr[k].kind == Kind::Str
                        && attr[k - 1].is("=")
                        && matches!(
                            key,
                            "rename" | "alias" | "tag" | "content" | "serialize" | "deserialize"
                        )
                    {
                        out.push((attr[k].line, attr[k].text.clone(), "a serde name"));
                    }
                }
            }
            let derives_serde = is(attr, 1, "derive")
                && attr
                    .iter()
                    .any(|a| a.is("Serialize") || a.is("Deserialize"));
            if derives_serde {
                serde_fields(code, end, &mut out);
            }
        }
    }
    out
}

/// The names the serde item after its attributes at `i` puts in JSON: a struct's fields, an
/// enum's variants (unless untagged) and their fields.
fn serde_fields(code: &[Tok], mut i: usize, out: &mut Vec<(usize, String, &'static str)>) {
    let mut untagged = false;
    while is(code, i, "#") && is(code, i + 1, "[") {
        let end = close(code, i + 1);
        untagged |= code[i..end].iter().any(|t| t.is("untagged"));
        i = end;
    }
    let Some(k) = (i..code.len()).find(|&k| ["{", "(", ";"].iter().any(|p| code[k].is(p))) else {
        return;
    };
    let is_enum = code[i..k].iter().any(|t| t.is("enum"));
    if code[k].is("{") {
        serde_body(code, k, is_enum && !untagged, out);
    }
}

/// The fields (or, for `variants`, the variants and their fields) of the body opening at `open`.
fn serde_body(
    code: &[Tok],
    open: usize,
    variants: bool,
    out: &mut Vec<(usize, String, &'static str)>,
) {
    let end = close(code, open);
    let mut k = open + 1;
    while k + 1 < end {
        let start = k;
        // Its attributes: skipped, flattened and renamed members spell no name of their own.
        let mut own = true;
        while is(code, k, "#") && is(code, k + 1, "[") {
            let e = close(code, k + 1);
            own &= !code[k..e]
                .iter()
                .any(|t| ["skip", "flatten", "rename"].iter().any(|w| t.is(w)));
            k = e;
        }
        if is(code, k, "pub") {
            k += 1;
            if is(code, k, "(") {
                k = close(code, k);
            }
        }
        if let Some(name) = ident(code, k) {
            if own && (variants || is(code, k + 1, ":")) {
                let how = if variants {
                    "a serde variant"
                } else {
                    "a serde field"
                };
                out.push((code[k].line, name.to_owned(), how));
            }
            if is(code, k + 1, "{") {
                serde_body(code, k + 1, false, out);
            }
        }
        k = item_end(code, k).max(start + 1);
    }
}

/// Rule: outside `provider/`, only the modules that own a ctxd JSON format ([`OWN_JSON`]) spell
/// JSON member names: any other name spelled is a provider's (or an agent's) field.
fn provider_fields_in_provider(tree: &Tree) -> Vec<Break> {
    let mut broken = Vec::new();
    for (path, file) in tree.code() {
        if file.room.as_deref() == Some("provider")
            || OWN_JSON.iter().any(|(own, _)| path.starts_with(own))
        {
            continue;
        }
        for (line, name, how) in json_members(&file.code) {
            broken.push(broke(
                path,
                line,
                format!("spells the provider field {name:?} ({how})"),
            ));
        }
    }
    broken
}

/// Rule: every module opens with a `//!` line saying what it owns.
fn modules_say_what_they_own(tree: &Tree) -> Vec<Break> {
    tree.files
        .iter()
        .filter(|(_, f)| !f.text.trim_start().starts_with("//!"))
        .map(|(path, _)| broke(path, 1, "does not open with a //! line".into()))
        .collect()
}

/// Rule: no file over [`MAX_LINES`], its inline tests included.
fn rooms_sized(tree: &Tree) -> Vec<Break> {
    tree.files
        .iter()
        .map(|(path, f)| (path, f.text.lines().count()))
        .filter(|(_, lines)| *lines > MAX_LINES)
        .map(|(path, lines)| broke(path, 1, format!("{lines} lines (at most {MAX_LINES})")))
        .collect()
}

// ----------------------------------------------------------------------------------------
// The map: ARCHITECTURE.md

/// The floors of the map's "Floors" block: a line that begins at the margin starts a floor,
/// one indented by two spaces continues its rooms; the rooms are the words of the left column.
fn floors_block(map: &str) -> Vec<(Vec<String>, String)> {
    let block = map
        .split("## Floors")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .unwrap_or_default();
    let mut floors: Vec<(Vec<String>, String)> = Vec::new();
    for line in block.lines().skip(1) {
        let indent = line.len() - line.trim_start().len();
        let (left, text) = line
            .trim_start()
            .split_once("  ")
            .unwrap_or((line.trim_start(), ""));
        let rooms: Vec<String> = left
            .split_whitespace()
            .map(|w| {
                w.trim_end_matches(',')
                    .trim_end_matches('/')
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .collect();
        match (indent, floors.last_mut()) {
            (0, _) => floors.push((rooms, text.to_owned())),
            (2, Some(floor)) => {
                floor.0.extend(rooms);
                floor.1 = format!("{} {text}", floor.1);
            }
            (_, Some(floor)) => floor.1 = format!("{} {}", floor.1, line.trim()),
            _ => {}
        }
    }
    floors
}

/// The map's prose in units (a bullet, a paragraph), each with the module its bullet is about
/// (`- **`store::sqlite`**`), fenced blocks left out.
fn prose(map: &str) -> Vec<(Option<Vec<String>>, String)> {
    let mut units: Vec<(Option<Vec<String>>, String)> = Vec::new();
    let mut fenced = false;
    for line in map.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let subject = line
            .strip_prefix("- **`")
            .and_then(|s| s.split_once('`'))
            .map(|(m, _)| module_of(&m.replace("::", "/")));
        if line.starts_with("- ") || line.starts_with('#') || units.is_empty() {
            units.push((subject, String::new()));
        }
        if let Some(unit) = units.last_mut() {
            unit.1.push_str(line);
            unit.1.push('\n');
        }
    }
    units
}

/// The paths a piece of text spells: `a::b::c` (a `::{x, y}` group spread), and `a/` for a
/// module by its directory.
fn spelled(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !(chars[i].is_alphabetic() || chars[i] == '_') || (i > 0 && word(chars[i - 1])) {
            i += 1;
            continue;
        }
        let mut path = Vec::new();
        loop {
            let from = i;
            while i < chars.len() && word(chars[i]) {
                i += 1;
            }
            path.push(chars[from..i].iter().collect::<String>());
            if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
                i += 2;
                if chars.get(i) == Some(&'{') {
                    let end = chars[i..]
                        .iter()
                        .position(|c| *c == '}')
                        .map_or(chars.len(), |e| i + e);
                    let group: String = chars[i + 1..end].iter().collect();
                    for member in group.split(',') {
                        for tail in spelled(member) {
                            out.push([path.clone(), tail].concat());
                        }
                    }
                    i = end;
                    path.clear();
                    break;
                }
                continue;
            }
            break;
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    out
}

/// Rule: the map and the code agree. The Floors block is [`FLOORS`] and holds every room; every
/// module is placed (a room by its floor, any other module by the map naming it or a module
/// that holds it); every path the map names under a module exists.
fn map_places_every_module(tree: &Tree) -> Vec<Break> {
    const MAP: &str = "ARCHITECTURE.md";
    let mut broken = Vec::new();
    let block = floors_block(&tree.map);
    let drawn: Vec<Vec<String>> = block.iter().map(|(rooms, _)| rooms.clone()).collect();
    let table: Vec<Vec<String>> = FLOORS
        .iter()
        .map(|f| f.iter().map(|r| r.to_string()).collect())
        .collect();
    if drawn != table {
        let why = format!("the Floors block draws {drawn:?}, the test's table is {table:?}");
        broken.push(broke(MAP, 1, why));
    }
    let rooms: BTreeSet<String> = tree.files.keys().filter_map(|p| room_of(p)).collect();
    let floored: BTreeSet<String> = FLOORS
        .iter()
        .flat_map(|f| f.iter())
        .map(|r| r.to_string())
        .collect();
    for room in floored.difference(&rooms) {
        broken.push(broke(
            MAP,
            1,
            format!("the floor room {room} is not in src/"),
        ));
    }
    for (path, file) in &tree.files {
        if let Some(room) = file.room.as_ref().filter(|r| !floored.contains(*r)) {
            broken.push(broke(path, 1, format!("the room {room} is on no floor")));
        }
    }
    // The modules the map names: each path's longest module prefix. A path that goes on past
    // its module must go on to something the module defines.
    let mut named: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut place = |path: &[String], broken: &mut Vec<Break>| {
        let mut module = vec!["crate".to_owned()];
        while let Some(next) = path.get(module.len() - 1) {
            let deeper = [module.as_slice(), std::slice::from_ref(next)].concat();
            if !tree.modules.contains(&deeper) {
                break;
            }
            module = deeper;
        }
        let item = path.get(module.len() - 1);
        if item.is_some_and(|i| !defined(tree, &module, i)) {
            let why = format!(
                "names {}, which {} does not define",
                join(path),
                join(&module[1..])
            );
            broken.push(broke(MAP, 1, why));
        }
        named.insert(module);
    };
    // The Floors block: paths from the crate, and `dir/` under the floor's rooms.
    for (floor, text) in &block {
        for path in spelled(text).into_iter().filter(|p| rooms.contains(&p[0])) {
            place(&path, &mut broken);
        }
        for word in text.split(|c: char| c.is_whitespace() || c == '(' || c == ',') {
            for room in floor {
                if let Some(dir) = word.strip_suffix('/') {
                    let path = [room.clone(), dir.to_owned()];
                    if tree
                        .modules
                        .contains(&[&["crate".to_owned()], &path[..]].concat())
                    {
                        place(&path, &mut broken);
                    }
                }
            }
        }
    }
    // The prose: a bullet's subject, and every `code` span in it, relative to the subject (or
    // its room) where that names a module, else from the crate.
    for (subject, text) in prose(&tree.map) {
        if let Some(subject) = &subject {
            place(&subject[1..], &mut broken);
        }
        for span in text.split('`').skip(1).step_by(2) {
            for path in spelled(span) {
                let dir = span.trim_end().ends_with('/') && path.len() == 1;
                let absolute = rooms.contains(&path[0]);
                let relative = subject
                    .iter()
                    .flat_map(|s| [s[1..].to_vec(), s[1..2].to_vec()])
                    .find(|base| {
                        let first = [&["crate".to_owned()], base.as_slice(), &path[..1]].concat();
                        tree.modules.contains(&first)
                    });
                match relative {
                    _ if absolute && path.len() > 1 => place(&path, &mut broken),
                    Some(base) => place(&[base, path].concat(), &mut broken),
                    None if absolute && dir => place(&path, &mut broken),
                    None => {}
                }
            }
        }
    }
    for (path, file) in tree.code() {
        let module = module_of(path);
        let placed = file.room.is_none()
            || module.len() <= 2
            || (3..=module.len()).any(|k| named.contains(&module[..k]));
        if !placed {
            let why = format!("{} is placed nowhere in {MAP}", join(&module[1..]));
            broken.push(broke(path, 1, why));
        }
    }
    broken
}

/// Whether `module` defines (or re-exports) `item`.
fn defined(tree: &Tree, module: &[String], item: &str) -> bool {
    tree.defines
        .get(module)
        .is_some_and(|(names, glob)| *glob || names.contains(item))
}

// ----------------------------------------------------------------------------------------
// The tests

fn texts() -> &'static (BTreeMap<String, String>, String) {
    static TEXTS: OnceLock<(BTreeMap<String, String>, String)> = OnceLock::new();
    TEXTS.get_or_init(|| {
        fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
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
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = BTreeMap::new();
        walk(&root.join("src"), &root.join("src"), &mut files);
        let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("the map");
        (files, map)
    })
}

fn tree() -> &'static Tree {
    static TREE: OnceLock<Tree> = OnceLock::new();
    TREE.get_or_init(|| {
        let (files, map) = texts();
        Tree::new(files, map)
    })
}

const RULES: [(&str, Rule); 8] = [
    ("floors", floors_point_down),
    ("doors", doors_apart),
    ("engine", engine_pure),
    ("confined", confined),
    ("provider fields", provider_fields_in_provider),
    ("owns", modules_say_what_they_own),
    ("map", map_places_every_module),
    ("lines", rooms_sized),
];

fn rule(name: &str) -> Rule {
    RULES.iter().find(|(n, _)| *n == name).expect("a rule").1
}

/// Whether `NOT_YET` lists a break.
fn not_yet(name: &str, b: &Break) -> bool {
    NOT_YET
        .iter()
        .any(|(r, p, w)| *r == name && *p == b.path && b.what.starts_with(w))
}

/// Runs a rule over the source: nothing may break it but what [`NOT_YET`] lists.
fn holds(name: &str) {
    let tree = tree();
    assert!(tree.files.len() > 100, "read the whole source tree");
    let broken: Vec<String> = rule(name)(tree)
        .iter()
        .filter(|b| !not_yet(name, b))
        .map(|b| b.to_string())
        .collect();
    assert!(broken.is_empty(), "{name}:\n{}", broken.join("\n"));
}

#[test]
fn the_floors_point_down() {
    holds("floors");
}

#[test]
fn doors_are_apart() {
    holds("doors");
}

#[test]
fn the_engine_does_no_io_and_reads_no_clock() {
    holds("engine");
}

#[test]
fn confined_crates_stay_in_their_rooms() {
    holds("confined");
}

#[test]
fn only_provider_spells_provider_fields() {
    holds("provider fields");
}

#[test]
fn every_module_says_what_it_owns() {
    holds("owns");
}

#[test]
fn the_map_places_every_module() {
    holds("map");
}

#[test]
fn no_file_is_over_600_lines() {
    holds("lines");
}

/// Every entry of [`NOT_YET`] still breaks its rule: what was moved is taken off the list.
#[test]
fn not_yet_is_current() {
    let tree = tree();
    let stale: Vec<String> = NOT_YET
        .iter()
        .filter(|(r, p, w)| {
            !rule(r)(tree)
                .iter()
                .any(|b| b.path == *p && b.what.starts_with(w))
        })
        .map(|(r, p, w)| format!("{r}: src/{p}: {w}: holds now, take it off NOT_YET"))
        .collect();
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

/// Where a planted line goes: after the file's first line, at its end (after its
/// `#[cfg(test)]` items), or as the whole of a new or replaced file.
#[derive(Clone, Copy, Debug)]
enum At {
    Top,
    End,
    Whole,
}

/// A copy of the tree with lines planted in files, and the map edited (`old` → `new`; an
/// empty `old` appends).
fn planted(files: &[(&str, At, &str)], map: Option<(&str, &str)>) -> Tree {
    let (texts, original) = texts();
    let mut texts = texts.clone();
    for (path, at, line) in files {
        let text = texts.entry(path.to_string()).or_default();
        *text = match (at, text.split_once('\n')) {
            (Top, Some((first, rest))) => format!("{first}\n{line}\n{rest}"),
            (Top | End, _) => format!("{text}\n{line}\n"),
            (Whole, _) => line.to_string(),
        };
    }
    let map = match map {
        Some(("", new)) => format!("{original}\n{new}\n"),
        Some((old, new)) => {
            assert!(original.contains(old), "the map says {old:?}");
            original.replacen(old, new, 1)
        }
        None => original.clone(),
    };
    Tree::new(&texts, &map)
}

use At::{End, Top, Whole};

/// Violations where a reading by lines is blind: (rule, file, where, what). Each is caught in
/// its file.
#[rustfmt::skip]
const PLANTS: [(&str, &str, At, &str); 29] = [
    // A middle floor pointing up, written every way a path can be.
    ("floors", "workflow/mod.rs", End, "use crate::api::status;"),
    ("floors", "workflow/savings.rs", Top, "use super::super::api::status;"),
    ("floors", "workflow/record/mod.rs", Top, "use super::super::gateway::Gateway;"),
    ("floors", "render/tiers/fold.rs", Top, "use super::super::super::store::Store;"),
    ("floors", "compact/mod.rs", Top, "use crate::{domain::Node, workflow::{Workflows, import}};"),
    ("floors", "provider/models.rs", Top, "use self::super::super::workflow::Workflows;"),
    ("floors", "store/mod.rs", End, "fn f() -> crate::provider::models::ModelTable { todo!() }"),
    // After a file's first `#[cfg(test)]` item, where its code goes on.
    ("floors", "domain/ledger/mod.rs", End, "use crate::store::Store;"),
    ("floors", "provider/responses/mod.rs", End, "fn f() { crate::gateway::serve(); }"),
    ("doors", "api/mod.rs", End, "use crate::gateway::Gateway;"),
    // The engine's I/O and clock: grouped, absolute, brought in by a `use`, or printed.
    ("engine", "render/mod.rs", End, "fn f() { std::time::SystemTime::now(); }"),
    ("engine", "render/stub.rs", Top, "use std::{fs, net};"),
    ("engine", "compact/segment.rs", Top, "fn f() { ::std::fs::read(\"x\"); }"),
    ("engine", "tokens/mod.rs", Top, "use std::time::Instant;\nfn f() { Instant::now(); }"),
    ("engine", "domain/summary.rs", Top, "fn f() { chrono::Utc::now(); }"),
    ("engine", "render/overlay.rs", End, "async fn f() { tokio::task::yield_now().await; }"),
    ("engine", "domain/ledger/mod.rs", End, "fn f() { println!(\"x\"); }"),
    ("confined", "workflow/mod.rs", Top, "use sqlx::Row;"),
    ("confined", "store/append/batch.rs", End, "fn f(_: sqlx::Error) {}"),
    ("confined", "gateway/json.rs", Top, "use prost::Message;"),
    // Provider fields: read, indexed, written, declared.
    ("provider fields", "workflow/mod.rs", End, "fn f(v: &Value) { v.get(\"tool_use_id\"); }"),
    ("provider fields", "api/render.rs", End, "fn f(v: Value) { &v[\"cache_control\"]; }"),
    ("provider fields", "summarizer.rs", End, "fn f() { json!({\"stop_reason\": 1}); }"),
    ("provider fields", "economy.rs", Top, "#[derive(Serialize)]\nstruct R { max_tokens: u32 }"),
    ("provider fields", "workflow/render.rs", Top, "#[derive(Deserialize)]\nstruct U(#[serde(rename = \"prompt_tokens\")] u32);"),
    ("owns", "workflow/mod.rs", Whole, "use std::sync::Arc;\n"),
    // A module, or a room, the map does not place.
    ("map", "render/sketch.rs", Whole, "//! A sketch.\n"),
    ("map", "sketch.rs", Whole, "//! A sketch.\n"),
    ("lines", "render/long.rs", Whole, ""),
];

/// A line planted in a file: (file, where, what); an edit of the map: (`old`, `new`).
type Edit = (&'static str, At, &'static str);
type MapEdit = Option<(&'static str, &'static str)>;

/// Violations that take more than one line: a door's type handed to another door by a lower
/// room's re-export (and a glob's), a path the map names that is not there, a floor the map
/// draws that the table does not have.
#[rustfmt::skip]
const PLANTED_ACROSS: [(&str, &[Edit], MapEdit, &str); 4] = [
    ("doors", &[("workflow/savings.rs", End, "pub use crate::api::Framing;"),
                ("inspector/query.rs", End, "use crate::workflow::savings::Framing;")],
     None, "inspector/query.rs"),
    ("doors", &[("workflow/import.rs", End, "pub use crate::gateway::*;"),
                ("api/render.rs", End, "fn f() { crate::workflow::import::Gateway::new; }")],
     None, "api/render.rs"),
    ("map", &[], Some(("", "- **`render`**: the ledger as text (`render::evidence`).")),
     "ARCHITECTURE.md"),
    ("map", &[], Some(("\nhook.rs ", "\n  hook.rs")), "ARCHITECTURE.md"),
];

#[test]
fn each_rule_catches_a_planted_violation() {
    let tree = tree();
    // 601 lines, most of them a test module.
    let long = format!(
        "//! Long.\n#[cfg(test)]\nmod tests {{\n{}}}\n",
        "//\n".repeat(MAX_LINES)
    );
    let single = PLANTS.iter().map(|&(rule, path, at, line)| {
        let line = if rule == "lines" { long.as_str() } else { line };
        (rule, vec![(path, at, line)], None, path)
    });
    let across = PLANTED_ACROSS
        .iter()
        .map(|&(rule, files, map, caught)| (rule, files.to_vec(), map, caught));
    let mut before: HashMap<&str, Vec<Break>> = HashMap::new();
    for (name, files, map, caught) in single.chain(across) {
        let check = rule(name);
        let before = before.entry(name).or_insert_with(|| check(tree));
        assert!(
            !before.iter().any(|b| b.path == caught),
            "{name}: {caught}: holds before"
        );
        let found = check(&planted(&files, map));
        assert!(
            found.iter().any(|b| b.path == caught),
            "{name}: {files:?} {map:?} is not caught"
        );
    }
}

/// What `#[cfg(test)]` marks is cut, and only that: a test module, a test-only `use`.
#[test]
fn only_test_items_are_cut() {
    let tests = "#[cfg(test)]\nuse crate::api::status;\n#[cfg(test)]\nmod t {\n    use crate::gateway::Gateway;\n}\n#[cfg(test)]\nfn t() {\n    crate::cli::main();\n}";
    let tree = planted(&[("workflow/savings.rs", End, tests)], None);
    assert!(
        floors_point_down(&tree)
            .iter()
            .all(|b| b.path != "workflow/savings.rs")
    );
    let after = format!("{tests}\nuse crate::api::status;");
    let tree = planted(&[("workflow/savings.rs", End, &after)], None);
    assert!(
        floors_point_down(&tree)
            .iter()
            .any(|b| b.path == "workflow/savings.rs")
    );
}
