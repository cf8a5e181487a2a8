//! `ctxd render` and `ctxd context`: a branch's context under a budget, as the messages sent (or
//! a provider's request document), or as a picture of where its tokens go.

use super::client::{BranchArgs, Failure, RenderFormat, Result, output};
use super::connect::{Client, Conn, call, connect, failure};
use super::{panel, show};
use crate::proto::pb;

/// `ctxd render`: the neutral messages readably, or the provider's request document.
pub(super) async fn render(
    args: BranchArgs,
    format: RenderFormat,
    reactive: bool,
    conn: &Conn,
) -> Result<String> {
    let req = pb::RenderRequest {
        session_id: args.session,
        target: args.branch.map(pb::render_request::Target::Branch),
        tokenizer: args.budget.tokenizer(),
        budget: args.budget.budget(),
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

/// `ctxd context`: the picture of the report; for a session the gateway recorded, what it
/// forwarded and its ledger too.
pub(super) async fn context(args: BranchArgs, all_calls: bool, conn: &Conn) -> Result<String> {
    let target = format!(
        "session {}  branch {}",
        args.session,
        args.branch.as_deref().unwrap_or("main")
    );
    let req = pb::ContextStatsRequest {
        session_id: args.session,
        target: args.branch.map(pb::context_stats_request::Target::Branch),
        tokenizer: args.budget.tokenizer(),
        budget: args.budget.budget(),
        ..Default::default()
    };
    let session_id = req.session_id.clone();
    let mut client = connect(conn).await?;
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
    Ok(output(conn, &r, || {
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

#[cfg(test)]
mod tests {
    use serde_json::Value;

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
