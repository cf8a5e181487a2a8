//! The errors every layer speaks: a closed set, mapped once to gRPC status codes in `api`.

/// Why a request cannot be carried out. Messages name the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("{what} not found: {id}")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// A compare-and-swap lost: the caller should re-read and retry.
    #[error("{0}")]
    Aborted(String),
}

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn not_found(what: &'static str, id: impl ToString) -> Self {
        Self::NotFound {
            what,
            id: id.to_string(),
        }
    }

    /// A compare-and-swap on a head that is `head`, not the `expected` one.
    pub fn head_moved(head: Option<super::NodeId>, expected: Option<super::NodeId>) -> Self {
        let show =
            |h: Option<super::NodeId>| h.map_or_else(|| "none".to_owned(), |id| id.to_string());
        Self::Aborted(format!(
            "expected_head_id: the head is {}, not {}",
            show(head),
            show(expected)
        ))
    }
}
