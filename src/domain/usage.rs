//! What the model gateway forwarded for a session, and what the provider reported using.

/// One model call the gateway forwarded: the tokens the client sent and the tokens that went
/// upstream (both by ctxd's heuristic count), and the provider's own usage report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayCall {
    pub at_ms: i64,
    /// `anthropic`, `openai` (chat completions) or `responses`.
    pub api: String,
    pub model: String,
    pub client_tokens: u64,
    pub forwarded_tokens: u64,
    pub usage: ProviderUsage,
    /// Tokens of the forwarded request identical to the previous forwarded request of the same
    /// session (and function) up to that request's last cache breakpoint: what the provider
    /// could read from its cache.
    pub kept_tokens: u64,
    /// Why the forwarded prefix differs from the previous forwarded request's, up to its last
    /// breakpoint; `None` when it is the same (or for the first call).
    pub change: Option<PrefixChange>,
    /// The model table's entry that priced the call (its name; `*` marks an operator's).
    pub priced_by: String,
    /// The edit ctxd asked the provider to make in place of a step: tool uses to clear, and to
    /// keep; `None` when it asked for none.
    pub asked: Option<AskedEdit>,
    /// Thinking blocks ctxd left out of the forwarded request itself, as no longer bound to
    /// what precedes them (the reasoning-dropping policy).
    pub thinking_dropped: u32,
}

/// An edit ctxd asked the provider to make: clear the oldest `clear` tool uses, keep `keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskedEdit {
    pub clear: u32,
    pub keep: u32,
}

/// A cache read this far below `kept_tokens` is still explained: the provider's tokens are not
/// ctxd's estimate, and its cache works in steps (OpenAI's are 128 tokens).
const MISS_TOLERANCE_TOKENS: u64 = 128;
/// ... or this share of `kept_tokens` (one fiftieth, 2%), whichever is larger.
const MISS_TOLERANCE_DIVISOR: u64 = 50;
/// A prefix shorter than this is cached by neither provider (OpenAI's least cached prefix, and
/// Anthropic's least for its larger models), so reading none of it is no miss.
const MIN_CACHED_PREFIX_TOKENS: u64 = 1024;

impl GatewayCall {
    /// The provider read less from its cache than the forwarded request kept of the previous
    /// one: a miss that nothing ctxd did explains (the reason is the provider's, or a
    /// breakpoint was lost). Never so when the cache expired by time (everything is written
    /// again then), for a prefix too short to be cached, or when the provider reported no usage.
    pub fn unexplained_miss(&self) -> bool {
        if matches!(self.change, Some(PrefixChange::Expired { .. })) {
            return false;
        }
        if self.kept_tokens < MIN_CACHED_PREFIX_TOKENS {
            return false;
        }
        let u = &self.usage;
        if u.input == 0 && u.cache_read == 0 && u.cache_write == 0 {
            return false;
        }
        let tolerance = MISS_TOLERANCE_TOKENS.max(self.kept_tokens / MISS_TOLERANCE_DIVISOR);
        u.cache_read.saturating_add(tolerance) < self.kept_tokens
    }
}

/// Why a forwarded request's prefix, up to the previous request's last cache breakpoint, is not
/// the previous forwarded request's: what made the provider write its cache again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixChange {
    /// The first forwarded call of its session (and function): nothing before it to keep.
    First,
    /// The render's step boundary moved: older tool results were cleared at `results` results,
    /// a step whose saving pays back its rewrite within `payback_calls` later calls (`None`: a
    /// step the cache's expiry made free, or one recorded before ctxd said).
    Step {
        results: u32,
        payback_calls: Option<u32>,
    },
    /// The history was over its budget and was reduced.
    Budget,
    /// A cache marker moved, so the provider's breakpoint prefix is another.
    MarkerMoved,
    /// The client changed its history (an edit, a fork, a dropped message).
    ClientChanged,
    /// The provider's cache had expired by time: `idle_ms` since the previous call.
    Expired { idle_ms: i64 },
}

impl PrefixChange {
    /// The stable text form, for storage and display: `first`, `step:20`,
    /// `step:20:payback:3`, `budget`, `marker_moved`, `client_changed`, `expired:360000`.
    pub fn as_text(&self) -> String {
        match self {
            Self::First => "first".into(),
            Self::Step {
                results,
                payback_calls: None,
            } => format!("step:{results}"),
            Self::Step {
                results,
                payback_calls: Some(calls),
            } => format!("step:{results}:payback:{calls}"),
            Self::Budget => "budget".into(),
            Self::MarkerMoved => "marker_moved".into(),
            Self::ClientChanged => "client_changed".into(),
            Self::Expired { idle_ms } => format!("expired:{idle_ms}"),
        }
    }

    /// The change `text` ([`PrefixChange::as_text`]) names, if it names one.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.split_once(':') {
            None => match text {
                "first" => Self::First,
                "budget" => Self::Budget,
                "marker_moved" => Self::MarkerMoved,
                "client_changed" => Self::ClientChanged,
                _ => return None,
            },
            Some(("step", n)) => match n.split_once(":payback:") {
                None => Self::Step {
                    results: number(n)?,
                    payback_calls: None,
                },
                Some((n, calls)) => Self::Step {
                    results: number(n)?,
                    payback_calls: Some(number(calls)?),
                },
            },
            Some(("expired", n)) => Self::Expired {
                idle_ms: signed(n)?,
            },
            Some(_) => return None,
        })
    }
}

/// A number in canonical decimal form (digits only, so `+5` or ` 5` never parse and every
/// value has one text).
fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if text.len() > 1 && text.starts_with('0') {
        return None;
    }
    text.parse().ok()
}

/// [`number`] with a sign: an idle gap measured across replicas' clocks may come out negative,
/// and what was written must read back.
fn signed(text: &str) -> Option<i64> {
    match text.strip_prefix('-') {
        Some(digits) => {
            number::<u64>(digits).filter(|n| *n > 0)?;
            text.parse().ok()
        }
        None => number(text),
    }
}

impl PrefixChange {
    /// What the change means, in words, for a panel: why the provider wrote its cache again.
    pub fn describe(&self) -> String {
        match self {
            Self::First => "first call".into(),
            Self::Step {
                results,
                payback_calls: Some(calls),
            } => format!("step at {results} results, paid back by {calls} calls"),
            Self::Step {
                results,
                payback_calls: None,
            } => format!("step at {results} results"),
            Self::Budget => "over budget".into(),
            Self::MarkerMoved => "cache marker moved".into(),
            Self::ClientChanged => "client changed its history".into(),
            Self::Expired { idle_ms } => {
                format!("cache expired ({} s idle)", idle_ms / 1000)
            }
        }
    }
}

impl std::fmt::Display for PrefixChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_text())
    }
}

/// A provider's usage report. Input tokens exclude those read from or written to its prompt
/// cache (Anthropic's convention; OpenAI's cached tokens are moved out of its prompt tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProviderUsage {
    pub input: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub output: u64,
    /// What the provider says its own context edit cleared (tool uses, input tokens); `None`
    /// when it reported no edit.
    pub cleared: Option<(u32, u64)>,
    /// Thinking blocks the provider says it dropped from the request as no longer bound to
    /// their prefix.
    pub thinking_dropped: u32,
}

impl ProviderUsage {
    /// Input cost in units of one uncached input token: cache reads at 0.1×, cache writes at
    /// 1.25× (the prices of Anthropic's 5-minute cache, which bench/ECONOMY.md uses too).
    pub fn weighted_input(&self) -> f64 {
        self.input as f64 + 0.1 * self.cache_read as f64 + 1.25 * self.cache_write as f64
    }
}

/// A session's gateway calls added up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GatewayUsage {
    pub calls: u64,
    pub client_tokens: u64,
    pub forwarded_tokens: u64,
    pub usage: ProviderUsage,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_reads_back_from_its_text() {
        let all = [
            PrefixChange::First,
            PrefixChange::Step {
                results: 20,
                payback_calls: None,
            },
            PrefixChange::Step {
                results: 0,
                payback_calls: None,
            },
            PrefixChange::Step {
                results: 20,
                payback_calls: Some(3),
            },
            PrefixChange::Budget,
            PrefixChange::MarkerMoved,
            PrefixChange::ClientChanged,
            PrefixChange::Expired { idle_ms: 360_000 },
            PrefixChange::Expired { idle_ms: i64::MAX },
            PrefixChange::Expired { idle_ms: -5 },
            PrefixChange::Expired { idle_ms: i64::MIN },
        ];
        for change in all {
            assert_eq!(
                PrefixChange::parse(&change.as_text()),
                Some(change),
                "{change}"
            );
        }
        assert_eq!(
            PrefixChange::Step {
                results: 20,
                payback_calls: None
            }
            .to_string(),
            "step:20"
        );
        assert_eq!(
            PrefixChange::Step {
                results: 20,
                payback_calls: Some(3)
            }
            .to_string(),
            "step:20:payback:3"
        );
        assert_eq!(
            PrefixChange::Expired { idle_ms: 360_000 }.to_string(),
            "expired:360000"
        );
        for bad in [
            "",
            "step",
            "step:",
            "step:-1",
            "step:+1",
            "step:01",
            "step:x",
            "expired:-0",
            "expired:--5",
            "expired:-",
            "expired:+5",
            "expired:9223372036854775808",
            "Budget",
            "budget:1",
            "first:",
            "moved",
            "step:4294967296",
            "step:20:payback:",
            "step:20:payback:-1",
            "step:20:paid:3",
            "step::payback:3",
        ] {
            assert_eq!(PrefixChange::parse(bad), None, "{bad:?}");
        }
    }

    fn call(kept: u64, read: u64, change: Option<PrefixChange>) -> GatewayCall {
        GatewayCall {
            kept_tokens: kept,
            change,
            usage: ProviderUsage {
                input: 100,
                cache_read: read,
                cache_write: 0,
                output: 10,
                ..ProviderUsage::default()
            },
            ..GatewayCall::default()
        }
    }

    #[test]
    fn a_miss_is_a_cache_read_below_what_was_kept_beyond_the_tolerance() {
        // Read all, or within 128 tokens: explained.
        assert!(!call(10_000, 10_000, None).unexplained_miss());
        assert!(!call(5_000, 4_872, None).unexplained_miss());
        assert!(call(5_000, 4_871, None).unexplained_miss());
        // 2% of a large prefix is the larger tolerance.
        assert!(!call(100_000, 98_000, None).unexplained_miss());
        assert!(call(100_000, 97_999, None).unexplained_miss());
        // Nothing read of a kept prefix, whatever else changed after it.
        assert!(call(50_000, 0, Some(PrefixChange::Budget)).unexplained_miss());
        // Expiry by time explains it; so does a prefix too short to cache.
        let expired = Some(PrefixChange::Expired { idle_ms: 400_000 });
        assert!(!call(50_000, 0, expired).unexplained_miss());
        assert!(!call(1_000, 0, None).unexplained_miss());
        // Nothing kept (the first call, a changed client): nothing to miss.
        assert!(!call(0, 0, Some(PrefixChange::First)).unexplained_miss());
        // A provider that reported no usage at all says nothing about its cache.
        let mut silent = call(50_000, 0, None);
        silent.usage = ProviderUsage::default();
        assert!(!silent.unexplained_miss());
    }
}
