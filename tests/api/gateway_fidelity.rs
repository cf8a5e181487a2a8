//! What the gateway forwards is what a careful human would have sent: the client's breakpoints
//! stay on the content they marked through a sub-agent's function, what the model has not seen
//! reaches it as the client sent it at every step, and the window is the request's own (the 1M
//! beta, a ceiling `max_tokens` not taken as the answer's size, an operator's setting, a model
//! ctxd does not know). Through the real server, its gateway and the fake provider.

use ctxd::gateway::{GatewayPolicy, Window};
use ctxd::server::Options;
use serde_json::{Value, json};

use crate::fake_provider::*;
use crate::gateway::*;
use crate::gateway_codex::only_branch;
use crate::helpers::*;

const SESSION: &str = "6f1c2a34-0000-4000-8000-00000000fd01";

fn metadata() -> Value {
    json!({"user_id": json!({"session_id": SESSION}).to_string()})
}

/// A Claude Code shaped request: system blocks with a breakpoint on the last, the session in
/// `metadata`, streamed, and `messages` as given.
fn claude_code(messages: Value) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=0"},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "metadata": metadata(),
        "messages": messages,
    })
}

/// `message` with a breakpoint on its last block (a string content becomes one text block).
fn marked(mut message: Value) -> Value {
    if let Some(s) = message["content"].as_str() {
        message["content"] = json!([{"type": "text", "text": s}]);
    }
    if let Some(Value::Object(last)) = message["content"].as_array_mut().and_then(|b| b.last_mut())
    {
        last.insert("cache_control".into(), json!({"type": "ephemeral"}));
    }
    message
}

/// Messages of `body` as the client sent them, with a marker only where `marks` says.
fn with_marks(messages: &[Value], marks: &[usize]) -> Value {
    Value::Array(
        messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                if marks.contains(&i) {
                    marked(m.clone())
                } else {
                    m.clone()
                }
            })
            .collect(),
    )
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": id, "name": name, "input": input},
    ]})
}

fn tool_result(id: &str, text: &str) -> Value {
    json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id, "content": text},
    ]})
}

/// `chars` characters of text unique to `seed`, as a file's lines.
fn output(seed: usize, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 64);
    let mut line = 0;
    while s.len() < chars {
        s.push_str(&format!(
            "{seed:04} line {line:05}: fn item_{line}() -> u32 {{ {line} }}\n"
        ));
        line += 1;
    }
    s.truncate(chars);
    s
}

#[tokio::test]
async fn breakpoints_stay_on_their_content_after_a_sub_agent() {
    let mut gw = start().await;
    let prompt = "Find where the config is loaded and report the file.";
    // In the foreground: its answer is the call's result (a background agent: see
    // `gateway_fidelity::a_background_sub_agent_is_a_function_of_its_parent`).
    let task = json!({"description": "find config", "prompt": prompt,
                      "subagent_type": "general-purpose", "run_in_background": false});
    let u1 = json!({"role": "user", "content": [{"type": "text", "text": "Where is the config loaded?"}]});

    gw.fake
        .script(Reply::tool_use_id("toolu_agent", "Agent", task.clone()));
    let first = gw
        .messages(&claude_code(with_marks(std::slice::from_ref(&u1), &[0])))
        .await
        .ok();
    let (session, branch) = (first.session(), first.branch());
    gw.answered(&session, &branch, 2).await;

    // The sub-agent's first call reaches the gateway before the parent's next one.
    gw.fake
        .script(Reply::text("It is loaded in src/config.rs."));
    let sub = claude_code(with_marks(
        &[json!({"role": "user", "content": [{"type": "text", "text": prompt}]})],
        &[0],
    ));
    let answer = gw.messages(&sub).await.ok();
    assert!(
        answer.header("x-ctxd-function-id").is_some(),
        "the sub-agent's call is its parent's function"
    );

    // The parent goes on: every later call resends its history with the breakpoint moved to
    // its newest message, and Claude Code keeps one on an earlier message too.
    let call = tool_use("toolu_agent", "Agent", task);
    let result = tool_result("toolu_agent", "It is loaded in src/config.rs.");
    gw.fake
        .script(Reply::text("The config is loaded in src/config.rs."));
    let mut history = vec![u1, call, result];
    for (turn, marks) in [(0, vec![2]), (1, vec![2, 4]), (2, vec![4, 6])] {
        let body = claude_code(with_marks(&history, &marks));
        let sent = gw.messages(&body).await.ok();
        assert_eq!(sent.session(), session, "call {turn}: the same session");
        assert_eq!(sent.branch(), branch, "call {turn}: the same branch");
        let forwarded = gw.last_upstream().body;
        assert_eq!(
            forwarded["messages"], body["messages"],
            "call {turn}: nothing reduced, so every message goes as the client sent it, \
             breakpoints included"
        );
        assert_eq!(
            markers(&forwarded["messages"]),
            marks.len(),
            "call {turn}: every client breakpoint forwarded"
        );
        assert_eq!(
            forwarded["system"], body["system"],
            "the system blocks as sent"
        );
        let reply = format!("answer {turn}");
        gw.fake.script(Reply::text(reply.clone()));
        history.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": if turn == 0 { "The config is loaded in src/config.rs.".to_owned() } else { format!("answer {}", turn - 1) }},
        ]}));
        history.push(json!({"role": "user", "content": [{"type": "text", "text": format!("and then {turn}?")}]}));
    }
    let branches: Vec<_> = gw
        .app
        .branches(&session)
        .await
        .into_iter()
        .filter(|b| !b.head_id.is_empty())
        .collect();
    assert_eq!(branches.len(), 1, "nothing forked: {branches:?}");
}

/// The history of a session that read `n` files of `chars` characters, one call each.
fn reads(n: usize, chars: usize) -> Vec<Value> {
    let mut history =
        vec![json!({"role": "user", "content": "Read the files and summarise them."})];
    for k in 1..=n {
        let id = format!("toolu_read_{k:02}");
        history.push(tool_use(
            &id,
            "Read",
            json!({"file_path": format!("src/f{k}.rs")}),
        ));
        history.push(tool_result(&id, &output(k, chars)));
    }
    history
}

#[tokio::test]
async fn the_newest_result_is_never_cut_at_a_count_step() {
    let gw = start().await;
    // 40 results of 4 KB, resent whole on every call: a step comes once it pays back.
    let n = 40;
    let full = reads(n, 4_000);
    let mut stepped_at = None;
    for k in 1..=n {
        let id = format!("toolu_read_{:02}", k + 1);
        if k < n {
            gw.fake.script(Reply::tool_use_id(
                &id,
                "Read",
                json!({"file_path": format!("src/f{}.rs", k + 1)}),
            ));
        }
        let history = &full[..1 + 2 * k];
        let body = claude_code(with_marks(history, &[history.len() - 1]));
        gw.messages(&body).await.ok();
        let forwarded = gw.last_upstream().body;
        let sent = forwarded["messages"].as_array().expect("messages").clone();
        assert_eq!(
            sent.last(),
            body["messages"].as_array().and_then(|m| m.last()),
            "call {k}: the result the model has not seen goes as the client sent it"
        );
        let first = &sent[2]["content"][0]["content"];
        let first_len = first.as_str().map_or(0, str::len);
        if stepped_at.is_none() && first_len < 1_000 {
            stepped_at = Some(k);
            assert_eq!(
                markers(&forwarded["messages"]),
                1,
                "the client's breakpoint is on the newest message, unchanged"
            );
        }
    }
    let k = stepped_at.expect("a step cleared the oldest result");
    assert!(
        k > 10,
        "a step is earned back before it is taken (call {k})"
    );
}

/// A server whose gateway has `windows` set.
async fn start_with_windows(windows: Vec<Window>) -> Gw {
    start_configured(FakeProvider::start().await, None, Options::default(), |g| {
        g.policy = GatewayPolicy::Stepped;
        g.windows = windows;
    })
    .await
}

/// Sends `history` (then, the model having answered, `history` with the answer and one more
/// user message, so the model has seen all of `history`) as `model` with `max_tokens` and
/// `extra` headers; the second forwarded request and the client's.
async fn seen_twice(
    gw: &Gw,
    model: &str,
    max_tokens: u64,
    history: &[Value],
    extra: &[(&str, &str)],
) -> (Value, Value) {
    let body = |messages: &[Value]| {
        let mut b = claude_code(Value::Array(messages.to_vec()));
        b["model"] = json!(model);
        b["max_tokens"] = json!(max_tokens);
        b
    };
    gw.fake.script(Reply::text("noted"));
    gw.messages_with(&body(history), extra).await.ok();
    let mut next = history.to_vec();
    next.push(json!({"role": "assistant", "content": [{"type": "text", "text": "noted"}]}));
    next.push(json!({"role": "user", "content": "Go on."}));
    let client = body(&next);
    gw.messages_with(&client, extra).await.ok();
    (
        gw.last_upstream().body["messages"].clone(),
        client["messages"].clone(),
    )
}

#[tokio::test]
async fn the_one_million_beta_is_the_window() {
    // 9 reads of 110 KB (fewer than a step needs): about 248k tokens, over a 200k window,
    // within 1M.
    let history = reads(9, 110_000);
    let gw = start().await;
    let (forwarded, client) = seen_twice(
        &gw,
        "claude-sonnet-4-5",
        32_000,
        &history,
        &[(
            "anthropic-beta",
            "claude-code-20250219,context-1m-2025-08-07",
        )],
    )
    .await;
    assert_eq!(forwarded, client, "within the 1M window nothing is cut");

    let gw = start().await;
    let (forwarded, client) = seen_twice(&gw, "claude-sonnet-4-5", 32_000, &history, &[]).await;
    assert_ne!(
        forwarded, client,
        "without the beta the same history is over the 200k window and reduced"
    );
    assert_eq!(
        forwarded.as_array().and_then(|m| m.last()),
        client.as_array().and_then(|m| m.last()),
        "the newest message, unseen, as sent"
    );
}

#[tokio::test]
async fn a_ceiling_max_tokens_is_not_the_answers_reserve() {
    // 7 reads of 60 KB: about 105k tokens. Claude Code asks for max_tokens 128,000; taken as
    // the answer's size it would leave 72k of a 200k window.
    let history = reads(7, 60_000);
    let gw = start().await;
    let (forwarded, client) = seen_twice(&gw, "claude-sonnet-4-5", 128_000, &history, &[]).await;
    assert_eq!(
        forwarded, client,
        "105k tokens fit a 200k window: nothing is cut"
    );
}

#[tokio::test]
async fn a_model_ctxd_does_not_know_is_never_cut_by_budget() {
    let history = reads(9, 110_000);
    let gw = start().await;
    let (forwarded, client) = seen_twice(&gw, "acme-local-70b", 4096, &history, &[]).await;
    assert_eq!(
        forwarded, client,
        "an unknown model's window is not guessed"
    );
}

#[tokio::test]
async fn an_operators_context_window_is_the_budget() {
    let history = reads(7, 60_000);
    let gw = start_with_windows(vec![
        Window::parse("claude-sonnet-*=100000").expect("a window"),
    ])
    .await;
    let (forwarded, client) = seen_twice(&gw, "claude-sonnet-4-5", 8192, &history, &[]).await;
    assert_ne!(
        forwarded, client,
        "105k tokens are over a 100k window set by the operator"
    );

    for bad in ["claude", "claude=", "claude=many", "=100000", "claude=12"] {
        let error = Window::parse(bad).expect_err(bad);
        assert!(error.contains("--context-window"), "{bad}: {error}");
    }
}

// ---------------------------------------------------------------- edges

#[tokio::test]
async fn a_body_over_the_limit_is_413_in_the_providers_shape() {
    let mut gw = start_configured(FakeProvider::start().await, None, Options::default(), |g| {
        g.max_body_bytes = 64 * 1024
    })
    .await;
    let big = json!([{"role": "user", "content": "x".repeat(100 * 1024)}]);
    let answer = gw.messages(&anthropic(big.clone())).await;
    assert_eq!(answer.status, 413, "{}", answer.text());
    let error = answer.json();
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["error"]["type"], "request_too_large", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("body:")),
        "{error}"
    );
    let answer = gw.chat(&openai(big)).await;
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert_eq!(answer.json()["error"]["param"], "body");
    assert!(gw.fake.requests().is_empty(), "nothing forwarded");
    assert!(sessions(&mut gw.app).await.is_empty(), "nothing recorded");
}

/// A client that announces a body over the limit is answered at once, before it sends a byte
/// of it: the gateway holds no connection waiting for 300 MiB.
#[tokio::test]
async fn an_announced_body_over_the_limit_is_413_before_it_is_read() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut gw = start().await;
    let addr = gw.url.trim_start_matches("http://").to_owned();
    for (path, shape) in [
        ("/v1/messages", "request_too_large"),
        ("/v1/chat/completions", ""),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             anthropic-version: 2023-06-01\r\ncontent-length: {}\r\n\r\n",
            300u64 << 20
        );
        tcp.write_all(head.as_bytes()).await.expect("head");
        // Nothing of the body follows; a gateway that waited for it would never answer.
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), tcp.read(&mut answer))
            .await
            .expect("answered before the body was sent")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(
            answer.contains("over the ctxd gateway's limit"),
            "{path}: {answer}"
        );
        assert!(answer.contains(shape), "{path}: {answer}");
    }
    assert!(gw.fake.requests().is_empty(), "nothing forwarded");
    assert!(sessions(&mut gw.app).await.is_empty(), "nothing recorded");
}

#[tokio::test]
async fn a_request_that_cannot_be_recorded_leaves_no_session_behind() {
    let mut gw = start().await;
    // A result for a call that was never made: forwarded as it came, and recorded nowhere.
    let body = anthropic(json!([
        user_msg("hello"),
        tool_result("toolu_nobody", "an orphan result"),
    ]));
    let answer = gw.messages(&body).await.ok();
    assert!(answer.header("x-ctxd-session-id").is_none());
    assert_eq!(gw.last_upstream().body, body, "forwarded as received");
    assert!(
        sessions(&mut gw.app).await.is_empty(),
        "no empty session left behind"
    );
}

// ---------------------------------------------------------------- the agent's own compaction

const COMPACT_PROMPT: &str = "Your task is to create a detailed summary of the conversation so \
    far, paying close attention to the user's explicit requests and your previous actions.";

fn continued(summary: &str) -> String {
    format!(
        "This session is being continued from a previous conversation that ran out of context. \
         The summary below covers the earlier portion of the conversation.\n\nSummary:\n{summary}"
    )
}

/// What Claude Code 2.1.x may send before its summary when it opens the conversation after a
/// compaction: the files it read again, as system reminders.
fn reread(file: &str) -> [String; 2] {
    [
        format!(
            "<system-reminder>\nCalled the Read tool with the following input: \
             {{\"file_path\":\"{file}\"}}\n</system-reminder>"
        ),
        format!(
            "<system-reminder>\nResult of calling the Read tool: \"1\\tcontents of {file}\"\n\
             </system-reminder>"
        ),
    ]
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

#[tokio::test]
async fn claude_codes_compaction_is_a_summary_over_the_same_session() {
    let summary = "1. The user asked to read 22 files.\n2. All were read; nothing is pending.";
    let [called, result] = reread("/work/src/lib.rs");
    // The summary alone; after the files read again, in its message; in messages of their own.
    let openings = [
        vec![json!({"role": "user", "content": [text_block(&continued(summary))]})],
        vec![json!({"role": "user", "content": [
            text_block(&called), text_block(&result), text_block(&continued(summary))
        ]})],
        vec![
            json!({"role": "user", "content": [text_block(&called)]}),
            json!({"role": "user", "content": [text_block(&result)]}),
            json!({"role": "user", "content": [text_block(&continued(summary))]}),
        ],
    ];
    for opening in openings {
        compaction_continues(summary, opening).await;
    }
}

/// A conversation compacted by Claude Code, continued by one that opens with `opening`: one
/// session, one branch, the agent's summary laid over what it replaced.
async fn compaction_continues(summary: &str, opening: Vec<Value>) {
    let shape = format!("{opening:?}");
    let texts: Vec<String> = opening
        .iter()
        .map(|m| {
            m["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    let laid = texts.join("\n");
    let mut gw = start().await;
    // 22 reads of 6 KB: a count step would clear the oldest of them.
    let mut history = reads(22, 6_000);
    gw.fake.script(Reply::text("I have read them all."));
    let first = gw
        .messages(&claude_code(with_marks(&history, &[history.len() - 1])))
        .await
        .ok();
    let (session, branch) = (first.session(), first.branch());
    history.push(json!({"role": "assistant", "content": [{"type": "text", "text": "I have read them all."}]}));

    // The summary request: the whole history and the prompt, forwarded with nothing reduced.
    gw.fake.script(Reply::text(format!(
        "<analysis>notes</analysis>\n<summary>\n{summary}\n</summary>"
    )));
    let mut ask = history.clone();
    ask.push(json!({"role": "user", "content": [{"type": "text", "text": COMPACT_PROMPT}]}));
    let body = claude_code(with_marks(&ask, &[ask.len() - 1]));
    let asked = gw.messages(&body).await.ok();
    assert_eq!(
        (asked.session(), asked.branch()),
        (session.clone(), branch.clone())
    );
    assert_eq!(
        gw.last_upstream().body["messages"],
        body["messages"],
        "the summary request goes as the agent sent it: nothing it must summarise is cut"
    );

    // The conversation after it opens with the summary: the same session, the same branch.
    gw.fake.script(Reply::text("Continuing."));
    let n = opening.len();
    let mut after = opening.clone();
    after.push(json!({"role": "user", "content": "Now write the report."}));
    let answer = gw
        .messages(&claude_code(with_marks(&after, &[n])))
        .await
        .ok();
    assert_eq!(
        (answer.session(), answer.branch()),
        (session.clone(), branch.clone()),
        "the compacted conversation continues its session and branch: {shape}"
    );
    let forwarded = gw.last_upstream().body["messages"].clone();
    assert!(
        forwarded[0]
            .to_string()
            .contains(&continued(summary).replace('\n', "\\n")),
        "the agent's summary reaches the model: {forwarded:#}"
    );
    let blocks = forwarded
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        blocks.last().map(|b| &b["text"]),
        Some(&json!("Now write the report.")),
        "the new message after it, as sent: {forwarded:#}"
    );
    assert_eq!(markers(&forwarded), 1, "its breakpoint forwarded");

    // And on: each call appends only what is new, on the same branch.
    let mut next = after.clone();
    next.push(json!({"role": "assistant", "content": [{"type": "text", "text": "Continuing."}]}));
    next.push(json!({"role": "user", "content": "Thanks."}));
    gw.fake.script(Reply::text("Done."));
    let body = claude_code(with_marks(&next, &[n + 2]));
    let again = gw.messages(&body).await.ok();
    assert_eq!(
        (again.session(), again.branch()),
        (session.clone(), branch.clone())
    );
    let forwarded = gw.last_upstream().body["messages"].clone();
    let forwarded = forwarded.as_array().expect("messages");
    // The summary and the user message after it are one user turn, as the API takes them.
    assert_eq!(
        forwarded[1..],
        body["messages"].as_array().expect("messages")[n + 1..],
        "what follows goes as the client sent it"
    );
    assert_eq!(
        markers(&Value::Array(forwarded.clone())),
        1,
        "the client's breakpoint forwarded"
    );

    let listed = gw.app.list_summaries(&session, &branch).await;
    assert_eq!(listed.summaries.len(), 1, "{listed:?}");
    assert_eq!(listed.summaries[0].model, "agent:claude-code");
    assert_eq!(listed.summaries[0].text, laid, "{shape}");
    assert_eq!(gw.app.get_session(&session).await.compaction_count, 1);
    assert_eq!(
        sessions(&mut gw.app).await.len(),
        1,
        "one session for the whole run"
    );
    let heads: Vec<_> = gw
        .app
        .branches(&session)
        .await
        .into_iter()
        .filter(|b| !b.head_id.is_empty())
        .collect();
    assert_eq!(heads.len(), 1, "one branch: {heads:?}");
    let log = gw.app.log(&session, &branch).await;
    let newest: Vec<String> = log.iter().take(4).map(describe).collect();
    assert_eq!(
        newest,
        [
            "assistant: Done.",
            "user: Thanks.",
            "assistant: Continuing.",
            "user: Now write the report.",
        ],
        "the continuation after the summary answer"
    );
}

// ---------------------------------------------------------------- the ledger

#[tokio::test]
async fn the_ledger_says_per_call_what_was_kept_and_why_not() {
    let mut gw = start().await;
    // A session that reads 40 files of 4 KB, resent whole with Claude Code's breakpoints: the
    // gateway steps once a step pays back.
    let n = 40;
    let full = reads(n, 4_000);
    let mut session = String::new();
    for k in 1..=n {
        if k < n {
            gw.fake.script(Reply::tool_use_id(
                format!("toolu_read_{:02}", k + 1),
                "Read",
                json!({"file_path": format!("src/f{}.rs", k + 1)}),
            ));
        }
        let history = &full[..1 + 2 * k];
        let answer = gw
            .messages(&claude_code(with_marks(history, &[history.len() - 1])))
            .await
            .ok();
        session = answer.session();
    }
    let calls = crate::gateway::gateway_calls(&mut gw.app.client, &session, n).await;
    assert_eq!(calls.len(), n, "one row a call");
    // The first call is the first; after it, the prefix is kept but where a step was taken,
    // and each step says the calls its saving needed to pay it back, a small share of those
    // the session had run.
    let mut steps = 0;
    for (k, call) in calls.iter().enumerate() {
        let change = ctxd::domain::PrefixChange::parse(&call.change);
        match (k, change) {
            (0, Some(ctxd::domain::PrefixChange::First)) => {}
            (
                _,
                Some(ctxd::domain::PrefixChange::Step {
                    payback_calls: Some(payback),
                    ..
                }),
            ) => {
                steps += 1;
                // The request of call `k` (from 0) holds `k + 1` calls of the model.
                assert!(
                    payback as usize * ctxd::gateway::policy().payback_odds <= k + 1,
                    "call {k}: a step that pays back in {payback} calls"
                );
            }
            (k, None) if k > 0 && call.change.is_empty() => {
                assert!(call.kept_tokens > 0, "call {k} kept its prefix: {call:?}");
            }
            _ => panic!("call {k}: unexpected change {:?}", call.change),
        }
        assert!(
            !call.unexplained_miss,
            "call {k}: the provider read what was kept: {call:?}"
        );
    }
    assert!(steps >= 1, "the session stepped");
}

#[tokio::test]
async fn a_background_sub_agent_is_a_function_of_its_parent() {
    // Claude Code runs an `Agent` call in the background unless told otherwise: the call is
    // answered "launched" at once, the parent goes on, and the sub-agent's first request reaches
    // the gateway before or after the parent's next one. Either way it is one function.
    for sub_agent_first in [true, false] {
        background_sub_agent(sub_agent_first).await;
    }
}

async fn background_sub_agent(sub_agent_first: bool) {
    let order = if sub_agent_first {
        "sub-agent first"
    } else {
        "parent first"
    };
    let mut gw = start().await;
    let prompt = "Audit the appendix and report whether it agrees with its data.";
    let task =
        json!({"description": "audit", "prompt": prompt, "subagent_type": "general-purpose"});
    let u1 = json!({"role": "user", "content": [{"type": "text", "text": "Audit the reports."}]});
    gw.fake
        .script(Reply::tool_use_id("toolu_bg", "Agent", task.clone()));
    let first = gw.messages(&claude_code(json!([u1]))).await.ok();
    let (parent, branch) = (first.session(), first.branch());
    gw.answered(&parent, &branch, 2).await;

    let opening = json!({"role": "user", "content": [{"type": "text", "text": prompt}]});
    let call = tool_use("toolu_bg", "Agent", task);
    let launched = tool_result("toolu_bg", "Async agent launched successfully. agentId: a1");
    let sub_agent_opening = claude_code(json!([opening]));
    let sub_agent_reply =
        || Reply::tool_use_id("toolu_sub_1", "Read", json!({"file_path": "a.txt"}));
    let (sub, sub_sent, next) = if sub_agent_first {
        gw.fake.script(sub_agent_reply());
        let sub = gw.messages(&sub_agent_opening).await.ok();
        let sub_sent = gw.last_upstream().messages().len();
        gw.fake.script(Reply::text("Waiting for the audit."));
        let next = gw
            .messages(&claude_code(json!([u1, call, launched])))
            .await
            .ok();
        (sub, sub_sent, next)
    } else {
        gw.fake.script(Reply::text("Waiting for the audit."));
        let next = gw
            .messages(&claude_code(json!([u1, call, launched])))
            .await
            .ok();
        gw.answered(&parent, &branch, 5).await;
        gw.fake.script(sub_agent_reply());
        let sub = gw.messages(&sub_agent_opening).await.ok();
        (sub, gw.last_upstream().messages().len(), next)
    };
    let function = sub
        .header("x-ctxd-function-id")
        .unwrap_or_else(|| panic!("{order}: the sub-agent's call is its parent's function"));
    assert_eq!(sub.session(), parent, "{order}: in the parent's session");
    assert_eq!(
        (next.session(), next.branch()),
        (parent.clone(), branch.clone()),
        "{order}: the parent goes on where it was"
    );
    assert_eq!(
        sub_sent, 1,
        "{order}: the sub-agent's upstream request is its own conversation"
    );

    // The sub-agent goes on in its function; the parent gets its report as a notification.
    gw.fake.script(Reply::text("They agree."));
    let again = gw
        .messages(&claude_code(json!([
            opening,
            tool_use("toolu_sub_1", "Read", json!({"file_path": "a.txt"})),
            tool_result("toolu_sub_1", "the appendix"),
        ])))
        .await
        .ok();
    assert_eq!(
        again.header("x-ctxd-function-id").as_deref(),
        Some(function.as_str()),
        "{order}: the same function"
    );
    gw.answered(&parent, &branch, 5).await;
    gw.fake.script(Reply::text("The audit agrees."));
    let notified = claude_code(with_marks(
        &[
            u1,
            call,
            launched,
            json!({"role": "assistant", "content": [{"type": "text", "text": "Waiting for the audit."}]}),
            json!({"role": "user", "content": [{"type": "text", "text": "<task-notification>They agree.</task-notification>"}]}),
        ],
        &[2, 4],
    ));
    let last = gw.messages(&notified).await.ok();
    assert_eq!(
        (last.session(), last.branch()),
        (parent.clone(), branch.clone())
    );
    let forwarded = gw.last_upstream().body;
    assert_eq!(
        forwarded["messages"], notified["messages"],
        "{order}: the parent's history goes as sent, breakpoints included"
    );

    // Stored: the parent's chain holds the function's call before the launch's result, and the
    // function's chain holds the sub-agent's conversation, each message once, on one branch.
    gw.answered(&parent, &branch, 7).await;
    assert_eq!(only_branch(&mut gw.app, &parent).await, branch, "{order}");
    let kinds: Vec<String> = gw
        .app
        .log(&parent, &branch)
        .await
        .iter()
        .rev()
        .map(|n| {
            use ctxd::api::pb::node_input::Kind;
            match n.content.as_ref().and_then(|c| c.kind.as_ref()) {
                Some(Kind::FunctionCall(f)) => format!("function_call[{}]", f.call_id),
                _ => describe(n),
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user: Audit the reports.",
            "assistant:  -> toolu_bg",
            "function_call[toolu_bg]",
            "tool[toolu_bg]: Async agent launched successfully. agentId: a1",
            "assistant: Waiting for the audit.",
            "user: <task-notification>They agree.</task-notification>",
            "assistant: The audit agrees.",
        ],
        "{order}"
    );
    let chain = gw
        .app
        .render(ctxd::api::pb::RenderRequest {
            callers: ctxd::api::pb::Callers::None as i32,
            ..render_req(&parent, Target::FunctionId(function.clone()))
        })
        .await;
    assert_eq!(
        transcript(&chain.messages),
        [
            format!("[fn] user: {prompt}"),
            "[fn] assistant:  -> toolu_sub_1".to_owned(),
            "[fn] tool[toolu_sub_1]: the appendix".to_owned(),
            "[fn] assistant: They agree.".to_owned(),
        ],
        "{order}: the sub-agent's conversation, whole, in its function"
    );
}
