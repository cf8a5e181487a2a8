//! The inspector's JSON API (`serve --http`): the RPCs' answers as JSON behind the same keys,
//! 401 before anything without one, tenants kept apart, raw content as JSON strings, and a
//! clear error with the right HTTP status for every bad input. Backend-neutral.

use std::net::SocketAddr;

use ctxd::api::pb;
use ctxd::auth::ApiKeys;
use ctxd::server::Options;
use pb::context_store_client::ContextStoreClient;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::helpers::*;

const ACME_KEY: &str = "acme-inspector-5b0c7d21";
const GLOBEX_KEY: &str = "globex-inspector-93e1aa04";
const HOSTILE: &str = "<script>alert(1)</script> & \"quotes\" <img src=x onerror=alert(2)>";

/// An HTTP/1.1 answer: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The error body's code and message.
    fn error(&self) -> (String, String) {
        let json = self.json();
        let error = &json["error"];
        (
            error["code"].as_str().expect("code").to_owned(),
            error["message"].as_str().expect("message").to_owned(),
        )
    }
}

/// One request on its own connection: enough HTTP for a test, with no client library.
async fn fetch(addr: SocketAddr, method: &str, path: &str, key: Option<&str>) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{auth}\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let raw = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status = lines.next().expect("status line")[9..12]
        .parse()
        .expect("status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A server with the inspector on a second port; returns the database, the server, its
/// inspector address.
async fn with_inspector(api_keys: Option<ApiKeys>) -> (TestDb, Server, SocketAddr) {
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = http.local_addr().expect("addr");
    let (db, server) = serve_fresh(Options {
        api_keys,
        http: Some(http),
        ..Options::default()
    })
    .await;
    (db, server, addr)
}

#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

async fn keyed(
    addr: SocketAddr,
    key: &str,
) -> ContextStoreClient<InterceptedService<Channel, Bearer>> {
    let bearer = Bearer(format!("Bearer {key}").parse().expect("ASCII"));
    ContextStoreClient::with_interceptor(channel(addr).await, bearer)
}

#[tokio::test]
async fn the_api_answers_the_rpcs_as_json_with_content_raw() {
    let (_db, server, web) = with_inspector(None).await;
    let mut client = connect(server.addr).await;
    let session = new_session(&mut client).await;
    client
        .append(append_req(&session, vec![user(HOSTILE), assistant("ok")]))
        .await
        .expect("append");

    let log = fetch(web, "GET", &format!("/api/sessions/{session}/log"), None).await;
    assert_eq!(log.status, 200, "{}", log.body);
    assert_eq!(log.header("content-type"), Some("application/json"));
    assert_eq!(log.header("cache-control"), Some("no-store"));
    let nodes = log.json()["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes.len(), 2);
    // Newest first; the text exactly as appended: escaping is the page's business.
    assert_eq!(
        nodes[1]["content"]["message"]["parts"][0]["text"],
        Value::from(HOSTILE)
    );

    let listed = fetch(web, "GET", "/api/sessions?page_size=10", None).await;
    assert_eq!(
        listed.json()["sessions"][0]["session_id"],
        Value::from(session.clone())
    );
    let one = fetch(web, "GET", &format!("/api/sessions/{session}"), None).await;
    assert_eq!(one.json()["branches"][0]["name"], "main");
    let rendered = fetch(
        web,
        "GET",
        &format!("/api/sessions/{session}/render?branch=main&context_window=100000"),
        None,
    )
    .await;
    assert_eq!(rendered.status, 200, "{}", rendered.body);
    let rendered = rendered.json();
    assert_eq!(
        rendered["messages"][0]["parts"][0]["text"],
        Value::from(HOSTILE)
    );
    assert_eq!(rendered["report"]["fits"], true);
    let summaries = fetch(
        web,
        "GET",
        &format!("/api/sessions/{session}/summaries"),
        None,
    )
    .await;
    assert_eq!(summaries.json()["events"], Value::Array(Vec::new()));

    // The page and its assets are embedded, under a content policy with no inline script.
    let page = fetch(web, "GET", "/", None).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("app.js"));
    let csp = page.header("content-security-policy").expect("a CSP");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(fetch(web, "GET", "/app.js", None).await.status, 200);
}

#[tokio::test]
async fn bad_inputs_get_a_clear_error_and_the_right_status() {
    let (_db, server, web) = with_inspector(None).await;
    let mut client = connect(server.addr).await;
    let session = new_session(&mut client).await;
    let cases = [
        (
            "/api/sessions?pagesize=3",
            400,
            "INVALID_ARGUMENT",
            "\"pagesize\"",
        ),
        (
            "/api/sessions?page_size=many",
            400,
            "INVALID_ARGUMENT",
            "page_size",
        ),
        (
            "/api/sessions/not-a-uuid",
            400,
            "INVALID_ARGUMENT",
            "session_id",
        ),
        (
            "/api/sessions/01a23577-ba12-74ba-ab79-83d667f6fd6e",
            404,
            "NOT_FOUND",
            "session",
        ),
        ("/api/nothing-here", 404, "NOT_FOUND", "no such API route"),
        ("/nothing-here", 404, "NOT_FOUND", "no such page"),
    ];
    for (path, status, code, names) in cases {
        let answer = fetch(web, "GET", path, None).await;
        assert_eq!(answer.status, status, "{path}: {}", answer.body);
        let (got, message) = answer.error();
        assert_eq!(got, code, "{path}");
        assert!(message.contains(names), "{path}: {message}");
    }
    let session_cases = [
        ("render?branch=nope", 404, "branch"),
        ("render?branch=a&node_id=b", 400, "at most one"),
        ("render?microcompact=sometimes", 400, "microcompact"),
        ("render?tokenizer=words", 400, "tokenizer"),
        ("log?limit=-1", 400, "limit"),
        ("nodes?ids=zzz", 400, "node"),
        ("summaries?branch=", 200, ""),
    ];
    for (rest, status, names) in session_cases {
        let path = format!("/api/sessions/{session}/{rest}");
        let answer = fetch(web, "GET", &path, None).await;
        assert_eq!(answer.status, status, "{path}: {}", answer.body);
        if status != 200 {
            let (_, message) = answer.error();
            assert!(message.contains(names), "{path}: {message}");
        }
    }
    // Read-only: a write method is not allowed.
    let post = fetch(web, "POST", "/api/sessions", None).await;
    assert_eq!(post.status, 405);
}

#[tokio::test]
async fn without_a_key_nothing_and_each_tenant_sees_only_its_own() {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(&keys, format!("acme {ACME_KEY}\nglobex {GLOBEX_KEY}\n")).expect("keys");
    let keys = ApiKeys::load(keys.path()).expect("keys");
    let (_db, server, web) = with_inspector(Some(keys)).await;
    let mut acme = keyed(server.addr, ACME_KEY).await;
    let session = acme
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("create")
        .into_inner()
        .session_id;
    acme.append(append_req(&session, vec![user("acme's secret")]))
        .await
        .expect("append");

    let paths = [
        "/api/sessions".to_owned(),
        format!("/api/sessions/{session}"),
        format!("/api/sessions/{session}/log"),
        format!("/api/sessions/{session}/render"),
        format!("/api/sessions/{session}/summaries"),
        "/api/no-such-route".to_owned(),
    ];
    for path in &paths {
        for (key, says) in [
            (None, "missing API key"),
            (Some("wrong"), "invalid API key"),
        ] {
            let answer = fetch(web, "GET", path, key).await;
            assert_eq!(answer.status, 401, "{path}");
            assert_eq!(
                answer.header("www-authenticate"),
                Some("Bearer realm=\"ctxd\"")
            );
            assert!(!answer.body.contains("secret") && !answer.body.contains(&session[..8]));
            let (code, message) = answer.error();
            assert_eq!(code, "UNAUTHENTICATED");
            assert!(message.contains(says), "{message}");
        }
    }

    // Another tenant: an empty list, and the session answers as an unknown one does.
    let listed = fetch(web, "GET", "/api/sessions", Some(GLOBEX_KEY)).await;
    assert_eq!(listed.json()["sessions"], Value::Array(Vec::new()));
    let unknown = unknown_id();
    let unknown = unknown.as_str();
    for rest in ["", "/log", "/render", "/summaries"] {
        let theirs = fetch(
            web,
            "GET",
            &format!("/api/sessions/{session}{rest}"),
            Some(GLOBEX_KEY),
        )
        .await;
        let none = fetch(
            web,
            "GET",
            &format!("/api/sessions/{unknown}{rest}"),
            Some(GLOBEX_KEY),
        )
        .await;
        assert_eq!(theirs.status, 404, "{rest}: {}", theirs.body);
        assert_eq!(theirs.body.replace(&session, unknown), none.body, "{rest}");
        assert!(!theirs.body.contains("secret"));
    }

    // The owner sees it.
    let listed = fetch(web, "GET", "/api/sessions", Some(ACME_KEY)).await;
    assert_eq!(
        listed.json()["sessions"][0]["session_id"],
        Value::from(session.clone())
    );
    let log = fetch(
        web,
        "GET",
        &format!("/api/sessions/{session}/log"),
        Some(ACME_KEY),
    )
    .await;
    assert_eq!(
        log.json()["nodes"][0]["content"]["message"]["parts"][0]["text"],
        "acme's secret"
    );
    // Static assets hold no data and need no key: the page must load to ask for one.
    assert_eq!(fetch(web, "GET", "/", None).await.status, 200);
}

/// `page` of the inspector's JSON API as (status, body).
async fn get_json(web: SocketAddr, path: &str) -> (u16, Value) {
    let answer = fetch(web, "GET", path, None).await;
    let json = answer.json();
    (answer.status, json)
}

#[tokio::test]
async fn the_sessions_list_is_searched_on_the_server_by_metadata_and_id_prefix() {
    let (_db, server, web) = with_inspector(None).await;
    let mut client = connect(server.addr).await;
    let mut ids = Vec::new();
    for team in ["a", "b", "a"] {
        let created = client
            .create_session(pb::CreateSessionRequest {
                metadata: [("team".to_owned(), team.to_owned())].into(),
                ..Default::default()
            })
            .await
            .expect("CreateSession")
            .into_inner();
        ids.push(created.session_id);
    }
    client
        .append(append_req(&ids[0], vec![user("q"), assistant("a")]))
        .await
        .expect("append");

    // Paged one at a time under the filter: the two of team a, newest first.
    let (status, first) = get_json(web, "/api/sessions?metadata=team%3Da&page_size=1").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        first["sessions"][0]["session_id"],
        Value::from(ids[2].clone())
    );
    let token = first["next_page_token"]
        .as_str()
        .expect("a token")
        .to_owned();
    let (_, second) = get_json(
        web,
        &format!("/api/sessions?metadata=team=a&page_size=1&page_token={token}"),
    )
    .await;
    assert_eq!(
        second["sessions"][0]["session_id"],
        Value::from(ids[0].clone())
    );
    assert_eq!(second["sessions"][0]["node_count"], 2);
    assert_eq!(second["next_page_token"], "");

    let prefix = &ids[1][..13];
    let (_, found) = get_json(web, &format!("/api/sessions?id_prefix={prefix}")).await;
    let found: Vec<&str> = found["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["session_id"].as_str().expect("id"))
        .collect();
    assert!(found.contains(&ids[1].as_str()), "{found:?}");
    assert!(found.iter().all(|id| id.starts_with(prefix)));

    for (query, names) in [
        ("id_prefix=xyz", "id_prefix"),
        ("metadata=team", "KEY=VALUE"),
        ("metadata=team=a&metadata=team=b", "two values"),
        ("metadata==a", "metadata"),
    ] {
        let answer = fetch(web, "GET", &format!("/api/sessions?{query}"), None).await;
        assert_eq!(answer.status, 400, "{query}: {}", answer.body);
        let (code, message) = answer.error();
        assert_eq!(code, "INVALID_ARGUMENT");
        assert!(message.contains(names), "{query}: {message}");
    }
}

/// A `text/event-stream` response read event by event: (id, event, data).
struct EventStream {
    response: reqwest::Response,
    buffer: String,
}

impl EventStream {
    async fn open(web: SocketAddr, path: &str, last_event_id: Option<&str>) -> Self {
        // reqwest is built without a crypto provider of its own.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut request = reqwest::Client::new().get(format!("http://{web}{path}"));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("the event stream");
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped); `None` when the stream ends.
    async fn next(&mut self) -> Option<(String, String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut name, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if name.is_empty() && data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).expect("JSON data");
                return Some((id, name, data));
            }
            let chunk =
                tokio::time::timeout(std::time::Duration::from_secs(30), self.response.chunk())
                    .await
                    .expect("an event within 30 s")
                    .expect("the stream");
            self.buffer
                .push_str(std::str::from_utf8(&chunk?).expect("UTF-8"));
        }
    }
}

#[tokio::test]
async fn a_session_is_followed_live_and_a_reconnect_resumes_after_the_last_event() {
    let (_db, server, web) = with_inspector(None).await;
    let mut client = connect(server.addr).await;
    let session = new_session(&mut client).await;
    let path = format!("/api/sessions/{session}/events");

    let mut live = EventStream::open(web, &path, None).await;
    let (_, name, started) = live.next().await.expect("started");
    assert_eq!(name, "started");
    assert_eq!(started["started"]["branches"][0]["name"], "main");
    let appended = client
        .append(append_req(
            &session,
            vec![user("first"), assistant("second")],
        ))
        .await
        .expect("append")
        .into_inner();
    let (first_id, name, first) = live.next().await.expect("a node");
    assert_eq!(name, "node");
    assert_eq!(
        first["node"]["node_id"],
        Value::from(appended.node_ids[0].clone())
    );
    assert_eq!(first["cursor"], Value::from(first_id.clone()));
    let (_, _, second) = live.next().await.expect("a node");
    assert_eq!(
        second["node"]["node_id"],
        Value::from(appended.node_ids[1].clone())
    );
    drop(live);

    // Reconnecting as a browser does, with the id of the last event it saw: only what came after.
    let more = client
        .append(append_req(&session, vec![user("third")]))
        .await
        .expect("append")
        .into_inner();
    let mut resumed = EventStream::open(web, &path, Some(&first_id)).await;
    let (_, name, _) = resumed.next().await.expect("started");
    assert_eq!(name, "started");
    let (_, _, next) = resumed.next().await.expect("a node");
    assert_eq!(
        next["node"]["node_id"],
        Value::from(appended.node_ids[1].clone())
    );
    let (_, _, next) = resumed.next().await.expect("a node");
    assert_eq!(
        next["node"]["node_id"],
        Value::from(more.node_ids[0].clone())
    );

    // The session's deletion is the last event.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: session.clone(),
        })
        .await
        .expect("delete");
    let (_, name, _) = resumed.next().await.expect("deleted");
    assert_eq!(name, "deleted");
    assert!(resumed.next().await.is_none(), "the stream ends");

    // Bad requests are refused before any event, naming what is wrong.
    let live = new_session(&mut client).await;
    let live_path = format!("/api/sessions/{live}/events");
    for (query, status, names) in [
        ("after_cursor=%00", 400, "after_cursor"),
        ("cursor=1", 400, "\"cursor\""),
        ("branch=-bad", 400, "branch"),
    ] {
        let answer = fetch(web, "GET", &format!("{live_path}?{query}"), None).await;
        assert_eq!(answer.status, status, "{query}: {}", answer.body);
        let (_, message) = answer.error();
        assert!(message.contains(names), "{query}: {message}");
    }
    let gone = fetch(web, "GET", &path, None).await;
    assert_eq!(gone.status, 404, "{}", gone.body);
}

#[tokio::test]
async fn savings_replay_the_policy_against_the_unpruned_calls() {
    let (_db, server, web) = with_inspector(None).await;
    let mut client = connect(server.addr).await;
    let session = new_session(&mut client).await;
    for turn in 0..6 {
        let id = format!("c{turn}");
        client
            .append(append_req(
                &session,
                vec![
                    user(&format!("read file {turn}")),
                    assistant_calls("", vec![call(&id, "read_file", r#"{"path":"x"}"#)]),
                    tool_result(&id, &big_text(20_000, &id)),
                    assistant(&format!("file {turn} read")),
                ],
            ))
            .await
            .expect("append");
    }
    let policy = "context_window=12000&max_tool_result_chars=2000";
    let (status, savings) = get_json(
        web,
        &format!("/api/sessions/{session}/savings?{policy}&calls=5"),
    )
    .await;
    assert_eq!(status, 200, "{savings}");
    assert_eq!(savings["calls_total"], 12, "{savings}");
    assert_eq!(savings["calls_replayed"], 5);
    assert_eq!(savings["gateway"], Value::Null);
    let number = |v: &Value| v.as_f64().expect("a number");
    for figures in [&savings["replayed"], &savings["next"]] {
        assert!(
            number(&figures["sent_tokens"]) < number(&figures["unpruned_tokens"]) / 2.0,
            "{figures}"
        );
        assert!(
            number(&figures["sent_cost"]) < number(&figures["unpruned_cost"]),
            "{figures}"
        );
    }
    // The render now is the next call: its tokens are what Render answers for the same query.
    let (_, rendered) = get_json(web, &format!("/api/sessions/{session}/render?{policy}")).await;
    assert_eq!(savings["next"]["sent_tokens"], rendered["total_tokens"]);

    // Without a budget nothing is pruned: sent is unpruned.
    let (_, open) = get_json(web, &format!("/api/sessions/{session}/savings")).await;
    assert_eq!(open["calls_replayed"], 12);
    assert_eq!(
        open["replayed"]["sent_tokens"],
        open["replayed"]["unpruned_tokens"]
    );
    assert_eq!(
        open["replayed"]["sent_cost"],
        open["replayed"]["unpruned_cost"]
    );

    for (query, names) in [
        ("calls=0", "calls"),
        ("calls=1001", "calls"),
        ("context_window=lots", "context_window"),
        ("branch=nope", "branch"),
    ] {
        let answer = fetch(
            web,
            "GET",
            &format!("/api/sessions/{session}/savings?{query}"),
            None,
        )
        .await;
        assert!(
            answer.status == 400 || answer.status == 404,
            "{query}: {}",
            answer.body
        );
        let (_, message) = answer.error();
        assert!(message.contains(names), "{query}: {message}");
    }
}

#[tokio::test]
async fn http_calls_take_the_servers_call_slots() {
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let web = http.local_addr().expect("addr");
    let (_db, server) = serve_fresh(Options {
        http: Some(http),
        limits: ctxd::limits::Limits {
            max_concurrent_requests: 1,
            ..Default::default()
        },
        ..Options::default()
    })
    .await;
    // An import whose stream stays open holds the only slot until it ends. A GET in flight
    // can refuse it the slot first: then it is started again.
    let hold = |addr: SocketAddr| {
        let (chunks, rx) = tokio::sync::mpsc::channel::<pb::ImportChunk>(1);
        let import = tokio::spawn(async move {
            let mut importer = connect(addr).await;
            importer
                .import_session(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
        });
        (chunks, import)
    };
    let (mut chunks, mut import) = hold(server.addr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let refused = loop {
        let answer = fetch(web, "GET", "/api/sessions", None).await;
        if answer.status == 429 {
            break answer;
        }
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            std::time::Instant::now() < deadline,
            "the import never took the slot"
        );
        if import.is_finished() {
            let refused = import.await.expect("the import task").expect_err("refused");
            assert_eq!(
                refused.code(),
                tonic::Code::ResourceExhausted,
                "{refused:?}"
            );
            (chunks, import) = hold(server.addr);
        }
        tokio::task::yield_now().await;
    };
    let (code, message) = refused.error();
    assert_eq!(code, "RESOURCE_EXHAUSTED");
    assert!(message.contains("--max-concurrent-requests"), "{message}");

    drop(chunks);
    let _ = import.await.expect("the import task");
    assert_eq!(fetch(web, "GET", "/api/sessions", None).await.status, 200);
}
