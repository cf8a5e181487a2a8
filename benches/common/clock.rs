//! The clock of a replayed session: when each of its model calls was made. From the raw Claude
//! Code file a trace was converted from, where one exists (one timestamp per line); for the
//! rest, gaps drawn deterministically (by the trace's name) from every gap those files measure.

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

    /// The times of `calls` model calls of the trace `name`, and whether they were measured.
    pub fn times(&self, name: &str, calls: usize) -> (Vec<i64>, bool) {
        if let Some(times) = self.measured.get(name).filter(|t| t.len() == calls) {
            return (times.clone(), true);
        }
        let mut at = 0i64;
        let mut times = Vec::with_capacity(calls);
        for k in 0..calls {
            if k > 0 && !self.gaps.is_empty() {
                let draw = blake3::hash(format!("{name}/{k}").as_bytes());
                let pick = u64::from_le_bytes(draw.as_bytes()[..8].try_into().expect("8 bytes"));
                at += self.gaps[(pick % self.gaps.len() as u64) as usize];
            }
            times.push(at);
        }
        (times, false)
    }
}
