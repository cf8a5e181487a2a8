//! The routing test: every statement ctxd runs on PostgreSQL names its routing key
//! (docs/scaling.md) by a bind parameter and joins no table distributed by another key, proven
//! on the statements sqlx actually executes, captured through `tracing` while a real server
//! serves CreateSession, Append, Render, PrepareCompaction, CommitSummary, CancelCompaction and
//! DeleteSession, and their answers for plans that are unknown or whose session is deleted.
//! The store runs its distributed form (`pg_batch_per_session`: a transaction per session's
//! appends, head updates one per head), as on Citus. Its own test binary, so the process-wide
//! subscriber sees only its statements.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

use ctxd::api::pb;
use ctxd::server::Options;
use ctxd::store::{Config, Store};
use pb::context_store_client::ContextStoreClient;
use sqlx::Connection;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

// ---------------------------------------------------------------- the routing rule

/// Tables of a session's data and the column a distributed layout shards them by.
const SESSION_TABLES: [(&str, &str); 14] = [
    ("sessions", "id"),
    ("blobs", "session_id"),
    ("nodes", "session_id"),
    ("branches", "session_id"),
    ("functions", "session_id"),
    ("idempotency", "session_id"),
    ("compactions", "session_id"),
    ("summaries", "session_id"),
    ("compaction_events", "session_id"),
    ("pins", "session_id"),
    ("gateway_calls", "session_id"),
    ("gateway_conversations", "session_id"),
    ("summarizer_sources", "session_id"),
    ("tombstones", "session_id"),
];

/// The tables keyed by something else by design, and the key each is distributed by.
const EXCEPTIONS: [(&str, &str); 4] = [
    // Creation keys: looked up by tenant and key before the session exists.
    ("session_keys", "key"),
    // Plan → session: CommitSummary and CancelCompaction name only the plan.
    ("compaction_owners", "id"),
    // Plans a deletion found open, by plan too.
    ("tombstone_plans", "compaction_id"),
    // The summarizer's cache, shared by every session.
    ("summarizer_outputs", "source_key"),
];

fn routing_key(table: &str) -> Option<(&'static str, bool)> {
    SESSION_TABLES
        .iter()
        .map(|&(t, k)| (t, k, false))
        .chain(EXCEPTIONS.iter().map(|&(t, k)| (t, k, true)))
        .find(|(t, _, _)| *t == table)
        .map(|(_, k, exception)| (k, exception))
}

/// How one table reference of a statement is routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    /// Its key equals one bind parameter: one shard.
    Param,
    /// Its key is one of an array bound as one parameter (`= ANY($n)`): the shards of those
    /// keys only.
    AnyParam,
    /// Its key is bound per row of a multi-row VALUES list (a group-commit batch's rows, which
    /// may belong to several sessions).
    PerRow,
    /// Nothing binds its key: every shard.
    Unbound,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// BEGIN, COMMIT, ROLLBACK, savepoints.
    TxControl,
    /// Every table it names is routed by its key; (table, key, binding) for each.
    Routed(Vec<(String, &'static str, Binding)>),
    /// A table it names is not routed by its key, or is unknown: the reason.
    Unrouted(String),
}

impl Verdict {
    fn is_ok(&self) -> bool {
        !matches!(self, Verdict::Unrouted(_))
    }

    fn label(&self) -> String {
        match self {
            Verdict::TxControl => "tx".into(),
            Verdict::Unrouted(why) => format!("UNROUTED: {why}"),
            Verdict::Routed(refs) if refs.is_empty() => "no table".into(),
            Verdict::Routed(refs) => refs
                .iter()
                .map(|(table, key, binding)| {
                    let how = match binding {
                        Binding::Param => "$",
                        Binding::AnyParam => "any $",
                        Binding::PerRow => "$ per row",
                        Binding::Unbound => "unbound",
                    };
                    let exception = if routing_key(table).is_some_and(|(_, e)| e) {
                        " (exception)"
                    } else {
                        ""
                    };
                    format!("{table}.{key} = {how}{exception}")
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// An identifier or keyword, lower-cased, dotted parts joined (`n.session_id`).
    Word(String),
    Param,
    Literal,
    Punct(char),
    /// `=`, `<`, `::`, `+`, …
    Op(String),
}

fn tokenize(sql: &str) -> Vec<Tok> {
    let chars: Vec<char> = sql.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '\'' {
            i += 1;
            while i < chars.len() {
                if chars[i] == '\'' && chars.get(i + 1) == Some(&'\'') {
                    i += 2;
                } else if chars[i] == '\'' {
                    break;
                } else {
                    i += 1;
                }
            }
            i += 1;
            toks.push(Tok::Literal);
        } else if c == '$' && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            toks.push(Tok::Param);
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            toks.push(Tok::Literal);
        } else if c.is_alphabetic() || c == '_' || c == '"' {
            let mut word = String::new();
            loop {
                if chars.get(i) == Some(&'"') {
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        word.push(chars[i]);
                        i += 1;
                    }
                    i += 1;
                } else {
                    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                        word.push(chars[i].to_ascii_lowercase());
                        i += 1;
                    }
                }
                let next_is_part = chars
                    .get(i + 1)
                    .is_some_and(|n| n.is_alphabetic() || *n == '_' || *n == '"');
                if chars.get(i) == Some(&'.') && next_is_part {
                    word.push('.');
                    i += 1;
                } else {
                    break;
                }
            }
            toks.push(Tok::Word(word));
        } else if "(),;.[]".contains(c) {
            toks.push(Tok::Punct(c));
            i += 1;
        } else {
            let mut op = String::new();
            while i < chars.len() && "<>=!+-*/%|&~^:#@?".contains(chars[i]) {
                op.push(chars[i]);
                i += 1;
            }
            if op.is_empty() {
                op.push(c);
                i += 1;
            }
            toks.push(Tok::Op(op));
        }
    }
    toks
}

/// Words that end a table name or alias.
const KEYWORDS: &str = "all and any as asc by collate conflict cross delete desc distinct do \
     except for from full group having in inner insert intersect into is join lateral left limit \
     natural not nothing null offset on or order outer recursive returning right select set share \
     union update using values where with";

fn is_keyword(word: &str) -> bool {
    KEYWORDS.split_whitespace().any(|k| k == word)
}

fn word(tok: Option<&Tok>) -> Option<&str> {
    match tok {
        Some(Tok::Word(w)) => Some(w.as_str()),
        _ => None,
    }
}

/// A table (or derived VALUES list) a statement names.
struct TableRef {
    table: String,
    alias: String,
}

/// A multi-row `VALUES (…), (…)` list: per column, whether every row binds it to a parameter.
fn values_columns(toks: &[Tok], mut i: usize) -> (Vec<bool>, usize, usize) {
    // `toks[i]` is `values`; returns (bound per column, rows, index after the list).
    i += 1;
    let mut bound: Option<Vec<bool>> = None;
    let mut rows = 0;
    while toks.get(i) == Some(&Tok::Punct('(')) {
        let mut depth = 0;
        let mut cols: Vec<Vec<Tok>> = vec![Vec::new()];
        i += 1;
        while i < toks.len() {
            match &toks[i] {
                Tok::Punct('(') => depth += 1,
                Tok::Punct(')') if depth == 0 => break,
                Tok::Punct(')') => depth -= 1,
                Tok::Punct(',') if depth == 0 => {
                    cols.push(Vec::new());
                    i += 1;
                    continue;
                }
                _ => {}
            }
            cols.last_mut().expect("a column").push(toks[i].clone());
            i += 1;
        }
        i += 1;
        rows += 1;
        // A column is bound if it is one parameter, with or without a cast.
        let row: Vec<bool> = cols
            .iter()
            .map(|c| {
                c.first() == Some(&Tok::Param)
                    && (c.len() == 1
                        || (c.len() == 3
                            && c[1] == Tok::Op("::".into())
                            && word(c.get(2)).is_some()))
            })
            .collect();
        bound = Some(match bound {
            None => row,
            Some(b) => b.iter().zip(&row).map(|(a, r)| *a && *r).collect(),
        });
        if toks.get(i) == Some(&Tok::Punct(',')) {
            i += 1;
        } else {
            break;
        }
    }
    (bound.unwrap_or_default(), rows, i)
}

/// A parenthesised list of column names at `toks[i]`: the names and the index after it.
fn name_list(toks: &[Tok], mut i: usize) -> Option<(Vec<String>, usize)> {
    if toks.get(i) != Some(&Tok::Punct('(')) {
        return None;
    }
    let mut names = Vec::new();
    i += 1;
    loop {
        names.push(word(toks.get(i))?.to_owned());
        i += 1;
        match toks.get(i) {
            Some(Tok::Punct(',')) => i += 1,
            Some(Tok::Punct(')')) => return Some((names, i + 1)),
            _ => return None,
        }
    }
}

/// Union-find over `alias.column` names and the two bindings.
#[derive(Default)]
struct Classes(HashMap<String, String>);

impl Classes {
    fn find(&mut self, x: &str) -> String {
        let parent = self.0.get(x).cloned().unwrap_or_else(|| x.to_owned());
        if parent == x {
            return parent;
        }
        let root = self.find(&parent);
        self.0.insert(x.to_owned(), root.clone());
        root
    }

    fn union(&mut self, a: &str, b: &str) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.0.insert(ra, rb);
        }
    }
}

const PARAM: &str = "$";
const ANY_PARAM: &str = "$any";

/// What a table is distributed with: a session table with every other, an exception alone.
fn colocation(table: &str) -> &str {
    match routing_key(table) {
        Some((_, false)) => "sessions",
        _ => table,
    }
}

/// Decides how a statement is routed: each session table it names must have its key equal to
/// a bind parameter, directly or through equalities with other such keys, in a conjunction
/// (an equality under an OR routes nothing); each exception table by its own key.
fn classify(sql: &str) -> Verdict {
    let toks = tokenize(sql);
    let first = word(toks.first()).unwrap_or("");
    if matches!(
        first,
        "begin" | "commit" | "rollback" | "savepoint" | "release" | "start" | "end"
    ) {
        return Verdict::TxControl;
    }
    // The parenthesis group of each token, and the groups with an OR in them.
    let mut group = Vec::with_capacity(toks.len());
    let mut stack = vec![usize::MAX];
    let mut ored = HashSet::new();
    for (i, t) in toks.iter().enumerate() {
        if *t == Tok::Punct(')') {
            stack.pop();
        }
        let g = *stack.last().unwrap_or(&usize::MAX);
        group.push(g);
        if *t == Tok::Punct('(') {
            stack.push(i);
        }
        if word(Some(t)) == Some("or") {
            ored.insert(g);
        }
    }
    // Common table expressions: names, not tables.
    let mut ctes = HashSet::new();
    for (i, t) in toks.iter().enumerate() {
        let starts =
            word(Some(t)) == Some("with") || (*t == Tok::Punct(',') && group[i] == usize::MAX);
        if !starts {
            continue;
        }
        let after = i + 1;
        let at = if word(toks.get(after)) == Some("recursive") {
            after + 1
        } else {
            after
        };
        if let Some(name) = word(toks.get(at)).filter(|w| !is_keyword(w)) {
            let next = match name_list(&toks, at + 1) {
                Some((_, j)) => j,
                None => at + 1,
            };
            if word(toks.get(next)) == Some("as") && toks.get(next + 1) == Some(&Tok::Punct('(')) {
                ctes.insert(name.to_owned());
            }
        }
    }

    let mut refs: Vec<TableRef> = Vec::new();
    let mut classes = Classes::default();
    let mut insert: Option<(String, bool, usize)> = None;
    let mut i = 0;
    while i < toks.len() {
        let kw = word(toks.get(i));
        if !matches!(kw, Some("from" | "join" | "into" | "update")) {
            i += 1;
            continue;
        }
        let is_into = kw == Some("into");
        let j = i + 1;
        if toks.get(j) == Some(&Tok::Punct('(')) && word(toks.get(j + 1)) == Some("values") {
            // FROM (VALUES (…), …): Citus prunes shards by a key equal to a constant, not by
            // a join with a derived list, so such a statement goes to every shard.
            return Verdict::Unrouted(
                "joins a VALUES list (Citus cannot route a statement through it)".into(),
            );
        }
        let Some(table) = word(toks.get(j)).filter(|w| !is_keyword(w)) else {
            i += 1;
            continue;
        };
        let table = table.to_owned();
        let mut k = j + 1;
        if word(toks.get(k)) == Some("as") {
            k += 1;
        }
        let alias = match word(toks.get(k)) {
            Some(a) if !is_keyword(a) => {
                k += 1;
                a.to_owned()
            }
            _ => table.clone(),
        };
        if is_into {
            let Some((cols, after_cols)) = name_list(&toks, k) else {
                return Verdict::Unrouted(format!("INSERT INTO {table} without a column list"));
            };
            if word(toks.get(after_cols)) != Some("values") {
                return Verdict::Unrouted(format!("INSERT INTO {table} not from VALUES"));
            }
            let (bound, rows, after) = values_columns(&toks, after_cols);
            let bound_cols: Vec<bool> = cols
                .iter()
                .zip(bound.iter().chain(std::iter::repeat(&false)))
                .map(|(_, b)| *b)
                .collect();
            let Some((key, _)) = routing_key(&table) else {
                return Verdict::Unrouted(format!("{table} is not a known table"));
            };
            let at = cols.iter().position(|c| c == key);
            insert = Some((table.clone(), at.is_some_and(|p| bound_cols[p]), rows));
            i = after;
            continue;
        }
        if !ctes.contains(&table) {
            refs.push(TableRef { table, alias });
        }
        i = k;
    }

    // Equalities between plain operands, outside SET clauses and OR groups.
    let in_set: Vec<bool> = {
        let mut flags = Vec::with_capacity(toks.len());
        let mut on = false;
        for (i, t) in toks.iter().enumerate() {
            match word(Some(t)) {
                Some("set") if group[i] == usize::MAX => on = true,
                Some("from" | "where" | "returning") if group[i] == usize::MAX => on = false,
                _ => {}
            }
            flags.push(on);
        }
        flags
    };
    let single = (refs.len() == 1).then(|| refs[0].alias.clone());
    let operand = |t: Option<&Tok>| -> Option<String> {
        match t? {
            Tok::Param => Some(PARAM.to_owned()),
            Tok::Word(w) if !is_keyword(w) => Some(match (w.contains('.'), &single) {
                (true, _) => w.clone(),
                (false, Some(alias)) => format!("{alias}.{w}"),
                (false, None) => format!("?.{w}"),
            }),
            _ => None,
        }
    };
    let bounded_before = |t: Option<&Tok>| match t {
        Some(Tok::Punct('(')) => true,
        Some(Tok::Word(w)) => matches!(w.as_str(), "where" | "and" | "on" | "having"),
        _ => false,
    };
    for (e, t) in toks.iter().enumerate() {
        if *t != Tok::Op("=".into()) || e == 0 || in_set[e] || ored.contains(&group[e]) {
            continue;
        }
        if !bounded_before(e.checked_sub(2).and_then(|p| toks.get(p))) {
            continue;
        }
        // `key = ANY($n)` (or `ANY($n::bytea[])`): one parameter holding the keys.
        if word(toks.get(e + 1)) == Some("any")
            && toks.get(e + 2) == Some(&Tok::Punct('('))
            && toks.get(e + 3) == Some(&Tok::Param)
        {
            let mut close = e + 4;
            if toks.get(close) == Some(&Tok::Op("::".into())) {
                close += 2;
                while matches!(toks.get(close), Some(Tok::Punct('[' | ']'))) {
                    close += 1;
                }
            }
            if toks.get(close) == Some(&Tok::Punct(')'))
                && let Some(left) = operand(toks.get(e - 1))
            {
                classes.union(&left, ANY_PARAM);
            }
            continue;
        }
        let (Some(left), Some(right)) = (operand(toks.get(e - 1)), operand(toks.get(e + 1))) else {
            continue;
        };
        let mut after = e + 2;
        if toks.get(after) == Some(&Tok::Op("::".into())) {
            after += 2;
        }
        // `x = $1 + 1` or `x = f(…)` binds nothing.
        if matches!(
            toks.get(after),
            Some(Tok::Op(_) | Tok::Punct('(' | '.' | '['))
        ) {
            continue;
        }
        classes.union(&left, &right);
    }

    let mut routed = Vec::new();
    if let Some((table, bound, rows)) = insert {
        let (key, _) = routing_key(&table).expect("checked above");
        let binding = match (bound, rows) {
            (false, _) => Binding::Unbound,
            (true, 1) => Binding::Param,
            (true, _) => Binding::PerRow,
        };
        routed.push((table, key, binding));
    }
    for r in &refs {
        let Some((key, _)) = routing_key(&r.table) else {
            return Verdict::Unrouted(format!("{} is not a known table", r.table));
        };
        let root = classes.find(&format!("{}.{key}", r.alias));
        let binding = if root == classes.find(PARAM) {
            Binding::Param
        } else if root == classes.find(ANY_PARAM) {
            Binding::AnyParam
        } else {
            Binding::Unbound
        };
        routed.push((r.table.clone(), key, binding));
    }
    let groups: HashSet<&str> = routed.iter().map(|(t, _, _)| colocation(t)).collect();
    if groups.len() > 1 {
        let mut tables: Vec<&str> = routed.iter().map(|(t, _, _)| t.as_str()).collect();
        tables.dedup();
        return Verdict::Unrouted(format!(
            "joins tables distributed by different keys ({})",
            tables.join(", ")
        ));
    }
    if let Some((table, key, _)) = routed.iter().find(|(_, _, b)| *b == Binding::Unbound) {
        return Verdict::Unrouted(format!("{table}.{key} is not bound to a parameter"));
    }
    Verdict::Routed(routed)
}

// ---------------------------------------------------------------- capturing statements

/// Statements sqlx logged, in order.
static STATEMENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps the SQL of sqlx's `sqlx::query` events; sees nothing else.
struct Capture;

/// sqlx logs the first words as `summary` and, when that is not the whole text, the whole
/// text as `db.statement`.
#[derive(Default)]
struct StatementFields {
    summary: String,
    statement: String,
}

impl Visit for StatementFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S: Subscriber> Layer<S> for Capture {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == "sqlx::query"
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut fields = StatementFields::default();
        event.record(&mut fields);
        let sql = if fields.statement.trim().is_empty() {
            fields.summary
        } else {
            fields.statement.trim().to_owned()
        };
        STATEMENTS.lock().expect("statements").push(sql);
    }
}

fn capture() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
    });
}

/// The statements run since the last call.
fn take() -> Vec<String> {
    std::mem::take(&mut *STATEMENTS.lock().expect("statements"))
}

/// Asserts every statement of `phase` is routed; returns them with their verdicts.
fn check(phase: &str, statements: Vec<String>) -> Vec<(String, Verdict)> {
    assert!(
        !statements.is_empty(),
        "{phase}: no statements were captured"
    );
    let judged: Vec<(String, Verdict)> = statements
        .into_iter()
        .map(|sql| {
            let verdict = classify(&sql);
            (sql, verdict)
        })
        .collect();
    for (sql, verdict) in &judged {
        println!("[{phase}] {:<60} | {}", one_line(sql, 60), verdict.label());
    }
    let unrouted: Vec<String> = judged
        .iter()
        .filter(|(_, v)| !v.is_ok())
        .map(|(sql, v)| format!("  {}\n    {}", v.label(), one_line(sql, 400)))
        .collect();
    assert!(
        unrouted.is_empty(),
        "{phase}: statements without their routing key:\n{}",
        unrouted.join("\n")
    );
    judged
}

fn one_line(sql: &str, max: usize) -> String {
    let flat = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max - 1).collect::<String>())
    } else {
        flat
    }
}

// ---------------------------------------------------------------- a database of its own

/// `server` (a `postgres://` URL) with its database replaced by `name`.
fn with_database(server: &str, name: &str) -> String {
    let (base, query) = match server.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (server, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    format!("{}/{name}{query}", &base[..host_end])
}

/// A fresh database on the server; dropped by [`drop_database`].
async fn create_database(server: &str) -> (String, String) {
    let name = format!("ctxd_routing_{}", uuid::Uuid::now_v7().simple());
    let mut admin = sqlx::PgConnection::connect(server)
        .await
        .unwrap_or_else(|e| panic!("CTXD_TEST_DATABASE_URL is set but unreachable: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    admin.close().await.ok();
    let url = with_database(server, &name);
    (name, url)
}

async fn drop_database(server: &str, name: &str) {
    let mut admin = sqlx::PgConnection::connect(server)
        .await
        .expect("reconnect to drop the test database");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .expect("drop the test database");
    admin.close().await.ok();
}

// ---------------------------------------------------------------- the hot path

type Client = ContextStoreClient<Channel>;

fn text(s: &str) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(s.into())),
    }
}

fn message(role: pb::Role, s: &str, calls: Vec<pb::ToolCall>) -> pb::NodeInput {
    pb::NodeInput {
        kind: Some(pb::node_input::Kind::Message(pb::Message {
            role: role as i32,
            parts: if s.is_empty() { vec![] } else { vec![text(s)] },
            tool_calls: calls,
        })),
        pinned: false,
    }
}

fn call(id: &str, name: &str) -> pb::ToolCall {
    pb::ToolCall {
        call_id: id.into(),
        name: name.into(),
        arguments_json: "{}".into(),
    }
}

fn tool_result(id: &str, s: &str) -> pb::NodeInput {
    pb::NodeInput {
        kind: Some(pb::node_input::Kind::ToolResult(pb::ToolResult {
            call_id: id.into(),
            name: String::new(),
            parts: vec![text(s)],
            is_error: false,
        })),
        pinned: false,
    }
}

fn node(kind: pb::node_input::Kind) -> pb::NodeInput {
    pb::NodeInput {
        kind: Some(kind),
        pinned: false,
    }
}

/// A text of `len` bytes, different per `seed`: long enough to be stored as a blob.
fn big_text(len: usize, seed: &str) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!("{seed} line {i:05} the quick brown fox\n"));
        i += 1;
    }
    s.truncate(len);
    s
}

async fn append(client: &mut Client, req: pb::AppendRequest) -> pb::AppendResponse {
    client.append(req).await.expect("Append").into_inner()
}

fn append_req(session: &str, nodes: Vec<pb::NodeInput>) -> pb::AppendRequest {
    pb::AppendRequest {
        session_id: session.into(),
        nodes,
        ..Default::default()
    }
}

/// Every table of a phase's statements.
fn tables_of(judged: &[(String, Verdict)]) -> HashSet<String> {
    judged
        .iter()
        .filter_map(|(_, v)| match v {
            Verdict::Routed(refs) => Some(refs.iter().map(|r| r.0.clone()).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect()
}

async fn prepare(client: &mut Client, session: &str, budget: pb::Budget) -> String {
    let plan = client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: session.into(),
            budget: Some(budget),
            ..Default::default()
        })
        .await
        .expect("PrepareCompaction")
        .into_inner();
    assert!(plan.needed, "the session needs a summary under this budget");
    plan.compaction_id
}

async fn commit(client: &mut Client, plan: &str) -> Result<pb::CompactionOutcome, tonic::Status> {
    client
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: plan.into(),
            text: "Files were read.".into(),
            model: "test-model".into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn cancel(client: &mut Client, plan: &str) -> Result<(), tonic::Status> {
    client
        .cancel_compaction(pb::CancelCompactionRequest {
            compaction_id: plan.into(),
            reason: "routing".into(),
        })
        .await
        .map(|_| ())
}

/// Drives the calls over gRPC (and the summarizer's cache through the store), checking each
/// phase's statements.
async fn drive(client: &mut Client, store: &Store) {
    take();

    let session = client
        .create_session(pb::CreateSessionRequest {
            idempotency_key: "routing-create".into(),
            ..Default::default()
        })
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id;
    let created = check("CreateSession", take());
    assert!(
        tables_of(&created).contains("session_keys"),
        "a keyed creation reads its key"
    );

    // Turns with tool calls and large results (stored as blobs), an idempotency key, a pin,
    // and a function (sub-agent) with its own chain.
    for t in 0..4 {
        let id = format!("c{t}");
        let mut req = append_req(
            &session,
            vec![
                message(pb::Role::User, &format!("request {t}"), vec![]),
                message(pb::Role::Assistant, "", vec![call(&id, "read_file")]),
                tool_result(&id, &big_text(3000, &format!("file {t}"))),
                message(pb::Role::Assistant, &format!("answer {t}"), vec![]),
            ],
        );
        req.idempotency_key = format!("routing-append-{t}");
        req.nodes[0].pinned = t == 0;
        append(client, req).await;
    }
    let opened = append(
        client,
        append_req(
            &session,
            vec![
                message(pb::Role::User, "delegate", vec![]),
                message(pb::Role::Assistant, "", vec![call("f1", "researcher")]),
                node(pb::node_input::Kind::FunctionCall(pb::FunctionCall {
                    call_id: "f1".into(),
                    name: String::new(),
                    input: "find X".into(),
                    expose: pb::Expose::Full as i32,
                })),
            ],
        ),
    )
    .await;
    let function = opened.node_ids[2].clone();
    append(
        client,
        pb::AppendRequest {
            function_id: function,
            ..append_req(
                &session,
                vec![
                    message(pb::Role::User, "find X", vec![]),
                    message(pb::Role::Assistant, "X is 42.", vec![]),
                ],
            )
        },
    )
    .await;
    append(
        client,
        append_req(
            &session,
            vec![
                node(pb::node_input::Kind::FunctionResult(pb::FunctionResult {
                    call_id: "f1".into(),
                    output: "X is 42".into(),
                    status: pb::FunctionStatus::Completed as i32,
                    ..Default::default()
                })),
                message(pb::Role::Assistant, "The answer is 42.", vec![]),
            ],
        ),
    )
    .await;
    let appended = check("Append", take());
    let tables = tables_of(&appended);
    for table in [
        "nodes",
        "blobs",
        "branches",
        "functions",
        "idempotency",
        "pins",
    ] {
        assert!(tables.contains(table), "the appends wrote or read {table}");
    }

    let budget = pb::Budget {
        context_window: 2500,
        output_reserve: 500,
        ..Default::default()
    };
    client
        .render(pb::RenderRequest {
            session_id: session.clone(),
            target: Some(pb::render_request::Target::Branch("main".into())),
            budget: Some(budget),
            ..Default::default()
        })
        .await
        .expect("Render");
    check("Render", take());

    let plan = prepare(client, &session, budget).await;
    let prepared = check("PrepareCompaction", take());
    assert!(tables_of(&prepared).contains("compaction_owners"));
    // Two more plans at the same head: one to cancel, one left open when the session goes.
    let cancelled = prepare(client, &session, budget).await;
    let open = prepare(client, &session, budget).await;
    check("PrepareCompaction", take());

    let outcome = commit(client, &plan).await.expect("CommitSummary");
    assert!(outcome.applied, "{outcome:?}");
    let committed = check("CommitSummary", take());
    assert!(tables_of(&committed).contains("compaction_owners"));
    assert!(
        tables_of(&committed).contains("summaries"),
        "the summary was stored: {outcome:?}"
    );

    // A plan cancelled, and the server summarizer's output kept for one the session used.
    cancel(client, &cancelled).await.expect("CancelCompaction");
    let judged = check("CancelCompaction", take());
    assert!(tables_of(&judged).contains("compaction_owners"));
    let session_id = ctxd::domain::SessionId::parse("session_id", &session).expect("an id");
    store
        .save_summarizer_output(session_id, &ctxd::domain::Hash([7; 32]), "a summary")
        .await
        .expect("save the summarizer's output");
    let judged = check("summarizer output", take());
    assert!(tables_of(&judged).contains("summarizer_sources"));

    // Deleting the session with a plan open: each row of the tables keyed otherwise (its
    // creation key, its plans' owners, its summarizer outputs, the open plan's tombstone) is
    // named by its own key.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: session.clone(),
        })
        .await
        .expect("DeleteSession");
    let judged = check("DeleteSession", take());
    let tables = tables_of(&judged);
    for table in [
        "session_keys",
        "compaction_owners",
        "tombstone_plans",
        "summarizer_outputs",
        "summarizer_sources",
        "tombstones",
        "nodes",
    ] {
        assert!(
            tables.contains(table),
            "the deletion touched {table}: {tables:?}"
        );
    }

    // The answers for a plan whose session is gone and for an unknown plan, found by the plan
    // tombstone lookup: STALE, OK, NOT_FOUND.
    let stale = commit(client, &open)
        .await
        .expect("CommitSummary after the deletion");
    assert_eq!(
        stale.reason,
        pb::CompactionReason::Stale as i32,
        "{stale:?}"
    );
    check("CommitSummary (session deleted)", take());
    cancel(client, &open)
        .await
        .expect("CancelCompaction after the deletion");
    check("CancelCompaction (session deleted)", take());
    let unknown = uuid::Uuid::now_v7().to_string();
    let status = commit(client, &unknown).await.expect_err("an unknown plan");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let status = cancel(client, &unknown).await.expect_err("an unknown plan");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    check("CommitSummary, CancelCompaction (unknown plan)", take());

    // The control: listing a tenant's sessions is the one cross-session read, and the rule
    // must see that it names no session.
    client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 10,
            ..Default::default()
        })
        .await
        .expect("ListSessions");
    let listed = take();
    assert!(
        listed.iter().any(|sql| !classify(sql).is_ok()),
        "ListSessions fans out, and the rule says so: {listed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hot_path_statement_names_its_routing_key() {
    let Ok(server) = std::env::var("CTXD_TEST_DATABASE_URL") else {
        eprintln!(
            "skipped: CTXD_TEST_DATABASE_URL is unset (a PostgreSQL server URL, e.g. \
             postgres://postgres@127.0.0.1:5432/test; a fresh database is made on it)"
        );
        return;
    };
    capture();
    let (name, url) = create_database(&server).await;
    // On its own task, so a failure still drops the database before it is reported.
    let run = tokio::spawn(async move {
        let config = Config {
            pg_batch_per_session: true,
            ..Config::default()
        };
        let store = Store::connect(&url, config)
            .await
            .expect("connect the store");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(ctxd::server::serve_with(
            listener,
            store.clone(),
            Options::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut client = ContextStoreClient::new(channel);
        drive(&mut client, &store).await;
        drop(client);
        every_table_is_distributed(&url).await;
        let _ = stop.send(());
        served.await.expect("serve task").expect("serve");
        store.close().await;
    })
    .await;
    drop_database(&server, &name).await;
    if let Err(e) = run {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// ctxd distributes every table of its schema on Citus, by the key this test routes it by.
async fn every_table_is_distributed(url: &str) {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::TEXT FROM information_schema.tables
         WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
           AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("list the tables");
    conn.close().await.ok();
    let distributed: HashMap<&str, &str> = ctxd::store::DISTRIBUTION
        .iter()
        .map(|&(table, column, _)| (table, column))
        .collect();
    for table in &tables {
        assert!(
            distributed.contains_key(table.as_str()),
            "{table} is in the schema but ctxd does not distribute it"
        );
    }
    assert_eq!(distributed.len(), tables.len(), "{tables:?}");
    for (table, column) in distributed {
        let (key, _) = routing_key(table).unwrap_or_else(|| panic!("{table}: no routing key"));
        assert_eq!(
            key, column,
            "{table} is distributed by the key it is routed by"
        );
    }
}

// ---------------------------------------------------------------- the rule on its own

#[test]
fn the_rule_accepts_keyed_statements() {
    for sql in [
        "SELECT head_id FROM branches WHERE session_id = $1 AND name = $2 FOR UPDATE",
        "SELECT 1 FROM sessions WHERE id = $1 FOR SHARE",
        "SELECT b.name, n.hash FROM branches b LEFT JOIN nodes n ON n.session_id = b.session_id \
         AND n.id = b.head_id WHERE b.session_id = $1",
        "INSERT INTO nodes (session_id, id) VALUES ($1, $2), ($3, $4)",
        "UPDATE branches SET head_id = $1, updated_at_ms = $2 WHERE session_id = $3 AND name = $4",
        "DELETE FROM compaction_owners WHERE id = ANY($1)",
        "DELETE FROM summarizer_outputs WHERE source_key = ANY($1::bytea[])",
        "SELECT session_id FROM tombstone_plans WHERE compaction_id = $1",
        "SELECT node_id FROM pins WHERE session_id = $1 AND ($2::text IS NULL OR x = $2)",
        "SELECT request_hash, session_id FROM session_keys WHERE tenant = $1 AND key = $2",
        "COMMIT",
    ] {
        assert!(classify(sql).is_ok(), "{sql}: {:?}", classify(sql));
    }
}

#[test]
fn the_rule_refuses_statements_without_their_key() {
    for sql in [
        // The key under an OR, compared to a column, set rather than constrained, or missing.
        "SELECT head_id FROM branches WHERE name = $1",
        "SELECT head_id FROM branches WHERE session_id = $1 OR name = $2",
        "SELECT n.id FROM nodes n JOIN branches b ON b.head_id = n.id WHERE b.session_id = $1",
        "UPDATE nodes SET session_id = $1 WHERE id = $2",
        "UPDATE sessions SET compaction_count = compaction_count + 1 WHERE tenant = $1",
        "INSERT INTO pins (node_id, pinned) VALUES ($1, $2)",
        "INSERT INTO pins (session_id, node_id) VALUES ($1, $2), ('x', $3)",
        "SELECT id FROM sessions WHERE tenant = $1 ORDER BY id DESC LIMIT $2",
        "SELECT text FROM summarizer_outputs WHERE created_at_ms = $1",
        "SELECT 1 FROM some_new_table WHERE session_id = $1",
        // Through a VALUES list, which Citus cannot prune by.
        "UPDATE branches SET head_id = v.head_id FROM (VALUES ($1, $2, $3)) AS v (session_id, \
         name, head_id) WHERE branches.session_id = v.session_id AND branches.name = v.name",
        // Tables distributed by different keys, joined or searched by session.
        "SELECT t.tenant FROM tombstone_plans p JOIN tombstones t ON t.session_id = p.session_id \
         WHERE p.compaction_id = $1",
        "DELETE FROM summarizer_outputs WHERE text IN (SELECT text FROM summaries \
         WHERE session_id = $1)",
        "DELETE FROM compaction_owners WHERE session_id = $1",
        "DELETE FROM session_keys WHERE session_id = $1",
    ] {
        assert!(!classify(sql).is_ok(), "{sql}: {:?}", classify(sql));
    }
}
