//! Sessions and branches as the store hands them out.

use std::collections::BTreeMap;

use super::{BranchName, Hash, NodeId, SessionId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: SessionId,
    pub created_at_ms: i64,
    pub metadata: BTreeMap<String, String>,
    pub compaction_count: u32,
    /// Sorted by name.
    pub branches: Vec<Branch>,
    /// Every node of the session: on all branches, and in its functions' internal chains.
    pub node_count: u64,
}

/// A named ref to a head node; `head` is `None` until the first append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub name: BranchName,
    pub head: Option<(NodeId, Hash)>,
    pub updated_at_ms: i64,
}

/// What is left of a deleted session, for the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    pub session: SessionId,
    /// The tenant the session belonged to.
    pub tenant: super::Tenant,
    /// The tenant whose key deleted it, or [`Tombstone::RETENTION`].
    pub deleted_by: String,
    pub deleted_at_ms: i64,
    pub nodes: u64,
    pub branches: u32,
    pub summaries: u32,
}

impl Tombstone {
    /// `deleted_by` of a session the retention policy deleted.
    pub const RETENTION: &'static str = "retention";
}

/// The first and last id bytes of a range, both included.
pub type IdRange = ([u8; 16], [u8; 16]);

/// Which sessions a listing returns: those whose id starts with a prefix and whose metadata
/// holds every given pair.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// The ids the prefix allows: a prefix of the printed id is a range of the stored one,
    /// which the id index answers.
    pub ids: Option<IdRange>,
    pub metadata: BTreeMap<String, String>,
}

impl SessionFilter {
    /// Metadata pairs one listing may ask for.
    pub const MAX_METADATA: usize = 16;

    /// `id_prefix` as ctxd prints ids (hyphenated; either case), and pairs that must all match.
    pub fn new(id_prefix: &str, metadata: BTreeMap<String, String>) -> Result<Self, super::Error> {
        if metadata.len() > Self::MAX_METADATA {
            return Err(super::Error::invalid(
                "metadata",
                format!(
                    "at most {} pairs, not {}",
                    Self::MAX_METADATA,
                    metadata.len()
                ),
            ));
        }
        if metadata.keys().any(String::is_empty) {
            return Err(super::Error::invalid("metadata", "keys must not be empty"));
        }
        Ok(Self {
            ids: id_range(id_prefix)?,
            metadata,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_none() && self.metadata.is_empty()
    }
}

/// The ids starting with `prefix`: its hex digits padded with 0s and with fs.
fn id_range(prefix: &str) -> Result<Option<IdRange>, super::Error> {
    if prefix.is_empty() {
        return Ok(None);
    }
    const HYPHENS: [usize; 4] = [8, 13, 18, 23];
    let bad = |why: String| super::Error::invalid("id_prefix", format!("{prefix:?} {why}"));
    if prefix.len() > 36 {
        return Err(bad("is longer than an id (36 characters)".into()));
    }
    let mut digits = String::with_capacity(32);
    for (i, c) in prefix.chars().enumerate() {
        match (HYPHENS.contains(&i), c) {
            (true, '-') => {}
            (false, c) if c.is_ascii_hexdigit() => digits.push(c.to_ascii_lowercase()),
            (true, _) => {
                return Err(bad(format!(
                    "cannot start an id: character {} must be '-'",
                    i + 1
                )));
            }
            (false, _) => {
                return Err(bad(format!(
                    "cannot start an id: character {} ({c:?}) is not a hex digit",
                    i + 1
                )));
            }
        }
    }
    let bytes = |pad: char| {
        let mut hex = digits.clone();
        while hex.len() < 32 {
            hex.push(pad);
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits");
        }
        out
    };
    Ok(Some((bytes('0'), bytes('f'))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_prefix_is_the_range_of_ids_it_starts() {
        let f = SessionFilter::new("0193F2A1-7", BTreeMap::new()).unwrap();
        let (lo, hi) = f.ids.unwrap();
        assert_eq!(&lo[..5], &[0x01, 0x93, 0xf2, 0xa1, 0x70]);
        assert_eq!(&hi[..5], &[0x01, 0x93, 0xf2, 0xa1, 0x7f]);
        assert!(lo[5..].iter().all(|&b| b == 0) && hi[5..].iter().all(|&b| b == 0xff));
        let id = "0193f2a1-7c3d-7e00-8000-000000000001";
        let (lo, hi) = SessionFilter::new(id, BTreeMap::new())
            .unwrap()
            .ids
            .unwrap();
        assert_eq!(lo, hi);
        assert!(SessionFilter::new("", BTreeMap::new()).unwrap().is_empty());
    }

    #[test]
    fn a_prefix_no_id_starts_with_names_the_field() {
        for bad in [
            "xyz",
            "0193f2a17",
            "0193f2a1-7c3d-7e00-8000-0000000000012",
            "0193f2a1_",
        ] {
            let e = SessionFilter::new(bad, BTreeMap::new())
                .unwrap_err()
                .to_string();
            assert!(e.contains("id_prefix"), "{bad}: {e}");
        }
        let many = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
        let e = SessionFilter::new("", many).unwrap_err().to_string();
        assert!(e.contains("metadata"), "{e}");
    }
}
