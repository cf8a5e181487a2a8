//! The clock of a replayed session: when each of its model calls was made. From the raw Claude
//! Code file a trace was converted from, where one exists (one timestamp per line); for the
//! rest, gaps drawn deterministically (by the trace's name) from the distribution TraceLab
//! publishes for real sessions (arXiv 2606.30560, 4,265 Claude Code and Codex sessions): a call
//! after a human turn waits for the human (median 79 s for Claude Code, 95 s for Codex; more
//! than 5 minutes 20.4% and 30.2% of the time, more than an hour 3.6% and 5.1%), a call after a
//! tool's result waits for the tool (p50 0.3 s, p90 13.6 s, p99 3.6 min). The few gaps the raw
//! files here measure (one in 167 over five minutes) are fewer than real sessions have.

// Each bench takes what it needs of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

/// The raw source of a converted trace, by the trace's name (`testdata/claude-code`).
const SOURCES: [(&str, &str); 2] = [
    (
        "cc-main-258c7280",
        "258c7280-ae70-4798-800f-63464d01a85d.jsonl",
    ),
    ("cc-sub-258c7280-a881341", "258c7280-agent-a881341.jsonl"),
];

/// When each model call of a raw Claude Code session was made, in milliseconds: for each
/// assistant message (its lines share `message.id`), the time of the newest user line before
/// it, which is when its input was complete.
pub fn call_times(raw: &str) -> Vec<i64> {
    let mut times = Vec::new();
    let (mut input_at, mut last_id): (Option<i64>, Option<String>) = (None, None);
    for line in raw.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(at) = v
            .get("timestamp")
            .and_then(|t| t.as_str())
            .and_then(|t| {
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
            })
            .map(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))
        else {
            continue;
        };
        match v.get("type").and_then(|t| t.as_str()) {
            Some("user") => input_at = Some(at),
            Some("assistant") => {
                let id = v
                    .pointer("/message/id")
                    .and_then(|i| i.as_str())
                    .map(str::to_owned);
                if id.is_some() && id == last_id {
                    continue;
                }
                times.push(input_at.unwrap_or(at));
                last_id = id;
            }
            _ => {}
        }
    }
    times
}

/// The sessions' clocks: measured where a trace has its raw source, drawn otherwise.
pub struct Clock {
    measured: HashMap<String, Vec<i64>>,
    /// Every gap between consecutive calls of every raw file, in milliseconds, sorted.
    gaps: Vec<i64>,
}

impl Clock {
    /// Reads every raw file of `dir` (`testdata/claude-code`).
    pub fn load(dir: &Path) -> Self {
        let mut measured = HashMap::new();
        let mut gaps = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "jsonl"));
        files.sort();
        for file in files {
            let Ok(raw) = std::fs::read_to_string(&file) else {
                continue;
            };
            let times = call_times(&raw);
            gaps.extend(times.windows(2).map(|w| (w[1] - w[0]).max(0)));
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if let Some((trace, _)) = SOURCES.iter().find(|(_, source)| *source == name) {
                measured.insert((*trace).to_owned(), times);
            }
        }
        gaps.sort_unstable();
        Self { measured, gaps }
    }

    /// How many gaps the raw files measure, and how many of them are at least `ttl_ms`.
    pub fn gap_stats(&self, ttl_ms: i64) -> (usize, usize) {
        (
            self.gaps.len(),
            self.gaps.iter().filter(|&&g| g >= ttl_ms).count(),
        )
    }

    /// The times of the model calls of the trace `name` (`human[k]`: call `k` follows a human
    /// turn, not a tool's result), and whether they were measured.
    pub fn times(&self, name: &str, human: &[bool]) -> (Vec<i64>, bool) {
        if let Some(times) = self.measured.get(name).filter(|t| t.len() == human.len()) {
            return (times.clone(), true);
        }
        let humans = if name.starts_with("codex") {
            &CODEX_HUMAN
        } else {
            &CLAUDE_CODE_HUMAN
        };
        let mut at = 0i64;
        let mut times = Vec::with_capacity(human.len());
        for (k, &after_human) in human.iter().enumerate() {
            if k > 0 {
                let draw = blake3::hash(format!("{name}/{k}").as_bytes());
                let pick = u64::from_le_bytes(draw.as_bytes()[..8].try_into().expect("8 bytes"));
                let u = (pick >> 11) as f64 / (1u64 << 53) as f64;
                let quantiles: &[(f64, f64)] = if after_human { humans } else { &TOOL };
                at += gap_ms(quantiles, u);
            }
            times.push(at);
        }
        (times, false)
    }
}

/// A gap's quantiles, (probability, seconds), as TraceLab publishes them, and a floor and a
/// ceiling of ours; between two, the gap is interpolated on a log scale.
const CLAUDE_CODE_HUMAN: [(f64, f64); 5] = [
    (0.0, 5.0),
    (0.5, 79.0),
    (1.0 - 0.204, 300.0),
    (1.0 - 0.036, 3_600.0),
    (1.0, 8.0 * 3_600.0),
];
const CODEX_HUMAN: [(f64, f64); 5] = [
    (0.0, 5.0),
    (0.5, 95.0),
    (1.0 - 0.302, 300.0),
    (1.0 - 0.051, 3_600.0),
    (1.0, 8.0 * 3_600.0),
];
const TOOL: [(f64, f64); 5] = [
    (0.0, 0.05),
    (0.5, 0.3),
    (0.9, 13.6),
    (0.99, 216.0),
    (1.0, 1_800.0),
];

/// The gap at quantile `u` of `quantiles`, in milliseconds.
fn gap_ms(quantiles: &[(f64, f64)], u: f64) -> i64 {
    let u = u.clamp(0.0, 1.0);
    let i = quantiles
        .windows(2)
        .position(|w| u <= w[1].0)
        .unwrap_or(quantiles.len() - 2);
    let ((p0, s0), (p1, s1)) = (quantiles[i], quantiles[i + 1]);
    let t = if p1 > p0 { (u - p0) / (p1 - p0) } else { 0.0 };
    let seconds = (s0.ln() + t * (s1.ln() - s0.ln())).exp();
    (seconds * 1000.0).round() as i64
}

/// Whether each model call of `nodes` (an imported path) follows a human turn: the message
/// before it is the user's, not a tool's result.
pub fn human_turns(nodes: &[std::sync::Arc<ctxd::domain::Node>]) -> Vec<bool> {
    use ctxd::domain::{NodeContent, Role};
    let assistant = |n: &ctxd::domain::Node| {
        matches!(
            &n.content,
            NodeContent::Message {
                role: Role::Assistant,
                ..
            }
        )
    };
    (1..nodes.len())
        .filter(|&k| assistant(&nodes[k]))
        .map(|k| {
            matches!(
                &nodes[k - 1].content,
                NodeContent::Message {
                    role: Role::User,
                    ..
                }
            )
        })
        .collect()
}
