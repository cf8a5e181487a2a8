//! ExportSession: a session streamed out at one consistent head, as ctxd JSONL or one branch in
//! a provider's format.
//!
//! The store reads the session at the heads it finds (`Store::snapshot`); the pure exporter
//! (`crate::export`) writes it piece by piece on a blocking thread, and the pieces go out in
//! chunks of about `CHUNK_BYTES` through a small channel, so a slow reader holds back the
//! writer instead of the whole file piling up as one string.

use std::pin::Pin;

use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::parse::{self, parse};
use super::service::{ContextStoreService, Reply, split};
use super::{convert, domain_status, pb, status};
use crate::domain::Error;
use crate::export::{self, Target};

pub type ExportStream = Pin<Box<dyn Stream<Item = Result<pb::ExportChunk, Status>> + Send>>;

/// About how much data a chunk carries (a piece is never split, so one may be larger).
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks written ahead of the reader.
const CHUNKS_AHEAD: usize = 4;

impl ContextStoreService {
    pub(super) async fn export(
        &self,
        request: Request<pb::ExportSessionRequest>,
    ) -> Reply<ExportStream> {
        let (tenant, request) = split(request);
        let session = parse::session_id(&request.session_id)?;
        let target = export_target(request.format, &request.branch)?;
        let scoped = self.scope(&tenant, session).await?;
        let snapshot = self.store.snapshot(scoped).await.map_err(status)?;
        if let Target::OpenAi(branch) | Target::ClaudeCode(branch) = &target
            && !snapshot
                .session
                .branches
                .iter()
                .any(|b| b.name.as_str() == branch)
        {
            return Err(domain_status(Error::not_found("branch", branch)));
        }
        let branches: Vec<pb::Branch> = snapshot
            .session
            .branches
            .iter()
            .cloned()
            .map(convert::branch)
            .collect();
        let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
        tokio::task::spawn_blocking(move || {
            let export = match export::export(&snapshot, &target) {
                Ok(export) => export,
                Err(e) => {
                    let _ = tx.blocking_send(Err(domain_status(e)));
                    return;
                }
            };
            let mut chunk = pb::ExportChunk {
                data: Vec::new(),
                branches,
                warnings: export.warnings,
            };
            let mut first = true;
            for piece in export.pieces {
                chunk.data.extend_from_slice(piece.as_bytes());
                if chunk.data.len() >= CHUNK_BYTES {
                    let full = std::mem::take(&mut chunk);
                    first = false;
                    // The reader went away: stop writing.
                    if tx.blocking_send(Ok(full)).is_err() {
                        return;
                    }
                }
            }
            if first || !chunk.data.is_empty() {
                let _ = tx.blocking_send(Ok(chunk));
            }
        });
        let stream: ExportStream = Box::pin(ReceiverStream::new(rx));
        Ok(Response::new(stream))
    }
}

/// The format asked for, with the branch a one-branch format exports (default `main`).
fn export_target(format: i32, branch: &str) -> Result<Target, Status> {
    let branch = || parse::branch_or_main("branch", branch).map(|b| b.as_str().to_owned());
    match pb::ExportFormat::try_from(format) {
        Ok(pb::ExportFormat::Unspecified | pb::ExportFormat::CtxdJsonl) => Ok(Target::Ctxd),
        Ok(pb::ExportFormat::OpenaiMessages) => Ok(Target::OpenAi(branch()?)),
        Ok(pb::ExportFormat::ClaudeCodeJsonl) => Ok(Target::ClaudeCode(branch()?)),
        Err(_) => parse(Err(Error::invalid(
            "format",
            format!("unknown value {format}"),
        ))),
    }
}
