//! Each conversation's previous request, remembered in this process (bounded): a request that
//! resends it is read from what changed, its unchanged entries recognised by their bytes and
//! not parsed again. What it reads is what reading it whole gives (debug builds check each
//! one), so a request another replica served, or the first after a restart, is only slower.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;

use super::Api;
use super::json::Members;
use crate::domain::{Hash, Tenant};
use crate::provider::conversation::Conversation;
use crate::workflow::record::Known;

/// Conversations remembered at most, and the bytes their bodies and readings may hold.
const REMEMBERED: usize = 1024;
const REMEMBERED_BYTES: usize = 256 << 20;
/// A body larger than this is not remembered: it would hold twice its size for one request.
const LARGEST: usize = 32 << 20;
/// Conversations whose requests share a key (a tenant's conversations that name no session, an
/// agent and its sub-agents) keep this many requests under it; a request resends the one whose
/// first [`PROBE`] bytes it shares most of.
const CANDIDATES: usize = 8;
const PROBE: usize = 64 << 10;

/// Whose request: its caller, its format and path, and the session it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    tenant: Tenant,
    api: &'static str,
    path: String,
    named: Option<String>,
}

impl Key {
    pub(super) fn new(tenant: &Tenant, api: Api, path: &str, named: Option<&str>) -> Self {
        Key {
            tenant: tenant.clone(),
            api: api.name(),
            path: path.to_owned(),
            named: named.map(str::to_owned),
        }
    }
}

/// A request as read: its bytes, its headers, where its conversation's entries lie, and what
/// it read as.
pub(super) struct Previous {
    body: Bytes,
    headers: Vec<(String, String)>,
    /// The conversation's array, `[` through `]`, and each entry in it.
    array: Range<usize>,
    entries: Vec<Range<usize>>,
    conv: Conversation,
    /// Its items' chain hashes, once its call has located it.
    hashes: OnceLock<Arc<[Hash]>>,
}

impl Previous {
    /// Keeps its items' chain hashes, found when its call located it.
    pub(super) fn located(&self, hashes: Arc<[Hash]>) {
        if hashes.len() == self.conv.items.len() {
            let _ = self.hashes.set(hashes);
        }
    }

    /// `body` as read into `conv`; `None` where its conversation's entries cannot be found.
    pub(super) fn of(
        api: Api,
        body: Bytes,
        headers: Vec<(String, String)>,
        conv: &Conversation,
    ) -> Option<Self> {
        if body.len() > LARGEST {
            return None;
        }
        let (array, entries) = {
            let members = Members::of(&body)?;
            let array = members.only(api.field())?;
            let entries: Vec<&RawValue> = serde_json::from_str(array.get()).ok()?;
            let at = |raw: &str| raw.as_ptr() as usize - body.as_ptr() as usize;
            let start = at(array.get());
            (
                start..start + array.get().len(),
                entries
                    .iter()
                    .map(|e| at(e.get())..at(e.get()) + e.get().len())
                    .collect(),
            )
        };
        Some(Previous {
            body,
            headers,
            array,
            entries,
            conv: conv.clone(),
            hashes: OnceLock::new(),
        })
    }

    /// What it holds, about: its body, and its reading as large again.
    fn bytes(&self) -> usize {
        self.body.len() * 2
    }
}

/// The request's headers as compared: all but its length.
pub(super) fn compared_headers(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| *name != "content-length")
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

/// `body`, a request resending `previous` (same headers, every other member byte-identical,
/// the conversation's first entries too), read from its other entries by `api`: the reading,
/// the request as the next one is compared with, and what is known of its first items (when
/// `previous`'s call located it). `None`: read it whole.
pub(super) fn resent(
    api: Api,
    previous: &Previous,
    body: &Bytes,
    headers: Vec<(String, String)>,
) -> Option<(Conversation, Previous, Option<Known>)> {
    if headers != previous.headers || body.len() > LARGEST {
        return None;
    }
    let same = common_prefix(body, &previous.body);
    // Every member before the conversation's is unchanged, and its `[`.
    if previous.array.start >= same {
        return None;
    }
    let from = previous
        .entries
        .iter()
        .take_while(|e| e.end <= same)
        .count();
    let mut at = match from {
        0 => previous.array.start + 1,
        k => previous.entries[k - 1].end,
    };
    let mut entries = previous.entries[..from].to_vec();
    let mut tail: Vec<Value> = Vec::new();
    loop {
        at = after_space(body, at);
        match body.get(at) {
            Some(b']') => {
                at += 1;
                break;
            }
            Some(b',') if !entries.is_empty() => at = after_space(body, at + 1),
            Some(_) if entries.is_empty() => {}
            _ => return None,
        }
        let mut values = serde_json::Deserializer::from_slice(&body[at..]).into_iter::<Value>();
        let value = values.next()?.ok()?;
        let end = at + values.byte_offset();
        entries.push(at..end);
        tail.push(value);
        at = end;
    }
    // Every member after the conversation's is unchanged.
    if body[at..] != previous.body[previous.array.end..] {
        return None;
    }
    let conv = api.read_resent()?(&previous.conv, from, tail)?.ok()?;
    // The items of the unchanged entries are the previous request's, first and in order.
    let kept = previous
        .conv
        .items
        .iter()
        .take_while(|i| i.through < from)
        .count();
    let known = previous.hashes.get().map(|hashes| Known {
        items: kept,
        hashes: hashes.clone(),
    });
    let next = Previous {
        body: body.clone(),
        headers,
        array: previous.array.start..at,
        entries,
        conv: conv.clone(),
        hashes: OnceLock::new(),
    };
    Some((conv, next, known))
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    // Compared in blocks, so the bulk is one `memcmp` each.
    const BLOCK: usize = 4096;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + BLOCK <= n && a[i..i + BLOCK] == b[i..i + BLOCK] {
        i += BLOCK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

fn after_space(body: &[u8], mut at: usize) -> usize {
    while body
        .get(at)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        at += 1;
    }
    at
}

/// The previous request of each conversation, the least recently used forgotten first.
#[derive(Default)]
pub(super) struct Resends(Mutex<Slots>);

/// The requests remembered under each key, each with when it was last used.
#[derive(Default)]
struct Slots {
    map: HashMap<Key, Vec<(u64, Arc<Previous>)>>,
    tick: u64,
}

impl Slots {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Whether it holds more requests, or more bytes, than it may.
    fn over(&self) -> bool {
        let all = self.map.values().flatten();
        all.clone().count() > REMEMBERED
            || all.map(|(_, p)| p.bytes()).sum::<usize>() > REMEMBERED_BYTES
    }

    /// Forgets the least recently used request under `key`, or under any key.
    fn forget_oldest(&mut self, key: Option<&Key>) {
        let oldest = self
            .map
            .iter()
            .filter(|(k, _)| key.is_none_or(|key| key == *k))
            .flat_map(|(k, slot)| {
                slot.iter()
                    .enumerate()
                    .map(move |(i, (used, _))| (*used, k, i))
            })
            .min_by_key(|(used, _, _)| *used)
            .map(|(_, k, i)| (k.clone(), i));
        if let Some((k, i)) = oldest
            && let Some(slot) = self.map.get_mut(&k)
        {
            slot.swap_remove(i);
            if slot.is_empty() {
                self.map.remove(&k);
            }
        }
    }
}

impl Resends {
    /// The request under `key` that `body` most likely resends.
    pub(super) fn get(&self, key: &Key, body: &[u8]) -> Option<Arc<Previous>> {
        let mut r = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tick = r.next_tick();
        let probe = &body[..body.len().min(PROBE)];
        let (used, previous) = r
            .map
            .get_mut(key)?
            .iter_mut()
            .max_by_key(|(used, p)| (common_prefix(probe, &p.body), *used))?;
        *used = tick;
        Some(previous.clone())
    }

    /// Remembers `previous` under `key`, in place of `replaced` (the request it was read from).
    pub(super) fn remember(
        &self,
        key: Key,
        previous: Previous,
        replaced: Option<&Arc<Previous>>,
    ) -> Arc<Previous> {
        let previous = Arc::new(previous);
        let mut r = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tick = r.next_tick();
        let slot = r.map.entry(key.clone()).or_default();
        if let Some(old) = replaced {
            slot.retain(|(_, p)| !Arc::ptr_eq(p, old));
        }
        slot.push((tick, previous.clone()));
        if slot.len() > CANDIDATES {
            r.forget_oldest(Some(&key));
        }
        while r.over() {
            r.forget_oldest(None);
        }
        previous
    }
}

#[cfg(test)]
mod tests;
