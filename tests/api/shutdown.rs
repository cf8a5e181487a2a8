//! Graceful shutdown of the `ctxd serve` binary: on SIGTERM health turns NOT_SERVING, new calls
//! are refused, calls in flight finish (within `--shutdown-grace-secs`), and nothing
//! acknowledged is lost.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ctxd::api::pb;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::daemon::{Daemon, WAIT};
use crate::held::{self, HeldModel};
use crate::helpers::*;

const SERVICE: &str = "ctxd.v1.ContextStore";

/// A Compact of `session` held in flight: the model has its request and does not answer yet.
async fn hold_compact(
    client: &Client,
    model: &mut HeldModel,
    session: &str,
) -> JoinHandle<Result<tonic::Response<pb::CompactionOutcome>, tonic::Status>> {
    let mut compacting = client.clone();
    let request = held::compact_req(session);
    let call = tokio::spawn(async move { compacting.compact(request).await });
    model.wait_for_requests(1).await;
    call
}

async fn health_of(addr: SocketAddr, service: &str) -> i32 {
    HealthClient::new(channel(addr).await)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap_or_else(|e| panic!("health check {service:?}: {e:?}"))
        .into_inner()
        .status
}

/// After a restart, every acknowledged append is on the branch, in order.
async fn assert_all_present(addr: SocketAddr, session: &str, acknowledged: &[pb::AppendResponse]) {
    let mut client = connect(addr).await;
    let rendered = client
        .log(pb::LogRequest {
            limit: 1000,
            ..log_req(session)
        })
        .await
        .expect("Log")
        .into_inner();
    let mut stored: Vec<String> = rendered.nodes.into_iter().map(|n| n.node_id).collect();
    stored.reverse();
    let expected: Vec<String> = acknowledged
        .iter()
        .flat_map(|a| a.node_ids.iter().cloned())
        .collect();
    assert_eq!(stored, expected, "every acknowledged node, in order");
}

fn wal_bytes(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

#[tokio::test]
async fn sigterm_turns_health_not_serving_refuses_new_calls_and_lets_the_held_call_finish() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let mut model = HeldModel::start().await;
    let url = model.url();
    let mut daemon =
        Daemon::start(&db, &["--summarizer-url", &url, "--summarizer-model", "m"]).await;
    let mut client = connect(daemon.addr).await;
    let (session, acknowledged) = held::session_needing_compaction(&mut client).await;

    // A health Watch opened before the signal, and a Compact held in flight on the model.
    let mut watch = HealthClient::new(channel(daemon.addr).await)
        .watch(HealthCheckRequest {
            service: SERVICE.into(),
        })
        .await
        .expect("Watch")
        .into_inner();
    let first = watch.message().await.expect("Watch").expect("a status");
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let held_call = hold_compact(&client, &mut model, &session).await;

    daemon.signal("TERM");

    let changed = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("the Watch stream reports the change at once")
        .expect("Watch")
        .expect("a status");
    assert_eq!(changed.status, ServingStatus::NotServing as i32);
    for service in ["", SERVICE] {
        assert_eq!(
            health_of(daemon.addr, service).await,
            ServingStatus::NotServing as i32,
            "Check {service:?} while a call is in flight"
        );
    }
    let refused = client
        .create_session(pb::CreateSessionRequest::default())
        .await;
    assert_status(refused, Code::Unavailable, "shutting down");
    let refused = client
        .append(append_req(&session, vec![user("too late")]))
        .await;
    assert_status(refused, Code::Unavailable, "shutting down");
    let mut fresh = connect(daemon.addr).await;
    let refused = fresh.get_session(get_session_req(&session)).await;
    assert_status(refused, Code::Unavailable, "shutting down");
    assert!(!held_call.is_finished(), "the held call is still in flight");

    model.release();
    let outcome = held_call
        .await
        .expect("join")
        .expect("the call in flight at the signal finishes")
        .into_inner();
    assert!(outcome.applied, "{outcome:?}");
    // The Watch stream ends with the server, cleanly.
    let ended = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("the Watch stream ends");
    assert!(matches!(ended, Ok(None) | Err(_)), "{ended:?}");
    drop((client, fresh));
    let (status, _) = daemon.wait_exit(WAIT).await;
    assert!(status.success(), "{status:?}: {}", daemon.stderr());
    assert_eq!(wal_bytes(&db), 0, "the WAL is checkpointed at exit");

    let daemon = Daemon::start(&db, &[]).await;
    assert_all_present(daemon.addr, &session, &acknowledged).await;
    let count = connect(daemon.addr)
        .await
        .get_session(get_session_req(&session))
        .await
        .expect("GetSession")
        .into_inner()
        .compaction_count;
    assert_eq!(count, 1, "the held Compact's summary is stored");
    daemon.stop().await;
}

#[tokio::test]
async fn a_call_that_never_finishes_is_abandoned_after_the_grace_period() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let mut model = HeldModel::start().await;
    let url = model.url();
    let grace = Duration::from_secs(1);
    let mut daemon = Daemon::start(
        &db,
        &[
            "--summarizer-url",
            &url,
            "--summarizer-model",
            "m",
            "--shutdown-grace-secs",
            "1",
        ],
    )
    .await;
    let mut client = connect(daemon.addr).await;
    let (session, acknowledged) = held::session_needing_compaction(&mut client).await;
    let held_call = hold_compact(&client, &mut model, &session).await;

    daemon.signal("TERM");
    let (status, took) = daemon.wait_exit(WAIT).await;
    println!("exited {took:?} after SIGTERM with a call that never finishes");
    assert!(status.success(), "{status:?}: {}", daemon.stderr());
    assert!(
        took >= grace - Duration::from_millis(100),
        "waited for the grace period: {took:?}"
    );
    assert!(
        took < grace + Duration::from_secs(5),
        "exited within the bound: {took:?}"
    );
    let abandoned = held_call.await.expect("join");
    assert!(
        abandoned.is_err(),
        "an abandoned call is not answered OK: {abandoned:?}"
    );
    let log = daemon.stderr();
    assert!(log.contains("abandoned"), "{log}");
    assert_eq!(wal_bytes(&db), 0, "the WAL is checkpointed at exit");

    let daemon = Daemon::start(&db, &[]).await;
    assert_all_present(daemon.addr, &session, &acknowledged).await;
    daemon.stop().await;
}

/// `Shutdown::drain` (`--shutdown-drain-ms`) keeps the listener open and health answering
/// NOT_SERVING for that long even with nothing in flight, so load balancers can notice.
#[tokio::test]
async fn the_drain_keeps_health_answering_not_serving_before_the_listener_closes() {
    let drain = Duration::from_secs(2);
    let options = ctxd::server::Options {
        shutdown: ctxd::server::Shutdown {
            drain,
            grace: Duration::from_secs(30),
        },
        ..Default::default()
    };
    let (_dir, mut server) = serve_fresh(options).await;
    let addr = server.addr;
    let mut watch = HealthClient::new(channel(addr).await)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Watch")
        .into_inner();
    let first = watch.message().await.expect("Watch").expect("a status");
    assert_eq!(first.status, ServingStatus::Serving as i32);

    server.shut_down();
    let signalled = Instant::now();
    let changed = watch.message().await.expect("Watch").expect("a status");
    assert_eq!(changed.status, ServingStatus::NotServing as i32);
    // A new connection is still accepted, and told.
    assert_eq!(
        health_of(addr, SERVICE).await,
        ServingStatus::NotServing as i32
    );
    let refused = connect(addr)
        .await
        .create_session(pb::CreateSessionRequest::default())
        .await;
    assert_status(refused, Code::Unavailable, "shutting down");

    server.stopped(WAIT).await;
    let took = signalled.elapsed();
    assert!(
        took >= drain,
        "the listener stayed open for the drain: {took:?}"
    );
    assert!(
        matches!(watch.message().await, Ok(None) | Err(_)),
        "the Watch stream ended"
    );
}

/// The signal handlers are in place before the address line is printed: a SIGTERM sent the
/// moment the line is read stops the server cleanly (exit 0), not by the default action.
#[tokio::test]
async fn a_sigterm_right_after_the_address_line_is_a_clean_stop() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut daemon = Daemon::start(&dir.path().join("ctxd.db"), &[]).await;
        daemon.signal("TERM");
        let (status, _) = daemon.wait_exit(WAIT).await;
        assert_eq!(status.code(), Some(0), "{status:?}: {}", daemon.stderr());
    }
}
