//! The model gateway in front of real, unmodified clients: the official Python SDKs (`anthropic`,
//! `openai`) and the Claude Code CLI, run as child processes against an in-process server whose
//! gateway forwards to the scripted fake provider (`tests/common/fake_provider.rs`). Each test
//! checks three things: the client gets the scripted answer, the ctxd session holds the
//! conversation (tool call and result included), and what went upstream carries it.
//!
//! The clients are found at `target/py/bin/python` (a venv with `anthropic` and `openai`) and
//! `target/agents/node_modules/.bin/claude`, which `.ci/run` installs; `CTXD_TEST_PYTHON` and
//! `CTXD_TEST_CLAUDE` name others. A missing client skips its test with a message, unless
//! `CTXD_GATEWAY_CLIENTS=required` (CI sets it): then the test fails naming what is missing.
//! Every child process is killed, with its process group, at [`CHILD_LIMIT`].

use std::path::{Path, PathBuf};
use std::process::Command;

use ctxd::api::pb;
use serde_json::{Value, json};

use crate::agents::{
    REQUIRED, assert_ctxd_headers_stripped, gateway_app, model_calls, paths, run_bounded,
};
use crate::fake_provider::{FakeProvider, Reply};
use crate::helpers::{TestApp, text_of};

const SYSTEM: &str = "You are a weather assistant. Use the tool.";
const QUESTION: &str = "What is the weather in Paris?";
const TOOL_ID: &str = "toolu_ctxd_weather_1";
const TOOL_OUTPUT: &str = "22 degrees and sunny";
const ANSWER: &str = "It is 22 degrees and sunny in Paris.";

// ---------------------------------------------------------------- the Anthropic SDK

#[tokio::test]
async fn anthropic_sdk_create_records_a_tool_loop() {
    anthropic_sdk("anthropic-create").await;
}

#[tokio::test]
async fn anthropic_sdk_stream_records_a_tool_loop() {
    anthropic_sdk("anthropic-stream").await;
}

/// A two-call tool loop with `anthropic.Anthropic(base_url=gateway)`: `messages.create` (`mode`
/// `anthropic-create`) or `messages.stream` (`anthropic-stream`).
async fn anthropic_sdk(mode: &str) {
    let Some(python) = python().await else { return };
    let fake = FakeProvider::start().await;
    fake.script_all([
        Reply::tool_use_id(TOOL_ID, "get_weather", json!({"city": "Paris"})),
        Reply::text(ANSWER),
    ]);
    let (mut app, gateway) = gateway_app(&fake).await;

    let out = run_sdk(&python, mode, &gateway).await;
    assert_eq!(out["answer"], ANSWER, "the SDK's answer; it printed {out}");
    assert_eq!(
        out["stop_reasons"],
        json!(["tool_use", "end_turn"]),
        "{out}"
    );
    assert_eq!(
        out["tool"],
        json!({"id": TOOL_ID, "name": "get_weather", "input": {"city": "Paris"}}),
        "the tool call the SDK saw"
    );
    if mode == "anthropic-stream" {
        assert_eq!(
            out["streamed_text"], ANSWER,
            "the text deltas of the stream"
        );
    }

    // Upstream: two calls, streamed as the SDK asked, the SDK's credentials forwarded, and the
    // second carrying the tool call and its result, paired.
    let calls = model_calls(&fake, "/v1/messages");
    assert_eq!(calls.len(), 2, "model calls upstream: {}", paths(&fake));
    let streamed = mode == "anthropic-stream";
    for call in &calls {
        // anthropic 2.x sends the key as `authorization: Bearer`, older ones as `x-api-key`.
        let key = (call.header("authorization"), call.header("x-api-key"));
        assert!(
            matches!(key, (Some("Bearer sk-test"), _) | (_, Some("sk-test"))),
            "the SDK's key forwarded (authorization, x-api-key): {key:?}"
        );
        assert!(
            call.header("anthropic-version").is_some(),
            "anthropic-version forwarded"
        );
        assert_eq!(call.body["stream"].as_bool().unwrap_or(false), streamed);
        assert_eq!(call.body["system"], SYSTEM, "the system prompt forwarded");
        assert_ctxd_headers_stripped(call);
    }
    let second = calls[1].messages();
    let (tool_use, tool_result) = anthropic_pair(&second, TOOL_ID).unwrap_or_else(|| {
        panic!("the second upstream request pairs {TOOL_ID} with its result: {second:#?}")
    });
    assert_eq!(tool_use["name"], "get_weather");
    assert_eq!(tool_use["input"], json!({"city": "Paris"}));
    assert_eq!(result_text(&tool_result["content"]), TOOL_OUTPUT);
    assert!(
        second
            .iter()
            .any(|m| m["role"] == "user" && message_text(m) == QUESTION),
        "the question went upstream again: {second:#?}"
    );

    // ctxd: one session, named in both answers, holding the conversation in order.
    let session = crate::agents::only_session(&mut app, "one conversation").await;
    assert_eq!(
        out["sessions"],
        json!([session, session]),
        "x-ctxd-session-id"
    );
    let branch = answered_branch(&out);
    let conversation = conversation(&mut app, &session, &branch).await;
    assert_eq!(
        conversation,
        vec![
            format!("user: {QUESTION}"),
            format!("assistant: -> {TOOL_ID} get_weather {{\"city\":\"Paris\"}}"),
            format!("tool[{TOOL_ID} get_weather]: {TOOL_OUTPUT}"),
            format!("assistant: {ANSWER}"),
        ],
        "the session's {branch} (system messages left out)"
    );
}

// ---------------------------------------------------------------- the OpenAI SDK

#[tokio::test]
async fn openai_sdk_create_records_a_tool_loop() {
    openai_sdk("openai-create").await;
}

#[tokio::test]
async fn openai_sdk_stream_records_a_tool_loop() {
    openai_sdk("openai-stream").await;
}

/// A two-call tool loop with `openai.OpenAI(base_url=gateway + "/v1")`:
/// `chat.completions.create` without (`openai-create`) or with `stream=True` (`openai-stream`).
async fn openai_sdk(mode: &str) {
    let Some(python) = python().await else { return };
    let fake = FakeProvider::start().await;
    fake.script_all([
        Reply::tool_use_id(TOOL_ID, "get_weather", json!({"city": "Paris"})),
        Reply::text(ANSWER),
    ]);
    let (mut app, gateway) = gateway_app(&fake).await;

    let out = run_sdk(&python, mode, &gateway).await;
    assert_eq!(out["answer"], ANSWER, "the SDK's answer; it printed {out}");
    assert_eq!(out["stop_reasons"], json!(["tool_calls", "stop"]), "{out}");
    assert_eq!(out["tool"]["id"], TOOL_ID, "{out}");
    assert_eq!(out["tool"]["name"], "get_weather", "{out}");
    let arguments: Value = serde_json::from_str(out["tool"]["arguments"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("the tool call's arguments are JSON ({e}): {out}"));
    assert_eq!(arguments, json!({"city": "Paris"}));

    let calls = model_calls(&fake, "/v1/chat/completions");
    assert_eq!(calls.len(), 2, "model calls upstream: {}", paths(&fake));
    let streamed = mode == "openai-stream";
    for call in &calls {
        assert_eq!(
            call.header("authorization"),
            Some("Bearer sk-test"),
            "authorization forwarded"
        );
        assert_eq!(call.body["stream"].as_bool().unwrap_or(false), streamed);
        assert_ctxd_headers_stripped(call);
    }
    let second = calls[1].messages();
    let (call, result) = openai_pair(&second, TOOL_ID).unwrap_or_else(|| {
        panic!("the second upstream request pairs {TOOL_ID} with its result: {second:#?}")
    });
    assert_eq!(call["function"]["name"], "get_weather");
    let sent: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
        .expect("arguments sent upstream are JSON");
    assert_eq!(sent, json!({"city": "Paris"}));
    assert_eq!(result_text(&result["content"]), TOOL_OUTPUT);
    assert!(
        second
            .iter()
            .any(|m| m["role"] == "system" && message_text(m) == SYSTEM),
        "the system prompt went upstream again: {second:#?}"
    );
    assert!(
        second
            .iter()
            .any(|m| m["role"] == "user" && message_text(m) == QUESTION),
        "the question went upstream again: {second:#?}"
    );

    let session = crate::agents::only_session(&mut app, "one conversation").await;
    assert_eq!(
        out["sessions"],
        json!([session, session]),
        "x-ctxd-session-id"
    );
    let branch = answered_branch(&out);
    let conversation = conversation(&mut app, &session, &branch).await;
    assert_eq!(
        conversation,
        vec![
            format!("user: {QUESTION}"),
            format!("assistant: -> {TOOL_ID} get_weather {{\"city\":\"Paris\"}}"),
            format!("tool[{TOOL_ID} get_weather]: {TOOL_OUTPUT}"),
            format!("assistant: {ANSWER}"),
        ],
        "the session's {branch} (system messages left out)"
    );
    let all = log_lines(&mut app, &session, &branch).await;
    assert!(
        all.contains(&format!("system: {SYSTEM}")),
        "the system message is recorded: {all:#?}"
    );
}

#[tokio::test]
async fn openai_sdk_responses_create_records_a_tool_loop() {
    responses_sdk("responses-create").await;
}

#[tokio::test]
async fn openai_sdk_responses_stream_records_a_tool_loop() {
    responses_sdk("responses-stream").await;
}

/// A two-call tool loop with `client.responses.create(..., store=False)`, without
/// (`responses-create`) or with `stream=True` (`responses-stream`): the client resends its
/// items, the model's output items among them, as Responses apps do.
async fn responses_sdk(mode: &str) {
    let Some(python) = python().await else { return };
    let fake = FakeProvider::start().await;
    fake.script_all([
        Reply::tool_use_id(TOOL_ID, "get_weather", json!({"city": "Paris"})),
        Reply::text(ANSWER),
    ]);
    let (mut app, gateway) = gateway_app(&fake).await;

    let out = run_sdk(&python, mode, &gateway).await;
    assert_eq!(out["answer"], ANSWER, "the SDK's answer; it printed {out}");
    assert_eq!(
        out["stop_reasons"],
        json!(["completed", "completed"]),
        "{out}"
    );
    assert_eq!(out["tool"]["id"], TOOL_ID, "{out}");
    assert_eq!(out["tool"]["name"], "get_weather", "{out}");

    let calls = model_calls(&fake, "/v1/responses");
    assert_eq!(calls.len(), 2, "model calls upstream: {}", paths(&fake));
    let streamed = mode == "responses-stream";
    for call in &calls {
        assert_eq!(call.header("authorization"), Some("Bearer sk-test"));
        assert_eq!(call.body["stream"].as_bool().unwrap_or(false), streamed);
        assert_ctxd_headers_stripped(call);
    }
    let second = calls[1].input();
    let call = second
        .iter()
        .position(|i| i["type"] == "function_call" && i["call_id"] == TOOL_ID)
        .unwrap_or_else(|| panic!("the second upstream input holds the call: {second:#?}"));
    assert_eq!(second[call]["name"], "get_weather");
    let output = &second[call + 1];
    assert_eq!(output["type"], "function_call_output", "{second:#?}");
    assert_eq!(output["call_id"], TOOL_ID);
    assert_eq!(output["output"], TOOL_OUTPUT);

    let session = crate::agents::only_session(&mut app, "one conversation").await;
    assert_eq!(
        out["sessions"],
        json!([session, session]),
        "x-ctxd-session-id"
    );
    let branch = answered_branch(&out);
    let nodes = app.log(&session, &branch).await;
    let lines: Vec<String> = nodes.iter().rev().map(describe).collect();
    assert_eq!(
        lines.len(),
        5,
        "system, question, call, result, answer: {lines:#?}"
    );
    // A bare `{role, content}` item keeps its form in a kept part beside its text.
    assert!(
        lines[0].starts_with("system: ") && lines[0].ends_with(SYSTEM),
        "{lines:#?}"
    );
    assert!(
        lines[1].starts_with("user: ") && lines[1].ends_with(QUESTION),
        "{lines:#?}"
    );
    assert!(
        lines[2].starts_with("assistant:")
            && lines[2].ends_with(&format!("-> {TOOL_ID} get_weather {{\"city\":\"Paris\"}}")),
        "{lines:#?}"
    );
    assert_eq!(
        lines[3],
        format!("tool[{TOOL_ID} get_weather]: {TOOL_OUTPUT}")
    );
    assert!(lines[4].starts_with("assistant:"), "{lines:#?}");
}

// ---------------------------------------------------------------- Claude Code

/// `claude -p "…" --allowedTools Read` through the gateway: the fake scripts a `Read` of a temp
/// file, then the answer. Claude Code reads the file itself and sends the result back.
#[tokio::test]
async fn claude_code_reads_a_file_through_the_gateway() {
    let Some(claude) = claude().await else { return };
    let fake = FakeProvider::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().join("work");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::create_dir_all(&home).expect("home dir");
    let first_line = format!("ctxd-gateway-{}", uuid::Uuid::now_v7().simple());
    let file = work.join("notes.txt");
    std::fs::write(&file, format!("{first_line}\nthe second line\n")).expect("write the file");
    let file_path = file.to_str().expect("a UTF-8 temp path").to_owned();

    let read_id = "toolu_ctxd_read_1";
    let answer = format!("The first line is: {first_line}");
    fake.script_all([
        Reply::tool_use_id(read_id, "Read", json!({"file_path": file_path})),
        Reply::text(answer.clone()),
    ]);
    let (mut app, gateway) = gateway_app(&fake).await;

    let prompt = format!("Read the file {file_path} and tell me its first line.");
    let mut command = Command::new(&claude);
    command
        .args(["-p", &prompt, "--allowedTools", "Read"])
        .current_dir(&work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("TERM", "dumb")
        .env("ANTHROPIC_BASE_URL", &gateway)
        .env("ANTHROPIC_API_KEY", "sk-test")
        // Nothing but model calls, and an error at once instead of retries with backoff.
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", "0");
    let ran = run_bounded("claude", command).await;
    let upstream = paths(&fake);
    assert!(
        ran.status.success() && ran.stdout.trim() == answer,
        "claude -p printed the scripted answer {answer:?}\nstatus: {}\nstdout: {}\nstderr: {}\n\
         upstream requests: {upstream}",
        ran.status,
        ran.stdout,
        ran.stderr
    );

    // Upstream: exactly the two model calls, the second carrying the Read call and its result.
    let calls = model_calls(&fake, "/v1/messages");
    assert_eq!(calls.len(), 2, "model calls upstream: {upstream}");
    for call in &calls {
        assert_eq!(
            call.header("x-api-key"),
            Some("sk-test"),
            "x-api-key forwarded"
        );
        assert!(
            call.header("anthropic-beta")
                .is_some_and(|b| b.contains("claude-code")),
            "anthropic-beta forwarded as sent: {:?}",
            call.header("anthropic-beta")
        );
        assert_eq!(call.body["stream"], true, "Claude Code streams");
        assert_eq!(
            call.query.as_deref(),
            Some("beta=true"),
            "the query forwarded"
        );
        assert_ctxd_headers_stripped(call);
    }
    let second = calls[1].messages();
    assert!(
        second
            .iter()
            .any(|m| m["role"] == "system" && m["output_config"].is_object()),
        "Claude Code's per-turn system message, with its output_config, went upstream: {second:#?}"
    );
    let (tool_use, tool_result) = anthropic_pair(&second, read_id).unwrap_or_else(|| {
        panic!("the second upstream request pairs {read_id} with its result: {second:#?}")
    });
    assert_eq!(tool_use["name"], "Read");
    assert_eq!(tool_use["input"]["file_path"], file_path.as_str());
    let read = result_text(&tool_result["content"]);
    assert!(
        read.contains(&first_line),
        "the Read result sent upstream holds the file's first line: {read:?}"
    );

    // ctxd: one session for the run, on one branch (a linear run forks nothing), holding the
    // prompt, the Read call, its result and the answer, each once and in that order.
    let session = crate::agents::only_session(&mut app, "one conversation").await;
    let branches: Vec<pb::Branch> = app
        .branches(&session)
        .await
        .into_iter()
        .filter(|b| !b.head_id.is_empty())
        .collect();
    let names: Vec<&str> = branches.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names.len(), 1, "branches with nodes: {names:?}");
    let all = log_lines(&mut app, &session, names[0]).await;
    let prompt_at = all
        .iter()
        .position(|l| l.starts_with("user: ") && l.contains(&prompt))
        .unwrap_or_else(|| panic!("the prompt is recorded: {all:#?}"));
    // Claude Code runs a model that thinks: its answers open with their (kept) thinking.
    let tail: Vec<String> = all[all.len().saturating_sub(3)..]
        .iter()
        .map(|l| {
            l.replacen("<application/vnd.ctxd.anthropic-reasoning+json>|", "", 1)
                .replacen("<application/vnd.ctxd.anthropic-reasoning+json> ", "", 1)
        })
        .collect();
    assert_eq!(
        tail.len(),
        3,
        "the session holds at least 3 nodes: {all:#?}"
    );
    assert_eq!(
        tail[0],
        format!(
            "assistant: -> {read_id} Read {}",
            json!({"file_path": file_path})
        ),
        "the Read call is recorded, after the prompt: {all:#?}"
    );
    assert!(
        tail[1].starts_with(&format!("tool[{read_id} Read]: ")) && tail[1].contains(&first_line),
        "the Read result is recorded after the call: {all:#?}"
    );
    assert_eq!(
        tail[2],
        format!("assistant: {answer}"),
        "the answer is the head: {all:#?}"
    );
    assert!(
        prompt_at < all.len() - 3,
        "the prompt comes first: {all:#?}"
    );
    for line in [&all[prompt_at], &all[all.len() - 3], &all[all.len() - 1]] {
        let times = all.iter().filter(|l| *l == line).count();
        assert_eq!(times, 1, "recorded once: {line}\n{all:#?}");
    }
}

// ---------------------------------------------------------------- the gateway under test

/// The branch both answers named (`x-ctxd-branch`).
fn answered_branch(out: &Value) -> String {
    let branches = &out["branches"];
    let first = branches[0].as_str().unwrap_or_default();
    assert!(!first.is_empty(), "answers carry x-ctxd-branch: {out}");
    assert_eq!(branches[1], first, "both calls on one branch: {out}");
    first.to_owned()
}

/// `branch` of `session`, oldest first, one line per node (see [`describe`]).
async fn log_lines(app: &mut TestApp, session: &str, branch: &str) -> Vec<String> {
    let mut nodes = app.log(session, branch).await;
    nodes.reverse();
    nodes.iter().map(describe).collect()
}

/// [`log_lines`] without system and developer messages.
async fn conversation(app: &mut TestApp, session: &str, branch: &str) -> Vec<String> {
    log_lines(app, session, branch)
        .await
        .into_iter()
        .filter(|l| !l.starts_with("system: ") && !l.starts_with("developer: "))
        .collect()
}

/// A node as one line: `user: text`, `assistant: text -> id name {args}`,
/// `tool[id name]: text`.
fn describe(node: &pb::Node) -> String {
    use pb::node_input::Kind;
    match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::Message(m)) => {
            let role = match pb::Role::try_from(m.role) {
                Ok(pb::Role::System) => "system",
                Ok(pb::Role::Developer) => "developer",
                Ok(pb::Role::User) => "user",
                Ok(pb::Role::Assistant) => "assistant",
                _ => "other",
            };
            let mut line = format!("{role}:");
            let text = text_of(&m.parts);
            if !text.is_empty() {
                line = format!("{line} {text}");
            }
            for call in &m.tool_calls {
                let args = serde_json::from_str::<Value>(&call.arguments_json)
                    .map(|v| v.to_string())
                    .unwrap_or_else(|_| call.arguments_json.clone());
                line = format!("{line} -> {} {} {args}", call.call_id, call.name);
            }
            line
        }
        Some(Kind::ToolResult(r)) => {
            let error = if r.is_error { " error" } else { "" };
            format!(
                "tool[{} {}{error}]: {}",
                r.call_id,
                r.name,
                text_of(&r.parts)
            )
        }
        Some(other) => format!("{other:?}"),
        None => "<no content>".into(),
    }
}

/// The assistant `tool_use` block with `id` and the `tool_result` answering it in the next
/// message, when `messages` (Anthropic) hold them so.
fn anthropic_pair(messages: &[Value], id: &str) -> Option<(Value, Value)> {
    let at = messages.iter().position(|m| {
        m["role"] == "assistant"
            && blocks(m)
                .iter()
                .any(|b| b["type"] == "tool_use" && b["id"] == id)
    })?;
    let tool_use = blocks(&messages[at]).into_iter().find(|b| b["id"] == id)?;
    let next = messages.get(at + 1)?;
    if next["role"] != "user" {
        return None;
    }
    let result = blocks(next)
        .into_iter()
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)?;
    Some((tool_use, result))
}

/// The assistant tool call with `id` and the `tool` message answering it right after (OpenAI).
fn openai_pair(messages: &[Value], id: &str) -> Option<(Value, Value)> {
    let at = messages.iter().position(|m| {
        m["role"] == "assistant"
            && m["tool_calls"]
                .as_array()
                .is_some_and(|calls| calls.iter().any(|c| c["id"] == id))
    })?;
    let call = messages[at]["tool_calls"]
        .as_array()?
        .iter()
        .find(|c| c["id"] == id)?
        .clone();
    let next = messages.get(at + 1)?;
    (next["role"] == "tool" && next["tool_call_id"] == id).then(|| (call, next.clone()))
}

/// A message's content as blocks (a string is one text block).
fn blocks(message: &Value) -> Vec<Value> {
    match &message["content"] {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(blocks) => blocks.clone(),
        _ => Vec::new(),
    }
}

/// The text of a message's content (string, or text blocks joined).
fn message_text(message: &Value) -> String {
    result_text(&message["content"])
}

/// The text of content that is a string or a list of text blocks (or parts).
fn result_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

// ---------------------------------------------------------------- the clients

/// The Python interpreter with `anthropic` and `openai`, or `None` (the test skips) when it
/// is missing and not required.
pub(crate) async fn python() -> Option<PathBuf> {
    let path = tool_path("CTXD_TEST_PYTHON", "target/py/bin/python");
    if !path.exists() {
        return missing(&format!(
            "no Python at {} (CTXD_TEST_PYTHON; .ci/run makes the venv target/py)",
            path.display()
        ));
    }
    let mut check = Command::new(&path);
    check
        .args(["-c", "import anthropic, openai"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    let ran = run_bounded("python -c 'import anthropic, openai'", check).await;
    if !ran.status.success() {
        return missing(&format!(
            "{} cannot import anthropic and openai (pip install anthropic openai): {}",
            path.display(),
            ran.stderr.trim()
        ));
    }
    Some(path)
}

/// The Claude Code CLI, or `None` (the test skips) when it is missing and not required.
async fn claude() -> Option<PathBuf> {
    let path = tool_path("CTXD_TEST_CLAUDE", "target/agents/node_modules/.bin/claude");
    if !path.exists() {
        return missing(&format!(
            "no Claude Code at {} (CTXD_TEST_CLAUDE; .ci/run installs @anthropic-ai/claude-code \
             into target/agents)",
            path.display()
        ));
    }
    Some(path)
}

/// The path in `var`, else `default` under the repository.
fn tool_path(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(default),
    }
}

/// Fails the test when the clients are required, else says why it skips.
fn missing<T>(why: &str) -> Option<T> {
    if std::env::var(REQUIRED).is_ok_and(|v| v == "required") {
        panic!("{REQUIRED}=required, but {why}");
    }
    eprintln!("skipped: {why}; set {REQUIRED}=required to fail instead");
    None
}

/// Runs the SDK script in `mode` against `gateway`; the JSON it prints last.
async fn run_sdk(python: &Path, mode: &str, gateway: &str) -> Value {
    let mut command = Command::new(python);
    command
        .args(["-c", SDK_SCRIPT, mode])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("GATEWAY_URL", gateway)
        .env("SYSTEM", SYSTEM)
        .env("QUESTION", QUESTION)
        .env("TOOL_OUTPUT", TOOL_OUTPUT);
    let ran = run_bounded(&format!("python ({mode})"), command).await;
    assert!(
        ran.status.success(),
        "the {mode} script failed: {}\nstdout: {}\nstderr: {}",
        ran.status,
        ran.stdout,
        ran.stderr
    );
    let last = ran.stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "the {mode} script prints JSON last ({e})\nstdout: {}\nstderr: {}",
            ran.stdout, ran.stderr
        )
    })
}

/// Both SDKs' tool loop: ask, run the tool the model calls, send its result, print what came
/// back as one JSON line.
const SDK_SCRIPT: &str = r#"
import json, os, sys

mode = sys.argv[1]
gateway = os.environ["GATEWAY_URL"]
SYSTEM, QUESTION, TOOL_OUTPUT = os.environ["SYSTEM"], os.environ["QUESTION"], os.environ["TOOL_OUTPUT"]
out = {"sessions": [], "branches": [], "stop_reasons": []}

def saw(headers):
    out["sessions"].append(headers.get("x-ctxd-session-id"))
    out["branches"].append(headers.get("x-ctxd-branch"))

if mode.startswith("anthropic"):
    import anthropic
    client = anthropic.Anthropic(base_url=gateway, api_key="sk-test", max_retries=0, timeout=60)
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}]
    messages = [{"role": "user", "content": QUESTION}]

    def call():
        args = dict(model="claude-test", max_tokens=1024, system=SYSTEM, tools=tools,
                    messages=messages)
        if mode == "anthropic-stream":
            with client.messages.stream(**args) as stream:
                text = "".join(stream.text_stream)
                message = stream.get_final_message()
                saw(stream.response.headers)
            return message, text
        raw = client.messages.with_raw_response.create(**args)
        saw(raw.headers)
        return raw.parse(), None

    first, _ = call()
    out["stop_reasons"].append(first.stop_reason)
    tool = next(b for b in first.content if b.type == "tool_use")
    out["tool"] = {"id": tool.id, "name": tool.name, "input": tool.input}
    messages.append({"role": "assistant", "content": first.content})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool.id, "content": TOOL_OUTPUT}]})
    second, text = call()
    out["stop_reasons"].append(second.stop_reason)
    out["answer"] = "".join(b.text for b in second.content if b.type == "text")
    out["streamed_text"] = text
elif mode.startswith("responses"):
    import openai
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-test", max_retries=0, timeout=60)
    tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]
    items = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]

    def call():
        args = dict(model="gpt-test", input=items, tools=tools, store=False)
        if mode == "responses-stream":
            raw = client.responses.with_raw_response.create(stream=True, **args)
            saw(raw.headers)
            final = None
            for event in raw.parse():
                if event.type == "response.completed":
                    final = event.response
            return final
        raw = client.responses.with_raw_response.create(**args)
        saw(raw.headers)
        return raw.parse()

    first = call()
    out["stop_reasons"].append(first.status)
    tool = next(o for o in first.output if o.type == "function_call")
    out["tool"] = {"id": tool.call_id, "name": tool.name, "arguments": tool.arguments}
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": tool.call_id, "output": TOOL_OUTPUT})
    second = call()
    out["stop_reasons"].append(second.status)
    out["answer"] = second.output_text
else:
    import openai
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-test", max_retries=0, timeout=60)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]

    def call():
        if mode == "openai-stream":
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-test", messages=messages, tools=tools, stream=True,
                stream_options={"include_usage": True})
            saw(raw.headers)
            content, calls, finish = "", {}, None
            for chunk in raw.parse():
                for choice in chunk.choices:
                    delta = choice.delta
                    content += delta.content or ""
                    for tc in delta.tool_calls or []:
                        c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                        c["id"] = tc.id or c["id"]
                        if tc.function is not None:
                            c["name"] += tc.function.name or ""
                            c["arguments"] += tc.function.arguments or ""
                    finish = choice.finish_reason or finish
            return content or None, [calls[i] for i in sorted(calls)], finish
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-test", messages=messages, tools=tools)
        saw(raw.headers)
        choice = raw.parse().choices[0]
        calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                 for t in choice.message.tool_calls or []]
        return choice.message.content, calls, choice.finish_reason

    content, calls, finish = call()
    out["stop_reasons"].append(finish)
    tool = calls[0]
    out["tool"] = tool
    messages.append({"role": "assistant", "content": content, "tool_calls": [
        {"id": tool["id"], "type": "function",
         "function": {"name": tool["name"], "arguments": tool["arguments"]}}]})
    messages.append({"role": "tool", "tool_call_id": tool["id"], "content": TOOL_OUTPUT})
    answer, _, finish = call()
    out["stop_reasons"].append(finish)
    out["answer"] = answer

print(json.dumps(out))
"#;
