//! ImportSession through the real server: real traces in, nothing half-imported on bad input.

use ctxd::api::pb::{self, render_request::Target};
use tonic::Code;

use crate::helpers::*;

fn testdata(path: &str) -> Vec<u8> {
    std::fs::read(format!("{}/testdata/{path}", env!("CARGO_MANIFEST_DIR"))).expect("test file")
}

async fn import(
    app: &mut TestApp,
    format: pb::ImportFormat,
    data: Vec<u8>,
) -> Result<pb::ImportSessionResponse, tonic::Status> {
    // Several chunks, as a client streams a large file.
    let chunks: Vec<pb::ImportChunk> = data
        .chunks(64 * 1024)
        .enumerate()
        .map(|(i, chunk)| pb::ImportChunk {
            format: if i == 0 { format as i32 } else { 0 },
            metadata: if i == 0 {
                [("source".to_owned(), "test".to_owned())].into()
            } else {
                Default::default()
            },
            data: chunk.to_vec(),
            ..Default::default()
        })
        .collect();
    app.client
        .import_session(tokio_stream::iter(chunks))
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn neutral_traces_import_whole_and_render_as_they_were() {
    let mut app = spawn_app().await;
    for (file, messages) in [
        ("traces/swe-marshmallow-1867-fc.jsonl", 28),
        ("traces/cc-main-8463c716.jsonl", 323),
    ] {
        let imported = import(&mut app, pb::ImportFormat::Unspecified, testdata(file))
            .await
            .expect("ImportSession");
        assert_eq!(
            imported.format,
            pb::ImportFormat::NeutralJsonl as i32,
            "{file}"
        );
        assert_eq!(imported.nodes, messages, "{file}");
        assert!(
            imported.warnings.is_empty(),
            "{file}: {:?}",
            imported.warnings
        );
        let session = imported.session.expect("session");
        assert_eq!(
            session.metadata.get("source").map(String::as_str),
            Some("test")
        );
        let r = app.render_branch(&session.session_id, "main").await;
        assert_eq!(r.messages.len(), messages as usize, "{file}");
    }
}

#[tokio::test]
async fn a_claude_code_session_brings_its_sub_agent_and_its_compaction() {
    let mut app = spawn_app().await;
    let mut data = testdata("claude-code/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    data.extend(testdata("claude-code/258c7280-agent-a881341.jsonl"));
    let imported = import(&mut app, pb::ImportFormat::ClaudeCodeJsonl, data)
        .await
        .expect("ImportSession");
    assert_eq!(imported.functions, 1);
    assert_eq!(imported.summaries, 1);
    let session = imported.session.expect("session");
    assert_eq!(session.compaction_count, 1);
    let s = session.session_id;

    // The compaction is a summary record over the earlier history, not a message.
    let r = app.render_branch(&s, "main").await;
    let first = text_of(&r.messages[0].parts);
    assert!(
        first.starts_with("[Summary of the earlier conversation"),
        "{first}"
    );
    assert!(first.contains("This session is being continued from a previous conversation"));
    let listed = summaries(&mut app.client, &s).await;
    assert_eq!(listed.summaries.len(), 1);
    assert!(listed.summaries[0].active);
    assert_eq!(listed.summaries[0].model, "imported");

    // The sub-agent is a function: its chain renders at its id, starting with its prompt.
    let log = app
        .log_all(pb::LogRequest {
            session_id: s.clone(),
            limit: 1000,
            ..Default::default()
        })
        .await;
    let call = log
        .iter()
        .find(|n| n.kind == pb::NodeKind::FunctionCall as i32)
        .expect("a function call node");
    let inner = app
        .render(pb::RenderRequest {
            callers: pb::Callers::None as i32,
            ..render_req(&s, Target::FunctionId(call.node_id.clone()))
        })
        .await;
    let prompt = text_of(&inner.messages[0].parts);
    assert!(
        prompt.starts_with("What is the output contract for Claude Code hooks"),
        "{prompt:?}"
    );
    assert!(inner.messages.iter().all(|m| m.function_id == call.node_id));
}

#[tokio::test]
async fn an_openai_messages_array_imports() {
    let mut app = spawn_app().await;
    let data = br#"[{"role": "system", "content": "be brief"},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a b"},
        {"role": "assistant", "content": "a and b"}]"#;
    let imported = import(&mut app, pb::ImportFormat::Unspecified, data.to_vec())
        .await
        .expect("ImportSession");
    assert_eq!(imported.format, pb::ImportFormat::OpenaiMessages as i32);
    let r = app
        .render(pb::RenderRequest {
            format: pb::Format::OpenaiChat as i32,
            ..render_req(
                &imported.session.expect("session").session_id,
                Target::Branch("main".into()),
            )
        })
        .await;
    let doc: serde_json::Value = serde_json::from_str(&r.messages_json).expect("JSON");
    assert_eq!(doc[2]["tool_calls"][0]["function"]["name"], "ls");
    assert_eq!(doc[3]["role"], "tool");
    assert_eq!(doc[3]["name"], serde_json::Value::Null);
}

#[tokio::test]
async fn malformed_input_names_the_line_and_leaves_nothing() {
    let mut app = spawn_app().await;
    let before = app.session_count().await;
    let mut data = testdata("traces/swe-marshmallow-1867-fc.jsonl");
    data.extend(b"{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"x\", \"name\": \"n\", \"arguments\": \"{oops\"}]}\n");
    let status = import(&mut app, pb::ImportFormat::NeutralJsonl, data)
        .await
        .expect_err("malformed");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("line 29.tool_calls[0].arguments: not JSON"),
        "{}",
        status.message()
    );
    assert_status(
        import(
            &mut app,
            pb::ImportFormat::ClaudeCodeJsonl,
            b"{\"type\": \"user\"}\n".to_vec(),
        )
        .await,
        Code::InvalidArgument,
        "line 1.message",
    );
    assert_status(
        import(&mut app, pb::ImportFormat::NeutralJsonl, Vec::new()).await,
        Code::InvalidArgument,
        "data",
    );
    assert_eq!(app.session_count().await, before, "nothing half-imported");
    assert_eq!(app.node_count().await, 0);
}

/// An import retried with its idempotency key returns the session the first one created and
/// writes nothing more; the key with another file is refused.
#[tokio::test]
async fn an_import_with_a_key_is_stored_once() {
    let mut app = spawn_app().await;
    let keyed = |data: &[u8]| pb::ImportChunk {
        format: pb::ImportFormat::NeutralJsonl as i32,
        data: data.to_vec(),
        idempotency_key: "import-1".into(),
        ..Default::default()
    };
    let file = br#"{"role": "user", "content": "hello"}"#;
    let import = |chunk: pb::ImportChunk| {
        let mut client = app.client.clone();
        async move { client.import_session(tokio_stream::iter([chunk])).await }
    };
    let first = import(keyed(file)).await.expect("import").into_inner();
    let nodes = app.node_count().await;
    let again = import(keyed(file)).await.expect("the retry").into_inner();
    assert_eq!(
        again.session.expect("session").session_id,
        first.session.expect("session").session_id
    );
    assert_eq!(app.node_count().await, nodes, "nothing written twice");
    let refused = import(keyed(br#"{"role": "user", "content": "other"}"#)).await;
    assert_status(refused, Code::FailedPrecondition, "idempotency_key");
    assert_eq!(app.session_count().await, 1);
}
