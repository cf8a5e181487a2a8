//! Fuzzes the real `ctxd serve` binary: random and mutated bytes into every RPC, broken gRPC
//! framing over raw HTTP/2, and valid requests with random field values (alone and in sequences
//! on live sessions). No answer may be INTERNAL, UNKNOWN or DATA_LOSS, every error carries a
//! message, the server never panics, and its memory stays flat from one equal round to the next.
//!
//! `CTXD_FUZZ_SEED=N` replays a run (the seed is printed), `CTXD_FUZZ_CASES=N` sets the requests
//! per round (default 5,000; the round runs twice).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxd::api::pb;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;
use tonic::transport::Channel;

// The API tests' `ctxd serve` child process; the fuzzer uses only part of it.
#[allow(dead_code)]
#[path = "api/daemon.rs"]
mod daemon;

#[path = "common/raw_codec.rs"]
mod raw_codec;

use daemon::Daemon;
use raw_codec::RawCodec;

const SERVICE: &str = "ctxd.v1.ContextStore";
const DEFAULT_CASES: usize = 5_000;
/// Requests in flight at once: enough to keep both cores and the group committer busy.
const WORKERS: usize = 4;
/// One request may take this long before the run counts it as hung.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// RSS the second round may add beyond what it stored and a little per request. The read cache
/// may keep every node a round stored (their decoded content, up to 256 MiB in all); the other
/// caches (each append target's state, paths, token counts) grow by an entry of a few hundred
/// bytes for the distinct things a request touches, up to their bounds. On top, SQLite's page
/// caches and the allocator's slack. Measured here: 4-6 MiB of growth over a default round
/// (allowed about 11 MiB), 13-18 MiB over 20,000 requests (allowed about 22 MiB); a leak of
/// 4 KiB in the session-id parser (two requests in three) failed it for each seed tried.
const RSS_SLACK: u64 = 8 * 1024 * 1024;
const RSS_PER_REQUEST: u64 = 256;

// ---------------------------------------------------------------- the server

/// The server's resident memory, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib * 1024
}

/// An OpenAI-compatible endpoint that accepts and drops every connection: each summarizer call
/// fails at once. Runs until the test process ends.
fn refusing_endpoint() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            drop(connection);
        }
    });
    addr
}

// ---------------------------------------------------------------- raw gRPC calls

/// One RPC of the service, as the descriptor lists it.
#[derive(Clone, Debug)]
struct Method {
    name: String,
    client_streaming: bool,
    server_streaming: bool,
}

/// Every RPC of `ctxd.v1.ContextStore`, read from the compiled-in descriptor so a new RPC is
/// fuzzed (and must get a generator below) without anyone remembering to add it.
fn methods() -> Vec<Method> {
    let set = prost_types::FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET)
        .expect("the descriptor set decodes");
    let methods: Vec<Method> = set
        .file
        .iter()
        .filter(|f| f.package() == "ctxd.v1")
        .flat_map(|f| &f.service)
        .filter(|s| format!("ctxd.v1.{}", s.name()) == SERVICE)
        .flat_map(|s| &s.method)
        .map(|m| Method {
            name: m.name().to_owned(),
            client_streaming: m.client_streaming(),
            server_streaming: m.server_streaming(),
        })
        .collect();
    assert!(
        methods.iter().any(|m| m.name == "Append") && methods.iter().any(|m| m.client_streaming),
        "the descriptor lists the service: {methods:?}"
    );
    methods
}

/// A call's answer: the response body, or the status.
type Answer = Result<Vec<u8>, tonic::Status>;

async fn call(channel: &Channel, method: &Method, messages: Vec<Vec<u8>>) -> Answer {
    let mut grpc = tonic::client::Grpc::new(channel.clone())
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("channel not ready: {e}")))?;
    let path =
        http::uri::PathAndQuery::from_str(&format!("/{SERVICE}/{}", method.name)).expect("a path");
    let answer = if method.server_streaming {
        // A server-streaming call takes one message; both ways (AppendStream), every one.
        let messages = if method.client_streaming {
            messages
        } else {
            vec![messages.into_iter().next().unwrap_or_default()]
        };
        return streamed(&mut grpc, path, messages, method.client_streaming).await;
    } else if method.client_streaming {
        let stream = tokio_stream::iter(messages);
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            grpc.client_streaming(tonic::Request::new(stream), path, RawCodec),
        )
        .await
    } else {
        let body = messages.into_iter().next().unwrap_or_default();
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            grpc.unary(tonic::Request::new(body), path, RawCodec),
        )
        .await
    };
    match answer {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within {REQUEST_TIMEOUT:?}"
        ))),
    }
}

/// A call answered by a stream: its status, or its messages concatenated. With `to_the_end`
/// (a stream the sender ends, AppendStream) all of them; otherwise the first few, once it has
/// sent them, ended, or gone quiet for a moment (a watch may never end).
async fn streamed(
    grpc: &mut tonic::client::Grpc<Channel>,
    path: http::uri::PathAndQuery,
    messages: Vec<Vec<u8>>,
    to_the_end: bool,
) -> Answer {
    let started = tokio::time::timeout(
        REQUEST_TIMEOUT,
        grpc.streaming(
            tonic::Request::new(tokio_stream::iter(messages)),
            path,
            RawCodec,
        ),
    )
    .await
    .map_err(|_| {
        tonic::Status::deadline_exceeded(format!("no answer within {REQUEST_TIMEOUT:?}"))
    })??;
    let mut stream = started.into_inner();
    let (most, quiet) = if to_the_end {
        (usize::MAX, REQUEST_TIMEOUT)
    } else {
        (4, Duration::from_millis(200))
    };
    let mut out = Vec::new();
    for _ in 0..most {
        match tokio::time::timeout(quiet, stream.message()).await {
            Ok(Ok(Some(message))) => out.extend(message),
            Ok(Ok(None)) => break,
            Ok(Err(status)) => return Err(status),
            Err(_) if to_the_end => {
                return Err(tonic::Status::deadline_exceeded(format!(
                    "the stream did not end within {REQUEST_TIMEOUT:?}"
                )));
            }
            Err(_) => break,
        }
    }
    Ok(out)
}

/// Sends `body` as the raw HTTP/2 body of a gRPC call (in `pieces` DATA frames) on its own
/// connection, so broken gRPC framing reaches the server as it is.
async fn call_framed(addr: SocketAddr, method: &Method, body: Vec<u8>, pieces: usize) -> Answer {
    let transport = |e: &dyn std::fmt::Display| tonic::Status::unknown(format!("transport: {e}"));
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| transport(&e))?;
        let (client, connection) = h2::client::handshake(tcp)
            .await
            .map_err(|e| transport(&e))?;
        tokio::spawn(connection);
        let mut client = client.ready().await.map_err(|e| transport(&e))?;
        let request = http::Request::post(format!("http://{addr}/{SERVICE}/{}", method.name))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("a request");
        let (response, mut send) = client
            .send_request(request, body.is_empty())
            .map_err(|e| transport(&e))?;
        if !body.is_empty() {
            let size = body.len().div_ceil(pieces.max(1));
            let chunks: Vec<&[u8]> = body.chunks(size).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                send.send_data(
                    prost::bytes::Bytes::copy_from_slice(chunk),
                    i + 1 == chunks.len(),
                )
                .map_err(|e| transport(&e))?;
            }
        }
        let response = response.await.map_err(|e| transport(&e))?;
        let (parts, mut body) = response.into_parts();
        let mut answer = parts.headers;
        if !answer.contains_key("grpc-status") {
            let mut received = Vec::new();
            loop {
                // A stream may never end (a valid Watch): quiet for a moment, it has answered.
                let data = if method.server_streaming {
                    match tokio::time::timeout(Duration::from_millis(500), body.data()).await {
                        Ok(data) => data,
                        Err(_) => return Ok(Vec::new()),
                    }
                } else {
                    body.data().await
                };
                let Some(data) = data else { break };
                let data = data.map_err(|e| transport(&e))?;
                let _ = body.flow_control().release_capacity(data.len());
                received.extend_from_slice(&data);
            }
            answer = body
                .trailers()
                .await
                .map_err(|e| transport(&e))?
                .unwrap_or_default();
        }
        match tonic::Status::from_header_map(&answer) {
            None => Err(transport(&"an answer without grpc-status")),
            Some(status) if status.code() == Code::Ok => Ok(Vec::new()),
            Some(status) => Err(status),
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {REQUEST_TIMEOUT:?}"
            )))
        })
}

/// gRPC length-prefixed frames of `messages`, with lies: compressed flags without an encoding,
/// invalid flags, lengths past the end or short of it, a body cut anywhere, no frame at all.
fn frames(g: &mut Gen, messages: &[Vec<u8>]) -> Vec<u8> {
    let mut body = Vec::new();
    for m in messages {
        let flag = match g.below(8) {
            0 => 1,
            1 => g.rng.random_range(2..=255),
            _ => 0,
        };
        let len = m.len() as u32;
        let len = match g.below(8) {
            0 => len + 1 + g.rng.random_range(0..1000),
            1 => len.saturating_sub(g.rng.random_range(1..5)),
            2 => u32::MAX,
            3 => 64 * 1024 * 1024 + 1,
            _ => len,
        };
        body.push(flag);
        body.extend(len.to_be_bytes());
        body.extend(m);
    }
    match g.below(6) {
        0 => body.truncate(g.below(body.len() + 1)),
        1 => body.clear(),
        _ => {}
    }
    body
}

// ---------------------------------------------------------------- what a round found

/// One answer the server must never give.
#[derive(Debug)]
struct Failure {
    method: String,
    code: Code,
    message: String,
    case: String,
}

#[derive(Default)]
struct Tally {
    requests: usize,
    /// Bytes of the requests the server stored (sessions, appends and imports answered OK).
    stored: usize,
    by_code: BTreeMap<String, usize>,
    /// Answers by RPC and code, to show how far the generators get.
    by_method: BTreeMap<String, BTreeMap<String, usize>>,
    failures: Vec<Failure>,
}

impl Tally {
    /// Counts `answer` to `messages`; `label` says what kind of case sent them.
    fn record(&mut self, method: &str, answer: &Answer, label: &str, messages: &[Vec<u8>]) {
        self.requests += 1;
        if answer.is_ok()
            && matches!(
                method,
                "Append" | "AppendStream" | "ImportSession" | "CreateSession"
            )
        {
            self.stored += messages.iter().map(Vec::len).sum::<usize>();
        }
        let code = answer.as_ref().map_or_else(|s| s.code(), |_| Code::Ok);
        *self.by_code.entry(format!("{code:?}")).or_default() += 1;
        *self
            .by_method
            .entry(method.to_owned())
            .or_default()
            .entry(format!("{code:?}"))
            .or_default() += 1;
        if let Err(status) = answer {
            let forbidden = matches!(code, Code::Internal | Code::Unknown | Code::DataLoss);
            if forbidden || status.message().is_empty() {
                self.failures.push(Failure {
                    method: method.to_owned(),
                    code,
                    message: status.message().to_owned(),
                    case: describe(label, messages),
                });
            }
        }
    }

    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.stored += other.stored;
        for (code, n) in other.by_code {
            *self.by_code.entry(code).or_default() += n;
        }
        for (method, codes) in other.by_method {
            let mine = self.by_method.entry(method).or_default();
            for (code, n) in codes {
                *mine.entry(code).or_default() += n;
            }
        }
        self.failures.extend(other.failures);
    }
}

/// A failed case, short enough to read: its kind and the start of each message in hex.
fn describe(label: &str, messages: &[Vec<u8>]) -> String {
    let hex = |m: &Vec<u8>| {
        let shown: String = m.iter().take(160).map(|b| format!("{b:02x}")).collect();
        format!(
            "{} bytes: {shown}{}",
            m.len(),
            if m.len() > 160 { "…" } else { "" }
        )
    };
    let shown: Vec<String> = messages.iter().map(hex).collect();
    format!("{label} [{}]", shown.join(", "))
}

// ---------------------------------------------------------------- random values

/// What a worker has seen the server create, so requests can name real things (and things of
/// the wrong session).
#[derive(Default)]
struct Pool {
    sessions: Vec<String>,
    nodes: Vec<String>,
    functions: Vec<String>,
    branches: Vec<String>,
    compactions: Vec<String>,
    call_ids: Vec<String>,
    idempotency_keys: Vec<String>,
}

impl Pool {
    fn keep(list: &mut Vec<String>, value: String) {
        // Bounded, so equal rounds stay equal in cost.
        if list.len() >= 256 {
            list.swap_remove(0);
        }
        list.push(value);
    }
}

struct Gen {
    rng: StdRng,
    pool: Pool,
    /// How often a field takes an edge value instead of a plausible one: varied per case, so
    /// some requests are junk everywhere and some get deep into the handlers.
    wild: f64,
}

const UNICODE: &[&str] = &[
    "日本語",
    "🎉",
    "\u{200d}",
    "\u{feff}",
    "é",
    "e\u{301}",
    "\u{202e}",
    "𝔘",
    "\u{fffd}",
    "ß",
    "\u{10ffff}",
    "\n",
    "\t",
    "\r\n",
    "\"",
    "\\",
    "{",
    "}",
    "[",
];

const BRANCHES: &[&str] = &[
    "main",
    "b",
    "feature/x-1",
    "v1.2",
    "a/../b",
    "..",
    "/x",
    "x/",
    "a//b",
    "has space",
    ".hidden",
    "x.lock",
    "-x",
    "é",
    "a\nb",
    "a\0b",
    "a~b",
    "HEAD",
];

const JSONS: &[&str] = &[
    "{}",
    "[]",
    "null",
    "1",
    "\"s\"",
    "{\"path\": \"README.md\"}",
    "{not json",
    "{\"a\":}",
    "[1,2",
    "",
    " ",
    "\u{feff}{}",
    "{\"a\":1}{\"b\":2}",
    "1e999",
    "-0",
    "{\"a\":\"\\ud800\"}",
];

impl Gen {
    fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            pool: Pool::default(),
            wild: 0.5,
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// Whether this field gets an edge value.
    /// Empty with probability `p`, else what `value` draws (in that order, so a seed replays).
    fn or_empty(&mut self, p: f64, value: impl FnOnce(&mut Self) -> String) -> String {
        if self.chance(p) {
            String::new()
        } else {
            value(self)
        }
    }

    fn edgy(&mut self) -> bool {
        self.rng.random_bool(self.wild)
    }

    /// Plausible text.
    fn words(&mut self, max_units: usize) -> String {
        let unit = *self.pick(&["lorem ipsum ", "fn main() {} ", "日本語 ", "{\"a\": 1} "]);
        unit.repeat(1 + self.below(max_units))
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = match self.below(4) {
            0 => self.below(8),
            1 | 2 => self.below(256),
            _ => self.below(max + 1),
        };
        let mut out = vec![0u8; len];
        self.rng.fill(&mut out[..]);
        out
    }

    fn uuid(&mut self) -> String {
        let b: [u8; 16] = self.rng.random();
        uuid::Uuid::from_bytes(b).to_string()
    }

    /// A string from the edges: empty, huge, unicode, NUL, JSON-ish, UUID-ish, known ids.
    fn string(&mut self) -> String {
        if !self.edgy() {
            return self.words(20);
        }
        match self.below(14) {
            0 => String::new(),
            1 => {
                let len = if self.chance(0.1) {
                    self.rng.random_range(64 * 1024..=256 * 1024)
                } else {
                    self.rng.random_range(1024..=16 * 1024)
                };
                let unit = self.pick(&["x", "ab ", "日本", "{\"k\": [1, 2]} ", "\0"]);
                unit.repeat(len / unit.len().max(1))
            }
            2 => (0..self.below(12)).map(|_| *self.pick(UNICODE)).collect(),
            3 => "\0".repeat(self.below(4) + 1) + "after-nul",
            4 => self.pick(JSONS).to_string(),
            5 => self
                .pick(&[
                    "not-a-uuid",
                    "42",
                    "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
                    "01890a5d-ac96-774b-bcce-b302099a8057-extra",
                    "00000000-0000-0000-0000-000000000000",
                    "ffffffff-ffff-ffff-ffff-ffffffffffff",
                    "{01890a5d-ac96-774b-bcce-b302099a8057}",
                    "01890A5D-AC96-774B-BCCE-B302099A8057",
                    "01890a5dac96774bbcceb302099a8057",
                    "urn:uuid:01890a5d-ac96-774b-bcce-b302099a8057",
                ])
                .to_string(),
            6 => self.uuid(),
            7 => self.known(Kind::Session),
            8 => self.known(Kind::Node),
            9 => self.pick(BRANCHES).to_string(),
            10 => "[".repeat(self.below(5000) + 1),
            11 => {
                let n = self.below(40);
                (0..n)
                    .map(|_| char::from(self.rng.random_range(0x20u8..0x7f)))
                    .collect()
            }
            12 => {
                let n = self.below(40);
                (0..n)
                    .filter_map(|_| char::from_u32(self.rng.random()))
                    .collect()
            }
            _ => "hello".to_owned(),
        }
    }

    /// A value for an id field: mostly a real one of that kind, else anything.
    fn id(&mut self, kind: Kind) -> String {
        if !self.edgy() || self.chance(0.3) {
            self.known(kind)
        } else {
            self.string()
        }
    }

    fn known(&mut self, kind: Kind) -> String {
        let list = match kind {
            Kind::Session => &self.pool.sessions,
            Kind::Node => &self.pool.nodes,
            Kind::Function => &self.pool.functions,
            Kind::Compaction => &self.pool.compactions,
        };
        if list.is_empty() {
            return self.uuid();
        }
        let i = self.rng.random_range(0..list.len());
        list[i].clone()
    }

    fn branch(&mut self) -> String {
        if !self.edgy() {
            return if self.chance(0.5) {
                "main".into()
            } else {
                format!("b{}", self.below(4))
            };
        }
        if self.chance(0.5) && !self.pool.branches.is_empty() {
            let i = self.below(self.pool.branches.len());
            self.pool.branches[i].clone()
        } else if self.chance(0.7) {
            self.pick(BRANCHES).to_string()
        } else {
            self.string()
        }
    }

    /// A count: small and plausible, or from the edges.
    fn u32(&mut self) -> u32 {
        if !self.edgy() {
            return self.rng.random_range(0..20);
        }
        match self.below(8) {
            0 => 0,
            1 => 1,
            2 => u32::MAX,
            3 => u32::MAX - self.rng.random_range(0..3),
            4 => 1 << self.below(32),
            5 => self.rng.random(),
            _ => self.rng.random_range(0..300),
        }
    }

    fn i64(&mut self) -> i64 {
        if !self.edgy() {
            return 0;
        }
        match self.below(7) {
            0 => 0,
            1 => -1,
            2 => i64::MIN,
            3 => i64::MAX,
            4 => self.rng.random(),
            _ => 1_750_000_000_000 + self.rng.random_range(-10_000_000_000..10_000_000_000),
        }
    }

    /// An enum value: mostly known ones, sometimes unknown or negative.
    fn enumeration(&mut self, known: i32) -> i32 {
        if !self.edgy() {
            return self.rng.random_range(0..=known);
        }
        match self.below(10) {
            0 => -1,
            1 => i32::MAX,
            2 => i32::MIN,
            3 => known + 1 + self.rng.random_range(0..100),
            _ => self.rng.random_range(0..=known),
        }
    }

    fn tokenizer(&mut self) -> String {
        if self.edgy() && self.chance(0.3) {
            return self.string();
        }
        match self.below(10) {
            0..=5 => String::new(),
            6 | 7 => "heuristic".into(),
            8 => "o200k_base".into(),
            _ => "cl100k_base".into(),
        }
    }

    fn budget(&mut self) -> Option<pb::Budget> {
        if self.chance(0.2) {
            return None;
        }
        let small = |g: &mut Self| {
            if g.edgy() {
                g.u32()
            } else {
                g.rng.random_range(0..500)
            }
        };
        Some(pb::Budget {
            context_window: if self.edgy() {
                self.u32()
            } else {
                self.rng.random_range(500..20_000)
            },
            output_reserve: small(self),
            system_tokens: small(self),
            tools_tokens: small(self),
            schema_tokens: small(self),
        })
    }

    fn policy(&mut self) -> Option<pb::RenderPolicy> {
        if self.chance(0.4) {
            return None;
        }
        let field = |g: &mut Self| {
            if g.chance(0.5) {
                0
            } else if g.edgy() {
                g.u32()
            } else {
                g.rng.random_range(1..10)
            }
        };
        Some(pb::RenderPolicy {
            max_tool_result_chars: field(self),
            microcompact_first: field(self),
            microcompact_every: field(self),
            microcompact_keep: field(self),
            idle_minutes: field(self),
            retain_turns: field(self),
            snip: [None, Some(true), Some(false)][self.below(3)],
            reactive: self.chance(0.2),
            // Unknown modes too: they are refused, naming the field.
            microcompact: if self.edgy() {
                self.u32() as i32
            } else {
                self.below(3) as i32
            },
            recent_tool_result_chars: field(self),
            clear_at_least_tokens: self.chance(0.5).then(|| field(self)),
            max_tool_input_chars: self.chance(0.5).then(|| field(self)),
            max_assistant_text_chars: self.chance(0.5).then(|| field(self)),
            recent_assistant_text_chars: self.chance(0.5).then(|| field(self)),
            recent_tool_input_chars: self.chance(0.5).then(|| field(self)),
            payback_odds: field(self),
            // Out of range, NaN and infinite prices too: refused, naming the field.
            cache_read_price: self.chance(0.3).then(|| self.price()),
            cache_write_price: self.chance(0.3).then(|| self.price()),
            reasoning: if self.edgy() {
                self.u32() as i32
            } else {
                self.below(3) as i32
            },
        })
    }

    fn price(&mut self) -> f64 {
        const PRICES: [f64; 8] = [0.025, 0.05, 0.1, 1.25, 0.0, -1.0, f64::NAN, f64::INFINITY];
        PRICES[self.below(PRICES.len())]
    }

    /// A model name: one the table knows, one it does not, or any string.
    fn model(&mut self) -> String {
        match self.below(4) {
            0 => String::new(),
            1 => "claude-opus-5-5".into(),
            2 => "gpt-5".into(),
            _ => self.string(),
        }
    }

    fn metadata(&mut self) -> std::collections::HashMap<String, String> {
        (0..self.below(4))
            .map(|_| {
                let key = if !self.edgy() {
                    format!("k{}", self.below(5))
                } else {
                    self.string()
                };
                (key, self.string())
            })
            .collect()
    }

    fn part(&mut self) -> pb::ContentPart {
        use pb::content_part::Part;
        use pb::media::Source;
        let part = match if self.edgy() { self.below(10) } else { 9 } {
            0 => None,
            1 => Some(Part::Media(pb::Media {
                mime_type: if !self.edgy() {
                    "image/png".into()
                } else {
                    self.string()
                },
                source: match self.below(3) {
                    0 => None,
                    1 => Some(Source::Data(self.bytes(4096))),
                    _ => Some(Source::Url(self.string())),
                },
            })),
            _ => Some(Part::Text(self.string())),
        };
        pb::ContentPart { part }
    }

    fn parts(&mut self) -> Vec<pb::ContentPart> {
        let n = if self.edgy() { self.below(4) } else { 1 };
        (0..n).map(|_| self.part()).collect()
    }

    fn call_id(&mut self) -> String {
        if self.chance(0.6) && !self.pool.call_ids.is_empty() {
            let i = self.below(self.pool.call_ids.len());
            self.pool.call_ids[i].clone()
        } else if self.chance(0.5) {
            let id = format!("call_{}", self.below(1000));
            Pool::keep(&mut self.pool.call_ids, id.clone());
            id
        } else {
            self.string()
        }
    }

    /// A node of any kind with random fields.
    fn node(&mut self) -> pb::NodeInput {
        use pb::node_input::Kind as K;
        let kind = match self.below(9) {
            0 if self.edgy() => None,
            0..=3 => Some(K::Message(pb::Message {
                role: if self.edgy() {
                    self.enumeration(5)
                } else {
                    self.rng.random_range(1..=4)
                },
                parts: self.parts(),
                tool_calls: (0..self.below(3))
                    .map(|_| pb::ToolCall {
                        call_id: self.call_id(),
                        name: if self.edgy() {
                            self.string()
                        } else {
                            "read_file".into()
                        },
                        arguments_json: if self.edgy() {
                            self.pick(JSONS).to_string()
                        } else {
                            "{}".into()
                        },
                    })
                    .collect(),
            })),
            4 | 5 => Some(K::ToolResult(pb::ToolResult {
                call_id: self.call_id(),
                name: self.or_empty(0.7, Gen::string),
                parts: self.parts(),
                is_error: self.chance(0.3),
            })),
            6 | 7 => Some(K::FunctionCall(pb::FunctionCall {
                call_id: self.call_id(),
                name: self.or_empty(0.7, Gen::string),
                input: self.string(),
                expose: self.enumeration(3),
            })),
            _ => Some(K::FunctionResult(pb::FunctionResult {
                call_id: self.call_id(),
                output: self.string(),
                status: self.enumeration(2),
                function_id: if !self.edgy() || self.chance(0.8) {
                    String::new()
                } else {
                    self.id(Kind::Function)
                },
                chain_head_id: if !self.edgy() || self.chance(0.8) {
                    String::new()
                } else {
                    self.id(Kind::Node)
                },
            })),
        };
        pb::NodeInput {
            kind,
            pinned: false,
        }
    }

    /// A well-formed history: a user turn, an assistant calling tools, their results, and
    /// sometimes a function that answers one of the calls.
    fn script(&mut self) -> Vec<pb::NodeInput> {
        use pb::node_input::Kind as K;
        let text = |g: &mut Self, len: usize| g.words(len);
        let mut nodes = Vec::new();
        if self.chance(0.3) {
            nodes.push(message(pb::Role::System, text(self, 30)));
        }
        for turn in 0..1 + self.below(4) {
            nodes.push(message(pb::Role::User, text(self, 40)));
            let calls: Vec<String> = (0..self.below(4)).map(|c| format!("t{turn}c{c}")).collect();
            nodes.push(pb::NodeInput {
                kind: Some(K::Message(pb::Message {
                    role: pb::Role::Assistant.into(),
                    parts: vec![text_part(text(self, 20))],
                    tool_calls: calls
                        .iter()
                        .map(|id| pb::ToolCall {
                            call_id: id.clone(),
                            name: "read_file".into(),
                            arguments_json: "{\"path\": \"README.md\"}".into(),
                        })
                        .collect(),
                })),
                pinned: false,
            });
            for (c, id) in calls.iter().enumerate() {
                Pool::keep(&mut self.pool.call_ids, id.clone());
                if c == 0 && self.chance(0.3) {
                    nodes.push(pb::NodeInput {
                        kind: Some(K::FunctionCall(pb::FunctionCall {
                            call_id: id.clone(),
                            name: String::new(),
                            input: text(self, 10),
                            expose: self.rng.random_range(0..4),
                        })),
                        pinned: false,
                    });
                    // Left open: later appends may write into it or close it.
                    break;
                }
                nodes.push(pb::NodeInput {
                    kind: Some(K::ToolResult(pb::ToolResult {
                        call_id: id.clone(),
                        name: String::new(),
                        parts: vec![text_part(text(self, 300))],
                        is_error: self.chance(0.2),
                    })),
                    pinned: false,
                });
            }
            if nodes
                .last()
                .is_some_and(|n| matches!(n.kind, Some(K::FunctionCall(_))))
            {
                break;
            }
            nodes.push(message(pb::Role::Assistant, text(self, 20)));
        }
        nodes
    }

    fn render_target(&mut self) -> Option<pb::render_request::Target> {
        use pb::render_request::Target;
        match self.below(5) {
            0 => None,
            1 => Some(Target::Branch(self.branch())),
            2 => Some(Target::NodeId(self.id(Kind::Node))),
            3 => Some(Target::FunctionId(self.id(Kind::Function))),
            _ => Some(Target::Branch(String::new())),
        }
    }

    fn import_data(&mut self) -> (i32, Vec<u8>) {
        const CLAUDE: &str = include_str!("../testdata/claude-code/short.jsonl");
        const NEUTRAL: &str = include_str!("../testdata/traces/swe-marshmallow-1867-fc.jsonl");
        let which = self.below(3);
        // The file's own format or detection, unless this case is wild.
        let format = if self.edgy() {
            self.enumeration(3)
        } else if self.chance(0.5) {
            0
        } else {
            [2, 1, 3][which]
        };
        let valid = match which {
            0 => CLAUDE.to_owned(),
            1 => NEUTRAL.lines().take(8).collect::<Vec<_>>().join("\n"),
            _ => serde_json::json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "ls", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a b"},
                {"role": "assistant", "content": "done"}
            ])
            .to_string(),
        };
        let data = if !self.edgy() {
            valid.into_bytes()
        } else if self.chance(0.3) {
            self.bytes(4096)
        } else {
            self.mutate(valid.into_bytes())
        };
        (format, data)
    }

    /// Mutates an encoded message: bit flips, truncation, splicing, varint and length lies.
    fn mutate(&mut self, mut data: Vec<u8>) -> Vec<u8> {
        for _ in 0..1 + self.below(3) {
            let len = data.len();
            match self.below(9) {
                0 if len > 0 => {
                    let i = self.below(len);
                    data[i] ^= 1 << self.below(8);
                }
                1 if len > 0 => data.truncate(self.below(len)),
                2 => {
                    // Splice random bytes in.
                    let at = self.below(len + 1);
                    let bytes = self.bytes(64);
                    data.splice(at..at, bytes);
                }
                3 if len > 1 => {
                    // Splice the message into itself.
                    let (a, b) = (self.below(len), self.below(len));
                    let piece = data[a.min(b)..a.max(b)].to_vec();
                    let at = self.below(len + 1);
                    data.splice(at..at, piece);
                }
                4 => {
                    // A length-delimited field whose length lies.
                    let field = self.rng.random_range(1u32..16);
                    let mut lie = Vec::new();
                    prost::encoding::encode_key(
                        field,
                        prost::encoding::WireType::LengthDelimited,
                        &mut lie,
                    );
                    let claimed = match self.below(3) {
                        0 => u64::MAX,
                        1 => u64::from(u32::MAX) + 1,
                        _ => self.rng.random_range(1..1_000_000),
                    };
                    prost::encoding::encode_varint(claimed, &mut lie);
                    lie.extend(self.bytes(16));
                    let at = self.below(len + 1);
                    data.splice(at..at, lie);
                }
                5 => {
                    // An over-long or unterminated varint.
                    let at = self.below(len + 1);
                    let mut run = vec![0xffu8; 1 + self.below(12)];
                    if self.chance(0.5) {
                        run.push(0x01);
                    }
                    data.splice(at..at, run);
                }
                6 => {
                    // A key with a random field number and wire type (groups, invalid types).
                    let key = self.rng.random_range(0u64..(1 << 35));
                    let mut bytes = Vec::new();
                    prost::encoding::encode_varint(key, &mut bytes);
                    let at = self.below(len + 1);
                    data.splice(at..at, bytes);
                }
                7 => data.extend(self.bytes(32)),
                _ => {
                    // A nested message of random bytes under a real field number.
                    let field = self.rng.random_range(1u32..12);
                    let inner = self.bytes(64);
                    prost::encoding::bytes::encode(field, &inner, &mut data);
                }
            }
        }
        data
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Session,
    Node,
    Function,
    Compaction,
}

fn text_part(text: String) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(text)),
    }
}

fn message(role: pb::Role, text: String) -> pb::NodeInput {
    pb::NodeInput {
        kind: Some(pb::node_input::Kind::Message(pb::Message {
            role: role.into(),
            parts: vec![text_part(text)],
            tool_calls: vec![],
        })),
        pinned: false,
    }
}

// ---------------------------------------------------------------- structured requests

/// A random request of `method` with random field values, encoded (ImportSession: its chunks).
fn request(g: &mut Gen, method: &str) -> Vec<Vec<u8>> {
    let encoded = match method {
        "CreateSession" => pb::CreateSessionRequest {
            metadata: g.metadata(),
            idempotency_key: g.string(),
        }
        .encode_to_vec(),
        "GetSession" => pb::GetSessionRequest {
            session_id: g.id(Kind::Session),
        }
        .encode_to_vec(),
        "ListSessions" => pb::ListSessionsRequest {
            page_size: if g.chance(0.7) {
                g.rng.random_range(0..20)
            } else {
                g.u32()
            },
            page_token: g.or_empty(0.5, |g| g.id(Kind::Session)),
            // A prefix of a real id, or anything.
            id_prefix: if g.chance(0.5) {
                let id = g.id(Kind::Session);
                let cut = g.rng.random_range(0..=id.len());
                id.get(..cut).unwrap_or_default().to_owned()
            } else {
                g.or_empty(0.7, |g| g.string())
            },
            metadata: g.metadata(),
        }
        .encode_to_vec(),
        "Append" => {
            let nodes = if g.chance(0.3) {
                g.script()
            } else {
                (0..g.below(5)).map(|_| g.node()).collect()
            };
            pb::AppendRequest {
                session_id: g.id(Kind::Session),
                branch: g.or_empty(0.6, Gen::branch),
                function_id: g.or_empty(0.7, |g| g.id(Kind::Function)),
                expected_head_id: if g.chance(0.7) {
                    None
                } else if g.chance(0.3) {
                    Some(String::new())
                } else {
                    Some(g.id(Kind::Node))
                },
                idempotency_key: if g.chance(0.7) {
                    String::new()
                } else if g.chance(0.5) && !g.pool.idempotency_keys.is_empty() {
                    let i = g.below(g.pool.idempotency_keys.len());
                    g.pool.idempotency_keys[i].clone()
                } else {
                    let key = g.string();
                    Pool::keep(&mut g.pool.idempotency_keys, key.clone());
                    key
                },
                nodes,
            }
            .encode_to_vec()
        }
        "GetNodes" => pb::GetNodesRequest {
            session_id: g.id(Kind::Session),
            node_ids: (0..g.below(5)).map(|_| g.id(Kind::Node)).collect(),
        }
        .encode_to_vec(),
        "ListGatewayCalls" => pb::ListGatewayCallsRequest {
            session_id: g.id(Kind::Session),
            page_size: g.u32(),
            // A call id is a UUID like any other: one that names no call is a cursor too.
            page_token: g.or_empty(0.6, |g| if g.chance(0.5) { g.uuid() } else { g.string() }),
        }
        .encode_to_vec(),
        "Log" => pb::LogRequest {
            session_id: g.id(Kind::Session),
            branch: g.or_empty(0.5, Gen::branch),
            node_id: g.or_empty(0.5, |g| g.id(Kind::Node)),
            limit: g.u32(),
            page_token: g.or_empty(0.6, |g| g.id(Kind::Node)),
        }
        .encode_to_vec(),
        "CreateBranch" => pb::CreateBranchRequest {
            session_id: g.id(Kind::Session),
            name: g.branch(),
            from_node_id: g.or_empty(0.2, |g| g.id(Kind::Node)),
        }
        .encode_to_vec(),
        "ListBranches" => pb::ListBranchesRequest {
            session_id: g.id(Kind::Session),
        }
        .encode_to_vec(),
        "DeleteBranch" => pb::DeleteBranchRequest {
            session_id: g.id(Kind::Session),
            name: g.branch(),
        }
        .encode_to_vec(),
        "ResetBranch" => pb::ResetBranchRequest {
            session_id: g.id(Kind::Session),
            name: g.branch(),
            to_node_id: g.or_empty(0.2, |g| g.id(Kind::Node)),
            expected_head_id: g.chance(0.5).then(|| g.or_empty(0.3, |g| g.id(Kind::Node))),
        }
        .encode_to_vec(),
        "Render" => pb::RenderRequest {
            session_id: g.id(Kind::Session),
            target: g.render_target(),
            tokenizer: g.tokenizer(),
            callers: g.enumeration(2),
            budget: g.budget(),
            policy: g.policy(),
            now_unix_ms: g.i64(),
            format: g.enumeration(3),
            strict_format: g.chance(0.5),
            last_call_unix_ms: g.i64(),
            model: g.model(),
        }
        .encode_to_vec(),
        "ContextStats" => {
            use pb::context_stats_request::Target;
            pb::ContextStatsRequest {
                session_id: g.id(Kind::Session),
                target: g.render_target().map(|t| match t {
                    pb::render_request::Target::Branch(b) => Target::Branch(b),
                    pb::render_request::Target::NodeId(n) => Target::NodeId(n),
                    pb::render_request::Target::FunctionId(f) => Target::FunctionId(f),
                }),
                tokenizer: g.tokenizer(),
                callers: g.enumeration(2),
                budget: g.budget(),
                policy: g.policy(),
                now_unix_ms: g.i64(),
                last_call_unix_ms: g.i64(),
                model: g.model(),
            }
            .encode_to_vec()
        }
        "PrepareCompaction" => pb::PrepareCompactionRequest {
            session_id: g.id(Kind::Session),
            branch: g.or_empty(0.6, Gen::branch),
            budget: g.budget(),
            tokenizer: g.tokenizer(),
            retain_turns: g.u32(),
            instructions: g.string(),
            max_tool_result_chars: g.u32(),
            format: g.enumeration(3),
            from_node_id: g.or_empty(0.7, |g| g.id(Kind::Node)),
            to_node_id: g.or_empty(0.7, |g| g.id(Kind::Node)),
            cache_sharing_request: g.chance(0.5),
            policy: g.policy(),
        }
        .encode_to_vec(),
        "CommitSummary" => pb::CommitSummaryRequest {
            compaction_id: g.id(Kind::Compaction),
            text: if g.chance(0.5) {
                "short".into()
            } else {
                g.string()
            },
            model: g.string(),
        }
        .encode_to_vec(),
        "CancelCompaction" => pb::CancelCompactionRequest {
            compaction_id: g.id(Kind::Compaction),
            reason: g.string(),
        }
        .encode_to_vec(),
        "ListSummaries" => pb::ListSummariesRequest {
            session_id: g.id(Kind::Session),
            branch: g.or_empty(0.6, Gen::branch),
        }
        .encode_to_vec(),
        "Compact" => pb::CompactRequest {
            session_id: g.id(Kind::Session),
            branch: g.or_empty(0.6, Gen::branch),
            budget: g.budget(),
            tokenizer: g.tokenizer(),
            retain_turns: g.u32(),
            instructions: g.string(),
            max_tool_result_chars: g.u32(),
            from_node_id: g.or_empty(0.7, |g| g.id(Kind::Node)),
            to_node_id: g.or_empty(0.7, |g| g.id(Kind::Node)),
            request_form: g.enumeration(3),
            policy: g.policy(),
        }
        .encode_to_vec(),
        "Recall" => pb::RecallRequest {
            session_id: g.id(Kind::Session),
            // A reference's shape, or anything.
            reference: if g.chance(0.5) {
                (0..12)
                    .map(|_| char::from(b"0123456789abcdef"[g.below(16)]))
                    .collect()
            } else {
                g.string()
            },
            max_chars: if g.chance(0.5) { 0 } else { g.u32() },
        }
        .encode_to_vec(),
        "RecallTool" => pb::RecallToolRequest {}.encode_to_vec(),
        "Pin" | "Unpin" => pb::PinRequest {
            session_id: g.id(Kind::Session),
            node_ids: (0..g.below(4)).map(|_| g.id(Kind::Node)).collect(),
        }
        .encode_to_vec(),
        "DeleteSession" => pb::DeleteSessionRequest {
            // Mostly ids never seen: deleting the pool's sessions would starve the other RPCs.
            session_id: if g.chance(0.1) {
                g.id(Kind::Session)
            } else {
                g.string()
            },
        }
        .encode_to_vec(),
        "ExportSession" => pb::ExportSessionRequest {
            session_id: g.id(Kind::Session),
            format: g.enumeration(4),
            branch: g.or_empty(0.5, Gen::branch),
        }
        .encode_to_vec(),
        "Watch" => pb::WatchRequest {
            session_id: g.id(Kind::Session),
            branch: g.or_empty(0.5, Gen::branch),
            after_cursor: g.or_empty(0.7, Gen::string),
            after_node_id: g.or_empty(0.8, |g| g.id(Kind::Node)),
        }
        .encode_to_vec(),
        // Never a path the fuzzer could write over: relative (refused), or in a missing directory.
        "BackupDatabase" => pb::BackupDatabaseRequest {
            to: match g.below(3) {
                0 => g.string().trim_start_matches('/').to_owned(),
                1 => format!("/nonexistent-ctxd-fuzz/{}.db", g.uuid()),
                _ => String::new(),
            },
        }
        .encode_to_vec(),
        "CollectGarbage" => pb::CollectGarbageRequest {}.encode_to_vec(),
        "ImportSession" => {
            let (format, data) = g.import_data();
            let metadata = g.metadata();
            // The file in 1-4 chunks; only the first carries format and metadata.
            let pieces = 1 + g.below(4);
            let size = data.len().div_ceil(pieces).max(1);
            let mut chunks: Vec<Vec<u8>> = data
                .chunks(size)
                .enumerate()
                .map(|(i, piece)| {
                    pb::ImportChunk {
                        format: if i == 0 { format } else { g.enumeration(3) },
                        metadata: if i == 0 {
                            metadata.clone()
                        } else {
                            Default::default()
                        },
                        data: piece.to_vec(),
                        idempotency_key: if i == 0 { g.string() } else { String::new() },
                    }
                    .encode_to_vec()
                })
                .collect();
            if chunks.is_empty() || g.chance(0.05) {
                chunks.push(Vec::new());
            }
            return chunks;
        }
        // A run of appends on one stream, now and then none.
        "AppendStream" => {
            return (0..g.below(6)).flat_map(|_| request(g, "Append")).collect();
        }
        other => panic!("no generator for the RPC {other}: add one to tests/fuzz.rs"),
    };
    vec![encoded]
}

/// What a successful answer tells the worker about the server's state.
fn learn(g: &mut Gen, method: &str, body: &[u8]) {
    let pool = &mut g.pool;
    let session = |s: pb::Session, pool: &mut Pool| {
        Pool::keep(&mut pool.sessions, s.session_id);
        for b in s.branches {
            if !b.head_id.is_empty() {
                Pool::keep(&mut pool.nodes, b.head_id);
            }
            Pool::keep(&mut pool.branches, b.name);
        }
    };
    match method {
        "CreateSession" | "GetSession" => {
            if let Ok(s) = pb::Session::decode(body) {
                session(s, pool);
            }
        }
        "Append" => {
            if let Ok(r) = pb::AppendResponse::decode(body) {
                for id in r.node_ids {
                    Pool::keep(&mut pool.nodes, id.clone());
                    // Any node may be a function call: naming it as one is a fair request either way.
                    Pool::keep(&mut pool.functions, id);
                }
            }
        }
        // The answers concatenated: decoded as one, their `appends` add up.
        "AppendStream" => {
            if let Ok(r) = pb::AppendStreamResponse::decode(body) {
                for id in r.appends.into_iter().flat_map(|a| a.node_ids) {
                    Pool::keep(&mut pool.nodes, id.clone());
                    Pool::keep(&mut pool.functions, id);
                }
            }
        }
        "CreateBranch" => {
            if let Ok(b) = pb::Branch::decode(body) {
                Pool::keep(&mut pool.branches, b.name);
            }
        }
        "PrepareCompaction" => {
            if let Ok(r) = pb::PrepareCompactionResponse::decode(body)
                && !r.compaction_id.is_empty()
            {
                Pool::keep(&mut pool.compactions, r.compaction_id);
            }
        }
        "ImportSession" => {
            if let Ok(r) = pb::ImportSessionResponse::decode(body)
                && let Some(s) = r.session
            {
                session(s, pool);
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------- a round

/// Runs `cases` requests split over the workers; worker `w` draws from `seed + w`.
async fn round(
    channel: &Channel,
    addr: SocketAddr,
    methods: &[Method],
    seed: u64,
    cases: usize,
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let channel = channel.clone();
        let methods = methods.to_vec();
        let tally = Arc::clone(&tally);
        let share = cases / WORKERS + usize::from(w < cases % WORKERS);
        workers.spawn(async move {
            let mut g = Gen::new(seed.wrapping_add(w as u64));
            let mut mine = Tally::default();
            // Every worker starts with a live session so sequences have something to work on.
            let m = find(&methods, "CreateSession");
            if let Ok(body) = call(&channel, m, request(&mut g, "CreateSession")).await {
                learn(&mut g, "CreateSession", &body);
            }
            while mine.requests < share {
                case(&mut g, &channel, addr, &methods, &mut mine).await;
            }
            tally.lock().expect("tally").merge(mine);
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.expect("a fuzz worker panicked");
    }
    Arc::try_unwrap(tally)
        .ok()
        .expect("all workers are done")
        .into_inner()
        .expect("tally")
}

fn find<'a>(methods: &'a [Method], name: &str) -> &'a Method {
    methods
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no RPC {name}"))
}

/// One case: raw bytes, a mutated valid request, a random valid request, or a sequence on a
/// fresh session.
async fn case(
    g: &mut Gen,
    channel: &Channel,
    addr: SocketAddr,
    methods: &[Method],
    tally: &mut Tally,
) {
    let method = g.pick(methods).clone();
    g.wild = *g.pick(&[0.02, 0.1, 0.3, 0.7]);
    match g.below(11) {
        // A request in broken gRPC framing, over raw HTTP/2.
        10 => {
            let messages = request(g, &method.name);
            let body = frames(g, &messages);
            let pieces = 1 + g.below(3);
            let answer = call_framed(addr, &method, body.clone(), pieces).await;
            tally.record(&method.name, &answer, "raw frames", &[body]);
        }
        // Random bytes as the message body (streaming: as each chunk).
        0 | 1 => {
            let messages: Vec<Vec<u8>> = (0..if method.client_streaming {
                1 + g.below(3)
            } else {
                1
            })
                .map(|_| g.bytes(8192))
                .collect();
            let answer = call(channel, &method, messages.clone()).await;
            tally.record(&method.name, &answer, "random bytes", &messages);
        }
        // A valid request, mutated.
        2 | 3 => {
            let messages: Vec<Vec<u8>> = request(g, &method.name)
                .into_iter()
                .map(|m| g.mutate(m))
                .collect();
            let answer = call(channel, &method, messages.clone()).await;
            tally.record(&method.name, &answer, "mutated request", &messages);
        }
        // A valid request with random field values.
        4..=7 => {
            let messages = request(g, &method.name);
            let answer = call(channel, &method, messages.clone()).await;
            if let Ok(body) = &answer {
                learn(g, &method.name, body);
            }
            tally.record(&method.name, &answer, "random request", &messages);
        }
        // A sequence on a fresh session: its history first, then random calls naming it.
        _ => sequence(g, channel, methods, tally).await,
    }
}

async fn sequence(g: &mut Gen, channel: &Channel, methods: &[Method], tally: &mut Tally) {
    let create = find(methods, "CreateSession");
    let answer = call(channel, create, vec![Vec::new()]).await;
    tally.record("CreateSession", &answer, "sequence: create", &[]);
    let Ok(body) = answer else { return };
    let session = pb::Session::decode(&body[..])
        .expect("a Session")
        .session_id;
    Pool::keep(&mut g.pool.sessions, session.clone());
    let nodes = g.script();
    let append = pb::AppendRequest {
        session_id: session.clone(),
        nodes,
        ..Default::default()
    };
    let messages = vec![append.encode_to_vec()];
    let answer = call(channel, find(methods, "Append"), messages.clone()).await;
    tally.record("Append", &answer, "sequence: history", &messages);
    if let Ok(body) = &answer {
        learn(g, "Append", body);
    }
    // Calls that name this session's things most of the time.
    const FOLLOW_UPS: &[&str] = &[
        "Append",
        "Render",
        "ContextStats",
        "CreateBranch",
        "Log",
        "ListGatewayCalls",
        "GetNodes",
        "PrepareCompaction",
        "CommitSummary",
        "CancelCompaction",
        "ListSummaries",
        "Compact",
        "Pin",
        "Unpin",
        "DeleteBranch",
        "Recall",
    ];
    for _ in 0..3 + g.below(6) {
        let name = *g.pick(FOLLOW_UPS);
        let mut messages = request(g, name);
        // Point it at this session (the generators pick from the whole pool).
        if g.chance(0.8) {
            messages = retarget(name, messages, &session);
        }
        let answer = call(channel, find(methods, name), messages.clone()).await;
        if let Ok(body) = &answer {
            learn(g, name, body);
        }
        tally.record(name, &answer, "sequence: follow-up", &messages);
    }
}

/// Sets `session_id` (field 1 in every request that has one) to `session`.
fn retarget(method: &str, messages: Vec<Vec<u8>>, session: &str) -> Vec<Vec<u8>> {
    macro_rules! with_session {
        ($t:ty) => {{
            messages
                .into_iter()
                .map(|m| {
                    let mut r = <$t>::decode(&m[..]).expect("our own encoding");
                    r.session_id = session.to_owned();
                    r.encode_to_vec()
                })
                .collect()
        }};
    }
    match method {
        "Append" | "AppendStream" => with_session!(pb::AppendRequest),
        "Render" => with_session!(pb::RenderRequest),
        "ContextStats" => with_session!(pb::ContextStatsRequest),
        "CreateBranch" => with_session!(pb::CreateBranchRequest),
        "Log" => with_session!(pb::LogRequest),
        "ListGatewayCalls" => with_session!(pb::ListGatewayCallsRequest),
        "GetNodes" => with_session!(pb::GetNodesRequest),
        "PrepareCompaction" => with_session!(pb::PrepareCompactionRequest),
        "ListSummaries" => with_session!(pb::ListSummariesRequest),
        "Compact" => with_session!(pb::CompactRequest),
        "Pin" | "Unpin" => with_session!(pb::PinRequest),
        "Recall" => with_session!(pb::RecallRequest),
        "DeleteBranch" => with_session!(pb::DeleteBranchRequest),
        _ => messages,
    }
}

// ---------------------------------------------------------------- the test

fn env_or<T: FromStr>(name: &str, default: impl FnOnce() -> T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_requests_never_break_the_server() {
    let seed: u64 = env_or("CTXD_FUZZ_SEED", || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let cases: usize = env_or("CTXD_FUZZ_CASES", || DEFAULT_CASES);
    println!("fuzz: CTXD_FUZZ_SEED={seed} CTXD_FUZZ_CASES={cases}");

    let dir = tempfile::tempdir().expect("temp dir");
    let summarizer = format!("http://{}/v1", refusing_endpoint());
    let daemon = Daemon::start(
        &dir.path().join("ctxd.db"),
        &[
            // A summarizer whose endpoint drops every call, so Compact runs to its failure
            // path instead of stopping at "no summarizer".
            "--summarizer-url",
            &summarizer,
            "--summarizer-model",
            "fuzz",
            "--summarizer-timeout-secs",
            "5",
            "--log",
            "warn",
        ],
    )
    .await;
    let pid = daemon.pid();
    let channel = Channel::from_shared(format!("http://{}", daemon.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let methods = methods();

    let started = Instant::now();
    let mut rss = Vec::new();
    let mut stored = Vec::new();
    let mut requests = Vec::new();
    let mut total = Tally::default();
    for r in 0..2 {
        // The same seed both rounds: equal work, so memory must not grow with it.
        let tally = round(&channel, daemon.addr, &methods, seed, cases).await;
        rss.push(rss_bytes(pid));
        stored.push(tally.stored as u64);
        requests.push(tally.requests as u64);
        println!(
            "fuzz: round {r}: {} requests, {} KiB stored, RSS {} MiB, {:?} so far, {:?}",
            tally.requests,
            tally.stored / 1024,
            rss[r] / (1024 * 1024),
            started.elapsed(),
            tally.by_code
        );
        total.merge(tally);
    }

    for (method, codes) in &total.by_method {
        println!("fuzz: {method:>18}: {codes:?}");
    }
    let stderr = daemon.stderr();
    let panics: Vec<&str> = stderr.lines().filter(|l| l.contains("panicked")).collect();
    let mut daemon = daemon;
    let alive = daemon.is_running();
    let report = total
        .failures
        .iter()
        .take(20)
        .map(|f| {
            format!(
                "  {} → {:?} {:?}\n    case: {}",
                f.method, f.code, f.message, f.case
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        total.failures.is_empty(),
        "seed {seed}: {} forbidden answers (first 20):\n{report}",
        total.failures.len()
    );
    assert!(
        panics.is_empty(),
        "seed {seed}: the server panicked:\n{}",
        panics.join("\n")
    );
    assert!(alive, "seed {seed}: the server died; stderr:\n{stderr}");
    // Every RPC answered something else than an error at least once, or the generators never
    // got past validation.
    assert!(
        total.by_code.get("Ok").copied().unwrap_or(0) > total.requests / 10,
        "seed {seed}: too few successful requests: {:?}",
        total.by_code
    );
    let allowed = rss[0] + stored[1] + requests[1] * RSS_PER_REQUEST + RSS_SLACK;
    assert!(
        rss[1] <= allowed,
        "seed {seed}: RSS grew from {} to {} bytes over an equal round of {} requests that stored \
         {} bytes (allowed: {allowed})",
        rss[0],
        rss[1],
        requests[1],
        stored[1]
    );
    daemon.stop().await;
    println!(
        "fuzz: done in {:?}; RSS grew {} KiB, allowed {} KiB",
        started.elapsed(),
        (rss[1].saturating_sub(rss[0])) / 1024,
        (allowed - rss[0]) / 1024
    );
}
