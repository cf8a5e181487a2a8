//! Requests read into nodes and written back as they came, and the requests refused: a bad
//! field named, state the server holds not recorded, the error body in the API's shape.

use super::*;
use crate::provider::message_of;
use crate::render::Reduction;

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
    let (role, parts, tool_calls) = message_of(&conv.items[3].content);
    assert_eq!(role, Role::Assistant);
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
    let (role, parts, tool_calls) = message_of(&conv.items[1].content);
    assert_eq!(role, Role::Assistant);
    assert_eq!((parts, tool_calls.len()), (&[kept(&tools)][..], 0));
    assert_eq!(canonical_items(&written), canonical_items(&body["input"]));
}

#[test]
fn errors_have_the_api_shape() {
    assert_eq!(
        Responses.error(Failure::Invalid, "input: bad", Some("input")),
        json!({"error": {"message": "input: bad", "type": "invalid_request_error", "param": "input", "code": null}})
    );
}
