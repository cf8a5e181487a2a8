//! What is appended comes back exactly; identical content is stored once.

use ctxd::api::pb;
use pb::node_input::Kind;

use crate::helpers::*;

const MIB: usize = 1024 * 1024;

fn kind_of(n: &pb::Node) -> pb::NodeKind {
    pb::NodeKind::try_from(n.kind).unwrap_or(pb::NodeKind::Unspecified)
}

#[tokio::test]
async fn every_node_kind_round_trips() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let image: Vec<u8> = (0..=255u8).cycle().take(4096).collect();

    let tool_output = node(Kind::ToolResult(pb::ToolResult {
        call_id: "call_read".into(),
        name: String::new(),
        parts: vec![
            text("permission denied"),
            media_data("image/png", vec![0, 1, 2, 255]),
        ],
        is_error: true,
    }));
    let caller_nodes = vec![
        system("You are a careful assistant."),
        message(
            pb::Role::User,
            vec![
                text("Look at this:"),
                media_data("image/png", image.clone()),
                media_url("application/pdf", "https://example.com/spec.pdf?v=1&x=%20"),
            ],
            vec![],
        ),
        assistant_calls(
            "I'll read the file and ask a helper.",
            vec![
                call(
                    "call_read",
                    "read_file",
                    r#"{"path":"src/main.rs","lines":[1,20]}"#,
                ),
                call("call_sub", "researcher", r#"{"topic":"ctxd","depth":2}"#),
            ],
        ),
        tool_output.clone(),
        function_call("call_sub", "study ctxd", pb::Expose::Full),
    ];
    let caller = app.append(&s, caller_nodes.clone()).await;
    assert_eq!(caller.node_ids.len(), 5);
    assert_eq!(caller.head_id, caller.node_ids[4]);
    let fc = caller.node_ids[4].clone();

    let inner_nodes = vec![user("study ctxd"), assistant("ctxd stores sessions.")];
    let inner = app.append_in_function(&s, &fc, inner_nodes.clone()).await;
    assert_eq!(inner.node_ids.len(), 2);
    assert_eq!(inner.head_id, inner.node_ids[1]);
    assert_eq!(
        app.branch(&s, "main").await.head_id,
        fc,
        "appending inside a function does not move the caller's branch"
    );

    let closing = function_result(
        "call_sub",
        "ctxd stores sessions",
        pb::FunctionStatus::Error,
    );
    let closed = app.append(&s, vec![closing.clone()]).await;
    let fr = closed.node_ids[0].clone();

    // What the server stores: the input plus the fields it fills.
    let mut expected: Vec<pb::NodeInput> = caller_nodes;
    if let Some(Kind::ToolResult(r)) = expected[3].kind.as_mut() {
        r.name = "read_file".into();
    }
    if let Some(Kind::FunctionCall(f)) = expected[4].kind.as_mut() {
        f.name = "researcher".into();
    }
    expected.extend(inner_nodes);
    let mut closing_filled = closing;
    if let Some(Kind::FunctionResult(r)) = closing_filled.kind.as_mut() {
        r.function_id = fc.clone();
        r.chain_head_id = inner.node_ids[1].clone();
    }
    expected.push(closing_filled);

    let ids: Vec<String> = caller
        .node_ids
        .iter()
        .chain(&inner.node_ids)
        .chain(&closed.node_ids)
        .cloned()
        .collect();
    let nodes = app.get_nodes(&s, &ids).await;
    assert_eq!(nodes.len(), 8);

    use pb::NodeKind::*;
    let kinds: Vec<pb::NodeKind> = nodes.iter().map(kind_of).collect();
    assert_eq!(
        kinds,
        vec![
            Message,
            Message,
            Message,
            ToolResult,
            FunctionCall,
            Message,
            Message,
            FunctionResult
        ]
    );
    let parents: Vec<&str> = nodes.iter().map(|n| n.parent_id.as_str()).collect();
    let want_parents = vec![
        "",
        ids[0].as_str(),
        ids[1].as_str(),
        ids[2].as_str(),
        ids[3].as_str(),
        fc.as_str(),
        ids[5].as_str(),
        fc.as_str(),
    ];
    assert_eq!(parents, want_parents);
    let function_ids: Vec<&str> = nodes.iter().map(|n| n.function_id.as_str()).collect();
    assert_eq!(
        function_ids,
        vec!["", "", "", "", "", fc.as_str(), fc.as_str(), ""]
    );

    for (i, (n, want)) in nodes.iter().zip(&expected).enumerate() {
        assert_eq!(n.node_id, ids[i]);
        assert_eq!(n.content.as_ref(), Some(want), "content of node {i}");
        assert!(is_hex_hash(&n.hash), "hash of node {i}: {:?}", n.hash);
        assert!(n.created_at_unix_ms > 0, "created_at of node {i}");
    }
    let mut hashes: Vec<&str> = nodes.iter().map(|n| n.hash.as_str()).collect();
    hashes.sort();
    hashes.dedup();
    assert_eq!(hashes.len(), 8, "every node has its own hash");
    assert_eq!(closed.head_id, fr);
    assert_eq!(closed.head_hash, nodes[7].hash);
    assert_eq!(caller.head_hash, nodes[4].hash);

    // A render right after the appends uses the nodes as the server kept them from the
    // requests; after a restart it reads them back: the two are the same.
    let remembered = app.render_branch(&s, "main").await;
    app.restart().await;
    let read_back = app.render_branch(&s, "main").await;
    assert_eq!(remembered, read_back);
}

#[tokio::test]
async fn unicode_text_round_trips_unchanged() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let samples = [
        "emoji: 👩‍👩‍👧‍👦 🚀 🏳️‍🌈 🇯🇵 👍🏽",
        "CJK: 你好，世界 こんにちは 안녕하세요 𠜎𠜱",
        "RTL: שלום עולם مرحبا بالعالم \u{200F}mark\u{202E}override\u{202C}",
        // Decomposed forms must not be normalised.
        "combining: e\u{0301} a\u{0308} o\u{0302}\u{0323} Z\u{0351}\u{0364}\u{0489}",
        "astral and controls: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 tab\t nl\n crlf\r\n zwj\u{200D}zwnj\u{200C}",
    ];
    let parts: Vec<pb::ContentPart> = samples.iter().map(|t| text(*t)).collect();
    let appended = app
        .append(
            &s,
            vec![
                message(pb::Role::User, parts.clone(), vec![]),
                assistant(samples[0]),
            ],
        )
        .await;

    let nodes = app.get_nodes(&s, &appended.node_ids).await;
    match nodes[0].content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::Message(m)) => assert_eq!(m.parts, parts),
        other => panic!("expected a message, got {other:?}"),
    }

    let rendered = app.render_branch(&s, "main").await;
    assert_eq!(rendered.messages.len(), 2);
    assert_eq!(rendered.messages[0].parts, parts);
    assert_eq!(rendered.messages[1].parts, vec![text(samples[0])]);
}

#[tokio::test]
async fn a_one_mib_tool_result_round_trips() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let big = big_text(MIB, "round-trip");
    assert_eq!(big.len(), MIB);

    let appended = app
        .append(
            &s,
            vec![
                assistant_calls("", vec![call("c1", "cat", r#"{"file":"big.log"}"#)]),
                tool_result("c1", &big),
            ],
        )
        .await;
    let nodes = app.get_nodes(&s, &appended.node_ids[1..]).await;
    match nodes[0].content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::ToolResult(r)) => {
            assert_eq!(r.call_id, "c1");
            assert_eq!(r.name, "cat");
            assert!(!r.is_error);
            assert_eq!(r.parts.len(), 1);
            let stored = text_of(&r.parts);
            assert_eq!(stored.len(), MIB);
            assert!(stored == big, "the 1 MiB text comes back byte for byte");
        }
        other => panic!("expected a tool result, got {other:?}"),
    }
}

/// A text under 1 KiB is kept in its node's body; from 1 KiB on it is a blob, stored once. Both
/// come back byte for byte.
#[tokio::test]
async fn short_texts_stay_in_the_node_and_long_ones_are_blobs() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let short = "é".repeat(511) + "x"; // 1,023 bytes
    let long = "é".repeat(512); // 1,024 bytes
    let base = app.blob_count().await;
    app.append(&s, vec![user(&short), assistant(&short)]).await;
    assert_eq!(app.blob_count().await, base, "a short text writes no blob");
    app.append(&s, vec![user(&long), assistant(&long)]).await;
    assert_eq!(app.blob_count().await, base + 1, "a long text is one blob");
    let rendered = app.render_branch(&s, "main").await.messages;
    let texts: Vec<String> = rendered.iter().map(|m| text_of(&m.parts)).collect();
    assert_eq!(texts, [short.clone(), short, long.clone(), long]);
}

#[tokio::test]
async fn identical_content_is_stored_once() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let big = big_text(MIB, "same");
    let other = big_text(MIB, "other");
    app.append(&s, vec![user("start")]).await;
    let base = app.blob_count().await;

    // The same 1 MiB text in three appends, then twice in one message.
    for _ in 0..3 {
        app.append(&s, vec![user(&big)]).await;
    }
    assert_eq!(
        app.blob_count().await,
        base + 1,
        "one blob for the same text appended three times"
    );
    app.append(
        &s,
        vec![message(
            pb::Role::User,
            vec![text(&big), text(&big)],
            vec![],
        )],
    )
    .await;
    assert_eq!(
        app.blob_count().await,
        base + 1,
        "one blob for the same text twice in a message"
    );

    // The same bytes as media in two messages: one more blob.
    let image: Vec<u8> = (0..=255u8).rev().cycle().take(10_000).collect();
    for _ in 0..2 {
        app.append(
            &s,
            vec![message(
                pb::Role::User,
                vec![media_data("image/png", image.clone())],
                vec![],
            )],
        )
        .await;
    }
    assert_eq!(
        app.blob_count().await,
        base + 2,
        "one blob for the same media bytes twice"
    );

    // The same text in a tool result (a different node kind). Each round also
    // stores a fresh tool call: measure against a control round with new text.
    let before = app.blob_count().await;
    app.append(
        &s,
        vec![
            assistant_calls("", vec![call("c1", "read_a", r#"{"path":"a"}"#)]),
            tool_result("c1", &other),
        ],
    )
    .await;
    let control = app.blob_count().await - before;
    assert!(
        control >= 1,
        "a new 1 MiB text adds a blob (added {control})"
    );

    let before = app.blob_count().await;
    app.append(
        &s,
        vec![
            assistant_calls("", vec![call("c2", "read_b", r#"{"path":"b"}"#)]),
            tool_result("c2", &big),
        ],
    )
    .await;
    assert_eq!(
        app.blob_count().await - before,
        control - 1,
        "a tool result repeating a stored text reuses its blob"
    );
}
