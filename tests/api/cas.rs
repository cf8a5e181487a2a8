//! Compare-and-swap across processes: 4 client processes race to extend 3 branches of one
//! session, each append expecting the head it just read. Every branch stays one linear chain and
//! no two successes were written against the same head.
//!
//! The clients are this test binary run again with only the ignored `cas_worker` test; they get
//! their orders from environment variables and report each success as a line on stdout.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use ctxd::api::pb;
use tonic::Code;

use crate::helpers::*;

const PROCESSES: usize = 4;
/// Successes each process needs, spread over the branches in turn.
const SUCCESSES: usize = 60;
const BRANCHES: [&str; 3] = ["main", "fork", "fresh"];
const WAIT: Duration = Duration::from_secs(120);

/// The worker's test name, as `--exact` wants it.
const WORKER_TEST: &str = "cas::cas_worker";
const ADDR_VAR: &str = "CTXD_CAS_ADDR";
const SESSION_VAR: &str = "CTXD_CAS_SESSION";
const WORKER_VAR: &str = "CTXD_CAS_WORKER";

/// Stdout markers of the worker protocol: ready, one line per success, done.
const READY: &str = "cas-ready";
const SUCCESS: &str = "cas-success";
const DONE: &str = "cas-done";

/// "none" stands for a branch with no head.
fn show(head: &str) -> &str {
    if head.is_empty() { "none" } else { head }
}

/// The client process: waits for "go" on stdin, then appends until it has `SUCCESSES`.
#[tokio::test]
#[ignore = "a client process of compare_and_swap_holds_across_processes, which starts it"]
async fn cas_worker() {
    let (Ok(addr), Ok(session), Ok(worker)) = (
        std::env::var(ADDR_VAR),
        std::env::var(SESSION_VAR),
        std::env::var(WORKER_VAR),
    ) else {
        eprintln!(
            "cas_worker runs only as a process started by compare_and_swap_holds_across_processes"
        );
        return;
    };
    let addr: SocketAddr = addr.parse().expect("address");
    let mut client = connect(addr).await;
    println!("{READY}");
    // Every process starts at the same moment, so they contend from the first append.
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("read stdin");
    assert_eq!(go.trim(), "go");

    let mut conflicts = 0usize;
    for i in 0..SUCCESSES {
        let branch = BRANCHES[i % BRANCHES.len()];
        loop {
            let head = client
                .list_branches(list_branches_req(&session))
                .await
                .expect("ListBranches")
                .into_inner()
                .branches
                .into_iter()
                .find(|b| b.name == branch)
                .expect("the branch is listed")
                .head_id;
            let text = format!("w{worker}-{i} after {}", show(&head));
            let request = pb::AppendRequest {
                branch: branch.into(),
                expected_head_id: Some(head.clone()),
                ..append_req(&session, vec![user(&text)])
            };
            match client.append(request).await {
                Ok(response) => {
                    let response = response.into_inner();
                    assert_eq!(response.node_ids, std::slice::from_ref(&response.head_id));
                    println!("{SUCCESS} {branch} {} {}", show(&head), response.head_id);
                    break;
                }
                Err(status) if status.code() == Code::Aborted => {
                    assert!(status.message().contains("expected_head_id"), "{status:?}");
                    conflicts += 1;
                }
                Err(status) => panic!("worker {worker}: unexpected {status:?}"),
            }
        }
    }
    println!("{DONE} {conflicts}");
}

/// One success as a worker reported it.
#[derive(Debug)]
struct Success {
    worker: usize,
    branch: String,
    expected: String,
    node: String,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: tempfile::NamedTempFile,
}

fn spawn_worker(addr: SocketAddr, session: &str, worker: usize) -> Worker {
    let stderr = tempfile::NamedTempFile::new().expect("stderr file");
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            WORKER_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ADDR_VAR, addr.to_string())
        .env(SESSION_VAR, session)
        .env(WORKER_VAR, worker.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr.reopen().expect("stderr file"))
        .spawn()
        .expect("start a worker process");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    Worker {
        child,
        stdin,
        stdout,
        stderr,
    }
}

/// The protocol lines of a worker's stdout (libtest's own lines may share a line with ours,
/// so a marker is searched, not expected at the start).
fn protocol_line(line: &str) -> Option<&str> {
    [READY, SUCCESS, DONE]
        .iter()
        .find_map(|marker| line.find(marker).map(|at| line[at..].trim_end()))
}

/// Reads up to the ready line.
fn await_ready(stdout: &mut BufReader<ChildStdout>) -> bool {
    let mut line = String::new();
    loop {
        line.clear();
        match stdout.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if protocol_line(&line) == Some(READY) => return true,
            Ok(_) => {}
        }
    }
}

/// Waits for the worker's exit and parses its successes and conflict count.
fn finish(mut worker: Worker, id: usize) -> (Vec<Success>, usize) {
    let mut out = String::new();
    worker
        .stdout
        .read_to_string(&mut out)
        .expect("read worker stdout");
    let status = worker.child.wait().expect("wait for the worker");
    let stderr = std::fs::read_to_string(worker.stderr.path()).unwrap_or_default();
    assert!(
        status.success(),
        "worker {id} failed ({status}); stdout:\n{out}\nstderr:\n{stderr}"
    );
    let mut successes = Vec::new();
    let mut conflicts = None;
    for line in out.lines().filter_map(protocol_line) {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[..] {
            [SUCCESS, branch, expected, node] => successes.push(Success {
                worker: id,
                branch: branch.into(),
                expected: expected.into(),
                node: node.into(),
            }),
            [DONE, n] => conflicts = Some(n.parse().expect("a conflict count")),
            _ => panic!("worker {id}: unexpected line {line:?}"),
        }
    }
    let conflicts = conflicts.unwrap_or_else(|| panic!("worker {id} never said done:\n{out}"));
    (successes, conflicts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_swap_holds_across_processes() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    // Each branch starts at a different head, so "no two successes share an expected head"
    // holds across branches too: main after `seed`, fork at the root, fresh with no head.
    let seed = app
        .append(&s, vec![system("root"), user("seed")])
        .await
        .node_ids;
    app.create_branch(&s, "fork", &seed[0]).await;
    app.create_branch(&s, "fresh", "").await;
    let base: HashMap<&str, usize> = [("main", 2), ("fork", 1), ("fresh", 0)].into();

    let addr = app.addr;
    let session = s.clone();
    let run = tokio::task::spawn_blocking(move || {
        let mut workers: Vec<Worker> = (0..PROCESSES)
            .map(|id| spawn_worker(addr, &session, id))
            .collect();
        for (id, worker) in workers.iter_mut().enumerate() {
            if !await_ready(&mut worker.stdout) {
                let _ = worker.child.kill();
                let stderr = std::fs::read_to_string(worker.stderr.path()).unwrap_or_default();
                panic!("worker {id} exited before it was ready; stderr:\n{stderr}");
            }
        }
        for worker in &mut workers {
            writeln!(worker.stdin, "go").expect("tell a worker to go");
        }
        workers
            .into_iter()
            .enumerate()
            .map(|(id, worker)| finish(worker, id))
            .collect::<Vec<_>>()
    });
    let reports = tokio::time::timeout(WAIT, run)
        .await
        .expect("the workers finish in time")
        .expect("worker supervisor");

    let mut successes = Vec::new();
    let mut conflicts = 0;
    for (report, lost) in reports {
        assert_eq!(report.len(), SUCCESSES, "every worker reached its count");
        successes.extend(report);
        conflicts += lost;
    }
    println!(
        "{} compare-and-swap successes and {conflicts} conflicts across {PROCESSES} processes",
        successes.len()
    );

    let mut expected_heads = HashSet::new();
    for success in &successes {
        assert!(
            expected_heads.insert(success.expected.as_str()),
            "two successes expected head {}: {success:?}",
            success.expected
        );
    }
    let by_node: HashMap<&str, &Success> = successes.iter().map(|s| (s.node.as_str(), s)).collect();
    assert_eq!(
        by_node.len(),
        successes.len(),
        "every success is a new node"
    );

    for branch in BRANCHES {
        let log = app.log(&s, branch).await;
        let appended = successes.iter().filter(|x| x.branch == branch).count();
        assert_eq!(
            log.len(),
            appended + base[branch],
            "{branch}: the head reaches the root through exactly the successes"
        );
        for pair in log.windows(2) {
            assert_eq!(
                pair[0].parent_id, pair[1].node_id,
                "{branch}: one linear chain"
            );
        }
        assert_eq!(log.last().map(|n| n.parent_id.as_str()), Some(""));
        for n in &log[..appended] {
            let success = by_node.get(n.node_id.as_str()).unwrap_or_else(|| {
                panic!("{branch}: node {} was reported by no worker", n.node_id)
            });
            assert_eq!(success.branch, branch);
            assert_eq!(
                show(&n.parent_id),
                success.expected,
                "{branch}: a node hangs under the head its append expected"
            );
            let text = match n.content.as_ref().and_then(|c| c.kind.as_ref()) {
                Some(pb::node_input::Kind::Message(m)) => text_of(&m.parts),
                other => panic!("expected a message, got {other:?}"),
            };
            assert!(
                text.starts_with(&format!("w{}-", success.worker))
                    && text.ends_with(&format!(" after {}", success.expected)),
                "{branch}: {text:?} is the content worker {} sent",
                success.worker
            );
        }
    }
    assert_eq!(
        app.node_count().await,
        2 + successes.len() as i64,
        "one node per success, none from a refused append"
    );
    assert!(
        conflicts > 0,
        "the processes never contended: the test proved nothing"
    );
}
