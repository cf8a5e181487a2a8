//! The Responses codec's tests: requests read and written back, answers assembled; here, the
//! renderings of a request's nodes and the readings of items they share.

mod answers;
mod requests;

use super::*;
use crate::provider::conversation::rendered;
use crate::provider::format::responses_input as input;

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
