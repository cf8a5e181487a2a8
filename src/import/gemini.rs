//! Gemini CLI session files (`~/.gemini/tmp/<project hash>/chats/session-*.jsonl`, or the
//! older `.json`): the conversation Gemini CLI sends when it resumes the session
//! (`provider::gemini::session`), read by the Gemini codec as the gateway reads that request, so
//! an imported session continues through the gateway node for node.

use super::{Builder, History, refused};
use crate::domain::Error;
use crate::provider::gemini;

pub(super) fn parse(text: &str) -> Result<History, Error> {
    let mut session = gemini::session(text).map_err(|e| refused("", e))?;
    let items = gemini::contents(&mut session.contents).map_err(|e| refused("", e))?;
    let mut b = Builder::default();
    for (line, what) in session.skipped {
        b.warn(line, format!("{what}; skipped"));
    }
    for item in items {
        let line = session.lines[item.message];
        b.node(item.content, line);
    }
    Ok(b.finish(session.last))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::{Op, Source, detect};
    use super::*;
    use crate::domain::{NodeContent, Part, Role};

    const SESSION: &str = include_str!("../../testdata/import/gemini-cli-0.61.0-session.jsonl");

    fn contents(plan: &History) -> Vec<NodeContent> {
        plan.ops
            .iter()
            .filter_map(|op| match op {
                Op::Node { content, .. } => Some(content.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_gemini_cli_session_imports_as_the_gateway_reads_its_resume() {
        assert_eq!(detect(SESSION.as_bytes()), Source::GeminiCliSession);
        let plan = super::super::parse(Source::GeminiCliSession, SESSION.as_bytes()).unwrap();
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
        let nodes = contents(&plan);
        // The request Gemini CLI sent after `--resume` (the corpus's 04.json) reads as the
        // imported session's nodes, but for the answer that came after it.
        let path = format!(
            "{}/testdata/gateway/corpus/gemini-cli-0.61.0/04.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut body: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let Some(Value::Array(sent)) = body.get_mut("contents") else {
            panic!()
        };
        let resumed: Vec<NodeContent> = gemini::contents(sent)
            .unwrap()
            .into_iter()
            .map(|i| i.content)
            .collect();
        assert_eq!(nodes.len(), resumed.len() + 1);
        for (k, (a, b)) in nodes.iter().zip(&resumed).enumerate() {
            assert!(a.says_same(b), "node {k}: {a:?} / {b:?}");
        }
        assert!(matches!(
            nodes.last(),
            Some(NodeContent::Message { role: Role::Assistant, parts, .. })
                if Part::text_of(parts) == "Nothing else: out.txt holds the marker."
        ));
        assert!(
            matches!(&nodes[2], NodeContent::ToolResult { name, .. } if name == "run_shell_command")
        );
    }

    #[test]
    fn an_older_session_file_rebuilds_calls_and_results() {
        let file = json!({"sessionId": "s", "projectHash": "p", "messages": [
            {"id": "1", "type": "user", "content": "list files"},
            {"id": "2", "type": "info", "content": "switched model"},
            {"id": "3", "type": "user", "content": "/stats"},
            {"id": "4", "type": "gemini", "content": "",
             "thoughts": [{"subject": "Listing", "description": "ls will do."}],
             "toolCalls": [{"id": "ls-1", "name": "ls", "args": {"dir": "."},
                            "result": [{"functionResponse": {"id": "ls-1", "name": "ls",
                                                               "response": {"output": "a b"}}}],
                            "status": "success"},
                           {"id": "cat-2", "name": "cat", "args": {}, "result": "text",
                            "status": "success"}]},
            {"id": "5", "type": "gemini", "content": "Two files."},
            {"id": "6", "type": "user", "content": [{"text": "thanks"}]}
        ]});
        let text = serde_json::to_string_pretty(&file).unwrap();
        assert_eq!(detect(text.as_bytes()), Source::GeminiCliSession);
        let plan = super::super::parse(Source::GeminiCliSession, text.as_bytes()).unwrap();
        let nodes = contents(&plan);
        let kinds: Vec<String> = nodes
            .iter()
            .map(|n| match n {
                NodeContent::Message {
                    role, tool_calls, ..
                } => {
                    format!("{}:{}", role.as_str(), tool_calls.len())
                }
                NodeContent::ToolResult { name, .. } => format!("result:{name}"),
                _ => "?".into(),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "user:0",
                "assistant:2",
                "result:ls",
                "result:cat",
                "assistant:0",
                "user:0"
            ]
        );
        let NodeContent::Message { parts, .. } = &nodes[1] else {
            panic!()
        };
        assert!(
            matches!(&parts[0], Part::Block(b) if b.reasoning && b.json.contains("**Listing** ls will do."))
        );
    }

    #[test]
    fn a_rewind_drops_what_followed_and_bad_lines_are_named() {
        let text = [
            r#"{"sessionId":"s","projectHash":"p","startTime":"t","lastUpdated":"t"}"#,
            r#"{"id":"a","timestamp":"t","type":"user","content":[{"text":"first"}]}"#,
            r#"{"id":"b","timestamp":"t","type":"gemini","content":"wrong turn"}"#,
            r#"{"$rewindTo":"b"}"#,
            r#"{"id":"c","timestamp":"t","type":"gemini","content":"right turn"}"#,
        ]
        .join("\n");
        let plan = super::super::parse(Source::GeminiCliSession, text.as_bytes()).unwrap();
        let texts: Vec<String> = contents(&plan)
            .iter()
            .map(|n| Part::text_of(n.parts()))
            .collect();
        assert_eq!(texts, ["first", "right turn"]);
        let bad = format!("{}\n{{\"id\":\"x\",\"content\":\"no type\"}}", text);
        assert_eq!(
            super::super::parse(Source::GeminiCliSession, bad.as_bytes())
                .unwrap_err()
                .to_string(),
            "line 6.type: must be a string"
        );
    }
}
