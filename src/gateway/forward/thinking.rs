//! The reasoning-dropping policy (`--gateway-reasoning drop`): ctxd's render goes upstream, and
//! every thinking block whose prefix differs from what was forwarded when it was produced is
//! left out, exactly those, so the provider never refuses the request. A block is produced on
//! the conversation's previous forwarded request: it stays valid while every entry before it is
//! what was forwarded then; once left out, it is left out on every later call, so what follows
//! it stays as it was forwarded too.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};

use super::Kept;
use crate::provider::anthropic::edits;

/// Leaves out of `entries` (the forwarded messages, as `kept` describes them) the thinking that
/// what precedes it no longer vouches for, against `sent`: the identities of the entries the
/// conversation's previous request forwarded (none known: every entry a step changed breaks
/// the prefix). The thinking blocks left out, and the identities of the entries as forwarded
/// now, for the next call.
pub fn drop_invalidated(
    entries: &mut [Cow<'_, str>],
    kept: &mut Kept,
    sent: &[u64],
) -> (u32, Vec<u64>) {
    let mut intact = true;
    let mut dropped = 0;
    let mut now = Vec::with_capacity(entries.len());
    for (j, entry) in entries.iter_mut().enumerate() {
        let Some(shape) = kept.shape.get_mut(j) else {
            break;
        };
        let mut left_out = false;
        if edits::holds_reasoning(entry) {
            // Produced on the previous request (the answer after it), or forwarded then with
            // its thinking, after the same prefix.
            let vouched = intact && sent.get(j).is_none_or(|&s| s == identity(shape.id, false));
            if !vouched && let Some((without, n)) = edits::without_reasoning(entry) {
                *entry = Cow::Owned(without);
                dropped += n;
                left_out = true;
                shape.changed = true;
                shape.client = false;
                shape.chars = entry.len();
            }
        }
        let id = identity(shape.id, left_out);
        match sent.get(j) {
            Some(&s) => intact &= s == id,
            None => intact &= !shape.changed,
        }
        shape.id = id;
        now.push(id);
    }
    (dropped, now)
}

/// An entry's identity with whether its thinking was left out.
fn identity(id: u64, left_out: bool) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    left_out.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::forward::EntryShape;

    fn shape(id: u64, changed: bool) -> EntryShape {
        EntryShape {
            id,
            chars: 0,
            changed,
            client: !changed,
        }
    }

    const THOUGHT: &str = r#"{"role":"assistant","content":[{"type":"thinking","thinking":"","signature":"s"},{"type":"text","text":"ok"}]}"#;
    const USER: &str = r#"{"role":"user","content":"go on"}"#;

    fn kept(shapes: Vec<EntryShape>) -> Kept {
        Kept {
            shape: shapes,
            ..Kept::default()
        }
    }

    #[test]
    fn thinking_after_a_change_is_left_out_then_and_after() {
        // First call: nothing known, nothing changed: every block stays.
        let mut entries: Vec<Cow<str>> = vec![USER.into(), THOUGHT.into(), USER.into()];
        let mut k = kept(vec![shape(1, false), shape(2, false), shape(3, false)]);
        let (dropped, sent) = drop_invalidated(&mut entries, &mut k, &[]);
        assert_eq!(dropped, 0);
        // A step changes entry 0: the block after it goes.
        let mut entries: Vec<Cow<str>> =
            vec![USER.into(), THOUGHT.into(), USER.into(), THOUGHT.into()];
        let mut k = kept(vec![
            shape(9, true),
            shape(2, false),
            shape(3, false),
            shape(4, false),
        ]);
        let (dropped, sent) = drop_invalidated(&mut entries, &mut k, &sent);
        assert_eq!(dropped, 2, "both blocks after the change");
        assert!(!edits::holds_reasoning(&entries[1]));
        // The next call: the same step, a new answer after what was forwarded: the left-out
        // blocks stay out, the new one was produced on that very prefix and stays.
        let mut entries: Vec<Cow<str>> = vec![
            USER.into(),
            THOUGHT.into(),
            USER.into(),
            THOUGHT.into(),
            USER.into(),
            THOUGHT.into(),
        ];
        let mut k = kept(vec![
            shape(9, true),
            shape(2, false),
            shape(3, false),
            shape(4, false),
            shape(5, false),
            shape(6, false),
        ]);
        let (dropped, _) = drop_invalidated(&mut entries, &mut k, &sent);
        assert_eq!(dropped, 2, "the two left out before, not the new one");
        assert!(edits::holds_reasoning(&entries[5]));
    }
}
