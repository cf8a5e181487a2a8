//! Tokenizers: a 4-characters-a-token heuristic and real BPE vocabularies (offline, via tiktoken).
//!
//! Every count includes the per-message framing a chat API adds, so a budget holds for the
//! request as sent, not just the text in it.

use std::fmt;

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
    fn names_round_trip() {
        for name in Tokenizer::NAMES {
            assert_eq!(Tokenizer::parse(name).map(Tokenizer::name), Some(name));
        }
        assert_eq!(Tokenizer::parse(""), Some(Tokenizer::Heuristic));
        assert_eq!(Tokenizer::parse("gpt2"), None);
    }
}
