//! The client commands (`ctxd import`, `sessions`, `log`, …): their arguments, and the dispatch
//! of each to the call it makes through the generated tonic client; each prints text or, with
//! `--json`, the response. The commands of a family live in their own module: `transfer`
//! (import, export), `sessions` (sessions, log, watch), `context` (render, context) and
//! `compact`.
//!
//! Failures print one line on stderr, `ctxd: <what failed>: <CODE>: <server message>`, and exit
//! with status 1.

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

pub use super::connect::Conn;
use super::connect::{call, connect};
use super::{compact, context, sessions, show, summaries, transfer};
use crate::proto::json::ToJson;
use crate::proto::pb;

/// A token budget and tokenizer, for `render`, `context` and `compact`.
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// Context window in tokens (with an output reserve of --output-reserve).
    #[arg(long, value_name = "N")]
    budget: Option<u32>,
    /// Tokens kept free for the answer, out of --budget.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "budget")]
    output_reserve: u32,
    /// `heuristic` (the default), `o200k_base` or `cl100k_base`.
    #[arg(long, value_name = "T")]
    tokenizer: Option<String>,
}

impl BudgetArgs {
    pub(super) fn tokenizer(&self) -> String {
        self.tokenizer.clone().unwrap_or_default()
    }

    pub(super) fn budget(&self) -> Option<pb::Budget> {
        self.budget.map(|window| pb::Budget {
            context_window: window,
            output_reserve: self.output_reserve,
            ..Default::default()
        })
    }
}

/// The branch `render`, `context` and `compact` work on, and the budget they fit it in.
#[derive(Debug, Args)]
pub struct BranchArgs {
    /// The session id.
    pub(super) session: String,
    /// Default `main`.
    #[arg(long)]
    pub(super) branch: Option<String>,
    #[command(flatten)]
    pub(super) budget: BudgetArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ImportFormat {
    Neutral,
    ClaudeCode,
    Openai,
    Ctxd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    Ctxd,
    Openai,
    ClaudeCode,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RenderFormat {
    Neutral,
    Openai,
    Anthropic,
}

#[derive(Debug, Subcommand)]
pub enum SessionsAction {
    /// Deletes sessions for good (nodes, branches, summaries, and blobs no other session
    /// shares), leaving a tombstone each; deleting one again shows its tombstone.
    Rm {
        #[arg(required = true, num_args = 1..)]
        sessions: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Imports a session file into a new session.
    Import {
        /// The file: neutral JSONL, a Claude Code session, an OpenAI messages array, or a ctxd
        /// export (`ctxd export`), which becomes a session with all its branches. A
        /// Claude Code session may be followed by its sub-agents' transcripts, which become
        /// functions under the calls that started them.
        #[arg(required = true, num_args = 1..)]
        files: Vec<std::path::PathBuf>,
        /// Detected from the first line when not given.
        #[arg(long, value_enum)]
        format: Option<ImportFormat>,
        /// Session metadata, repeatable.
        #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = key_value)]
        meta: Vec<(String, String)>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Exports a session: every branch, function chain, summary and pin as ctxd JSONL (which
    /// `ctxd import` reads back), or one branch as an OpenAI messages array or a Claude Code
    /// session file. What a one-branch format cannot carry is printed as warnings on stderr.
    Export {
        /// The session id.
        session: String,
        #[arg(long, value_enum, default_value = "ctxd")]
        format: ExportFormat,
        /// The branch the one-branch formats export; default `main`.
        #[arg(long)]
        branch: Option<String>,
        /// Write to this file (created; it must not exist) instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Lists sessions, newest first; `ctxd sessions rm ID…` deletes sessions.
    Sessions {
        #[command(subcommand)]
        action: Option<SessionsAction>,
        /// Sessions to show at most.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only sessions whose id starts with this (e.g. `0193f2a1-7`).
        #[arg(long, value_name = "PREFIX")]
        id_prefix: Option<String>,
        /// Only sessions with this metadata pair; repeat to require several.
        #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = key_value)]
        metadata: Vec<(String, String)>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Asks the server to copy its SQLite database, consistent at one moment, into a new file
    /// on the server's machine while it serves (BackupDatabase; needs an admin key).
    RemoteBackup {
        /// An absolute path on the server's machine; it must not exist.
        #[arg(long, value_name = "PATH")]
        to: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Gives the space of deleted sessions back to the system and shows the store's size
    /// (needs an admin key).
    Gc {
        #[command(flatten)]
        conn: Conn,
    },
    /// Shows a session's nodes from a branch head or a node, newest first.
    Log {
        /// The session id.
        session: String,
        /// Default `main`.
        #[arg(long, conflicts_with = "node")]
        branch: Option<String>,
        /// Start at this node instead of a branch head.
        #[arg(long)]
        node: Option<String>,
        /// Nodes to show at most.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// Creates a branch at a node.
    Branch {
        /// The session id.
        session: String,
        /// The new branch's name.
        name: String,
        /// The node the branch starts at.
        #[arg(long = "from", value_name = "NODE")]
        from: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Renders a branch's context, under a budget if given.
    Render {
        #[command(flatten)]
        target: BranchArgs,
        /// `openai` and `anthropic` print the provider's request document.
        #[arg(long, value_enum, default_value = "neutral")]
        format: RenderFormat,
        /// The provider refused the request as too long: clear old tool results.
        #[arg(long)]
        reactive: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Pictures where a branch's context tokens go, against a budget if given; for a session
    /// the model gateway recorded, what it forwarded and its ledger, call by call.
    Context {
        #[command(flatten)]
        target: BranchArgs,
        /// Every gateway call in the ledger, not only the newest 20.
        #[arg(long)]
        all_calls: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Summarizes older history (or, with --from and --to, a segment) with the server's
    /// summarizer, or with --text.
    Compact {
        #[command(flatten)]
        target: BranchArgs,
        /// For the summarizer.
        #[arg(long)]
        instructions: Option<String>,
        /// A segment summary: its first node (on the branch's path; needs --to).
        #[arg(long = "from", value_name = "NODE", requires = "to")]
        from: Option<String>,
        /// A segment summary: its last node, inclusive (needs --from).
        #[arg(long = "to", value_name = "NODE", requires = "from")]
        to: Option<String>,
        /// The summary itself, instead of the server's summarizer: prepares, then commits this
        /// text (model `ctxd-cli`); a plan the commit does not apply is cancelled.
        #[arg(long, value_name = "TEXT")]
        text: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Pins nodes: never reduced by a render, shown verbatim just before a summary covering them.
    Pin {
        /// The session id.
        session: String,
        /// The nodes to pin.
        #[arg(required = true, num_args = 1.., value_name = "NODE")]
        nodes: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Prints the original content of what a render cleared, cut or stubbed, by the reference
    /// its placeholder names (`recall 3f9a2c1b7d04`).
    Recall {
        /// The session id.
        session: String,
        /// The 12 hexadecimal characters after `recall` in a placeholder.
        reference: String,
        /// The most characters to print (default 20000).
        #[arg(long, value_name = "N")]
        max_chars: Option<u32>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Unpins nodes.
    Unpin {
        /// The session id.
        session: String,
        /// The nodes to unpin.
        #[arg(required = true, num_args = 1.., value_name = "NODE")]
        nodes: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Follows a session (or one branch) as it changes, one line per event, until Ctrl-C;
    /// then prints the cursor to resume from (`--after`) on stderr.
    Watch {
        /// The session id.
        session: String,
        /// Follow this branch only; default every branch.
        #[arg(long)]
        branch: Option<String>,
        /// Resume right after the event whose cursor this is.
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Lists a session's summaries and compaction events.
    Summaries {
        /// The session id.
        session: String,
        /// Which branch `active` and `applies` refer to. Default `main`.
        #[arg(long)]
        branch: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Why a command failed: one line, printed after `ctxd: `.
#[derive(Debug)]
pub struct Failure(pub(super) String);

pub(super) type Result<T> = std::result::Result<T, Failure>;

/// Runs a client command to completion; on failure prints one line and exits with status 1.
pub fn run(runtime: &tokio::runtime::Runtime, command: Command) -> anyhow::Result<()> {
    match runtime.block_on(execute(command)) {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                // `ctxd log … | head` closing the pipe early is not a failure.
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(e) => fail(&format!("writing the output: {e}")),
            }
        }
        Err(Failure(line)) => fail(&line),
    }
}

fn fail(line: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "ctxd: {line}");
    std::process::exit(1)
}

async fn execute(command: Command) -> Result<String> {
    match command {
        Command::Import {
            files,
            format,
            meta,
            conn,
        } => transfer::import(&files, format, meta, &conn).await,
        Command::Export {
            session,
            format,
            branch,
            out,
            conn,
        } => transfer::export(session, format, branch, out.as_deref(), &conn).await,
        Command::Sessions {
            action: Some(SessionsAction::Rm { sessions, conn }),
            ..
        } => sessions::remove(sessions, &conn).await,
        Command::Sessions {
            action: None,
            limit,
            id_prefix,
            metadata,
            conn,
        } => {
            let filter = pb::ListSessionsRequest {
                id_prefix: id_prefix.unwrap_or_default(),
                metadata: metadata.into_iter().collect(),
                ..Default::default()
            };
            sessions::list(limit, filter, &conn).await
        }
        Command::RemoteBackup { to, conn } => {
            let req = pb::BackupDatabaseRequest { to };
            let r = call("BackupDatabase", connect(&conn).await?.backup_database(req)).await?;
            Ok(output(&conn, &r, || {
                format!(
                    "backed up to {} ({} bytes, {} ms)\n",
                    r.path, r.bytes, r.took_ms
                )
            }))
        }
        Command::Gc { conn } => {
            let r = call(
                "CollectGarbage",
                connect(&conn)
                    .await?
                    .collect_garbage(pb::CollectGarbageRequest {}),
            )
            .await?;
            Ok(output(&conn, &r, || show::garbage(&r)))
        }
        Command::Log {
            session,
            branch,
            node,
            limit,
            conn,
        } => {
            let req = pb::LogRequest {
                session_id: session,
                branch: branch.unwrap_or_default(),
                node_id: node.unwrap_or_default(),
                ..Default::default()
            };
            sessions::log(req, limit, &conn).await
        }
        Command::Branch {
            session,
            name,
            from,
            conn,
        } => {
            let req = pb::CreateBranchRequest {
                session_id: session,
                name,
                from_node_id: from,
            };
            let b = call("CreateBranch", connect(&conn).await?.create_branch(req)).await?;
            Ok(output(&conn, &b, || {
                format!("branch {} at {} ({})\n", b.name, b.head_id, b.head_hash)
            }))
        }
        Command::Render {
            target,
            format,
            reactive,
            conn,
        } => context::render(target, format, reactive, &conn).await,
        Command::Context {
            target,
            all_calls,
            conn,
        } => context::context(target, all_calls, &conn).await,
        Command::Compact {
            target,
            instructions,
            from,
            to,
            text,
            conn,
        } => compact::compact(target, instructions, from, to, text, &conn).await,
        Command::Pin {
            session,
            nodes,
            conn,
        } => pin(session, nodes, true, &conn).await,
        Command::Unpin {
            session,
            nodes,
            conn,
        } => pin(session, nodes, false, &conn).await,
        Command::Recall {
            session,
            reference,
            max_chars,
            conn,
        } => {
            let req = pb::RecallRequest {
                session_id: session,
                reference,
                max_chars: max_chars.unwrap_or(0),
            };
            let r = call("Recall", connect(&conn).await?.recall(req)).await?;
            Ok(output(&conn, &r, || {
                if r.truncated {
                    format!(
                        "{}\n[… {} more characters: ask for more with --max-chars]",
                        r.content,
                        r.total_chars
                            .saturating_sub(r.content.chars().count() as u64)
                    )
                } else {
                    r.content.clone()
                }
            }))
        }
        Command::Watch {
            session,
            branch,
            after,
            conn,
        } => {
            let req = pb::WatchRequest {
                session_id: session,
                branch: branch.unwrap_or_default(),
                after_cursor: after.unwrap_or_default(),
                after_node_id: String::new(),
            };
            sessions::watch(req, &conn).await.map(|()| String::new())
        }
        Command::Summaries {
            session,
            branch,
            conn,
        } => {
            let req = pb::ListSummariesRequest {
                session_id: session,
                branch: branch.unwrap_or_default(),
            };
            let r = call("ListSummaries", connect(&conn).await?.list_summaries(req)).await?;
            Ok(output(&conn, &r, || summaries::list(&r)))
        }
    }
}

/// `ctxd pin` and `ctxd unpin`: the session's pinned nodes after the call.
async fn pin(session: String, nodes: Vec<String>, pin: bool, conn: &Conn) -> Result<String> {
    let req = pb::PinRequest {
        session_id: session,
        node_ids: nodes,
    };
    let mut client = connect(conn).await?;
    let r = if pin {
        call("Pin", client.pin(req)).await?
    } else {
        call("Unpin", client.unpin(req)).await?
    };
    Ok(output(conn, &r, || show::pinned(&r)))
}

/// The text, or with `--json` the response itself.
pub(super) fn output<T: ToJson>(
    conn: &Conn,
    response: &T,
    text: impl FnOnce() -> String,
) -> String {
    if conn.json {
        pretty(&response.to_json())
    } else {
        text()
    }
}

pub(super) fn pretty(value: &Value) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    s.push('\n');
    s
}

fn key_value(s: &str) -> std::result::Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}
