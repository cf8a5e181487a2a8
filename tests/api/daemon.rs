//! The `ctxd` binary as a child process: `ctxd serve` started on port 0 with its address read
//! from its stdout line, signalled, and waited for in bounded time; other commands run to their
//! exit. Shared by the API tests and the fuzzer, so it uses nothing but std and tokio.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a start, a stop or a command may take before the test fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(20);

/// The `ctxd` binary, configured by its arguments alone: the test's `CTXD_*` variables (a
/// developer's own, or the tests' knobs) never reach it.
pub fn ctxd() -> Command {
    clean(Command::new(env!("CARGO_BIN_EXE_ctxd")))
}

fn clean(mut command: Command) -> Command {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CTXD_") {
            command.env_remove(name);
        }
    }
    command
}

/// `ctxd serve` to be started: on 127.0.0.1:0 over `db` with stderr to `stderr.log` beside it,
/// unless told otherwise.
pub struct Serve {
    db: PathBuf,
    listen: String,
    args: Vec<OsString>,
    stderr: PathBuf,
    append_stderr: bool,
    ready_within: Duration,
    through: Vec<OsString>,
}

impl Serve {
    pub fn new(db: &Path) -> Self {
        Self {
            db: db.to_path_buf(),
            listen: "127.0.0.1:0".into(),
            args: Vec::new(),
            stderr: db.with_file_name("stderr.log"),
            append_stderr: false,
            ready_within: WAIT,
            through: Vec::new(),
        }
    }

    pub fn listen(mut self, addr: &str) -> Self {
        self.listen = addr.into();
        self
    }

    /// Flags after `--listen ADDR --db DB`. With `--metrics-listen`, the server prints a second
    /// line, `ctxd metrics on ADDR`, which [`Serve::start`] then reads too.
    pub fn args(mut self, args: impl IntoIterator<Item = impl AsRef<OsStr>>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn stderr(mut self, path: &Path) -> Self {
        self.stderr = path.to_path_buf();
        self
    }

    /// Adds to the stderr log instead of replacing it, so a restart loop keeps every run's.
    pub fn append_stderr(mut self) -> Self {
        self.append_stderr = true;
        self
    }

    /// How long the address line may take (by default [`WAIT`]).
    pub fn ready_within(mut self, wait: Duration) -> Self {
        self.ready_within = wait;
        self
    }

    /// Runs the server through `wrapper` (a program and its arguments), which must exec the
    /// arguments that follow it: the binary's path and its own arguments. Signals reach the
    /// server only if the wrapper replaced itself with it.
    pub fn through(mut self, wrapper: impl IntoIterator<Item = impl AsRef<OsStr>>) -> Self {
        self.through = wrapper.into_iter().map(|a| a.as_ref().to_owned()).collect();
        self
    }

    /// The command line, for a server expected to refuse to start (see [`run_to_exit`]).
    pub fn command(&self) -> Command {
        let mut command = match self.through.split_first() {
            None => ctxd(),
            Some((program, wrapper)) => {
                let mut command = clean(Command::new(program));
                command.args(wrapper).arg(env!("CARGO_BIN_EXE_ctxd"));
                command
            }
        };
        command
            .args(["serve", "--listen", &self.listen, "--db"])
            .arg(&self.db)
            .args(&self.args);
        command
    }

    fn expects(&self, flag: &str) -> bool {
        self.args
            .iter()
            .any(|a| a.to_string_lossy().starts_with(flag))
    }

    /// Spawns the server and waits for its address line (and the metrics line, if asked for).
    pub async fn start(self) -> Daemon {
        let stderr = if self.append_stderr {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.stderr)
        } else {
            File::create(&self.stderr)
        }
        .expect("the stderr log");
        let mut child = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn ctxd");
        let stdout = child.stdout.take().expect("stdout");
        // The address line, then one per further listener in the order `serve` prints them.
        let (metrics, http, gateway) = (
            self.expects("--metrics-listen"),
            self.expects("--http"),
            self.expects("--gateway"),
        );
        let lines = 1 + usize::from(metrics) + usize::from(http) + usize::from(gateway);
        let read = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut read = Vec::new();
            for _ in 0..lines {
                let mut line = String::new();
                reader.read_line(&mut line)?;
                read.push(line);
            }
            Ok::<_, std::io::Error>((read, reader))
        });
        // From here a panic kills the child, in `Drop`.
        let mut daemon = Daemon {
            child: Some(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics: None,
            http: None,
            gateway: None,
            stdout: None,
            stderr: self.stderr,
        };
        let Ok(joined) = tokio::time::timeout(self.ready_within, read).await else {
            panic!(
                "no address line within {:?}; stderr: {}",
                self.ready_within,
                daemon.stderr()
            );
        };
        let (lines, stdout) = joined.expect("reader thread").expect("read stdout");
        let address = |line: &str, prefix: &str| -> SocketAddr {
            line.trim_end()
                .strip_prefix(prefix)
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("stdout line {line:?}; stderr: {}", daemon.stderr()))
        };
        let addr = address(&lines[0], "ctxd listening on ");
        let mut rest = lines[1..].iter();
        let metrics = if metrics {
            rest.next().map(|l| address(l, "ctxd metrics on "))
        } else {
            None
        };
        let http = if http {
            rest.next().map(|l| address(l, "ctxd http on "))
        } else {
            None
        };
        let gateway = if gateway {
            rest.next().map(|l| address(l, "ctxd gateway on "))
        } else {
            None
        };
        daemon.addr = addr;
        daemon.metrics = metrics;
        daemon.http = http;
        daemon.gateway = gateway;
        daemon.stdout = Some(stdout);
        daemon
    }
}

/// A running `ctxd serve`; killed if the test fails before it stops it.
pub struct Daemon {
    child: Option<Child>,
    /// The bound address, as printed.
    pub addr: SocketAddr,
    /// The metrics endpoint's, with `--metrics-listen`.
    pub metrics: Option<SocketAddr>,
    /// The inspector's, with `--http`.
    pub http: Option<SocketAddr>,
    /// The model gateway's, with `--gateway`.
    pub gateway: Option<SocketAddr>,
    /// Held open, so the server never writes into a closed pipe.
    stdout: Option<BufReader<ChildStdout>>,
    stderr: PathBuf,
}

impl Daemon {
    /// `ctxd serve` on 127.0.0.1:0 over `db` with `args`; see [`Serve`] for more.
    pub async fn start(db: &Path, args: &[&str]) -> Self {
        Serve::new(db).args(args).start().await
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The address to connect to: the bound port on loopback, also for 0.0.0.0.
    pub fn local(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.addr.port()))
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Sends `signal` (`TERM`, `INT`, `KILL`, ...) as `kill -SIGNAL PID` does.
    pub fn signal(&self, signal: &str) {
        send(self.pid(), signal);
    }

    // Only the fuzzer asks, but it shares this file.
    #[allow(dead_code)]
    pub fn is_running(&mut self) -> bool {
        let child = self.child.as_mut().expect("not yet waited for");
        child.try_wait().expect("try_wait").is_none()
    }

    /// Waits for the process to exit: its status, and how long that took.
    pub async fn wait_exit(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let started = Instant::now();
        let mut child = self.child.take().expect("not yet waited for");
        let pid = child.id();
        let waited = tokio::task::spawn_blocking(move || child.wait());
        let Ok(joined) = tokio::time::timeout(within, waited).await else {
            send(pid, "KILL");
            panic!(
                "ctxd did not exit within {within:?}; stderr: {}",
                self.stderr()
            );
        };
        let status = joined.expect("waiter thread").expect("wait");
        (status, started.elapsed())
    }

    /// SIGTERM, then [`Daemon::stop_with`]'s checks.
    pub async fn stop(self) -> String {
        self.stop_with("TERM").await
    }

    /// Sends `signal` and expects a clean exit within [`WAIT`] with nothing on stdout after the
    /// address lines; returns its stderr.
    pub async fn stop_with(mut self, signal: &str) -> String {
        self.signal(signal);
        let (status, _) = self.wait_exit(WAIT).await;
        assert!(
            status.success(),
            "exit after SIG{signal}: {status:?}; stderr: {}",
            self.stderr()
        );
        let mut rest = String::new();
        let mut stdout = self.stdout.take().expect("stdout");
        stdout.read_to_string(&mut rest).expect("read stdout");
        assert_eq!(rest, "", "only the address lines on stdout");
        self.stderr()
    }

    /// SIGKILL (what `kill -9` sends), then reaps the process.
    pub async fn kill(mut self) {
        let mut child = self.child.take().expect("not yet waited for");
        child.kill().expect("SIGKILL ctxd");
        tokio::task::spawn_blocking(move || child.wait())
            .await
            .expect("waiter thread")
            .expect("reap ctxd");
    }

    /// The text of the metrics endpoint, response head included.
    pub async fn scrape(&self) -> String {
        let addr = self.metrics.expect("started with --metrics-listen");
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut stream = std::net::TcpStream::connect(addr).expect("connect to metrics");
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: ctxd\r\n\r\n")
                .expect("send");
            let mut response = String::new();
            stream.read_to_string(&mut response).expect("read");
            response
        })
        .await
        .expect("scrape")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn send(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// How a command that ran to its end ended.
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` with no input to its exit within [`WAIT`], capturing both streams.
pub async fn run_to_exit(mut command: Command) -> Exited {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ctxd");
    let pid = child.id();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output());
    let Ok(joined) = tokio::time::timeout(WAIT, output).await else {
        send(pid, "KILL");
        panic!("ctxd did not exit within {WAIT:?}");
    };
    let output = joined.expect("waiter thread").expect("wait");
    Exited {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
