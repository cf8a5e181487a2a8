//! Tenants: with API keys, every session belongs to the key's tenant, and another tenant's ids
//! answer exactly like ids that do not exist, without a byte of the owner's data.

use ctxd::api::pb;
use ctxd::auth::ApiKeys;
use ctxd::server::Options;
use tonic::{Code, Status};

use crate::helpers::*;

const ACME_KEY: &str = "acme-6f1d0c2b9e8a4c31";
const GLOBEX_KEY: &str = "globex-0a7e55d3c1b24f96";
/// In every piece of acme's data, so any leak of it shows.
const SECRET: &str = "acme-confidential-7c1e";

/// A server with two tenants' keys, on 127.0.0.1:0 over a fresh database; stops when dropped.
async fn two_tenants() -> (TestDb, Server) {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(&keys, format!("acme {ACME_KEY}\nglobex {GLOBEX_KEY}\n")).expect("keys");
    serve_fresh(Options {
        api_keys: Some(ApiKeys::load(keys.path()).expect("the keys file")),
        ..Options::default()
    })
    .await
}

/// The ids of one tenant's data that another tenant will probe with.
#[derive(Clone)]
struct Ids {
    session: String,
    node: String,
    function: String,
    compaction: String,
}

impl Ids {
    /// Ids of the same shapes that exist nowhere.
    fn unknown() -> Self {
        Self {
            session: unknown_id(),
            node: unknown_id(),
            function: unknown_id(),
            compaction: unknown_id(),
        }
    }

    fn all(&self) -> [&str; 4] {
        [&self.session, &self.node, &self.function, &self.compaction]
    }
}

/// Acme's session: messages, a tool round, a finished sub-agent, a branch and an open
/// compaction, each holding the secret.
async fn acme_data(acme: &mut KeyedClient) -> Ids {
    let session = acme
        .create_session(pb::CreateSessionRequest {
            metadata: [("project".to_owned(), SECRET.to_owned())].into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner()
        .session_id;
    let append = |nodes: Vec<pb::NodeInput>| append_req(&session, nodes);
    let mut nodes = Vec::new();
    for turn in 0..4 {
        let call_id = format!("read-{turn}");
        nodes.extend([
            user(&format!("{SECRET}: look at file {turn}")),
            assistant_calls("reading", vec![call(&call_id, "read_file", "{}")]),
            tool_result(&call_id, &big_text(3000, SECRET)),
            assistant(&format!("file {turn} holds {SECRET}")),
        ]);
    }
    nodes.extend([
        user(&format!("delegate {SECRET}")),
        assistant_calls("delegating", vec![call("task-1", "research", "{}")]),
        function_call("task-1", SECRET, pb::Expose::Io),
    ]);
    let appended = acme
        .append(append(nodes))
        .await
        .expect("append")
        .into_inner();
    let function = appended.head_id.clone();
    acme.append(function_req(
        &session,
        &function,
        vec![user(SECRET), assistant(SECRET)],
    ))
    .await
    .expect("function chain");
    acme.append(append(vec![function_result(
        "task-1",
        SECRET,
        pb::FunctionStatus::Completed,
    )]))
    .await
    .expect("function result");
    let node = appended.node_ids[1].clone();
    acme.create_branch(create_branch_req(&session, "fork", &node))
        .await
        .expect("branch");
    let prepared = acme
        .prepare_compaction(prepare_req(&session))
        .await
        .expect("prepare")
        .into_inner();
    assert!(
        prepared.needed,
        "the session is over the budget: a plan is stored"
    );
    Ids {
        session,
        node,
        function,
        compaction: prepared.compaction_id,
    }
}

fn prepare_req(session: &str) -> pb::PrepareCompactionRequest {
    pb::PrepareCompactionRequest {
        session_id: session.into(),
        budget: Some(small_budget()),
        ..Default::default()
    }
}

/// Every way a caller can name another tenant's session, node, function or compaction. `own`
/// is a session of the caller's, for probes that aim at foreign nodes from it.
const PROBES: usize = 23;

/// Probe `which` with `ids`; the answer as text (an OK answer would be a leak in itself).
async fn probe(c: &mut KeyedClient, which: usize, ids: &Ids, own: &str) -> Result<String, Status> {
    let s = ids.session.clone();
    match which {
        0 => shown(c.get_session(get_session_req(&s)).await),
        1 => shown(c.list_branches(list_branches_req(&s)).await),
        2 => shown(c.log(log_req(&s)).await),
        3 => shown(
            c.log(pb::LogRequest {
                node_id: ids.node.clone(),
                ..log_req(&s)
            })
            .await,
        ),
        4 => shown(c.get_nodes(get_nodes_req(&s, vec![ids.node.clone()])).await),
        5 => shown(c.append(append_req(&s, vec![user("hello")])).await),
        6 => shown(
            c.append(function_req(&s, &ids.function, vec![user("hello")]))
                .await,
        ),
        7 => shown(
            c.create_branch(create_branch_req(&s, "mine", &ids.node))
                .await,
        ),
        8 => shown(c.delete_branch(delete_branch_req(&s, "fork")).await),
        9 => shown(
            c.render(render_req(&s, Target::Branch("main".into())))
                .await,
        ),
        10 => shown(
            c.render(render_req(&s, Target::NodeId(ids.node.clone())))
                .await,
        ),
        11 => shown(
            c.render(render_req(&s, Target::FunctionId(ids.function.clone())))
                .await,
        ),
        12 => shown(
            c.context_stats(pb::ContextStatsRequest {
                session_id: s,
                ..Default::default()
            })
            .await,
        ),
        13 => shown(c.prepare_compaction(prepare_req(&s)).await),
        14 => shown(
            c.compact(pb::CompactRequest {
                session_id: s,
                budget: Some(small_budget()),
                ..Default::default()
            })
            .await,
        ),
        15 => shown(
            c.commit_summary(pb::CommitSummaryRequest {
                compaction_id: ids.compaction.clone(),
                text: "short".into(),
                model: "m".into(),
            })
            .await,
        ),
        16 => shown(
            c.cancel_compaction(pb::CancelCompactionRequest {
                compaction_id: ids.compaction.clone(),
                reason: String::new(),
            })
            .await,
        ),
        17 => shown(
            c.list_summaries(pb::ListSummariesRequest {
                session_id: s,
                branch: String::new(),
            })
            .await,
        ),
        // From the caller's own session, at the other tenant's nodes and function.
        18 => shown(
            c.get_nodes(get_nodes_req(own, vec![ids.node.clone()]))
                .await,
        ),
        19 => shown(
            c.create_branch(create_branch_req(own, "stolen", &ids.node))
                .await,
        ),
        20 => shown(
            c.render(render_req(own, Target::NodeId(ids.node.clone())))
                .await,
        ),
        21 => shown(
            c.append(function_req(own, &ids.function, vec![user("hello")]))
                .await,
        ),
        22 => shown(
            c.log(pb::LogRequest {
                node_id: ids.node.clone(),
                ..log_req(own)
            })
            .await,
        ),
        _ => unreachable!("{PROBES} probes"),
    }
}

/// An answer as text.
fn shown<T: std::fmt::Debug>(answer: Result<tonic::Response<T>, Status>) -> Result<String, Status> {
    answer.map(|r| format!("{:?}", r.into_inner()))
}

/// A refusal with the probed ids replaced, so answers about different ids compare equal.
fn normalized(status: &Status, ids: &Ids) -> (Code, String, Vec<u8>) {
    let mut message = status.message().to_owned();
    for id in ids.all() {
        message = message.replace(id, "<id>");
    }
    (status.code(), message, status.details().to_vec())
}

#[tokio::test]
async fn another_tenants_ids_answer_like_unknown_ones_and_leak_nothing() {
    let (_dir, server) = two_tenants().await;
    let mut acme = keyed_client(server.addr, ACME_KEY).await;
    let mut globex = keyed_client(server.addr, GLOBEX_KEY).await;
    let ids = acme_data(&mut acme).await;
    let own = globex
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("globex's own session")
        .into_inner()
        .session_id;
    globex
        .append(append_req(&own, vec![user("globex's own message")]))
        .await
        .expect("globex appends to its own session");
    let before = acme
        .log(log_req(&ids.session))
        .await
        .expect("acme's log")
        .into_inner();

    // A thousand calls with acme's ids, each beside the same call with ids that exist nowhere.
    let mut calls = 0;
    for round in 0..44 {
        for which in 0..PROBES {
            let unknown = Ids::unknown();
            let foreign = probe(&mut globex, which, &ids, &own).await;
            let nowhere = probe(&mut globex, which, &unknown, &own).await;
            calls += 1;
            let foreign = foreign.expect_err(&format!("probe {which} must be refused"));
            let nowhere = nowhere.expect_err(&format!("probe {which} with unknown ids"));
            assert_eq!(
                normalized(&foreign, &ids),
                normalized(&nowhere, &unknown),
                "probe {which} (round {round}) tells acme's ids from unknown ones"
            );
            assert_eq!(foreign.code(), Code::NotFound, "probe {which}: {foreign:?}");
            let leaked = format!("{foreign:?}");
            assert!(
                !leaked.contains(SECRET),
                "probe {which} leaked acme's data: {leaked}"
            );
        }
    }
    assert!(calls >= 1000, "{calls} calls");

    // Globex lists only its own session; acme's data is whole and its plan still open.
    let listed = globex
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("list")
        .into_inner();
    let listed: Vec<_> = listed
        .sessions
        .iter()
        .map(|s| s.session_id.as_str())
        .collect();
    assert_eq!(listed, [own.as_str()], "globex sees only its own session");
    let after = acme
        .log(log_req(&ids.session))
        .await
        .expect("acme's log")
        .into_inner();
    assert_eq!(before, after, "globex's calls changed nothing of acme's");
    let branches = acme
        .list_branches(list_branches_req(&ids.session))
        .await
        .expect("acme's branches")
        .into_inner()
        .branches;
    let names: Vec<_> = branches.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names.len(), 2, "main and fork, untouched: {names:?}");
    let outcome = acme
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: ids.compaction.clone(),
            text: "acme looked at four files".into(),
            model: "m".into(),
        })
        .await
        .expect("acme's plan is still open for acme")
        .into_inner();
    assert!(outcome.applied, "{outcome:?}");
}

#[tokio::test]
async fn each_tenant_lists_and_reads_only_its_own_sessions() {
    let (_dir, server) = two_tenants().await;
    let mut acme = keyed_client(server.addr, ACME_KEY).await;
    let mut globex = keyed_client(server.addr, GLOBEX_KEY).await;
    let mut mine = Vec::new();
    for i in 0..5 {
        for (client, owner) in [(&mut acme, "acme"), (&mut globex, "globex")] {
            let id = client
                .create_session(pb::CreateSessionRequest {
                    metadata: [("owner".to_owned(), format!("{owner}-{i}"))].into(),
                    ..Default::default()
                })
                .await
                .expect("create")
                .into_inner()
                .session_id;
            mine.push((owner, id));
        }
    }
    for (client, owner) in [(&mut acme, "acme"), (&mut globex, "globex")] {
        // Two pages of two, then the last one: paging stays within the tenant.
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = client
                .list_sessions(pb::ListSessionsRequest {
                    page_size: 2,
                    page_token: token,
                    ..Default::default()
                })
                .await
                .expect("list")
                .into_inner();
            seen.extend(page.sessions.into_iter().map(|s| s.session_id));
            token = page.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        let expected: Vec<_> = mine
            .iter()
            .rev()
            .filter(|(o, _)| *o == owner)
            .map(|(_, id)| id.clone())
            .collect();
        assert_eq!(
            seen, expected,
            "{owner} lists its own sessions, newest first"
        );
        for (_, id) in mine.iter().filter(|(o, _)| *o != owner) {
            let refused = client.get_session(get_session_req(id)).await;
            assert_status(refused, Code::NotFound, "session");
        }
    }

    // An imported session belongs to the importer too.
    let imported = globex
        .import_session(tokio_stream::iter([pb::ImportChunk {
            data: br#"{"role": "user", "content": "globex's imported note"}"#.to_vec(),
            ..Default::default()
        }]))
        .await
        .expect("import")
        .into_inner()
        .session
        .expect("the new session")
        .session_id;
    let refused = acme.get_session(get_session_req(&imported)).await;
    assert_status(refused, Code::NotFound, "session");
    globex
        .get_session(get_session_req(&imported))
        .await
        .expect("the importer reads it");
}
