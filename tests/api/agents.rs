//! What the tests that drive real agent clients through the gateway share (gateway_clients.rs:
//! the Python SDKs and Claude Code; gateway_codex.rs: Codex CLI): a server with a gateway in
//! front of the fake provider, the upstream calls it received, and child processes run to
//! their exit in a process group of their own, bounded in time.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use ctxd::gateway::Gateway;
use ctxd::server::Options;
use tokio::net::TcpListener;

use crate::fake_provider::{FakeProvider, Recorded};
use crate::helpers::{TestApp, spawn_app_with};

/// The longest a client process may run before it is killed and the test fails.
pub const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// `CTXD_GATEWAY_CLIENTS=required`: a missing client fails its test instead of skipping it.
pub const REQUIRED: &str = "CTXD_GATEWAY_CLIENTS";

/// How a child process ended, and what it wrote.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` (no stdin) in a process group of its own to its exit, capturing both streams;
/// past [`CHILD_LIMIT`] the group is killed and the test fails with what it wrote so far. The
/// group is killed after a normal exit too, so nothing it started outlives the test.
pub async fn run_bounded(what: &str, mut command: Command) -> Ran {
    command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let pid = child.id();
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let waited = tokio::task::spawn_blocking(move || child.wait());
    let status = tokio::time::timeout(CHILD_LIMIT, waited).await;
    kill_group(pid);
    let stdout = collect(stdout).await;
    let stderr = collect(stderr).await;
    match status {
        Ok(joined) => Ran {
            status: joined.expect("waiter task").expect("wait for the child"),
            stdout,
            stderr,
        },
        Err(_) => panic!(
            "{what} did not finish within {CHILD_LIMIT:?} and was killed\nstdout: {stdout}\n\
             stderr: {stderr}"
        ),
    }
}

/// Reads `pipe` to its end on a thread of its own.
pub fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

/// What a [`drain`] read (its pipe is closed once the process group is gone).
pub async fn collect(reader: std::thread::JoinHandle<Vec<u8>>) -> String {
    let joined = tokio::task::spawn_blocking(move || reader.join());
    match tokio::time::timeout(Duration::from_secs(10), joined).await {
        Ok(Ok(Ok(buf))) => String::from_utf8_lossy(&buf).into_owned(),
        _ => "<not readable: the pipe stayed open>".into(),
    }
}

/// SIGKILL to the process group `pgid` (a group already gone is fine).
pub fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A server with the gateway in front of `fake` (both APIs); the gateway's base URL.
pub async fn gateway_app(fake: &FakeProvider) -> (TestApp, String) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gateway");
    let url = format!("http://{}", listener.local_addr().expect("gateway addr"));
    let options = Options {
        gateway: Some(Gateway::new(listener, fake.url(), fake.url())),
        ..Default::default()
    };
    (spawn_app_with(options).await, url)
}

/// A server with the gateway in front of `fake` for every API it speaks, Google's Gemini API
/// too (see [`point_gemini_upstream`]); the gateway's base URL.
pub async fn gemini_gateway_app(fake: &FakeProvider) -> (TestApp, String) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gateway");
    let url = format!("http://{}", listener.local_addr().expect("gateway addr"));
    let mut gateway = Gateway::new(listener, fake.url(), fake.url());
    point_gemini_upstream(&mut gateway, &fake.url());
    let options = Options {
        gateway: Some(gateway),
        ..Default::default()
    };
    (spawn_app_with(options).await, url)
}

/// Points `gateway`'s Gemini upstream at `url` (a base URL without `/v1beta`, e.g. the fake's).
/// The one place the tests name the field.
pub fn point_gemini_upstream(gateway: &mut Gateway, url: &str) {
    gateway.gemini_upstream = url.to_owned();
}

/// Requests to `path` the fake received.
pub fn model_calls(fake: &FakeProvider, path: &str) -> Vec<Recorded> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == path)
        .collect()
}

/// Every request the fake received, as `METHOD path?query` (for failure messages).
pub fn paths(fake: &FakeProvider) -> String {
    let all: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| match &r.query {
            Some(q) => format!("{} {}?{q}", r.method, r.path),
            None => format!("{} {}", r.method, r.path),
        })
        .collect();
    format!("{all:?}")
}

/// The only session of the test's server (`what` says what one session stands for, in the
/// failure message).
pub async fn only_session(app: &mut TestApp, what: &str) -> String {
    let ids = crate::gateway::sessions(app).await;
    assert_eq!(ids.len(), 1, "{what}, one session: {ids:?}");
    ids[0].clone()
}

/// An agent CLI `.ci/run` installs under `target/agents` (`bin`), or the one the environment
/// variable `var` names; `None` (the test skips) when it is missing and not required.
pub fn installed(what: &str, bin: &str, var: &str, package: &str) -> Option<std::path::PathBuf> {
    let path = match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(path) => std::path::PathBuf::from(path),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/agents/node_modules/.bin")
            .join(bin),
    };
    if path.exists() {
        return Some(path);
    }
    let why = format!(
        "no {what} at {} ({var}; .ci/run installs {package} into target/agents)",
        path.display()
    );
    if std::env::var(REQUIRED).is_ok_and(|v| v == "required") {
        panic!("{REQUIRED}=required, but {why}");
    }
    eprintln!("skipped: {why}; set {REQUIRED}=required to fail instead");
    None
}

/// ctxd's own headers (`x-ctxd-*`) never go upstream.
pub fn assert_ctxd_headers_stripped(call: &Recorded) {
    let leaked: Vec<&str> = call
        .headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with("x-ctxd-"))
        .collect();
    assert!(
        leaked.is_empty(),
        "x-ctxd-* headers went upstream: {leaked:?}"
    );
}
