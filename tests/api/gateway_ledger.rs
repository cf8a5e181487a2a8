//! The gateway's ledger (`ListGatewayCalls`, the inspector's `/gateway-calls`): each call the
//! gateway recorded, read back in the order made with every field, in pages; the unexplained
//! miss flag; the calls the real gateway records over the fake provider; bad input named.
//! Backend-neutral.

use std::time::Duration;

use ctxd::api::pb;
use ctxd::auth::ApiKeys;
use ctxd::domain::{AskedEdit, GatewayCall, PrefixChange, ProviderUsage, SessionId, Tenant};
use ctxd::gateway::GatewayPolicy;
use ctxd::server::Options;
use ctxd::store::Store;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tonic::Code;

use crate::fake_provider::{DEFAULT_TEXT, FakeProvider};
use crate::gateway::{anthropic, assistant_msg, http_client, start_full, user_msg};
use crate::helpers::*;

/// The most a test waits for the gateway to record a call (written after its answer).
const PATIENCE: Duration = Duration::from_secs(30);

/// A server over a fresh database whose store the test also holds, with the inspector on a
/// second listener; returns the store, the server, a client and the inspector's address.
async fn with_store(options: Options) -> (TestDb, Store, Server, Client, String) {
    let db = TestDb::new().await;
    let store = db.open().await;
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let web = format!("http://{}", http.local_addr().expect("addr"));
    let server = serve_store(
        store.clone(),
        Options {
            http: Some(http),
            ..options
        },
    )
    .await;
    let client = connect(server.addr).await;
    (db, store, server, client, web)
}

/// A call as the gateway would record it, distinct in every field by `n`.
fn recorded(n: u64, kept: u64, cache_read: u64, change: Option<PrefixChange>) -> GatewayCall {
    GatewayCall {
        at_ms: 1_750_000_000_000 + n as i64 * 1_000,
        api: if n.is_multiple_of(2) {
            "anthropic"
        } else {
            "openai"
        }
        .to_owned(),
        model: format!("model-{n}"),
        client_tokens: 10_000 + n,
        forwarded_tokens: 8_000 + n,
        usage: ProviderUsage {
            input: 300 + n,
            cache_read,
            cache_write: 700 + n,
            output: 40 + n,
            // What a provider reports of its own edit, on every other call.
            cleared: n.is_multiple_of(2).then_some((n as u32, 1_000 * n)),
            thinking_dropped: (n % 3) as u32,
        },
        kept_tokens: kept,
        change,
        priced_by: format!("entry-{n}"),
        asked: n.is_multiple_of(2).then_some(AskedEdit {
            clear: n as u32 + 1,
            keep: 3,
        }),
        thinking_dropped: (n % 2) as u32,
    }
}

/// The calls a session's test records: every change reason, a hit, a miss, a miss the expiry
/// explains, and a small miss within the tolerance.
fn ledger() -> Vec<GatewayCall> {
    vec![
        recorded(0, 0, 0, Some(PrefixChange::First)),
        recorded(1, 7_000, 7_000, None),
        recorded(
            2,
            7_500,
            0,
            Some(PrefixChange::Step {
                results: 20,
                payback_calls: Some(3),
            }),
        ),
        recorded(3, 5_000, 4_900, Some(PrefixChange::Budget)),
        recorded(
            4,
            9_000,
            0,
            Some(PrefixChange::Expired { idle_ms: 360_000 }),
        ),
        recorded(5, 6_000, 1_000, Some(PrefixChange::MarkerMoved)),
        recorded(6, 0, 0, Some(PrefixChange::ClientChanged)),
    ]
}

fn expected(call: &GatewayCall) -> pb::GatewayCall {
    pb::GatewayCall {
        at_unix_ms: call.at_ms,
        api: call.api.clone(),
        model: call.model.clone(),
        client_tokens: call.client_tokens,
        forwarded_tokens: call.forwarded_tokens,
        input_tokens: call.usage.input,
        cache_read_tokens: call.usage.cache_read,
        cache_write_tokens: call.usage.cache_write,
        output_tokens: call.usage.output,
        kept_tokens: call.kept_tokens,
        change: call.change.map(|c| c.to_string()).unwrap_or_default(),
        unexplained_miss: call.unexplained_miss(),
        priced_by: call.priced_by.clone(),
        edit_clear: call.asked.map(|a| a.clear),
        edit_keep: call.asked.map(|a| a.keep),
        provider_cleared: call.usage.cleared.map(|(uses, _)| uses),
        provider_cleared_tokens: call.usage.cleared.map(|(_, tokens)| tokens),
        provider_thinking_dropped: call.usage.thinking_dropped,
        thinking_dropped: call.thinking_dropped,
        // A model the table does not know is priced at 0.1x reads and 1.25x writes.
        cost: call.usage.input as f64
            + 0.1 * call.usage.cache_read as f64
            + 1.25 * call.usage.cache_write as f64,
    }
}

async fn record_all(store: &Store, session: &str, calls: &[GatewayCall]) {
    let id = SessionId::parse("session_id", session).expect("a session id");
    let scoped = store
        .scope(&Tenant::local(), id)
        .await
        .expect("the session");
    for call in calls {
        store
            .record_gateway_call(scoped, call)
            .await
            .expect("record the call");
    }
}

fn list(session: &str, page_size: u32, page_token: &str) -> pb::ListGatewayCallsRequest {
    pb::ListGatewayCallsRequest {
        session_id: session.to_owned(),
        page_size,
        page_token: page_token.to_owned(),
    }
}

#[tokio::test]
async fn calls_read_back_in_order_with_every_field_in_pages() {
    let (_db, store, _server, mut client, web) = with_store(Options::default()).await;
    let session = new_session(&mut client).await;
    let other = new_session(&mut client).await;
    let calls = ledger();
    record_all(&store, &session, &calls).await;
    // Another session's calls are not this one's.
    record_all(&store, &other, &calls[..2]).await;

    let all = client
        .list_gateway_calls(list(&session, 0, ""))
        .await
        .expect("ListGatewayCalls")
        .into_inner();
    let want: Vec<pb::GatewayCall> = calls.iter().map(expected).collect();
    assert_eq!(all.calls, want, "every field, in the order recorded");
    assert_eq!(all.next_page_token, "", "one page holds them all");

    // The flag: a read short of what was kept beyond the tolerance, unless the cache expired.
    let misses: Vec<bool> = all.calls.iter().map(|c| c.unexplained_miss).collect();
    assert_eq!(misses, [false, false, true, false, false, true, false]);
    let changes: Vec<&str> = all.calls.iter().map(|c| c.change.as_str()).collect();
    assert_eq!(
        changes,
        [
            "first",
            "",
            "step:20:payback:3",
            "budget",
            "expired:360000",
            "marker_moved",
            "client_changed"
        ]
    );

    // Pages of three: 3, 3, 1, each starting after the last call of the one before.
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_gateway_calls(list(&session, 3, &token))
            .await
            .expect("a page")
            .into_inner();
        pages.push(page.calls.len());
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
        assert!(pages.len() < 10, "the pages end");
    }
    assert_eq!(pages, [3, 3, 1]);
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_gateway_calls(list(&session, 3, &token))
            .await
            .expect("a page")
            .into_inner();
        paged.extend(page.calls);
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(paged, want, "the pages together are the whole ledger");
    // A page size of exactly what is left ends without a further, empty page.
    let exact = client
        .list_gateway_calls(list(&session, 7, ""))
        .await
        .expect("seven")
        .into_inner();
    assert_eq!((exact.calls.len(), exact.next_page_token.as_str()), (7, ""));
    // A page size past the maximum is the maximum.
    let big = client
        .list_gateway_calls(list(&session, u32::MAX, ""))
        .await
        .expect("clamped")
        .into_inner();
    assert_eq!(big.calls.len(), 7);

    let theirs = client
        .list_gateway_calls(list(&other, 0, ""))
        .await
        .expect("the other session")
        .into_inner();
    assert_eq!(theirs.calls, want[..2]);

    // A session the gateway never served has an empty ledger.
    let quiet = new_session(&mut client).await;
    let none = client
        .list_gateway_calls(list(&quiet, 0, ""))
        .await
        .expect("no calls")
        .into_inner();
    assert_eq!(none, pb::ListGatewayCallsResponse::default());

    // The inspector maps the RPC as JSON, paged the same way.
    let http = http_client();
    let get = |path: String| {
        let http = http.clone();
        async move {
            let r = http.get(path).send().await.expect("GET");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("JSON"))
        }
    };
    let (status, body) = get(format!("{web}/api/sessions/{session}/gateway-calls")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["calls"].as_array().map(Vec::len), Some(7));
    assert_eq!(
        body["calls"][2],
        json!({
            "at_unix_ms": calls[2].at_ms,
            "api": "anthropic",
            "model": "model-2",
            "client_tokens": 10_002,
            "forwarded_tokens": 8_002,
            "input_tokens": 302,
            "cache_read_tokens": 0,
            "cache_write_tokens": 702,
            "output_tokens": 42,
            "kept_tokens": 7_500,
            "change": "step:20:payback:3",
            "unexplained_miss": true,
            "priced_by": "entry-2",
            "edit_clear": 3,
            "edit_keep": 3,
            "provider_cleared": 2,
            "provider_cleared_tokens": 2_000,
            "provider_thinking_dropped": 2,
            "thinking_dropped": 0,
            // 302 uncached, 702 written at 1.25x (a model the table does not know).
            "cost": 1_179.5,
        })
    );
    let (_, first) = get(format!(
        "{web}/api/sessions/{session}/gateway-calls?page_size=4"
    ))
    .await;
    let token = first["next_page_token"]
        .as_str()
        .expect("a token")
        .to_owned();
    assert!(!token.is_empty());
    let (_, rest) = get(format!(
        "{web}/api/sessions/{session}/gateway-calls?page_size=4&page_token={token}"
    ))
    .await;
    assert_eq!(rest["calls"].as_array().map(Vec::len), Some(3));
    assert_eq!(rest["calls"][2]["change"], "client_changed");
    assert_eq!(rest["next_page_token"], "");
}

#[tokio::test]
async fn bad_inputs_are_refused_naming_the_field() {
    let (_db, _store, _server, mut client, web) = with_store(Options::default()).await;
    let session = new_session(&mut client).await;
    let unknown = uuid::Uuid::now_v7().to_string();
    for (request, code, field) in [
        (list("", 0, ""), Code::InvalidArgument, "session_id"),
        (
            list("not-a-uuid", 0, ""),
            Code::InvalidArgument,
            "session_id",
        ),
        (
            list(&session, 0, "yesterday"),
            Code::InvalidArgument,
            "page_token",
        ),
        (list(&unknown, 0, ""), Code::NotFound, "session"),
    ] {
        let answer = client.list_gateway_calls(request.clone()).await;
        assert_status(answer, code, field);
    }
    // A token naming no call of the session is only a position: the calls after it (none).
    let after = client
        .list_gateway_calls(list(&session, 0, &unknown))
        .await
        .expect("a cursor past every call")
        .into_inner();
    assert!(after.calls.is_empty());

    let http = http_client();
    for (path, status, names) in [
        (
            format!("/api/sessions/{session}/gateway-calls?page_token=zzz"),
            400,
            "page_token",
        ),
        (
            format!("/api/sessions/{session}/gateway-calls?page_size=many"),
            400,
            "page_size",
        ),
        (
            format!("/api/sessions/{session}/gateway-calls?pagesize=3"),
            400,
            "pagesize",
        ),
        (
            "/api/sessions/nope/gateway-calls".to_owned(),
            400,
            "session_id",
        ),
        (
            format!("/api/sessions/{unknown}/gateway-calls"),
            404,
            "session",
        ),
    ] {
        let r = http.get(format!("{web}{path}")).send().await.expect("GET");
        assert_eq!(r.status().as_u16(), status, "{path}");
        let body: Value = r.json().await.expect("JSON");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{path}: {message}");
    }
}

#[tokio::test]
async fn another_tenants_ledger_answers_as_an_unknown_session() {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(
        &keys,
        "acme acme-ledger-7f1e02\nglobex globex-ledger-0c93aa\n",
    )
    .expect("keys");
    let keys = ApiKeys::load(keys.path()).expect("keys");
    let (_db, store, server, _client, _web) = with_store(Options {
        api_keys: Some(keys),
        ..Options::default()
    })
    .await;
    let session = store
        .create_session(&Tenant::new("acme"), Default::default(), None)
        .await
        .expect("acme's session")
        .id;
    let scoped = store
        .scope(&Tenant::new("acme"), session)
        .await
        .expect("acme's");
    store
        .record_gateway_call(scoped, &ledger()[1])
        .await
        .expect("record");
    let call = |key: &'static str, session: String| {
        let addr = server.addr;
        async move {
            let mut request = tonic::Request::new(list(&session, 0, ""));
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {key}").parse().expect("ASCII"),
            );
            connect(addr).await.list_gateway_calls(request).await
        }
    };
    let mine = call("acme-ledger-7f1e02", session.to_string())
        .await
        .expect("the owner reads it")
        .into_inner();
    assert_eq!(mine.calls.len(), 1);
    let theirs = call("globex-ledger-0c93aa", session.to_string()).await;
    let unknown = uuid::Uuid::now_v7().to_string();
    let none = call("globex-ledger-0c93aa", unknown.clone()).await;
    let (theirs, none) = (theirs.expect_err("hidden"), none.expect_err("unknown"));
    assert_eq!(theirs.code(), Code::NotFound);
    assert_eq!(
        theirs.message().replace(&session.to_string(), &unknown),
        none.message()
    );
}

#[tokio::test]
async fn the_gateway_records_each_call_it_forwards_in_the_ledger() {
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let web = format!("http://{}", http.local_addr().expect("addr"));
    let mut gw = start_full(
        FakeProvider::start().await,
        None,
        GatewayPolicy::default(),
        Options {
            http: Some(http),
            ..Options::default()
        },
    )
    .await;
    let u1 = user_msg("Count to three.");
    let first = gw.messages(&anthropic(json!([u1]))).await.ok();
    let (session, branch) = (first.session(), first.branch());
    gw.answered(&session, &branch, 2).await;
    loop_until(&mut gw.app.client, &session, 1).await;
    let next = json!([u1, assistant_msg(DEFAULT_TEXT), user_msg("Now to four.")]);
    let second = gw.messages(&anthropic(next)).await.ok();
    assert_eq!(second.session(), session);
    let calls = loop_until(&mut gw.app.client, &session, 2).await;
    assert_eq!(calls.len(), 2);
    assert!(
        calls[0].at_unix_ms <= calls[1].at_unix_ms,
        "in the order made"
    );
    assert!(
        calls[1].client_tokens > calls[0].client_tokens,
        "the second call resent the first's history and more"
    );
    let reported = gw.fake.requests();
    let call = &calls[0];
    assert_eq!(call.api, "anthropic");
    assert_eq!(
        call.model,
        reported[0].body["model"].as_str().expect("model")
    );
    assert!(call.client_tokens > 0 && call.forwarded_tokens > 0);
    let usage = &reported[0].usage;
    assert_eq!(
        call.input_tokens,
        usage["input_tokens"].as_u64().unwrap_or(0),
        "the provider's own report"
    );
    assert_eq!(
        call.cache_read_tokens,
        usage["cache_read_input_tokens"].as_u64().unwrap_or(0)
    );
    assert_eq!(
        call.output_tokens,
        usage["output_tokens"].as_u64().unwrap_or(0)
    );
    assert!(call.at_unix_ms > 1_700_000_000_000, "a real time");

    // The same through the inspector, which the session page reads.
    let r = http_client()
        .get(format!("{web}/api/sessions/{session}/gateway-calls"))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(body["calls"][0]["model"], Value::from(call.model.clone()));
}

/// The session's ledger once it holds `n` calls (each is written after its answer).
pub(crate) async fn loop_until(
    client: &mut Client,
    session: &str,
    n: usize,
) -> Vec<pb::GatewayCall> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let calls = client
            .list_gateway_calls(list(session, 0, ""))
            .await
            .expect("ListGatewayCalls")
            .into_inner()
            .calls;
        if calls.len() >= n {
            return calls;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} call(s) recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
