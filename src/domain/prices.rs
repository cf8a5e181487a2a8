//! What a provider's prompt cache charges for a token read from it and a token written to it,
//! relative to a plain input token: the prices a render weighs a step by and a ledger bills at.

/// Cache prices per mille of a plain input token (exact, so a policy holding them compares
/// equal to itself): Anthropic's older models read at 100 (0.1×) and write 5-minute entries at
/// 1250 (1.25×); Opus 5.5 reads at 50, Fable 5.1 at 25; OpenAI writes at 1000 (no premium).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CachePrices {
    pub read_per_mille: u32,
    pub write_per_mille: u32,
}

impl CachePrices {
    /// 0.1× reads, 1.25× writes: the prices of Anthropic's 5-minute cache on its older models,
    /// which ctxd weighed every step at before it knew a model's own.
    pub const STANDARD: CachePrices = CachePrices {
        read_per_mille: 100,
        write_per_mille: 1250,
    };

    /// A price given as a multiplier of plain input (1.25, 0.05) in per mille; `None` unless
    /// between 0 and 100 (a NaN is not).
    pub fn per_mille(multiplier: f64) -> Option<u32> {
        (0.0..=100.0)
            .contains(&multiplier)
            .then(|| (multiplier * 1000.0).round() as u32)
    }

    pub fn read(self) -> f64 {
        f64::from(self.read_per_mille) / 1000.0
    }

    pub fn write(self) -> f64 {
        f64::from(self.write_per_mille) / 1000.0
    }

    /// What `input` plain tokens, `read` tokens read and `written` tokens written cost, in
    /// plain input tokens.
    pub fn cost(self, input: u64, read: u64, written: u64) -> f64 {
        input as f64 + self.read() * read as f64 + self.write() * written as f64
    }
}

impl Default for CachePrices {
    fn default() -> Self {
        Self::STANDARD
    }
}
