//! Observations: a harness's command output sent back as a user message (mini-swe-agent,
//! OpenHands without function calling, SWE-agent's thought and action), which the budget steps
//! treat as the tool output it is: cleared at a step once read, recallable as a result is.

use super::{Message, MessageRole};
use crate::domain::Part;

/// How the harnesses that answer an action in a user message begin that answer.
const PREFIXES: [&str; 3] = [
    // mini-swe-agent
    "<returncode>",
    // OpenHands' CodeAct agent without function calling
    "OBSERVATION:",
    "EXECUTION RESULT of [",
];

/// Marks each user message that answers the action of the assistant message right before it:
/// one with no tool calls (the action is in its text) and an answer shaped as its harness
/// shapes one.
pub(super) fn mark(messages: &mut [Message]) {
    for i in 1..messages.len() {
        let (before, rest) = messages.split_at_mut(i);
        let (action, answer) = (&before[i - 1], &mut rest[0]);
        answer.observation = answer.role == MessageRole::User
            && answer.summary_id.is_none()
            && answer.pinned_under.is_none()
            && action.role == MessageRole::Assistant
            && action.summary_id.is_none()
            && action.tool_calls.is_empty()
            && is_observation(&Part::text_of(&answer.parts), &Part::text_of(&action.parts));
    }
}

/// Whether `text`, answering `action`, is a command's output.
fn is_observation(text: &str, action: &str) -> bool {
    let text = text.trim_start();
    PREFIXES.iter().any(|p| text.starts_with(p))
        // SWE-agent: the action is a fenced command, the answer ends with its prompt's state.
        || (action.contains("```") && text.contains("(Current directory:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_to_an_action_in_text_is_an_observation() {
        use MessageRole::{Assistant, User};
        // User and assistant in turn, each answer after the action before it.
        let conversation = [
            (User, "<returncode>0</returncode> as the task"),
            (Assistant, "THOUGHT: list\n\n```bash\nls\n```"),
            (User, "<returncode>0</returncode>\n<output>a b</output>"),
            (Assistant, "I'll look."),
            (User, "Thanks, now fix it."),
            (Assistant, "```\nopen x.py\n```"),
            (
                User,
                "[File: x.py]\n(Open file: x.py)\n(Current directory: /r)",
            ),
            (Assistant, "Running it."),
            (User, "OBSERVATION:\nok"),
        ];
        let mut messages: Vec<Message> = conversation
            .iter()
            .map(|(role, text)| Message::new(*role, vec![Part::Text((*text).to_owned())]))
            .collect();
        mark(&mut messages);
        let marked: Vec<bool> = messages.iter().map(|m| m.observation).collect();
        assert_eq!(
            marked,
            [false, false, true, false, false, false, true, false, true]
        );
    }
}
