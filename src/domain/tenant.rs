//! The tenant a caller acts for: every session belongs to exactly one.

use std::fmt;
use std::sync::Arc;

/// A tenant name, as given by the API-keys file. Without keys every caller is [`Tenant::local`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Arc<str>);

impl Tenant {
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }

    /// The one tenant of a server without API keys.
    pub fn local() -> Self {
        Self(Arc::from(""))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
