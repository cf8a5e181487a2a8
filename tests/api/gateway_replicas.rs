//! The model gateway on several replicas of one PostgreSQL database: a client resending its
//! history to whichever replica, two clients racing on one session, and a replica killed
//! mid-stream with the call retried on another, each recorded once (nothing lost, nothing
//! stored twice). PostgreSQL only: without `CTXD_TEST_DATABASE_URL` these tests say so and pass.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use ctxd::api::pb;
use ctxd::gateway::Gateway;
use ctxd::server::Options;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::daemon::{Daemon, Serve};
use crate::fake_provider::{FakeProvider, Reply, parse_sse};
use crate::gateway::{
    Answer, anthropic, anthropic_stream, assistant_msg, describe, http_client, read_answer,
    transcript_of, user_msg, wait_for_transcript,
};
use crate::gateway_ledger::loop_until;
use crate::helpers::*;
use crate::replicas::server_or_skip;

/// The most a test waits for an answer or a recording before failing (never a readiness sleep).
const PATIENCE: Duration = Duration::from_secs(30);

/// The session key both clients of the race name in `x-ctxd-session`.
const RACE_KEY: &str = "replica-race";

// ---------------------------------------------------------------- harness

/// Two in-process servers on one fresh PostgreSQL schema, each with its own gateway, and one
/// fake provider behind both.
struct Replicas {
    db: TestDb,
    _servers: [Server; 2],
    /// Each replica's gateway base URL.
    gateways: [String; 2],
    /// A gRPC client of each replica.
    grpc: [Client; 2],
    fake: FakeProvider,
    http: reqwest::Client,
}

async fn replicas(server: String) -> Replicas {
    let db = TestDb::postgres(server).await;
    let fake = FakeProvider::start().await;
    let (a, a_url) = replica(&db, &fake).await;
    let (b, b_url) = replica(&db, &fake).await;
    let grpc = [connect(a.addr).await, connect(b.addr).await];
    Replicas {
        db,
        _servers: [a, b],
        gateways: [a_url, b_url],
        grpc,
        fake,
        http: http_client(),
    }
}

/// A server on `db` (its own store, so its own pool and committer) with a gateway in front of
/// `fake`, and the gateway's base URL.
async fn replica(db: &TestDb, fake: &FakeProvider) -> (Server, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let options = Options {
        gateway: Some(Gateway::new(listener, fake.url(), fake.url())),
        ..Options::default()
    };
    (serve_store(db.open().await, options).await, url)
}

/// `POST /v1/messages` to the gateway at `base`, as an Anthropic SDK sends it (with
/// `x-ctxd-session: key` when one is given); the response, headers received.
async fn send(
    http: &reqwest::Client,
    base: &str,
    body: &Value,
    key: Option<&str>,
) -> reqwest::Response {
    let mut request = http
        .post(format!("{base}/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", "sk-ant-test")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("x-ctxd-session", key);
    }
    tokio::time::timeout(PATIENCE, request.send())
        .await
        .expect("the gateway answers in time")
        .expect("the gateway answers")
}

/// [`send`], the whole answer read, which must be a 200.
async fn call(http: &reqwest::Client, base: &str, body: &Value, key: Option<&str>) -> Answer {
    read_answer(send(http, base, body, key).await).await.ok()
}

/// The nodes of `branch` from the root to its head.
async fn path(client: &mut Client, session: &str, branch: &str) -> Vec<pb::Node> {
    let mut nodes = Vec::new();
    let mut request = pb::LogRequest {
        session_id: session.into(),
        branch: branch.into(),
        ..Default::default()
    };
    loop {
        let page = client.log(request.clone()).await.expect("Log").into_inner();
        nodes.extend(page.nodes);
        if page.next_page_token.is_empty() {
            nodes.reverse();
            return nodes;
        }
        request.page_token = page.next_page_token;
    }
}

async fn branch_names(client: &mut Client, session: &str) -> Vec<String> {
    let mut names: Vec<String> = client
        .list_branches(list_branches_req(session))
        .await
        .expect("ListBranches")
        .into_inner()
        .branches
        .into_iter()
        .map(|b| b.name)
        .collect();
    names.sort();
    names
}

/// The transcript of `branch` once it holds `n` nodes, the last an assistant's, as `client`'s
/// replica reads it (see [`wait_for_transcript`]).
async fn answered(client: &mut Client, session: &str, branch: &str, n: usize) -> Vec<String> {
    wait_for_transcript(client, session, branch, |lines| {
        lines.len() >= n && lines.last().is_some_and(|l| l.starts_with("assistant"))
    })
    .await
}

/// Lines cut to a readable length, for failure messages about transcripts of long outputs.
fn short(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| match l.char_indices().nth(60) {
            Some((i, _)) => format!("{}… ({} bytes)", &l[..i], l.len()),
            None => l.clone(),
        })
        .collect()
}

#[track_caller]
fn assert_transcript(actual: &[String], expected: &[String], what: &str) {
    assert!(
        actual == expected,
        "{what}:\n stored   {:#?}\n expected {:#?}",
        short(actual),
        short(expected)
    );
}

/// Checks that the database holds `reachable` nodes (none off every branch) and no two with
/// the same hash: the hash covers a node's content and its whole history, so a repeat would be
/// one message stored twice after the same history.
async fn assert_stored_once(db: &TestDb, reachable: usize) {
    assert_eq!(
        db.count("SELECT COUNT(*) FROM nodes").await,
        reachable as i64,
        "every stored node is on a branch"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) - COUNT(DISTINCT hash) FROM nodes")
            .await,
        0,
        "no message is stored twice after the same history"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM sessions").await, 1);
}

/// The assistant's message as the client resends it: the content of the answer it got.
fn resent(answer: &Answer) -> Value {
    json!({"role": "assistant", "content": answer.json()["content"]})
}

fn tool_result(id: &str, output: &str) -> Value {
    json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id, "content": output},
    ]})
}

// ---------------------------------------------------------------- one client, two replicas

const CALLS: usize = 12;

/// An agent resending its whole history each call (a tool loop with sizeable outputs, and a
/// text turn in the middle), call `k` going to replica `k % 2`: each replica finds what the
/// other stored by hash and appends only what is new.
#[tokio::test]
async fn a_resending_client_alternating_between_gateway_replicas_is_recorded_once() {
    let test = "a_resending_client_alternating_between_gateway_replicas_is_recorded_once";
    let Some(server) = server_or_skip(test) else {
        return;
    };
    let mut r = replicas(server).await;
    let mut history = vec![user_msg("Read the crate, file by file.")];
    let mut expected = vec!["user: Read the crate, file by file.".to_owned()];
    let mut session = String::new();
    for k in 0..CALLS {
        let id = format!("toolu_{k:02}");
        let text_turn = k == CALLS / 2 || k == CALLS - 1;
        if text_turn {
            r.fake
                .script(Reply::text(format!("Read {k} files so far.")));
        } else {
            let file = format!("src/f{k}.rs");
            r.fake
                .script(Reply::tool_use_id(&id, "read_file", json!({"path": file})));
        }
        let replica = k % 2;
        let body = anthropic(Value::Array(history.clone()));
        let answer = call(&r.http, &r.gateways[replica], &body, None).await;
        if k == 0 {
            session = answer.session();
        }
        assert_eq!(answer.session(), session, "call {k}: one session");
        assert_eq!(answer.branch(), "main", "call {k}: on main");
        // The replica forwarded the whole history: it read what the other one stored.
        let upstream = r.fake.last_request().messages();
        assert_eq!(upstream.len(), history.len(), "call {k}: forwarded whole");

        history.push(resent(&answer));
        if text_turn {
            expected.push(format!("assistant: Read {k} files so far."));
            let next = format!("Go on after {k}.");
            expected.push(format!("user: {next}"));
            history.push(user_msg(&next));
        } else {
            expected.push(format!("assistant:  -> {id}"));
            let output = big_text(6 * 1024, &format!("f{k}"));
            expected.push(format!("tool[{id}]: {output}"));
            history.push(tool_result(&id, &output));
        }
    }
    // The last answer's follow-up was never sent: the session ends at that answer.
    expected.pop();
    assert_eq!(r.fake.request_count(), CALLS);

    // Read from the replica that made the last append, whose Watch its commit signals.
    let last = (CALLS - 1) % 2;
    let stored = answered(&mut r.grpc[last], &session, "main", expected.len()).await;
    assert_transcript(
        &stored,
        &expected,
        "main holds the conversation once, in order",
    );
    let other = transcript_of(&mut r.grpc[1 - last], &session, "main").await;
    assert_transcript(&other, &expected, "the other replica reads the same");
    assert_eq!(branch_names(&mut r.grpc[0], &session).await, ["main"]);
    assert_stored_once(&r.db, expected.len()).await;
}

// ---------------------------------------------------------------- two clients racing

const ROUNDS: usize = 6;

/// Two clients on one session key sending the same resent history at the same moment, one to
/// each replica, and both answered alike: the session, each request and each answer are made
/// once whichever replica wins each compare-and-swap. Then the two send different messages at
/// once: one goes on main, the other forks one branch (`gw-…`), and still nothing is stored
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clients_racing_on_one_session_record_each_message_once() {
    let test = "two_clients_racing_on_one_session_record_each_message_once";
    let Some(server) = server_or_skip(test) else {
        return;
    };
    let mut r = replicas(server).await;
    let mut history = vec![user_msg("Both of us read the files.")];
    let mut expected = vec!["user: Both of us read the files.".to_owned()];
    let mut session = String::new();
    for round in 0..ROUNDS {
        let id = format!("toolu_r{round}");
        let last = round == ROUNDS - 1;
        let reply = if last {
            Reply::text("All files read.")
        } else {
            Reply::tool_use_id(&id, "read_file", json!({"path": format!("r{round}.rs")}))
        };
        // One reply for each client's call, so both are answered alike.
        r.fake.script_all([reply.clone(), reply]);
        let body = anthropic(Value::Array(history.clone()));
        let (a, b) = tokio::join!(
            call(&r.http, &r.gateways[0], &body, Some(RACE_KEY)),
            call(&r.http, &r.gateways[1], &body, Some(RACE_KEY)),
        );
        if round == 0 {
            session = a.session();
        }
        for answer in [&a, &b] {
            assert_eq!(answer.session(), session, "round {round}: one session");
            assert_eq!(answer.branch(), "main", "round {round}: on main");
        }
        assert_eq!(a.json()["content"], b.json()["content"], "answered alike");
        history.push(resent(&a));
        if last {
            expected.push("assistant: All files read.".to_owned());
        } else {
            expected.push(format!("assistant:  -> {id}"));
            let output = big_text(2 * 1024, &format!("r{round}"));
            expected.push(format!("tool[{id}]: {output}"));
            history.push(tool_result(&id, &output));
        }
        let mut want = expected.clone();
        if !last {
            // The tool result is the next round's, not sent yet.
            want.pop();
        }
        // Both bodies have ended, so both replicas have committed: either one reads it all.
        let stored = answered(&mut r.grpc[round % 2], &session, "main", want.len()).await;
        assert_transcript(&stored, &want, &format!("round {round}: main"));
        assert_eq!(
            branch_names(&mut r.grpc[1], &session).await,
            ["main"],
            "round {round}: no other branch"
        );
    }
    assert_eq!(r.fake.request_count(), 2 * ROUNDS);
    assert_stored_once(&r.db, expected.len()).await;

    // Now the two diverge, at the same moment.
    let asks = ["user: A asks about r0.rs.", "user: B asks about r1.rs."];
    r.fake
        .script_all([Reply::text("Noted."), Reply::text("Noted.")]);
    let bodies = asks.map(|ask| {
        let mut h = history.clone();
        h.push(user_msg(ask.trim_start_matches("user: ")));
        anthropic(Value::Array(h))
    });
    let (a, b) = tokio::join!(
        call(&r.http, &r.gateways[0], &bodies[0], Some(RACE_KEY)),
        call(&r.http, &r.gateways[1], &bodies[1], Some(RACE_KEY)),
    );
    assert_eq!(a.session(), session);
    assert_eq!(b.session(), session);

    let names = branch_names(&mut r.grpc[0], &session).await;
    let forks: Vec<&String> = names.iter().filter(|n| *n != "main").collect();
    assert!(
        names.contains(&"main".to_owned()) && forks.len() == 1 && forks[0].starts_with("gw-"),
        "main and one fork: {names:?}"
    );
    // Each branch is the shared history, then one client's message and its answer, each
    // message at most once.
    let mut nodes: HashMap<String, pb::Node> = HashMap::new();
    let mut holder: HashMap<&str, String> = HashMap::new();
    for name in &names {
        let stored = answered(&mut r.grpc[0], &session, name, expected.len() + 2).await;
        let ask = stored.get(expected.len()).cloned().unwrap_or_default();
        let Some(ask) = asks.iter().find(|a| **a == ask) else {
            panic!(
                "{name} holds neither client's message: {:?}",
                short(&stored)
            );
        };
        let mut want = expected.clone();
        want.extend([ask.to_string(), "assistant: Noted.".to_owned()]);
        assert_transcript(&stored, &want, &format!("{name} after the divergence"));
        assert!(
            holder.insert(*ask, name.clone()).is_none(),
            "{ask:?} is on one branch only: {holder:?}"
        );
        for node in path(&mut r.grpc[0], &session, name).await {
            nodes.insert(node.node_id.clone(), node);
        }
    }
    assert_eq!(holder.len(), 2, "both messages are stored: {holder:?}");
    // No two nodes of the session have the same parent and content.
    let mut seen = HashSet::new();
    for node in nodes.values() {
        assert!(
            seen.insert((node.parent_id.clone(), describe(node))),
            "stored twice under {}: {:?}",
            node.parent_id,
            short(&[describe(node)])
        );
    }
    assert_eq!(
        nodes.len(),
        expected.len() + 4,
        "the shared history and two turns"
    );
    assert_stored_once(&r.db, nodes.len()).await;
    // Each answer names the branch its turn is stored on, the loser's fork included.
    for (answer, ask) in [(&a, asks[0]), (&b, asks[1])] {
        assert_eq!(
            answer.branch(),
            holder[ask],
            "x-ctxd-branch of the answer to {ask:?}"
        );
    }
}

// ---------------------------------------------------------------- forwarded as through one

/// A tool loop long enough for the gateway to take steps (old results cleared), its newest
/// result marked for the cache as Claude Code marks it, sent through the replicas `route`
/// names for each call under session key `key`: what went upstream (each call's messages) and
/// what the gateway recorded of each call (why its prefix changed, what it kept, what the
/// provider billed).
async fn tool_loop(
    r: &Replicas,
    key: &str,
    route: impl Fn(usize) -> usize,
) -> (Vec<Value>, Vec<(String, u64, u64, u64, u64)>) {
    const LOOP: usize = 40;
    r.fake.clear_cache();
    r.fake.clear_requests();
    let mut grpc = r.grpc[0].clone();
    let mut history = vec![user_msg(
        "Read every file of the crate, then say what it does.",
    )];
    let mut session = String::new();
    for k in 0..LOOP {
        let id = format!("toolu_{k:02}");
        r.fake.script(Reply::tool_use_id(
            &id,
            "read_file",
            json!({"path": format!("src/f{k}.rs")}),
        ));
        let body = anthropic(Value::Array(history.clone()));
        let answer = call(&r.http, &r.gateways[route(k)], &body, Some(key)).await;
        session = answer.session();
        // Each call recorded before the next, as an agent waits for its answer.
        loop_until(&mut grpc, &session, k + 1).await;
        history.push(resent(&answer));
        let output: String = (0..120)
            .map(|line| format!("f{k} line {line}: let value_{line} = compute({line});\n"))
            .collect();
        history.push(json!({"role": "user", "content": [{
            "type": "tool_result",
            "tool_use_id": id,
            "content": output,
            "cache_control": {"type": "ephemeral"},
        }]}));
    }
    let upstream = r
        .fake
        .requests()
        .into_iter()
        .filter(|q| q.path == "/v1/messages")
        .map(|q| q.body["messages"].clone())
        .collect();
    let calls = loop_until(&mut grpc, &session, LOOP)
        .await
        .into_iter()
        .map(|c| {
            (
                c.change,
                c.kept_tokens,
                c.input_tokens,
                c.cache_read_tokens,
                c.cache_write_tokens,
            )
        })
        .collect();
    (upstream, calls)
}

/// What the gateway renders and how it judges a call depend on the conversation's previous
/// call (the horizon of its last step, when it was made, the prefix it wrote), which any
/// replica may have served: a conversation alternating between two replicas is forwarded,
/// judged and billed exactly as the same conversation through one.
#[tokio::test]
async fn a_conversation_alternating_between_replicas_is_forwarded_as_through_one() {
    let test = "a_conversation_alternating_between_replicas_is_forwarded_as_through_one";
    let Some(server) = server_or_skip(test) else {
        return;
    };
    let r = replicas(server).await;
    let (one_upstream, one_calls) = tool_loop(&r, "through-one", |_| 0).await;
    let (alt_upstream, alt_calls) = tool_loop(&r, "alternating", |k| k % 2).await;
    assert!(
        one_calls.iter().any(|c| c.0.starts_with("step:")),
        "the loop takes a step, so what the next call renders depends on it: {one_calls:?}"
    );
    assert_eq!(alt_upstream.len(), one_upstream.len());
    for (k, (alt, one)) in alt_upstream.iter().zip(&one_upstream).enumerate() {
        assert!(alt == one, "call {k} went upstream as through one replica");
    }
    assert_eq!(
        alt_calls, one_calls,
        "each call judged and billed as through one replica"
    );
}

// ---------------------------------------------------------------- a replica killed

/// `ctxd serve` with a gateway in front of `fake`, on `db` (a PostgreSQL URL), its stderr in
/// `log`.
async fn gateway_replica(db: &str, fake: &FakeProvider, log: &Path) -> Daemon {
    let upstream = fake.url();
    Serve::new(Path::new(db))
        .args([
            "--gateway",
            "127.0.0.1:0",
            "--anthropic-upstream",
            &upstream,
            "--openai-upstream",
            &upstream,
        ])
        .stderr(log)
        .ready_within(PATIENCE)
        .start()
        .await
}

fn gateway_url(daemon: &Daemon) -> String {
    format!("http://{}", daemon.gateway.expect("started with --gateway"))
}

/// A streaming agent talks through replica A; mid-way through an answer's stream A is killed
/// with SIGKILL. The client sees its stream cut, sends the same request to replica B, which
/// answers it whole: the session holds every earlier message and that answer once, and B goes
/// on serving.
#[tokio::test]
async fn killing_a_gateway_replica_mid_stream_loses_nothing() {
    let test = "killing_a_gateway_replica_mid_stream_loses_nothing";
    let Some(server) = server_or_skip(test) else {
        return;
    };
    let db = TestDb::postgres(server).await;
    let fake = FakeProvider::start().await;
    let logs = tempfile::tempdir().expect("a dir for the replicas' logs");
    let doomed = gateway_replica(&db.url(), &fake, &logs.path().join("a.log")).await;
    let survivor = gateway_replica(&db.url(), &fake, &logs.path().join("b.log")).await;
    let (a, b) = (gateway_url(&doomed), gateway_url(&survivor));
    let mut grpc = connect(survivor.local()).await;
    let http = http_client();

    let mut history = Vec::new();
    let mut expected = Vec::new();
    let mut session = String::new();
    for turn in 0..3 {
        let (ask, text) = (format!("Turn {turn}?"), format!("Answer {turn}."));
        history.push(user_msg(&ask));
        expected.push(format!("user: {ask}"));
        fake.script(Reply::text(text.clone()));
        let answer = call(
            &http,
            &a,
            &anthropic_stream(Value::Array(history.clone())),
            None,
        )
        .await;
        assert!(!answer.cut, "turn {turn} streamed whole");
        session = answer.session();
        assert_eq!(answer.branch(), "main");
        history.push(assistant_msg(&text));
        expected.push(format!("assistant: {text}"));
    }

    // The answer to this one stops after its first text delta until the gate opens.
    let ask = "Turn 3, a long one?";
    let text = "Answer 3, told at length and in full.";
    history.push(user_msg(ask));
    expected.push(format!("user: {ask}"));
    let body = anthropic_stream(Value::Array(history.clone()));
    let (held, gate) = Reply::text(text).paused_after(4);
    fake.script(held);
    let mut response = send(&http, &a, &body, None).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response
            .headers()
            .get("x-ctxd-session-id")
            .and_then(|v| v.to_str().ok()),
        Some(session.as_str())
    );
    let mut received = Vec::new();
    let started = async {
        while !parse_sse(&received)
            .iter()
            .any(|e| e.event == "content_block_delta")
        {
            let chunk = response
                .chunk()
                .await
                .expect("the stream goes on")
                .expect("more of the stream");
            received.extend_from_slice(&chunk);
        }
    };
    tokio::time::timeout(PATIENCE, started)
        .await
        .expect("the answer's first text reaches the client");
    doomed.kill().await;
    // The provider may go on now: nobody is left to read it.
    gate.open();
    let rest = read_answer(response).await;
    received.extend_from_slice(&rest.body);
    assert!(rest.cut, "the client sees the stream cut: {rest:?}");
    assert!(
        !parse_sse(&received)
            .iter()
            .any(|e| e.event == "message_stop"),
        "the answer never ended on the killed replica"
    );

    // The client retries the same request on the surviving replica.
    fake.script(Reply::text(text));
    let retried = call(&http, &b, &body, None).await;
    assert!(!retried.cut, "the retry streams whole");
    assert!(
        parse_sse(&retried.body)
            .iter()
            .any(|e| e.event == "message_stop"),
        "{}",
        retried.text()
    );
    assert_eq!(retried.session(), session);
    assert_eq!(retried.branch(), "main");
    expected.push(format!("assistant: {text}"));
    let stored = answered(&mut grpc, &session, "main", expected.len()).await;
    assert_transcript(&stored, &expected, "main after the retry on B");
    assert_eq!(branch_names(&mut grpc, &session).await, ["main"]);
    assert_stored_once(&db, expected.len()).await;

    // B goes on serving the conversation.
    history.push(assistant_msg(text));
    history.push(user_msg("Turn 4?"));
    expected.push("user: Turn 4?".to_owned());
    fake.script(Reply::text("Answer 4."));
    let next = call(&http, &b, &anthropic_stream(Value::Array(history)), None).await;
    assert_eq!(next.session(), session);
    expected.push("assistant: Answer 4.".to_owned());
    let stored = answered(&mut grpc, &session, "main", expected.len()).await;
    assert_transcript(&stored, &expected, "main after the next call on B");
    assert_stored_once(&db, expected.len()).await;
    let log = survivor.stop().await;
    assert!(!log.contains("panicked"), "{log}");
}
