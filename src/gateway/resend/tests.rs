//! A resent request reads as it does whole, whatever a conversation does between requests:
//! resend with new messages (the client's breakpoint moving to the newest), edit an earlier
//! message, fork back to an earlier one, or find nothing remembered (a restart, another
//! replica's turn).

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::domain::WireFormat;
use crate::provider::codec::{Codec, Request, codec};

const PATH: &str = "/v1/messages";

fn api() -> &'static dyn Codec {
    codec(WireFormat::AnthropicMessages)
}

/// Message `n` of a tool loop: a user's text, then an answer calling a tool, then its result.
fn message(n: usize, salt: u32) -> Value {
    match n % 3 {
        0 => {
            json!({"role": "user", "content": [{"type": "text", "text": format!("ask {n} {salt}")}]})
        }
        1 => json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("reading {n}")},
            {"type": "tool_use", "id": format!("toolu_{n}"), "name": "Read",
             "input": {"file_path": format!("/src/{n}.rs")}},
        ]}),
        _ => json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": format!("toolu_{}", n - 1), "content": "x".repeat(n * 7 + salt as usize)}]}),
    }
}

/// A request body as Claude Code sends it: its newest message's last block marked, the
/// conversation first or between other members.
fn body(messages: &[Value], messages_first: bool) -> Bytes {
    let mut messages = messages.to_vec();
    if let Some(Value::Array(blocks)) = messages.last_mut().and_then(|m| m.get_mut("content"))
        && let Some(Value::Object(block)) = blocks.last_mut()
    {
        block.insert("cache_control".into(), json!({"type": "ephemeral"}));
    }
    let messages = Value::Array(messages).to_string();
    let text = if messages_first {
        format!(
            r#"{{"model":"claude-sonnet-4-5","messages":{messages},"system":[{{"type":"text","text":"sys"}}],"tools":[{{"name":"Read","input_schema":{{"type":"object"}}}}],"max_tokens":1024,"stream":true}}"#
        )
    } else {
        format!(r#"{{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":{messages}}}"#)
    };
    Bytes::from(text)
}

fn whole(body: &Bytes) -> Conversation {
    let value: Value = serde_json::from_slice(body).expect("JSON");
    api()
        .read(Request {
            path: PATH,
            body: value,
            headers: &[],
        })
        .expect("a request")
}

#[derive(Debug, Clone)]
enum Step {
    /// The answer and `n` more messages (a new turn).
    Resend(usize),
    /// An earlier message said otherwise.
    Edit(usize),
    /// Back to an earlier message, then on from there.
    Fork(usize),
    /// Nothing remembered.
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..4).prop_map(Step::Resend),
        1 => (0usize..64).prop_map(Step::Edit),
        1 => (0usize..64).prop_map(Step::Fork),
        1 => Just(Step::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_resent_request_reads_as_it_does_whole(
        steps in prop::collection::vec(step(), 1..24),
        messages_first in any::<bool>(),
    ) {
        let mut messages: Vec<Value> = (0..2).map(|n| message(n, 0)).collect();
        let mut remembered: Option<Previous> = None;
        let mut salt = 0;
        for step in steps {
            salt += 1;
            let grown = matches!(step, Step::Resend(_));
            match step {
                Step::Resend(n) => {
                    let len = messages.len();
                    messages.extend((len..len + n).map(|k| message(k, 0)));
                }
                Step::Edit(at) => {
                    let at = at % messages.len();
                    messages[at] = message(at, salt);
                }
                Step::Fork(at) => {
                    messages.truncate(at % messages.len() + 1);
                    let len = messages.len();
                    messages.push(message(len, salt));
                }
                Step::Restart => remembered = None,
            }
            let body = body(&messages, messages_first);
            let read = whole(&body);
            let resent = remembered
                .as_ref()
                .and_then(|p| resent(api(), p, &body, Vec::new()));
            if let Some((conv, _, _)) = &resent {
                prop_assert_eq!(conv, &read);
            }
            // A request that only adds to the one before is read from what it adds.
            if grown && remembered.is_some() {
                prop_assert!(resent.is_some(), "a grown conversation was read whole");
            }
            remembered = match resent {
                Some((_, next, _)) => Some(next),
                None => Previous::of(api(), body.clone(), Vec::new(), &read),
            };
        }
    }
}

#[test]
fn a_request_with_other_headers_or_members_is_read_whole() {
    let messages: Vec<Value> = (0..3).map(|n| message(n, 0)).collect();
    let first = body(&messages[..2], true);
    let previous = Previous::of(api(), first.clone(), Vec::new(), &whole(&first)).expect("spans");
    let next = body(&messages, true);
    assert!(resent(api(), &previous, &next, Vec::new()).is_some());
    let headers = vec![(
        "anthropic-beta".to_owned(),
        "context-1m-2025-08-07".to_owned(),
    )];
    assert!(resent(api(), &previous, &next, headers).is_none());
    let other = Bytes::from(
        String::from_utf8(next.to_vec())
            .expect("UTF-8")
            .replace(r#""max_tokens":1024"#, r#""max_tokens":2048"#),
    );
    assert!(resent(api(), &previous, &other, Vec::new()).is_none());
}

#[test]
fn a_body_that_names_its_conversation_twice_is_not_remembered() {
    let once = body(&[message(0, 0)], true);
    let text = String::from_utf8(once.to_vec()).expect("UTF-8");
    // A JSON reader takes the last `messages`; the bytes' first would be another conversation.
    let twice = Bytes::from(text.replacen(
        r#""messages":"#,
        r#""messages":[{"role":"user","content":"other"}],"messages":"#,
        1,
    ));
    assert!(Previous::of(api(), twice.clone(), Vec::new(), &whole(&twice)).is_none());
    assert!(Previous::of(api(), once.clone(), Vec::new(), &whole(&once)).is_some());
}

#[test]
fn the_least_recently_used_conversation_is_forgotten_first() {
    let resends = Resends::default();
    let tenant = Tenant::local();
    let key = |n: usize| Key::new(&tenant, api(), PATH, Some(&format!("s{n}")));
    let first = body(&[message(0, 0)], true);
    let read = whole(&first);
    for n in 0..=REMEMBERED {
        if n == REMEMBERED {
            // The first is used again: the second is now the oldest.
            assert!(resends.get(&key(0), &first).is_some());
        }
        let previous = Previous::of(api(), first.clone(), Vec::new(), &read).expect("spans");
        resends.remember(key(n), previous, None);
    }
    assert!(resends.get(&key(0), &first).is_some(), "used lately, kept");
    assert!(
        resends.get(&key(1), &first).is_none(),
        "the oldest, forgotten"
    );
    assert!(resends.get(&key(REMEMBERED), &first).is_some());
}

#[test]
fn conversations_under_one_key_each_resend_their_own() {
    // An agent and its sub-agent, neither naming a session: one key, two conversations.
    let resends = Resends::default();
    let key = Key::new(&Tenant::local(), api(), PATH, None);
    let agent: Vec<Value> = (0..8).map(|n| message(n, 1)).collect();
    let sub: Vec<Value> = (0..8).map(|n| message(n, 2)).collect();
    for (len, conversation) in [(2, &agent), (2, &sub), (5, &agent), (5, &sub), (8, &agent)] {
        let body = body(&conversation[..len], true);
        let previous = resends.get(&key, &body);
        let read = whole(&body);
        match previous
            .as_deref()
            .and_then(|p| resent(api(), p, &body, Vec::new()))
        {
            Some((conv, next, _)) => {
                assert_eq!(conv, read);
                resends.remember(key.clone(), next, previous.as_ref());
            }
            None => {
                assert_eq!(len, 2, "only a conversation's first request is read whole");
                let p = Previous::of(api(), body.clone(), Vec::new(), &read).expect("spans");
                resends.remember(key.clone(), p, None);
            }
        }
    }
}

#[test]
fn a_resent_chat_completions_request_reads_as_it_does_whole() {
    let chat = codec(WireFormat::ChatCompletions);
    let message = |n: usize| match n % 3 {
        0 => json!({"role": "user", "content": format!("ask {n}")}),
        1 => {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{n}"),
            "type": "function", "function": {"name": "read", "arguments": format!("{{\"n\":{n}}}")}}]})
        }
        _ => {
            json!({"role": "tool", "tool_call_id": format!("call_{}", n - 1), "content": "x".repeat(n)})
        }
    };
    let body = |messages: &[Value]| {
        let mut all = vec![json!({"role": "system", "content": "sys"})];
        all.extend_from_slice(messages);
        Bytes::from(json!({"model": "gpt-5", "messages": all, "stream": true}).to_string())
    };
    let whole = |body: &Bytes| {
        chat.read(Request {
            path: "/v1/chat/completions",
            body: serde_json::from_slice(body).expect("JSON"),
            headers: &[],
        })
        .expect("a request")
    };
    let first = body(&[message(0)]);
    let mut previous =
        Previous::of(chat, first.clone(), Vec::new(), &whole(&first)).expect("spans");
    let mut messages = vec![message(0)];
    for n in 1..12 {
        messages.push(message(n));
        let next = body(&messages);
        let (conv, remembered, _) =
            resent(chat, &previous, &next, Vec::new()).expect("a grown request read from its tail");
        assert_eq!(conv, whole(&next), "after {n} messages");
        previous = remembered;
    }
}
