//! The inspector's JSON API (`serve --http`): the RPCs' answers as JSON behind the same keys,
//! 401 before anything without one, tenants kept apart, raw content as JSON strings, and a
//! clear error with the right HTTP status for every bad input. Backend-neutral.

use std::net::SocketAddr;

use ctxd::api::auth::ApiKeys;
use ctxd::api::pb;
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
