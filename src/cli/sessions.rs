//! `ctxd sessions` (and `sessions rm`), `log` and `watch`: the store's sessions and a branch's
//! nodes, page by page, and a session's changes as they come.

use std::io::Write;

use super::client::{Failure, Result, output};
use super::connect::{Conn, call, connect};
use super::show;
use crate::proto::json::ToJson;
use crate::proto::pb;

/// `ctxd sessions`: pages of `filter` (its id prefix and metadata) until `limit`.
pub(super) async fn list(
    limit: u32,
    filter: pb::ListSessionsRequest,
    conn: &Conn,
) -> Result<String> {
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
pub(super) async fn remove(sessions: Vec<String>, conn: &Conn) -> Result<String> {
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
pub(super) async fn watch(req: pb::WatchRequest, conn: &Conn) -> Result<()> {
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

pub(super) async fn log(mut req: pb::LogRequest, limit: u32, conn: &Conn) -> Result<String> {
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
