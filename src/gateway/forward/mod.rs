//! The conversation the gateway forwards: the client's own entries, byte for byte, wherever
//! ctxd's render changed nothing of them; ctxd's render where a step did; and the client's cache
//! breakpoints kept on the content they marked, moved back only past what a step changed.
//!
//! Forwarding the client's bytes where nothing changed keeps everything ctxd does not reduce
//! exactly as sent (fields ctxd does not read, a client's bookkeeping on items it resends, key
//! order), so the provider's cache sees the prefix the client would have sent. Which stored node
//! each client entry is comes from walking the rendered path beside the request's items, so a
//! path that holds more than the request (a sub-agent's function call, which the client sends as
//! a tool call and its result) still maps entry to node.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::domain::{Node, NodeContent, NodeId, Part, PathView, ToolCall};
use crate::provider::anthropic::MAX_MARKERS;
use crate::provider::codec::Codec;
use crate::provider::conversation::Conversation;
use crate::provider::format;
use crate::render::{Message, Reduction};

pub mod edited;
mod markers;
pub mod thinking;

use markers::{Entry, Map, Parts, place_markers};

/// What a forwarded conversation kept of the client's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// Client entries forwarded as their own bytes.
    pub verbatim: usize,
    /// Entries of the forwarded conversation.
    pub entries: usize,
    /// Cache breakpoints on messages, as the client sent them and as forwarded.
    pub client_markers: usize,
    pub forwarded_markers: usize,
    /// Client breakpoints moved to an earlier message, because a step changed theirs.
    pub markers_moved: usize,
    /// Each forwarded entry, in order: what it is, for telling whether the next request
    /// forwards the same (see `ledger`).
    pub shape: Vec<EntryShape>,
    /// The forwarded entries that carry a breakpoint.
    pub breakpoints: Vec<usize>,
}

/// One forwarded entry as the ledger compares them: an identity (the nodes it holds and what
/// the render did to them; a client entry forwarded as sent is its nodes), its length, and
/// whether a step changed it or it is the client's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryShape {
    pub id: u64,
    pub chars: usize,
    pub changed: bool,
    pub client: bool,
}

/// The forwarded conversation, entry by entry (the client's own bytes or ctxd's render), and
/// what it kept. The entries are written out once, into the body that carries them
/// ([`super::json::Members::with_entries`]), not gathered into a string first.
pub fn conversation<'a>(
    format: &dyn Codec,
    conv: &Conversation,
    contents: &[&NodeContent],
    client: Option<&[&'a RawValue]>,
    path: &PathView,
    rendered: &mut [Message],
) -> (Vec<Cow<'a, str>>, Kept) {
    // Unchanged messages usually go out as the client's own entries: their documents are built
    // hollow (texts and arguments stood in for), which keeps every structural choice (roles,
    // grouping, pairing) and copies none of their text; a rendered entry that does hold one is
    // then built again, below. The smallest are built whole: standing in for them saves less
    // than a second pass costs.
    let hollow: Vec<bool> = rendered
        .iter()
        .map(|m| !changed(m) && bulk(m) >= HOLLOW_BYTES)
        .collect();
    let (mut docs, sources) = documents(format, rendered, Some(&hollow));
    let unchanged: Vec<bool> = sources
        .iter()
        .map(|s| !s.is_empty() && s.iter().all(|&k| !changed(&rendered[k])))
        .collect();
    let stored = rendered_scope(path);
    let aligned = align(&stored, contents);
    let map = Map::new(conv, &aligned, rendered, &sources, &stored);

    // Output entries in order: a client entry (by index) or a rendered one.
    let mut out: Vec<Entry> = Vec::with_capacity(docs.len());
    let mut j = 0;
    while j < docs.len() {
        if let (Some(client), Some((end, first, last))) = (client, map.group(j, &unchanged))
            && last < client.len()
        {
            out.extend((first..=last).map(Entry::Client));
            j = end + 1;
            continue;
        }
        out.push(Entry::Rendered(j));
        j += 1;
    }
    // The messages whose entries go out rendered: built again, with them whole, when any was
    // built hollow.
    let mut needed = vec![false; rendered.len()];
    for e in &out {
        if let Entry::Rendered(j) = e {
            for &k in &sources[*j] {
                needed[k] = true;
            }
        }
    }
    if needed.iter().zip(&hollow).any(|(n, h)| *n && *h) {
        let hollow: Vec<bool> = needed.iter().map(|n| !n).collect();
        docs = documents(format, rendered, Some(&hollow)).0;
    }

    let mut kept = Kept {
        verbatim: out.iter().filter(|e| matches!(e, Entry::Client(_))).count(),
        entries: out.len(),
        client_markers: conv.markers.len(),
        ..Kept::default()
    };
    let mut values: Vec<Option<Value>> = vec![None; out.len()];
    if format.cache_markers() {
        let parts = Parts {
            conv,
            client,
            out: &out,
            docs: &docs,
            unchanged: &unchanged,
            map: &map,
        };
        place_markers(&parts, &mut values, &mut kept);
    }
    // Nodes by content (their hash), not id: a render made in memory before the request was
    // recorded names the same nodes by other ids.
    let hashes: HashMap<NodeId, crate::domain::Hash> =
        path.nodes.iter().map(|n| (n.id, n.hash)).collect();
    let mut entries: Vec<Cow<'a, str>> = Vec::with_capacity(out.len());
    for (k, entry) in out.iter().enumerate() {
        let text: Cow<'a, str> = match (values[k].take(), entry) {
            (Some(v), _) => Cow::Owned(v.to_string()),
            (None, Entry::Client(i)) => {
                client.map_or(Cow::Borrowed("null"), |c| Cow::Borrowed(c[*i].get()))
            }
            (None, Entry::Rendered(j)) => Cow::Owned(docs[*j].to_string()),
        };
        let (id, changed) = match entry {
            Entry::Client(i) => (
                identity(0, map.client_nodes[*i].iter().flatten(), &[], &hashes),
                false,
            ),
            Entry::Rendered(j) => {
                let messages: Vec<&Message> = sources[*j].iter().map(|&r| &rendered[r]).collect();
                let states: Vec<u64> = messages.iter().map(|m| state(m)).collect();
                (
                    identity(
                        1,
                        messages.iter().flat_map(|m| m.node_ids.iter()),
                        &states,
                        &hashes,
                    ),
                    !unchanged[*j],
                )
            }
        };
        kept.shape.push(EntryShape {
            id,
            chars: text.len(),
            changed,
            client: matches!(entry, Entry::Client(_)),
        });
        entries.push(text);
    }
    (entries, kept)
}

/// The nodes of the scope a path renders (its last node's: the top level, or a function's own
/// chain), oldest first: what the request's items are aligned with.
fn rendered_scope(path: &PathView) -> Vec<&Arc<Node>> {
    let scope = path.nodes.last().and_then(|n| n.function_id);
    path.nodes
        .iter()
        .filter(|n| n.function_id == scope)
        .collect()
}

/// Whether `entries` are the client's own, every one and in order: the client's body is then
/// what goes, as sent.
pub fn all_client_entries(entries: &[Cow<'_, str>], client: Option<&[&RawValue]>) -> bool {
    client.is_some_and(|client| {
        client.len() == entries.len()
            && entries
                .iter()
                .zip(client)
                .all(|(e, c)| matches!(e, Cow::Borrowed(s) if std::ptr::eq(*s, c.get())))
    })
}

/// What forwarding the client's conversation as sent keeps, when that is what [`conversation`]
/// would forward, found without building any document: the render changed nothing and shows
/// the request's items, one message each, in order, each on the stored node aligned with it;
/// every client entry holds an item and every item one entry; and the client's breakpoints fit
/// the provider's limit. `None`: [`conversation`] decides.
pub fn as_sent(
    conv: &Conversation,
    contents: &[&NodeContent],
    client: Option<&[&RawValue]>,
    path: &PathView,
    rendered: &[Message],
) -> Option<Kept> {
    let client = client?;
    if conv.markers.len() > MAX_MARKERS.saturating_sub(conv.fixed_markers)
        || rendered.len() != conv.items.len()
        || contents.len() != conv.items.len()
    {
        return None;
    }
    let mut next = 0;
    for (item, m) in conv.items.iter().zip(rendered) {
        // Items in entry order, no entry skipped, none spanning several.
        if changed(m) || m.node_ids.len() != 1 || item.through != item.message {
            return None;
        }
        match item.message {
            e if e + 1 == next => {}
            e if e == next => next += 1,
            _ => return None,
        }
    }
    if next != client.len() {
        return None;
    }
    let stored = rendered_scope(path);
    let aligned = align(&stored, contents);
    if !aligned.passed.is_empty()
        || aligned
            .nodes
            .iter()
            .zip(rendered)
            .any(|(n, m)| *n != Some(m.node_ids[0]))
    {
        return None;
    }
    let hashes: HashMap<NodeId, crate::domain::Hash> =
        stored.iter().map(|n| (n.id, n.hash)).collect();
    let mut shape = Vec::with_capacity(client.len());
    let mut k = 0;
    for (e, entry) in client.iter().enumerate() {
        let from = k;
        while k < conv.items.len() && conv.items[k].message == e {
            k += 1;
        }
        let nodes = rendered[from..k].iter().map(|m| &m.node_ids[0]);
        shape.push(EntryShape {
            id: identity(0, nodes, &[], &hashes),
            chars: entry.get().len(),
            changed: false,
            client: true,
        });
    }
    Some(Kept::all_client(conv, shape))
}

impl Kept {
    /// What forwarding every client entry as its own bytes keeps: `shape`, one per entry, and
    /// the client's breakpoints where it put them.
    pub fn all_client(conv: &Conversation, shape: Vec<EntryShape>) -> Self {
        let mut breakpoints: Vec<usize> = conv.markers.iter().map(|(i, _)| *i).collect();
        breakpoints.sort_unstable();
        Kept {
            verbatim: shape.len(),
            entries: shape.len(),
            client_markers: conv.markers.len(),
            forwarded_markers: conv.markers.len(),
            markers_moved: 0,
            shape,
            breakpoints,
        }
    }
}

/// The size from which an unchanged message's document is built hollow.
const HOLLOW_BYTES: usize = 1024;

/// The bytes of a message's texts, media and call arguments.
fn bulk(m: &Message) -> usize {
    m.parts.iter().map(Part::byte_len).sum::<usize>()
        + m.tool_calls
            .iter()
            .map(|c| c.arguments_json.len())
            .sum::<usize>()
}

/// The rendered messages as `format`'s entries, and which messages each holds. Messages
/// marked in `hollow` are built with their texts and call arguments stood in for, which changes
/// no entry's shape, only what it says: their bulk is set aside while the document is built and
/// put back after, so no message is copied.
fn documents(
    format: &dyn Codec,
    rendered: &mut [Message],
    hollow: Option<&[bool]>,
) -> (Vec<Value>, Vec<Vec<usize>>) {
    let mut aside: Vec<(usize, Vec<Part>, Vec<ToolCall>)> = Vec::new();
    if let Some(hollow) = hollow {
        for (i, (m, &h)) in rendered.iter_mut().zip(hollow).enumerate() {
            if h {
                let (parts, calls) = hollow_bulk(m, format);
                let parts = std::mem::replace(&mut m.parts, parts);
                let calls = std::mem::replace(&mut m.tool_calls, calls);
                aside.push((i, parts, calls));
            }
        }
    }
    let (docs, sources) = format.document(rendered);
    for (i, parts, calls) in aside {
        rendered[i].parts = parts;
        rendered[i].tool_calls = calls;
    }
    (docs, sources)
}

/// What stands in for `m`'s parts and calls in a hollow document: each non-empty text one
/// character and each call's arguments `{}`, so what decides an entry's shape (roles, which
/// texts are empty, media, calls and their ids) is kept, the bulk not.
fn hollow_bulk(m: &Message, format: &dyn Codec) -> (Vec<Part>, Vec<ToolCall>) {
    use crate::domain::MediaSource;
    let parts = m
        .parts
        .iter()
        .map(|p| match p {
            Part::Text(t) if !t.is_empty() => Part::Text("x".to_owned()),
            Part::Block(block) if format.hollow_block(block) => Part::Text("x".to_owned()),
            Part::Media {
                mime_type,
                source: MediaSource::Data(_),
            } => Part::Media {
                mime_type: mime_type.clone(),
                source: MediaSource::Data(Vec::new()),
            },
            other => other.clone(),
        })
        .collect();
    let calls = m
        .tool_calls
        .iter()
        .map(|c| ToolCall {
            call_id: c.call_id.clone(),
            name: c.name.clone(),
            arguments_json: "{}".to_owned(),
        })
        .collect();
    (parts, calls)
}

/// An entry's identity: its kind, its nodes' content and what the render did to each message.
fn identity<'a>(
    kind: u8,
    nodes: impl Iterator<Item = &'a NodeId>,
    states: &[u64],
    hashes: &HashMap<NodeId, crate::domain::Hash>,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    kind.hash(&mut h);
    for n in nodes {
        match hashes.get(n) {
            Some(content) => content.0.hash(&mut h),
            None => n.hash(&mut h),
        }
    }
    states.hash(&mut h);
    h.finish()
}

/// What the render did to a message, as a number: equal for equal renders of the same nodes.
fn state(m: &Message) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match m.reduction {
        Reduction::None => 0u8.hash(&mut h),
        Reduction::Truncated {
            cut_chars,
            of_chars,
        } => (1u8, cut_chars, of_chars).hash(&mut h),
        Reduction::Cleared => 2u8.hash(&mut h),
    }
    m.stubbed_inputs.hash(&mut h);
    m.summary_id.map(|s| s.to_string()).hash(&mut h);
    Part::text_chars(&m.parts).hash(&mut h);
    h.finish()
}

/// A rendered message that is not what was stored: reduced by a step, or a summary.
fn changed(m: &Message) -> bool {
    m.reduction != Reduction::None || m.stubbed_inputs > 0 || m.summary_id.is_some()
}

/// Which stored node each item of a request is (`None` past where they part), and the stored
/// function calls passed over on the way.
pub struct Aligned {
    pub nodes: Vec<Option<NodeId>>,
    pub passed: HashSet<NodeId>,
}

/// Walks `stored` (one scope of the rendered path, oldest first) beside the request's items,
/// from the newest back, as far as they agree: the path ends where the request does, but may
/// begin elsewhere (a compacted conversation continues after the history its summary covers).
/// A sub-agent's call node is passed over where the result of its function was matched to the
/// client's tool result of the same call and text.
pub fn align(stored: &[&Arc<Node>], items: &[&NodeContent]) -> Aligned {
    let mut nodes = vec![None; items.len()];
    let mut passed = HashSet::new();
    let mut returned: HashSet<&str> = HashSet::new();
    let (mut i, mut j) = (items.len(), stored.len());
    while i > 0 && j > 0 {
        let node = stored[j - 1];
        let same = match &node.content {
            NodeContent::FunctionCall { call_id, .. } => {
                if returned.contains(call_id.as_str()) {
                    passed.insert(node.id);
                    j -= 1;
                    continue;
                }
                false
            }
            NodeContent::FunctionResult(r) => {
                let same = r.answered_by(items[i - 1]);
                if same {
                    returned.insert(r.call_id.as_str());
                }
                same
            }
            content => content.says_same(items[i - 1]),
        };
        if !same {
            break;
        }
        nodes[i - 1] = Some(node.id);
        i -= 1;
        j -= 1;
    }
    Aligned { nodes, passed }
}

/// The client's entries of `field` (`messages` or `input`) among a body's members, each as its
/// bytes, borrowed; `None` when the field is not an array.
pub fn client_entries<'a>(
    members: &super::json::Members<'a>,
    field: &str,
) -> Option<Vec<&'a RawValue>> {
    serde_json::from_str(members.get(field)?.get()).ok()
}

#[cfg(test)]
mod tests;
