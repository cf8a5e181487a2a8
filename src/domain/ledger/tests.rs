//! Tests of ledger derivation and its text form, kept apart from the code they test and split
//! by concern; here, the nodes they derive from and the readings of a ledger they share.

mod entries;
mod render;
mod session;
mod tools;
mod traces;

use super::*;
use crate::domain::{Expose, FunctionResult, FunctionStatus, NodeContent, Part, Role, ToolCall};
use crate::tokens::{Tokenizer, Tokens};
use serde_json::Value;
use std::collections::BTreeSet;

use crate::domain::loose_node as node;

fn user(text: &str) -> Node {
    node(NodeContent::Message {
        role: Role::User,
        parts: vec![Part::Text(text.to_owned())],
        tool_calls: Vec::new(),
    })
}

fn call(id: &str, name: &str, args: Value) -> Node {
    call_raw(id, name, &args.to_string())
}

fn call_raw(id: &str, name: &str, arguments_json: &str) -> Node {
    node(NodeContent::Message {
        role: Role::Assistant,
        parts: Vec::new(),
        tool_calls: vec![ToolCall {
            call_id: id.to_owned(),
            name: name.to_owned(),
            arguments_json: arguments_json.to_owned(),
        }],
    })
}

fn result(id: &str, name: &str, text: &str, is_error: bool) -> Node {
    node(NodeContent::ToolResult {
        call_id: id.to_owned(),
        name: name.to_owned(),
        parts: vec![Part::Text(text.to_owned())],
        is_error,
    })
}

fn function_call(id: &str, name: &str, input: &str) -> Node {
    node(NodeContent::FunctionCall {
        call_id: id.to_owned(),
        name: name.to_owned(),
        input: input.to_owned(),
        expose: Expose::Io,
    })
}

fn function_result(id: &str, output: &str, status: FunctionStatus) -> Node {
    node(NodeContent::FunctionResult(FunctionResult {
        call_id: id.to_owned(),
        output: output.to_owned(),
        status,
        chain: None,
    }))
}

fn derive(nodes: &[Node]) -> Ledger {
    Ledger::derive(nodes)
}

fn paths(files: &[FileUse]) -> Vec<&str> {
    files.iter().map(|f| f.path.as_str()).collect()
}

fn commands(ledger: &Ledger) -> Vec<&str> {
    ledger.commands.iter().map(|c| c.command.as_str()).collect()
}

fn use_of<'a>(files: &'a [FileUse], path: &str) -> &'a FileUse {
    files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not in {files:?}"))
}

fn round_trips(ledger: &Ledger, cap: Option<Tokens>) -> bool {
    let text = ledger.render(cap, &Tokenizer::Heuristic);
    let got: BTreeSet<String> = paths_in(&text).into_iter().collect();
    let want: BTreeSet<String> = ledger.paths().into_iter().map(str::to_owned).collect();
    got == want
}
