//! Sessions, GetNodes order and Log paging.

use std::collections::HashMap;

use ctxd::api::pb;
use tonic::Code;

use crate::helpers::*;

#[tokio::test]
async fn a_new_session_has_an_empty_main_branch() {
    let mut app = spawn_app().await;
    let metadata = HashMap::from([
        ("agent".to_string(), "coder".to_string()),
        ("ticket".to_string(), "ÄBC-123 🚀".to_string()),
    ]);
    let created = app
        .client
        .create_session(pb::CreateSessionRequest {
            metadata: metadata.clone(),
            ..Default::default()
        })
        .await
        .expect("CreateSession")
        .into_inner();

    uuid::Uuid::parse_str(&created.session_id).expect("session_id is a UUID");
    assert!(created.created_at_unix_ms > 0);
    assert_eq!(created.metadata, metadata);
    assert_eq!(created.compaction_count, 0);
    assert_eq!(created.branches.len(), 1, "{:?}", created.branches);
    assert_eq!(created.branches[0].name, "main");
    assert_eq!(created.branches[0].head_id, "");

    let fetched = app.get_session(&created.session_id).await;
    assert_eq!(fetched, created);
    assert!(app.log(&created.session_id, "main").await.is_empty());
}

#[tokio::test]
async fn get_session_shows_the_moved_head() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let appended = app.append(&s, vec![user("hello"), assistant("hi")]).await;

    assert_eq!(appended.node_ids.len(), 2);
    assert_eq!(appended.head_id, appended.node_ids[1]);
    assert!(is_hex_hash(&appended.head_hash), "{}", appended.head_hash);

    let session = app.get_session(&s).await;
    let main = session
        .branches
        .iter()
        .find(|b| b.name == "main")
        .expect("main");
    assert_eq!(main.head_id, appended.head_id);
    assert_eq!(main.head_hash, appended.head_hash);
}

#[tokio::test]
async fn list_sessions_is_newest_first_and_paged() {
    let mut app = spawn_app().await;
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(app.create_session().await);
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    // Default page size (50) holds them all.
    let all = app
        .client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("ListSessions")
        .into_inner();
    let ids: Vec<String> = all.sessions.iter().map(|s| s.session_id.clone()).collect();
    assert_eq!(ids, newest_first);
    assert_eq!(all.next_page_token, "");

    // Pages of two: 2 + 2 + 1, the last one without a token.
    let mut paged = Vec::new();
    let mut sizes = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("ListSessions page")
            .into_inner();
        sizes.push(page.sessions.len());
        paged.extend(page.sessions.into_iter().map(|s| s.session_id));
        if page.next_page_token.is_empty() {
            break;
        }
        assert!(sizes.len() < 10, "paging does not end");
        token = page.next_page_token;
    }
    assert_eq!(sizes, vec![2, 2, 1]);
    assert_eq!(paged, newest_first);
}

#[tokio::test]
async fn get_nodes_answers_in_the_order_asked() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(&s, vec![user("one"), assistant("two"), user("three")])
        .await
        .node_ids;

    let asked = vec![ids[2].clone(), ids[0].clone(), ids[1].clone()];
    let nodes = app.get_nodes(&s, &asked).await;
    let got: Vec<String> = nodes.iter().map(|n| n.node_id.clone()).collect();
    assert_eq!(got, asked);
    let texts: Vec<String> = nodes
        .iter()
        .map(|n| match n.content.as_ref().and_then(|c| c.kind.as_ref()) {
            Some(pb::node_input::Kind::Message(m)) => text_of(&m.parts),
            other => panic!("expected a message, got {other:?}"),
        })
        .collect();
    assert_eq!(texts, vec!["three", "one", "two"]);
}

#[tokio::test]
async fn log_walks_parents_newest_first_with_paging() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let node = if i % 2 == 0 {
            user(&format!("u{i}"))
        } else {
            assistant(&format!("a{i}"))
        };
        ids.extend(app.append(&s, vec![node]).await.node_ids);
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();

    // Default limit, default branch.
    let page = app
        .client
        .log(pb::LogRequest {
            session_id: s.clone(),
            ..Default::default()
        })
        .await
        .expect("Log")
        .into_inner();
    let got: Vec<String> = page.nodes.iter().map(|n| n.node_id.clone()).collect();
    assert_eq!(got, newest_first);
    assert_eq!(page.next_page_token, "");

    // Parent links: each node's parent is the next older one; the first has none.
    for pair in page.nodes.windows(2) {
        assert_eq!(pair[0].parent_id, pair[1].node_id);
    }
    assert_eq!(page.nodes.last().expect("nodes").parent_id, "");

    // Pages of three: 3 + 3 + 1.
    let mut req = pb::LogRequest {
        session_id: s.clone(),
        branch: "main".into(),
        limit: 3,
        ..Default::default()
    };
    let mut sizes = Vec::new();
    let mut paged = Vec::new();
    loop {
        let page = app
            .client
            .log(req.clone())
            .await
            .expect("Log page")
            .into_inner();
        sizes.push(page.nodes.len());
        paged.extend(page.nodes.into_iter().map(|n| n.node_id));
        if page.next_page_token.is_empty() {
            break;
        }
        assert!(sizes.len() < 10, "paging does not end");
        req.page_token = page.next_page_token;
    }
    assert_eq!(sizes, vec![3, 3, 1]);
    assert_eq!(paged, newest_first);

    // From a node: that node and its ancestors.
    let from_node = app
        .log_all(pb::LogRequest {
            session_id: s.clone(),
            node_id: ids[3].clone(),
            ..Default::default()
        })
        .await;
    let got: Vec<String> = from_node.into_iter().map(|n| n.node_id).collect();
    assert_eq!(
        got,
        vec![
            ids[3].clone(),
            ids[2].clone(),
            ids[1].clone(),
            ids[0].clone()
        ]
    );
}

/// A CreateSession retried with its idempotency key (its answer lost, say) returns the session
/// the first call made, as it is now; the key with other metadata is refused; keys are the
/// caller's own, so another key makes another session.
#[tokio::test]
async fn create_session_with_a_key_creates_once() {
    let mut app = spawn_app().await;
    let request = |key: &str, value: &str| pb::CreateSessionRequest {
        metadata: [("agent".to_owned(), value.to_owned())].into(),
        idempotency_key: key.into(),
    };
    let first = app
        .client
        .create_session(request("create-1", "a"))
        .await
        .expect("create")
        .into_inner();
    app.append(&first.session_id, vec![user("hello")]).await;
    let again = app
        .client
        .create_session(request("create-1", "a"))
        .await
        .expect("the retry")
        .into_inner();
    assert_eq!(again.session_id, first.session_id, "the same session");
    assert_ne!(
        again.branches[0].head_id, "",
        "as it is now: with its append"
    );
    let refused = app.client.create_session(request("create-1", "b")).await;
    assert_status(refused, Code::FailedPrecondition, "idempotency_key");
    let other = app
        .client
        .create_session(request("create-2", "a"))
        .await
        .expect("another key")
        .into_inner();
    assert_ne!(other.session_id, first.session_id);
    assert_eq!(app.session_count().await, 2, "nothing else was created");
}

/// Sessions of `metadata`, newest last.
async fn sessions_with(app: &mut TestApp, metadata: &[&[(&str, &str)]]) -> Vec<String> {
    let mut ids = Vec::new();
    for pairs in metadata {
        let created = app
            .client
            .create_session(pb::CreateSessionRequest {
                metadata: pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                ..Default::default()
            })
            .await
            .expect("CreateSession")
            .into_inner();
        ids.push(created.session_id);
    }
    ids
}

/// Every page of `filter`, `page_size` at a time.
async fn listed(app: &mut TestApp, filter: pb::ListSessionsRequest) -> Vec<String> {
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .client
            .list_sessions(pb::ListSessionsRequest {
                page_token: token,
                ..filter.clone()
            })
            .await
            .expect("ListSessions")
            .into_inner();
        ids.extend(page.sessions.into_iter().map(|s| s.session_id));
        token = page.next_page_token;
        if token.is_empty() {
            return ids;
        }
        assert!(ids.len() < 100, "paging does not end");
    }
}

#[tokio::test]
async fn list_sessions_filters_by_metadata_and_id_prefix_on_the_server_and_pages_the_matches() {
    let mut app = spawn_app().await;
    let ids = sessions_with(
        &mut app,
        &[
            &[("team", "a"), ("run", "1")],
            &[("team", "b")],
            &[("team", "a"), ("run", "2")],
            &[("team", "a")],
            &[],
            // A value that only looks like another pair must not match it.
            &[("team", "a=run")],
        ],
    )
    .await;
    let meta = |pairs: &[(&str, &str)]| pb::ListSessionsRequest {
        metadata: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };

    // Newest first; every pair must match; one at a time pages through exactly the matches.
    let team_a = vec![ids[3].clone(), ids[2].clone(), ids[0].clone()];
    assert_eq!(listed(&mut app, meta(&[("team", "a")])).await, team_a);
    let paged = listed(
        &mut app,
        pb::ListSessionsRequest {
            page_size: 1,
            ..meta(&[("team", "a")])
        },
    )
    .await;
    assert_eq!(paged, team_a);
    assert_eq!(
        listed(&mut app, meta(&[("team", "a"), ("run", "2")])).await,
        vec![ids[2].clone()]
    );
    assert!(listed(&mut app, meta(&[("team", "c")])).await.is_empty());
    assert!(
        listed(&mut app, meta(&[("run", "1"), ("team", "b")]))
            .await
            .is_empty()
    );

    // An id prefix, in either case, of any length up to the whole id.
    for cut in [1, 9, 19, 36] {
        let prefix = &ids[4][..cut];
        let found = listed(
            &mut app,
            pb::ListSessionsRequest {
                id_prefix: prefix.to_uppercase(),
                ..Default::default()
            },
        )
        .await;
        assert!(found.contains(&ids[4]), "{prefix}: {found:?}");
        assert!(
            found.iter().all(|id| id.starts_with(prefix)),
            "{prefix}: {found:?}"
        );
    }
    let whole = pb::ListSessionsRequest {
        id_prefix: ids[0].clone(),
        ..meta(&[("team", "a")])
    };
    assert_eq!(listed(&mut app, whole).await, vec![ids[0].clone()]);
    let not_that_team = pb::ListSessionsRequest {
        id_prefix: ids[1].clone(),
        ..meta(&[("team", "a")])
    };
    assert!(listed(&mut app, not_that_team).await.is_empty());
}

#[tokio::test]
async fn a_sessions_node_count_holds_every_branch_and_its_functions_chains() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                user("Ask the researcher"),
                assistant_calls("", vec![call("c1", "researcher", "{}")]),
                function_call("c1", "x", pb::Expose::None),
            ],
        )
        .await
        .node_ids;
    app.append_in_function(&s, &ids[2], vec![user("x"), assistant("42")])
        .await;
    app.client
        .create_branch(pb::CreateBranchRequest {
            session_id: s.clone(),
            name: "alt".into(),
            from_node_id: ids[0].clone(),
        })
        .await
        .expect("CreateBranch");
    app.append_branch(&s, "alt", vec![assistant("Another way")])
        .await;
    // 3 on main, 2 inside the function, 1 on the branch.
    assert_eq!(app.get_session(&s).await.node_count, 6);
    let listed = app
        .client
        .list_sessions(pb::ListSessionsRequest {
            id_prefix: s.clone(),
            ..Default::default()
        })
        .await
        .expect("ListSessions")
        .into_inner()
        .sessions;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].node_count, 6);
}
