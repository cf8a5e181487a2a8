//! Documents of rendered messages from anywhere (other formats' nodes, summaries, reduced
//! results) under Gemini's rules, which blocks are hollow, and Google's error shape.

use serde_json::json;

use super::*;
use crate::domain::{MediaSource, Part, ProviderBlock, ToolCall, WireFormat};
use crate::provider::codec::Failure;
use crate::render::{MessageRole, Reduction};

fn message(role: MessageRole, text: &str) -> Message {
    Message::new(role, vec![Part::Text(text.into())])
}

fn result(call: &str, name: &str, text: &str) -> Message {
    Message {
        tool_call_id: Some(call.into()),
        name: Some(name.into()),
        ..message(MessageRole::Tool, text)
    }
}

#[test]
fn a_render_from_anywhere_is_valid_gemini() {
    let call = |id: &str, name: &str| ToolCall {
        call_id: id.into(),
        name: name.into(),
        arguments_json: r#"{"path":"a"}"#.into(),
    };
    let assistant = Message {
        tool_calls: vec![
            call("toolu_1", "Read"),
            call("toolu_2", "Grep"),
            call("toolu_3", "Ls"),
        ],
        ..Message::new(
            MessageRole::Assistant,
            vec![
                Part::Text("Reading.".into()),
                Part::Block(ProviderBlock::reasoning(r#"{"type":"thinking"}"#.into())),
                Part::Block(ProviderBlock::new(WireFormat::Responses, "{}".into())),
            ],
        )
    };
    let mut cleared = result("toolu_2", "Grep", "[cleared]");
    cleared.reduction = Reduction::Cleared;
    cleared.is_error = true;
    let image = Message {
        parts: vec![
            Part::Text("see".into()),
            Part::Media {
                mime_type: "image/png".into(),
                source: MediaSource::Data(vec![1, 2, 3]),
            },
            Part::Media {
                mime_type: "image/*".into(),
                source: MediaSource::Url("https://example.com/a.png".into()),
            },
        ],
        ..message(MessageRole::User, "")
    };
    let messages = vec![
        message(MessageRole::System, "Be brief."),
        message(MessageRole::User, "[summary] earlier work"),
        image,
        assistant,
        result("toolu_1", "Read", "contents"),
        cleared,
        message(MessageRole::User, "next"),
        Message {
            tool_calls: vec![call("toolu_4", "Pending")],
            ..message(MessageRole::Assistant, "Waiting.")
        },
    ];
    let (contents, sources) = Gemini.document(&messages);
    assert_eq!(
        contents,
        [
            json!({"role": "user", "parts": [{"text": "[system] Be brief."}]}),
            json!({"role": "user", "parts": [{"text": "[summary] earlier work"}]}),
            json!({"role": "user", "parts": [{"text": "see"},
                {"inlineData": {"mimeType": "image/png", "data": "AQID"}},
                {"text": "[image/* attachment]"}]}),
            // Other formats' blocks are left out, and so is the call no result answers.
            json!({"role": "model", "parts": [{"text": "Reading."},
                {"functionCall": {"name": "Read", "args": {"path": "a"}}},
                {"functionCall": {"name": "Grep", "args": {"path": "a"}}}]}),
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": "Read", "response": {"output": "contents"}}},
                {"functionResponse": {"name": "Grep", "response": {"error": "[cleared]"}}}]}),
            json!({"role": "user", "parts": [{"text": "next"}]}),
            json!({"role": "model", "parts": [{"text": "Waiting."}]}),
        ]
    );
    assert_eq!(
        sources,
        [
            vec![0],
            vec![1],
            vec![2],
            vec![3],
            vec![4, 5],
            vec![6],
            vec![7]
        ]
    );
}

#[test]
fn a_reduced_object_response_goes_as_its_text() {
    let body = body(json!([user("go"),
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"rows": [1, 2]}}}]}]));
    let conv = read(body).unwrap();
    let mut messages = rendered(&conv);
    let (contents, _) = Gemini.document(&messages);
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"]["response"],
        json!({"rows": [1, 2]})
    );
    let kept: Vec<Part> = messages[2]
        .parts
        .iter()
        .filter(|p| !matches!(p, Part::Text(_)))
        .cloned()
        .collect();
    messages[2].parts = kept;
    messages[2]
        .parts
        .push(Part::Text("[cleared: 12 characters]".into()));
    messages[2].reduction = Reduction::Cleared;
    let (contents, _) = Gemini.document(&messages);
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"]["response"],
        json!({"output": "[cleared: 12 characters]"})
    );
}

#[test]
fn a_result_keeps_its_calls_id() {
    // Cleared, a result is its placeholder alone: it takes its call's wire id.
    let conv = read(corpus(2)).unwrap();
    let mut messages = rendered(&conv);
    messages[2].parts = vec![Part::Text("[cleared]".into())];
    messages[2].reduction = Reduction::Cleared;
    let (contents, _) = Gemini.document(&messages);
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"],
        json!({"id": "run_shell_command_1796668890921_0", "name": "run_shell_command",
               "response": {"output": "[cleared]"}})
    );
    // One the client sent without it is written back without it.
    let sent = json!([user("go"),
        {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "f", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "o"}}}]}]);
    let (_, contents, _) = round_trip(&body(sent.clone()));
    assert_eq!(same(&contents), same(sent.as_array().unwrap()));
}

#[test]
fn only_a_kept_part_is_hollow() {
    let conv = read(corpus(2)).unwrap();
    let NodeContent::Message { parts, .. } = &conv.items[1].content else {
        panic!()
    };
    let Part::Block(wire) = &parts[0] else {
        panic!()
    };
    assert!(
        !Gemini.hollow_block(wire),
        "a wire block holds its call's members"
    );
    let thought = read(body(json!([user("go"), {"role": "model", "parts": [
        {"text": "hm", "thought": true}, {"text": "ok"}]}])))
    .unwrap();
    let NodeContent::Message { parts, .. } = &thought.items[1].content else {
        panic!()
    };
    let Part::Block(block) = &parts[0] else {
        panic!()
    };
    assert!(block.reasoning);
    assert!(Gemini.hollow_block(block));
    assert!(!Gemini.hollow_block(&ProviderBlock::new(WireFormat::Responses, "{}".into())));
}

#[test]
fn errors_are_googles() {
    assert_eq!(
        Gemini.error(
            Failure::Invalid,
            "contents[0].role: bad",
            Some("contents[0].role")
        ),
        json!({"error": {"code": 400, "message": "contents[0].role: bad", "status": "INVALID_ARGUMENT",
            "details": [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                         "fieldViolations": [{"field": "contents[0].role", "description": "contents[0].role: bad"}]}]}})
    );
    for (failure, code, status) in [
        (Failure::Unauthenticated, 401, "UNAUTHENTICATED"),
        (Failure::NotFound, 404, "NOT_FOUND"),
        (Failure::TooLarge, 413, "INVALID_ARGUMENT"),
        (Failure::Upstream, 502, "UNAVAILABLE"),
        (Failure::Busy, 429, "RESOURCE_EXHAUSTED"),
        (Failure::Unavailable, 503, "UNAVAILABLE"),
    ] {
        assert_eq!(
            Gemini.error(failure, "m", None),
            json!({"error": {"code": code, "message": "m", "status": status}})
        );
    }
}
