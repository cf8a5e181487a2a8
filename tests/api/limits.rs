//! Limits: request, part and response sizes, and the concurrency limit with load shedding.
//! Every refusal names the limit and writes nothing.

use std::time::{Duration, Instant};

use ctxd::api::pb;
use ctxd::limits::Limits;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::held::{self, HeldModel};
use crate::helpers::*;

/// The server's summarizer over the model at `url`.
fn summarizer(url: String) -> ctxd::summarizer::Summarizer {
    ctxd::summarizer::Summarizer::new(ctxd::summarizer::Config {
        url,
        model: "test-model".into(),
        api_key: None,
        window_tokens: 8000,
        max_output_tokens: 512,
        max_calls: 8,
        timeout: Duration::from_secs(60),
    })
    .expect("build the summarizer")
}

/// A server with `limits` (and a summarizer, if given) over a fresh SQLite file.
async fn spawn_with(limits: Limits, summarizer_url: Option<String>) -> TestApp {
    spawn_app_with(ctxd::server::Options {
        summarizer: summarizer_url.map(summarizer),
        limits,
        ..Default::default()
    })
    .await
}

/// Imports neutral JSONL sent as `chunks`.
async fn import(
    w: &mut TestApp,
    chunks: Vec<Vec<u8>>,
) -> Result<pb::ImportSessionResponse, tonic::Status> {
    let neutral = pb::ImportFormat::NeutralJsonl as i32;
    let chunks = chunks
        .into_iter()
        .map(move |data| import_chunk(neutral, data));
    w.client
        .import_session(tokio_stream::iter(chunks))
        .await
        .map(|r| r.into_inner())
}

/// Neutral JSONL: `turns` user/assistant pairs, each line about `line_bytes` long.
fn jsonl(turns: usize, line_bytes: usize) -> Vec<u8> {
    let mut out = String::new();
    for t in 0..turns {
        for role in ["user", "assistant"] {
            let line = serde_json::json!({"role": role, "content": big_text(line_bytes, &format!("{role} {t}"))});
            out.push_str(&line.to_string());
            out.push('\n');
        }
    }
    out.into_bytes()
}

#[track_caller]
fn assert_message_has<T: std::fmt::Debug>(result: &Result<T, tonic::Status>, words: &[&str]) {
    let status = result.as_ref().expect_err("a refusal");
    for word in words {
        assert!(
            status.message().contains(word),
            "{word:?} in {:?}",
            status.message()
        );
    }
}

// ---------------------------------------------------------------- request size

#[tokio::test]
async fn a_request_over_max_request_bytes_is_resource_exhausted_and_writes_nothing() {
    let limits = Limits {
        max_request_bytes: 64 * 1024,
        ..Default::default()
    };
    let mut w = spawn_with(limits, None).await;
    let s = w.create_session().await;
    w.client
        .append(append_req(&s, vec![user(&big_text(60_000, "fits"))]))
        .await
        .expect("a request under the limit is served");
    let head = head_of(&mut w.client, &s, "main").await;

    let over = w
        .client
        .append(append_req(&s, vec![user(&big_text(70_000, "too big"))]))
        .await;
    assert_message_has(&over, &["65536", "--max-request-bytes"]);
    assert_status(over, Code::ResourceExhausted, "--max-request-bytes");
    assert_eq!(
        head_of(&mut w.client, &s, "main").await,
        head,
        "nothing appended"
    );
    assert_eq!(w.node_count().await, 1);

    // ImportSession: the limit is per message, so a file sent in chunks under it imports, and
    // a chunk over it is refused without a session.
    let file = jsonl(10, 10_000);
    assert!(file.len() > 3 * 64 * 1024);
    let sessions = w.session_count().await;
    let refused = import(&mut w, vec![file.clone()]).await;
    assert_status(refused, Code::ResourceExhausted, "--max-request-bytes");
    assert_eq!(w.session_count().await, sessions, "no session imported");
    let chunks = file.chunks(32 * 1024).map(<[u8]>::to_vec).collect();
    let imported = import(&mut w, chunks)
        .await
        .expect("chunks under the limit import");
    assert_eq!(imported.nodes, 20);
    assert_eq!(w.session_count().await, sessions + 1);
}

// ---------------------------------------------------------------- part size

#[tokio::test]
async fn a_part_over_max_part_bytes_is_invalid_argument_naming_the_part() {
    let limits = Limits {
        max_part_bytes: 1024,
        ..Default::default()
    };
    let mut w = spawn_with(limits, None).await;
    let s = w.create_session().await;
    let big = big_text(1025, "big");
    let big_json = format!(r#"{{"p":"{}"}}"#, "x".repeat(1025 - 8));
    let open = || {
        vec![
            user("q"),
            assistant_calls("", vec![call("c1", "read", "{}")]),
        ]
    };
    let cases: Vec<(Vec<pb::NodeInput>, &str)> = vec![
        (
            vec![
                user("a"),
                assistant("b"),
                message(pb::Role::User, vec![text("small"), text(&big)], vec![]),
            ],
            "nodes[2].message.parts[1]",
        ),
        (
            vec![
                user("a"),
                message(
                    pb::Role::User,
                    vec![media_data("image/png", vec![7; 1025])],
                    vec![],
                ),
            ],
            "nodes[1].message.parts[0]",
        ),
        (
            vec![
                user("a"),
                assistant_calls("", vec![call("c1", "read", &big_json)]),
            ],
            "nodes[1].message.tool_calls[0].arguments_json",
        ),
        (
            [open(), vec![tool_result("c1", &big)]].concat(),
            "nodes[2].tool_result.parts[0]",
        ),
        (
            [open(), vec![function_call("c1", &big, pb::Expose::Io)]].concat(),
            "nodes[2].function_call.input",
        ),
        (
            [
                open(),
                vec![
                    function_call("c1", "in", pb::Expose::Io),
                    function_result("c1", &big, pb::FunctionStatus::Completed),
                ],
            ]
            .concat(),
            "nodes[3].function_result.output",
        ),
    ];
    for (nodes, field) in cases {
        let refused = w.client.append(append_req(&s, nodes)).await;
        assert_message_has(&refused, &["1025 bytes", "--max-part-bytes"]);
        assert_status(refused, Code::InvalidArgument, field);
    }
    assert_eq!(w.node_count().await, 0, "nothing written");

    // Exactly the limit is accepted.
    w.client
        .append(append_req(&s, vec![user(&big_text(1024, "fits"))]))
        .await
        .expect("a part of exactly max_part_bytes");

    // An imported file's nodes are held to the same limit; the error names the line.
    let sessions = w.session_count().await;
    let file = format!(
        "{}\n{}\n",
        serde_json::json!({"role": "user", "content": "hi"}),
        serde_json::json!({"role": "assistant", "content": big}),
    );
    let refused = import(&mut w, vec![file.into_bytes()]).await;
    assert_message_has(&refused, &["--max-part-bytes"]);
    assert_status(refused, Code::InvalidArgument, "line 2.message.parts[0]");
    assert_eq!(w.session_count().await, sessions, "no session imported");
}

// ---------------------------------------------------------------- response size

#[tokio::test]
async fn a_response_over_max_response_bytes_is_refused_with_advice_and_never_after_a_write() {
    let max = 64 * 1024;
    let limits = Limits {
        max_response_bytes: max,
        ..Default::default()
    };
    let mut w = spawn_with(limits, None).await;
    let s = w.create_session().await;
    // Six turns of ~20 KB: ~120 KB of history.
    let mut ids = Vec::new();
    for t in 0..6 {
        let appended = w
            .client
            .append(append_req(
                &s,
                vec![
                    user(&big_text(20_000, &format!("turn {t}"))),
                    assistant("ok"),
                ],
            ))
            .await
            .expect("Append")
            .into_inner();
        ids.extend(appended.node_ids);
    }
    let head = head_of(&mut w.client, &s, "main").await;

    let all = w
        .client
        .get_nodes(pb::GetNodesRequest {
            session_id: s.clone(),
            node_ids: ids.clone(),
        })
        .await;
    assert_message_has(&all, &["65536", "node_ids"]);
    assert_status(all, Code::ResourceExhausted, "--max-response-bytes");
    let two = w
        .client
        .get_nodes(pb::GetNodesRequest {
            session_id: s.clone(),
            node_ids: ids[..2].to_vec(),
        })
        .await
        .expect("fewer node ids fit");
    assert_eq!(two.into_inner().nodes.len(), 2);

    let log = w.client.log(log_req(&s)).await;
    assert_message_has(&log, &["limit"]);
    assert_status(log, Code::ResourceExhausted, "--max-response-bytes");
    w.client
        .log(pb::LogRequest {
            limit: 2,
            ..log_req(&s)
        })
        .await
        .expect("a smaller page fits");

    let render = w
        .client
        .render(render_req(&s, Target::Branch("main".into())))
        .await;
    assert_message_has(&render, &["budget"]);
    assert_status(render, Code::ResourceExhausted, "--max-response-bytes");
    let budget = pb::Budget {
        context_window: 9000,
        output_reserve: 1000,
        ..Default::default()
    };
    let fitted = w
        .client
        .render(pb::RenderRequest {
            budget: Some(budget),
            ..render_req(&s, Target::Branch("main".into()))
        })
        .await
        .expect("a render under a budget fits");
    assert!(fitted.into_inner().messages.len() < 12);

    // A prepared summary input too large to send: refused, and the plan closed as cancelled.
    let prepare = w
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.clone(),
            budget: Some(pb::Budget {
                context_window: 13_000,
                output_reserve: 1000,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;
    assert_message_has(&prepare, &["Compact"]);
    assert_status(prepare, Code::ResourceExhausted, "--max-response-bytes");
    let audit = summaries(&mut w.client, &s).await;
    let kinds: Vec<&str> = audit.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["prepared", "cancelled"], "{:?}", audit.events);
    assert!(audit.events[1].message.contains("--max-response-bytes"));

    // Writes whose reply would not fit are refused before they write.
    let many: Vec<pb::NodeInput> = (0..2000).map(|i| user(&i.to_string())).collect();
    let append = w.client.append(append_req(&s, many)).await;
    assert_message_has(&append, &["fewer nodes", "--max-response-bytes"]);
    assert_status(append, Code::ResourceExhausted, "nodes");
    assert_eq!(
        head_of(&mut w.client, &s, "main").await,
        head,
        "nothing appended"
    );
    let sessions = w.session_count().await;
    let metadata = [("notes".to_owned(), big_text(70_000, "notes"))].into();
    let create = w
        .client
        .create_session(pb::CreateSessionRequest {
            metadata,
            ..Default::default()
        })
        .await;
    assert_status(create, Code::ResourceExhausted, "metadata");
    assert_eq!(w.session_count().await, sessions, "no session created");
    assert_eq!(w.node_count().await, 12);
}

// ---------------------------------------------------------------- concurrency

/// With `--max-concurrent-requests 2` and two `Compact` calls held in flight on the model,
/// further calls are refused at once; health still answers; after the release all is served.
#[tokio::test]
async fn past_max_concurrent_requests_calls_are_refused_at_once_and_health_still_answers() {
    let mut model = HeldModel::start().await;
    let limits = Limits {
        max_concurrent_requests: 2,
        ..Default::default()
    };
    let mut w = spawn_with(limits, Some(model.url())).await;
    let (first, _) = held::session_needing_compaction(&mut w.client).await;
    let (second, _) = held::session_needing_compaction(&mut w.client).await;

    // One call held: the other slot still serves, and fast.
    let mut compacting = w.client.clone();
    let held_one = tokio::spawn(async move { compacting.compact(held::compact_req(&first)).await });
    model.wait_for_requests(1).await;
    let started = Instant::now();
    w.create_session().await;
    let admitted = started.elapsed();

    // Both held: a third call is refused at once, health is exempt.
    let mut compacting = w.client.clone();
    let held_two =
        tokio::spawn(async move { compacting.compact(held::compact_req(&second)).await });
    model.wait_for_requests(1).await;
    for _ in 0..3 {
        let started = Instant::now();
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            w.client.create_session(pb::CreateSessionRequest::default()),
        )
        .await
        .expect("a call past the limit is answered, not queued");
        let elapsed = started.elapsed();
        assert_message_has(&refused, &["2 calls"]);
        assert_status(
            refused,
            Code::ResourceExhausted,
            "--max-concurrent-requests",
        );
        assert!(elapsed < Duration::from_secs(2), "refused in {elapsed:?}");
    }
    let mut health = HealthClient::new(channel(w.addr).await);
    let status = health
        .check(HealthCheckRequest {
            service: "ctxd.v1.ContextStore".into(),
        })
        .await
        .expect("health is not behind the limit")
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);

    model.release();
    for held in [held_one, held_two] {
        let outcome = held
            .await
            .expect("join")
            .expect("a held Compact finishes")
            .into_inner();
        assert!(outcome.applied, "{outcome:?}");
    }
    assert_eq!(
        w.session_count().await,
        3,
        "the refused calls created nothing"
    );
    println!("admitted beside a held call in {admitted:?}");
    assert!(
        admitted < Duration::from_secs(2),
        "admitted in {admitted:?}"
    );
}

/// The gateway takes the server's call slots too: with `--max-concurrent-requests 1` and a
/// `Compact` held on the model, a model call through the gateway is refused at once with a 429
/// in the provider's own shape (Anthropic's and Gemini's alike), reaches no upstream and
/// records nothing; once the slot is free the same call is served.
#[tokio::test]
async fn gateway_calls_share_the_servers_call_slots() {
    let mut model = HeldModel::start().await;
    let fake = crate::fake_provider::FakeProvider::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gateway");
    let gateway_url = format!("http://{}", listener.local_addr().expect("gateway addr"));
    let mut gateway = ctxd::gateway::Gateway::new(listener, fake.url(), fake.url());
    gateway.gemini_upstream = fake.url();
    let mut w = spawn_app_with(ctxd::server::Options {
        summarizer: Some(summarizer(model.url())),
        limits: Limits {
            max_concurrent_requests: 1,
            ..Default::default()
        },
        gateway: Some(gateway),
        ..Default::default()
    })
    .await;
    let (session, _) = held::session_needing_compaction(&mut w.client).await;
    let mut compacting = w.client.clone();
    let held_call =
        tokio::spawn(async move { compacting.compact(held::compact_req(&session)).await });
    model.wait_for_requests(1).await;

    let http = reqwest::Client::new();
    let anthropic = || {
        http.post(format!("{gateway_url}/v1/messages"))
            .header("x-api-key", "sk-test")
            .header("anthropic-version", "2023-06-01")
            .json(
                &serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
                "messages": [{"role": "user", "content": "hello"}]}),
            )
    };
    let refused = anthropic().send().await.expect("the gateway answers");
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.expect("a JSON error");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("1 calls"), "{message}");

    let gemini = http
        .post(format!(
            "{gateway_url}/v1beta/models/gemini-3.5-flash-lite:generateContent"
        ))
        .header("x-goog-api-key", "g-test")
        .json(&serde_json::json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(gemini.status(), 429);
    let body: serde_json::Value = gemini.json().await.expect("a JSON error");
    assert_eq!(body["error"]["code"], 429, "{body}");
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");
    assert_eq!(
        fake.request_count(),
        0,
        "a refused call reaches no upstream"
    );

    model.release();
    held_call
        .await
        .expect("join")
        .expect("the held Compact finishes");
    // A slot comes back once the server has sent its answer, which the client may read a
    // moment before: a call is tried again while it is refused, at most 30 seconds.
    let deadline = Instant::now() + Duration::from_secs(30);
    let served = loop {
        let answer = anthropic().send().await.expect("the gateway answers");
        if answer.status() != 429 || Instant::now() > deadline {
            break answer;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(served.status(), 200, "{:?}", served.text().await);
    assert_eq!(fake.request_count(), 1);
    let sessions = loop {
        let request = pb::ListSessionsRequest::default();
        match w.client.list_sessions(request).await {
            Ok(listed) => break listed.into_inner().sessions.len(),
            Err(s) if s.code() == Code::ResourceExhausted && Instant::now() < deadline => {
                tokio::task::yield_now().await;
            }
            Err(s) => panic!("ListSessions: {s:?}"),
        }
    };
    assert_eq!(
        sessions, 2,
        "the compacted session and the served call's: the refused calls recorded nothing"
    );
}
