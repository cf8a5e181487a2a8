//! `ImportSession`: a session file streamed in, parsed and written as a new session.

use std::collections::{BTreeMap, HashMap};

use tonic::Request;

use super::parse::{self};
use super::reply::{self};
use super::{convert, domain_status, pb, workflow_status};
use crate::domain::Error;
use crate::import;
use crate::store::CreationKey;

use super::service::{ContextStoreService, Reply, split};

/// The largest session file an import takes; it is parsed in memory.
const MAX_IMPORT_BYTES: usize = 512 * 1024 * 1024;

impl ContextStoreService {
    pub(super) async fn import(
        &self,
        request: Request<tonic::Streaming<pb::ImportChunk>>,
    ) -> Reply<pb::ImportSessionResponse> {
        let (tenant, mut stream) = split(request);
        let mut first: Option<(i32, HashMap<String, String>, String)> = None;
        let mut data = Vec::new();
        while let Some(chunk) = stream.message().await? {
            if data.len() + chunk.data.len() > MAX_IMPORT_BYTES {
                return Err(domain_status(Error::invalid(
                    "data",
                    format!("larger than {MAX_IMPORT_BYTES} bytes"),
                )));
            }
            first.get_or_insert((chunk.format, chunk.metadata, chunk.idempotency_key));
            data.extend_from_slice(&chunk.data);
        }
        let (format, metadata, idempotency_key) = first.unwrap_or_default();
        // Room for the counts and a note on left-out warnings (below).
        self.reply_fits(
            reply::new_session_len(&metadata) + reply::WARNINGS_NOTE_BYTES,
            "metadata",
            "send less metadata",
        )?;
        let source = parse::import_source(format, &data)?;
        let metadata: BTreeMap<String, String> = metadata.into_iter().collect();
        let key = CreationKey::import(idempotency_key, format, &metadata, &data);
        let parsed = self
            .workflows
            .parse_import(source, data, metadata, self.limits.max_part_bytes)
            .await
            .map_err(workflow_status)?;
        // The file's own metadata must fit the reply too; checked before anything is written.
        let merged: HashMap<String, String> = parsed.metadata.clone().into_iter().collect();
        self.reply_fits(
            reply::new_session_len(&merged) + reply::WARNINGS_NOTE_BYTES,
            "data",
            "the file's metadata is too large for the reply",
        )?;
        let session = self
            .workflows
            .import(&tenant, &parsed, key.as_ref())
            .await
            .map_err(workflow_status)?;
        let plan = parsed.plan;
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut response = pb::ImportSessionResponse {
            session: Some(convert::session(session)),
            nodes: count(plan.nodes()),
            functions: count(plan.functions()),
            summaries: count(plan.summaries()),
            format: match source {
                import::Source::NeutralJsonl => pb::ImportFormat::NeutralJsonl,
                import::Source::ClaudeCodeJsonl => pb::ImportFormat::ClaudeCodeJsonl,
                import::Source::OpenAiMessages => pb::ImportFormat::OpenaiMessages,
                import::Source::CtxdJsonl => pb::ImportFormat::CtxdJsonl,
                // The contract has no value for it yet: detected, never named.
                import::Source::GeminiCliSession => pb::ImportFormat::Unspecified,
            }
            .into(),
            warnings: plan.warnings,
        };
        // The session is written: the reply must go out, so warnings make room if need be.
        reply::fit_warnings(&mut response, self.limits.max_response_bytes);
        self.reply(response)
    }
}
