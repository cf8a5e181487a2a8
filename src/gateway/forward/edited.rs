//! What a request forwarded as the client sent it, with a step said as the provider's edit,
//! keeps of the previous one: each client entry is itself, unless the edit clears a tool result
//! in it, which the provider then reads as its placeholder (a changed entry, as a step's).

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use serde_json::value::RawValue;

use super::{EntryShape, Kept};
use crate::domain::{NodeContent, Part};
use crate::provider::conversation::Conversation;

/// The client's entries as forwarded with an edit that clears the results of `cleared` (call
/// ids): their shapes, breakpoints and markers, for the ledger.
pub fn kept(conv: &Conversation, client: &[&RawValue], cleared: &HashSet<&str>) -> Kept {
    let mut shape = Vec::with_capacity(client.len());
    let mut items = conv.items.iter().peekable();
    for (e, entry) in client.iter().enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut changed = false;
        while let Some(item) = items.next_if(|i| i.message <= e) {
            identity(&item.content, &mut h);
            if let NodeContent::ToolResult { call_id, .. } = &item.content
                && cleared.contains(call_id.as_str())
            {
                changed = true;
                call_id.hash(&mut h);
            }
        }
        changed.hash(&mut h);
        shape.push(EntryShape {
            id: h.finish(),
            chars: entry.get().len(),
            changed,
            client: true,
        });
    }
    Kept::all_client(conv, shape)
}

/// What a content is to the provider's cache, markers aside: every part, the model's reasoning
/// included (a client that leaves its thinking out sends another prefix).
fn identity(content: &NodeContent, h: &mut impl Hasher) {
    let parts = |parts: &[Part], h: &mut dyn Hasher| {
        for p in parts {
            match p {
                Part::Text(t) => {
                    h.write_u8(1);
                    h.write(t.as_bytes());
                }
                Part::Block(b) => {
                    h.write_u8(2);
                    h.write(b.json.as_bytes());
                }
                Part::Media { mime_type, .. } => {
                    h.write_u8(3);
                    h.write(mime_type.as_bytes());
                    h.write_usize(p.byte_len());
                }
            }
        }
    };
    match content {
        NodeContent::Message {
            role,
            parts: ps,
            tool_calls,
        } => {
            (*role as u8).hash(h);
            parts(ps, h);
            for c in tool_calls {
                c.call_id.hash(h);
                c.name.hash(h);
                c.arguments_json.hash(h);
            }
        }
        NodeContent::ToolResult {
            call_id,
            parts: ps,
            is_error,
            ..
        } => {
            call_id.hash(h);
            is_error.hash(h);
            parts(ps, h);
        }
        other => format!("{other:?}").hash(h),
    }
}
