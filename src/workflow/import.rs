//! Importing a session file: parsed off the I/O threads into a plan (its own metadata under the
//! caller's), every part checked against the size limit, then written whole through the same
//! checks as an append.

use std::collections::BTreeMap;

use super::{Error, Workflows};
use crate::domain::{History, Session, Tenant};
use crate::import::{self, Source};
use crate::store::CreationKey;

/// A file parsed and ready to write.
pub struct Parsed {
    pub source: Source,
    pub plan: History,
    /// The caller's metadata, with the file's own (ctxd JSONL carries it) under it.
    pub metadata: BTreeMap<String, String>,
}

impl Workflows {
    /// Parses `data` as `source`; every part at most `max_part_bytes`.
    pub async fn parse_import(
        &self,
        source: Source,
        data: Vec<u8>,
        metadata: BTreeMap<String, String>,
        max_part_bytes: usize,
    ) -> Result<Parsed, Error> {
        // Parsing a file of many megabytes is CPU work: off the I/O threads.
        let mut plan = tokio::task::spawn_blocking(move || import::parse(source, &data))
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "import parse failed");
                Error::Task("the import")
            })??;
        let mut metadata = metadata;
        for (k, v) in std::mem::take(&mut plan.metadata) {
            metadata.entry(k).or_insert(v);
        }
        for op in &plan.ops {
            if let import::Op::Node { content, line, .. } = op {
                content.check_part_sizes(&format!("line {line}"), max_part_bytes)?;
            }
        }
        Ok(Parsed {
            source,
            plan,
            metadata,
        })
    }

    /// Writes a parsed file as a new session of `tenant` (once per `key`).
    pub async fn import(
        &self,
        tenant: &Tenant,
        parsed: &Parsed,
        key: Option<&CreationKey>,
    ) -> Result<Session, Error> {
        let session = self
            .store
            .import(tenant, parsed.metadata.clone(), &parsed.plan, key)
            .await?;
        metrics::counter!("ctxd_imported_sessions_total").increment(1);
        Ok(session)
    }
}
