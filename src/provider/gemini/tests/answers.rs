//! Answers assembled: a stream split anywhere, a whole body, a stream sent as one array, usage,
//! and the answers ctxd does not append.

use serde_json::json;

use super::*;
use crate::domain::{Part, ProviderUsage};
use crate::provider::codec::Answer;

/// Chunks as Google streams Gemini CLI's answer with a call: the thought, the call with its
/// signature, then the finish reason and the usage (thoughts, the cached share).
fn call_chunks() -> Vec<Value> {
    let usage = json!({"promptTokenCount": 11548, "cachedContentTokenCount": 8000,
                       "candidatesTokenCount": 20, "thoughtsTokenCount": 10, "totalTokenCount": 11578});
    vec![
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "**Writing the marker** One shell command", "thought": true}]}, "index": 0}],
            "usageMetadata": {"promptTokenCount": 11548}}),
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": " writes it.", "thought": true, "thoughtSignature": "dGhvdWdodA=="}]}, "index": 0}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "run_shell_command", "args": {
                "command": "echo ctxd-gemini-marker > out.txt",
                "description": "Write the marker into out.txt."}},
             "thoughtSignature": "Q3R4ZEdlbWluaUNvcnB1c1NpZ25hdHVyZTE="}]},
            "finishReason": "STOP", "index": 0}], "usageMetadata": usage}),
    ]
}

fn sse(chunks: &[Value]) -> Vec<u8> {
    chunks
        .iter()
        .flat_map(|c| format!("data: {c}\r\n\r\n").into_bytes())
        .collect()
}

fn streamed(bytes: &[u8], cuts: &[usize]) -> Option<(Option<NodeContent>, ProviderUsage)> {
    let mut answer = Gemini.answer(true);
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        answer.feed(&bytes[from..cut]);
        from = cut;
    }
    answer.finish()
}

fn whole(body: &Value) -> Option<(Option<NodeContent>, ProviderUsage)> {
    let mut answer: Answer = Gemini.answer(false);
    answer.feed(body.to_string().as_bytes());
    answer.finish()
}

#[test]
fn a_streamed_answer_is_the_node_its_resend_reads_as() {
    let bytes = sse(&call_chunks());
    // Gemini CLI 0.61 resends the answer without its thought, with an id of its own (02.json).
    let resent = nodes(&read(corpus(2)).unwrap());
    let expected = ProviderUsage {
        input: 3548,
        cache_read: 8000,
        cache_write: 0,
        output: 30,
        ..ProviderUsage::default()
    };
    for cut in 0..=bytes.len() {
        let (node, usage) = streamed(&bytes, &[cut]).expect("a whole answer");
        let node = node.expect("a node");
        assert!(node.says_same(&resent[1]), "cut at {cut}");
        assert_eq!(usage, expected);
    }
    let (node, _) = streamed(&bytes, &[3, 50, 51, 200, 201, 202]).unwrap();
    let NodeContent::Message { parts, .. } = node.unwrap() else {
        panic!()
    };
    // The thought is one part, kept as the model's reasoning with its signature.
    let thought = parts
        .iter()
        .find_map(|p| match p {
            Part::Block(b) if b.reasoning && b.json.contains("thought\"") => Some(b.json.clone()),
            _ => None,
        })
        .unwrap();
    assert!(thought.contains("One shell command writes it."));
    assert!(thought.contains("dGhvdWdodA=="));
    let mut answer = Gemini.answer(true);
    answer.feed(&bytes[..bytes.len() - 1]);
    assert!(!answer.complete(), "the finishing chunk is not whole yet");
    answer.feed(&bytes[bytes.len() - 1..]);
    assert!(answer.complete());
}

#[test]
fn streamed_text_is_joined_as_gemini_cli_keeps_it() {
    // As the corpus's 02.json was answered: the text in pieces, then its signature alone in
    // an empty text part with the finish reason.
    let chunks = [
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Wrote ctxd-"}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "gemini-marker "}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "into out.txt."}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "", "thoughtSignature": "c2ln"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5}}),
    ];
    let (node, usage) = streamed(&sse(&chunks), &[17]).unwrap();
    let resent = nodes(&read(corpus(4)).unwrap());
    let node = node.unwrap();
    assert!(node.says_same(&resent[3]), "{node:?}");
    assert_eq!(
        hashes(std::slice::from_ref(&node)),
        hashes(std::slice::from_ref(&resent[3]))
    );
    assert_eq!((usage.input, usage.output), (10, 5));
    // Written back, the signature stays on the text it came with.
    let conv = Conversation {
        items: vec![crate::provider::conversation::Item {
            content: node,
            message: 0,
            through: 0,
        }],
        ..Conversation::default()
    };
    let (contents, _) = Gemini.document(&rendered(&conv));
    assert_eq!(
        contents,
        [json!({"role": "model", "parts": [
            {"text": "Wrote ctxd-gemini-marker into out.txt.", "thoughtSignature": "c2ln"}]})]
    );
}

#[test]
fn a_whole_body_and_an_array_stream_read_alike() {
    let chunks = call_chunks();
    let streamed = streamed(&sse(&chunks), &[]).unwrap();
    let array = whole(&Value::Array(chunks.clone())).unwrap();
    assert_eq!(array, streamed);
    let body = json!({"candidates": [{"content": {"role": "model", "parts": [
        {"text": "**Writing the marker** One shell command writes it.", "thought": true, "thoughtSignature": "dGhvdWdodA=="},
        chunks[2]["candidates"][0]["content"]["parts"][0]]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": chunks[2]["usageMetadata"], "modelVersion": "gemini-3.1-pro-preview"});
    assert_eq!(whole(&body).unwrap(), streamed);
    // An answer with nothing in it is whole, and appends nothing.
    let empty = json!({"candidates": [{"content": {"role": "model"}, "finishReason": "STOP"}],
                       "usageMetadata": {"promptTokenCount": 4}});
    let (node, usage) = whole(&empty).unwrap();
    assert!(node.is_none());
    assert_eq!(usage.input, 4);
}

#[test]
fn answers_ctxd_does_not_append() {
    let finish = |reason: &str| {
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "x"}]},
                               "finishReason": reason}]})
    };
    for reason in ["SAFETY", "RECITATION", "MALFORMED_FUNCTION_CALL", "OTHER"] {
        assert!(whole(&finish(reason)).is_none(), "{reason}");
        let mut answer = Gemini.answer(true);
        answer.feed(&sse(&[finish(reason)]));
        assert!(answer.complete());
        assert!(answer.finish().is_none(), "{reason}");
    }
    assert!(
        whole(&finish("MAX_TOKENS")).is_some(),
        "a truncated answer is still the answer"
    );
    // Cut short: no finish reason came.
    let chunks = call_chunks();
    let mut cut = Gemini.answer(true);
    cut.feed(&sse(&chunks[..2]));
    assert!(!cut.complete());
    assert!(cut.finish().is_none());
    assert!(whole(&json!({"candidates": [{"content": {"parts": [{"text": "x"}]}}]})).is_none());
    // An error, in the stream or as the body; a blocked prompt.
    let mut failed = Gemini.answer(true);
    failed.feed(&sse(&[
        json!({"error": {"code": 500, "message": "internal", "status": "INTERNAL"}}),
    ]));
    assert!(failed.complete());
    assert!(failed.finish().is_none());
    assert!(whole(&json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}})).is_none());
    assert!(whole(&json!({"promptFeedback": {"blockReason": "SAFETY"}})).is_none());
    // A call that names nothing is no answer ctxd records.
    assert!(
        whole(
            &json!({"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]},
                                          "finishReason": "STOP"}]})
        )
        .is_none()
    );
    assert!(whole(&json!("not a response")).is_none());
    // A call streamed in pieces is not assembled here.
    let pieces = json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f",
        "partialArgs": [{"jsonPath": "$.a", "stringValue": "x"}], "willContinue": true}}]}}]});
    let mut answer = Gemini.answer(true);
    answer.feed(&sse(&[pieces]));
    assert!(answer.complete());
    assert!(answer.finish().is_none());
}
