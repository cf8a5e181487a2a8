//! The pairing rules of provider request documents, checked on rendered JSON.

use std::collections::HashSet;

use serde_json::Value;

/// OpenAI chat completions: an assistant message's `tool_calls` are answered, each once, by the
/// `role: tool` messages right after it; no tool message stands anywhere else.
pub fn check_openai(doc: &Value) -> Result<(), String> {
    let messages = doc.as_array().ok_or("not an array")?;
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        let role = m["role"].as_str().ok_or(format!("[{i}] has no role"))?;
        match role {
            "assistant" => {
                let calls: Vec<&str> = m["tool_calls"]
                    .as_array()
                    .map(|c| c.iter().filter_map(|c| c["id"].as_str()).collect())
                    .unwrap_or_default();
                if m["tool_calls"].is_array() && calls.is_empty() {
                    return Err(format!("[{i}] has an empty tool_calls"));
                }
                if calls.is_empty() && m["content"].is_null() {
                    return Err(format!("[{i}] says nothing"));
                }
                let mut open: HashSet<&str> = calls.iter().copied().collect();
                if open.len() != calls.len() {
                    return Err(format!("[{i}] repeats a call id"));
                }
                let mut j = i + 1;
                while j < messages.len() && messages[j]["role"] == "tool" {
                    let id = messages[j]["tool_call_id"].as_str().unwrap_or_default();
                    if !open.remove(id) {
                        return Err(format!("[{j}] answers {id:?}, not an open call of [{i}]"));
                    }
                    j += 1;
                }
                if !open.is_empty() {
                    return Err(format!("[{i}] calls {open:?} without results"));
                }
                i = j;
            }
            "tool" => return Err(format!("[{i}] is a tool message after no assistant call")),
            "system" | "developer" | "user" => i += 1,
            other => return Err(format!("[{i}] has role {other:?}")),
        }
    }
    Ok(())
}

/// Anthropic Messages: roles alternate from `user`; each `tool_use` is answered by a
/// `tool_result` in the very next (user) message, whose results come first and answer only
/// that assistant message's calls.
pub fn check_anthropic(doc: &Value) -> Result<(), String> {
    if !doc["system"].is_null() && doc["system"].as_str().is_none_or(str::is_empty) {
        return Err("system is present but not a non-empty string".into());
    }
    let messages = doc["messages"]
        .as_array()
        .ok_or("messages is not an array")?;
    let mut expected = "user";
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if role != expected {
            return Err(format!("[{i}] is {role:?}, expected {expected:?}"));
        }
        expected = if role == "user" { "assistant" } else { "user" };
        let blocks = m["content"]
            .as_array()
            .ok_or(format!("[{i}] content is not blocks"))?;
        if blocks.is_empty() {
            return Err(format!("[{i}] is empty"));
        }
        let uses: Vec<&str> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["id"].as_str())
            .collect();
        if role == "user" && !uses.is_empty() {
            return Err(format!("[{i}] is a user message with tool_use"));
        }
        let results: Vec<&str> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .filter_map(|b| b["tool_use_id"].as_str())
            .collect();
        if role == "assistant" && !results.is_empty() {
            return Err(format!("[{i}] is an assistant message with tool_result"));
        }
        // Results lead their message.
        if blocks
            .iter()
            .skip(results.len())
            .any(|b| b["type"] == "tool_result")
        {
            return Err(format!("[{i}] has a tool_result after other blocks"));
        }
        let previous_uses: HashSet<&str> = if i > 0 {
            messages[i - 1]["content"]
                .as_array()
                .map(|b| {
                    b.iter()
                        .filter(|b| b["type"] == "tool_use")
                        .filter_map(|b| b["id"].as_str())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            HashSet::new()
        };
        let answered: HashSet<&str> = results.iter().copied().collect();
        if answered.len() != results.len() {
            return Err(format!("[{i}] answers a call twice"));
        }
        if role == "user" && answered != previous_uses {
            return Err(format!(
                "[{i}] answers {answered:?} but [{}] called {previous_uses:?}",
                i.saturating_sub(1)
            ));
        }
    }
    // An assistant message with tool_use must not end the document unanswered.
    if let Some(last) = messages.last()
        && last["role"] == "assistant"
        && last["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_use"))
    {
        return Err("the last message has unanswered tool_use".into());
    }
    Ok(())
}
