//! Tokenizers: a 4-characters-a-token heuristic and real BPE vocabularies (offline, via tiktoken).
//!
//! Every count includes the per-message framing a chat API adds, so a budget holds for the
//! request as sent, not just the text in it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

/// Tokens of framing per message (role markers and separators), as chat formats add them.
pub const MESSAGE_OVERHEAD: u32 = 4;
/// Tokens of framing per tool call, on top of its name and arguments.
pub const TOOL_CALL_OVERHEAD: u32 = 4;
/// A media part (image, file) counts as this many tokens: providers bill them by size and
/// resolution, which the store does not know; this is about one mid-size image.
pub const MEDIA_TOKENS: u32 = 1024;

/// A token count, the unit of every budget.
pub type Tokens = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tokenizer {
    /// One token per four characters, rounded up: fast, and close for English prose and code.
    #[default]
    Heuristic,
    O200kBase,
    Cl100kBase,
}

impl Tokenizer {
    pub const NAMES: [&'static str; 3] = ["heuristic", "o200k_base", "cl100k_base"];

    /// Parses a request's tokenizer name; empty means the default.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "" | "heuristic" => Tokenizer::Heuristic,
            "o200k_base" => Tokenizer::O200kBase,
            "cl100k_base" => Tokenizer::Cl100kBase,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::Heuristic => "heuristic",
            Tokenizer::O200kBase => "o200k_base",
            Tokenizer::Cl100kBase => "cl100k_base",
        }
    }

    /// Tokens of `text` alone, without framing.
    pub fn count(self, text: &str) -> Tokens {
        let n = match self {
            Tokenizer::Heuristic => text.chars().count().div_ceil(4),
            Tokenizer::O200kBase => tiktoken_rs::o200k_base_singleton().count_ordinary(text),
            Tokenizer::Cl100kBase => tiktoken_rs::cl100k_base_singleton().count_ordinary(text),
        };
        Tokens::try_from(n).unwrap_or(Tokens::MAX)
    }
}

/// Counts the tokens of a text.
pub trait Count {
    fn tokenizer(&self) -> Tokenizer;
    fn count(&self, text: &str) -> Tokens;
}

impl Count for Tokenizer {
    fn tokenizer(&self) -> Tokenizer {
        *self
    }

    fn count(&self, text: &str) -> Tokens {
        Tokenizer::count(*self, text)
    }
}

/// Memoised BPE counts, keyed by the BLAKE3 of the text (the same key as its content blob), so
/// a long session is counted once per tokenizer, not on every render.
pub struct TokenCache {
    counts: Mutex<HashMap<([u8; 32], Tokenizer), Tokens>>,
    capacity: usize,
}

/// Texts shorter than this are counted directly: hashing and locking would cost more. BPE on
/// even a short text (a tool name, a placeholder, an argument stub) costs microseconds, far more
/// than a BLAKE3 hash and an uncontended lock: with a 256-byte floor, a warm o200k render of
/// the 293-message trace in `cargo bench --bench render` took 3.7 times as long.
const CACHE_MIN_BYTES: usize = 8;

impl TokenCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            counts: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// A counter for one render.
    pub fn counter(&self, tokenizer: Tokenizer) -> CachedCounter<'_> {
        CachedCounter {
            cache: self,
            tokenizer,
        }
    }

    pub fn len(&self) -> usize {
        self.counts.lock().map_or(0, |c| c.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for TokenCache {
    /// About 40 MB at capacity: far more distinct long texts than a busy server renders.
    fn default() -> Self {
        Self::new(1_000_000)
    }
}

pub struct CachedCounter<'a> {
    cache: &'a TokenCache,
    tokenizer: Tokenizer,
}

impl Count for CachedCounter<'_> {
    fn tokenizer(&self) -> Tokenizer {
        self.tokenizer
    }

    fn count(&self, text: &str) -> Tokens {
        if self.tokenizer == Tokenizer::Heuristic || text.len() < CACHE_MIN_BYTES {
            return self.tokenizer.count(text);
        }
        let key = (*blake3::hash(text.as_bytes()).as_bytes(), self.tokenizer);
        if let Some(n) = self
            .cache
            .counts
            .lock()
            .ok()
            .and_then(|c| c.get(&key).copied())
        {
            return n;
        }
        // Count outside the lock: BPE on a long text takes milliseconds.
        let n = self.tokenizer.count(text);
        if let Ok(mut counts) = self.cache.counts.lock() {
            if counts.len() >= self.cache.capacity {
                // Crude but bounded: start over rather than track recency on every hit.
                counts.clear();
            }
            counts.insert(key, n);
        }
        n
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_rounds_up_per_character() {
        assert_eq!(Tokenizer::Heuristic.count(""), 0);
        assert_eq!(Tokenizer::Heuristic.count("abcde"), 2);
        // Characters, not bytes: four CJK characters are one token, not three.
        assert_eq!(Tokenizer::Heuristic.count("日本語だ"), 1);
    }

    #[test]
    fn bpe_vocabularies_count_real_tokens() {
        assert_eq!(Tokenizer::O200kBase.count("hello world"), 2);
        assert_eq!(Tokenizer::Cl100kBase.count("hello world"), 2);
        assert!(Tokenizer::O200kBase.count("fn main() { println!(\"hi\"); }") > 5);
    }

    #[test]
    fn cache_returns_what_the_tokenizer_counts() {
        let cache = TokenCache::new(2);
        let counter = cache.counter(Tokenizer::O200kBase);
        let long = "the quick brown fox jumps over the lazy dog. ".repeat(20);
        assert_eq!(counter.count(&long), Tokenizer::O200kBase.count(&long));
        assert_eq!(counter.count(&long), Tokenizer::O200kBase.count(&long));
        assert_eq!(cache.len(), 1);
        // Another tokenizer is another entry; a full cache starts over.
        assert_eq!(
            cache.counter(Tokenizer::Cl100kBase).count(&long),
            Tokenizer::Cl100kBase.count(&long)
        );
        counter.count(&format!("{long}!"));
        assert_eq!(cache.len(), 1);
        // Short texts skip the cache.
        counter.count("hi");
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn names_round_trip() {
        for name in Tokenizer::NAMES {
            assert_eq!(Tokenizer::parse(name).map(Tokenizer::name), Some(name));
        }
        assert_eq!(Tokenizer::parse(""), Some(Tokenizer::Heuristic));
        assert_eq!(Tokenizer::parse("gpt2"), None);
    }
}
