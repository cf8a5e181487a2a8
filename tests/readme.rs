//! The README's quick start, run as written against the `ctxd` binary: the blocks marked
//! `<!-- tests/readme.rs: NAME -->` are read from README.md at run time, their commands run, and
//! their output compared with what the README says. Only the binary (this build's, in place of
//! `cargo run --release --`), addresses (port 0 on loopback), the working directory of the
//! server (a temp dir) and the gateway's upstreams (a fake provider on loopback) differ from what
//! a reader types, so a renamed flag, a moved file or a changed output fails here.

#[path = "common/fake_provider.rs"]
mod fake_provider;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use fake_provider::{DEFAULT_TEXT, FakeProvider};
use serde_json::Value;

/// How long a start, a stop or a command may take before the test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(20);
/// What `$ANTHROPIC_API_KEY` stands for in the README's commands.
const API_KEY: &str = "sk-ant-readme-test";

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    std::fs::read_to_string(path).expect("read README.md")
}

// ---------------------------------------------------------------- reading the README

/// A fenced block under a `<!-- tests/readme.rs: NAME -->` marker.
struct Block {
    lang: String,
    body: String,
    /// The README's text after the block, up to the next heading.
    after: String,
}

fn block(readme: &str, name: &str) -> Block {
    let marker = format!("<!-- tests/readme.rs: {name} -->");
    let (_, rest) = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker} marker"));
    let rest = rest.trim_start_matches(['\r', '\n']);
    let (fence, rest) = rest
        .split_once('\n')
        .unwrap_or_else(|| panic!("{marker} ends the README"));
    let lang = fence
        .strip_prefix("```")
        .unwrap_or_else(|| panic!("{marker} is not followed by a fenced block: {fence:?}"));
    let (body, after) = rest
        .split_once("\n```")
        .unwrap_or_else(|| panic!("the block under {marker} is not closed"));
    let after = after.split("\n#").next().unwrap_or_default();
    Block {
        lang: lang.trim().to_owned(),
        body: body.to_owned(),
        after: after.to_owned(),
    }
}

/// The commands of a shell block: continued lines joined, blank and comment lines left out.
fn commands(body: &str) -> Vec<String> {
    let joined = body.replace("\\\n", " ");
    joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Splits a command into words as a POSIX shell does for what the README uses: single and
/// double quotes, `$NAME` expanded from `vars` (outside single quotes), and `#` starting a
/// comment at a word's start.
fn words(command: &str, vars: &HashMap<&str, &str>) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars().peekable();
    let expand = |chars: &mut std::iter::Peekable<std::str::Chars>| -> String {
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if !(c.is_ascii_alphanumeric() || c == '_') {
                break;
            }
            name.push(c);
            chars.next();
        }
        match vars.get(name.as_str()) {
            Some(value) => (*value).to_owned(),
            None => panic!("`${name}` in {command:?}: tests/readme.rs has no value for it"),
        }
    };
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => out.extend(word.take()),
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '$' => {
                            let value = expand(&mut chars);
                            word.as_mut().expect("in a word").push_str(&value);
                        }
                        c => word.as_mut().expect("in a word").push(c),
                    }
                }
            }
            '$' => {
                let value = expand(&mut chars);
                word.get_or_insert_with(String::new).push_str(&value);
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The `ctxd` arguments of a `cargo run --release -- ARGS` command.
fn cargo_run_args(command: &str) -> Vec<String> {
    let all = words(command, &HashMap::new());
    let prefix = ["cargo", "run", "--release", "--"];
    assert!(
        all.len() > prefix.len() && all[..prefix.len()] == prefix,
        "expected `cargo run --release -- …`, the README has {command:?}"
    );
    all[prefix.len()..].to_vec()
}

/// The address lines the README says `serve` prints: its inline code spans `ctxd … on ADDR`.
fn announced(text: &str) -> Vec<(String, SocketAddr)> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (prefix, addr) = span.rsplit_once(" on ")?;
            let addr = addr.parse().ok()?;
            prefix
                .starts_with("ctxd ")
                .then(|| (format!("{prefix} on "), addr))
        })
        .collect()
}

// ---------------------------------------------------------------- running ctxd

/// The `ctxd` binary, configured by its arguments alone: the developer's `CTXD_*` variables
/// never reach it.
fn ctxd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxd"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CTXD_") {
            command.env_remove(name);
        }
    }
    command
}

/// A `ctxd serve` child; killed if the test fails before it stops it.
struct Server {
    child: Child,
    /// Its stdout lines after those read at start, for the check that nothing else comes.
    rest: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `ctxd ARGS` in `dir` (its database lands there unless ARGS name one), every
    /// address in ARGS on port 0, with `--listen 127.0.0.1:0` unless ARGS listen somewhere, and
    /// `extra` appended; returns it with its first `lines` stdout lines.
    fn start(args: &[String], dir: &Path, extra: &[String], lines: usize) -> (Self, Vec<String>) {
        assert_eq!(
            args.first().map(String::as_str),
            Some("serve"),
            "a `ctxd serve` command: {args:?}"
        );
        let mut args: Vec<String> = args
            .iter()
            .map(|a| match a.parse::<SocketAddr>() {
                Ok(addr) => SocketAddr::new(addr.ip(), 0).to_string(),
                Err(_) => a.clone(),
            })
            .collect();
        if !args.iter().any(|a| a == "--listen") {
            args.extend(["--listen".into(), "127.0.0.1:0".into()]);
        }
        args.extend_from_slice(extra);
        // Beside the database, so a failed start can say why.
        let stderr_path = dir.join("serve.stderr");
        let stderr = std::fs::File::create(&stderr_path).expect("the stderr file");
        let mut child = ctxd()
            .args(&args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn ctxd serve");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (send, rest) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let server = Server { child, rest };
        let read = (0..lines)
            .map(|_| {
                server.rest.recv_timeout(WAIT).unwrap_or_else(|e| {
                    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                    panic!("ctxd {args:?}: no address line within {WAIT:?} ({e}); stderr: {stderr}")
                })
            })
            .collect();
        (server, read)
    }

    /// Ctrl-C, as the README says, and a clean exit with nothing more on stdout.
    fn stop(mut self) {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -INT");
        let deadline = std::time::Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "ctxd serve did not exit within {WAIT:?} of SIGINT"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "ctxd serve after SIGINT: {status:?}");
        let more: Vec<String> = self.rest.try_iter().collect();
        assert!(more.is_empty(), "stdout after the address lines: {more:?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a client command from the repository root against `server`; it must succeed.
fn client(args: &[String], server: SocketAddr) -> String {
    let out: Output = ctxd()
        .args(args)
        .env("CTXD_SERVER", format!("http://{server}"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run ctxd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("panicked"),
        "ctxd {args:?} failed: {stderr}"
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

// ---------------------------------------------------------------- ids

/// Whether `s` starts with a UUID (8-4-4-4-12 hexadecimal digits).
fn is_uuid(s: &[u8]) -> bool {
    s.len() >= 36
        && s[..36].iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Replaces the README's ids in `text` by those they stand for.
fn substitute(text: &str, ids: &HashMap<String, String>) -> String {
    ids.iter()
        .fold(text.to_owned(), |t, (readme, real)| t.replace(readme, real))
}

/// Checks `actual` against the README's `expected` output, where every id may differ: an id of
/// the README met for the first time is learnt (in `ids`) from the same place in `actual`.
fn assert_output(
    command: &str,
    expected: &[&str],
    actual: &str,
    ids: &mut HashMap<String, String>,
) {
    let actual: Vec<&str> = actual.lines().collect();
    assert_eq!(
        expected.len(),
        actual.len(),
        "`{command}` printed {} lines, the README shows {}:\n{}",
        actual.len(),
        expected.len(),
        actual.join("\n")
    );
    for (want, got) in expected.iter().zip(&actual) {
        let (w, g) = (want.as_bytes(), got.as_bytes());
        let mut i = 0;
        while i < w.len() {
            if is_uuid(&w[i..]) && g.len() >= i + 36 && is_uuid(&g[i..]) {
                let readme_id = &want[i..i + 36];
                let real = &got[i..i + 36];
                let known = ids
                    .entry(readme_id.to_owned())
                    .or_insert_with(|| real.to_owned());
                assert_eq!(known, real, "`{command}`: {readme_id} stands for two ids");
                i += 36;
            } else {
                i += 1;
            }
        }
        assert_eq!(
            substitute(want, ids),
            *got,
            "`{command}`: the README's output and ctxd's differ"
        );
    }
}

// ---------------------------------------------------------------- the quick start

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The gateway quick start and the gRPC one after it, against one server, as the README has
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_runs_as_written() {
    let readme = readme();
    let fake = FakeProvider::start().await;
    let dir = tempfile::tempdir().expect("temp dir");

    // `cargo run --release -- serve --gateway ADDR`, and the lines it is said to print.
    let serve = block(&readme, "serve-gateway");
    let [command] = commands(&serve.body)
        .try_into()
        .unwrap_or_else(|c| panic!("one command in the serve block: {c:?}"));
    let announced = announced(&serve.after);
    let named = |prefix: &str| {
        announced
            .iter()
            .find(|(p, _)| p == prefix)
            .map(|(_, addr)| *addr)
            .unwrap_or_else(|| panic!("the README names the `{prefix}…` line: {announced:?}"))
    };
    let (listen, gateway) = (named("ctxd listening on "), named("ctxd gateway on "));
    let upstreams = [
        "--anthropic-upstream".to_owned(),
        fake.url(),
        "--openai-upstream".to_owned(),
        fake.url(),
    ];
    let (server, lines) = Server::start(
        &cargo_run_args(&command),
        dir.path(),
        &upstreams,
        announced.len(),
    );
    // The README's address of each listener, and where it is in this run.
    let mut addrs: HashMap<SocketAddr, SocketAddr> = HashMap::new();
    for ((prefix, readme_addr), line) in announced.iter().zip(&lines) {
        let real = line
            .strip_prefix(prefix.as_str())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("the README says `{prefix}…`; ctxd printed {lines:?}"));
        addrs.insert(*readme_addr, real);
    }
    assert!(
        dir.path().join("ctxd.db").exists(),
        "the database is ./ctxd.db"
    );

    gateway_clients(&readme, &fake, gateway, addrs[&gateway], addrs[&listen]).await;
    grpc(&readme, listen, addrs[&listen]);
    server.stop();
}

/// The gateway's clients: `claude` is checked for the base URL it is given (it is not run
/// here), `curl`'s request is sent through the gateway to the fake provider and must come back
/// with the provider's answer and be recorded as a session.
async fn gateway_clients(
    readme: &str,
    fake: &FakeProvider,
    readme_gateway: SocketAddr,
    gateway: SocketAddr,
    grpc: SocketAddr,
) {
    let clients = block(readme, "gateway-clients");
    assert_eq!(clients.lang, "sh");
    let vars = HashMap::from([("ANTHROPIC_API_KEY", API_KEY)]);
    let base = format!("http://{readme_gateway}");
    let mut curls = 0;
    for command in commands(&clients.body) {
        let words = words(&command, &vars);
        let assignments: Vec<(&str, &str)> = words
            .iter()
            .map_while(|w| {
                w.split_once('=').filter(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                })
            })
            .collect();
        let program = words[assignments.len()].as_str();
        let args = &words[assignments.len() + 1..];
        match program {
            "claude" => {
                let url = assignments
                    .iter()
                    .find(|(k, _)| *k == "ANTHROPIC_BASE_URL")
                    .map(|(_, v)| *v);
                assert_eq!(
                    url,
                    Some(base.as_str()),
                    "Claude Code's base URL: {command}"
                );
            }
            "curl" => {
                curls += 1;
                curl(args, &base, gateway, fake, grpc).await;
            }
            other => panic!("tests/readme.rs does not know how to check `{other}`: {command}"),
        }
    }
    assert!(
        curls > 0,
        "the gateway quick start sends a request with curl"
    );
}

/// Sends what `curl ARGS` sends (a URL, `-H` headers, a `-d` body; `-s` changes nothing) with
/// `base` replaced by the gateway of this run.
async fn curl(
    args: &[String],
    base: &str,
    gateway: SocketAddr,
    fake: &FakeProvider,
    grpc: SocketAddr,
) {
    let (mut url, mut headers, mut body) = (None, Vec::new(), None);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-s" | "--silent" => {}
            "-H" | "--header" => {
                let header = args.next().expect("a header after -H");
                let (name, value) = header.split_once(':').expect("NAME: VALUE");
                headers.push((name.trim().to_owned(), value.trim().to_owned()));
            }
            "-d" | "--data" | "--data-raw" => body = args.next().cloned(),
            a if !a.starts_with('-') && url.is_none() => url = Some(a.to_owned()),
            a => panic!("tests/readme.rs does not know curl's {a}"),
        }
    }
    let url = url.expect("curl's URL");
    let path = url
        .strip_prefix(base)
        .unwrap_or_else(|| panic!("curl's URL {url} is on the gateway, {base}"));
    let body = body.expect("curl sends a body");
    let sent: Value = serde_json::from_str(&body).expect("curl's body is JSON");

    install_crypto();
    let http = reqwest::Client::new();
    let mut request = http.post(format!("http://{gateway}{path}")).body(body);
    for (name, value) in &headers {
        request = request.header(name, value);
    }
    let answer = tokio::time::timeout(WAIT, request.send())
        .await
        .expect("the gateway answers in time")
        .expect("the gateway answers");
    let status = answer.status();
    let session = answer
        .headers()
        .get("x-ctxd-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = answer.text().await.expect("the answer's body");
    assert_eq!(status, 200, "through the gateway: {text}");
    let answer: Value = serde_json::from_str(&text).expect("the answer is JSON");
    assert_eq!(
        answer["content"][0]["text"], DEFAULT_TEXT,
        "the provider's answer: {text}"
    );

    // The provider got the call with the client's own key.
    let upstream = fake.requests();
    assert_eq!(upstream.len(), 1, "one call upstream");
    assert_eq!(upstream[0].path, path);
    assert_eq!(upstream[0].header("x-api-key"), Some(API_KEY));

    // And the call is a session: the user's message and the provider's answer.
    let session = session.expect("x-ctxd-session-id on the answer");
    let said = sent["messages"][0]["content"]
        .as_str()
        .expect("a user message");
    let log = client(&["log".into(), session.clone()], grpc);
    assert!(
        log.contains(said) && log.contains(DEFAULT_TEXT),
        "`ctxd log {session}` shows the call: {log}"
    );
}

/// The gRPC quick start: each `$ ctxd …` of the console block run against the server, its
/// output compared with the lines the README shows under it, ids aside.
fn grpc(readme: &str, readme_listen: SocketAddr, listen: SocketAddr) {
    let console = block(readme, "grpc");
    assert_eq!(console.lang, "console");
    // The README's commands give no --server: the default must be the server it started.
    let help = client(&["import".into(), "--help".into()], listen);
    assert!(
        help.contains(&format!("[default: http://{readme_listen}]")),
        "the command line's default server is the README's {readme_listen}: {help}"
    );

    let mut steps: Vec<(String, Vec<&str>)> = Vec::new();
    for line in console.body.lines() {
        match line.strip_prefix("$ ") {
            Some(command) => steps.push((command.to_owned(), Vec::new())),
            None => steps
                .last_mut()
                .expect("the console block starts with a command")
                .1
                .push(line),
        }
    }
    assert!(steps.len() >= 2, "the gRPC quick start writes and reads");
    let mut ids = HashMap::new();
    for (command, expected) in &steps {
        let args = words(&substitute(command, &ids), &HashMap::new());
        assert_eq!(args[0], "ctxd", "a ctxd command: {command}");
        let out = client(&args[1..], listen);
        assert_output(command, expected, &out, &mut ids);
    }
}

/// `cargo run --release -- serve` serves gRPC with the SQLite file `./ctxd.db`, and `cargo test`
/// is the other command beside it.
#[test]
fn run_it_serves_with_the_default_database() {
    let readme = readme();
    let run = block(&readme, "run");
    let commands = commands(&run.body);
    let serve: Vec<&String> = commands
        .iter()
        .filter(|c| c.starts_with("cargo run"))
        .collect();
    let [serve] = serve[..] else {
        panic!("one `cargo run` in the run block: {commands:?}")
    };
    assert!(
        commands
            .iter()
            .any(|c| words(c, &HashMap::new()) == ["cargo", "test"]),
        "the run block gives `cargo test`: {commands:?}"
    );
    assert!(
        serve.contains("127.0.0.1:50051") && serve.contains("./ctxd.db"),
        "the comment says where it serves and stores: {serve}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, lines) = Server::start(&cargo_run_args(serve), dir.path(), &[], 1);
    let addr: SocketAddr = lines[0]
        .strip_prefix("ctxd listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the first line names the address: {lines:?}"));
    assert!(
        dir.path().join("ctxd.db").exists(),
        "the database is ./ctxd.db"
    );
    // It answers over gRPC (the call fails the test otherwise).
    client(&["sessions".into()], addr);
    server.stop();
}
