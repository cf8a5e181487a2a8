//! The fake provider's rules beyond its caches, as `tests/common/fake_provider.rs` states them:
//! per-model read prices, thinking blocks bound to the prefix they were produced on (refused,
//! or dropped with the binding beta), and server-side context editing (`clear_tool_uses`,
//! `clear_thinking`). The gateway is judged against these rules, so they are pinned here on
//! the fake alone, over HTTP.

use serde_json::{Value, json};

use crate::fake_provider::{
    BILLING_HEADER, Block, CLEAR_THINKING, CLEAR_TOOL_USES, CLEARED_TOOL_RESULT, FakeProvider,
    Recorded, Reply, SIGNATURE_PREFIX, THINKING_TEXT, anthropic_message_of_sse, anthropic_units,
    binds_thinking, parse_sse, read_price, thinking_signature,
};
use crate::gateway::http_client;

/// A model that binds its thinking (a dated id), and one that does not.
const BINDING: &str = "claude-opus-5-5-20261015";
const PLAIN: &str = "claude-sonnet-4-5";
const EDITING: &str = "context-management-2025-06-27";
const DROPPING: &str = "thinking-binding-controls-2026-08-01";

/// What a request refused for an unbound thinking block says after its location.
const UNBOUND: &str = concat!(
    "Invalid `signature` in `thinking` block. The block is bound to a different conversation. ",
    "Thinking blocks must be sent back after exactly the prefix they were produced on."
);

/// Posts `body` (as `raw` text when given) to the fake's `path`, one `anthropic-beta` header
/// line per entry of `betas`; gives the status and the answer: a streamed one as the message
/// its events build, else the JSON body.
async fn send_text(
    fake: &FakeProvider,
    path: &str,
    body: &Value,
    raw: Option<String>,
    betas: &[&str],
) -> (u16, Value) {
    let mut request = http_client()
        .post(format!("{}{path}", fake.url()))
        .header("content-type", "application/json")
        .body(raw.unwrap_or_else(|| body.to_string()));
    for beta in betas {
        request = request.header("anthropic-beta", *beta);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("a body");
    let answer = if status == 200 && body["stream"] == true {
        anthropic_message_of_sse(&bytes).expect("a whole stream")
    } else {
        serde_json::from_slice(&bytes).expect("a JSON body")
    };
    (status, answer)
}

async fn send(fake: &FakeProvider, body: &Value, betas: &[&str]) -> (u16, Value) {
    send_text(fake, "/v1/messages", body, None, betas).await
}

/// An answer that must come (200).
async fn answer(fake: &FakeProvider, body: &Value, betas: &[&str]) -> Value {
    let (status, answer) = send(fake, body, betas).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// A refusal that must come: 400, its error message.
async fn refused(fake: &FakeProvider, body: &Value, betas: &[&str]) -> String {
    let (status, answer) = send(fake, body, betas).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["type"], "error");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    answer["error"]["message"]
        .as_str()
        .expect("a message")
        .to_owned()
}

fn unbound(message: usize, content: usize) -> String {
    format!("messages.{message}.content.{content}: {UNBOUND}")
}

/// Tokens of a prompt as the fake prices it.
fn prompt_tokens(body: &Value) -> u64 {
    anthropic_units(body).iter().map(|u| u.tokens).sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// `value` as JSON text with every object's keys in reverse order (a client's own order).
fn reversed(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), reversed(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(reversed).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn assistant(answer: &Value) -> Value {
    json!({"role": "assistant", "content": answer["content"]})
}

fn result(id: &Value, text: &str) -> Value {
    json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id, "content": text}]})
}

/// `messages` with every marker removed, then one on the last block of the last message.
fn marked_last(messages: &[Value]) -> Vec<Value> {
    let mut messages: Vec<Value> = messages.iter().map(unmarked).collect();
    if let Some(Value::Array(blocks)) = messages.last_mut().map(|m| &mut m["content"])
        && let Some(last) = blocks.last_mut()
    {
        last["cache_control"] = json!({"type": "ephemeral"});
    }
    messages
}

/// `value` without `cache_control` keys, at any depth.
fn unmarked(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, v)| (k.clone(), unmarked(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(unmarked).collect()),
        other => other.clone(),
    }
}

/// A weather agent's request to the binding model with thinking on; Claude Code's billing
/// header (changed on every request) first in the system prompt, the instructions marked.
fn weather(billing: &str, messages: &[Value]) -> Value {
    json!({
        "model": BINDING,
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "tools": [{"name": "weather", "description": "The weather in a city.",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "system": [
            {"type": "text", "text": format!("{BILLING_HEADER} cc_version=2.1; cch={billing};")},
            {"type": "text", "text": "You are a weather agent.",
             "cache_control": {"type": "ephemeral"}},
        ],
        "messages": messages,
    })
}

/// `body` with `answer`'s message appended: where its blocks' prefixes are read.
fn answered(body: &Value, answer: &Value) -> Value {
    let mut body = body.clone();
    body["messages"]
        .as_array_mut()
        .expect("messages")
        .push(assistant(answer));
    body
}

/// Three tool calls of the binding model, each answered with its result:
/// `[ask, A1, R1, A2, R2, A3, R3]`, A1 opening with scripted thinking (its signature the
/// fake's), A2 with the thinking the fake adds, A3 with redacted thinking. Every request has
/// another billing header and its marker on its last block, and is accepted.
async fn tool_loop(fake: &FakeProvider) -> Vec<Value> {
    fake.script_all([
        Reply::thinking(
            "Paris first.",
            "a scripted signature",
            Reply::tool_use("weather", json!({"city": "Paris"})),
        ),
        Reply::tool_use("weather", json!({"city": "Rome"})),
        Reply::blocks(vec![
            Block::RedactedThinking("scripted data".into()),
            Block::ToolUse {
                id: String::new(),
                name: "weather".into(),
                input: json!({"city": "Oslo"}),
            },
        ]),
    ]);
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "The weather in Paris, Rome and Oslo?"}]})];
    for (i, city) in ["Paris", "Rome", "Oslo"].into_iter().enumerate() {
        let body = weather(&format!("b{i}"), &marked_last(&messages));
        let answer = answer(fake, &body, &[]).await;
        let blocks = answer["content"].as_array().expect("content");
        assert!(
            matches!(
                blocks[0]["type"].as_str(),
                Some("thinking" | "redacted_thinking")
            ),
            "{answer}"
        );
        let id = blocks.last().expect("a tool call")["id"].clone();
        messages.push(assistant(&answer));
        messages.push(result(&id, &format!("{city}: sunny, 2{i} degrees.")));
    }
    assert_eq!(fake.refusals(), 0);
    messages
}

#[tokio::test]
async fn fake_rules_read_price_by_model_in_bill_cost_and_cost_at() {
    for (model, price) in [
        ("claude-fable-5-1", 0.025),
        ("claude-fable-5-2-20260301", 0.025),
        ("anthropic/Claude-Mythos-5-2", 0.025),
        ("claude-mythos-5-1", 0.025),
        ("claude-opus-5-5-20261015", 0.05),
        ("claude-sonnet-5-5", 0.05),
        ("claude-haiku-5-5", 0.05),
        ("claude-sonnet-4-5", 0.1),
        ("claude-opus-5", 0.1),
        ("gpt-5", 0.1),
    ] {
        assert!(close(read_price(model), price), "{model}");
        assert_eq!(binds_thinking(model), price < 0.1, "{model}");
    }

    // Over HTTP: the second call reads what the first wrote, at its model's read price.
    for (model, price) in [
        ("claude-haiku-5-5", 0.05),
        ("claude-mythos-5-1-20260101", 0.025),
        (PLAIN, 0.1),
    ] {
        let fake = FakeProvider::start().await;
        let body = json!({"model": model, "max_tokens": 64, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "A long document. ".repeat(50),
                                          "cache_control": {"type": "ephemeral"}},
        ]}]});
        answer(&fake, &body, &[]).await;
        answer(&fake, &body, &[]).await;
        let requests = fake.requests();
        let (one, two) = (
            requests[0].bill.expect("billed"),
            requests[1].bill.expect("billed"),
        );
        assert!(
            one.write_5m > 0 && two.read == one.write_5m,
            "{one:?} {two:?}"
        );
        assert_eq!((one.read_price, two.read_price), (price, price), "{model}");
        assert!(close(two.cost(), price * two.read as f64), "{model}");
        assert!(close(two.cost_at(0.1), 0.1 * two.read as f64), "{model}");
        assert!(close(one.cost(), 1.25 * one.write_5m as f64));
        assert!(close(fake.cost(), one.cost() + two.cost()));
        assert!(close(
            fake.cost_at(0.025),
            1.25 * one.write_5m as f64 + 0.025 * two.read as f64
        ));
        assert!(close(requests[1].cost_at(0.05), 0.05 * two.read as f64));
    }

    // OpenAI keeps reads at 0.1.
    let fake = FakeProvider::start().await;
    let response = http_client()
        .post(format!("{}/v1/chat/completions", fake.url()))
        .json(&json!({"model": "gpt-5", "messages": [{"role": "user", "content": "Hi."}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(fake.last_request().bill.expect("billed").read_price, 0.1);
}

#[tokio::test]
async fn fake_rules_bound_thinking_resent_unchanged_is_accepted() {
    let fake = FakeProvider::start().await;
    fake.script(Reply::thinking(
        "Paris first.",
        "a scripted signature",
        Reply::tool_use("weather", json!({"city": "Paris"})),
    ));
    let ask = user("The weather in Paris?");
    let one = weather("b0", std::slice::from_ref(&ask));
    let first = answer(&fake, &one, &[]).await;
    let thinking = &first["content"][0];
    assert_eq!(thinking["thinking"], "Paris first.");
    let signature = thinking["signature"].as_str().expect("signed");
    assert!(signature.starts_with(SIGNATURE_PREFIX), "{signature}");
    assert_eq!(
        signature,
        thinking_signature(&answered(&one, &first), 1, 0, Some("Paris first.")),
        "signed on its prefix: the request, then the answer's message"
    );

    // Sent back with another billing header, the markers moved (off the system prompt, onto
    // the tool result), every object's keys in another order, streamed.
    let id = first["content"][1]["id"].clone();
    let mut two = weather(
        "b1",
        &marked_last(&[ask, assistant(&first), result(&id, "Sunny.")]),
    );
    two["system"][1]
        .as_object_mut()
        .expect("a block")
        .remove("cache_control");
    two["stream"] = json!(true);
    let (status, second) = send_text(&fake, "/v1/messages", &two, Some(reversed(&two)), &[]).await;
    assert_eq!(status, 200, "{second}");
    // Thinking on and a reply without thinking: the fake thinks first, and signs it.
    let added = &second["content"][0];
    assert_eq!(added["type"], "thinking", "{second}");
    assert_eq!(added["thinking"], THINKING_TEXT);
    assert_eq!(
        added["signature"],
        thinking_signature(&answered(&two, &second), 3, 0, Some(THINKING_TEXT))
    );
    assert_eq!(second["content"][1]["text"], "fake answer");

    // Scripted redacted thinking gets its data made the same way; with the display omitted
    // the thinking the fake adds is empty.
    fake.script(Reply::blocks(vec![
        Block::RedactedThinking("scripted data".into()),
        Block::Text("Sunny in Paris.".into()),
    ]));
    let mut messages = two["messages"].as_array().expect("messages").clone();
    messages.push(assistant(&second));
    messages.push(user("And tomorrow?"));
    let three = weather("b2", &messages);
    let third = answer(&fake, &three, &[]).await;
    assert_eq!(
        third["content"][0],
        json!({"type": "redacted_thinking",
               "data": thinking_signature(&answered(&three, &third), 5, 0, None)})
    );
    messages.push(assistant(&third));
    messages.push(user("Thanks."));
    let mut four = weather("b3", &marked_last(&messages));
    four["thinking"]["display"] = json!("omitted");
    let fourth = answer(&fake, &four, &[]).await;
    assert_eq!(fourth["content"][0]["thinking"], "", "{fourth}");
    assert_eq!(
        fourth["content"][0]["signature"],
        thinking_signature(&answered(&four, &fourth), 7, 0, Some(""))
    );

    assert_eq!(fake.refusals(), 0);
    assert!(fake.requests().iter().all(|r| r.status == 200));
}

#[tokio::test]
async fn fake_rules_changed_prefix_is_refused_without_a_reply_or_bill() {
    let fake = FakeProvider::start().await;
    let messages = tool_loop(&fake).await;
    let cost = fake.cost();
    fake.script(Reply::text("not for a refused request"));

    // An earlier tool result changed: the thinking after it (A2, messages[3]) is bound to the
    // old one. A marker on A1's call too, to show below that the refusal wrote nothing.
    let mut changed = messages.clone();
    changed[2]["content"][0]["content"] = json!("Paris: rain.");
    changed[1]["content"][1]["cache_control"] = json!({"type": "ephemeral"});
    assert_eq!(
        refused(&fake, &weather("b9", &changed), &[]).await,
        unbound(3, 0)
    );
    let refusal = fake.last_request();
    assert_eq!(refusal.status, 400);
    assert_eq!(refusal.bill, None, "a refusal is not billed");
    assert_eq!(refusal.prompt, Value::Null);
    assert_eq!(fake.pending(), 1, "a refusal takes no reply");
    assert_eq!(fake.refusals(), 1);
    assert!(close(fake.cost(), cost));

    // Redacted data changed: refused at that block.
    let mut tampered = messages.clone();
    tampered[5]["content"][0]["data"] = json!("fakesig1.0");
    assert_eq!(
        refused(&fake, &weather("b9", &tampered), &[]).await,
        unbound(5, 0)
    );
    // An earlier thinking block left out, a later one kept: the later one's prefix changed.
    let mut omitted = messages.clone();
    omitted[1]["content"]
        .as_array_mut()
        .expect("blocks")
        .remove(0);
    assert_eq!(
        refused(&fake, &weather("b9", &omitted), &[]).await,
        unbound(3, 0)
    );
    // A signature the fake did not make.
    let forged = vec![
        user("Hi."),
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Hmm.", "signature": "EqQBCgIYAhIM"},
            {"type": "text", "text": "Hello."}]}),
        user("Again?"),
    ];
    assert_eq!(
        refused(&fake, &weather("b9", &forged), &[]).await,
        unbound(1, 0)
    );
    assert_eq!(fake.refusals(), 4);
    assert_eq!(fake.pending(), 1);

    // The refused requests (all with billing header b9) wrote nothing: marked as the first one
    // was and accepted, this one reads nothing and writes all.
    let mut remarked = marked_last(&messages);
    remarked[1]["content"][1]["cache_control"] = json!({"type": "ephemeral"});
    let body = weather("b9", &remarked);
    answer(&fake, &body, &[]).await;
    let bill = fake.last_request().bill.expect("billed");
    assert_eq!(
        (bill.read, bill.write_5m, bill.input),
        (0, prompt_tokens(&body), 0),
        "{bill:?}"
    );

    // Every thinking block left out: nothing is bound, the request is accepted.
    let bare: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(blocks) = m["content"].as_array_mut() {
                blocks.retain(|b| {
                    !matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking"))
                });
            }
            m
        })
        .collect();
    answer(&fake, &weather("b10", &bare), &[]).await;
    assert_eq!(fake.refusals(), 4);
}

#[tokio::test]
async fn fake_rules_drop_block_drops_every_later_thinking_block() {
    let fake = FakeProvider::start().await;
    let messages = tool_loop(&fake).await;
    let mut changed = unmarked(&json!(messages));
    changed[2]["content"][0]["content"] = json!("Paris: rain.");
    let changed = changed.as_array().expect("messages").clone();
    let mut body = weather("b5", &changed);
    body["system"] = json!("You are a weather agent.");
    body["thinking"]["block_binding"] = json!({"prefix_mismatch_behavior": "drop_block"});
    body["stream"] = json!(true);

    // Without the beta, or without asking to drop, the request is refused.
    assert_eq!(refused(&fake, &body, &[]).await, unbound(3, 0));
    let mut asking = body.clone();
    asking["thinking"]["block_binding"] = Value::Null;
    assert_eq!(refused(&fake, &asking, &[DROPPING]).await, unbound(3, 0));
    assert_eq!(fake.refusals(), 2);

    // With both (the beta on a second header line, after another): A2's thinking is unbound,
    // and A3's redacted thinking is dropped with it; A1's stays.
    let betas = [
        "interleaved-thinking-2025-05-14",
        "token-efficient-tools-2025-02-19, thinking-binding-controls-2026-08-01",
    ];
    let (status, message) = send(&fake, &body, &betas).await;
    assert_eq!(status, 200, "{message}");
    let dropped = json!([
        {"type": "thinking_block_dropped", "message_index": 3, "content_index": 0,
         "reason": "prefix_mismatch"},
        {"type": "thinking_block_dropped", "message_index": 5, "content_index": 0,
         "reason": "prefix_mismatch"},
    ]);
    let record = fake.last_request();
    let start = parse_sse(&record.response)
        .into_iter()
        .find(|e| e.event == "message_start")
        .expect("message_start");
    let start: Value = serde_json::from_str(&start.data).expect("JSON");
    assert_eq!(start["message"]["input_transformations"], dropped);
    assert_eq!(message["input_transformations"], dropped);
    assert_eq!(record.input_transformations, dropped);
    assert_eq!(fake.refusals(), 2, "a drop is no refusal");

    let mut seen = changed.clone();
    for n in [3, 5] {
        seen[n]["content"].as_array_mut().expect("blocks").remove(0);
    }
    assert_eq!(record.prompt, json!(seen));
    let mut priced = body.clone();
    priced["messages"] = json!(seen);
    let bill = record.bill.expect("billed");
    assert_eq!(
        bill.input,
        prompt_tokens(&priced),
        "priced without the dropped blocks"
    );
    assert!(bill.input < prompt_tokens(&body));

    // count_tokens counts the same prompt.
    let (status, count) = send_text(
        &fake,
        "/v1/messages/count_tokens",
        &json!({}),
        Some(body.to_string()),
        &betas,
    )
    .await;
    assert_eq!(status, 200, "{count}");
    assert_eq!(count["input_tokens"], prompt_tokens(&priced));
    assert_eq!(fake.last_request().prompt, json!(seen));
}

#[tokio::test]
async fn fake_rules_non_binding_models_never_refuse_changed_thinking() {
    let fake = FakeProvider::start().await;
    fake.script(Reply::thinking(
        "t",
        "a scripted signature",
        Reply::text("ok"),
    ));
    let mut body = json!({"model": PLAIN, "max_tokens": 1024,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [
        user("Hi."),
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "edited", "signature": "not the fake's"},
            {"type": "redacted_thinking", "data": "anything"},
            {"type": "text", "text": "Hello."}]},
        user("Again?"),
    ]});
    let first = answer(&fake, &body, &[]).await;
    assert_eq!(
        first["content"],
        json!([{"type": "thinking", "thinking": "t", "signature": "a scripted signature"},
               {"type": "text", "text": "ok"}]),
        "signatures as scripted"
    );
    body["thinking"]["block_binding"] = json!({"prefix_mismatch_behavior": "drop_block"});
    let second = answer(&fake, &body, &[DROPPING]).await;
    assert_eq!(
        second["content"],
        json!([{"type": "text", "text": "fake answer"}]),
        "no thinking added to a reply without it"
    );
    assert!(second.get("input_transformations").is_none());
    assert_eq!(fake.refusals(), 0);
}

// ---------------------------------------------------------------- context editing

/// A file survey: an ask, then `n` tool uses each answered (`tu_<i>`, `grep` for even `i`,
/// `read` for odd), the first result an error.
fn survey(n: usize) -> Vec<Value> {
    let mut messages = vec![user("Survey the repository.")];
    for i in 0..n {
        let name = if i % 2 == 0 { "grep" } else { "read" };
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("tu_{i}"), "name": name,
             "input": {"path": format!("src/file_{i}.rs"), "pattern": "fn main"}}]}));
        let mut result = json!({"type": "tool_result", "tool_use_id": format!("tu_{i}"),
            "content": format!("file {i}: {}", "lorem ipsum dolor ".repeat(30))});
        if i == 0 {
            result["is_error"] = json!(true);
        }
        messages.push(json!({"role": "user", "content": [result]}));
    }
    messages
}

/// `messages` with the results of the tool uses `results` cleared and the inputs of `inputs`
/// emptied, as the docs state it (tool use `i` at messages `2i+1`, its result at `2i+2`).
fn cleared(messages: &[Value], results: &[usize], inputs: &[usize]) -> Vec<Value> {
    let mut messages = messages.to_vec();
    for &i in results {
        let block = &mut messages[2 * i + 2]["content"][0];
        block["content"] = json!([{"type": "text", "text": CLEARED_TOOL_RESULT}]);
    }
    for &i in inputs {
        messages[2 * i + 1]["content"][0]["input"] = json!({});
    }
    messages
}

fn edited(messages: &[Value], edits: Value) -> Value {
    json!({"model": PLAIN, "max_tokens": 1024, "context_management": {"edits": edits},
           "messages": messages})
}

/// Sends `body` with the context-management beta; checks the answer reports what the record
/// says, that the prompt is `expected` and that it was priced (no markers: all input); gives
/// the applied edits.
async fn edit(fake: &FakeProvider, body: &Value, expected: &[Value]) -> Value {
    let answer = answer(fake, body, &[EDITING]).await;
    let record: Recorded = fake.last_request();
    assert_eq!(
        record.prompt,
        json!(expected),
        "{}",
        body["context_management"]
    );
    assert_eq!(
        answer["context_management"]["applied_edits"],
        record.applied_edits
    );
    let mut priced = body.clone();
    priced["messages"] = json!(expected);
    assert_eq!(record.bill.expect("billed").input, prompt_tokens(&priced));
    record.applied_edits
}

fn tool_entry(uses: usize, before: &Value, after: &[Value]) -> Value {
    let mut after_body = before.clone();
    after_body["messages"] = json!(after);
    json!([{"type": CLEAR_TOOL_USES, "cleared_tool_uses": uses,
            "cleared_input_tokens": prompt_tokens(before) - prompt_tokens(&after_body)}])
}

#[tokio::test]
async fn fake_rules_clear_tool_uses_keep_trigger_exclude_and_inputs() {
    let fake = FakeProvider::start().await;
    let history = survey(5);
    let by_uses = |keep: u64, over: u64| {
        json!({"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": over},
               "keep": {"type": "tool_uses", "value": keep}})
    };

    // 5 tool uses over a trigger of 3: all but the newest 2 cleared, is_error kept.
    let body = edited(&history, json!([by_uses(2, 3)]));
    let expected = cleared(&history, &[0, 1, 2], &[]);
    assert_eq!(expected[2]["content"][0]["is_error"], true);
    let entry = tool_entry(3, &body, &expected);
    assert_eq!(edit(&fake, &body, &expected).await, entry);
    let freed = entry[0]["cleared_input_tokens"].as_u64().expect("tokens");
    assert!(freed > 0);

    // Not over the trigger: nothing cleared, nothing reported.
    let body = edited(&history, json!([by_uses(2, 5)]));
    assert_eq!(edit(&fake, &body, &history).await, json!([]));

    // The input_tokens trigger: fires only over it (default keep 3).
    let tokens = prompt_tokens(&edited(&history, json!([])));
    let by_tokens = |value: u64| {
        json!({"type": CLEAR_TOOL_USES,
               "trigger": {"type": "input_tokens", "value": value}})
    };
    let body = edited(&history, json!([by_tokens(tokens)]));
    assert_eq!(edit(&fake, &body, &history).await, json!([]), "not reached");
    let body = edited(&history, json!([by_tokens(tokens - 1)]));
    let expected = cleared(&history, &[0, 1], &[]);
    assert_eq!(
        edit(&fake, &body, &expected).await,
        tool_entry(2, &body, &expected)
    );
    // The default trigger (100,000 tokens) is far away.
    let body = edited(&history, json!([{"type": CLEAR_TOOL_USES}]));
    assert_eq!(edit(&fake, &body, &history).await, json!([]));

    // clear_at_least: fewer tokens would be cleared than asked, so none are.
    let mut at_least = by_uses(2, 3);
    at_least["clear_at_least"] = json!({"type": "input_tokens", "value": freed + 1});
    let body = edited(&history, json!([at_least]));
    assert_eq!(edit(&fake, &body, &history).await, json!([]));
    let mut at_least = by_uses(2, 3);
    at_least["clear_at_least"] = json!({"type": "input_tokens", "value": freed});
    let body = edited(&history, json!([at_least]));
    let expected = cleared(&history, &[0, 1, 2], &[]);
    assert_eq!(edit(&fake, &body, &expected).await, entry);

    // exclude_tools: `read` (tu_1) is never cleared; the newest 2 still count it out.
    let mut excluding = by_uses(2, 3);
    excluding["exclude_tools"] = json!(["read"]);
    let body = edited(&history, json!([excluding]));
    let expected = cleared(&history, &[0, 2], &[]);
    assert_eq!(
        edit(&fake, &body, &expected).await,
        tool_entry(2, &body, &expected)
    );

    // clear_tool_inputs: every cleared call's input, or only the named tools'.
    let mut inputs = by_uses(2, 3);
    inputs["clear_tool_inputs"] = json!(true);
    let body = edited(&history, json!([inputs]));
    let expected = cleared(&history, &[0, 1, 2], &[0, 1, 2]);
    assert_eq!(
        edit(&fake, &body, &expected).await,
        tool_entry(3, &body, &expected)
    );
    let mut inputs = by_uses(2, 3);
    inputs["clear_tool_inputs"] = json!(["grep"]);
    let body = edited(&history, json!([inputs]));
    let expected = cleared(&history, &[0, 1, 2], &[0, 2]);
    assert_eq!(
        edit(&fake, &body, &expected).await,
        tool_entry(3, &body, &expected)
    );

    // Stateless: a result sent as the placeholder is cleared again (and frees nothing).
    let sent = cleared(&history, &[0], &[]);
    let body = edited(&sent, json!([by_uses(2, 3)]));
    let expected = cleared(&history, &[0, 1, 2], &[]);
    assert_eq!(
        edit(&fake, &body, &expected).await,
        tool_entry(3, &body, &expected)
    );

    // Streamed: the report is in message_delta.
    let mut body = edited(&history, json!([by_uses(2, 3)]));
    body["stream"] = json!(true);
    let message = answer(&fake, &body, &[EDITING]).await;
    assert_eq!(message["context_management"]["applied_edits"], entry);
    let delta = parse_sse(&fake.last_request().response)
        .into_iter()
        .find(|e| e.event == "message_delta")
        .expect("message_delta");
    let delta: Value = serde_json::from_str(&delta.data).expect("JSON");
    assert_eq!(delta["context_management"]["applied_edits"], entry);
    assert_eq!(fake.refusals(), 0);
}

#[tokio::test]
async fn fake_rules_cleared_tool_uses_are_cached_as_edited() {
    let fake = FakeProvider::start().await;
    let marker = json!({"type": "ephemeral"});
    // Markers on tu_1's result (cleared), on tu_3's call and on the last result.
    let mark = |messages: &mut Vec<Value>| {
        let last = messages.len() - 1;
        for n in [4, 7, last] {
            messages[n]["content"][0]["cache_control"] = marker.clone();
        }
    };
    let edits = json!([{"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 3},
                        "keep": {"type": "tool_uses", "value": 2}}]);
    let mut five = survey(5);
    mark(&mut five);
    let body = edited(&five, edits.clone());
    let expected = cleared(&five, &[0, 1, 2], &[]);
    assert_eq!(
        expected[4]["content"][0]["cache_control"], marker,
        "a marker stays on the block it was on"
    );
    let mut priced = body.clone();
    priced["messages"] = json!(expected);
    let total = prompt_tokens(&priced);

    answer(&fake, &body, &[EDITING]).await;
    let bill = fake.last_request().bill.expect("billed");
    assert_eq!((bill.write_5m, bill.read, bill.input), (total, 0, 0));
    // The same cleared set: read whole.
    answer(&fake, &body, &[EDITING]).await;
    assert_eq!(fake.last_request().prompt, json!(expected));
    let bill = fake.last_request().bill.expect("billed");
    assert_eq!((bill.write_5m, bill.read, bill.input), (0, total, 0));

    // One more tool use: tu_3 is cleared too. Read up to its call, written from its result.
    let mut six = survey(6);
    mark(&mut six);
    let body = edited(&six, edits);
    let expected = cleared(&six, &[0, 1, 2, 3], &[]);
    answer(&fake, &body, &[EDITING]).await;
    assert_eq!(fake.last_request().prompt, json!(expected));
    let mut priced = body.clone();
    priced["messages"] = json!(expected);
    let mut upto_call = priced.clone();
    upto_call["messages"] = json!(expected[..8]);
    let bill = fake.last_request().bill.expect("billed");
    assert_eq!(bill.read, prompt_tokens(&upto_call));
    assert_eq!(bill.write_5m, prompt_tokens(&priced) - bill.read);
    assert_eq!(bill.input, 0);
}

#[tokio::test]
async fn fake_rules_context_management_needs_its_beta_and_known_edits() {
    let fake = FakeProvider::start().await;
    fake.script(Reply::text("kept for later"));
    let history = survey(2);
    let body = edited(&history, json!([{"type": CLEAR_TOOL_USES}]));
    assert_eq!(
        refused(&fake, &body, &[]).await,
        "context_management: requires the anthropic-beta header context-management-2025-06-27"
    );
    assert_eq!(
        refused(&fake, &body, &["interleaved-thinking-2025-05-14"]).await,
        "context_management: requires the anthropic-beta header context-management-2025-06-27"
    );
    let record = fake.last_request();
    assert_eq!((record.status, record.bill), (400, None));
    assert_eq!(record.applied_edits, Value::Null);

    let unknown = edited(
        &history,
        json!([{"type": CLEAR_TOOL_USES}, {"type": "clear_everything"}]),
    );
    let message = refused(&fake, &unknown, &[EDITING]).await;
    assert!(
        message.starts_with("context_management.edits.1: "),
        "{message}"
    );
    let late = edited(
        &history,
        json!([{"type": CLEAR_TOOL_USES}, {"type": CLEAR_THINKING}]),
    );
    let message = refused(&fake, &late, &[EDITING]).await;
    assert!(
        message.starts_with("context_management.edits.1: "),
        "{message}"
    );

    assert_eq!(fake.pending(), 1, "no reply taken");
    assert_eq!(fake.cost(), 0.0);
    assert_eq!(fake.refusals(), 0, "not binding refusals");
    // With the beta (several, comma-separated) it is answered: the reply kept is taken now.
    let answer = answer(
        &fake,
        &body,
        &["interleaved-thinking-2025-05-14, context-management-2025-06-27"],
    )
    .await;
    assert_eq!(answer["content"][0]["text"], "kept for later");
    assert_eq!(answer["context_management"], json!({"applied_edits": []}));
}

/// Three assistant turns with thinking (the second calling a tool, its result continuing the
/// turn), then a question.
fn thoughtful() -> Vec<Value> {
    let think = |text: &str| {
        json!({"type": "thinking", "thinking": text,
               "signature": format!("sig-{text}")})
    };
    vec![
        user("Q1"),
        json!({"role": "assistant", "content": [think("t1"), {"type": "text", "text": "A1"}]}),
        user("Q2"),
        json!({"role": "assistant", "content": [think("t2"),
            {"type": "tool_use", "id": "tu_1", "name": "read", "input": {"path": "a"}}]}),
        result(&json!("tu_1"), &"contents of a, at length. ".repeat(10)),
        json!({"role": "assistant", "content": [think("t3"), {"type": "text", "text": "A2"}]}),
        user("Q3"),
        json!({"role": "assistant", "content": [think("t4"), {"type": "text", "text": "A3"}]}),
        user("Q4"),
    ]
}

/// `messages` without the thinking blocks of `indices`.
fn unthought(messages: &[Value], indices: &[usize]) -> Vec<Value> {
    let mut messages = messages.to_vec();
    for &n in indices {
        messages[n]["content"]
            .as_array_mut()
            .expect("blocks")
            .retain(|b| b["type"] != "thinking");
    }
    messages
}

#[tokio::test]
async fn fake_rules_clear_thinking_keep_all_and_the_default() {
    let fake = FakeProvider::start().await;
    let history = thoughtful();
    let thinking = |mut body: Value| {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
        body
    };
    let plain = json!({"model": PLAIN, "max_tokens": 1024, "messages": history});

    // Thinking off: nothing is cleared.
    answer(&fake, &plain, &[]).await;
    assert_eq!(fake.last_request().prompt, json!(history));
    // Thinking on, no edit: the API's default keeps the last turn's thinking only; nothing is
    // reported.
    let body = thinking(plain.clone());
    let answer_json = answer(&fake, &body, &[]).await;
    let record = fake.last_request();
    assert_eq!(record.prompt, json!(unthought(&history, &[1, 3, 5])));
    assert_eq!(record.applied_edits, Value::Null);
    assert!(answer_json.get("context_management").is_none());
    let mut priced = body.clone();
    priced["messages"] = record.prompt.clone();
    assert_eq!(record.bill.expect("billed").input, prompt_tokens(&priced));

    // keep "all": nothing cleared, nothing reported.
    let body = thinking(edited(
        &history,
        json!([{"type": CLEAR_THINKING, "keep": "all"}]),
    ));
    assert_eq!(edit(&fake, &body, &history).await, json!([]));

    // Two turns kept: the first turn's thinking goes.
    let body = thinking(edited(
        &history,
        json!([
        {"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 2}}]),
    ));
    let expected = unthought(&history, &[1]);
    let mut after = body.clone();
    after["messages"] = json!(expected);
    assert_eq!(
        edit(&fake, &body, &expected).await,
        json!([{"type": CLEAR_THINKING, "cleared_thinking_turns": 1,
                "cleared_input_tokens": prompt_tokens(&body) - prompt_tokens(&after)}])
    );

    // The edit with its default (1 turn), then clear_tool_uses on what is left; streamed.
    let mut body = thinking(edited(
        &history,
        json!([
        {"type": CLEAR_THINKING},
        {"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 0},
         "keep": {"type": "tool_uses", "value": 0}}]),
    ));
    body["stream"] = json!(true);
    let thought = unthought(&history, &[1, 3, 5]);
    let mut expected = thought.clone();
    expected[4]["content"][0]["content"] = json!([{"type": "text", "text": CLEARED_TOOL_RESULT}]);
    let mut between = body.clone();
    between["messages"] = json!(thought);
    let mut after = body.clone();
    after["messages"] = json!(expected);
    let message = answer(&fake, &body, &[EDITING]).await;
    assert_eq!(fake.last_request().prompt, json!(expected));
    assert_eq!(
        message["context_management"]["applied_edits"],
        json!([
            {"type": CLEAR_THINKING, "cleared_thinking_turns": 2,
             "cleared_input_tokens": prompt_tokens(&body) - prompt_tokens(&between)},
            {"type": CLEAR_TOOL_USES, "cleared_tool_uses": 1,
             "cleared_input_tokens": prompt_tokens(&between) - prompt_tokens(&after)},
        ])
    );
}
