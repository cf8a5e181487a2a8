//! The capacity run of the gateway bench: many conversations resending at once through a
//! `ctxd serve --gateway` child process and through a bare proxy child process (this bench's own
//! binary, `--bare-proxy`), against the loopback fake: calls per second, and each server's CPU
//! seconds per call read from `/proc/<pid>/stat`.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use serde_json::Value;

use super::{
    ANSWER, Conversation, FakeProvider, PATIENCE, Reply, request, send, start_daemon, start_proxy,
    status_kib, stdout_lines, wide,
};

/// Conversations resending at once, their history in tokens, and the timed calls each makes
/// after its first (which records the history and is not timed).
pub const CONVERSATIONS: usize = 64;
pub const TOKENS: usize = 100_000;
pub const CALLS_EACH: usize = 8;

/// One arm of the capacity run.
pub struct Capacity {
    pub arm: &'static str,
    pub calls: usize,
    pub seconds: f64,
    /// The server process's user + system CPU over the timed calls.
    pub cpu_seconds: f64,
    pub failures: Vec<String>,
}

impl Capacity {
    pub fn calls_per_second(&self) -> f64 {
        self.calls as f64 / self.seconds
    }

    pub fn cpu_per_call(&self) -> f64 {
        self.cpu_seconds / self.calls as f64
    }
}

/// A server child process; killed when dropped.
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the bare proxy of this bench in this process, forwarding to `upstream`, until killed:
/// what `--bare-proxy UPSTREAM` does.
pub fn serve_bare_proxy(upstream: String) -> ! {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .expect("an HTTP client");
        let (addr, task) = start_proxy(upstream, http).await;
        println!("bare proxy on {addr}");
        let _ = task.await;
    });
    std::process::exit(0)
}

fn start_bare_proxy(upstream: &str) -> Result<(Proxy, SocketAddr), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .arg("--bare-proxy")
        .arg(upstream)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("start the bare proxy: {e}"))?;
    let rx = stdout_lines(&mut child);
    let proxy = Proxy(child);
    let line = rx
        .recv_timeout(PATIENCE)
        .map_err(|_| "the bare proxy said nothing".to_owned())?;
    let addr = line
        .strip_prefix("bare proxy on ")
        .ok_or_else(|| format!("the bare proxy said {line:?}"))?
        .trim()
        .parse()
        .map_err(|e| format!("the bare proxy's address: {e}"))?;
    Ok((proxy, addr))
}

/// Clock ticks per second of `/proc`'s times: Linux's user-space ABI fixes it at 100.
const USER_HZ: f64 = 100.0;

/// User + system CPU seconds of process `pid` (every thread), from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("read /proc/{pid}/stat: {e}"))?;
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or("a /proc stat without a command")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    // utime and stime are fields 14 and 15: 12 and 13 after the command.
    let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
        return Err(format!("no utime/stime in /proc/{pid}/stat"));
    };
    Ok((user + system) as f64 / USER_HZ)
}

/// Both arms, in turn: ctxd's gateway, then the bare proxy.
pub async fn capacity(http: &reqwest::Client, system: &str, history: &[Value]) -> Vec<Capacity> {
    let fake = FakeProvider::start().await;
    fake.set_default(Reply::text(ANSWER));
    let mut out = Vec::new();
    match tempfile::tempdir()
        .map_err(|e| e.to_string())
        .and_then(|dir| {
            let daemon = start_daemon(dir.path(), &fake.url())?;
            Ok((dir, daemon))
        }) {
        Ok((_dir, daemon)) => {
            let pid = daemon.child.id();
            let url = format!("http://{}/v1/messages", daemon.gateway);
            out.push(run("gateway", http, &url, pid, system, history, &fake).await);
        }
        Err(e) => out.push(failed("gateway", e)),
    }
    match start_bare_proxy(&fake.url()) {
        Ok((proxy, addr)) => {
            let pid = proxy.0.id();
            let url = format!("http://{addr}/v1/messages");
            out.push(run("bare proxy", http, &url, pid, system, history, &fake).await);
        }
        Err(e) => out.push(failed("bare proxy", e)),
    }
    fake.clear_requests();
    out
}

fn failed(arm: &'static str, why: String) -> Capacity {
    Capacity {
        arm,
        calls: 0,
        seconds: f64::NAN,
        cpu_seconds: f64::NAN,
        failures: vec![why],
    }
}

/// [`CONVERSATIONS`] conversations at once against `url`: one untimed call each, then
/// [`CALLS_EACH`] timed ones each, every conversation resending its whole history.
#[allow(clippy::too_many_arguments)]
async fn run(
    arm: &'static str,
    http: &reqwest::Client,
    url: &str,
    pid: u32,
    system: &str,
    history: &[Value],
    fake: &FakeProvider,
) -> Capacity {
    let conversations: Vec<Conversation> = (0..CONVERSATIONS)
        .map(|i| {
            let mut messages = history.to_vec();
            // Each agent's own conversation: its opening message differs.
            if let Some(Value::Array(blocks)) = messages[0].get_mut("content")
                && let Some(first) = blocks.first_mut()
                && let Some(text) = first.get("text").and_then(Value::as_str)
            {
                first["text"] = Value::from(format!("[agent {i}] {text}"));
            }
            Conversation::new(&messages)
        })
        .collect();
    let round = |mut conversations: Vec<Conversation>, calls: usize| {
        let tasks: Vec<_> = conversations
            .drain(..)
            .enumerate()
            .map(|(i, mut conversation)| {
                let (http, url, system) = (http.clone(), url.to_owned(), system.to_owned());
                tokio::spawn(async move {
                    let session = format!("capacity-{i}");
                    let mut failures = Vec::new();
                    for _ in 0..calls {
                        let body = conversation.next(&system);
                        let sent = wide(request(&http, &url, Some(&session), None, body), TOKENS);
                        match send(Instant::now(), sent).await {
                            Ok(answer) if answer.status == 200 => {}
                            Ok(answer) => failures.push(format!("status {}", answer.status)),
                            Err(e) => failures.push(e),
                        }
                        conversation.answered();
                    }
                    (conversation, failures)
                })
            })
            .collect();
        async move {
            let mut back = Vec::new();
            let mut failures = Vec::new();
            for task in tasks {
                match tokio::time::timeout(PATIENCE * 4, task).await {
                    Ok(Ok((c, f))) => {
                        back.push(c);
                        failures.extend(f);
                    }
                    Ok(Err(e)) => failures.push(e.to_string()),
                    Err(_) => failures.push("a conversation took too long".into()),
                }
            }
            (back, failures)
        }
    };
    // A client has an answer once it is appended (the gateway holds its last chunk until then),
    // so the timed calls start on recorded conversations.
    let (conversations, mut failures) = round(conversations, 1).await;
    fake.clear_requests();
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let (_, timed_failures) = round(conversations, CALLS_EACH).await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = cpu_seconds(pid);
    fake.clear_requests();
    failures.extend(timed_failures);
    let rss = status_kib(pid).map_or(String::new(), |(rss, hwm)| {
        format!(
            ", VmRSS {:.0} MiB, VmHWM {:.0} MiB",
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        )
    });
    println!(
        "capacity, {arm}: {} conversations × {CALLS_EACH} calls in {seconds:.2} s{rss}",
        CONVERSATIONS
    );
    let cpu_seconds = match (cpu_before, cpu_after) {
        (Ok(b), Ok(a)) => a - b,
        (Err(e), _) | (_, Err(e)) => {
            failures.push(e);
            f64::NAN
        }
    };
    Capacity {
        arm,
        calls: CONVERSATIONS * CALLS_EACH,
        seconds,
        cpu_seconds,
        failures,
    }
}
