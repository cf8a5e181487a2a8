//! The fake provider's pricing: Anthropic's breakpoint cache and OpenAI's automatic prefix cache,
//! as `tests/common/fake_provider.rs` states them. The gateway is judged by these numbers, so
//! they are pinned here on the fake alone.

use std::time::Duration;

use serde_json::{Value, json};

use crate::fake_provider::{Bill, FakeProvider, Reply, tokens_of};
use crate::gateway::http_client;

const CLAUDE: &str = "claude-sonnet-4-5";
const GPT: &str = "gpt-5";

/// Posts `body` to the fake's `path`, expects an answer, and gives the usage it reported and
/// what the call cost as recorded.
async fn call(fake: &FakeProvider, path: &str, body: &Value) -> (Value, Bill) {
    let response = http_client()
        .post(format!("{}{path}", fake.url()))
        .json(body)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 200);
    let answer: Value = response.json().await.expect("a JSON answer");
    let bill = fake
        .last_request()
        .bill
        .expect("an answered call is billed");
    (answer["usage"].clone(), bill)
}

async fn messages(fake: &FakeProvider, body: &Value) -> Bill {
    let (usage, bill) = call(fake, "/v1/messages", body).await;
    // The usage says what the bill says, as the API reports it.
    assert_eq!(usage["input_tokens"], bill.input, "{usage}");
    assert_eq!(usage["cache_read_input_tokens"], bill.read, "{usage}");
    assert_eq!(
        usage["cache_creation_input_tokens"],
        bill.write_5m + bill.write_1h,
        "{usage}"
    );
    assert_eq!(
        usage["cache_creation"],
        json!({"ephemeral_5m_input_tokens": bill.write_5m, "ephemeral_1h_input_tokens": bill.write_1h})
    );
    bill
}

/// A text block, marked with `marker` unless it is null.
fn block(text: &str, marker: &Value) -> Value {
    let mut b = json!({"type": "text", "text": text});
    if !marker.is_null() {
        b["cache_control"] = marker.clone();
    }
    b
}

fn five_minutes() -> Value {
    json!({"type": "ephemeral"})
}

fn one_hour() -> Value {
    json!({"type": "ephemeral", "ttl": "1h"})
}

fn body(system: Value, messages: Vec<Value>) -> Value {
    json!({"model": CLAUDE, "max_tokens": 1024, "system": system, "messages": messages})
}

/// One user message of the blocks `texts`, the last marked with `marker`.
fn user(texts: &[String], marker: &Value) -> Value {
    let n = texts.len();
    let blocks: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| block(t, if i + 1 == n { marker } else { &Value::Null }))
        .collect();
    json!({"role": "user", "content": blocks})
}

fn texts(prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{prefix} block {i}: some words to count."))
        .collect()
}

#[tokio::test]
async fn fake_cache_reads_no_prefix_without_a_marker() {
    let fake = FakeProvider::start().await;
    let request = body(
        json!("You are terse."),
        vec![user(&texts("a", 3), &Value::Null)],
    );
    let total = tokens_of(&json!({"type": "text", "text": "You are terse."}))
        + texts("a", 3)
            .iter()
            .map(|t| tokens_of(&block(t, &Value::Null)))
            .sum::<u64>();
    for _ in 0..2 {
        let bill = messages(&fake, &request).await;
        assert_eq!(
            bill,
            Bill {
                input: total,
                ..Bill::default()
            },
            "an unmarked prompt is neither read nor written, however often it repeats"
        );
    }
    assert_eq!(fake.cost(), 2.0 * total as f64);
}

#[tokio::test]
async fn fake_cache_moved_marker_reads_within_20_blocks_only() {
    let system = "You are a careful coding agent.";
    let sys_tokens = tokens_of(&json!({"type": "text", "text": system}));
    let first = texts("first", 1);
    let first_tokens = tokens_of(&block(&first[0], &Value::Null));

    // The marker moves 19 blocks on: the breakpoint's 20-block look-back reaches the entry the
    // first call wrote (blocks: system 0, first 1, the new ones 2..=20).
    for (added, reads) in [(19, true), (20, false)] {
        let fake = FakeProvider::start().await;
        let one = messages(
            &fake,
            &body(json!(system), vec![user(&first, &five_minutes())]),
        )
        .await;
        assert_eq!(
            one,
            Bill {
                write_5m: sys_tokens + first_tokens,
                ..Bill::default()
            },
            "all up to the breakpoint is written"
        );
        let later = texts("later", added);
        let later_tokens: u64 = later
            .iter()
            .map(|t| tokens_of(&block(t, &Value::Null)))
            .sum();
        let moved = body(
            json!(system),
            vec![
                user(&first, &Value::Null),
                json!({"role": "assistant", "content": [block(&later[0], &Value::Null)]}),
                user(&later[1..], &five_minutes()),
            ],
        );
        let two = messages(&fake, &moved).await;
        let read = if reads { sys_tokens + first_tokens } else { 0 };
        assert_eq!(
            two,
            Bill {
                read,
                write_5m: sys_tokens + first_tokens + later_tokens - read,
                ..Bill::default()
            },
            "{added} blocks after the written breakpoint"
        );
    }

    // With the system block marked too (as Claude Code marks it), the system prefix is still
    // read when the message breakpoint moved too far.
    let fake = FakeProvider::start().await;
    let marked_system = json!([block(system, &five_minutes())]);
    messages(
        &fake,
        &body(marked_system.clone(), vec![user(&first, &five_minutes())]),
    )
    .await;
    let later = texts("later", 30);
    let later_tokens: u64 = later
        .iter()
        .map(|t| tokens_of(&block(t, &Value::Null)))
        .sum();
    let far = body(
        marked_system,
        vec![
            user(&first, &Value::Null),
            json!({"role": "assistant", "content": [block(&later[0], &Value::Null)]}),
            user(&later[1..], &five_minutes()),
        ],
    );
    assert_eq!(
        messages(&fake, &far).await,
        Bill {
            read: sys_tokens,
            write_5m: first_tokens + later_tokens,
            ..Bill::default()
        }
    );
}

#[tokio::test]
async fn fake_cache_honours_four_breakpoints_and_bills_what_follows_as_input() {
    let fake = FakeProvider::start().await;
    let marker = five_minutes();
    let blocks: Vec<Value> = texts("m", 6)
        .iter()
        .enumerate()
        .map(|(i, t)| block(t, if i < 5 { &marker } else { &Value::Null }))
        .collect();
    let each: Vec<u64> = blocks.iter().map(tokens_of).collect();
    let request = json!({"model": CLAUDE, "max_tokens": 1024, "messages": [
        {"role": "user", "content": blocks},
    ]});
    let bill = messages(&fake, &request).await;
    assert_eq!(
        bill,
        Bill {
            write_5m: each[..4].iter().sum(),
            input: each[4..].iter().sum(),
            ..Bill::default()
        },
        "a fifth marker is ignored: what follows the fourth is plain input"
    );
    assert_eq!(
        fake.cost(),
        1.25 * bill.write_5m as f64 + bill.input as f64,
        "writes cost 1.25×"
    );
}

#[tokio::test]
async fn fake_cache_entries_expire_on_the_fake_clock() {
    let fake = FakeProvider::start().await;
    let short = body(
        json!("Short-lived."),
        vec![user(&texts("s", 2), &five_minutes())],
    );
    let long = body(
        json!("Long-lived."),
        vec![user(&texts("l", 2), &one_hour())],
    );
    let short_tokens = messages(&fake, &short).await.write_5m;
    let first_long = messages(&fake, &long).await;
    let long_tokens = first_long.write_1h;
    assert!(short_tokens > 0 && long_tokens > 0);
    assert_eq!(first_long.write_5m, 0, "a 1h marker writes at the 1h price");
    assert_eq!(
        fake.cost(),
        1.25 * short_tokens as f64 + 2.0 * long_tokens as f64
    );

    fake.advance(Duration::from_secs(6 * 60));
    assert_eq!(fake.now(), Duration::from_secs(6 * 60));
    assert_eq!(
        messages(&fake, &short).await,
        Bill {
            write_5m: short_tokens,
            ..Bill::default()
        },
        "gone after 6 minutes: written again"
    );
    assert_eq!(
        messages(&fake, &long).await,
        Bill {
            read: long_tokens,
            ..Bill::default()
        },
        "a 1h entry is still there"
    );

    // A read refreshes the entry: read at 4 minutes, it is still there at 8.
    fake.advance(Duration::from_secs(4 * 60));
    assert_eq!(messages(&fake, &short).await.read, short_tokens);
    fake.advance(Duration::from_secs(4 * 60));
    assert_eq!(messages(&fake, &short).await.read, short_tokens);

    // An error answer refreshes nothing, and costs nothing.
    fake.clear_requests();
    fake.advance(Duration::from_secs(4 * 60));
    fake.script(Reply::anthropic_error(529, "overloaded_error", "busy"));
    let refused = http_client()
        .post(format!("{}/v1/messages", fake.url()))
        .json(&short)
        .send()
        .await
        .expect("send");
    assert_eq!(refused.status().as_u16(), 529);
    assert_eq!(fake.last_request().bill, None);
    assert_eq!(fake.cost(), 0.0);
    fake.advance(Duration::from_secs(2 * 60));
    assert_eq!(
        messages(&fake, &short).await.read,
        0,
        "6 minutes after its last read"
    );
}

/// A chat completions body of `messages`.
fn chat(messages: &[Value]) -> Value {
    json!({"model": GPT, "messages": messages})
}

async fn cached(fake: &FakeProvider, path: &str, body: &Value) -> (u64, u64) {
    let (usage, bill) = call(fake, path, body).await;
    let (prompt, cached) = if path == "/v1/responses" {
        (
            &usage["input_tokens"],
            &usage["input_tokens_details"]["cached_tokens"],
        )
    } else {
        (
            &usage["prompt_tokens"],
            &usage["prompt_tokens_details"]["cached_tokens"],
        )
    };
    assert_eq!(*prompt, bill.prompt(), "{usage}");
    assert_eq!(*cached, bill.read, "{usage}");
    assert_eq!(
        (bill.write_5m, bill.write_1h),
        (0, 0),
        "OpenAI bills no writes"
    );
    (bill.prompt(), bill.read)
}

#[tokio::test]
async fn fake_cache_openai_caches_from_1024_tokens_in_steps_of_128() {
    let fake = FakeProvider::start().await;
    let path = "/v1/chat/completions";
    let small = [json!({"role": "user", "content": "A short question."})];
    cached(&fake, path, &chat(&small)).await;
    assert_eq!(
        cached(&fake, path, &chat(&small)).await.1,
        0,
        "under 1,024 tokens nothing is cached"
    );

    let long = json!({"role": "user", "content": "word ".repeat(1100)});
    let long_tokens = tokens_of(&long);
    assert!(
        long_tokens > 1100 && !long_tokens.is_multiple_of(128),
        "{long_tokens}"
    );
    let (prompt, read) = cached(&fake, path, &chat(std::slice::from_ref(&long))).await;
    assert_eq!((prompt, read), (long_tokens, 0), "nothing seen before");
    let next = [
        long.clone(),
        json!({"role": "assistant", "content": "Noted."}),
        json!({"role": "user", "content": "Go on."}),
    ];
    let (_, read) = cached(&fake, path, &chat(&next)).await;
    assert_eq!(
        read,
        long_tokens / 128 * 128,
        "the earlier prefix, rounded down to 128"
    );
    let mut keyed = chat(&next);
    keyed["prompt_cache_key"] = json!("another-thread");
    assert_eq!(
        cached(&fake, path, &keyed).await.1,
        0,
        "another prompt_cache_key is another cache"
    );
}

#[tokio::test]
async fn fake_cache_responses_retention_and_expiry() {
    let fake = FakeProvider::start().await;
    let path = "/v1/responses";
    let input = json!([{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "token ".repeat(1500)}]}]);
    let plain = json!({"model": GPT, "instructions": "Be brief.", "input": input});
    let mut kept = plain.clone();
    kept["prompt_cache_retention"] = json!("24h");
    kept["prompt_cache_key"] = json!("kept");
    let (prompt, _) = cached(&fake, path, &plain).await;
    cached(&fake, path, &kept).await;
    let whole = prompt / 128 * 128;
    assert_eq!(cached(&fake, path, &plain).await.1, whole);

    fake.advance(Duration::from_secs(6 * 60));
    assert_eq!(
        cached(&fake, path, &plain).await.1,
        0,
        "5 minutes without use: gone"
    );
    assert_eq!(
        cached(&fake, path, &kept).await.1,
        whole,
        "kept for 24 hours"
    );
    fake.advance(Duration::from_secs(25 * 60 * 60));
    assert_eq!(cached(&fake, path, &kept).await.1, 0);
}
