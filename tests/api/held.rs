//! A chat-completions endpoint on 127.0.0.1:0 that holds every request until the test releases
//! it: a `Compact` pointed at it stays in flight for exactly as long as a test needs.

use std::net::SocketAddr;
use std::time::Duration;

use ctxd::api::pb;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::chat_http;
use crate::helpers::*;

/// The model's whole answer: short, so the summary is applied.
pub const SUMMARY: &str = "Modules 0 and 1 were read and their parsers fixed.";

pub struct HeldModel {
    pub addr: SocketAddr,
    arrived: mpsc::UnboundedReceiver<()>,
    release: watch::Sender<bool>,
}

impl HeldModel {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the held model");
        let addr = listener.local_addr().expect("local addr");
        let (arrivals, arrived) = mpsc::unbounded_channel();
        let (release, released) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream, arrivals.clone(), released.clone()));
            }
        });
        Self {
            addr,
            arrived,
            release,
        }
    }

    /// The base URL to give the summarizer.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Waits until `n` more requests have arrived (and are being held).
    pub async fn wait_for_requests(&mut self, n: usize) {
        for i in 0..n {
            tokio::time::timeout(Duration::from_secs(30), self.arrived.recv())
                .await
                .unwrap_or_else(|_| panic!("request {} of {n} never reached the model", i + 1))
                .expect("the model is running");
        }
    }

    /// Answers every request held and every one to come.
    pub fn release(&self) {
        self.release.send_replace(true);
    }
}

/// Reads one request, reports it, waits for the release and answers with [`SUMMARY`].
async fn answer(
    mut stream: TcpStream,
    arrivals: mpsc::UnboundedSender<()>,
    mut released: watch::Receiver<bool>,
) {
    if chat_http::read_request(&mut stream, &mut Vec::new())
        .await
        .is_none()
    {
        return;
    }
    let _ = arrivals.send(());
    if released.wait_for(|r| *r).await.is_err() {
        return;
    }
    let _ = chat_http::respond(&mut stream, 200, &chat_http::completion(SUMMARY), true).await;
}

/// History budget 2,600 tokens against the ~3,200 of [`session_needing_compaction`].
pub fn tight_budget() -> pb::Budget {
    pb::Budget {
        context_window: 3600,
        output_reserve: 1000,
        ..Default::default()
    }
}

pub fn compact_req(session: &str) -> pb::CompactRequest {
    pb::CompactRequest {
        session_id: session.into(),
        budget: Some(tight_budget()),
        ..Default::default()
    }
}

/// A session of four turns (request, tool call, a ~3,600-character result, answer) that a
/// `Compact` under [`tight_budget`] sends to the model. Returns it and every append's answer.
pub async fn session_needing_compaction(client: &mut Client) -> (String, Vec<pb::AppendResponse>) {
    let session = new_session(client).await;
    let mut appended = Vec::new();
    for t in 0..4 {
        let id = format!("call_{t}");
        let nodes = vec![
            user(&format!("Request {t}: fix the parser of module {t}")),
            assistant_calls("Reading it.", vec![call(&id, "read_file", "{}")]),
            tool_result(&id, &big_text(3600, &format!("module_{t}"))),
            assistant(&format!("Fixed module {t}.")),
        ];
        let answer = client
            .append(append_req(&session, nodes))
            .await
            .expect("Append")
            .into_inner();
        appended.push(answer);
    }
    (session, appended)
}
