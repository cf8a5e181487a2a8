//! Graceful shutdown of the `ctxd serve` binary: on SIGTERM health turns NOT_SERVING, new calls
//! are refused, calls in flight finish (within `--shutdown-grace-secs`), and nothing
//! acknowledged is lost.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ctxd::api::pb;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::held::{self, HeldModel};
use crate::helpers::*;

const SERVICE: &str = "ctxd.v1.ContextStore";
const WAIT: Duration = Duration::from_secs(20);

struct Daemon {
    child: Child,
    addr: SocketAddr,
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// Starts `ctxd serve` on port 0 with `args` and reads the address from its stdout line.
async fn start(db: &Path, log: &Path, args: &[&str]) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ctxd"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db)
        .args(args)
        .env("CTXD_LOG", "info")
        .env_remove("CTXD_LISTEN")
        .env_remove("CTXD_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(log).expect("stderr log"))
        .spawn()
        .expect("spawn ctxd");
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line = match tokio::time::timeout(WAIT, line).await {
        Ok(line) => line.expect("reader").expect("read stdout"),
        Err(_) => {
            signal(pid, "-KILL");
            panic!("no address line within {WAIT:?}: {}", read(log));
        }
    };
    let addr = line
        .trim_end()
        .strip_prefix("ctxd listening on ")
        .unwrap_or_else(|| panic!("unexpected line {line:?}: {}", read(log)))
        .parse()
        .expect("an address");
    Daemon { child, addr }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits for the process to exit; returns its status and how long that took.
async fn exit_of(child: Child, log: &Path) -> (ExitStatus, Duration) {
    let started = Instant::now();
    let pid = child.id();
    let mut child = child;
    let waited = tokio::task::spawn_blocking(move || child.wait());
    match tokio::time::timeout(WAIT, waited).await {
        Ok(status) => (status.expect("waiter").expect("wait"), started.elapsed()),
        Err(_) => {
            signal(pid, "-KILL");
            panic!("ctxd did not exit within {WAIT:?}: {}", read(log));
        }
    }
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
            session_id: session.into(),
            limit: 1000,
            ..Default::default()
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
    let log = dir.path().join("stderr.log");
    let mut model = HeldModel::start().await;
    let url = model.url();
    let daemon = start(
        &db,
        &log,
        &["--summarizer-url", &url, "--summarizer-model", "m"],
    )
    .await;
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
    let mut compacting = client.clone();
    let compact_session = session.clone();
    let held_call = tokio::spawn(async move {
        compacting
            .compact(held::compact_req(&compact_session))
            .await
    });
    model.wait_for_requests(1).await;

    signal(daemon.child.id(), "-TERM");

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
    let refused = fresh
        .get_session(pb::GetSessionRequest {
            session_id: session.clone(),
        })
        .await;
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
    let (status, _) = exit_of(daemon.child, &log).await;
    assert!(status.success(), "{status:?}: {}", read(&log));
    assert_eq!(wal_bytes(&db), 0, "the WAL is checkpointed at exit");

    let daemon = start(&db, &log, &[]).await;
    assert_all_present(daemon.addr, &session, &acknowledged).await;
    let count = connect(daemon.addr)
        .await
        .get_session(pb::GetSessionRequest {
            session_id: session.clone(),
        })
        .await
        .expect("GetSession")
        .into_inner()
        .compaction_count;
    assert_eq!(count, 1, "the held Compact's summary is stored");
    signal(daemon.child.id(), "-TERM");
    let (status, _) = exit_of(daemon.child, &log).await;
    assert!(status.success());
}

#[tokio::test]
async fn a_call_that_never_finishes_is_abandoned_after_the_grace_period() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let log = dir.path().join("stderr.log");
    let mut model = HeldModel::start().await;
    let url = model.url();
    let grace = Duration::from_secs(1);
    let daemon = start(
        &db,
        &log,
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
    let mut compacting = client.clone();
    let compact_session = session.clone();
    let held_call = tokio::spawn(async move {
        compacting
            .compact(held::compact_req(&compact_session))
            .await
    });
    model.wait_for_requests(1).await;

    signal(daemon.child.id(), "-TERM");
    let (status, took) = exit_of(daemon.child, &log).await;
    println!("exited {took:?} after SIGTERM with a call that never finishes");
    assert!(status.success(), "{status:?}: {}", read(&log));
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
    assert!(read(&log).contains("abandoned"), "{}", read(&log));
    assert_eq!(wal_bytes(&db), 0, "the WAL is checkpointed at exit");

    let daemon = start(&db, &log, &[]).await;
    assert_all_present(daemon.addr, &session, &acknowledged).await;
    signal(daemon.child.id(), "-TERM");
    let (status, _) = exit_of(daemon.child, &log).await;
    assert!(status.success());
}

/// `Shutdown::drain` (`--shutdown-drain-ms`) keeps the listener open and health answering
/// NOT_SERVING for that long even with nothing in flight, so load balancers can notice.
#[tokio::test]
async fn the_drain_keeps_health_answering_not_serving_before_the_listener_closes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ctxd::store::Store::open(&dir.path().join("ctxd.db"))
        .await
        .expect("open the store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let drain = Duration::from_secs(2);
    let options = ctxd::server::Options {
        shutdown: ctxd::server::Shutdown {
            drain,
            grace: Duration::from_secs(30),
        },
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(ctxd::server::serve_with(
        listener,
        store,
        options,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut watch = HealthClient::new(channel(addr).await)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Watch")
        .into_inner();
    let first = watch.message().await.expect("Watch").expect("a status");
    assert_eq!(first.status, ServingStatus::Serving as i32);

    stop.send(()).expect("the server is running");
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

    tokio::time::timeout(WAIT, served)
        .await
        .expect("serve returns after the drain")
        .expect("join")
        .expect("a clean shutdown");
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
