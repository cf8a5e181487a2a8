//! A `generateContent` answer, assembled from the whole body (or a stream sent as one JSON
//! array) or the server-sent `GenerateContentResponse` chunks as they are relayed, into the
//! assistant node it appends. The stream has no terminal event: the chunk with the candidate's
//! `finishReason` (usage with it) ends it.

use serde_json::{Map, Value, json};

use super::parts::model_node;
use crate::domain::{NodeContent, ProviderUsage};
use crate::provider::codec::{Events, Progress};
use crate::provider::conversation::MAX_ANSWER_PARTS;

/// The answer's parts so far, pieces of one text or thought joined as Gemini CLI joins them
/// before it keeps the answer in its history.
#[derive(Debug, Default)]
pub struct GeminiEvents {
    parts: Vec<Value>,
}

/// What a chunk says of the answer's end.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Open,
    /// A `finishReason` of a whole answer: `STOP` or `MAX_TOKENS`.
    Stopped,
    /// An error, a blocked prompt, or an answer cut by another reason (`SAFETY`,
    /// `RECITATION`, `MALFORMED_FUNCTION_CALL`...), which ctxd does not append.
    Failed,
}

impl Events for GeminiEvents {
    fn event(&mut self, _name: &str, data: Option<&Value>, progress: &mut Progress) {
        let Some(data) = data else { return };
        match chunk(&mut self.parts, data, &mut progress.usage) {
            End::Open => {}
            End::Stopped => progress.stopped = true,
            End::Failed => progress.failed = true,
        }
    }

    fn streamed(self: Box<Self>) -> Option<Option<NodeContent>> {
        node(self.parts)
    }

    fn body(&self, body: &Value, usage: &mut ProviderUsage) -> Option<Option<NodeContent>> {
        let chunks = match body {
            Value::Array(chunks) => chunks.as_slice(),
            one => std::slice::from_ref(one),
        };
        let mut parts = Vec::new();
        let mut stopped = false;
        for data in chunks {
            match chunk(&mut parts, data, usage) {
                End::Open => {}
                End::Stopped => stopped = true,
                End::Failed => return None,
            }
        }
        if !stopped {
            return None;
        }
        node(parts)
    }
}

fn node(parts: Vec<Value>) -> Option<Option<NodeContent>> {
    if parts.is_empty() {
        return Some(None);
    }
    model_node("candidates[0].content", parts)
        .ok()
        .map(|(node, _)| node)
}

/// `usageMetadata` as ctxd counts it: the cached share of the prompt is a cache read (Gemini
/// writes its implicit cache at no price of its own), the thoughts are output.
pub fn usage(u: &Value) -> ProviderUsage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("cachedContentTokenCount");
    ProviderUsage {
        input: n("promptTokenCount").saturating_sub(cached) + n("toolUsePromptTokenCount"),
        cache_read: cached,
        cache_write: 0,
        output: n("candidatesTokenCount") + n("thoughtsTokenCount"),
        ..ProviderUsage::default()
    }
}

/// Reads one `GenerateContentResponse`: its usage (each chunk's is the answer's so far), the
/// first candidate's parts, and whether it ends the answer.
fn chunk(parts: &mut Vec<Value>, data: &Value, into: &mut ProviderUsage) -> End {
    if data.get("error").is_some() {
        return End::Failed;
    }
    if let Some(u) = data.get("usageMetadata").filter(|u| u.is_object()) {
        *into = usage(u);
    }
    if data
        .get("promptFeedback")
        .and_then(|f| f.get("blockReason"))
        .is_some_and(|r| !r.is_null())
    {
        return End::Failed;
    }
    let Some(candidate) = data.get("candidates").and_then(|c| c.get(0)) else {
        return End::Open;
    };
    if let Some(Value::Array(new)) = candidate.get("content").and_then(|c| c.get("parts")) {
        for part in new {
            if !append(parts, part) {
                return End::Failed;
            }
        }
        if parts.len() > MAX_ANSWER_PARTS {
            return End::Failed;
        }
    }
    match candidate.get("finishReason") {
        None | Some(Value::Null) => End::Open,
        Some(Value::String(r)) if r == "STOP" || r == "MAX_TOKENS" => End::Stopped,
        Some(_) => End::Failed,
    }
}

/// Whether `part` holds only `keys` and a string `text`.
fn only(part: &Map<String, Value>, keys: &[&str]) -> bool {
    part.get("text").is_some_and(Value::is_string)
        && part.keys().all(|k| keys.contains(&k.as_str()))
}

/// A thought's piece.
fn thought(part: &Value) -> Option<&Map<String, Value>> {
    part.as_object().filter(|p| {
        p.get("thought") == Some(&json!(true)) && only(p, &["text", "thought", "thoughtSignature"])
    })
}

/// A plain text's piece (a part with only `text`, and maybe a signature).
fn text(part: &Value) -> Option<&Map<String, Value>> {
    part.as_object()
        .filter(|p| only(p, &["text", "thoughtSignature"]))
}

/// Adds a streamed part. A text's piece joins the last part that is not a thought when that is
/// a text (what Gemini CLI resends: thoughts left out, texts joined), a thought's piece the
/// thought before it; a signature stays with the part it is joined to. Anything else (a call
/// comes whole) is a part of its own. False for a call streamed in pieces (`partialArgs`,
/// `willContinue`), which is not assembled here.
fn append(parts: &mut Vec<Value>, part: &Value) -> bool {
    if part
        .get("functionCall")
        .is_some_and(|c| c.get("partialArgs").is_some() || c.get("willContinue").is_some())
    {
        return false;
    }
    let join = |into: &mut Value, piece: &Map<String, Value>| {
        let add = piece
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(Value::String(t)) = into.get_mut("text") {
            t.push_str(add);
        }
        if let (Some(sig), Some(obj)) = (piece.get("thoughtSignature"), into.as_object_mut()) {
            obj.entry("thoughtSignature").or_insert_with(|| sig.clone());
        }
    };
    if let Some(piece) = text(part) {
        let last = parts.iter_mut().rev().find(|p| thought(p).is_none());
        if let Some(last) = last
            && text(last).is_some_and(|l| l["text"].as_str().is_some_and(|t| !t.is_empty()))
        {
            join(last, piece);
            return true;
        }
    } else if let Some(piece) = thought(part)
        && let Some(last) = parts.last_mut()
        && let Some(l) = thought(last)
        && !(l.contains_key("thoughtSignature") && piece.contains_key("thoughtSignature"))
    {
        join(last, piece);
        return true;
    }
    parts.push(part.clone());
    true
}
