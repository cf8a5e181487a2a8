//! Recall: every placeholder a render writes names what it replaced, and `Recall` gives the
//! original back from the store, within the caller's session alone.

use ctxd::api::pb;
use ctxd::auth::ApiKeys;
use ctxd::server::Options;
use tonic::Code;

use crate::helpers::*;

/// A policy that steps early: first 3 results, every 1, keep 1, whatever it saves.
fn stepping() -> pb::RenderPolicy {
    pb::RenderPolicy {
        microcompact_first: 3,
        microcompact_every: 1,
        microcompact_keep: 1,
        clear_at_least_tokens: Some(0),
        recent_tool_result_chars: 3000,
        max_tool_result_chars: 1000,
        ..Default::default()
    }
}

fn render_stepping(session: &str) -> pb::RenderRequest {
    pb::RenderRequest {
        budget: Some(pb::Budget {
            context_window: 1_000_000,
            ..Default::default()
        }),
        policy: Some(stepping()),
        ..render_req(session, Target::Branch("main".into()))
    }
}

/// The references `text` names, in order.
fn references(text: &str) -> Vec<String> {
    text.match_indices("recall ")
        .filter_map(|(at, _)| {
            let r: String = text[at + "recall ".len()..].chars().take(12).collect();
            (r.len() == 12 && r.chars().all(|c| c.is_ascii_hexdigit())).then_some(r)
        })
        .collect()
}

/// Recalls `reference` in `session`; it must be there.
async fn recall(app: &mut TestApp, session: &str, reference: &str) -> pb::RecallResponse {
    app.client
        .recall(recall_req(session, reference))
        .await
        .expect("Recall")
        .into_inner()
}

fn recall_req(session: &str, reference: &str) -> pb::RecallRequest {
    pb::RecallRequest {
        session_id: session.into(),
        reference: reference.into(),
        max_chars: 0,
    }
}

/// Four reads of 5,000 characters each (`read-0`…), an edit whose argument is a file body, a
/// fifth read and a closing answer: under `stepping`, the step at six results clears the four
/// reads (the edit's short result stays, a placeholder would be longer) and cuts the fifth.
async fn session_with_reads(app: &mut TestApp, task: &str) -> (String, Vec<String>) {
    let s = app.create_session().await;
    let mut nodes = vec![user(task)];
    let calls = (0..4)
        .map(|i| {
            call(
                &format!("read-{i}"),
                "read_file",
                &format!(r#"{{"path":"f{i}"}}"#),
            )
        })
        .collect();
    nodes.push(assistant_calls("reading", calls));
    let results: Vec<String> = (0..5)
        .map(|i| big_text(5000, &format!("result-{i}")))
        .collect();
    for (i, r) in results.iter().enumerate().take(4) {
        nodes.push(tool_result(&format!("read-{i}"), r));
    }
    let body = big_text(3000, "new body of f0");
    let edit = serde_json::json!({"file_path": "f0", "content": body}).to_string();
    nodes.push(assistant_calls(
        "writing f0",
        vec![call("write-0", "write_file", &edit)],
    ));
    nodes.push(tool_result("write-0", "written"));
    nodes.push(assistant_calls(
        "checking f0",
        vec![call("read-4", "read_file", r#"{"path":"f0"}"#)],
    ));
    nodes.push(tool_result("read-4", &results[4]));
    nodes.push(assistant("done"));
    app.append(&s, nodes).await;
    (s, results)
}

#[tokio::test]
async fn a_cleared_result_comes_back_byte_exact() {
    let mut app = spawn_app().await;
    let (s, results) = session_with_reads(&mut app, "read the four files, then fix one").await;
    let r = app.render(render_stepping(&s)).await;
    let cleared: Vec<&pb::RenderedMessage> = r.messages.iter().filter(|m| m.cleared).collect();
    assert!(!cleared.is_empty(), "{:#?}", transcript(&r.messages));
    for m in cleared {
        let text = text_of(&m.parts);
        let Ok([reference]) = <[String; 1]>::try_from(references(&text)) else {
            panic!("one reference in {text:?}");
        };
        assert_eq!(
            text,
            format!("[cleared to save context: recall {reference}]")
        );
        let recalled = recall(&mut app, &s, &reference).await;
        let i: usize = m.tool_call_id["read-".len()..].parse().expect("read-N");
        assert_eq!(recalled.content, results[i]);
        assert_eq!(recalled.kind, "tool_result");
        assert_eq!(recalled.node_id, m.node_ids[0]);
        assert_eq!(recalled.tool_call_id, m.tool_call_id);
        assert_eq!(recalled.tool_name, "read_file");
        assert_eq!(recalled.total_chars, results[i].chars().count() as u64);
        assert!(!recalled.truncated);
        // A reference is 12 hexadecimal characters in either case.
        let upper = recall(&mut app, &s, &reference.to_uppercase()).await;
        assert_eq!(upper.content, results[i]);
    }
}

#[tokio::test]
async fn cut_results_and_stubbed_calls_name_what_they_replaced() {
    let mut app = spawn_app().await;
    let (s, results) = session_with_reads(&mut app, "read the four files, then fix one").await;
    let r = app.render(render_stepping(&s)).await;
    // The result kept at the step is cut to 1,000; its marker names the whole.
    let cut = r
        .messages
        .iter()
        .find(|m| m.truncated && m.role == pb::Role::Tool as i32)
        .unwrap_or_else(|| panic!("a cut result in {:#?}", transcript(&r.messages)));
    let text = text_of(&cut.parts);
    let Ok([reference]) = <[String; 1]>::try_from(references(&text)) else {
        panic!("one reference in {text:?}");
    };
    assert!(
        text.contains(&format!("characters cut: recall {reference} …]")),
        "{text}"
    );
    let recalled = recall(&mut app, &s, &reference).await;
    let i: usize = cut.tool_call_id["read-".len()..].parse().expect("read-N");
    assert_eq!(recalled.content, results[i]);

    // The edit's file body is stubbed, and the stub names the call's message.
    let edit = r
        .messages
        .iter()
        .find(|m| m.tool_calls.iter().any(|c| c.call_id == "write-0"))
        .expect("the edit");
    assert_eq!(edit.inputs_stubbed, 1);
    let args = &edit.tool_calls[0].arguments_json;
    let Ok([reference]) = <[String; 1]>::try_from(references(args)) else {
        panic!("one reference in {args:?}");
    };
    let stub: serde_json::Value = serde_json::from_str(args).expect("a stub is JSON");
    assert_eq!(stub["file_path"], "f0");
    let recalled = recall(&mut app, &s, &reference).await;
    assert_eq!(recalled.kind, "message");
    assert_eq!(recalled.node_id, edit.node_ids[0]);
    assert!(
        recalled
            .content
            .starts_with("writing f0\n[tool call write_file write-0] {"),
        "{}",
        recalled.content
    );
    let original: serde_json::Value = serde_json::from_str(
        recalled
            .content
            .split_once("] ")
            .expect("the call's arguments")
            .1,
    )
    .expect("the original arguments");
    assert_eq!(original["content"], big_text(3000, "new body of f0"));

    // max_chars keeps the head and says so.
    let head = app
        .client
        .recall(pb::RecallRequest {
            max_chars: 100,
            ..recall_req(&s, &references(&text_of(&cut.parts))[0])
        })
        .await
        .expect("Recall")
        .into_inner();
    assert_eq!(
        head.content,
        results[i].chars().take(100).collect::<String>()
    );
    assert!(head.truncated);
    assert_eq!(head.total_chars, results[i].chars().count() as u64);
}

#[tokio::test]
async fn a_reference_from_another_session_is_unknown() {
    let mut app = spawn_app().await;
    let (s, _) = session_with_reads(&mut app, "read the four files, then fix one").await;
    let (other, _) = session_with_reads(&mut app, "another task").await;
    let r = app.render(render_stepping(&s)).await;
    let reference = r
        .messages
        .iter()
        .find(|m| m.cleared)
        .map(|m| references(&text_of(&m.parts))[0].clone())
        .expect("a cleared result");
    // A node's hash covers its history: the other session's nodes differ from the first
    // message on. (A session holding the very same history holds the very same content.)
    assert_status(
        app.client.recall(recall_req(&other, &reference)).await,
        Code::NotFound,
        "reference",
    );
    assert_status(
        app.client
            .recall(recall_req(&unknown_id(), &reference))
            .await,
        Code::NotFound,
        "session",
    );
}

#[tokio::test]
async fn a_reference_of_another_tenant_is_unknown() {
    const ACME: &str = "acme-2b7c94e1d05f4a18";
    const GLOBEX: &str = "globex-93d1e6a7c20b45f7";
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(&keys, format!("acme {ACME}\nglobex {GLOBEX}\n")).expect("keys");
    let (_db, server) = serve_fresh(Options {
        api_keys: Some(ApiKeys::load(keys.path()).expect("the keys file")),
        ..Options::default()
    })
    .await;
    let mut acme = keyed_client(server.addr, ACME).await;
    let mut globex = keyed_client(server.addr, GLOBEX).await;
    let session = acme
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("create")
        .into_inner()
        .session_id;
    let mut nodes = vec![user("read")];
    let calls = (0..4)
        .map(|i| call(&format!("r{i}"), "read_file", "{}"))
        .collect();
    nodes.push(assistant_calls("reading", calls));
    for i in 0..4 {
        nodes.push(tool_result(
            &format!("r{i}"),
            &big_text(2000, "acme secret"),
        ));
    }
    // The model has read them: what it has not seen no step clears.
    nodes.push(assistant("read them"));
    acme.append(append_req(&session, nodes))
        .await
        .expect("append");
    // An hour on: the provider's cache has expired, so the render steps for free.
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
        + 3_600_000;
    let r = acme
        .render(pb::RenderRequest {
            now_unix_ms: later,
            ..render_stepping(&session)
        })
        .await
        .expect("render")
        .into_inner();
    let reference = r
        .messages
        .iter()
        .find(|m| m.cleared)
        .map(|m| references(&text_of(&m.parts))[0].clone())
        .expect("a cleared result");
    acme.recall(recall_req(&session, &reference))
        .await
        .expect("the owner recalls it");
    // Globex, naming acme's session and reference, learns nothing: the session is unknown.
    assert_status(
        globex.recall(recall_req(&session, &reference)).await,
        Code::NotFound,
        "session",
    );
    // From its own session, acme's reference is unknown too.
    let own = globex
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("create")
        .into_inner()
        .session_id;
    assert_status(
        globex.recall(recall_req(&own, &reference)).await,
        Code::NotFound,
        "reference",
    );
}

#[tokio::test]
async fn bad_references_are_invalid_and_name_the_field() {
    let mut app = spawn_app().await;
    let (s, _) = session_with_reads(&mut app, "read the four files, then fix one").await;
    for bad in [
        "",
        "3f9a2c1b7d0",
        "3f9a2c1b7d04a",
        "3f9a2c1b7d0g",
        "recall 3f9a2c",
        "été3f9a2c1b7",
    ] {
        assert_status(
            app.client.recall(recall_req(&s, bad)).await,
            Code::InvalidArgument,
            "reference",
        );
    }
    assert_status(
        app.client
            .recall(pb::RecallRequest {
                max_chars: 200_001,
                ..recall_req(&s, "3f9a2c1b7d04")
            })
            .await,
        Code::InvalidArgument,
        "max_chars",
    );
    assert_status(
        app.client
            .recall(recall_req("not-a-session", "3f9a2c1b7d04"))
            .await,
        Code::InvalidArgument,
        "session_id",
    );
}

#[tokio::test]
async fn the_recall_tool_comes_in_three_shapes() {
    let mut app = spawn_app().await;
    let tool = app
        .client
        .recall_tool(pb::RecallToolRequest {})
        .await
        .expect("RecallTool")
        .into_inner();
    assert_eq!(tool.name, "recall");
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).expect("JSON");
    let (anthropic, openai, responses) = (
        parse(&tool.anthropic_json),
        parse(&tool.openai_json),
        parse(&tool.responses_json),
    );
    assert_eq!(anthropic["name"], "recall");
    assert_eq!(openai["type"], "function");
    assert_eq!(openai["function"]["name"], "recall");
    assert_eq!(responses["type"], "function");
    assert_eq!(responses["name"], "recall");
    let schema = &anthropic["input_schema"];
    assert_eq!(schema, &openai["function"]["parameters"]);
    assert_eq!(schema, &responses["parameters"]);
    assert_eq!(schema["required"], serde_json::json!(["reference"]));
    assert_eq!(schema["properties"]["reference"]["type"], "string");
}
