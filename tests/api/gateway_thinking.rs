//! Reasoning on a model that binds every thinking block to what precedes it (Claude Opus 5.5):
//! the fake provider (`tests/common/fake_provider.rs`) signs each block by its prefix and
//! refuses a request in which that prefix changed. Through the gateway no request is refused:
//! a step is the provider's own `clear_tool_uses_20250919` edit on the client's messages as
//! sent, or, with `--gateway-reasoning drop`, ctxd's rewrite with exactly the invalidated
//! thinking left out; a client that resends its history without thinking continues its branch;
//! and a host rendering its own requests with `Render` for the model gets documents the
//! provider accepts after a step.

use ctxd::api::pb;
use ctxd::gateway::GatewayPolicy;
use ctxd::server::Options;
use ctxd::workflow::render::Reasoning;
use serde_json::{Value, json};

use crate::fake_provider::{FakeProvider, Reply};
use crate::gateway::{Gw, http_client, start_configured};
use crate::gateway_claude_code::count_blocks;
use crate::helpers::{TestApp, message, spawn_app_with, text, tool_result};

const MODEL: &str = "claude-opus-5-5";
const SYSTEM: &str = "You are a coding agent.";
const CONTEXT_MANAGEMENT_BETA: &str = "context-management-2025-06-27";
/// What Claude Code sends beside it.
const CLIENT_BETA: &str = "interleaved-thinking-2025-05-14";

/// A file's text of about `chars` characters, different for each `k`.
fn file(k: usize, chars: usize) -> String {
    let mut text = String::with_capacity(chars + 64);
    let mut line = 0;
    while text.len() < chars {
        line += 1;
        text.push_str(&format!(
            "{k:04} line {line:05}: fn item_{line}() -> u32 {{ {line} }}\n"
        ));
    }
    text
}

fn tools() -> Value {
    json!([{"name": "Read", "description": "Read a file",
            "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}])
}

/// A request as Claude Code sends it on Opus 5.5: adaptive thinking, its own context editing
/// (every thinking block kept), a breakpoint on the newest block.
fn request(messages: &[Value]) -> Value {
    let mut messages = messages.to_vec();
    if let Some(Value::Array(blocks)) = messages.last_mut().map(|m| &mut m["content"])
        && let Some(Value::Object(last)) = blocks.last_mut()
    {
        last.insert("cache_control".into(), json!({"type": "ephemeral"}));
    }
    json!({
        "model": MODEL,
        "max_tokens": 32000,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "tools": tools(),
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "messages": messages,
    })
}

/// Scripts `fake` for a loop of `calls` model calls: a `Read` of `src/f{k}.rs` as call `k`,
/// then the answer.
fn script_reads(fake: &FakeProvider, calls: usize) {
    for k in 1..calls {
        fake.script(Reply::tool_use_id(
            format!("toolu_{k:02}"),
            "Read",
            json!({"file_path": format!("src/f{k}.rs")}),
        ));
    }
    fake.script(Reply::text("All read."));
}

/// A tool loop of `calls` model calls with thinking on, through `base` (a gateway, or the fake
/// itself): the fake answers each with its thinking and a `Read`, the loop appends the answer as
/// it came and the file's text as the result, and resends the whole history. The last call
/// answers. The messages at the end.
async fn tool_loop(fake: &FakeProvider, base: &str, calls: usize, chars: usize) -> Vec<Value> {
    script_reads(fake, calls);
    let http = http_client();
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Read every file the tool names."}
    ]})];
    for k in 1..=calls {
        let answer = http
            .post(format!("{base}/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .header("x-api-key", "sk-test")
            .header(
                "anthropic-beta",
                format!("{CLIENT_BETA},{CONTEXT_MANAGEMENT_BETA}"),
            )
            .json(&request(&messages))
            .send()
            .await
            .expect("an answer");
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.expect("a JSON answer");
        assert_eq!(status, 200, "call {k} answered: {body}");
        messages.push(json!({"role": "assistant", "content": body["content"]}));
        if k < calls {
            messages.push(json!({"role": "user", "content": [{
                "type": "tool_result", "tool_use_id": format!("toolu_{k:02}"),
                "content": file(k, chars),
            }]}));
        }
    }
    messages
}

/// A gateway in front of a fresh fake, its reasoning policy `reasoning`.
async fn gateway(reasoning: Reasoning) -> Gw {
    start_configured(FakeProvider::start().await, None, Options::default(), |g| {
        g.policy = GatewayPolicy::Stepped;
        g.reasoning = reasoning;
    })
    .await
}

/// The session's ledger.
async fn ledger(app: &mut TestApp) -> Vec<pb::GatewayCall> {
    let session = crate::agents::only_session(app, "one session").await;
    app.client
        .list_gateway_calls(pb::ListGatewayCallsRequest {
            session_id: session,
            page_size: 1000,
            page_token: String::new(),
        })
        .await
        .expect("the ledger")
        .into_inner()
        .calls
}

const CALLS: usize = 30;
const CHARS: usize = 12_000;

#[tokio::test]
async fn a_binding_models_step_is_the_providers_edit_and_no_thinking_is_refused() {
    let mut gw = gateway(Reasoning::Keep).await;
    tool_loop(&gw.fake, &gw.url, CALLS, CHARS).await;
    let straight = FakeProvider::start().await;
    tool_loop(&straight, &straight.url(), CALLS, CHARS).await;
    assert_eq!(gw.fake.refusals(), 0, "no thinking block refused");

    let upstream = gw.upstream("/v1/messages");
    assert_eq!(upstream.len(), CALLS);
    let mut asked = 0;
    for (n, call) in upstream.iter().enumerate() {
        assert!(
            call.input_transformations.is_null(),
            "call {n}: the provider dropped nothing"
        );
        // The client's messages, as sent: its breakpoint on the newest block included.
        let client = request(&[]);
        assert_eq!(call.body["system"], client["system"]);
        let edits = call.body["context_management"]["edits"].as_array().cloned();
        let edits = edits.unwrap_or_default();
        assert_eq!(
            edits[0],
            json!({"type": "clear_thinking_20251015", "keep": "all"}),
            "call {n}: the client's own edit stays first"
        );
        if let Some(edit) = edits.get(1) {
            asked += 1;
            assert_eq!(edit["type"], "clear_tool_uses_20250919");
            let cleared = &call.applied_edits[0];
            assert_eq!(
                cleared["cleared_tool_uses"], edit["trigger"]["value"],
                "call {n}: the provider cleared what ctxd asked: {}",
                call.applied_edits
            );
            let betas: Vec<&str> = call
                .headers
                .get_all("anthropic-beta")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            assert_eq!(
                betas,
                [format!("{CLIENT_BETA},{CONTEXT_MANAGEMENT_BETA}").as_str()],
                "the client's betas, which have context editing already"
            );
        }
    }
    assert!(asked > 0, "a step was asked of the provider");
    assert!(
        count_blocks(&upstream[CALLS - 1].body["messages"], "thinking") >= CALLS - 2,
        "every thinking block went upstream"
    );
    let (gw_cost, direct) = (gw.fake.cost(), straight.cost());
    assert!(
        gw_cost < direct,
        "at the model's prices the loop costs less through the gateway: {gw_cost:.0} against \
         {direct:.0}"
    );

    let calls = ledger(&mut gw.app).await;
    assert!(calls.iter().all(|c| c.priced_by == MODEL));
    let edited: Vec<_> = calls.iter().filter(|c| c.edit_clear.is_some()).collect();
    assert_eq!(edited.len(), asked, "the ledger says each call's edit");
    for c in edited {
        assert_eq!(c.provider_cleared, c.edit_clear, "{c:?}");
        assert!(c.provider_cleared_tokens.unwrap_or(0) > 0, "{c:?}");
    }
}

#[tokio::test]
async fn ctxd_adds_the_beta_its_edit_needs_beside_the_clients() {
    let gw = gateway(Reasoning::Keep).await;
    // A client that asks for no context editing of its own: the beta comes from ctxd.
    script_reads(&gw.fake, CALLS);
    let mut messages = vec![json!({"role": "user", "content": [{"type": "text", "text": "Go."}]})];
    for k in 1..CALLS {
        let mut body = request(&messages);
        body.as_object_mut().map(|b| b.remove("context_management"));
        let answer = gw
            .messages_with(&body, &[("anthropic-beta", CLIENT_BETA)])
            .await
            .ok();
        messages.push(json!({"role": "assistant", "content": answer.json()["content"]}));
        messages.push(json!({"role": "user", "content": [{
            "type": "tool_result", "tool_use_id": format!("toolu_{k:02}"), "content": file(k, CHARS),
        }]}));
    }
    let edited: Vec<_> = gw
        .upstream("/v1/messages")
        .into_iter()
        .filter(|c| !c.body["context_management"].is_null())
        .collect();
    assert!(!edited.is_empty(), "a step was asked of the provider");
    for call in edited {
        let betas: Vec<&str> = call
            .headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        assert_eq!(betas, [CLIENT_BETA, CONTEXT_MANAGEMENT_BETA]);
        assert_eq!(
            call.body["context_management"]["edits"][0]["type"],
            "clear_tool_uses_20250919"
        );
    }
    assert_eq!(gw.fake.refusals(), 0);
}

#[tokio::test]
async fn the_reasoning_dropping_policy_leaves_out_exactly_what_a_step_invalidated() {
    let mut gw = gateway(Reasoning::Drop).await;
    tool_loop(&gw.fake, &gw.url, CALLS, CHARS).await;
    assert_eq!(
        gw.fake.refusals(),
        0,
        "no request the provider would refuse"
    );
    let upstream = gw.upstream("/v1/messages");
    assert!(
        upstream.iter().all(|c| c.input_transformations.is_null()),
        "ctxd left out the invalid thinking itself"
    );
    // After a step the forwarded messages are ctxd's; the thinking before the change stays,
    // and each answer's thinking goes back the call after it was produced.
    let calls = ledger(&mut gw.app).await;
    let dropped: u32 = calls.iter().map(|c| c.thinking_dropped).sum();
    assert!(dropped > 0, "a step invalidated thinking: {calls:#?}");
    let last = &upstream[CALLS - 1].body["messages"];
    let sent = count_blocks(last, "thinking");
    assert!(
        sent > 0 && sent < CALLS - 1,
        "some thinking kept, some left out: {sent}"
    );
    assert!(
        calls.iter().all(|c| c.edit_clear.is_none()),
        "no edit asked"
    );
}

#[tokio::test]
async fn a_client_that_leaves_its_thinking_out_continues_its_branch() {
    let mut gw = gateway(Reasoning::Keep).await;
    let mut messages = tool_loop(&gw.fake, &gw.url, 5, 2_000).await;
    assert!(count_blocks(&Value::Array(messages.clone()), "thinking") >= 4);
    // Claude Code's recovery after a refusal: the whole history again, every thinking block
    // removed, and the next message.
    for m in &mut messages {
        if let Some(blocks) = m["content"].as_array_mut() {
            blocks.retain(|b| b["type"] != "thinking");
        }
    }
    messages.push(json!({"role": "user", "content": [{"type": "text", "text": "Thanks."}]}));
    gw.fake.script(Reply::text("You are welcome."));
    let beta = format!("{CLIENT_BETA},{CONTEXT_MANAGEMENT_BETA}");
    let answer = gw
        .messages_with(&request(&messages), &[("anthropic-beta", &beta)])
        .await
        .ok();
    assert_eq!(answer.branch(), "main", "the same branch");
    let session = crate::agents::only_session(&mut gw.app, "one session").await;
    let branches: Vec<String> = gw
        .app
        .branches(&session)
        .await
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(branches, ["main"], "no fork");
    let log = gw.app.log(&session, "main").await;
    let kept = log
        .iter()
        .filter_map(|n| match n.content.as_ref().and_then(|c| c.kind.as_ref()) {
            Some(pb::node_input::Kind::Message(m)) => Some(m),
            _ => None,
        })
        .flat_map(|m| &m.parts)
        .filter(|p| {
            matches!(&p.part, Some(pb::content_part::Part::Media(m))
                if m.mime_type == "application/vnd.ctxd.anthropic-reasoning+json")
        })
        .count();
    assert!(kept >= 4, "the branch keeps the thinking it stored: {kept}");
    assert_eq!(gw.fake.refusals(), 0);
}

// ---------------------------------------------------------------- a host rendering its own

const HOST_CALLS: usize = 50;

/// A host's tool loop over gRPC: each call `Render`s the session for the model as an Anthropic
/// document, sends it with the host's system prompt and tools (and the betas the render names)
/// to the fake, and appends the answer (its thinking as a kept block) and the tool's result.
/// The renders.
async fn host_loop(reasoning: pb::Reasoning) -> (FakeProvider, Vec<pb::RenderResponse>) {
    let fake = FakeProvider::start().await;
    let mut app = spawn_app_with(Options::default()).await;
    let session = app.create_session().await;
    app.append(
        &session,
        vec![message(
            pb::Role::User,
            vec![text("Read every file.")],
            vec![],
        )],
    )
    .await;
    let http = http_client();
    let mut renders = Vec::new();
    script_reads(&fake, HOST_CALLS);
    for k in 1..=HOST_CALLS {
        let rendered = app
            .render(pb::RenderRequest {
                session_id: session.clone(),
                format: pb::Format::AnthropicMessages as i32,
                model: MODEL.into(),
                budget: Some(pb::Budget {
                    context_window: 200_000,
                    output_reserve: 32_000,
                    ..Default::default()
                }),
                policy: Some(pb::RenderPolicy {
                    reasoning: reasoning as i32,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await;
        let document: Value = serde_json::from_str(&rendered.messages_json).expect("a document");
        let mut body = json!({
            "model": MODEL, "max_tokens": 32000, "system": SYSTEM, "tools": tools(),
            "thinking": {"type": "adaptive", "display": "omitted"},
            "messages": document["messages"],
        });
        if !document["context_management"].is_null() {
            body["context_management"] = document["context_management"].clone();
        }
        let mut post = http
            .post(format!("{}/v1/messages", fake.url()))
            .header("anthropic-version", "2023-06-01");
        for beta in &rendered.betas {
            post = post.header("anthropic-beta", beta);
        }
        let answer = post.json(&body).send().await.expect("an answer");
        let status = answer.status().as_u16();
        let answer: Value = answer.json().await.expect("JSON");
        assert_eq!(
            status, 200,
            "call {k}: the provider accepts the render: {answer}"
        );
        let blocks = answer["content"].as_array().cloned().unwrap_or_default();
        let parts = blocks
            .iter()
            .filter(|b| b["type"] == "thinking" || b["type"] == "text")
            .map(|b| match b["type"].as_str() {
                Some("thinking") => crate::helpers::media_data(
                    "application/vnd.ctxd.anthropic-reasoning+json",
                    b.to_string().into_bytes(),
                ),
                _ => text(b["text"].as_str().unwrap_or_default()),
            })
            .collect();
        let calls = blocks
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| {
                crate::helpers::call(
                    b["id"].as_str().unwrap_or_default(),
                    "Read",
                    &b["input"].to_string(),
                )
            })
            .collect();
        let mut nodes = vec![message(pb::Role::Assistant, parts, calls)];
        if k < HOST_CALLS {
            nodes.push(tool_result(&format!("toolu_{k:02}"), &file(k, CHARS)));
        }
        app.append(&session, nodes).await;
        renders.push(rendered);
    }
    (fake, renders)
}

#[tokio::test]
async fn a_render_for_a_binding_model_is_accepted_after_a_step() {
    let (fake, renders) = host_loop(pb::Reasoning::Keep).await;
    let reports = reports(&renders);
    assert_eq!(fake.refusals(), 0);
    assert!(
        reports.iter().any(|r| r.edit_clear > 0),
        "a step came, as the provider's edit"
    );
    assert!(
        reports
            .iter()
            .all(|r| r.priced_by == MODEL && r.thinking_dropped == 0)
    );
    let applied = fake
        .requests()
        .iter()
        .filter(|r| !r.applied_edits.is_null())
        .count();
    assert!(applied > 0, "the provider applied the render's edit");
}

#[tokio::test]
async fn a_render_that_drops_reasoning_is_accepted_after_a_step() {
    let (fake, renders) = host_loop(pb::Reasoning::Drop).await;
    let reports = reports(&renders);
    assert_eq!(fake.refusals(), 0);
    assert!(
        reports.iter().any(|r| r.thinking_dropped > 0),
        "a step left thinking out"
    );
    assert!(reports.iter().all(|r| r.edit_clear == 0));
    // What the render counts is what it sends: a message whose thinking a step left out counts
    // less than it did with it.
    let holds = |m: &pb::RenderedMessage| {
        m.parts.iter().any(|p| {
            matches!(&p.part, Some(pb::content_part::Part::Media(media))
                if media.mime_type.ends_with("reasoning+json"))
        })
    };
    let first = reports
        .iter()
        .position(|r| r.thinking_dropped > 0)
        .expect("a step");
    let before = &renders[first - 1].messages;
    let mut recounted = 0;
    for m in renders[first].messages.iter().filter(|m| !holds(m)) {
        if let Some(had) = before.iter().find(|b| b.node_ids == m.node_ids && holds(b)) {
            assert!(
                m.tokens < had.tokens,
                "{:?} counts its thinking",
                m.node_ids
            );
            recounted += 1;
        }
    }
    assert!(recounted > 0, "the step left thinking out of kept messages");
    for r in &renders {
        let sum: u32 = r.messages.iter().map(|m| m.tokens).sum();
        assert_eq!(sum, r.total_tokens);
    }
}

fn reports(renders: &[pb::RenderResponse]) -> Vec<pb::ContextReport> {
    renders
        .iter()
        .map(|r| r.report.clone().expect("a report"))
        .collect()
}

// ---------------------------------------------------------------- the Anthropic SDK

/// A tool loop of `SDK_CALLS` calls with thinking on, written as an application on the pinned
/// `anthropic` SDK writes one (no retry logic of its own: a 400 ends it): each answer's content
/// appended as the SDK gives it back, thinking and signature included.
const SDK_LOOP: &str = r#"
import json, os, sys
import anthropic

calls, chars = int(os.environ["CALLS"]), int(os.environ["CHARS"])
client = anthropic.Anthropic(base_url=os.environ["BASE_URL"], api_key="sk-test", max_retries=0,
                             timeout=60)
tools = [{"name": "Read", "description": "Read a file",
          "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}]
messages = [{"role": "user", "content": "Read every file the tool names."}]
made = 0
for k in range(1, calls + 1):
    try:
        answer = client.messages.create(
            model="claude-opus-5-5", max_tokens=32000, system="You are a coding agent.",
            tools=tools, messages=messages,
            extra_body={"thinking": {"type": "adaptive", "display": "omitted"}})
    except anthropic.APIStatusError as e:
        print(json.dumps({"made": made, "error": e.status_code, "message": str(e)}))
        sys.exit(0)
    made += 1
    messages.append({"role": "assistant", "content": answer.content})
    uses = [b for b in answer.content if b.type == "tool_use"]
    if not uses:
        break
    text = "".join(f"{k:04} line {n:05}: fn item_{n}() -> u32 {{ {n} }}\n" for n in range(chars // 40))
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": text}]})
thinking = sum(1 for m in messages if m["role"] == "assistant"
               for b in m["content"] if getattr(b, "type", None) == "thinking")
print(json.dumps({"made": made, "error": None, "thinking": thinking}))
"#;

const SDK_CALLS: usize = 60;

/// Runs [`SDK_LOOP`] against `base`; what it printed.
async fn sdk_loop(python: &std::path::Path, base: &str) -> Value {
    let mut command = std::process::Command::new(python);
    command
        .args(["-c", SDK_LOOP])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("BASE_URL", base)
        .env("CALLS", SDK_CALLS.to_string())
        .env("CHARS", "8000");
    let ran = crate::agents::run_bounded("python (sdk loop)", command).await;
    assert!(
        ran.status.success(),
        "the SDK loop ran: {}\n{}",
        ran.stdout,
        ran.stderr
    );
    serde_json::from_str(ran.stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the loop prints JSON last ({e}): {}", ran.stdout))
}

#[tokio::test]
async fn an_sdk_tool_loop_with_thinking_gets_no_refusal() {
    let Some(python) = crate::gateway_clients::python().await else {
        return;
    };
    let mut gw = gateway(Reasoning::Keep).await;
    script_reads(&gw.fake, SDK_CALLS);
    let straight = FakeProvider::start().await;
    script_reads(&straight, SDK_CALLS);
    let straight_url = straight.url();
    let (through, direct) =
        tokio::join!(sdk_loop(&python, &gw.url), sdk_loop(&python, &straight_url));
    assert_eq!(
        through,
        json!({"made": SDK_CALLS, "error": null, "thinking": SDK_CALLS}),
        "every call answered through the gateway, no 400"
    );
    assert_eq!(direct, through, "the same loop straight");
    assert_eq!(gw.fake.refusals(), 0);
    let calls = ledger(&mut gw.app).await;
    assert!(
        calls.iter().any(|c| c.edit_clear.is_some()),
        "the loop stepped, as the provider's edit"
    );
    eprintln!(
        "sdk loop with thinking, through the gateway / straight: {:.3}x at 0.05x reads, {:.3}x \
         at 0.1x",
        gw.fake.cost() / straight.cost(),
        gw.fake.cost_at(0.1) / straight.cost_at(0.1)
    );
    assert!(gw.fake.cost() < straight.cost());
}
