//! The token budget of a request.

use super::Error;

type Tokens = u32;

/// The token budget of a request; the history gets what the other parts leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    pub context_window: Tokens,
    pub output_reserve: Tokens,
    pub system: Tokens,
    pub tools: Tokens,
    pub schema: Tokens,
}

impl Budget {
    /// `context_window − output_reserve − system − tools − schema`, which must be positive.
    pub fn history(&self) -> Result<Tokens, Error> {
        let share = i64::from(self.context_window)
            - i64::from(self.output_reserve)
            - i64::from(self.system)
            - i64::from(self.tools)
            - i64::from(self.schema);
        Tokens::try_from(share)
            .ok()
            .filter(|share| *share > 0)
            .ok_or_else(|| {
                Error::invalid(
                    "budget",
                    format!(
                        "leaves the history {share} tokens: context_window {} − output_reserve {} \
                         − system_tokens {} − tools_tokens {} − schema_tokens {} must be positive",
                        self.context_window,
                        self.output_reserve,
                        self.system,
                        self.tools,
                        self.schema
                    ),
                )
            })
    }
}
