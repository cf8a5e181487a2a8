//! The pairing rules checked at append: every tool call gets exactly one answer, in order.
//!
//! A chain's pairing state lives entirely after its latest message: while the latest assistant
//! message has unanswered calls, only their answers may follow. So the store needs to read only
//! the nodes since that message, and every stored path renders with calls and results paired.
//!
//! A call a function took up is answered by its function_result, or, for a function that runs in
//! the background (a sub-agent launched and answered at once, its work reported later), by a
//! tool_result: the caller goes on and the function stays open for its own chain.

use super::{Error, FunctionResult, NodeContent, NodeId, ToolCall};

#[derive(Debug, Clone, PartialEq, Eq)]
enum CallState {
    Open,
    /// Answered by a function that has not returned yet.
    Running(NodeId),
    Answered,
    /// Answered by a tool result while its function runs on in the background.
    Detached,
}

/// The calls of a chain's latest assistant message and how far each is answered.
#[derive(Debug, Clone, Default)]
pub struct ChainTail {
    calls: Vec<(ToolCall, CallState)>,
}

/// What admitting a node means beyond adding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    Plain,
    /// A function_call: it opens a function scope.
    OpensFunction,
    /// A function_result: it closes this function.
    ClosesFunction(NodeId),
}

impl ChainTail {
    /// Rebuilds the tail from a chain's nodes since (and including) its latest message, oldest
    /// first. Those nodes were admitted once already, so they are replayed, not checked.
    pub fn replay<'a>(nodes: impl IntoIterator<Item = (NodeId, &'a NodeContent)>) -> Self {
        let mut tail = Self::default();
        for (id, content) in nodes {
            tail.apply(id, content);
        }
        tail
    }

    /// Call ids still waiting for an answer (tool result or function result).
    pub fn pending(&self) -> Vec<&str> {
        self.calls
            .iter()
            .filter(|(_, state)| matches!(state, CallState::Open | CallState::Running(_)))
            .map(|(call, _)| call.call_id.as_str())
            .collect()
    }

    /// Checks `content` (the node at request field `field`) against the rules, fills the names
    /// a result may leave empty, and advances the tail.
    pub fn admit(
        &mut self,
        field: &str,
        id: NodeId,
        content: &mut NodeContent,
    ) -> Result<Admit, Error> {
        let admit = match content {
            NodeContent::Message { .. } => {
                let pending = self.pending();
                if !pending.is_empty() {
                    return Err(Error::FailedPrecondition(format!(
                        "{field}: the latest assistant message has unanswered tool calls ({}); \
                         append their results first",
                        pending.join(", ")
                    )));
                }
                Admit::Plain
            }
            NodeContent::ToolResult { call_id, name, .. } => {
                let call = self.call(field, call_id, "tool_result")?;
                match &call.1 {
                    // A running function's call answered by a tool result: the function runs
                    // on in the background.
                    CallState::Open | CallState::Running(_) => {}
                    CallState::Answered | CallState::Detached => {
                        return Err(answered(field, "tool_result", call_id));
                    }
                }
                fill_name(field, "tool_result", name, &call.0)?;
                Admit::Plain
            }
            NodeContent::FunctionCall { call_id, name, .. } => {
                let call = self.call(field, call_id, "function_call")?;
                if call.1 != CallState::Open {
                    return Err(answered(field, "function_call", call_id));
                }
                fill_name(field, "function_call", name, &call.0)?;
                Admit::OpensFunction
            }
            NodeContent::FunctionResult(FunctionResult { call_id, .. }) => {
                let call = self.call(field, call_id, "function_result")?;
                match call.1 {
                    CallState::Running(function_id) => Admit::ClosesFunction(function_id),
                    CallState::Answered => return Err(answered(field, "function_result", call_id)),
                    CallState::Detached => {
                        return Err(Error::invalid(
                            format!("{field}.function_result.call_id"),
                            format!(
                                "call {call_id:?} was answered by a tool_result; its function \
                                 runs in the background and returns no result"
                            ),
                        ));
                    }
                    CallState::Open => {
                        return Err(Error::invalid(
                            format!("{field}.function_result.call_id"),
                            format!("no function_call was made for call {call_id:?}"),
                        ));
                    }
                }
            }
        };
        self.apply(id, content);
        Ok(admit)
    }

    fn call(
        &self,
        field: &str,
        call_id: &str,
        kind: &str,
    ) -> Result<&(ToolCall, CallState), Error> {
        self.calls
            .iter()
            .find(|(call, _)| call.call_id == call_id)
            .ok_or_else(|| {
                Error::invalid(
                    format!("{field}.{kind}.call_id"),
                    format!("{call_id:?} is not a call of the latest assistant message"),
                )
            })
    }

    fn apply(&mut self, id: NodeId, content: &NodeContent) {
        let set = |calls: &mut Vec<(ToolCall, CallState)>, call_id: &str, state: CallState| {
            if let Some(entry) = calls.iter_mut().find(|(call, _)| call.call_id == call_id) {
                entry.1 = state;
            }
        };
        match content {
            NodeContent::Message { tool_calls, .. } => {
                self.calls = tool_calls
                    .iter()
                    .map(|call| (call.clone(), CallState::Open))
                    .collect();
            }
            NodeContent::ToolResult { call_id, .. } => {
                let detached = self
                    .calls
                    .iter()
                    .any(|(c, s)| c.call_id == *call_id && matches!(s, CallState::Running(_)));
                let state = if detached {
                    CallState::Detached
                } else {
                    CallState::Answered
                };
                set(&mut self.calls, call_id, state)
            }
            NodeContent::FunctionCall { call_id, .. } => {
                set(&mut self.calls, call_id, CallState::Running(id))
            }
            NodeContent::FunctionResult(result) => {
                set(&mut self.calls, &result.call_id, CallState::Answered)
            }
        }
    }
}

fn answered(field: &str, kind: &str, call_id: &str) -> Error {
    Error::invalid(
        format!("{field}.{kind}.call_id"),
        format!("call {call_id:?} already has a result"),
    )
}

fn fill_name(field: &str, kind: &str, name: &mut String, call: &ToolCall) -> Result<(), Error> {
    if name.is_empty() {
        name.clone_from(&call.name);
    } else if *name != call.name {
        return Err(Error::invalid(
            format!("{field}.{kind}.name"),
            format!(
                "call {:?} was made to {:?}, not {name:?}",
                call.call_id, call.name
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Expose, FunctionStatus, Role};

    fn assistant(calls: &[&str]) -> NodeContent {
        NodeContent::Message {
            role: Role::Assistant,
            parts: vec![],
            tool_calls: calls
                .iter()
                .map(|id| ToolCall {
                    call_id: (*id).to_owned(),
                    name: "bash".to_owned(),
                    arguments_json: "{}".to_owned(),
                })
                .collect(),
        }
    }

    fn result(call_id: &str) -> NodeContent {
        NodeContent::ToolResult {
            call_id: call_id.to_owned(),
            name: String::new(),
            parts: vec![],
            is_error: false,
        }
    }

    fn user() -> NodeContent {
        NodeContent::Message {
            role: Role::User,
            parts: vec![],
            tool_calls: vec![],
        }
    }

    #[test]
    fn results_answer_open_calls_once() {
        let mut tail = ChainTail::default();
        let id = NodeId::new();
        tail.admit("n", id, &mut assistant(&["a", "b"]))
            .expect("assistant");
        let mut r = result("a");
        tail.admit("n", id, &mut r).expect("first result");
        assert!(matches!(r, NodeContent::ToolResult { ref name, .. } if name == "bash"));
        let err = tail
            .admit("n", id, &mut result("a"))
            .expect_err("second result");
        assert!(err.to_string().contains("already has a result"), "{err}");
        let err = tail
            .admit("n", id, &mut result("zz"))
            .expect_err("unknown call");
        assert!(
            err.to_string().starts_with("n.tool_result.call_id"),
            "{err}"
        );
        let err = tail.admit("n", id, &mut user()).expect_err("b still open");
        assert!(matches!(err, Error::FailedPrecondition(_)));
        tail.admit("n", id, &mut result("b")).expect("b");
        tail.admit("n", id, &mut user()).expect("all answered");
        assert!(tail.pending().is_empty());
    }

    fn function_call(call_id: &str) -> NodeContent {
        NodeContent::FunctionCall {
            call_id: call_id.to_owned(),
            name: String::new(),
            input: "go".to_owned(),
            expose: Expose::Io,
        }
    }

    fn function_result(call_id: &str) -> NodeContent {
        NodeContent::FunctionResult(FunctionResult {
            call_id: call_id.to_owned(),
            output: "ok".to_owned(),
            status: FunctionStatus::Completed,
            chain: None,
        })
    }

    #[test]
    fn functions_open_and_close() {
        let mut tail = ChainTail::default();
        let fid = NodeId::new();
        tail.admit("n", NodeId::new(), &mut assistant(&["t"]))
            .expect("assistant");
        let mut call = function_call("t");
        assert_eq!(tail.admit("n", fid, &mut call), Ok(Admit::OpensFunction));
        assert_eq!(
            tail.pending(),
            vec!["t"],
            "the caller waits for a running function"
        );
        let mut done = function_result("t");
        assert_eq!(
            tail.admit("n", NodeId::new(), &mut done.clone()),
            Ok(Admit::ClosesFunction(fid))
        );
        assert!(tail.admit("n", NodeId::new(), &mut done).is_err());
    }

    #[test]
    fn a_tool_result_leaves_a_running_function_in_the_background() {
        let mut tail = ChainTail::default();
        tail.admit("n", NodeId::new(), &mut assistant(&["t"]))
            .expect("assistant");
        let mut call = function_call("t");
        tail.admit("n", NodeId::new(), &mut call).expect("call");
        assert_eq!(
            tail.admit("n", NodeId::new(), &mut result("t")),
            Ok(Admit::Plain),
            "the launch answers the call; the function stays open"
        );
        assert!(tail.pending().is_empty(), "the caller goes on");
        assert!(tail.admit("n", NodeId::new(), &mut result("t")).is_err());
        let mut done = function_result("t");
        let refused = tail.admit("n", NodeId::new(), &mut done);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument { field, .. }) if field == "n.function_result.call_id"),
            "{refused:?}"
        );
        // A replay of the stored nodes comes to the same state.
        let replayed = ChainTail::replay([
            (NodeId::new(), &assistant(&["t"])),
            (NodeId::new(), &call),
            (NodeId::new(), &result("t")),
        ]);
        assert!(replayed.pending().is_empty());
    }
}
