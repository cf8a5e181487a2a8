//! Identifiers parsed once at the boundary: session and node ids (UUID v7) and branch names.

use std::fmt;

use uuid::Uuid;

use super::Error;

macro_rules! uuid_id {
    ($name:ident, $what:literal) => {
        #[doc = concat!("The id of a ", $what, " (UUID v7, so ids sort by creation time).")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// The id `uuid` is (ids are minted outside the engine, which reads no clock:
            /// `store::mint`).
            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            /// Parses a textual UUID; `field` names the request field in the error.
            pub fn parse(field: &str, text: &str) -> Result<Self, Error> {
                if text.is_empty() {
                    return Err(Error::invalid(field, "is required"));
                }
                Uuid::try_parse(text)
                    .map(Self)
                    .map_err(|_| Error::invalid(field, format!("not a UUID: {text:?}")))
            }

            pub fn from_bytes(bytes: [u8; 16]) -> Self {
                Self(Uuid::from_bytes(bytes))
            }

            pub fn as_bytes(&self) -> &[u8; 16] {
                self.0.as_bytes()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

uuid_id!(SessionId, "session");
uuid_id!(NodeId, "node");
uuid_id!(SummaryId, "summary");
uuid_id!(CompactionId, "compaction");
uuid_id!(GatewayCallId, "call the model gateway forwarded");

/// A branch name: git-ref-like, so it is safe in URLs, logs and shell commands.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BranchName(String);

impl BranchName {
    pub const MAX_LEN: usize = 128;

    pub fn main() -> Self {
        Self("main".to_owned())
    }

    pub fn parse(field: &str, name: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Err(Error::invalid(field, format!("{reason}: {name:?}")));
        if name.is_empty() {
            return Err(Error::invalid(field, "is required"));
        }
        if name.len() > Self::MAX_LEN {
            return bad(&format!("longer than {} bytes", Self::MAX_LEN));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
        {
            return bad(&format!(
                "may hold only ASCII letters, digits, '-', '_', '.' and '/', not {c:?}"
            ));
        }
        // git refuses these too: `a..b` reads as a range, and a trailing dot as junk.
        if name.contains("..") || name.ends_with('.') {
            return bad("holds '..' or ends with '.'");
        }
        for segment in name.split('/') {
            if segment.is_empty() {
                return bad("has an empty path segment (leading, trailing or double '/')");
            }
            if segment.starts_with('.') || segment.ends_with(".lock") {
                return bad("has a segment starting with '.' or ending with '.lock'");
            }
        }
        if name.starts_with('-') {
            return bad("starts with '-'");
        }
        Ok(Self(name.to_owned()))
    }

    /// A name read back from the store, which only ever holds parsed names.
    pub fn from_stored(name: String) -> Self {
        Self(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BranchName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names() {
        for ok in ["main", "feature/x-1", "v1.2", "a_b/c.d"] {
            assert!(BranchName::parse("name", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "..",
            "a/../b",
            "/x",
            "x/",
            "a//b",
            "has space",
            ".hidden",
            "x.lock",
            "-x",
            "é",
            "a\nb",
            "a..b",
            "_..",
            "x.",
            "a/b.",
        ] {
            let err = BranchName::parse("name", bad).expect_err(bad);
            assert!(err.to_string().starts_with("name:"), "{err}");
        }
    }

    #[test]
    fn uuid_parse_names_the_field() {
        let err = NodeId::parse("node_ids[2]", "nope").expect_err("not a uuid");
        assert_eq!(err.to_string(), "node_ids[2]: not a UUID: \"nope\"");
        let id = NodeId::new();
        assert_eq!(NodeId::parse("x", &id.to_string()), Ok(id));
    }
}
