//! A session imported with `ImportSession` and then continued through the gateway: the import and
//! the gateway read each provider's messages with the same codec, so the continuation appends
//! only what is new, on `main`, never a fork. And kept provider blocks (thinking, server tools,
//! types ctxd does not know) leave an export and come back from its import byte for byte.

use ctxd::api::pb;
use serde_json::{Value, json};

use crate::export::{export, import};
use crate::gateway::start;
use crate::helpers::*;

/// A real Claude Code session's main chain as Claude Code sends it to the API: the lines of one
/// assistant message (one line per block) joined, consecutive user lines joined, string content
/// as one text block.
fn claude_code_request_messages(file: &str) -> Vec<Value> {
    let mut messages: Vec<(Value, Option<String>)> = Vec::new();
    for line in file.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        let kind = v["type"].as_str().unwrap_or_default();
        if !matches!(kind, "user" | "assistant") || v["isSidechain"] == json!(true) {
            continue;
        }
        let message = &v["message"];
        let blocks = match &message["content"] {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(blocks) => blocks.clone(),
            _ => continue,
        };
        let id = message["id"].as_str().map(str::to_owned);
        match messages.last_mut() {
            Some((last, last_id))
                if last["role"] == kind && (kind == "user" || (id.is_some() && *last_id == id)) =>
            {
                last["content"]
                    .as_array_mut()
                    .expect("content blocks")
                    .extend(blocks);
            }
            _ => messages.push((json!({"role": kind, "content": blocks}), id)),
        }
    }
    messages.into_iter().map(|(m, _)| m).collect()
}

/// How many nodes `branch` of `session` holds, and the names of its branches.
async fn shape(app: &mut TestApp, session: &str) -> (usize, Vec<String>) {
    let nodes = app.log(session, "main").await.len();
    let mut branches: Vec<String> = app
        .branches(session)
        .await
        .into_iter()
        .map(|b| b.name)
        .collect();
    branches.sort();
    (nodes, branches)
}

#[tokio::test]
async fn an_imported_claude_code_session_continues_through_the_gateway_on_main() {
    let file = std::fs::read_to_string(format!(
        "{}/testdata/claude-code/short.jsonl",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("the session file");
    assert!(
        file.contains("\"thinking\""),
        "the session holds thinking blocks"
    );
    let mut gw = start().await;
    let session = imported(
        &mut gw.app,
        pb::ImportFormat::ClaudeCodeJsonl,
        file.as_bytes(),
    )
    .await;
    let (before, branches) = shape(&mut gw.app, &session).await;
    assert_eq!(branches, ["main"]);

    let mut messages = claude_code_request_messages(&file);
    // As Claude Code resends it: a cache marker on the last block.
    let last = messages.last_mut().expect("messages");
    if let Some(Value::Array(blocks)) = last.get_mut("content")
        && let Some(Value::Object(block)) = blocks.last_mut()
    {
        block.insert("cache_control".into(), json!({"type": "ephemeral"}));
    }
    messages.push(json!({"role": "user", "content": "and now run the tests"}));
    let body = json!({"model": "claude-test-1", "max_tokens": 1024, "messages": messages});
    let answer = gw
        .messages_with(&body, &[("x-ctxd-session", session.as_str())])
        .await
        .ok();
    assert_eq!(answer.session(), session);
    assert_eq!(answer.branch(), "main", "the continuation forks nothing");
    let (after, branches) = shape(&mut gw.app, &session).await;
    assert_eq!(branches, ["main"], "no gw-… branch");
    assert_eq!(
        after,
        before + 2,
        "only the new user message and the answer are appended"
    );
}

#[tokio::test]
async fn an_imported_openai_conversation_continues_through_the_gateway_on_main() {
    // The arguments as a model spaced them.
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "what is here?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "ls", "arguments": "{\"path\": \".\",  \"all\": true}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "Two files."},
    ]);
    let mut gw = start().await;
    for resent_arguments in [
        // As imported, byte for byte.
        "{\"path\": \".\",  \"all\": true}",
        // The same object spaced and ordered otherwise, as another client library writes it.
        "{\"all\":true,\"path\":\".\"}",
    ] {
        let data = messages.to_string();
        let session = imported(
            &mut gw.app,
            pb::ImportFormat::OpenaiMessages,
            data.as_bytes(),
        )
        .await;
        let (before, branches) = shape(&mut gw.app, &session).await;
        assert_eq!((before, branches), (5, vec!["main".to_owned()]));

        let mut resent = messages.clone();
        resent[2]["tool_calls"][0]["function"]["arguments"] = json!(resent_arguments);
        let resent = resent.as_array_mut().expect("messages");
        resent.push(json!({"role": "user", "content": "and the hidden ones?"}));
        let body = json!({"model": "gpt-test", "messages": resent});
        let answer = gw
            .chat_with(&body, &[("x-ctxd-session", session.as_str())])
            .await
            .ok();
        assert_eq!(answer.session(), session);
        assert_eq!(answer.branch(), "main", "{resent_arguments}: forks nothing");
        let (after, branches) = shape(&mut gw.app, &session).await;
        assert_eq!(branches, ["main"], "{resent_arguments}: no gw-… branch");
        assert_eq!(
            after,
            before + 2,
            "{resent_arguments}: only the new user message and the answer are appended"
        );
    }
}

/// The `message` of each line of a Claude Code export, without the ids an import renews.
fn exported_messages(data: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(data)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            let mut message = v["message"].clone();
            if let Some(m) = message.as_object_mut() {
                m.remove("id");
            }
            json!({"type": v["type"], "message": message})
        })
        .collect()
}

#[tokio::test]
async fn kept_blocks_leave_an_export_and_come_back_byte_exact() {
    let thinking = json!({"type": "thinking", "thinking": "The user wants the weather.",
        "signature": "EqQBCkYIBxgCKkA+/sig=="});
    let server_tool = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
        "input": {"query": "weather in Lisbon"}});
    let server_result = json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
        "content": [{"type": "web_search_result", "url": "https://example.com/lisbon",
            "title": "Lisbon", "encrypted_content": "Eo8BCioIAhgB", "page_age": null}]});
    let unknown = json!({"type": "a_block_from_next_year", "payload": {"b": [1, 2], "a": "x"}});
    let lines = [
        json!({"type": "user", "uuid": "u1", "parentUuid": null, "sessionId": "s",
            "message": {"role": "user", "content": "weather in Lisbon?"}}),
        json!({"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": "s",
            "message": {"id": "msg_1", "role": "assistant", "content": [thinking]}}),
        json!({"type": "assistant", "uuid": "a2", "parentUuid": "a1", "sessionId": "s",
            "message": {"id": "msg_1", "role": "assistant", "content": [server_tool]}}),
        json!({"type": "assistant", "uuid": "a3", "parentUuid": "a2", "sessionId": "s",
            "message": {"id": "msg_1", "role": "assistant", "content": [server_result]}}),
        json!({"type": "assistant", "uuid": "a4", "parentUuid": "a3", "sessionId": "s",
            "message": {"id": "msg_1", "role": "assistant",
                "content": [unknown, {"type": "text", "text": "Sunny, 21°C."}]}}),
    ];
    let file: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let mut app = spawn_app().await;
    let first = imported(&mut app, pb::ImportFormat::ClaudeCodeJsonl, file.as_bytes()).await;
    let (once, warnings) = exported(&mut app, &first, pb::ExportFormat::ClaudeCodeJsonl).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    let messages = exported_messages(&once);
    assert_eq!(
        messages[1]["message"]["content"],
        json!([thinking, server_tool, server_result, unknown, {"type": "text", "text": "Sunny, 21°C."}]),
        "every block as it came"
    );

    // Claude Code JSONL and ctxd JSONL alike: export, import, export again, the same bytes.
    let second = imported(&mut app, pb::ImportFormat::ClaudeCodeJsonl, &once).await;
    let (twice, _) = exported(&mut app, &second, pb::ExportFormat::ClaudeCodeJsonl).await;
    assert_eq!(exported_messages(&twice), messages);
    let (whole, _) = exported(&mut app, &second, pb::ExportFormat::CtxdJsonl).await;
    let third = imported(&mut app, pb::ImportFormat::CtxdJsonl, &whole).await;
    let (back, _) = exported(&mut app, &third, pb::ExportFormat::ClaudeCodeJsonl).await;
    assert_eq!(exported_messages(&back), messages);
}

/// The session `data` imports as.
async fn imported(app: &mut TestApp, format: pb::ImportFormat, data: &[u8]) -> String {
    import(&mut app.client, format, data)
        .await
        .expect("the import")
        .session
        .expect("a session")
        .session_id
}

/// `session`'s `main` exported as `format`, and the export's warnings.
async fn exported(
    app: &mut TestApp,
    session: &str,
    format: pb::ExportFormat,
) -> (Vec<u8>, Vec<String>) {
    let (data, _, warnings) = export(&mut app.client, session, format, "main")
        .await
        .expect("the export");
    (data, warnings)
}
