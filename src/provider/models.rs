//! The model table: for each provider model (by name prefix, so dated ids match) its context
//! window, what its prompt cache charges for a read and a write relative to plain input, how
//! long an entry lives, and whether its thinking blocks are bound to their prefix. The one place
//! ctxd's economics and the gateway's reasoning rules read a model's facts; an operator extends
//! or overrides it with a file (`--models FILE`) or a window (`--context-window`), no rebuild.
//!
//! The built-in entries are the providers' published figures as DESIGN.md §6 records them.
//! Where a model's price was not published separately, its entry takes the cheapest read of its
//! family, since a cheaper read makes a step pay back later: a step priced at too cheap a read
//! is only taken later than it could be, never one that costs more than it saves.

use serde::Deserialize;

use crate::domain::CachePrices;

/// Whether a model binds its thinking blocks to the prefix they were produced after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// A thinking block is valid only after the very prefix it was produced on: a request that
    /// changes anything before a kept one is refused (or the block dropped).
    Binds,
    Free,
    /// Not known: binding when the history holds signed thinking (an unknown Claude model).
    IfSigned,
}

/// One entry of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelEntry {
    /// The name prefix the entry answers for (`claude-opus-5-5` answers for
    /// `claude-opus-5-5-20261015` too); the longest matching prefix wins.
    pub name: String,
    /// The input window in tokens; `None`: no budget cuts the model's requests, only steps.
    pub window: Option<u32>,
    pub prices: CachePrices,
    /// The lifetime of a default cache entry, and of a long one (Anthropic's `ttl: "1h"`,
    /// OpenAI's `prompt_cache_retention: "24h"`), in milliseconds.
    pub ttl_ms: i64,
    pub long_ttl_ms: i64,
    /// The write price of a long entry, per mille of plain input.
    pub long_write_per_mille: u32,
    pub binding: Binding,
    /// Set on entries that came from the operator (file or flag), for display.
    pub overridden: bool,
    /// Answers for its very name only (an operator's `--context-window MODEL=…` without `*`).
    pub exact: bool,
}

const MINUTE: i64 = 60 * 1000;

impl ModelEntry {
    /// Anthropic's terms: writes 1.25× (5 minutes) or 2× (1 hour), reads at `read_per_mille`.
    fn anthropic(name: &str, window: u32, read_per_mille: u32, binding: Binding) -> Self {
        Self {
            name: name.to_owned(),
            window: Some(window),
            prices: CachePrices {
                read_per_mille,
                write_per_mille: 1250,
            },
            ttl_ms: 5 * MINUTE,
            long_ttl_ms: 60 * MINUTE,
            long_write_per_mille: 2000,
            binding,
            overridden: false,
            exact: false,
        }
    }

    /// OpenAI's and Google's automatic prefix caches: no write premium, reads discounted.
    fn automatic(name: &str, window: u32, read_per_mille: u32, long_ttl_ms: i64) -> Self {
        Self {
            name: name.to_owned(),
            window: Some(window),
            prices: CachePrices {
                read_per_mille,
                write_per_mille: 1000,
            },
            ttl_ms: 5 * MINUTE,
            long_ttl_ms,
            long_write_per_mille: 1000,
            binding: Binding::Free,
            overridden: false,
            exact: false,
        }
    }

    /// Whether requests of this model bind thinking, given whether their history holds a
    /// signed thinking block.
    pub fn binds(&self, history_signed: bool) -> bool {
        match self.binding {
            Binding::Binds => true,
            Binding::Free => false,
            Binding::IfSigned => history_signed,
        }
    }

    /// The entry's name as the ledger and the inspector show it: `*` for an operator's.
    pub fn label(&self) -> String {
        if self.overridden {
            format!("{}*", self.name)
        } else {
            self.name.clone()
        }
    }
}

/// The entry of a model the table does not know: Anthropic's breakpoint prices (the dearest
/// writes, so a step pays back no sooner than on any provider), no window, nothing bound.
pub fn unknown(model: &str) -> ModelEntry {
    let mut entry = ModelEntry::anthropic("", 0, 100, Binding::Free);
    entry.name = format!("unknown:{}", normalized(model));
    entry.window = None;
    entry
}

/// The built-in table, most specific names first where several share a prefix.
fn builtin() -> Vec<ModelEntry> {
    use Binding::{Binds, Free, IfSigned};
    let a = ModelEntry::anthropic;
    let o = |name, window, read| ModelEntry::automatic(name, window, read, 24 * 60 * MINUTE);
    let g = |name, window, read| ModelEntry::automatic(name, window, read, 60 * MINUTE);
    vec![
        // Anthropic's current models bind every thinking block to its prefix.
        a("claude-fable-5-1", 1_000_000, 25, Binds),
        a("claude-mythos-5-1", 1_000_000, 25, Binds),
        // 5.2: its family's read price (none published apart).
        a("claude-fable-5-2", 1_000_000, 25, Binds),
        a("claude-mythos-5-2", 1_000_000, 25, Binds),
        a("claude-fable-5", 1_000_000, 100, Free),
        a("claude-mythos-5", 1_000_000, 100, Free),
        a("claude-opus-5-5", 200_000, 50, Binds),
        a("claude-sonnet-5-5", 200_000, 50, Binds),
        // Haiku 5.5: its generation's read price (none published apart).
        a("claude-haiku-5-5", 200_000, 50, Binds),
        a("claude-opus-4", 200_000, 100, Free),
        a("claude-sonnet-4", 200_000, 100, Free),
        a("claude-haiku-4", 200_000, 100, Free),
        a("claude-3", 200_000, 100, Free),
        // Any other Claude model: binding when its history holds signed thinking.
        a("claude", 200_000, 100, IfSigned),
        // OpenAI: GPT-5 family 400k of which 128k output; cached input at its listed share.
        o("gpt-5", 272_000, 100),
        o("gpt-4.1", 1_047_576, 250),
        o("gpt-4o", 128_000, 500),
        o("gpt-4-turbo", 128_000, 1000),
        o("o1", 200_000, 500),
        o("o3", 200_000, 250),
        o("o4", 200_000, 250),
        o("codex-mini", 200_000, 250),
        o("gpt-oss", 131_072, 1000),
        // Google's implicit cache (ai.google.dev/gemini-api/docs/caching): from 2.5 on, reads
        // 75% off on 2.5, 90% on 3, 95% on 4, of prefixes of at least 2,048 tokens (2.5) or
        // 4,096 (3 and later); below that the provider reports no cached tokens, and the ledger
        // prices what it reports. 2.0 has explicit caches only, which a request cannot name
        // through the gateway (`cachedContent` goes unrecorded): no read discount.
        g("gemini-4", 1_048_576, 50),
        g("gemini-3", 1_048_576, 100),
        g("gemini-2.5", 1_048_576, 250),
        g("gemini-2.0", 1_048_576, 1000),
    ]
}

/// A model name as the table matches it: lower case, without a `provider/` prefix.
fn normalized(model: &str) -> String {
    let m = model.trim().to_ascii_lowercase();
    m.rsplit('/').next().unwrap_or(&m).to_owned()
}

/// A model's context window set by the operator: `MODEL=TOKENS`, `MODEL` ending in `*` for
/// every model it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub model: String,
    pub prefix: bool,
    pub tokens: u32,
}

impl Window {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (model, tokens) = s
            .split_once('=')
            .ok_or_else(|| format!("--context-window {s:?}: must be MODEL=TOKENS"))?;
        let model = model.trim();
        let tokens: u32 = tokens.trim().parse().map_err(|_| {
            format!("--context-window {s:?}: TOKENS must be a whole number of tokens")
        })?;
        if tokens < 1024 {
            return Err(format!(
                "--context-window {s:?}: TOKENS must be at least 1024"
            ));
        }
        let (model, prefix) = match model.strip_suffix('*') {
            Some(m) => (m, true),
            None => (model, false),
        };
        if model.is_empty() && !prefix {
            return Err(format!("--context-window {s:?}: MODEL must not be empty"));
        }
        Ok(Self {
            model: model.to_ascii_lowercase(),
            prefix,
            tokens,
        })
    }
}

/// The table: the operator's entries first, then the built-in ones.
#[derive(Debug, Clone)]
pub struct ModelTable {
    entries: Vec<ModelEntry>,
}

impl Default for ModelTable {
    fn default() -> Self {
        Self { entries: builtin() }
    }
}

impl ModelTable {
    /// The entry for `model`: the operator's entry with the longest name that prefixes it, else
    /// the built-in one (an operator who names `claude-sonnet-*` means every Sonnet, the table's
    /// longer names too); [`unknown`] when none does.
    pub fn entry(&self, model: &str) -> ModelEntry {
        let m = normalized(model);
        self.entries
            .iter()
            .filter(|e| {
                if e.exact {
                    m == e.name
                } else {
                    m.starts_with(&e.name)
                }
            })
            .max_by_key(|e| (e.overridden, e.name.len()))
            .cloned()
            .unwrap_or_else(|| unknown(model))
    }

    /// Adds the operator's `entries` before the built-in ones.
    pub fn with(mut self, entries: Vec<ModelEntry>) -> Self {
        let mut all = entries;
        all.append(&mut self.entries);
        self.entries = all;
        self
    }

    /// Sets the window of every entry named by `name` (`MODEL`, or `MODEL*` for every model it
    /// starts): an operator's `--context-window`.
    pub fn with_window(self, name: &str, prefix: bool, tokens: u32) -> Self {
        let entry = ModelEntry {
            name: normalized(name),
            window: Some(tokens),
            overridden: true,
            exact: !prefix,
            ..self.entry(name)
        };
        self.with(vec![entry])
    }

    /// Reads the operator's table file: a JSON array of entries (see [`FileEntry`]).
    pub fn with_file(self, text: &str) -> Result<Self, String> {
        let entries: Vec<FileEntry> =
            serde_json::from_str(text).map_err(|e| format!("the models file: {e}"))?;
        let mut out = Vec::with_capacity(entries.len());
        for (i, e) in entries.into_iter().enumerate() {
            out.push(e.entry(&self, i)?);
        }
        Ok(self.with(out))
    }
}

/// One entry of an operator's models file. Absent fields are those of the built-in entry the
/// name falls under (or of an unknown model's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    model: String,
    window: Option<u32>,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
    cache_write_long: Option<f64>,
    ttl_minutes: Option<u32>,
    long_ttl_minutes: Option<u32>,
    binds_thinking: Option<bool>,
}

/// A price multiplier of the file (1.25, 0.05) as per mille, checked.
fn per_mille(field: &str, at: usize, value: f64) -> Result<u32, String> {
    CachePrices::per_mille(value).ok_or_else(|| {
        format!("the models file: [{at}].{field} must be between 0 and 100, not {value}")
    })
}

impl FileEntry {
    fn entry(self, table: &ModelTable, at: usize) -> Result<ModelEntry, String> {
        let name = normalized(&self.model);
        if name.is_empty() {
            return Err(format!("the models file: [{at}].model must not be empty"));
        }
        if self.window.is_some_and(|w| w < 1024) {
            return Err(format!(
                "the models file: [{at}].window must be at least 1024 tokens"
            ));
        }
        let base = table.entry(&name);
        let minutes = |m: u32| i64::from(m) * MINUTE;
        let mut prices = base.prices;
        if let Some(r) = self.cache_read {
            prices.read_per_mille = per_mille("cache_read", at, r)?;
        }
        if let Some(w) = self.cache_write {
            prices.write_per_mille = per_mille("cache_write", at, w)?;
        }
        Ok(ModelEntry {
            name,
            window: self.window.or(base.window),
            prices,
            ttl_ms: self.ttl_minutes.map_or(base.ttl_ms, minutes),
            long_ttl_ms: self.long_ttl_minutes.map_or(base.long_ttl_ms, minutes),
            long_write_per_mille: match self.cache_write_long {
                Some(w) => per_mille("cache_write_long", at, w)?,
                None => base.long_write_per_mille,
            },
            binding: match self.binds_thinking {
                Some(true) => Binding::Binds,
                Some(false) => Binding::Free,
                None => base.binding,
            },
            overridden: true,
            exact: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_prices_a_model() {
        let table = ModelTable::default();
        let opus = table.entry("claude-opus-5-5-20261015");
        assert_eq!(opus.name, "claude-opus-5-5");
        assert_eq!(opus.prices.read_per_mille, 50);
        assert!(opus.binds(false));
        let fable = table.entry("claude-fable-5-1");
        assert_eq!(fable.prices.read_per_mille, 25);
        assert_eq!(table.entry("claude-fable-5").prices.read_per_mille, 100);
        let old = table.entry("claude-sonnet-4-5");
        assert!(!old.binds(true));
        let other = table.entry("claude-x");
        assert_eq!(other.name, "claude");
        assert!(!other.binds(false) && other.binds(true));
        let gpt = table.entry("openai/GPT-5.2-codex");
        assert_eq!(
            (gpt.name.as_str(), gpt.prices.write_per_mille),
            ("gpt-5", 1000)
        );
        let none = table.entry("llama-9");
        assert_eq!(none.window, None);
        assert_eq!(none.name, "unknown:llama-9");
    }

    #[test]
    fn an_operator_file_overrides_and_names_the_field_it_refuses() {
        let table = ModelTable::default()
            .with_file(
                r#"[{"model": "claude-opus-5-5", "cache_read": 0.08, "ttl_minutes": 60},
                           {"model": "acme-1", "window": 64000, "binds_thinking": true}]"#,
            )
            .expect("a models file");
        let opus = table.entry("claude-opus-5-5-20261015");
        assert_eq!(opus.prices.read_per_mille, 80);
        assert_eq!(opus.ttl_ms, 60 * MINUTE);
        assert!(
            opus.binds(false),
            "what the file does not say stays the table's"
        );
        assert_eq!(opus.label(), "claude-opus-5-5*");
        let acme = table.entry("acme-1-mini");
        assert_eq!(acme.window, Some(64000));
        assert!(acme.binds(false));
        let bad = ModelTable::default().with_file(r#"[{"model": "x", "cache_read": -1}]"#);
        assert!(bad.unwrap_err().contains("[0].cache_read"));
        let unknown_field = ModelTable::default().with_file(r#"[{"model": "x", "speed": 1}]"#);
        assert!(unknown_field.unwrap_err().contains("speed"));
        let window = ModelTable::default().with_window("claude-opus-5-5", false, 1_000_000);
        assert_eq!(window.entry("claude-opus-5-5").window, Some(1_000_000));
        assert_eq!(window.entry("claude-opus-5-5").prices.read_per_mille, 50);
        assert_eq!(
            window.entry("claude-opus-5-5-20261015").window,
            Some(200_000),
            "an exact name answers for itself alone"
        );
    }
}
