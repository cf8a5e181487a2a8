//! Real agent traces (`testdata/traces/*.jsonl`, the neutral JSONL described in
//! `testdata/traces/README.md`) imported into a ctxd session through the gRPC API, the way an
//! agent host would record them: one Append per model turn (a message and the tool results
//! answering it), each atomic and a compare-and-swap on the head the previous one left.
//!
//! A sub-agent trace can be nested into the main one as a function (`import_with_subagent`).
//!
//! The pairing rules are strict (a result must answer a call of the latest assistant message;
//! no message while calls are pending). Real traces that break them are not forced through
//! silently: each deviation is handled in one explicit way and listed in
//! [`Imported::anomalies`], which the tests assert.

use std::path::PathBuf;

use ctxd::api::pb;
use serde::Deserialize;

use crate::helpers::*;

/// One line of a trace.
#[derive(Debug, Clone, Deserialize)]
pub struct TraceMessage {
    pub role: String,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub tool_calls: Vec<TraceCall>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub is_error: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TraceCall {
    pub id: String,
    pub name: String,
    /// A JSON document, as a string.
    pub arguments: String,
}

/// `testdata/traces/<name>.jsonl`.
pub fn trace_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/traces")
        .join(format!("{name}.jsonl"))
}

/// The messages of `testdata/traces/<name>.jsonl`, in order.
pub fn load_trace(name: &str) -> Vec<TraceMessage> {
    let path = trace_path(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read testdata/traces/{name}.jsonl: {e}"));
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{name}.jsonl line {}: {e}", i + 1))
        })
        .collect()
}

/// What an import did.
#[derive(Debug, Clone, Default)]
pub struct Imported {
    pub session: String,
    /// Trace messages imported (main and sub-agent).
    pub messages: usize,
    /// Nodes appended (a function_call and a function_result replace one tool result).
    pub nodes: usize,
    /// Append requests made.
    pub requests: usize,
    /// The function holding the sub-agent's chain, when one was nested.
    pub function_id: Option<String>,
    /// Every place the trace broke a pairing rule and what the import did about it, as
    /// `<trace>[<index>]: <what>`.
    pub anomalies: Vec<String>,
}

/// Imports trace `name` into a new session's `main` branch.
pub async fn import(app: &mut TestApp, name: &str) -> Imported {
    import_inner(app, name, None).await
}

/// Imports `main` into a new session, nesting the sub-agent trace `sub` as the function that
/// answers the main trace's call `call_id`: the assistant message making the call is followed by
/// `function_call{call_id, input: <the call's prompt>, expose}`, the whole sub trace is appended
/// into that function, and where the main trace has the call's tool result, a
/// `function_result{call_id, output: <its content>, status}` closes the function instead.
pub async fn import_with_subagent(
    app: &mut TestApp,
    main: &str,
    sub: &str,
    call_id: &str,
    expose: pb::Expose,
) -> Imported {
    import_inner(
        app,
        main,
        Some(SubAgent {
            trace: sub.to_owned(),
            call_id: call_id.to_owned(),
            expose,
        }),
    )
    .await
}

struct SubAgent {
    trace: String,
    call_id: String,
    expose: pb::Expose,
}

async fn import_inner(app: &mut TestApp, name: &str, sub: Option<SubAgent>) -> Imported {
    let session = app.create_session().await;
    let mut imported = Imported {
        session: session.clone(),
        ..Imported::default()
    };
    let messages = load_trace(name);
    let mut main = Chain::new(name, Target::Main);

    // The sub-agent's function, once called.
    let mut function: Option<String> = None;

    for (i, m) in messages.iter().enumerate() {
        imported.messages += 1;
        if m.role == "tool" {
            let call_id = m.tool_call_id.clone().unwrap_or_default();
            if main.running.as_deref() == Some(call_id.as_str()) {
                main.running = None;
                main.batch.push(function_result(
                    &call_id,
                    &m.content,
                    if m.is_error {
                        pb::FunctionStatus::Error
                    } else {
                        pb::FunctionStatus::Completed
                    },
                ));
            } else {
                main.tool_result(i, m, &mut imported.anomalies);
            }
            continue;
        }

        main.flush(app, &session, &mut imported).await;
        main.message(i, m);

        let Some(sub) = sub.as_ref() else { continue };
        let Some(call) = m.tool_calls.iter().find(|c| c.id == sub.call_id) else {
            continue;
        };
        // The sub-agent starts here: the function answers the call, then its own chain is
        // appended into it before the main trace goes on.
        let sub_messages = load_trace(&sub.trace);
        let first = sub_messages
            .first()
            .unwrap_or_else(|| panic!("sub trace {} is empty", sub.trace));
        let prompt = serde_json::from_str::<serde_json::Value>(&call.arguments)
            .ok()
            .and_then(|args| {
                args.get("prompt")
                    .and_then(|p| p.as_str())
                    .map(String::from)
            })
            .unwrap_or_else(|| first.content.clone());
        assert!(
            first.role == "user" && first.content == prompt,
            "{name}[{i}]: the prompt of call {} should be the first user message of {}",
            sub.call_id,
            sub.trace
        );
        main.answer(&sub.call_id);
        main.running = Some(sub.call_id.clone());
        main.batch
            .push(function_call(&sub.call_id, &prompt, sub.expose));
        // Mid-turn: the assistant message and the function_call, not yet the other results.
        let appended = main.send(app, &session, &mut imported).await;
        let function_id = appended
            .node_ids
            .last()
            .cloned()
            .expect("the function_call node id");

        let mut inner = Chain::new(&sub.trace, Target::Function(function_id.clone()));
        for (j, sm) in sub_messages.iter().enumerate() {
            imported.messages += 1;
            if sm.role == "tool" {
                inner.tool_result(j, sm, &mut imported.anomalies);
            } else {
                inner.flush(app, &session, &mut imported).await;
                inner.message(j, sm);
            }
        }
        inner.finish(app, &session, &mut imported).await;
        function = Some(function_id);
    }
    main.finish(app, &session, &mut imported).await;

    if let Some(sub) = &sub {
        assert!(
            function.is_some(),
            "{name} never made the call {}",
            sub.call_id
        );
    }
    imported.function_id = function;
    imported
}

enum Target {
    Main,
    Function(String),
}

/// One chain being imported: its head, the batch of the current model turn, and the calls of
/// its latest assistant message still waiting for an answer.
struct Chain {
    trace: String,
    target: Target,
    /// `Some("")`: the chain has no node yet.
    head: String,
    batch: Vec<pb::NodeInput>,
    pending: Vec<String>,
    /// The call a running function answers (its function_result is still to come).
    running: Option<String>,
    /// Index of the latest assistant message, for the anomaly notes.
    latest_assistant: usize,
}

/// The content of a synthetic result for a call the trace never answered mid-session.
pub const MISSING_RESULT: &str = "[ctxd trace import: the trace has no result for this call]";

impl Chain {
    fn new(trace: &str, target: Target) -> Self {
        Self {
            trace: trace.to_owned(),
            target,
            head: String::new(),
            batch: Vec::new(),
            pending: Vec::new(),
            running: None,
            latest_assistant: 0,
        }
    }

    fn is_pending(&self, call_id: &str) -> bool {
        self.pending.iter().any(|c| c == call_id)
    }

    fn answer(&mut self, call_id: &str) {
        self.pending.retain(|c| c != call_id);
    }

    /// Starts a new model turn with a system, user or assistant message (after `flush`).
    fn message(&mut self, i: usize, m: &TraceMessage) {
        assert!(self.batch.is_empty(), "flush before a new message");
        let role = match m.role.as_str() {
            "system" => pb::Role::System,
            "user" => pb::Role::User,
            "assistant" => pb::Role::Assistant,
            other => panic!("{}[{i}]: unknown role {other:?}", self.trace),
        };
        if !m.tool_calls.is_empty() && role != pb::Role::Assistant {
            panic!("{}[{i}]: a {} message with tool calls", self.trace, m.role);
        }
        let calls: Vec<pb::ToolCall> = m
            .tool_calls
            .iter()
            .map(|c| call(&c.id, &c.name, &c.arguments))
            .collect();
        // An assistant message that only makes calls has no text part; anything else keeps its
        // text, even empty, since a message needs parts or calls.
        let parts = if m.content.is_empty() && !calls.is_empty() {
            vec![]
        } else {
            vec![text(m.content.clone())]
        };
        self.batch.push(message(role, parts, calls));
        if role == pb::Role::Assistant {
            self.pending = m.tool_calls.iter().map(|c| c.id.clone()).collect();
            self.latest_assistant = i;
        }
    }

    /// Adds a tool result to the current turn; one that answers no pending call is dropped
    /// and noted.
    fn tool_result(&mut self, i: usize, m: &TraceMessage, anomalies: &mut Vec<String>) {
        let call_id = m.tool_call_id.clone().unwrap_or_default();
        if !self.is_pending(&call_id) {
            anomalies.push(format!(
                "{}[{i}]: tool result for {call_id:?} answers no pending call of the latest \
                 assistant message; dropped",
                self.trace
            ));
            return;
        }
        self.answer(&call_id);
        self.batch.push(if m.is_error {
            tool_error(&call_id, &m.content)
        } else {
            tool_result(&call_id, &m.content)
        });
    }

    /// Ends the current model turn before a new message: calls the trace left unanswered get a
    /// synthetic error result (the rules allow no message while calls are pending, and dropping
    /// the calls would hide what the model did), a function the trace never returned from gets
    /// an error function_result; each is noted. Then the turn is sent as one atomic Append.
    async fn flush(&mut self, app: &mut TestApp, session: &str, imported: &mut Imported) {
        for call_id in std::mem::take(&mut self.pending) {
            imported.anomalies.push(format!(
                "{}[{}]: call {call_id:?} has no result before the next message; \
                 answered with a synthetic error result",
                self.trace, self.latest_assistant
            ));
            self.batch.push(tool_error(&call_id, MISSING_RESULT));
        }
        if let Some(call_id) = self.running.take() {
            imported.anomalies.push(format!(
                "{}[{}]: the function answering {call_id:?} has no result before the next \
                 message; closed with status error",
                self.trace, self.latest_assistant
            ));
            self.batch.push(function_result(
                &call_id,
                MISSING_RESULT,
                pb::FunctionStatus::Error,
            ));
        }
        self.send(app, session, imported).await;
    }

    /// Sends what is left; calls still pending at the end of the trace stay pending (the rules
    /// allow that at the tail) and are noted, as is a function still running.
    async fn finish(&mut self, app: &mut TestApp, session: &str, imported: &mut Imported) {
        self.send(app, session, imported).await;
        if let Some(call_id) = self.running.take() {
            imported.anomalies.push(format!(
                "{}[{}]: the function answering {call_id:?} has no result at the end of the \
                 trace; left running",
                self.trace, self.latest_assistant
            ));
        }
        for call_id in std::mem::take(&mut self.pending) {
            imported.anomalies.push(format!(
                "{}[{}]: call {call_id:?} has no result at the end of the trace; left pending",
                self.trace, self.latest_assistant
            ));
        }
    }

    async fn send(
        &mut self,
        app: &mut TestApp,
        session: &str,
        imported: &mut Imported,
    ) -> pb::AppendResponse {
        if self.batch.is_empty() {
            return pb::AppendResponse::default();
        }
        let nodes = std::mem::take(&mut self.batch);
        let count = nodes.len();
        let req = match &self.target {
            Target::Main => append_req(session, nodes),
            Target::Function(function_id) => function_req(session, function_id, nodes),
        };
        let req = pb::AppendRequest {
            expected_head_id: Some(self.head.clone()),
            ..req
        };
        let response = app.try_append(req).await.unwrap_or_else(|status| {
            panic!(
                "{}: Append of {count} nodes failed: {:?} {}",
                self.trace,
                status.code(),
                status.message()
            )
        });
        self.head = response.head_id.clone();
        imported.nodes += count;
        imported.requests += 1;
        response
    }
}

// ---------------------------------------------------------------- tests of the import itself

/// The unbudgeted render of an imported trace is the trace: same roles, texts, calls, results.
#[tokio::test]
async fn imported_traces_render_as_the_trace() {
    let mut app = spawn_app().await;
    for name in ["swe-marshmallow-1867-fc", "swe-pydicom-1458"] {
        let imported = import(&mut app, name).await;
        let trace = load_trace(name);
        let r = app.render_branch(&imported.session, "main").await;
        assert_eq!(
            r.messages.len(),
            trace.len(),
            "{name}: one message per line"
        );
        for (i, (m, t)) in r.messages.iter().zip(&trace).enumerate() {
            let role = match pb::Role::try_from(m.role) {
                Ok(pb::Role::System) => "system",
                Ok(pb::Role::User) => "user",
                Ok(pb::Role::Assistant) => "assistant",
                Ok(pb::Role::Tool) => "tool",
                other => panic!("{name}[{i}]: role {other:?}"),
            };
            assert_eq!(role, t.role, "{name}[{i}]: role");
            assert_eq!(text_of(&m.parts), t.content, "{name}[{i}]: content");
            let calls: Vec<(&str, &str, &str)> = m
                .tool_calls
                .iter()
                .map(|c| {
                    (
                        c.call_id.as_str(),
                        c.name.as_str(),
                        c.arguments_json.as_str(),
                    )
                })
                .collect();
            let expected: Vec<(&str, &str, &str)> = t
                .tool_calls
                .iter()
                .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
                .collect();
            assert_eq!(calls, expected, "{name}[{i}]: tool calls");
            if role == "tool" {
                assert_eq!(Some(&m.tool_call_id), t.tool_call_id.as_ref());
                assert_eq!(m.is_error, t.is_error, "{name}[{i}]: is_error");
            }
        }
        assert_eq!(imported.messages, trace.len());
        assert_eq!(imported.nodes, trace.len());
    }
}

/// pydicom's final `submit` action has no observation: the call stays pending at the tail,
/// which the rules allow, and the import says so. The other traces follow the rules.
#[tokio::test]
async fn trace_anomalies_are_reported() {
    let mut app = spawn_app().await;
    let pydicom = import(&mut app, "swe-pydicom-1458").await;
    assert_eq!(
        pydicom.anomalies,
        vec![
            "swe-pydicom-1458[25]: call \"swe_call_12\" has no result at the end of the trace; \
             left pending"
                .to_string()
        ]
    );
    let marshmallow = import(&mut app, "swe-marshmallow-1867-fc").await;
    assert_eq!(marshmallow.anomalies, Vec::<String>::new());
}

/// The sub-agent of cc-main-8463c716 nests as a function: with `expose=full` its whole chain
/// renders after the Task call's result, every message of it marked with the function.
#[tokio::test]
async fn subagent_trace_nests_as_a_function() {
    const CALL: &str = "toolu_017SvvKc8KLbhGMG3tXkf21Z";
    let mut app = spawn_app().await;
    let imported = import_with_subagent(
        &mut app,
        "cc-main-8463c716",
        "cc-sub-8463c716-a7be2f0",
        CALL,
        pb::Expose::Full,
    )
    .await;
    assert_eq!(imported.anomalies, Vec::<String>::new());
    let main = load_trace("cc-main-8463c716");
    let sub = load_trace("cc-sub-8463c716-a7be2f0");
    assert_eq!(imported.messages, main.len() + sub.len());
    // The tool result became a function_call and a function_result.
    assert_eq!(imported.nodes, main.len() + sub.len() + 1);
    let function_id = imported.function_id.clone().expect("a function");

    let r = app.render_branch(&imported.session, "main").await;
    assert_eq!(r.messages.len(), main.len() + sub.len());
    let at = r
        .messages
        .iter()
        .position(|m| m.tool_call_id == CALL)
        .expect("the Task call's result renders");
    let result = &r.messages[at];
    assert_eq!(result.name, "Task");
    let answered = main
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some(CALL))
        .expect("the main trace answers the call");
    assert_eq!(text_of(&result.parts), answered.content);
    let inner: Vec<usize> = (0..r.messages.len())
        .filter(|&i| r.messages[i].function_id == function_id)
        .collect();
    assert_eq!(inner, (at + 1..at + 1 + sub.len()).collect::<Vec<_>>());
    assert_eq!(text_of(&r.messages[at + 1].parts), sub[0].content);
}
