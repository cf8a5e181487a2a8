//! The Gemini codec's tests: requests read and written back (`requests`), answers assembled
//! (`answers`), documents of rendered messages and errors (`documents`); here, the helpers they
//! share.

mod answers;
mod documents;
mod requests;

use serde_json::{Value, json};

use super::Gemini;
use crate::domain::{Hash, NodeContent, node_hash};
use crate::provider::canonical::canonical;
use crate::provider::codec::{Codec, Request};
use crate::provider::conversation::{Conversation, Refusal, rendered};
use crate::render::Message;

const STREAM: &str = "/v1beta/models/gemini-3.1-pro-preview:streamGenerateContent?alt=sse";

/// A request to the streaming method, read.
fn read(body: Value) -> Result<Conversation, Refusal> {
    read_at(STREAM, body)
}

fn read_at(path: &str, body: Value) -> Result<Conversation, Refusal> {
    Gemini.read(Request {
        path,
        body,
        headers: &[],
    })
}

/// The corpus's `n`th request of Gemini CLI 0.61.0.
fn corpus(n: usize) -> Value {
    let path = format!(
        "{}/testdata/gateway/corpus/gemini-cli-0.61.0/{n:02}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("the corpus is JSON")
}

fn nodes(conv: &Conversation) -> Vec<NodeContent> {
    conv.items.iter().map(|i| i.content.clone()).collect()
}

/// The hashes of a chain of `contents`, as the store would give them.
fn hashes(contents: &[NodeContent]) -> Vec<Hash> {
    let mut parent: Option<Hash> = None;
    contents
        .iter()
        .map(|c| {
            let h = node_hash(parent.as_ref(), None, c);
            parent = Some(h);
            h
        })
        .collect()
}

/// A request read, its nodes rendered and written back as `contents`.
fn round_trip(body: &Value) -> (Conversation, Vec<Value>, Vec<Vec<usize>>) {
    let conv = read(body.clone()).expect("a request");
    let (contents, sources) = Gemini.document(&rendered(&conv));
    (conv, contents, sources)
}

/// `contents` as one canonical string (key order aside).
fn same(contents: &[Value]) -> String {
    canonical(&Value::Array(contents.to_vec()))
}

/// The field a refused request names.
fn invalid(body: Value) -> String {
    match read(body) {
        Err(Refusal::Invalid { field, .. }) => field,
        other => panic!("not refused as invalid: {other:?}"),
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "parts": [{"text": text}]})
}

fn body(contents: Value) -> Value {
    json!({ "contents": contents })
}
