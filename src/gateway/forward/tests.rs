//! The forwarded conversation's documents: hollow ones keep every entry's shape, and what
//! is forwarded of a client's entries, markers and kept blocks.

use super::*;
use crate::domain::{MediaSource, ToolCall};
use crate::domain::{ProviderBlock, WireFormat};
use crate::provider::format::MESSAGE_FIELDS;
use crate::render::MessageRole;

fn message(role: MessageRole, parts: Vec<Part>) -> Message {
    Message {
        node_ids: vec![NodeId::new()],
        ..Message::new(role, parts)
    }
}

fn block(json: &str) -> Part {
    Part::Block(ProviderBlock::new(
        WireFormat::AnthropicMessages,
        json.to_owned(),
    ))
}

/// Every shape a document decides on: texts empty and not, kept blocks (one holding the
/// message's own fields), an image, calls answered and not, results, system text.
fn conversation() -> Vec<Message> {
    let text = |t: &str| Part::Text(t.to_owned());
    let mut assistant = message(
        MessageRole::Assistant,
        vec![
            block(r#"{"thinking":"hm","type":"thinking"}"#),
            text("I will read"),
        ],
    );
    assistant.tool_calls = vec![
        ToolCall {
            call_id: "a".into(),
            name: "Read".into(),
            arguments_json: r#"{"path":"x"}"#.into(),
        },
        ToolCall {
            call_id: "b".into(),
            name: "Read".into(),
            arguments_json: r#"{"path":"y"}"#.into(),
        },
    ];
    let result = |id: &str, body: &str| {
        let mut m = message(MessageRole::Tool, vec![text(body)]);
        m.tool_call_id = Some(id.into());
        m.name = Some("Read".into());
        m
    };
    let mut calls_only = message(MessageRole::Assistant, Vec::new());
    calls_only.tool_calls = vec![ToolCall {
        call_id: "c".into(),
        name: "Bash".into(),
        arguments_json: "{}".into(),
    }];
    vec![
        message(MessageRole::System, vec![text("be brief")]),
        message(
            MessageRole::User,
            vec![
                block(&format!(r#"{{"effort":"low","type":"{MESSAGE_FIELDS}"}}"#)),
                text("hello"),
                Part::Media {
                    mime_type: "image/png".into(),
                    source: MediaSource::Data(vec![1, 2, 3]),
                },
            ],
        ),
        message(MessageRole::User, vec![text("")]),
        assistant,
        result("a", "file x"),
        result("b", ""),
        message(MessageRole::User, vec![text("and then?")]),
        calls_only,
        result("c", "ok"),
        message(MessageRole::Assistant, vec![text("done")]),
    ]
}

#[test]
fn hollow_documents_keep_every_entry_s_shape() {
    let messages = conversation();
    let all = vec![true; messages.len()];
    for format in crate::provider::codec::codecs() {
        let mut built = messages.clone();
        let (whole, whole_sources) = documents(format, &mut built, None);
        let (hollow, hollow_sources) = documents(format, &mut built, Some(&all));
        assert_eq!(
            built,
            messages,
            "{}: the messages as they were",
            format.name()
        );
        assert_eq!(hollow_sources, whole_sources, "{}", format.name());
        assert_eq!(hollow.len(), whole.len(), "{}", format.name());
        for (h, w) in hollow.iter().zip(&whole) {
            assert_eq!(shape(h), shape(w), "{}: {h} against {w}", format.name());
        }
        assert!(!hollow.iter().any(|d| d.to_string().contains("file x")));
    }
}

/// A document entry as its shape: its role, how many blocks, items or calls it holds, and
/// the ids that pair them; no text.
fn shape(v: &Value) -> Value {
    const KEPT: [&str; 9] = [
        "role",
        "content",
        "tool_calls",
        "id",
        "call_id",
        "tool_use_id",
        "tool_call_id",
        "name",
        "output",
    ];
    match v {
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| KEPT.contains(&k.as_str()))
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) if k != "content" && k != "output" => {
                            Value::String(s.clone())
                        }
                        Value::String(_) => Value::String(String::new()),
                        other => shape(other),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::String(_) => Value::String(String::new()),
        other => other.clone(),
    }
}

#[test]
fn kept_blocks_and_message_fields_come_back_as_they_came() {
    use crate::domain::Role;
    use serde_json::json;
    let thinking = json!({"type": "thinking", "thinking": "", "signature": "c2ln+/="});
    let conv = crate::provider::anthropic::read(
        &mut json!({"model": "claude-x", "max_tokens": 100, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "be brief", "output_config": {"effort": "low"}},
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "hello"}]},
        ]}),
    )
    .expect("a request");
    let messages: Vec<Message> = conv
        .items
        .iter()
        .map(|i| match &i.content {
            NodeContent::Message {
                role,
                parts,
                tool_calls,
            } => Message {
                tool_calls: tool_calls.clone(),
                ..Message::new(
                    match role {
                        Role::User => crate::render::MessageRole::User,
                        Role::Assistant => crate::render::MessageRole::Assistant,
                        _ => crate::render::MessageRole::System,
                    },
                    parts.clone(),
                )
            },
            other => panic!("{other:?}"),
        })
        .collect();
    let out = messages_for_test(&messages, &conv);
    assert_eq!(
        out,
        json!([
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": [{"type": "text", "text": "be brief"}],
             "output_config": {"effort": "low"}},
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "hello"}]},
        ])
    );
}

fn messages_for_test(rendered: &[Message], conv: &Conversation) -> Value {
    let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
    let (entries, _) = super::conversation(
        &crate::provider::anthropic::Messages,
        conv,
        &contents,
        None,
        &crate::domain::PathView::default(),
        &mut rendered.to_vec(),
    );
    let text = format!("[{}]", entries.join(","));
    serde_json::from_str(&text).expect("the forwarded messages are JSON")
}
