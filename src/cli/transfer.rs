//! `ctxd import` and `ctxd export`: a session file streamed to the server in chunks (with a
//! progress bar for a large one), and an export streamed back into a file or stdout.

use std::io::{IsTerminal, Write};

use super::client::{ExportFormat, Failure, ImportFormat, Result, output};
use super::connect::{Conn, call, connect, failure};
use super::show;
use crate::proto::pb;

/// Bytes per `ImportChunk`.
const CHUNK_BYTES: usize = 64 * 1024;
/// Files at least this large get a progress bar (on a terminal, without `--json`).
const PROGRESS_MIN_BYTES: usize = 1024 * 1024;

pub(super) async fn import(
    files: &[std::path::PathBuf],
    format: Option<ImportFormat>,
    meta: Vec<(String, String)>,
    conn: &Conn,
) -> Result<String> {
    let mut data = Vec::new();
    for file in files {
        let bytes =
            std::fs::read(file).map_err(|e| Failure(format!("reading {}: {e}", file.display())))?;
        data.extend_from_slice(&bytes);
        // Files are streamed as one: keep each one's last line apart from the next one's first.
        if !data.ends_with(b"\n") {
            data.push(b'\n');
        }
    }
    let format = match format {
        None => pb::ImportFormat::Unspecified,
        Some(ImportFormat::Neutral) => pb::ImportFormat::NeutralJsonl,
        Some(ImportFormat::ClaudeCode) => pb::ImportFormat::ClaudeCodeJsonl,
        Some(ImportFormat::Openai) => pb::ImportFormat::OpenaiMessages,
        Some(ImportFormat::Ctxd) => pb::ImportFormat::CtxdJsonl,
    };
    let mut client = connect(conn).await?;
    let progress = progress_bar(data.len(), conn.json);
    let chunks = chunks(data, format, meta.into_iter().collect(), progress.clone());
    let r = call("ImportSession", client.import_session(chunks)).await;
    progress.finish_and_clear();
    let r = r?;
    Ok(output(conn, &r, || show::import(&r)))
}

pub(super) async fn export(
    session: String,
    format: ExportFormat,
    branch: Option<String>,
    out: Option<&std::path::Path>,
    conn: &Conn,
) -> Result<String> {
    let format = match format {
        ExportFormat::Ctxd => pb::ExportFormat::CtxdJsonl,
        ExportFormat::Openai => pb::ExportFormat::OpenaiMessages,
        ExportFormat::ClaudeCode => pb::ExportFormat::ClaudeCodeJsonl,
    };
    let mut client = connect(conn).await?;
    let req = pb::ExportSessionRequest {
        session_id: session,
        format: format as i32,
        branch: branch.unwrap_or_default(),
    };
    let mut stream = call("ExportSession", client.export_session(req)).await?;
    let mut sink: Box<dyn Write> = match out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| Failure(format!("creating {}: {e}", path.display())))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let written = copy_chunks(&mut stream, &mut *sink).await;
    let written = written.and_then(|n| {
        sink.flush()
            .map_err(|e| Failure(format!("writing the export: {e}")))
            .map(|()| n)
    });
    drop(sink);
    match (written, out) {
        (Ok(n), Some(path)) => Ok(format!("exported {} bytes to {}\n", n, path.display())),
        (Ok(_), None) => Ok(String::new()),
        (Err(e), Some(path)) => {
            // Half an export is no export.
            let _ = std::fs::remove_file(path);
            Err(e)
        }
        (Err(e), None) => Err(e),
    }
}

/// Writes every chunk's data to `sink` and the first chunk's warnings to stderr; the bytes.
async fn copy_chunks(
    stream: &mut tonic::Streaming<pb::ExportChunk>,
    sink: &mut dyn Write,
) -> Result<usize> {
    let mut written = 0;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|s| failure("ExportSession", &s))?
    {
        for w in &chunk.warnings {
            let _ = writeln!(std::io::stderr(), "ctxd: warning: {w}");
        }
        sink.write_all(&chunk.data)
            .map_err(|e| Failure(format!("writing the export: {e}")))?;
        written += chunk.data.len();
    }
    Ok(written)
}

/// The file as a stream of chunks, the first carrying the format and metadata; the bar
/// advances as the transport takes each one.
fn chunks(
    data: Vec<u8>,
    format: pb::ImportFormat,
    metadata: std::collections::HashMap<String, String>,
    progress: indicatif::ProgressBar,
) -> impl tokio_stream::Stream<Item = pb::ImportChunk> + Send + 'static {
    let count = data.len().div_ceil(CHUNK_BYTES).max(1);
    let mut metadata = Some(metadata);
    tokio_stream::iter((0..count).map(move |i| {
        let slice =
            &data[(i * CHUNK_BYTES).min(data.len())..((i + 1) * CHUNK_BYTES).min(data.len())];
        progress.inc(slice.len() as u64);
        pb::ImportChunk {
            format: format as i32,
            metadata: metadata.take().unwrap_or_default(),
            data: slice.to_vec(),
            ..Default::default()
        }
    }))
}

fn progress_bar(len: usize, json: bool) -> indicatif::ProgressBar {
    if json || len < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "importing {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
    ) {
        bar.set_style(style);
    }
    bar
}
