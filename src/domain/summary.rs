//! Summaries laid over a prefix of a branch's history, and the audit trail of compactions.

use std::sync::Arc;

use super::{Ledger, NodeId};

/// What range a summary was made over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SummaryKind {
    /// Everything older than the retained turns.
    #[default]
    Rolling,
    /// A segment the caller chose, between two nodes of the path.
    Segment,
}

impl SummaryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SummaryKind::Rolling => "rolling",
            SummaryKind::Segment => "segment",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "rolling" => SummaryKind::Rolling,
            "segment" => SummaryKind::Segment,
            _ => return None,
        })
    }
}

/// A stored summary: the exact nodes it replaces, rolling over the summaries it incorporates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub id: SummaryId,
    pub compaction_id: CompactionId,
    pub kind: SummaryKind,
    /// Every node the summary replaces, those of the summaries it rolls over included.
    pub covers: Vec<NodeId>,
    /// The first and last node of its range on the path it was made on.
    pub range: Option<(NodeId, NodeId)>,
    pub text: String,
    /// The summaries it incorporates (text and ledger), in render order.
    pub rolls_over: Vec<SummaryId>,
    /// What the covered nodes did; `None` on summaries made before ledgers, and imported ones.
    pub ledger: Option<Arc<Ledger>>,
    pub model: String,
    pub base_head: NodeId,
    pub tokens_before: u32,
    pub tokens_after: u32,
    pub created_at_ms: i64,
}

/// A summary whose `model` starts so was written by the session's own agent (its compaction,
/// recorded by the gateway): it renders as the agent wrote it, since the model is to read
/// exactly what its agent gave it.
pub const AGENT_MODEL_PREFIX: &str = "agent:";

/// An agent's summary whose words stay in the agent's own window after it (Codex's
/// `compaction` item, which the provider reads): the overlay only hides what it replaced.
pub const AGENT_WINDOW_MODEL_PREFIX: &str = "agent:window:";

impl Summary {
    /// Written by the session's own agent, not by a summarizer ctxd asked.
    pub fn by_agent(&self) -> bool {
        self.model.starts_with(AGENT_MODEL_PREFIX)
    }

    /// Renders as no message: the agent's window after it carries the summary.
    pub fn renders_nothing(&self) -> bool {
        self.model.starts_with(AGENT_WINDOW_MODEL_PREFIX)
    }
}

pub use super::ids::{CompactionId, SummaryId};

/// Why a compaction ended as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Applied,
    /// The text was empty or whitespace.
    Empty,
    /// The summary did not make the context strictly smaller.
    NoGain,
    /// A covered node left the branch's path, or the prior summary changed.
    Stale,
    Cancelled,
    /// The summarizer failed (provider error, deadline, bound exhausted).
    Failed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Applied => "applied",
            Reason::Empty => "empty",
            Reason::NoGain => "no_gain",
            Reason::Stale => "stale",
            Reason::Cancelled => "cancelled",
            Reason::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "applied" => Reason::Applied,
            "empty" => Reason::Empty,
            "no_gain" => Reason::NoGain,
            "stale" => Reason::Stale,
            "cancelled" => Reason::Cancelled,
            "failed" => Reason::Failed,
            _ => return None,
        })
    }
}

/// What happened in a compaction's life, for the audit trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Prepared,
    Committed,
    Rejected,
    Cancelled,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Prepared => "prepared",
            EventKind::Committed => "committed",
            EventKind::Rejected => "rejected",
            EventKind::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "prepared" => EventKind::Prepared,
            "committed" => EventKind::Committed,
            "rejected" => EventKind::Rejected,
            "cancelled" => EventKind::Cancelled,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionEvent {
    pub compaction_id: CompactionId,
    pub branch: String,
    pub kind: EventKind,
    pub reason: Option<Reason>,
    pub base_head: Option<NodeId>,
    pub tokens_before: u32,
    pub tokens_after: u32,
    pub summary_id: Option<SummaryId>,
    pub message: String,
    pub created_at_ms: i64,
}
