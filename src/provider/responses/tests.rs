//! The Responses codec's tests: requests read and written back, answers assembled; here, the
//! renderings of a request's nodes and the readings of items they share.

mod answers;
mod requests;

use std::sync::Arc;

use super::*;
use crate::domain::{Node, NodeId, PathView, node_hash};
use crate::provider::format::responses_input as input;
use crate::render::Message;
use crate::render::{Callers, visible};

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

/// The request's nodes written back as the `input` a path of them renders.
fn input_of(conv: &Conversation) -> Value {
    input(&rendered(conv))
}

fn round_trip(body: &Value) -> (Conversation, Value) {
    let conv = read(body).unwrap();
    let written = input_of(&conv);
    (conv, written)
}
