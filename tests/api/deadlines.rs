//! Deadlines: an append whose deadline passes mid-write is stored whole or not at all, and a
//! retry with its idempotency key returns the one stored answer.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ctxd::api::pb;
use tokio::task::JoinSet;
use tonic::Code;

use crate::helpers::*;

const SESSIONS: usize = 4;
const PER_SESSION: usize = 40;

/// One turn of four nodes, every one of them marked with `key`.
fn turn(key: &str) -> Vec<pb::NodeInput> {
    let call_id = format!("{key}-call");
    vec![
        user(&format!("{key} asks")),
        assistant_calls("", vec![call(&call_id, "lookup", "{}")]),
        tool_result(&call_id, &format!("{key} result")),
        assistant(&format!("{key} answers")),
    ]
}

/// The key a node of [`turn`] carries.
fn key_of(node: &pb::Node) -> String {
    use pb::node_input::Kind;
    match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::Message(m)) if m.parts.is_empty() => {
            m.tool_calls[0].call_id.trim_end_matches("-call").to_owned()
        }
        Some(Kind::Message(m)) => text_of(&m.parts)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned(),
        Some(Kind::ToolResult(r)) => r.call_id.trim_end_matches("-call").to_owned(),
        other => panic!("unexpected node {other:?}"),
    }
}

/// A stored append: its node ids oldest first, and the hash of its last node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    node_ids: Vec<String>,
    head_hash: String,
}

/// Reads every session's main branch and checks it is one linear chain of whole turns, each
/// key at most once. Returns what each key stored.
async fn stored_turns(app: &mut TestApp, sessions: &[String]) -> HashMap<String, Stored> {
    let mut stored = HashMap::new();
    for session in sessions {
        let names: Vec<String> = app
            .branches(session)
            .await
            .into_iter()
            .map(|b| b.name)
            .collect();
        assert_eq!(names, ["main"], "no branch appeared");
        let mut nodes = app.log(session, "main").await;
        for pair in nodes.windows(2) {
            assert_eq!(pair[0].parent_id, pair[1].node_id, "one linear chain");
        }
        if let Some(root) = nodes.last() {
            assert_eq!(root.parent_id, "", "the chain starts at the root");
        }
        nodes.reverse();
        assert_eq!(
            nodes.len() % 4,
            0,
            "whole turns only: {} nodes",
            nodes.len()
        );
        for group in nodes.chunks(4) {
            let key = key_of(&group[0]);
            for node in group {
                assert_eq!(key_of(node), key, "the nodes of one append stay together");
            }
            let turn = Stored {
                node_ids: group.iter().map(|n| n.node_id.clone()).collect(),
                head_hash: group[3].hash.clone(),
            };
            assert!(
                stored.insert(key.clone(), turn).is_none(),
                "{key} was applied twice"
            );
        }
    }
    stored
}

#[track_caller]
fn assert_answer_is_stored(key: &str, answer: &pb::AppendResponse, stored: &Stored) {
    assert_eq!(
        answer.node_ids, stored.node_ids,
        "{key}: the answer's node ids"
    );
    assert_eq!(
        &answer.head_id,
        stored.node_ids.last().unwrap(),
        "{key}: the answer's head"
    );
    assert_eq!(
        answer.head_hash, stored.head_hash,
        "{key}: the answer's head hash"
    );
}

#[tokio::test]
async fn appends_past_their_deadline_are_all_or_nothing_and_a_retry_answers_what_is_stored() {
    let mut app = spawn_app().await;
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(app.create_session().await);
    }
    let request = |session: &str, key: &str| pb::AppendRequest {
        idempotency_key: key.to_owned(),
        ..append_req(session, turn(key))
    };

    // Every append at once, with deadlines of 0 to 5 ms; every tenth has time to finish.
    let mut calls = JoinSet::new();
    for i in 0..SESSIONS * PER_SESSION {
        let session = sessions[i % SESSIONS].clone();
        let key = format!("k{i:03}");
        let mut rpc = tonic::Request::new(request(&session, &key));
        rpc.set_timeout(if i % 10 == 9 {
            Duration::from_secs(60)
        } else {
            Duration::from_millis((i % 6) as u64)
        });
        let mut client = app.client.clone();
        calls.spawn(async move { (key, client.append(rpc).await) });
    }
    let mut first = HashMap::new();
    while let Some(joined) = calls.join_next().await {
        let (key, answer) = joined.expect("join");
        match answer {
            Ok(answer) => {
                first.insert(key, Some(answer.into_inner()));
            }
            Err(status) => {
                assert!(
                    matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
                    "{key}: only the deadline may fail an append: {status:?}"
                );
                first.insert(key, None);
            }
        }
    }

    // A timed-out handler is never polled again, so whatever it queued was queued before its
    // status went out; the committer takes appends in order, so once this one is answered,
    // every earlier one is committed or dropped.
    let barrier = app.create_session().await;
    app.append(&barrier, vec![user("barrier")]).await;

    let before = stored_turns(&mut app, &sessions).await;
    let (mut acknowledged, mut stored_anyway, mut absent) = (0, 0, 0);
    for (key, answer) in &first {
        match (answer, before.get(key)) {
            (Some(answer), Some(stored)) => {
                acknowledged += 1;
                assert_answer_is_stored(key, answer, stored);
            }
            (Some(_), None) => panic!("{key} was acknowledged but is not stored"),
            (None, Some(_)) => stored_anyway += 1,
            (None, None) => absent += 1,
        }
    }
    println!(
        "{acknowledged} acknowledged, {stored_anyway} stored though the deadline passed, \
         {absent} absent"
    );
    assert!(
        acknowledged > 0 && stored_anyway + absent > 0,
        "some appends finished and some deadlines passed, or the test proves little"
    );

    // Retries without a deadline: each returns the stored answer, or appends the turn once.
    let mut retried = HashMap::new();
    for i in 0..SESSIONS * PER_SESSION {
        let key = format!("k{i:03}");
        let answer = app
            .try_append(request(&sessions[i % SESSIONS], &key))
            .await
            .unwrap_or_else(|e| panic!("retry of {key}: {e:?}"));
        if let Some(stored) = before.get(&key) {
            assert_answer_is_stored(&key, &answer, stored);
        }
        if let Some(Some(first)) = first.get(&key) {
            assert_eq!(&answer, first, "{key}: the retry repeats the first answer");
        }
        retried.insert(key, answer);
    }
    let after = stored_turns(&mut app, &sessions).await;
    assert_eq!(
        after.keys().collect::<HashSet<_>>(),
        retried.keys().collect::<HashSet<_>>(),
        "every key stored exactly once"
    );
    for (key, answer) in &retried {
        assert_answer_is_stored(key, answer, &after[key]);
    }
}
