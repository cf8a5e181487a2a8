//! The client commands (`ctxd import`, `sessions`, `log`, …): each parses its arguments, makes
//! its call through the generated tonic client, and prints text or, with `--json`, the response.
//!
//! Failures print one line on stderr, `ctxd: <what failed>: <CODE>: <server message>`, and exit
//! with status 1.

use std::io::{IsTerminal, Write};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

pub use super::connect::Conn;
use super::connect::{Client, call, connect, failure};
use super::{panel, show};
use crate::proto::json::ToJson;
use crate::proto::pb;

/// Bytes per `ImportChunk`.
const CHUNK_BYTES: usize = 64 * 1024;
/// Files at least this large get a progress bar (on a terminal, without `--json`).
const PROGRESS_MIN_BYTES: usize = 1024 * 1024;

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
    fn tokenizer(&self) -> String {
        self.tokenizer.clone().unwrap_or_default()
    }

    fn budget(&self) -> Option<pb::Budget> {
        self.budget.map(|window| pb::Budget {
            context_window: window,
            output_reserve: self.output_reserve,
            ..Default::default()
        })
    }
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
        /// The session id.
        session: String,
        /// Default `main`.
        #[arg(long)]
        branch: Option<String>,
        #[command(flatten)]
        budget: BudgetArgs,
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
        /// The session id.
        session: String,
        /// Default `main`.
        #[arg(long)]
        branch: Option<String>,
        #[command(flatten)]
        budget: BudgetArgs,
        /// Every gateway call in the ledger, not only the newest 20.
        #[arg(long)]
        all_calls: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Summarizes older history (or, with --from and --to, a segment) with the server's
    /// summarizer, or with --text.
    Compact {
        /// The session id.
        session: String,
        /// Default `main`.
        #[arg(long)]
        branch: Option<String>,
        #[command(flatten)]
        budget: BudgetArgs,
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
    /// Lists a session's summaries and compaction events.
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
        } => import(&files, format, meta, &conn).await,
        Command::Export {
            session,
            format,
            branch,
            out,
            conn,
        } => export(session, format, branch, out.as_deref(), &conn).await,
        Command::Sessions {
            action: Some(SessionsAction::Rm { sessions, conn }),
            ..
        } => remove(sessions, &conn).await,
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
            sessions(limit, filter, &conn).await
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
            log(req, limit, &conn).await
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
            session,
            branch,
            budget,
            format,
            reactive,
            conn,
        } => render(session, branch, &budget, format, reactive, &conn).await,
        Command::Context {
            session,
            branch,
            budget,
            all_calls,
            conn,
        } => {
            let target = format!(
                "session {session}  branch {}",
                branch.as_deref().unwrap_or("main")
            );
            let req = pb::ContextStatsRequest {
                session_id: session,
                target: branch.map(pb::context_stats_request::Target::Branch),
                tokenizer: budget.tokenizer(),
                budget: budget.budget(),
                ..Default::default()
            };
            let session_id = req.session_id.clone();
            let mut client = connect(&conn).await?;
            let r = call("ContextStats", client.context_stats(req)).await?;
            let session = call(
                "GetSession",
                client.get_session(pb::GetSessionRequest {
                    session_id: session_id.clone(),
                }),
            )
            .await?;
            // The ledger is text only (`--json` stays the report); read only for a session the
            // gateway served, since no other has calls.
            let calls = match (&session.gateway, conn.json) {
                (Some(_), false) => gateway_calls(&mut client, session_id).await?,
                _ => None,
            };
            Ok(output(&conn, &r, || {
                let mut picture = panel::picture(&target, &r);
                if let Some(g) = &session.gateway {
                    picture.push_str(&panel::gateway(g));
                }
                if let Some(calls) = &calls {
                    let newest = (!all_calls).then_some(panel::LEDGER_NEWEST);
                    picture.push_str(&panel::ledger(calls, newest));
                }
                picture
            }))
        }
        Command::Compact {
            session,
            branch,
            budget,
            instructions,
            from,
            to,
            text,
            conn,
        } => {
            if let Some(text) = text {
                let req = pb::PrepareCompactionRequest {
                    session_id: session,
                    branch: branch.unwrap_or_default(),
                    budget: budget.budget(),
                    tokenizer: budget.tokenizer(),
                    instructions: instructions.unwrap_or_default(),
                    from_node_id: from.unwrap_or_default(),
                    to_node_id: to.unwrap_or_default(),
                    ..Default::default()
                };
                return compact_with_text(req, text, &conn).await;
            }
            let req = pb::CompactRequest {
                session_id: session,
                branch: branch.unwrap_or_default(),
                budget: budget.budget(),
                tokenizer: budget.tokenizer(),
                instructions: instructions.unwrap_or_default(),
                from_node_id: from.unwrap_or_default(),
                to_node_id: to.unwrap_or_default(),
                ..Default::default()
            };
            let o = call("Compact", connect(&conn).await?.compact(req)).await?;
            Ok(output(&conn, &o, || show::outcome(&o)))
        }
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
            watch(req, &conn).await.map(|()| String::new())
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
            Ok(output(&conn, &r, || show::summaries(&r)))
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

/// The model a summary committed with `ctxd compact --text` is recorded under.
const CLI_MODEL: &str = "ctxd-cli";

/// `ctxd compact --text`: Prepare, then CommitSummary with the caller's text, so no summarizer
/// is needed. A plan the commit does not apply is cancelled, as `Compact` closes its own, so no
/// open plan is left behind. With `--json`: the outcome's fields, plus `prepare`, the
/// PrepareCompaction response.
async fn compact_with_text(
    req: pb::PrepareCompactionRequest,
    text: String,
    conn: &Conn,
) -> Result<String> {
    let mut client = connect(conn).await?;
    let prepared = call("PrepareCompaction", client.prepare_compaction(req)).await?;
    let outcome = if prepared.needed {
        let commit = pb::CommitSummaryRequest {
            compaction_id: prepared.compaction_id.clone(),
            text,
            model: CLI_MODEL.into(),
        };
        let outcome = call("CommitSummary", client.commit_summary(commit)).await?;
        if !outcome.applied {
            let cancel = pb::CancelCompactionRequest {
                compaction_id: prepared.compaction_id.clone(),
                reason: format!(
                    "ctxd compact --text: not applied ({})",
                    show::reason(outcome.reason)
                ),
            };
            call("CancelCompaction", client.cancel_compaction(cancel)).await?;
        }
        outcome
    } else {
        // What `Compact` answers when there is nothing to do.
        pb::CompactionOutcome {
            applied: false,
            tokens_before: prepared.tokens_before,
            tokens_after: prepared.tokens_before,
            reason: pb::CompactionReason::NotNeeded.into(),
            message: prepared.reason.clone(),
            ..Default::default()
        }
    };
    if conn.json {
        let mut value = outcome.to_json();
        value["prepare"] = prepared.to_json();
        return Ok(pretty(&value));
    }
    Ok(show::prepared_outcome(&prepared, &outcome))
}

async fn import(
    files: &[std::path::PathBuf],
    format: Option<ImportFormat>,
    meta: Vec<(String, String)>,
    conn: &Conn,
) -> Result<String> {
    let mut data = Vec::new();
    for file in files {
        let bytes =
            std::fs::read(file).map_err(|e| Failure(format!("reading {}: {e}", file.display())))?;
        data.extend_from_slice(&bytes);
        // Files are streamed as one: keep each one's last line apart from the next one's first.
        if !data.ends_with(b"\n") {
            data.push(b'\n');
        }
    }
    let format = match format {
        None => pb::ImportFormat::Unspecified,
        Some(ImportFormat::Neutral) => pb::ImportFormat::NeutralJsonl,
        Some(ImportFormat::ClaudeCode) => pb::ImportFormat::ClaudeCodeJsonl,
        Some(ImportFormat::Openai) => pb::ImportFormat::OpenaiMessages,
        Some(ImportFormat::Ctxd) => pb::ImportFormat::CtxdJsonl,
    };
    let mut client = connect(conn).await?;
    let progress = progress_bar(data.len(), conn.json);
    let chunks = chunks(data, format, meta.into_iter().collect(), progress.clone());
    let r = call("ImportSession", client.import_session(chunks)).await;
    progress.finish_and_clear();
    let r = r?;
    Ok(output(conn, &r, || show::import(&r)))
}

async fn export(
    session: String,
    format: ExportFormat,
    branch: Option<String>,
    out: Option<&std::path::Path>,
    conn: &Conn,
) -> Result<String> {
    let format = match format {
        ExportFormat::Ctxd => pb::ExportFormat::CtxdJsonl,
        ExportFormat::Openai => pb::ExportFormat::OpenaiMessages,
        ExportFormat::ClaudeCode => pb::ExportFormat::ClaudeCodeJsonl,
    };
    let mut client = connect(conn).await?;
    let req = pb::ExportSessionRequest {
        session_id: session,
        format: format as i32,
        branch: branch.unwrap_or_default(),
    };
    let mut stream = call("ExportSession", client.export_session(req)).await?;
    let mut sink: Box<dyn Write> = match out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| Failure(format!("creating {}: {e}", path.display())))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let written = copy_chunks(&mut stream, &mut *sink).await;
    let written = written.and_then(|n| {
        sink.flush()
            .map_err(|e| Failure(format!("writing the export: {e}")))
            .map(|()| n)
    });
    drop(sink);
    match (written, out) {
        (Ok(n), Some(path)) => Ok(format!("exported {} bytes to {}\n", n, path.display())),
        (Ok(_), None) => Ok(String::new()),
        (Err(e), Some(path)) => {
            // Half an export is no export.
            let _ = std::fs::remove_file(path);
            Err(e)
        }
        (Err(e), None) => Err(e),
    }
}

/// Writes every chunk's data to `sink` and the first chunk's warnings to stderr; the bytes.
async fn copy_chunks(
    stream: &mut tonic::Streaming<pb::ExportChunk>,
    sink: &mut dyn Write,
) -> Result<usize> {
    let mut written = 0;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|s| failure("ExportSession", &s))?
    {
        for w in &chunk.warnings {
            let _ = writeln!(std::io::stderr(), "ctxd: warning: {w}");
        }
        sink.write_all(&chunk.data)
            .map_err(|e| Failure(format!("writing the export: {e}")))?;
        written += chunk.data.len();
    }
    Ok(written)
}

/// The file as a stream of chunks, the first carrying the format and metadata; the bar
/// advances as the transport takes each one.
fn chunks(
    data: Vec<u8>,
    format: pb::ImportFormat,
    metadata: std::collections::HashMap<String, String>,
    progress: indicatif::ProgressBar,
) -> impl tokio_stream::Stream<Item = pb::ImportChunk> + Send + 'static {
    let count = data.len().div_ceil(CHUNK_BYTES).max(1);
    let mut metadata = Some(metadata);
    tokio_stream::iter((0..count).map(move |i| {
        let slice =
            &data[(i * CHUNK_BYTES).min(data.len())..((i + 1) * CHUNK_BYTES).min(data.len())];
        progress.inc(slice.len() as u64);
        pb::ImportChunk {
            format: format as i32,
            metadata: metadata.take().unwrap_or_default(),
            data: slice.to_vec(),
            ..Default::default()
        }
    }))
}

fn progress_bar(len: usize, json: bool) -> indicatif::ProgressBar {
    if json || len < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "importing {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Every gateway call of `session`, in the order made (the pages followed: the newest are last,
/// and the totals cover them all); `None` from a server that has no ledger yet.
async fn gateway_calls(
    client: &mut Client,
    session_id: String,
) -> Result<Option<Vec<pb::GatewayCall>>> {
    let mut calls = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListGatewayCallsRequest {
            session_id: session_id.clone(),
            page_size: 1000,
            page_token,
        };
        let page = match client.list_gateway_calls(req).await {
            Ok(page) => page.into_inner(),
            Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(None),
            Err(s) => return Err(failure("ListGatewayCalls", &s)),
        };
        calls.extend(page.calls);
        if page.next_page_token.is_empty() {
            return Ok(Some(calls));
        }
        page_token = page.next_page_token;
    }
}

/// `ctxd sessions`: pages of `filter` (its id prefix and metadata) until `limit`.
async fn sessions(limit: u32, filter: pb::ListSessionsRequest, conn: &Conn) -> Result<String> {
    let mut client = connect(conn).await?;
    let mut all = pb::ListSessionsResponse::default();
    loop {
        let want = limit.saturating_sub(all.sessions.len() as u32).min(1000);
        let req = pb::ListSessionsRequest {
            page_size: want,
            page_token: all.next_page_token.clone(),
            ..filter.clone()
        };
        let page = call("ListSessions", client.list_sessions(req)).await?;
        all.sessions.extend(page.sessions);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.sessions.len() as u32 >= limit {
            break;
        }
    }
    all.sessions.truncate(limit as usize);
    Ok(output(conn, &all, || {
        show::sessions(&all.sessions, !all.next_page_token.is_empty())
    }))
}

/// `ctxd sessions rm`: each session in turn; the first failure stops it, naming the session.
async fn remove(sessions: Vec<String>, conn: &Conn) -> Result<String> {
    let mut client = connect(conn).await?;
    let mut done = Vec::new();
    for session in sessions {
        let req = pb::DeleteSessionRequest {
            session_id: session,
        };
        done.push(call("DeleteSession", client.delete_session(req)).await?);
    }
    Ok(output(conn, &done, || show::deleted(&done)))
}

/// Prints each event as it comes (a line of text, or of JSON) until Ctrl-C, the stream's
/// end, or a closed stdout; a stream that ends with an error fails with it.
async fn watch(req: pb::WatchRequest, conn: &Conn) -> Result<()> {
    let mut stream = call("Watch", connect(conn).await?.watch(req)).await?;
    let mut cursor = String::new();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let event = tokio::select! {
            event = stream.message() => event,
            _ = &mut interrupted => break,
        };
        let event = match event {
            Ok(Some(event)) => event,
            Ok(None) => break,
            Err(status) => {
                return call::<()>("Watch", std::future::ready(Err(status))).await;
            }
        };
        let line = if conn.json {
            event.to_json().to_string()
        } else {
            show::watch_event(&event)
        };
        cursor.clone_from(&event.cursor);
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
            Ok(()) => {}
            // `ctxd watch … | head` closing the pipe is the end, not a failure.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(Failure(format!("writing the output: {e}"))),
        }
    }
    if !cursor.is_empty() {
        let _ = writeln!(std::io::stderr(), "resume with --after {cursor}");
    }
    Ok(())
}

async fn log(mut req: pb::LogRequest, limit: u32, conn: &Conn) -> Result<String> {
    let mut client = connect(conn).await?;
    let mut all = pb::LogResponse::default();
    loop {
        req.limit = limit.saturating_sub(all.nodes.len() as u32).min(1000);
        let page = call("Log", client.log(req.clone())).await?;
        all.nodes.extend(page.nodes);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.nodes.len() as u32 >= limit {
            break;
        }
        req.page_token = all.next_page_token.clone();
    }
    Ok(output(conn, &all, || {
        show::log(&all.nodes, !all.next_page_token.is_empty())
    }))
}

async fn render(
    session: String,
    branch: Option<String>,
    budget: &BudgetArgs,
    format: RenderFormat,
    reactive: bool,
    conn: &Conn,
) -> Result<String> {
    let req = pb::RenderRequest {
        session_id: session,
        target: branch.map(pb::render_request::Target::Branch),
        tokenizer: budget.tokenizer(),
        budget: budget.budget(),
        policy: reactive.then(|| pb::RenderPolicy {
            reactive: true,
            ..Default::default()
        }),
        format: match format {
            RenderFormat::Neutral => pb::Format::Neutral,
            RenderFormat::Openai => pb::Format::OpenaiChat,
            RenderFormat::Anthropic => pb::Format::AnthropicMessages,
        } as i32,
        ..Default::default()
    };
    let r = call("Render", connect(conn).await?.render(req)).await?;
    if conn.json || matches!(format, RenderFormat::Neutral) {
        return Ok(output(conn, &r, || show::render(&r)));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(&r.messages_json).map_err(|e| {
        Failure(format!(
            "Render failed: the server's messages_json is not JSON: {e}"
        ))
    })?;
    Ok(reindent(&r.messages_json))
}

/// Valid JSON indented by two spaces, keeping the server's key order.
fn reindent(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                while chars.next_if(|n| n.is_whitespace()).is_some() {}
                if let Some(close) = chars.next_if(|n| matches!(n, '}' | ']')) {
                    out.push(c);
                    out.push(close);
                    continue;
                }
                out.push(c);
                depth += 1;
                newline(&mut out, depth);
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out.push('\n');
    out
}

/// The text, or with `--json` the response itself.
fn output<T: ToJson>(conn: &Conn, response: &T, text: impl FnOnce() -> String) -> String {
    if conn.json {
        pretty(&response.to_json())
    } else {
        text()
    }
}

fn pretty(value: &Value) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reindent_keeps_key_order_and_strings() {
        let json =
            r#"{"role":"user","content":"a, b: {c} \" [d]","x":[],"y":{},"z":[1,{"k":null}]}"#;
        let pretty = reindent(json);
        let parsed: Value = serde_json::from_str(&pretty).unwrap();
        assert_eq!(parsed, serde_json::from_str::<Value>(json).unwrap());
        assert!(pretty.find("role").unwrap() < pretty.find("content").unwrap());
        assert!(pretty.contains(r#""a, b: {c} \" [d]""#), "{pretty}");
        assert!(pretty.contains(r#""x": [],"#), "{pretty}");
    }
}
