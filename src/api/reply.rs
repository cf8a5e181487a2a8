//! The response size cap: every reply is measured before it is sent, so a client gets
//! RESOURCE_EXHAUSTED saying what to ask for instead of a reply it cannot decode.

use prost::Message;
use tonic::{Response, Status};

use super::pb;

/// A response message, with what a caller can do when it is over the cap.
pub(super) trait Capped: Message + Sized {
    const ADVICE: &'static str = "raise --max-response-bytes on the server (and the client's \
                                  receive limit)";
}

/// `message`, or RESOURCE_EXHAUSTED when it encodes to more than `max` bytes.
pub(super) fn capped<T: Capped>(message: T, max: usize) -> Result<Response<T>, Status> {
    let len = message.encoded_len();
    if len > max {
        return Err(too_big(len, max, T::ADVICE));
    }
    Ok(Response::new(message))
}

fn too_big(len: usize, max: usize, advice: &str) -> Status {
    Status::resource_exhausted(too_big_message(len, max, advice))
}

pub(super) fn too_big_message(len: usize, max: usize, advice: &str) -> String {
    format!(
        "the response would be {len} bytes, over the server's limit of {max} \
         (--max-response-bytes): {advice}"
    )
}

impl Capped for pb::Session {
    const ADVICE: &'static str = "the session's metadata or branches are too large to send; \
                                  raise --max-response-bytes on the server";
}

impl Capped for pb::ListSessionsResponse {
    const ADVICE: &'static str = "ask for a smaller page_size";
}

impl Capped for pb::AppendResponse {
    const ADVICE: &'static str = "append fewer nodes per call";
}

impl Capped for pb::GetNodesResponse {
    const ADVICE: &'static str = "ask for fewer node_ids per call";
}

impl Capped for pb::LogResponse {
    const ADVICE: &'static str = "ask for a smaller limit per page";
}

impl Capped for pb::RenderResponse {
    const ADVICE: &'static str = "render under a budget, leave format unset to skip \
                                  messages_json, or ask ContextStats for the report alone";
}

impl Capped for pb::PrepareCompactionResponse {
    const ADVICE: &'static str = "the summary input is too large to send; leave format unset \
                                  to skip summary_input_json, or use Compact, which summarizes \
                                  inside the server";
}

impl Capped for pb::ImportSessionResponse {
    const ADVICE: &'static str = "import with smaller metadata";
}

impl Capped for pb::RecallResponse {
    const ADVICE: &'static str = "ask for a smaller max_chars";
}

impl Capped for pb::RecallToolResponse {}
impl Capped for pb::Branch {}
impl Capped for pb::ListBranchesResponse {}
impl Capped for pb::DeleteBranchResponse {}
impl Capped for pb::ContextReport {}
impl Capped for pb::CompactionOutcome {}
impl Capped for pb::CancelCompactionResponse {}
impl Capped for pb::ListSummariesResponse {}
impl Capped for pb::PinResponse {}

/// The encoded size of an `AppendResponse` for `nodes` nodes, known before anything is written.
pub(super) fn append_response_len(nodes: usize) -> usize {
    // Ids are hyphenated UUIDs, hashes 64 hex digits.
    const ID: &str = "00000000-0000-0000-0000-000000000000";
    let head = pb::AppendResponse {
        node_ids: vec![],
        head_id: ID.to_owned(),
        head_hash: "0".repeat(64),
    }
    .encoded_len();
    head + nodes.saturating_mul(prost::encoding::string::encoded_len(1, &ID.to_owned()))
}

/// The encoded size of a new session's reply (`CreateSession`, `ImportSession`) before it is
/// created: its metadata plus an upper bound for the rest.
pub(super) fn new_session_len(metadata: &std::collections::HashMap<String, String>) -> usize {
    use prost::encoding::{hash_map, string};
    let rest = pb::Session {
        session_id: "00000000-0000-0000-0000-000000000000".to_owned(),
        created_at_unix_ms: i64::MAX,
        metadata: Default::default(),
        compaction_count: u32::MAX,
        branches: vec![pb::Branch {
            name: "main".to_owned(),
            updated_at_unix_ms: i64::MAX,
            ..Default::default()
        }],
        gateway: None,
        node_count: u64::MAX,
    }
    .encoded_len();
    rest + hash_map::encoded_len(string::encoded_len, string::encoded_len, 3, metadata)
}

/// Room kept in an import's reply for its counts and the note on left-out warnings.
pub(super) const WARNINGS_NOTE_BYTES: usize = 128;

/// Leaves out the warnings an import's reply has no room for, saying how many.
pub(super) fn fit_warnings(response: &mut pb::ImportSessionResponse, max: usize) {
    if response.encoded_len() <= max {
        return;
    }
    let warnings = std::mem::take(&mut response.warnings);
    let room = max.saturating_sub(response.encoded_len() + WARNINGS_NOTE_BYTES);
    let mut used = 0;
    let kept = warnings
        .iter()
        .take_while(|w| {
            used += prost::encoding::string::encoded_len(6, w);
            used <= room
        })
        .count();
    let left_out = warnings.len() - kept;
    response.warnings = warnings;
    response.warnings.truncate(kept);
    response.warnings.push(format!(
        "{left_out} more warnings left out to keep the reply under --max-response-bytes"
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_append_response_length_is_exact() {
        for n in [1, 2, 100] {
            let id = uuid::Uuid::now_v7().to_string();
            let real = pb::AppendResponse {
                node_ids: vec![id.clone(); n],
                head_id: id,
                head_hash: "ab".repeat(32),
            };
            assert_eq!(append_response_len(n), real.encoded_len());
        }
    }

    #[test]
    fn warnings_make_room_in_an_import_reply() {
        let mut response = pb::ImportSessionResponse {
            warnings: (0..1000).map(|i| format!("line {i}: repaired")).collect(),
            ..Default::default()
        };
        let max = 4096;
        fit_warnings(&mut response, max);
        assert!(response.encoded_len() <= max);
        let note = response.warnings.last().unwrap();
        let kept = response.warnings.len() - 1;
        assert!(kept > 100, "{kept}");
        assert!(
            note.starts_with(&format!("{} more warnings", 1000 - kept)),
            "{note}"
        );
    }

    #[test]
    fn the_new_session_length_bounds_the_real_one() {
        let metadata: std::collections::HashMap<String, String> =
            [("k".to_owned(), "v".repeat(1000))].into();
        let real = pb::Session {
            session_id: uuid::Uuid::now_v7().to_string(),
            created_at_unix_ms: 1_700_000_000_000,
            metadata: metadata.clone(),
            compaction_count: 0,
            branches: vec![pb::Branch {
                name: "main".to_owned(),
                updated_at_unix_ms: 1_700_000_000_000,
                ..Default::default()
            }],
            gateway: None,
            node_count: 1_000_000,
        };
        let bound = new_session_len(&metadata);
        assert!(bound >= real.encoded_len() && bound < real.encoded_len() + 32);
    }
}
