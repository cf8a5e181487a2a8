//! Tenants: with API keys, every session belongs to the key's tenant, and another tenant's ids
//! answer exactly like ids that do not exist, without a byte of the owner's data.

use std::net::SocketAddr;

use ctxd::api::auth::ApiKeys;
use ctxd::api::pb;
use ctxd::server::Options;
use pb::context_store_client::ContextStoreClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::helpers::*;

const ACME_KEY: &str = "acme-6f1d0c2b9e8a4c31";
const GLOBEX_KEY: &str = "globex-0a7e55d3c1b24f96";
/// In every piece of acme's data, so any leak of it shows.
const SECRET: &str = "acme-confidential-7c1e";

type KeyedClient = ContextStoreClient<InterceptedService<Channel, Bearer>>;

#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

async fn keyed(addr: SocketAddr, key: &str) -> KeyedClient {
    let bearer = Bearer(format!("Bearer {key}").parse().expect("ASCII"));
    ContextStoreClient::with_interceptor(channel(addr).await, bearer)
}

/// A server with two tenants' keys, on 127.0.0.1:0 over a fresh file; stops when dropped.
async fn two_tenants() -> (tempfile::TempDir, Server) {
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
    acme.create_branch(pb::CreateBranchRequest {
        session_id: session.clone(),
        name: "fork".into(),
        from_node_id: node.clone(),
    })
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
async fn probe(
    client: &mut KeyedClient,
    which: usize,
    ids: &Ids,
    own: &str,
) -> Result<String, Status> {
    let s = ids.session.clone();
    let render = |session: &str, target| pb::RenderRequest {
        session_id: session.into(),
        target: Some(target),
        ..Default::default()
    };
    use pb::render_request::Target;
    let debug = |r: &dyn std::fmt::Debug| format!("{r:?}");
    match which {
        0 => client
            .get_session(pb::GetSessionRequest { session_id: s })
            .await
            .map(|r| debug(&r.into_inner())),
        1 => client
            .list_branches(pb::ListBranchesRequest { session_id: s })
            .await
            .map(|r| debug(&r.into_inner())),
        2 => client
            .log(pb::LogRequest {
                session_id: s,
                ..Default::default()
            })
            .await
            .map(|r| debug(&r.into_inner())),
        3 => client
            .log(pb::LogRequest {
                session_id: s,
                node_id: ids.node.clone(),
                ..Default::default()
            })
            .await
            .map(|r| debug(&r.into_inner())),
        4 => client
            .get_nodes(pb::GetNodesRequest {
                session_id: s,
                node_ids: vec![ids.node.clone()],
            })
            .await
            .map(|r| debug(&r.into_inner())),
        5 => client
            .append(append_req(&s, vec![user("hello")]))
            .await
            .map(|r| debug(&r.into_inner())),
        6 => client
            .append(function_req(&s, &ids.function, vec![user("hello")]))
            .await
            .map(|r| debug(&r.into_inner())),
        7 => client
            .create_branch(pb::CreateBranchRequest {
                session_id: s,
                name: "mine".into(),
                from_node_id: ids.node.clone(),
            })
            .await
            .map(|r| debug(&r.into_inner())),
        8 => client
            .delete_branch(pb::DeleteBranchRequest {
                session_id: s,
                name: "fork".into(),
            })
            .await
            .map(|r| debug(&r.into_inner())),
        9 => client
            .render(render(&s, Target::Branch("main".into())))
            .await
            .map(|r| debug(&r.into_inner())),
        10 => client
            .render(render(&s, Target::NodeId(ids.node.clone())))
            .await
            .map(|r| debug(&r.into_inner())),
        11 => client
            .render(render(&s, Target::FunctionId(ids.function.clone())))
            .await
            .map(|r| debug(&r.into_inner())),
        12 => client
            .context_stats(pb::ContextStatsRequest {
                session_id: s,
                ..Default::default()
            })
            .await
            .map(|r| debug(&r.into_inner())),
        13 => client
            .prepare_compaction(prepare_req(&s))
            .await
            .map(|r| debug(&r.into_inner())),
        14 => client
            .compact(pb::CompactRequest {
                session_id: s,
                budget: Some(small_budget()),
                ..Default::default()
            })
            .await
            .map(|r| debug(&r.into_inner())),
        15 => client
            .commit_summary(pb::CommitSummaryRequest {
                compaction_id: ids.compaction.clone(),
                text: "short".into(),
                model: "m".into(),
            })
            .await
            .map(|r| debug(&r.into_inner())),
        16 => client
            .cancel_compaction(pb::CancelCompactionRequest {
                compaction_id: ids.compaction.clone(),
                reason: String::new(),
            })
            .await
            .map(|r| debug(&r.into_inner())),
        17 => client
            .list_summaries(pb::ListSummariesRequest {
                session_id: s,
                branch: String::new(),
            })
            .await
            .map(|r| debug(&r.into_inner())),
        // From the caller's own session, at the other tenant's nodes and function.
        18 => client
            .get_nodes(pb::GetNodesRequest {
                session_id: own.into(),
                node_ids: vec![ids.node.clone()],
            })
            .await
            .map(|r| debug(&r.into_inner())),
        19 => client
            .create_branch(pb::CreateBranchRequest {
                session_id: own.into(),
                name: "stolen".into(),
                from_node_id: ids.node.clone(),
            })
            .await
            .map(|r| debug(&r.into_inner())),
        20 => client
            .render(render(own, Target::NodeId(ids.node.clone())))
            .await
            .map(|r| debug(&r.into_inner())),
        21 => client
            .append(function_req(own, &ids.function, vec![user("hello")]))
            .await
            .map(|r| debug(&r.into_inner())),
        22 => client
            .log(pb::LogRequest {
                session_id: own.into(),
                node_id: ids.node.clone(),
                ..Default::default()
            })
            .await
            .map(|r| debug(&r.into_inner())),
        _ => unreachable!("{PROBES} probes"),
    }
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
    let mut acme = keyed(server.addr, ACME_KEY).await;
    let mut globex = keyed(server.addr, GLOBEX_KEY).await;
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
        .log(pb::LogRequest {
            session_id: ids.session.clone(),
            ..Default::default()
        })
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
        .log(pb::LogRequest {
            session_id: ids.session.clone(),
            ..Default::default()
        })
        .await
        .expect("acme's log")
        .into_inner();
    assert_eq!(before, after, "globex's calls changed nothing of acme's");
    let branches = acme
        .list_branches(pb::ListBranchesRequest {
            session_id: ids.session.clone(),
        })
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
    let mut acme = keyed(server.addr, ACME_KEY).await;
    let mut globex = keyed(server.addr, GLOBEX_KEY).await;
    let mut mine = Vec::new();
    for i in 0..5 {
        for (client, owner) in [(&mut acme, "acme"), (&mut globex, "globex")] {
            let id = client
                .create_session(pb::CreateSessionRequest {
                    metadata: [("owner".to_owned(), format!("{owner}-{i}"))].into(),
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
            let refused = client
                .get_session(pb::GetSessionRequest {
                    session_id: id.clone(),
                })
                .await;
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
    let refused = acme
        .get_session(pb::GetSessionRequest {
            session_id: imported.clone(),
        })
        .await;
    assert_status(refused, Code::NotFound, "session");
    globex
        .get_session(pb::GetSessionRequest {
            session_id: imported,
        })
        .await
        .expect("the importer reads it");
}
