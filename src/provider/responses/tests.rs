//! The Responses codec's tests: requests read and written back, answers assembled.

use std::sync::Arc;

use super::*;
use crate::domain::{Node, NodeId, PathView, ProviderUsage, node_hash};
use crate::provider::format::responses_input as input;
use crate::render::Message;
use crate::render::{Callers, Reduction, visible};

/// The request's nodes as a stored path renders them, untouched by any budget step.
fn rendered(conv: &Conversation) -> Vec<Message> {
    let mut path = PathView::default();
    let mut parent: Option<(NodeId, crate::domain::Hash)> = None;
    for item in &conv.items {
        let hash = node_hash(parent.as_ref().map(|p| &p.1), None, &item.content);
        let node = Node {
            id: NodeId::new(),
            parent_id: parent.map(|p| p.0),
            function_id: None,
            content: item.content.clone(),
            created_at_ms: 0,
            hash,
        };
        parent = Some((node.id, hash));
        path.nodes.push(Arc::new(node));
    }
    visible(&path, Callers::All)
}

/// Items as canonical JSON, with function call arguments in canonical form (the form they
/// are stored in).
fn canonical_items(items: &Value) -> Vec<String> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let mut item = item.clone();
            if item["type"] == "function_call" {
                let a = item["arguments"].as_str().unwrap().to_owned();
                item["arguments"] = json!(canonical_arguments(&a));
            }
            // A null member and an absent one are the same item.
            super::super::canonical::canonical_block(&item)
        })
        .collect()
}

/// `items` without their bookkeeping: what is written back of them.
fn bare(items: &Value) -> Value {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(without_bookkeeping)
        .collect()
}

fn round_trip(body: &Value) -> (Conversation, Value) {
    let conv = read(body).unwrap();
    let written = input(&rendered(&conv));
    (conv, written)
}

fn codex_request() -> Value {
    json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "<permissions instructions>sandbox: workspace-write</permissions instructions>"}
            ]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"}
            ]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "list the files, then fix the typo"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
            ]},
            {"type": "reasoning", "id": "rs_01", "summary": [
                {"type": "summary_text", "text": "**Listing files**"}
            ], "content": null, "encrypted_content": "gAAAAABo-encrypted-1"},
            {"type": "function_call", "id": "fc_01", "status": "completed", "call_id": "call_ls",
             "name": "shell", "arguments": "{\"command\": [\"bash\", \"-lc\", \"ls\"], \"workdir\": \"/repo\"}"},
            {"type": "function_call_output", "call_id": "call_ls", "output": "README.md\nsrc\n"},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABo-encrypted-2"},
            {"type": "custom_tool_call", "status": "completed", "call_id": "call_patch", "name": "apply_patch",
             "input": "*** Begin Patch\n*** Update File: README.md\n-teh\n+the\n*** End Patch\n"},
            {"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Success. Updated README.md"},
            {"type": "function_call", "call_id": "call_git", "name": "shell",
             "arguments": "{\"command\":[\"git\",\"diff\"]}"},
            {"type": "function_call_output", "id": "fco_1", "status": "completed", "call_id": "call_git",
             "output": [{"type": "input_text", "text": "diff --git a/README.md"}]},
            {"type": "message", "role": "assistant", "id": "msg_01", "status": "completed", "content": [
                {"type": "output_text", "text": "Fixed the typo.", "annotations": [], "logprobs": []}
            ]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]}
        ],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "max_output_tokens": 32000
    })
}

#[test]
fn a_codex_request_is_written_back_as_it_came() {
    let body = codex_request();
    let (conv, written) = round_trip(&body);
    assert_eq!(conv.model, "gpt-5-codex");
    assert!(conv.stream);
    assert_eq!(conv.output_reserve, 32000);
    assert_eq!(
        conv.system_tokens as u64,
        estimate("You are Codex, a coding agent.".len())
    );
    assert!(conv.tools_tokens > 0);
    assert_eq!(
        conv.client_session.as_deref(),
        Some("0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
    );
    assert!(
        conv.opening
            .starts_with("You are Codex, a coding agent.\n\n<environment_context>")
    );
    assert!(conv.client_tokens > 0);
    // dev, user, user, [reasoning fc], result, [reasoning custom], result, [fc], result,
    // [assistant message], user
    let at: Vec<usize> = conv.items.iter().map(|i| i.message).collect();
    assert_eq!(at, vec![0, 1, 2, 3, 5, 6, 8, 9, 10, 11, 12]);
    let NodeContent::Message {
        role: Role::Assistant,
        parts,
        tool_calls,
    } = &conv.items[3].content
    else {
        panic!("not an assistant message: {:?}", conv.items[3].content);
    };
    assert_eq!(
        parts.len(),
        1,
        "the reasoning; the call, its id and status left out, ends its run plainly"
    );
    assert_eq!(
        tool_calls,
        &vec![ToolCall {
            call_id: "call_ls".into(),
            name: "shell".into(),
            arguments_json: r#"{"command":["bash","-lc","ls"],"workdir":"/repo"}"#.into(),
        }]
    );
    let NodeContent::Message { tool_calls, .. } = &conv.items[5].content else {
        panic!()
    };
    assert_eq!(
        tool_calls[0].arguments_json,
        canonical(&json!({"input": body["input"][7]["input"]}))
    );
    for (k, name) in [(4, "shell"), (6, "apply_patch"), (8, "shell")] {
        let NodeContent::ToolResult {
            name: n, is_error, ..
        } = &conv.items[k].content
        else {
            panic!("not a result: {:?}", conv.items[k].content);
        };
        assert_eq!(n, name);
        assert!(!is_error);
    }
    // A plain call at the end of its run needs no fields part.
    let NodeContent::Message { parts, .. } = &conv.items[7].content else {
        panic!()
    };
    assert!(parts.is_empty());
    for item in &conv.items {
        item.content.validate("n").unwrap();
    }
    assert_eq!(
        canonical_items(&written),
        canonical_items(&bare(&body["input"]))
    );
}

#[test]
fn a_run_keeps_its_order_and_bare_messages_their_form() {
    let body = json!({
        "model": "gpt-5",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed",
             "action": {"type": "search", "query": "q"}},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
            {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{\"k\":1}"},
            {"type": "function_call", "call_id": "c", "name": "g", "arguments": "{\"k\":2}"},
            {"type": "function_call_output", "call_id": "a", "output": "A"},
            {"type": "function_call_output", "call_id": "b", "output": ""},
            {"type": "function_call_output", "call_id": "c", "output": []},
            {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}], "id": "m_1"}
        ]
    });
    let (conv, written) = round_trip(&body);
    assert_eq!(conv.items.len(), 6);
    let NodeContent::Message {
        parts, tool_calls, ..
    } = &conv.items[1].content
    else {
        panic!()
    };
    // reasoning, fields of `a`, web search, message; `b` and `c` end the run plainly.
    assert_eq!(parts.len(), 4);
    assert_eq!(tool_calls.len(), 3);
    assert_eq!(
        canonical_items(&written),
        canonical_items(&bare(&body["input"]))
    );
}

#[test]
fn a_string_input_is_one_user_message() {
    let (conv, written) = round_trip(&json!({"model": "gpt-5", "input": "hello"}));
    assert_eq!(conv.items.len(), 1);
    assert_eq!(conv.opening, "\n\nhello");
    assert_eq!(written, json!([{"role": "user", "content": "hello"}]));
}

#[test]
fn a_pending_call_is_left_out() {
    let body = json!({
        "model": "gpt-5",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "e"},
            {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "p",
             "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "q", "name": "f", "arguments": "{}"}
        ]
    });
    let (_, written) = round_trip(&body);
    assert_eq!(
        canonical_items(&written),
        canonical_items(&bare(&json!([body["input"][0], body["input"][1]])))
    );
}

#[test]
fn a_cleared_or_truncated_result_is_its_text() {
    let body = json!({
        "model": "gpt-5",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "patch"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "id": "o2", "call_id": "c2",
             "output": [{"type": "input_text", "text": "long"}, {"type": "input_image", "image_url": "u"}]}
        ]
    });
    let conv = read(&body).unwrap();
    let mut messages = rendered(&conv);
    messages[2].parts = vec![Part::Text("[cleared]".into())];
    messages[2].reduction = Reduction::Cleared;
    messages[4].parts = vec![
        messages[4].parts[0].clone(),
        Part::Text("lo…ng".into()),
        messages[4].parts[2].clone(),
    ];
    messages[4].reduction = Reduction::Truncated {
        cut_chars: 1,
        of_chars: 4,
    };
    let written = input(&messages);
    // The output of a custom call stays one when its fields went with the clearing.
    assert_eq!(
        written[2],
        json!({"type": "custom_tool_call_output", "call_id": "c1", "output": "[cleared]"})
    );
    assert_eq!(
        written[1],
        json!({"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "patch"})
    );
    assert_eq!(
        written[4],
        json!({"type": "function_call_output", "call_id": "c2", "output": "lo…ng"})
    );
}

#[test]
fn bad_requests_name_their_field() {
    let invalid = |body: Value| match read(&body) {
        Err(Refusal::Invalid { field, .. }) => field,
        other => panic!("not invalid: {other:?}"),
    };
    assert_eq!(invalid(json!([])), "body");
    assert_eq!(invalid(json!({"input": "x"})), "model");
    assert_eq!(invalid(json!({"model": "m"})), "input");
    assert_eq!(invalid(json!({"model": "m", "input": 3})), "input");
    assert_eq!(
        invalid(json!({"model": "m", "input": "x", "instructions": 1})),
        "instructions"
    );
    assert_eq!(
        invalid(
            json!({"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]})
        ),
        "input[1].role"
    );
    assert_eq!(
        invalid(json!({"model": "m", "input": [{"type": "message", "content": "b"}]})),
        "input[0].role"
    );
    assert_eq!(
        invalid(json!({"model": "m", "input": [{"type": "function_call_output", "output": "b"}]})),
        "input[0].call_id"
    );
    assert_eq!(
        invalid(json!({"model": "m", "input": [{"role": "user", "content": 3}]})),
        "input[0].content"
    );
    assert_eq!(invalid(json!({"model": "m", "input": [7]})), "input[0]");
}

#[test]
fn server_held_state_is_not_recorded() {
    let unrecordable = |body: Value| match read(&body) {
        Err(Refusal::Unrecordable(reason)) => reason,
        other => panic!("recorded: {other:?}"),
    };
    assert_eq!(
        unrecordable(json!({"model": "m", "input": "x", "previous_response_id": "resp_1"})),
        "previous_response_id"
    );
    assert!(read(&json!({"model": "m", "input": "x", "previous_response_id": null})).is_ok());
    unrecordable(json!({"model": "m", "input": "x", "conversation": "conv_1"}));
    unrecordable(json!({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}));
    unrecordable(json!({"model": "m", "input": [
        {"type": "function_call", "name": "f", "arguments": "{}"}
    ]}));
}

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
    let mut a = Answer::new(true);
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
    let mut a = Answer::new(true);
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

/// The request's nodes written back as the `input` a path of them renders.
fn input_of(conv: &Conversation) -> Value {
    input(&rendered(conv))
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

/// Responses Lite's tools come as an `additional_tools` input item, with no top-level
/// `tools`: a node of its own, the item given back whole.
#[test]
fn additional_tools_are_kept_whole() {
    let tools = json!({"type": "additional_tools", "tools": [
        {"type": "function", "name": "shell", "description": "Runs a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]});
    let body = json!({"model": "gpt-5", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        tools,
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a"}
    ]});
    let (conv, written) = round_trip(&body);
    assert_eq!(conv.items.len(), 5);
    assert_eq!(conv.tools_tokens, 0, "no top-level tools");
    let NodeContent::Message {
        role: Role::Assistant,
        parts,
        tool_calls,
    } = &conv.items[1].content
    else {
        panic!("not a node of its own: {:?}", conv.items[1].content);
    };
    assert_eq!((parts, tool_calls.len()), (&vec![kept(&tools)], 0));
    assert_eq!(canonical_items(&written), canonical_items(&body["input"]));
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
    let mut a = Answer::new(false);
    a.feed(body.to_string().as_bytes());
    let (node, usage) = a.finish().unwrap();
    assert_eq!(node, run(&items).unwrap());
    assert_eq!(usage.cache_read, 1000);
    let mut a = Answer::new(false);
    let mut incomplete = body.clone();
    incomplete["status"] = json!("incomplete");
    a.feed(incomplete.to_string().as_bytes());
    assert!(a.finish().is_none());
}

#[test]
fn errors_have_the_api_shape() {
    assert_eq!(
        error("invalid_request_error", "input: bad", Some("input")),
        json!({"error": {"message": "input: bad", "type": "invalid_request_error", "param": "input", "code": null}})
    );
}
