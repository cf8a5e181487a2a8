//! Capping, clearing and stubbing: what a step does to one tool result, call or assistant text,
//! each kept only when it costs fewer tokens.

use super::{Fit, Keep, cleared_placeholder, truncated};
use crate::domain::Part;
use crate::render::stub::stub_arguments;
use crate::render::{MessageRole, Reduction, message_breakdown};

impl Fit<'_> {
    /// Puts `parts`, reduced as `reduction`, in message `i` when that costs fewer tokens: no
    /// step ever grows the context (a marker costs some).
    pub(super) fn reduce(&mut self, i: usize, parts: Vec<Part>, reduction: Reduction) {
        let message = &mut self.messages[i];
        let was = std::mem::replace(&mut message.parts, parts);
        let was_reduced = std::mem::replace(&mut message.reduction, reduction);
        let reduced = message_breakdown(message, self.counter);
        if reduced.total() < self.counts[i].total() {
            self.counts[i] = reduced;
        } else {
            message.parts = was;
            message.reduction = was_reduced;
        }
    }

    /// Result `k` is hidden by a summary, pinned, or not yet read by the model: no step
    /// changes it. What the model has not read, when it alone exceeds the history's budget, is
    /// the exception: it could never be sent whole, so it may be cut (never cleared).
    pub(super) fn untouchable(&self, k: usize) -> bool {
        let m = &self.messages[self.results[k]];
        self.hidden[k].is_some() || m.pinned || (m.unseen && !self.unseen_over)
    }

    /// Cuts result `k` to `cap` characters of what it was.
    pub(super) fn cap(&mut self, k: usize, cap: usize) {
        let i = self.results[k];
        if self.untouchable(k) || self.messages[i].reduction == Reduction::Cleared {
            return;
        }
        if let Some((parts, reduction)) = truncated(&self.messages[i], cap, Keep::HeadAndTail) {
            self.reduce(i, parts, reduction);
        }
    }

    /// Cuts the text of assistant message `i` to `cap` characters as `keep` says; a pinned one
    /// never.
    pub(super) fn cut_text(&mut self, i: usize, cap: usize, keep: Keep) {
        let message = &self.messages[i];
        if message.role != MessageRole::Assistant
            || message.pinned
            || message.unseen
            || message.pinned_under.is_some()
            || cap == usize::MAX
        {
            return;
        }
        if let Some((parts, reduction)) = truncated(message, cap, keep) {
            let before = self.counts[i].assistant_text;
            self.reduce(i, parts, reduction);
            self.text_saved[i] = before.saturating_sub(self.counts[i].assistant_text);
        }
    }

    /// Clears result `k`, unless it is shorter than its placeholder.
    pub(super) fn clear(&mut self, k: usize) {
        let i = self.results[k];
        if self.untouchable(k)
            || self.messages[i].unseen
            || self.messages[i].reduction == Reduction::Cleared
        {
            return;
        }
        let placeholder = vec![Part::Text(cleared_placeholder(&self.messages[i]))];
        self.reduce(i, placeholder, Reduction::Cleared);
    }

    /// Clears result `k` as the provider's edit does, whatever its size, unless a summary hides
    /// it, it is pinned (the edit then stops before it) or the model has not read it. One no
    /// longer than the provider's placeholder keeps its words here: the provider's placeholder
    /// reads about as long, and a render never grows the context.
    pub(super) fn clear_whole(&mut self, k: usize) {
        let i = self.results[k];
        let m = &self.messages[i];
        if self.hidden[k].is_some() || m.unseen || m.pinned || m.reduction == Reduction::Cleared {
            return;
        }
        let placeholder = vec![Part::Text(cleared_placeholder(m))];
        self.reduce(i, placeholder, Reduction::Cleared);
        if self.messages[i].reduction != Reduction::Cleared {
            self.messages[i].reduction = Reduction::Cleared;
            self.counts[i] = message_breakdown(&self.messages[i], self.counter);
        }
    }

    /// Stubs the arguments of result `k`'s call when they are longer than `over` characters
    /// and the stub costs fewer tokens.
    pub(super) fn stub(&mut self, k: usize, over: usize) {
        let Some((at, c)) = self.calls[k] else {
            return;
        };
        if self.messages[at].pinned || self.messages[at].unseen {
            return;
        }
        let args = &self.messages[at].tool_calls[c].arguments_json;
        let chars = args.chars().count();
        if chars <= over {
            return;
        }
        let reference = self.messages[at].recall.map(|h| h.reference());
        let Some(stub) = stub_arguments(args, reference.as_deref()) else {
            return;
        };
        let (before, after) = (self.counter.count(args), self.counter.count(&stub));
        if after >= before {
            return;
        }
        self.stub_chars[at] += chars - stub.chars().count();
        let message = &mut self.messages[at];
        message.tool_calls[c].arguments_json = stub;
        message.stubbed_inputs += 1;
        // A call's arguments count on their own (message_breakdown): the rest of the message
        // stands, and recounting it for every stub of a message would count it again and again.
        self.counts[at].tool_calls -= before - after;
    }

    /// The message from which result `k` (or its call) sits: what a step at `k` may change.
    pub(super) fn first_message_of(&self, k: usize) -> usize {
        match self.calls.get(k) {
            Some(Some((at, _))) => *at,
            Some(None) => self.results[k],
            None => self.messages.len(),
        }
    }
}
