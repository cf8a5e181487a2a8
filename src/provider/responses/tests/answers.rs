//! Answers assembled from a stream or a body into the node their resend makes, whatever
//! bookkeeping the resend adds, and answers that are not whole left unrecorded.

use super::*;
use crate::domain::ProviderUsage;

fn output_items() -> Vec<Value> {
    vec![
        json!({"id": "rs_9", "type": "reasoning", "summary": [
            {"type": "summary_text", "text": "**Checking**"}
        ], "encrypted_content": "gAAAAABo-enc"}),
        json!({"id": "msg_9", "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Let me look."}]}),
        json!({"id": "fc_9", "type": "function_call", "status": "completed", "call_id": "call_9",
               "name": "shell", "arguments": "{\"command\":[\"ls\"]}"}),
    ]
}

fn usage_json() -> Value {
    json!({"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1000},
           "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20}, "total_tokens": 1250})
}

/// A streamed answer with `items` as its output, and the completed response's `output`.
fn stream(items: &[Value], completed_output: &Value, last: &str) -> String {
    let mut events: Vec<Value> = vec![
        json!({"type": "response.created", "sequence_number": 0, "response": {
            "id": "resp_9", "object": "response", "status": "in_progress", "output": [], "usage": null}}),
        json!({"type": "response.in_progress", "sequence_number": 1, "response": {
            "id": "resp_9", "object": "response", "status": "in_progress", "output": []}}),
    ];
    for (i, item) in items.iter().enumerate() {
        let mut added = item.clone();
        match item["type"].as_str().unwrap() {
            "message" => {
                added["status"] = json!("in_progress");
                added["content"] = json!([]);
                events.push(
                    json!({"type": "response.output_item.added", "output_index": i, "item": added}),
                );
                events.push(json!({"type": "response.content_part.added", "item_id": item["id"],
                    "output_index": i, "content_index": 0,
                    "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}}));
                for delta in ["Let me", " look."] {
                    events.push(
                        json!({"type": "response.output_text.delta", "item_id": item["id"],
                        "output_index": i, "content_index": 0, "delta": delta, "logprobs": []}),
                    );
                }
                events.push(
                    json!({"type": "response.output_text.done", "item_id": item["id"],
                    "output_index": i, "content_index": 0, "text": "Let me look.", "logprobs": []}),
                );
            }
            "function_call" => {
                added["status"] = json!("in_progress");
                added["arguments"] = json!("");
                events.push(
                    json!({"type": "response.output_item.added", "output_index": i, "item": added}),
                );
                events.push(json!({"type": "response.function_call_arguments.delta",
                    "item_id": item["id"], "output_index": i, "delta": item["arguments"]}));
                events.push(json!({"type": "response.function_call_arguments.done",
                    "item_id": item["id"], "output_index": i, "arguments": item["arguments"]}));
            }
            _ => {
                added.as_object_mut().unwrap().remove("encrypted_content");
                events.push(
                    json!({"type": "response.output_item.added", "output_index": i, "item": added}),
                );
            }
        }
        events.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
    }
    let end = match last {
        "response.completed" => json!({"type": last, "response": {
            "id": "resp_9", "object": "response", "status": "completed",
            "output": completed_output, "usage": usage_json()}}),
        "response.incomplete" => json!({"type": last, "response": {
            "id": "resp_9", "object": "response", "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"}, "output": completed_output}}),
        "response.failed" => json!({"type": last, "response": {
            "id": "resp_9", "object": "response", "status": "failed",
            "error": {"code": "server_error", "message": "boom"}, "output": []}}),
        "error" => json!({"type": "error", "code": "x", "message": "boom", "param": null}),
        _ => Value::Null,
    };
    if !end.is_null() {
        events.push(end);
    }
    events
        .iter()
        .enumerate()
        .map(|(n, e)| {
            let mut e = e.clone();
            e["sequence_number"] = json!(n);
            format!("event: {}\ndata: {}\n\n", e["type"].as_str().unwrap(), e)
        })
        .collect()
}

fn answer(stream_text: &str) -> Option<(Option<NodeContent>, ProviderUsage)> {
    let mut a = Responses.answer(true);
    // Chunks that cut events anywhere, as the network does.
    for chunk in stream_text.as_bytes().chunks(37) {
        a.feed(chunk);
    }
    a.finish()
}

#[test]
fn a_streamed_answer_is_the_node_its_resend_makes() {
    let items = output_items();
    let (node, usage) = answer(&stream(&items, &json!(items), "response.completed")).unwrap();
    let node = node.unwrap();
    let mut resend = vec![json!({"role": "user", "content": "look"})];
    resend.extend(items.iter().cloned());
    resend.push(json!({"type": "function_call_output", "call_id": "call_9", "output": "a"}));
    let conv = read(&json!({"model": "gpt-5", "input": resend})).unwrap();
    assert_eq!(conv.items[1].content, node);
    assert_eq!(
        usage,
        ProviderUsage {
            input: 200,
            cache_read: 1000,
            cache_write: 0,
            output: 50,
            ..ProviderUsage::default()
        }
    );
    let mut a = Responses.answer(true);
    let text = stream(&items, &json!(items), "response.completed");
    let (head, last) = text.split_at(text.rfind("event: response.completed").unwrap());
    a.feed(head.as_bytes());
    assert!(!a.complete());
    a.feed(last.as_bytes());
    assert!(a.complete(), "the terminal event holds the last chunk");
    // A backend whose completed response leaves the output out: the items as they were done.
    let (again, _) = answer(&stream(&items, &json!([]), "response.completed")).unwrap();
    assert_eq!(again.unwrap(), node);
}

/// Codex 0.171 resends its answers' items with `internal_chat_message_metadata_passthrough`
/// added; other clients drop the ids and statuses. Either way the resent items are the node
/// the answer made, and a message resent with other bookkeeping is the node it made before.
#[test]
fn bookkeeping_is_no_part_of_a_node() {
    let items = output_items();
    let (answer_node, _) = answer(&stream(&items, &json!(items), "response.completed")).unwrap();
    let prompt = |bookkeeping: Value| {
        let mut item = json!({"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": "look"}]});
        for (k, v) in bookkeeping.as_object().unwrap() {
            item[k] = v.clone();
        }
        item
    };
    let with = |f: &dyn Fn(&mut Map<String, Value>)| -> Vec<Value> {
        items
            .iter()
            .map(|item| {
                let mut item = item.clone();
                f(item.as_object_mut().unwrap());
                item
            })
            .collect()
    };
    let restated = with(&|item| {
        item.insert(
            "internal_chat_message_metadata_passthrough".into(),
            json!({"turn_id": "01a2410d-ed1c"}),
        );
    });
    let dropped = with(&|item| {
        item.remove("id");
        item.remove("status");
    });
    let prompts = [
        json!({}),
        json!({"id": "msg_01a2", "internal_chat_message_metadata_passthrough":
               {"content_item_kinds": ["user.text"], "create_time": 1796387761.46}}),
        json!({"id": "msg_01b3", "status": "completed"}),
    ];
    let mut first = None;
    for (resent, bookkeeping) in [items.clone(), restated, dropped].into_iter().zip(prompts) {
        let mut input = vec![prompt(bookkeeping)];
        input.extend(resent);
        input.push(json!({"type": "function_call_output", "id": "fco_1",
            "internal_chat_message_metadata_passthrough": {"turn_id": "t"},
            "call_id": "call_9", "output": "a"}));
        let conv = read(&json!({"model": "gpt-5", "input": input})).unwrap();
        let nodes: Vec<NodeContent> = conv.items.iter().map(|i| i.content.clone()).collect();
        assert_eq!(nodes.len(), 3);
        assert_eq!(Some(&nodes[1]), answer_node.as_ref(), "{input:#?}");
        let first = first.get_or_insert(nodes.clone());
        assert_eq!(&nodes, first, "{input:#?}");
        // Kept items and fields parts alike hold none of it.
        let written = input_of(&conv);
        assert!(
            !written.to_string().contains("\"id\"")
                && !written.to_string().contains("internal_chat_message")
                && !written.to_string().contains("\"status\""),
            "{written:#}"
        );
    }
}

/// Codex asks for a compaction right after an answer (a `compaction_trigger` item), is
/// answered one `compaction` item (here only in `response.output_item.done`), and resends it
/// right before the next answer's items: each is a node of its own, so the resent history
/// is the nodes the answers made.
#[test]
fn a_compaction_and_its_trigger_stand_alone() {
    let go = json!({"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "go"}]});
    let done = json!({"type": "message", "role": "assistant", "id": "msg_1",
        "status": "completed",
        "content": [{"type": "output_text", "text": "done", "annotations": []}]});
    let trigger = json!({"type": "compaction_trigger"});
    let compaction = json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "enc"});
    let call = json!({"type": "function_call", "id": "fc_2", "status": "completed",
        "call_id": "c2", "name": "shell", "arguments": "{}"});
    let whole = |output: &[Value]| {
        answer(&stream(output, &json!(output), "response.completed"))
            .unwrap()
            .0
            .unwrap()
    };

    let asking = json!({"model": "gpt-5", "input": [go, done, trigger]});
    let conv = read(&asking).unwrap();
    assert_eq!(
        conv.items.len(),
        3,
        "the trigger is not joined to the answer"
    );
    assert_eq!(conv.items[1].content, whole(std::slice::from_ref(&done)));
    assert_eq!(
        conv.items[2].content,
        NodeContent::Message {
            role: Role::Assistant,
            parts: vec![kept(&trigger)],
            tool_calls: Vec::new(),
        }
    );
    assert_eq!(input_of(&conv)[2], trigger, "written back as it came");

    let (compacted, _) = answer(&stream(
        std::slice::from_ref(&compaction),
        &json!([]),
        "response.completed",
    ))
    .expect("the compaction item of output_item.done is the answer");
    let next = json!({"model": "gpt-5", "input": [go, compaction, call,
        {"type": "function_call_output", "call_id": "c2", "output": "ok"}]});
    let conv = read(&next).unwrap();
    assert_eq!(
        conv.items.len(),
        4,
        "the compaction is not joined to the next answer"
    );
    assert_eq!(Some(&conv.items[1].content), compacted.as_ref());
    assert_eq!(conv.items[2].content, whole(&[call]));
    assert_eq!(input_of(&conv)[1], bare(&json!([compaction]))[0]);
}

#[test]
fn an_answer_that_is_not_whole_is_not_recorded() {
    let items = output_items();
    for last in ["response.failed", "response.incomplete", "error", "none"] {
        assert!(
            answer(&stream(&items, &json!(items), last)).is_none(),
            "{last}"
        );
    }
}

#[test]
fn a_whole_answer_is_read_from_its_body() {
    let items = output_items();
    let body = json!({"id": "resp_9", "object": "response", "status": "completed",
                      "output": items, "usage": usage_json()});
    let mut a = Responses.answer(false);
    a.feed(body.to_string().as_bytes());
    let (node, usage) = a.finish().unwrap();
    assert_eq!(node, run(&items).unwrap());
    assert_eq!(usage.cache_read, 1000);
    let mut a = Responses.answer(false);
    let mut incomplete = body.clone();
    incomplete["status"] = json!("incomplete");
    a.feed(incomplete.to_string().as_bytes());
    assert!(a.finish().is_none());
}
