//! Unit tests of the importers on small inputs and the real Claude Code files.

use super::*;

fn kinds(plan: &History) -> Vec<String> {
    plan.ops
        .iter()
        .map(|op| match op {
            Op::Summary { .. } | Op::Overlay { .. } => "summary".to_owned(),
            Op::Fork { .. } | Op::Pin { .. } | Op::Branch { .. } => "ref".to_owned(),
            Op::Node { scope, content, .. } => {
                let kind = match content {
                    NodeContent::Message { role, .. } => role.as_str().to_owned(),
                    NodeContent::ToolResult { call_id, .. } => format!("result:{call_id}"),
                    NodeContent::FunctionCall { call_id, .. } => format!("call:{call_id}"),
                    NodeContent::FunctionResult(r) => format!("return:{}", r.call_id),
                };
                if scope.is_some() {
                    format!("  {kind}")
                } else {
                    kind
                }
            }
        })
        .collect()
}

fn err(source: Source, text: &str) -> String {
    parse(source, text.as_bytes())
        .expect_err("malformed")
        .to_string()
}

#[test]
fn neutral_jsonl_keeps_pairs_and_names_bad_lines() {
    let text = r#"{"role": "user", "content": "hi"}
{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "ls", "arguments": "{}"}]}
{"role": "tool", "tool_call_id": "c1", "content": "a b", "is_error": true}

{"role": "assistant", "content": "done"}"#;
    let plan = parse(Source::NeutralJsonl, text.as_bytes()).expect("parses");
    assert_eq!(
        kinds(&plan),
        ["user", "assistant", "result:c1", "assistant"]
    );
    assert!(matches!(
        &plan.ops[2],
        Op::Node { content: NodeContent::ToolResult { name, is_error: true, .. }, line: 3, .. } if name == "ls"
    ));
    assert!(plan.warnings.is_empty());

    assert_eq!(
        err(
            Source::NeutralJsonl,
            "{\"role\": \"user\", \"content\": \"x\"}\n{oops"
        ),
        "line 2: not JSON: key must be a string at line 1 column 2"
    );
    assert!(
        err(Source::NeutralJsonl, r#"{"role": "robot", "content": "x"}"#)
            .starts_with("line 1.role:")
    );
    assert!(
        err(
            Source::NeutralJsonl,
            r#"{"role": "assistant", "tool_calls": [{"id": "c", "name": "n", "arguments": "{nope"}]}"#
        )
        .starts_with("line 1.tool_calls[0].arguments: not JSON")
    );
    assert!(
        err(Source::NeutralJsonl, r#"{"role": "tool", "content": "x"}"#)
            .starts_with("line 1.tool_call_id:")
    );
    assert_eq!(err(Source::NeutralJsonl, "\n\n"), "data: holds no message");
}

#[test]
fn pairing_breaks_are_repaired_and_reported() {
    let text = r#"{"role": "user", "content": "hi"}
{"role": "tool", "tool_call_id": "ghost", "content": "?"}
{"role": "assistant", "tool_calls": [{"id": "c1", "name": "ls", "arguments": {"path": "."}}]}
{"role": "user", "content": "never mind"}"#;
    let plan = parse(Source::NeutralJsonl, text.as_bytes()).expect("parses");
    assert_eq!(kinds(&plan), ["user", "assistant", "result:c1", "user"]);
    assert_eq!(plan.warnings.len(), 2, "{:?}", plan.warnings);
    assert!(plan.warnings[0].starts_with("line 2: a result for call ghost"));
    assert!(plan.warnings[1].starts_with("line 4: call c1 had no result"));
    // Object arguments are kept as JSON text.
    assert!(matches!(
        &plan.ops[1],
        Op::Node { content: NodeContent::Message { tool_calls, .. }, .. } if tool_calls[0].arguments_json == r#"{"path":"."}"#
    ));
}

#[test]
fn openai_messages_array() {
    let text = r#"[
  {"role": "system", "content": "be brief"},
  {"role": "user", "content": [{"type": "text", "text": "what is this?"},
     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]},
  {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
  {"role": "assistant", "content": "A cat."}
]"#;
    assert_eq!(detect(text.as_bytes()), Source::OpenAiMessages);
    let plan = parse(Source::OpenAiMessages, text.as_bytes()).expect("parses");
    assert_eq!(
        kinds(&plan),
        ["system", "user", "assistant", "result:c1", "assistant"]
    );
    assert!(matches!(
        &plan.ops[1],
        Op::Node { content: NodeContent::Message { parts, .. }, .. }
            if matches!(&parts[1], Part::Media { mime_type, source: crate::domain::MediaSource::Data(d) } if mime_type == "image/png" && d.len() == 6)
    ));
    let bad = r#"[{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "n", "arguments": "{"}}]}]"#;
    assert!(
        err(Source::OpenAiMessages, bad)
            .starts_with("messages[0].tool_calls[0].function.arguments: not JSON")
    );
    assert!(
        err(Source::OpenAiMessages, "[\n{\"role\": \"user\",\n").starts_with("line 3: not JSON")
    );
}

fn claude_code(files: &[&str]) -> History {
    let mut data = Vec::new();
    for file in files {
        let path = format!("{}/testdata/claude-code/{file}", env!("CARGO_MANIFEST_DIR"));
        data.extend(std::fs::read(&path).expect("test file"));
    }
    assert_eq!(detect(&data), Source::ClaudeCodeJsonl);
    parse(Source::ClaudeCodeJsonl, &data).expect("parses")
}

#[test]
fn claude_code_merges_split_messages_and_keeps_pairs() {
    let plan = claude_code(&["short.jsonl"]);
    // Three assistant lines of one API message and two results become one message and its
    // group; thinking blocks are gone.
    assert_eq!(
        kinds(&plan)[..4],
        [
            "user",
            "assistant",
            "result:toolu_0116Hyi5v8ut7Ffb7d8qV1Sc",
            "result:toolu_01FdQ8qTyVyZjE3Kw4dguQGx"
        ]
    );
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    for file in ["subagent.jsonl", "tool_heavy.jsonl"] {
        let plan = claude_code(&[file]);
        assert!(plan.nodes() > 10, "{file}");
    }
}

#[test]
fn claude_code_sidechains_become_functions_and_compactions_summaries() {
    let plan = claude_code(&[
        "258c7280-ae70-4798-800f-63464d01a85d.jsonl",
        "258c7280-agent-a881341.jsonl",
    ]);
    assert_eq!(plan.functions(), 1);
    assert_eq!(plan.summaries(), 1);
    let kinds = kinds(&plan);
    let call = kinds
        .iter()
        .position(|k| k.starts_with("call:"))
        .expect("a function call");
    // The sub-agent's chain follows its call, inside the function, and opens with its prompt.
    assert_eq!(kinds[call + 1], "  user");
    let inner = kinds[call + 1..]
        .iter()
        .take_while(|k| k.starts_with("  "))
        .count();
    assert!(inner >= 5, "{inner} nodes inside");
    assert!(kinds.iter().any(|k| k.starts_with("return:")));
    let Some(Op::Summary { text, .. }) =
        plan.ops.iter().find(|op| matches!(op, Op::Summary { .. }))
    else {
        unreachable!("counted above")
    };
    assert!(text.starts_with("This session is being continued from a previous conversation"));
    // Without the sub-agent's file, its call is answered by its plain result.
    let alone = claude_code(&["258c7280-ae70-4798-800f-63464d01a85d.jsonl"]);
    assert_eq!(alone.functions(), 0);
    assert_eq!(alone.nodes() + 1, plan.nodes() - inner);
}
