//! Google's Gemini API, the gateway's fourth wire format, and the real Gemini CLI
//! (`@google/gemini-cli` 0.61.0, `gemini -p`) driven through it.
//!
//! The CLI speaks the Gemini API: with a key (`security.auth.selectedType: "gemini-api-key"`,
//! the key in `GEMINI_API_KEY`) and `GOOGLE_GEMINI_BASE_URL` it sends each step of a turn as
//! `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`, the whole history resent, its
//! key in `x-goog-api-key`; before a turn in `auto` mode it asks `gemini-3.5-flash-lite` (a
//! `generateContent` side call whose `responseJsonSchema` wants a `complexity_score`) which
//! model the turn goes to. Its shell tool is `run_shell_command` (`{"command": ..}`), offered
//! only with `--yolo`; it gives every call without an `id` its own
//! (`run_shell_command_<ms>_<n>`) and sends the result back as a `functionResponse` part with
//! that id, the call as it came with its `thoughtSignature`. `testdata/gateway/corpus/
//! gemini-cli-0.61.0/README.md` shows the requests.
//!
//! Two parts. The first needs no gateway: the fake provider's Gemini rules
//! (`tests/common/fake_gemini.rs`), pinned over HTTP, and the real CLI run straight against the
//! fake to a finished tool-using session (the fake is good enough for the CLI). The second
//! runs the CLI, and plain HTTP, through the gateway, whose Gemini upstream is pointed at the
//! fake by [`crate::agents::point_gemini_upstream`].
//!
//! The CLI is found at `target/agents/node_modules/.bin/gemini` (`.ci/run` installs the pinned
//! `@google/gemini-cli`); `CTXD_TEST_GEMINI` names another. Without it the tests that need it
//! skip with a message, unless `CTXD_GATEWAY_CLIENTS=required` (CI sets it): then they fail
//! naming what is missing. The CLI runs with a temp `HOME` whose `~/.gemini/settings.json`
//! selects the key and turns off what would reach beyond loopback (auto-update and its
//! notification, usage statistics, telemetry); every child process is killed, with its
//! process group, at [`crate::agents::CHILD_LIMIT`].

use std::path::{Path, PathBuf};
use std::process::Command;

use ctxd::api::pb;
use serde_json::{Value, json};

use crate::agents::{Ran, gemini_gateway_app, paths, run_bounded};
use crate::fake_provider::{
    CORRUPTED_SIGNATURE, DUMMY_SIGNATURES, FakeProvider, GEMINI_CACHE_LIFE, NO_KEY, PAIRING_CALL,
    PAIRING_COUNT, PAIRING_RESPONSE, Recorded, Reply, THINKING_TEXT, gemini_of_sse,
    gemini_read_price, gemini_units, missing_signature,
};
use crate::gateway::http_client;
use crate::helpers::TestApp;

/// The model `gemini -p -m` names for the turns (the CLI's default Pro model).
const PRO: &str = "gemini-3.1-pro-preview";

/// The model of the CLI's side calls (routing).
const FLASH_LITE: &str = "gemini-3.5-flash-lite";

/// The key the tests give (the CLI's `GEMINI_API_KEY`).
const KEY: &str = "AIzaSy-ctxd-test-gemini-key";

/// The CLI's shell tool, and its file-writing one.
const SHELL: &str = "run_shell_command";
const WRITE_FILE: &str = "write_file";

const ANSWER: &str = "Wrote out.txt.";

// ================================================================ the fake's Gemini rules

/// Posts `body` to the fake's `path` (with its query) with `headers`; the status and the raw
/// body.
async fn post(
    fake: &FakeProvider,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Vec<u8>) {
    let mut request = http_client()
        .post(format!("{}{path}", fake.url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    (status, response.bytes().await.expect("a body").to_vec())
}

/// `generateContent` on `model` with the key: the status and the JSON answer.
async fn generate(fake: &FakeProvider, model: &str, body: &Value) -> (u16, Value) {
    let path = format!("/v1beta/models/{model}:generateContent");
    let (status, bytes) = post(fake, &path, &[("x-goog-api-key", KEY)], body).await;
    let answer = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("a JSON answer ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, answer)
}

/// An answer that must come (200).
async fn answered(fake: &FakeProvider, model: &str, body: &Value) -> Value {
    let (status, answer) = generate(fake, model, body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// A refusal that must come: 400 `INVALID_ARGUMENT`, its message.
async fn refused(fake: &FakeProvider, model: &str, body: &Value) -> String {
    let (status, answer) = generate(fake, model, body).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], 400, "{answer}");
    assert_eq!(answer["error"]["status"], "INVALID_ARGUMENT", "{answer}");
    answer["error"]["message"]
        .as_str()
        .expect("a message")
        .to_owned()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "parts": [{"text": text}]})
}

fn request(contents: &[Value]) -> Value {
    json!({"contents": contents})
}

/// The parts of an answer's first candidate.
fn parts(answer: &Value) -> Vec<Value> {
    answer["candidates"][0]["content"]["parts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// An answer's content as the next request sends it back: its parts but thoughts.
fn model_turn(answer: &Value) -> Value {
    let kept: Vec<Value> = parts(answer)
        .into_iter()
        .filter(|p| p["thought"] != true)
        .collect();
    json!({"role": "model", "parts": kept})
}

fn function_response(name: &str, output: &str) -> Value {
    json!({"functionResponse": {"name": name, "response": {"output": output}}})
}

fn responses(parts: Vec<Value>) -> Value {
    json!({"role": "user", "parts": parts})
}

/// Tokens of a request's prompt as the fake counts them, for `model` and [`KEY`].
fn prompt_tokens(body: &Value, model: &str) -> u64 {
    gemini_units(body, model, KEY)
        .iter()
        .map(|u| u.tokens)
        .sum()
}

/// The fake's Gemini API as the CLI and the gateway rely on it: an answer whole and streamed
/// (Google's SSE framing, one chunk per part or piece of text, the last with the finish reason
/// and the usage; without `alt=sse` a JSON array), a call and a thought part signed, the usage,
/// and `countTokens`.
#[tokio::test]
async fn fake_gemini_answers_whole_and_streamed() {
    let fake = FakeProvider::start().await;
    let prompt = user("Run true.");
    let thinking = json!({"thinkingConfig": {"includeThoughts": true}});
    fake.script_all([
        Reply::tool_use(SHELL, json!({"command": "true"})),
        Reply::text("It ran."),
        Reply::text("Again."),
    ]);

    // Streamed, thoughts asked for: a thought part, then the call, each signed.
    let body = json!({"contents": [prompt], "generationConfig": thinking});
    let path = format!("/v1beta/models/{PRO}:streamGenerateContent?alt=sse");
    let (status, bytes) = post(&fake, &path, &[("x-goog-api-key", KEY)], &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let recorded = fake.last_request();
    assert_eq!(
        recorded.response.as_ref(),
        bytes.as_slice(),
        "what was sent is recorded"
    );
    let text = String::from_utf8(bytes.clone()).expect("UTF-8");
    assert!(text.ends_with("\r\n\r\n"), "{text:?}");
    let events: Vec<&str> = text.split_terminator("\r\n\r\n").collect();
    assert_eq!(events.len(), 2, "one chunk per part: {text}");
    for event in &events {
        let data = event.strip_prefix("data: ").expect("a data: line");
        let chunk: Value = serde_json::from_str(data).expect("a JSON chunk");
        assert_eq!(chunk["modelVersion"], PRO);
        assert!(
            chunk["usageMetadata"]["promptTokenCount"].is_u64(),
            "{chunk}"
        );
    }
    let whole = gemini_of_sse(&bytes).expect("a whole streamed answer");
    let got = parts(&whole);
    assert_eq!(got.len(), 2, "{whole:#}");
    assert_eq!(got[0]["text"], THINKING_TEXT);
    assert_eq!(got[0]["thought"], true);
    let call = &got[1];
    assert_eq!(
        call["functionCall"],
        json!({"name": SHELL, "args": {"command": "true"}}),
        "no id: Google's API gives none"
    );
    let signature = call["thoughtSignature"]
        .as_str()
        .expect("the call is signed");
    assert!(
        signature.len().is_multiple_of(4)
            && signature
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)),
        "base64: {signature}"
    );
    assert!(
        got[0]["thoughtSignature"].is_string(),
        "the thought is signed"
    );
    assert_eq!(
        fake.gemini_signatures(),
        vec![(SHELL.to_owned(), signature.to_owned())],
        "the fake keeps what it gave the call"
    );
    let candidate = &whole["candidates"][0];
    assert_eq!(candidate["finishReason"], "STOP");
    assert_eq!(candidate["content"]["role"], "model");
    let usage = &whole["usageMetadata"];
    let prompt_count = prompt_tokens(&body, PRO);
    assert_eq!(usage["promptTokenCount"], prompt_count);
    assert_eq!(
        usage["thoughtsTokenCount"],
        (THINKING_TEXT.len() as u64).div_ceil(4)
    );
    assert!(usage.get("cachedContentTokenCount").is_none(), "{usage}");
    let total = usage["promptTokenCount"].as_u64().unwrap()
        + usage["candidatesTokenCount"].as_u64().unwrap()
        + usage["thoughtsTokenCount"].as_u64().unwrap();
    assert_eq!(usage["totalTokenCount"], total);
    assert_eq!(recorded.usage, *usage, "the usage is recorded");
    assert_eq!(
        recorded.bill.expect("billed").prompt(),
        prompt_count,
        "and billed"
    );

    // Whole, thoughts not asked for: the text, signed on its last part; the call went back
    // with its signature and its response.
    let history = [
        prompt.clone(),
        json!({"role": "model", "parts": [call.clone()]}),
        responses(vec![function_response(SHELL, "")]),
    ];
    let whole = answered(&fake, PRO, &request(&history)).await;
    let got = parts(&whole);
    assert_eq!(got.len(), 1, "no thought part unless asked: {whole:#}");
    assert_eq!(got[0]["text"], "It ran.");
    assert!(got[0]["thoughtSignature"].is_string(), "{whole:#}");
    assert!(
        whole["usageMetadata"]["thoughtsTokenCount"].as_u64() > Some(0),
        "it thought all the same"
    );
    assert_eq!(whole["responseId"], format!("fake-gemini-{}", 2));

    // Streamed without alt=sse: a JSON array of the chunks.
    let path = format!("/v1beta/models/{PRO}:streamGenerateContent");
    let (status, bytes) = post(&fake, &path, &[("x-goog-api-key", KEY)], &request(&history)).await;
    assert_eq!(status, 200);
    let chunks: Vec<Value> = serde_json::from_slice(&bytes).expect("a JSON array");
    let texts: String = chunks
        .iter()
        .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, "Again.");
    assert_eq!(
        chunks.last().unwrap()["candidates"][0]["finishReason"],
        "STOP"
    );

    // countTokens: the prompt's tokens, no reply taken.
    fake.script(Reply::text("unused"));
    let path = format!("/v1beta/models/{PRO}:countTokens");
    let (status, bytes) = post(&fake, &path, &[("x-goog-api-key", KEY)], &body).await;
    assert_eq!(status, 200);
    let counted: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(counted["totalTokens"], prompt_count);
    let wrapped = json!({"generateContentRequest": body});
    let (_, bytes) = post(&fake, &path, &[("x-goog-api-key", KEY)], &wrapped).await;
    let counted: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(counted["totalTokens"], prompt_count);
    assert_eq!(fake.pending(), 1, "countTokens takes no reply");
}

/// The key in `x-goog-api-key` or `?key=`, else Google's 403; unknown methods 404; the
/// structure of `contents` Google requires.
#[tokio::test]
async fn fake_gemini_requires_a_key_and_well_formed_contents() {
    let fake = FakeProvider::start().await;
    let body = request(&[user("Hello.")]);
    let path = format!("/v1beta/models/{PRO}:generateContent");

    let (status, bytes) = post(&fake, &path, &[], &body).await;
    let error: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(status, 403, "{error}");
    assert_eq!(
        error,
        json!({"error": {"code": 403, "message": NO_KEY, "status": "PERMISSION_DENIED"}})
    );
    let (status, _) = post(&fake, &path, &[("x-goog-api-key", "")], &body).await;
    assert_eq!(status, 403, "an empty key is none");
    let (status, _) = post(&fake, &format!("{path}?key={KEY}"), &[], &body).await;
    assert_eq!(status, 200, "the key as a query parameter");
    assert_eq!(
        fake.last_request().query.as_deref(),
        Some(&*format!("key={KEY}"))
    );
    let (status, _) = post(&fake, &path, &[("x-goog-api-key", KEY)], &body).await;
    assert_eq!(status, 200, "the key as a header");

    let unknown = format!("/v1beta/models/{PRO}:embedContent");
    let (status, bytes) = post(&fake, &unknown, &[("x-goog-api-key", KEY)], &body).await;
    let error: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(
        (status, &error["error"]["status"]),
        (404, &json!("NOT_FOUND"))
    );

    let message = refused(&fake, PRO, &json!({"contents": []})).await;
    assert!(message.contains("contents is not specified"), "{message}");
    let message = refused(
        &fake,
        PRO,
        &request(&[json!({"role": "assistant", "parts": [{"text": "Hi."}]})]),
    )
    .await;
    assert_eq!(message, "Please use a valid role: user, model.");
    let message = refused(
        &fake,
        PRO,
        &request(&[user("Hi."), json!({"role": "model", "parts": []})]),
    )
    .await;
    assert!(message.contains("contents[1].parts"), "{message}");
    assert_eq!(fake.refusals(), 0, "none of these is a signature's");
}

/// Calls and their responses pair as Google requires; the CLI's resumed request of the corpus
/// (one call answered twice: 0.61.0 resends the response its session file holds twice) is
/// refused as Google refuses it.
#[tokio::test]
async fn fake_gemini_pairs_calls_with_responses() {
    let fake = FakeProvider::start().await;
    let call = json!({"functionCall": {"name": SHELL, "args": {"command": "true"}},
                      "thoughtSignature": DUMMY_SIGNATURES[0]});
    let prompt = user("Run true.");
    let model = json!({"role": "model", "parts": [call]});

    let twice = [
        prompt.clone(),
        model.clone(),
        responses(vec![
            function_response(SHELL, ""),
            function_response(SHELL, ""),
        ]),
    ];
    assert_eq!(refused(&fake, PRO, &request(&twice)).await, PAIRING_COUNT);
    let alone = [
        prompt.clone(),
        responses(vec![function_response(SHELL, "")]),
    ];
    assert_eq!(
        refused(&fake, PRO, &request(&alone)).await,
        PAIRING_RESPONSE
    );
    let after_model = [
        prompt.clone(),
        json!({"role": "model", "parts": [{"text": "Let me see."}]}),
        model.clone(),
        responses(vec![function_response(SHELL, "")]),
    ];
    assert_eq!(
        refused(&fake, PRO, &request(&after_model)).await,
        PAIRING_CALL
    );
    let paired = [prompt, model, responses(vec![function_response(SHELL, "")])];
    answered(&fake, PRO, &request(&paired)).await;

    let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/gateway/corpus/gemini-cli-0.61.0/04.json");
    let resumed: Value =
        serde_json::from_slice(&std::fs::read(&corpus).expect("the corpus")).expect("JSON");
    assert_eq!(
        refused(&fake, "gemini-3.1-pro-preview-customtools", &resumed).await,
        PAIRING_COUNT
    );
    assert_eq!(fake.refusals(), 0, "none of these is a signature's");
}

/// Gemini 3: a call of the current turn must come back with the signature the fake gave it;
/// the first call of a model content without one is refused with Google's message, another
/// signature is corrupted, Google's dummy values pass, earlier turns and Gemini 2.5 are not
/// checked, and of parallel calls only the first is signed.
#[tokio::test]
async fn fake_gemini_refuses_a_call_without_its_signature() {
    let fake = FakeProvider::start().await;
    let args = json!({"command": "echo hi"});
    fake.script(Reply::tool_use(SHELL, args.clone()));
    let prompt = user("Say hi.");
    let first = answered(&fake, PRO, &request(std::slice::from_ref(&prompt))).await;
    let model = model_turn(&first);
    let signature = model["parts"][0]["thoughtSignature"]
        .as_str()
        .expect("signed")
        .to_owned();
    let result = responses(vec![function_response(SHELL, "hi")]);
    let with_call = |call: Value| {
        vec![
            prompt.clone(),
            json!({"role": "model", "parts": [call]}),
            result.clone(),
        ]
    };
    let call_with = |signature: Option<&str>, args: &Value| {
        let mut part = json!({"functionCall": {"name": SHELL, "args": args}});
        if let Some(signature) = signature {
            part["thoughtSignature"] = json!(signature);
        }
        part
    };

    answered(
        &fake,
        PRO,
        &request(&with_call(call_with(Some(&signature), &args))),
    )
    .await;
    // The same call, its arguments' keys in another order, the CLI's id added: the same call.
    let mut with_id = call_with(Some(&signature), &args);
    with_id["functionCall"]["id"] = json!("run_shell_command_1_0");
    answered(&fake, PRO, &request(&with_call(with_id))).await;
    assert_eq!(fake.refusals(), 0);

    let message = refused(&fake, PRO, &request(&with_call(call_with(None, &args)))).await;
    assert_eq!(message, missing_signature(SHELL, 2));
    assert!(
        message.starts_with("Function call is missing a thought_signature in functionCall parts."),
        "{message}"
    );
    let forged = format!("{}AA==", &signature[..signature.len() - 4]);
    let message = refused(
        &fake,
        PRO,
        &request(&with_call(call_with(Some(&forged), &args))),
    )
    .await;
    assert_eq!(message, CORRUPTED_SIGNATURE);
    let other_args = json!({"command": "echo bye"});
    let message = refused(
        &fake,
        PRO,
        &request(&with_call(call_with(Some(&signature), &other_args))),
    )
    .await;
    assert_eq!(
        message, CORRUPTED_SIGNATURE,
        "a signature is its own call's"
    );
    let message = refused(
        &fake,
        "gemini-3.8-flash",
        &request(&with_call(call_with(Some(&signature), &args))),
    )
    .await;
    assert_eq!(
        message, CORRUPTED_SIGNATURE,
        "a signature is its own model's"
    );
    assert_eq!(fake.refusals(), 4, "each counted");

    for dummy in DUMMY_SIGNATURES {
        answered(
            &fake,
            PRO,
            &request(&with_call(call_with(Some(dummy), &args))),
        )
        .await;
    }
    // An earlier turn's call is not checked.
    let mut later = with_call(call_with(None, &args));
    later.push(json!({"role": "model", "parts": [{"text": "hi"}]}));
    later.push(user("Thanks."));
    answered(&fake, PRO, &request(&later)).await;
    // Nor is Gemini 2.5's.
    answered(
        &fake,
        "gemini-2.5-flash",
        &request(&with_call(call_with(None, &args))),
    )
    .await;
    assert_eq!(fake.refusals(), 4);

    // Parallel calls: the first signed, the second not; sent back so, they pass.
    fake.script(Reply::blocks(vec![
        crate::fake_provider::Block::ToolUse {
            id: String::new(),
            name: SHELL.into(),
            input: json!({"command": "echo a"}),
        },
        crate::fake_provider::Block::ToolUse {
            id: String::new(),
            name: WRITE_FILE.into(),
            input: json!({"file_path": "b.txt", "content": "b"}),
        },
    ]));
    let parallel = answered(&fake, PRO, &request(&[user("Both.")])).await;
    let calls = parts(&parallel);
    assert!(calls[0]["thoughtSignature"].is_string(), "{parallel:#}");
    assert!(calls[1].get("thoughtSignature").is_none(), "{parallel:#}");
    let back = [
        user("Both."),
        model_turn(&parallel),
        responses(vec![
            function_response(SHELL, "a"),
            function_response(WRITE_FILE, "ok"),
        ]),
    ];
    answered(&fake, PRO, &request(&back)).await;
    assert_eq!(fake.refusals(), 4);
}

/// Implicit caching per model: the longest prefix seen, read only at or over the model's
/// minimum (4,096 tokens on Gemini 3, 2,048 on 2.5), at its read price; scoped by model and
/// key; an entry lives [`GEMINI_CACHE_LIFE`] on the fake's clock.
#[tokio::test]
async fn fake_gemini_caches_implicit_prefixes() {
    let fake = FakeProvider::start().await;
    // A system instruction of `tokens` tokens as the fake counts them, more or less.
    let system = |tokens: usize| json!({"parts": [{"text": "x ".repeat(tokens * 2)}]});
    let body = |system: &Value, contents: &[Value]| json!({"systemInstruction": system, "contents": contents});
    let usage_of = |answer: &Value| answer["usageMetadata"].clone();

    let big = system(5000);
    let first = body(&big, &[user("One.")]);
    let answer = answered(&fake, PRO, &first).await;
    assert!(usage_of(&answer).get("cachedContentTokenCount").is_none());
    let second = body(&big, &[user("One."), model_turn(&answer), user("Two.")]);
    let answer = answered(&fake, PRO, &second).await;
    let usage = usage_of(&answer);
    let cached = prompt_tokens(&first, PRO);
    assert!(cached >= 4096, "over the minimum: {cached}");
    assert_eq!(usage["cachedContentTokenCount"], cached, "{usage}");
    assert_eq!(
        usage["promptTokenCount"],
        prompt_tokens(&second, PRO),
        "cached included"
    );
    assert_eq!(
        usage["cacheTokensDetails"],
        json!([{"modality": "TEXT", "tokenCount": cached}])
    );
    let bill = fake.last_request().bill.expect("billed");
    assert_eq!((bill.read, bill.read_price), (cached, 0.1));
    let cost = (prompt_tokens(&second, PRO) - cached) as f64 + 0.1 * cached as f64;
    assert!((bill.cost() - cost).abs() < 1e-9, "{bill:?}");

    // Another key, another model: their own caches.
    let path = format!("/v1beta/models/{PRO}:generateContent");
    let (_, bytes) = post(&fake, &path, &[("x-goog-api-key", "another-key")], &second).await;
    let other: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert!(
        usage_of(&other).get("cachedContentTokenCount").is_none(),
        "{other}"
    );
    // Past the entry's life: nothing read.
    fake.advance(GEMINI_CACHE_LIFE);
    let answer = answered(&fake, PRO, &second).await;
    assert!(usage_of(&answer).get("cachedContentTokenCount").is_none());

    // Under Gemini 3's minimum nothing is read; 2.5 reads from 2,048 tokens, at 0.25.
    let middling = body(&system(3000), &[user("One.")]);
    for _ in 0..2 {
        let answer = answered(&fake, PRO, &middling).await;
        assert!(usage_of(&answer).get("cachedContentTokenCount").is_none());
    }
    let flash = "gemini-2.5-flash";
    answered(&fake, flash, &middling).await;
    let answer = answered(&fake, flash, &middling).await;
    assert_eq!(
        usage_of(&answer)["cachedContentTokenCount"],
        prompt_tokens(&middling, flash)
    );
    assert_eq!(fake.last_request().bill.expect("billed").read_price, 0.25);
    // Gemini 4 reads at 0.05; 2.0 caches nothing.
    assert_eq!(gemini_read_price("gemini-4-argon"), 0.05);
    assert_eq!(gemini_read_price("models/gemini-3.8-flash"), 0.1);
    let old = "gemini-2.0-flash";
    answered(&fake, old, &first).await;
    let answer = answered(&fake, old, &first).await;
    assert!(usage_of(&answer).get("cachedContentTokenCount").is_none());
}

/// The real Gemini CLI straight against the fake (no gateway), in `auto` mode: the routing side
/// call on `gemini-3.5-flash-lite` is answered with a low complexity score, so the turn goes to
/// a Flash model; it calls `run_shell_command`, the CLI runs it and sends its result back with
/// the call as signed, and prints the answer. No request is refused: the fake is good enough
/// for the CLI. Its session file is where and what the import expects.
#[tokio::test]
async fn gemini_cli_finishes_a_tool_session_against_the_fake() {
    let Some(gemini) = gemini() else { return };
    let fake = FakeProvider::start().await;
    let dirs = GeminiDirs::new();
    let marker = format!("ctxd-gemini-{}", uuid::Uuid::now_v7().simple());
    let command = format!("echo {marker} > out.txt");
    fake.script_all([
        routed(10),
        Reply::tool_use(
            SHELL,
            json!({"command": command, "description": "Write the marker."}),
        ),
        Reply::text(ANSWER),
    ]);

    let prompt = format!("Write {marker} into out.txt.");
    let ran = run_bounded(
        "gemini -p",
        dirs.command(&gemini, &fake.url(), &["--yolo", "-p", &prompt]),
    )
    .await;
    assert_ran_the_script(&ran, &dirs, &marker, &fake);
    assert_eq!(fake.refusals(), 0, "no call refused: {}", paths(&fake));
    assert_eq!(fake.pending(), 0, "every scripted answer was asked for");
    let requests = fake.requests();
    assert!(
        requests.iter().all(|r| r.status == 200),
        "every request answered: {:?}",
        requests
            .iter()
            .map(|r| (&r.path, r.status))
            .collect::<Vec<_>>()
    );

    // The side call, then the turn's two steps on the model it chose.
    assert_eq!(requests.len(), 3, "{}", paths(&fake));
    assert_side_call(&requests[0]);
    let turns = &requests[1..];
    let turn_model = turn_model(&turns[0]);
    assert_ne!(
        turn_model, PRO,
        "the router read the side call's score (the CLI's default model is its fallback)"
    );
    for turn in turns {
        assert_turn(turn, &turn_model);
    }
    let signatures = fake.gemini_signatures();
    assert_eq!(signatures.len(), 1, "{signatures:?}");
    let (call, result) = call_and_result(&turns[1].contents()).unwrap_or_else(|| {
        panic!(
            "the second step sends the call and its result: {:#?}",
            turns[1].contents()
        )
    });
    assert_eq!(
        result["functionResponse"]["id"], call["functionCall"]["id"],
        "paired by the CLI's id"
    );
    assert_eq!(
        call["thoughtSignature"].as_str(),
        Some(signatures[0].1.as_str()),
        "the call went back with its signature: {call}"
    );
    assert_eq!(call["functionCall"]["args"]["command"], command.as_str());

    // ~/.gemini/tmp/<the work dir's name>/chats/session-<time>-<id>.jsonl: a header, then the
    // messages, the call with its result in the model's message.
    let chats = dirs.home.join(".gemini/tmp/work/chats");
    let files: Vec<PathBuf> = std::fs::read_dir(&chats)
        .unwrap_or_else(|e| panic!("{} ({e})", chats.display()))
        .map(|e| e.expect("an entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let lines: Vec<Value> = std::fs::read_to_string(&files[0])
        .expect("the session file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert!(
        lines[0]["sessionId"].is_string() && lines[0]["kind"] == "main",
        "{:#}",
        lines[0]
    );
    let made = lines.iter().any(|l| {
        let call = &l["toolCalls"][0];
        l["type"] == "gemini"
            && call["name"] == SHELL
            && call["args"]["command"] == command.as_str()
            && call["result"][0]["functionResponse"]["name"] == SHELL
    });
    assert!(
        made,
        "the session file holds the call and its result: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "gemini" && l["content"] == ANSWER),
        "and the answer: {lines:#?}"
    );
}

// ================================================================ through the gateway

/// `gemini -p --yolo -m gemini-3.1-pro-preview` through the gateway: the fake scripts a
/// `run_shell_command` call writing a marker, then the answer. The CLI runs it and prints the
/// answer; upstream, both steps went with the CLI's key, no request was refused and every call
/// kept the signature the fake gave it, byte for byte; the ctxd session holds the prompt, the
/// call, its result and the answer, in that order.
#[tokio::test]
async fn gemini_cli_runs_a_shell_call_through_the_gateway() {
    let Some(gemini) = gemini() else { return };
    let fake = FakeProvider::start().await;
    let (mut app, gateway) = gemini_gateway_app(&fake).await;
    let dirs = GeminiDirs::new();
    let marker = format!("ctxd-gemini-{}", uuid::Uuid::now_v7().simple());
    let command = format!("echo {marker} > out.txt");
    let args = json!({"command": command, "description": "Write the marker."});
    fake.script_all([Reply::tool_use(SHELL, args.clone()), Reply::text(ANSWER)]);

    let prompt = format!("Write {marker} into out.txt.");
    let ran = run_bounded(
        "gemini -p through the gateway",
        dirs.command(&gemini, &gateway, &["--yolo", "-m", PRO, "-p", &prompt]),
    )
    .await;
    assert_ran_the_script(&ran, &dirs, &marker, &fake);

    // Upstream: the two steps, answered, the key forwarded, the signature kept.
    assert_eq!(fake.refusals(), 0, "no call refused: {}", paths(&fake));
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "{}", paths(&fake));
    for turn in &requests {
        assert_eq!(turn.status, 200, "{}", turn.response_text());
        assert_turn(turn, PRO);
    }
    assert_signatures_kept(&fake);
    let (call, result) = call_and_result(&requests[1].contents()).unwrap_or_else(|| {
        panic!(
            "the second step sends the call and its result: {:#?}",
            requests[1].contents()
        )
    });
    assert_eq!(call["functionCall"]["args"], args);
    let call_id = call["functionCall"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        result["functionResponse"]["id"],
        call_id.as_str(),
        "paired by the CLI's id"
    );

    // ctxd: one session, one branch; the prompt, then the call, its result and the answer.
    let session = crate::agents::only_session(&mut app, "one gemini -p run").await;
    let branch = crate::gateway_codex::only_branch(&mut app, &session).await;
    crate::gateway::wait_for_transcript(&mut app.client, &session, &branch, |lines| {
        lines
            .last()
            .is_some_and(|l| l.starts_with("assistant") && l.contains(ANSWER))
    })
    .await;
    let nodes = ordered_log(&mut app, &session, &branch).await;
    let lines: Vec<String> = nodes.iter().map(line).collect();
    let at = |what: &str, from: usize, found: &dyn Fn(&pb::Node) -> bool| {
        nodes
            .iter()
            .skip(from)
            .position(found)
            .map(|i| i + from)
            .unwrap_or_else(|| panic!("{what} is recorded after node {from}: {lines:#?}"))
    };
    let asked = at("the prompt", 0, &|n| {
        role_text(n, pb::Role::User).contains(&prompt)
    });
    let called = at("the call", asked + 1, &|n| {
        calls(n).iter().any(|c| {
            c.name == SHELL
                && serde_json::from_str::<Value>(&c.arguments_json)
                    .ok()
                    .as_ref()
                    == Some(&args)
        })
    });
    let the_call = calls(&nodes[called])
        .into_iter()
        .find(|c| c.name == SHELL)
        .expect("the call");
    let resulted = at("its result", called + 1, &|n| {
        result_of(n).is_some_and(|r| r.call_id == the_call.call_id && r.name == SHELL)
    });
    let answered_at = at("the answer", resulted + 1, &|n| {
        role_text(n, pb::Role::Assistant).contains(ANSWER)
    });
    assert_eq!(
        (called, resulted, answered_at),
        (asked + 1, asked + 2, asked + 3),
        "the call, its result and the answer follow the prompt: {lines:#?}"
    );
    assert_eq!(
        answered_at + 1,
        nodes.len(),
        "the answer is the head: {lines:#?}"
    );
}

/// The key a Gemini client sends, in `x-goog-api-key` or as `?key=`, is forwarded as sent
/// (the query whole) and stored nowhere: not in a node, not in the database file. Plain HTTP,
/// streamed and not; no CLI needed.
#[tokio::test]
async fn gateway_forwards_the_gemini_key_and_never_stores_it() {
    let fake = FakeProvider::start().await;
    let (mut app, gateway) = gemini_gateway_app(&fake).await;
    let http = http_client();
    let header_key = "AIzaSy-ctxd-header-key-0123456789";
    let query_key = "AIzaSy-ctxd-query-key-9876543210";
    fake.script_all([Reply::text("First."), Reply::text("Second.")]);
    let prompt = user("Keep my key to yourself.");

    let first = http
        .post(format!("{gateway}/v1beta/models/{PRO}:generateContent"))
        .header("content-type", "application/json")
        .header("x-goog-api-key", header_key)
        .body(request(std::slice::from_ref(&prompt)).to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(first.status(), 200);
    let session = first
        .headers()
        .get("x-ctxd-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let answer: Value = first.json().await.expect("a JSON answer");
    assert_eq!(parts(&answer)[0]["text"], "First.", "{answer:#}");
    let upstream = fake.last_request();
    assert_eq!(upstream.header("x-goog-api-key"), Some(header_key));
    assert_eq!(upstream.query, None, "no query added");

    let query = format!("alt=sse&key={query_key}");
    let history = [prompt, model_turn(&answer), user("Again, by query.")];
    let second = http
        .post(format!(
            "{gateway}/v1beta/models/{PRO}:streamGenerateContent?{query}"
        ))
        .header("content-type", "application/json")
        .body(request(&history).to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(second.status(), 200);
    let bytes = second.bytes().await.expect("the stream");
    let whole = gemini_of_sse(&bytes).expect("a whole streamed answer");
    assert_eq!(parts(&whole)[0]["text"], "Second.", "{whole:#}");
    let upstream = fake.last_request();
    assert_eq!(
        upstream.query.as_deref(),
        Some(query.as_str()),
        "the query as sent"
    );
    assert_eq!(upstream.header("x-goog-api-key"), None, "no header added");
    for request in fake.requests() {
        crate::agents::assert_ctxd_headers_stripped(&request);
    }

    // Recorded, keys nowhere.
    let session = session.unwrap_or_else(|| panic!("x-ctxd-session-id on the answer"));
    let branch = crate::gateway_codex::only_branch(&mut app, &session).await;
    crate::gateway::wait_for_transcript(&mut app.client, &session, &branch, |lines| {
        lines.last().is_some_and(|l| l.contains("Second."))
    })
    .await;
    for node in app.log(&session, &branch).await {
        let shown = format!("{node:?}");
        let data: Vec<u8> = media_bytes(&node);
        for key in [header_key, query_key] {
            assert!(!shown.contains(key), "a node holds the key: {shown}");
            assert!(
                !data.windows(key.len()).any(|w| w == key.as_bytes()),
                "a node's media holds the key: {shown}"
            );
        }
    }
    let Some(path) = app.db.sqlite_path().map(Path::to_path_buf) else {
        return; // PostgreSQL: no file to read.
    };
    let wal = path.with_file_name(format!(
        "{}-wal",
        path.file_name().expect("a file name").to_string_lossy()
    ));
    for file in [path, wal].into_iter().filter(|f| f.exists()) {
        let bytes = std::fs::read(&file).expect("read the database file");
        for key in [header_key, query_key] {
            let found = bytes.windows(key.len()).any(|w| w == key.as_bytes());
            assert!(!found, "{} holds the key {key}", file.display());
        }
    }
}

/// The CLI in `auto` mode through the gateway: its routing side call (`generateContent` on
/// `gemini-3.5-flash-lite`, a JSON answer asked for) is forwarded and its answer reaches the
/// CLI, whose router follows it (a low score: a Flash model, not its default); the turn is
/// answered and printed.
#[tokio::test]
async fn gemini_cli_side_calls_pass_through_the_gateway() {
    let Some(gemini) = gemini() else { return };
    let fake = FakeProvider::start().await;
    let (_app, gateway) = gemini_gateway_app(&fake).await;
    let dirs = GeminiDirs::new();
    let answer = "Hello from the turn.";
    fake.script_all([routed(10), Reply::text(answer)]);

    let ran = run_bounded(
        "gemini -p (auto) through the gateway",
        dirs.command(&gemini, &gateway, &["--yolo", "-p", "Say hello."]),
    )
    .await;
    assert_printed(&ran, answer, &fake);
    assert_eq!(fake.refusals(), 0);
    let requests = fake.requests();
    assert_eq!(
        requests.len(),
        2,
        "the side call and the turn: {}",
        paths(&fake)
    );
    assert_side_call(&requests[0]);
    assert_eq!(requests[0].status, 200);
    let side = gemini_of_json(&requests[0]);
    assert!(
        parts(&side).iter().any(|p| p["text"]
            .as_str()
            .is_some_and(|t| t.contains("complexity_score"))),
        "the side call was answered with the score: {side:#}"
    );
    let turn_model = turn_model(&requests[1]);
    assert!(
        turn_model != PRO && turn_model.contains("flash"),
        "the CLI routed by the score the gateway relayed: {turn_model}"
    );
    assert_turn(&requests[1], &turn_model);
    assert_eq!(requests[1].status, 200);
}

/// Gemini is costed and forked like the other formats. A resend of the history reads it from
/// the fake's implicit cache (its prefix is past Gemini 3's 4,096-token minimum): the ledger
/// row says so, priced by the table's `gemini-3` entry at 0.1× reads. A resend that edits its
/// last question leaves the branch: the session forks, and the branch it had keeps its history.
#[tokio::test]
async fn gemini_calls_are_costed_and_an_edit_forks() {
    let fake = FakeProvider::start().await;
    let (mut app, gateway) = gemini_gateway_app(&fake).await;
    let http = http_client();
    fake.script_all([
        Reply::text("Read it."),
        Reply::text("Still there."),
        Reply::text("Another road."),
    ]);
    let call = |contents: Vec<Value>| {
        http.post(format!("{gateway}/v1beta/models/{PRO}:generateContent"))
            .header("content-type", "application/json")
            .header("x-goog-api-key", KEY)
            .body(request(&contents).to_string())
            .send()
    };
    let long = format!(
        "Read this log.\n{}",
        "error: disk quota exceeded\n".repeat(1200)
    );
    let first = call(vec![user(&long)]).await.expect("send");
    assert_eq!(first.status(), 200);
    let session = first
        .headers()
        .get("x-ctxd-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .expect("the session named on the answer");
    let answer: Value = first.json().await.expect("a JSON answer");
    let resent = vec![user(&long), model_turn(&answer), user("Is it still there?")];
    assert_eq!(call(resent).await.expect("send").status(), 200);

    let calls = crate::gateway::gateway_calls(&mut app.client, &session, 2).await;
    assert_eq!(calls.len(), 2, "{calls:#?}");
    for c in &calls {
        assert_eq!(
            (c.api.as_str(), c.priced_by.as_str()),
            ("gemini", "gemini-3")
        );
        assert!(c.input_tokens > 0 && c.output_tokens > 0, "{c:#?}");
    }
    assert_eq!(
        calls[0].cache_read_tokens, 0,
        "nothing cached yet: {:#?}",
        calls[0]
    );
    let read = calls[1].cache_read_tokens;
    assert!(
        read >= 4096,
        "the resent prefix read from the cache: {:#?}",
        calls[1]
    );
    let cost = calls[1].input_tokens as f64 + 0.1 * read as f64;
    assert!(
        (calls[1].cost - cost).abs() < 1e-6,
        "priced at the entry's 0.1x reads: {:#?}",
        calls[1]
    );
    let main = crate::gateway_codex::only_branch(&mut app, &session).await;

    let edited = vec![user(&long), model_turn(&answer), user("Is it gone now?")];
    let forked = call(edited).await.expect("send");
    assert_eq!(forked.status(), 200);
    let named = |h: &str| {
        let value = forked.headers().get(h).and_then(|v| v.to_str().ok());
        value.map(str::to_owned)
    };
    let (at, branch) = (named("x-ctxd-session-id"), named("x-ctxd-branch"));
    assert_eq!(at, Some(session.clone()), "an edit stays in its session");
    assert_ne!(
        branch,
        Some(main.clone()),
        "and goes on a branch of its own"
    );
    let answer: Value = forked.json().await.expect("a JSON answer");
    assert_eq!(parts(&answer)[0]["text"], "Another road.", "{answer:#}");
    crate::gateway::gateway_calls(&mut app.client, &session, 3).await;
    let branches: Vec<String> = app
        .branches(&session)
        .await
        .into_iter()
        .filter(|b| !b.head_id.is_empty())
        .map(|b| b.name)
        .collect();
    assert_eq!(branches.len(), 2, "the edit forked: {branches:?}");
    let kept = app.log(&session, &main).await;
    assert_eq!(kept.len(), 4, "the first branch keeps its four nodes");
}

// ================================================================ the Gemini CLI

/// A temp dir for one test's CLI runs: `work` (its cwd; the CLI names its project by this
/// directory's name) and `home` with `~/.gemini/settings.json`.
struct GeminiDirs {
    /// The temp dir the others are in (removed when dropped).
    _root: tempfile::TempDir,
    work: PathBuf,
    home: PathBuf,
}

impl GeminiDirs {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let work = root.path().join("work");
        let home = root.path().join("home");
        let settings = home.join(".gemini");
        for dir in [&work, &settings] {
            std::fs::create_dir_all(dir).expect("a temp dir");
        }
        // The key's auth, and nothing that reaches beyond loopback: no auto-update nor its
        // check, no usage statistics, no telemetry.
        let config = json!({
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
            "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false},
        });
        std::fs::write(settings.join("settings.json"), config.to_string())
            .expect("write settings.json");
        Self {
            _root: root,
            work,
            home,
        }
    }

    /// The CLI with `args`, run in `work` against `base_url` (without `/v1beta`) with nothing
    /// but this dir's environment (the workspace trusted, so its tools run headless).
    fn command(&self, gemini: &Path, base_url: &str, args: &[&str]) -> Command {
        let mut command = Command::new(gemini);
        command
            .args(args)
            .current_dir(&self.work)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("TERM", "dumb")
            .env("GOOGLE_GEMINI_BASE_URL", base_url)
            .env("GEMINI_API_KEY", KEY)
            .env("GEMINI_CLI_TRUST_WORKSPACE", "true");
        command
    }
}

/// The CLI printed the scripted answer and ran the scripted command (`out.txt` holds the
/// marker).
fn assert_ran_the_script(ran: &Ran, dirs: &GeminiDirs, marker: &str, fake: &FakeProvider) {
    assert_printed(ran, ANSWER, fake);
    assert_eq!(
        std::fs::read_to_string(dirs.work.join("out.txt")).ok(),
        Some(format!("{marker}\n")),
        "the CLI ran the scripted command"
    );
}

/// The Gemini CLI, or `None` (the test skips) when it is missing and not required.
fn gemini() -> Option<PathBuf> {
    crate::agents::installed(
        "Gemini CLI",
        "gemini",
        "CTXD_TEST_GEMINI",
        "@google/gemini-cli",
    )
}

/// The answer to the CLI's routing side call: its JSON with a complexity `score` (from 1 to
/// 100; a low one routes the turn to a Flash model).
fn routed(score: u32) -> Reply {
    Reply::text(
        json!({"complexity_reasoning": "A one-step task.", "complexity_score": score}).to_string(),
    )
}

// ================================================================ checks

/// The CLI exited 0 printing `answer`.
#[track_caller]
fn assert_printed(ran: &Ran, answer: &str, fake: &FakeProvider) {
    assert!(
        ran.status.success() && ran.stdout.trim() == answer,
        "gemini printed {answer:?}\nstatus: {}\nstdout: {}\nstderr: {}\nupstream requests: {}",
        ran.status,
        ran.stdout,
        ran.stderr,
        paths(fake)
    );
}

/// The model of a turn's request (`/v1beta/models/{model}:streamGenerateContent`).
fn turn_model(turn: &Recorded) -> String {
    turn.path
        .strip_prefix("/v1beta/models/")
        .and_then(|rest| rest.strip_suffix(":streamGenerateContent"))
        .unwrap_or_else(|| panic!("a turn is streamed: {}", turn.path))
        .to_owned()
}

/// A step of a turn: streamed as SSE on `model`, with the CLI's key, system instruction, tools
/// (the shell's among them) and thinking config.
#[track_caller]
fn assert_turn(turn: &Recorded, model: &str) {
    assert_eq!(turn.method, "POST");
    assert_eq!(
        turn.path,
        format!("/v1beta/models/{model}:streamGenerateContent")
    );
    assert_eq!(turn.query.as_deref(), Some("alt=sse"));
    assert_eq!(turn.header("x-goog-api-key"), Some(KEY), "the CLI's key");
    assert!(turn.body["systemInstruction"]["parts"][0]["text"].is_string());
    let tools: Vec<&str> = turn.body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["functionDeclarations"].as_array().into_iter().flatten())
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(
        tools.contains(&SHELL),
        "the shell tool is declared: {tools:?}"
    );
    assert_eq!(
        turn.body["generationConfig"]["thinkingConfig"]["includeThoughts"],
        true
    );
}

/// The routing side call: `generateContent` on Flash-Lite, asking for JSON with a
/// `complexity_score`.
#[track_caller]
fn assert_side_call(call: &Recorded) {
    assert_eq!(
        call.path,
        format!("/v1beta/models/{FLASH_LITE}:generateContent"),
        "the side call"
    );
    assert_eq!(call.header("x-goog-api-key"), Some(KEY));
    let config = &call.body["generationConfig"];
    assert_eq!(config["responseMimeType"], "application/json");
    assert!(
        config["responseJsonSchema"]["properties"]["complexity_score"].is_object(),
        "{config:#}"
    );
}

/// Every `functionCall` part any request carried bears a signature the fake gave a call of
/// that name, byte for byte (or one of Google's dummy values).
#[track_caller]
fn assert_signatures_kept(fake: &FakeProvider) {
    let given = fake.gemini_signatures();
    for request in fake.requests() {
        for content in request.contents() {
            for part in content["parts"].as_array().into_iter().flatten() {
                let Some(call) = part.get("functionCall") else {
                    continue;
                };
                let signature = part["thoughtSignature"].as_str().unwrap_or_default();
                let name = call["name"].as_str().unwrap_or_default();
                assert!(
                    given.iter().any(|(n, s)| n == name && s == signature),
                    "the call went upstream with the signature the fake gave it: {part}\n\
                     given: {given:?}"
                );
            }
        }
    }
}

/// The model content with a `functionCall` and the user content right after it holding its
/// `functionResponse`: the call part and the response part.
fn call_and_result(contents: &[Value]) -> Option<(Value, Value)> {
    contents.windows(2).find_map(|pair| {
        let call = pair[0]["parts"]
            .as_array()?
            .iter()
            .find(|p| p.get("functionCall").is_some())?;
        let result = pair[1]["parts"]
            .as_array()?
            .iter()
            .find(|p| p.get("functionResponse").is_some())?;
        (pair[0]["role"] == "model").then(|| (call.clone(), result.clone()))
    })
}

/// The `GenerateContentResponse` a non-streamed request was answered with.
fn gemini_of_json(call: &Recorded) -> Value {
    serde_json::from_slice(&call.response)
        .unwrap_or_else(|e| panic!("a JSON answer ({e}): {}", call.response_text()))
}

// ================================================================ the session, read back

/// `branch` of `session`, oldest first.
async fn ordered_log(app: &mut TestApp, session: &str, branch: &str) -> Vec<pb::Node> {
    let mut nodes = app.log(session, branch).await;
    nodes.reverse();
    nodes
}

fn message(node: &pb::Node) -> Option<&pb::Message> {
    match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(pb::node_input::Kind::Message(m)) => Some(m),
        _ => None,
    }
}

fn result_of(node: &pb::Node) -> Option<&pb::ToolResult> {
    match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(pb::node_input::Kind::ToolResult(r)) => Some(r),
        _ => None,
    }
}

/// The text parts of a message of `role` (empty for any other node).
fn role_text(node: &pb::Node, role: pb::Role) -> String {
    message(node)
        .filter(|m| m.role == role as i32)
        .map(|m| texts(&m.parts))
        .unwrap_or_default()
}

fn calls(node: &pb::Node) -> Vec<pb::ToolCall> {
    message(node)
        .map(|m| m.tool_calls.clone())
        .unwrap_or_default()
}

fn texts(parts: &[pb::ContentPart]) -> String {
    parts
        .iter()
        .filter_map(|p| match &p.part {
            Some(pb::content_part::Part::Text(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The bytes of a node's media parts.
fn media_bytes(node: &pb::Node) -> Vec<u8> {
    let parts = match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(pb::node_input::Kind::Message(m)) => &m.parts,
        Some(pb::node_input::Kind::ToolResult(r)) => &r.parts,
        _ => return Vec::new(),
    };
    parts
        .iter()
        .filter_map(|p| match &p.part {
            Some(pb::content_part::Part::Media(m)) => match &m.source {
                Some(pb::media::Source::Data(data)) => Some(data.clone()),
                _ => None,
            },
            _ => None,
        })
        .flatten()
        .collect()
}

/// A node as one line, for failure messages.
fn line(node: &pb::Node) -> String {
    if let Some(m) = message(node) {
        let role = pb::Role::try_from(m.role).map_or("?".into(), |r| format!("{r:?}"));
        let mut line = format!(
            "{role}: {}",
            texts(&m.parts).chars().take(120).collect::<String>()
        );
        for call in &m.tool_calls {
            line.push_str(&format!(
                " -> {} {} {}",
                call.call_id, call.name, call.arguments_json
            ));
        }
        return line;
    }
    if let Some(r) = result_of(node) {
        return format!("tool[{} {}]: {}", r.call_id, r.name, texts(&r.parts));
    }
    format!("{:?}", node.content)
}
