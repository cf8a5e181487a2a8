//! What the model gateway forwarded for a session, and what the provider reported using.

/// One model call the gateway forwarded: the tokens the client sent and the tokens that went
/// upstream (both by ctxd's heuristic count), and the provider's own usage report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayCall {
    pub at_ms: i64,
    /// `anthropic` or `openai`.
    pub api: String,
    pub model: String,
    pub client_tokens: u64,
    pub forwarded_tokens: u64,
    pub usage: ProviderUsage,
}

/// A provider's usage report. Input tokens exclude those read from or written to its prompt
/// cache (Anthropic's convention; OpenAI's cached tokens are moved out of its prompt tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProviderUsage {
    pub input: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub output: u64,
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
