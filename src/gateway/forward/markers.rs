//! Where the cache markers go in a forwarded conversation: the client's own markers kept on the
//! entries it sent unchanged, moved to the rendered entry holding the same content otherwise.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    /// The client's entry of this index, as sent.
    Client(usize),
    /// The rendered document's entry of this index.
    Rendered(usize),
}

/// The client's breakpoints on the forwarded entries. A client entry forwarded as sent carries
/// its own; a breakpoint whose entry a step changed moves to the newest unchanged entry before
/// it, never past the provider's limit (the newest kept when there are too many).
pub(super) fn place_markers(parts: &Parts, values: &mut [Option<Value>], kept: &mut Kept) {
    let Parts {
        conv,
        client,
        out,
        docs,
        unchanged,
        map,
    } = *parts;
    let marked: HashMap<usize, &Value> = conv.markers.iter().map(|(i, m)| (*i, m)).collect();
    let is_unchanged = |e: &Entry| match e {
        Entry::Client(_) => true,
        Entry::Rendered(j) => unchanged[*j],
    };
    // Where each output entry ends on the path (its newest node), for moving markers back.
    let ends: Vec<Option<usize>> = out
        .iter()
        .map(|e| match e {
            Entry::Client(i) => map.client_end(*i),
            Entry::Rendered(j) => map.doc_end(*j),
        })
        .collect();
    let mut placed: Vec<(usize, Value)> = Vec::new();
    for (k, e) in out.iter().enumerate() {
        if let Entry::Client(i) = e
            && let Some(m) = marked.get(i)
        {
            placed.push((k, (*m).clone()));
        }
    }
    let verbatim: HashSet<usize> = out
        .iter()
        .filter_map(|e| match e {
            Entry::Client(i) => Some(*i),
            Entry::Rendered(_) => None,
        })
        .collect();
    for (i, marker) in &conv.markers {
        if verbatim.contains(i) {
            continue;
        }
        // The entry now holding this client message's content unchanged at its end (merged
        // after a changed message, say); else the newest unchanged entry before where it
        // stands on the path.
        let holding = map.holding_entry(*i).and_then(|d| {
            out.iter()
                .position(|e| matches!(e, Entry::Rendered(j) if *j == d))
        });
        let target = match (holding, map.client_end(*i)) {
            (Some(k), _) => Some(k),
            (None, Some(end)) => out
                .iter()
                .enumerate()
                .rev()
                .find(|(k, e)| is_unchanged(e) && ends[*k].is_some_and(|x| x <= end))
                .map(|(k, _)| k),
            (None, None) => None,
        };
        let Some(k) = target else { continue };
        if placed.iter().any(|(p, _)| *p == k) {
            continue;
        }
        kept.markers_moved += usize::from(!holds(map, out[k], *i));
        placed.push((k, marker.clone()));
    }
    let room = MAX_MARKERS.saturating_sub(conv.fixed_markers);
    placed.sort_by_key(|(k, _)| *k);
    let skip = placed.len().saturating_sub(room);
    let keep: Vec<(usize, Value)> = placed.into_iter().skip(skip).collect();
    kept.forwarded_markers = keep.len();
    kept.breakpoints = keep.iter().map(|(k, _)| *k).collect();
    // Client entries that lose their marker (over the limit) or gain one are written anew.
    for (k, e) in out.iter().enumerate() {
        let want = keep.iter().find(|(p, _)| *p == k).map(|(_, m)| m);
        let has = match e {
            Entry::Client(i) => marked.contains_key(i),
            Entry::Rendered(_) => false,
        };
        match (e, want) {
            (Entry::Client(_), Some(_)) if has => {}
            (Entry::Client(_), None) if !has => {}
            (Entry::Client(i), want) => {
                let parsed = client.and_then(|c| serde_json::from_str::<Value>(c[*i].get()).ok());
                let Some(Value::Object(mut entry)) = parsed else {
                    continue;
                };
                format::strip_markers(&mut entry);
                if let Some(m) = want {
                    format::mark_last_block(&mut entry, m.clone());
                }
                values[k] = Some(Value::Object(entry));
            }
            (Entry::Rendered(j), Some(m)) => {
                let mut entry = docs[*j].clone();
                if let Value::Object(map) = &mut entry {
                    format::mark_last_block(map, m.clone());
                }
                values[k] = Some(entry);
            }
            (Entry::Rendered(_), None) => {}
        }
    }
}

/// What marker placement reads.
pub(super) struct Parts<'a> {
    pub(super) conv: &'a Conversation,
    pub(super) client: Option<&'a [&'a RawValue]>,
    pub(super) out: &'a [Entry],
    pub(super) docs: &'a [Value],
    pub(super) unchanged: &'a [bool],
    pub(super) map: &'a Map,
}

/// Whether output entry `e` holds client message `i`'s content.
pub(super) fn holds(map: &Map, e: Entry, i: usize) -> bool {
    match e {
        Entry::Client(c) => c == i,
        Entry::Rendered(j) => map.doc_entries(j).contains(&i),
    }
}

/// Which rendered entries and client entries hold which nodes.
pub(super) struct Map {
    /// Per client entry: its items' nodes (`None`: an item not on the path).
    pub(super) client_nodes: Vec<Option<Vec<NodeId>>>,
    /// Per rendered entry: its nodes, less the function calls the client has no entry for.
    pub(super) doc_nodes: Vec<Vec<NodeId>>,
    /// Client entry and rendered entry of each node.
    pub(super) client_of: HashMap<NodeId, usize>,
    pub(super) doc_of: HashMap<NodeId, usize>,
    /// Position of each node on the path.
    pub(super) position: HashMap<NodeId, usize>,
    /// Nodes of rendered messages a step changed.
    pub(super) changed: HashSet<NodeId>,
    /// Per rendered entry: the nodes of its last rendered message (where its last block is).
    pub(super) tails: Vec<Vec<NodeId>>,
}

impl Map {
    pub(super) fn new(
        conv: &Conversation,
        aligned: &Aligned,
        rendered: &[Message],
        sources: &[Vec<usize>],
        stored: &[&Arc<Node>],
    ) -> Self {
        let entries = conv.items.iter().map(|i| i.message + 1).max().unwrap_or(0);
        let mut client_nodes: Vec<Option<Vec<NodeId>>> = vec![Some(Vec::new()); entries];
        let mut client_of = HashMap::new();
        let entries = conv
            .items
            .iter()
            .map(|i| i.through + 1)
            .max()
            .unwrap_or(0)
            .max(entries);
        client_nodes.resize(entries, Some(Vec::new()));
        for (item, node) in conv.items.iter().zip(&aligned.nodes) {
            // A node made of several entries (a Responses run) is held by each of them.
            let span = item.message..=item.through.max(item.message);
            for (e, held) in client_nodes
                .iter_mut()
                .enumerate()
                .take(*span.end() + 1)
                .skip(*span.start())
            {
                match (node, held.as_mut()) {
                    (Some(n), Some(nodes)) => {
                        nodes.push(*n);
                        client_of.entry(*n).or_insert(e);
                    }
                    _ => *held = None,
                }
            }
        }
        // An entry with no items (nothing ctxd records) is never forwarded as itself.
        for nodes in &mut client_nodes {
            if nodes.as_ref().is_some_and(Vec::is_empty) {
                *nodes = None;
            }
        }
        let mut doc_of = HashMap::new();
        let doc_nodes: Vec<Vec<NodeId>> = sources
            .iter()
            .enumerate()
            .map(|(j, s)| {
                let nodes: Vec<NodeId> = s
                    .iter()
                    .flat_map(|&k| rendered[k].node_ids.iter().copied())
                    .filter(|n| !aligned.passed.contains(n))
                    .collect();
                for n in &nodes {
                    doc_of.entry(*n).or_insert(j);
                }
                nodes
            })
            .collect();
        let position = stored.iter().enumerate().map(|(p, n)| (n.id, p)).collect();
        let changed = rendered
            .iter()
            .filter(|m| changed(m))
            .flat_map(|m| m.node_ids.iter().copied())
            .collect();
        let tails = sources
            .iter()
            .map(|s| {
                s.last()
                    .map_or_else(Vec::new, |&k| rendered[k].node_ids.clone())
            })
            .collect();
        Self {
            changed,
            tails,
            client_nodes,
            doc_nodes,
            client_of,
            doc_of,
            position,
        }
    }

    /// The client entries rendered entry `j` holds.
    pub(super) fn doc_entries(&self, j: usize) -> Vec<usize> {
        let mut out: Vec<usize> = self.doc_nodes[j]
            .iter()
            .filter_map(|n| self.client_of.get(n).copied())
            .collect();
        out.dedup();
        out
    }

    /// The rendered entry that ends with client entry `i`'s content, unchanged.
    pub(super) fn holding_entry(&self, i: usize) -> Option<usize> {
        let nodes = self.client_nodes.get(i)?.as_ref()?;
        let last = nodes.last()?;
        let d = *self.doc_of.get(last)?;
        (self.tails[d].contains(last) && nodes.iter().all(|n| !self.changed.contains(n)))
            .then_some(d)
    }

    /// Where client entry `i` ends on the path.
    pub(super) fn client_end(&self, i: usize) -> Option<usize> {
        let nodes = self.client_nodes.get(i)?.as_ref()?;
        nodes
            .iter()
            .filter_map(|n| self.position.get(n))
            .max()
            .copied()
    }

    /// Where rendered entry `j` ends on the path.
    pub(super) fn doc_end(&self, j: usize) -> Option<usize> {
        self.doc_nodes[j]
            .iter()
            .filter_map(|n| self.position.get(n))
            .max()
            .copied()
    }

    /// The run of rendered entries from `j` that holds exactly a run of whole client entries,
    /// all unchanged: (last rendered entry, first and last client entry).
    pub(super) fn group(&self, j: usize, unchanged: &[bool]) -> Option<(usize, usize, usize)> {
        let entries_of = |d: usize| -> Option<Vec<usize>> {
            let nodes = &self.doc_nodes[d];
            if nodes.is_empty() || !unchanged[d] {
                return None;
            }
            nodes
                .iter()
                .map(|n| self.client_of.get(n).copied())
                .collect()
        };
        let first = entries_of(j)?;
        let (mut lo, mut hi) = (*first.iter().min()?, *first.iter().max()?);
        let mut end = j;
        loop {
            // Every client entry of the run must be whole, and held by rendered entries from
            // `j` on.
            let mut new_end = end;
            for i in lo..=hi {
                for n in self.client_nodes.get(i)?.as_ref()? {
                    let d = *self.doc_of.get(n)?;
                    if d < j {
                        return None;
                    }
                    new_end = new_end.max(d);
                }
            }
            let (mut new_lo, mut new_hi) = (lo, hi);
            for d in end + 1..=new_end {
                let es = entries_of(d)?;
                new_lo = new_lo.min(*es.iter().min()?);
                new_hi = new_hi.max(*es.iter().max()?);
            }
            if (new_end, new_lo, new_hi) == (end, lo, hi) {
                break;
            }
            (end, lo, hi) = (new_end, new_lo, new_hi);
        }
        Some((end, lo, hi))
    }
}
