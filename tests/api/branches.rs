//! Branches: forks keep their own history; hashes identify histories.

use ctxd::api::pb;
use tonic::Code;

use crate::helpers::*;

fn conversation() -> Vec<pb::NodeInput> {
    vec![
        system("You are terse."),
        user("Name a prime."),
        assistant("7"),
        user("Another one?"),
        assistant("11"),
    ]
}

#[tokio::test]
async fn a_fork_at_an_older_node_keeps_its_own_history() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app.append(&s, conversation()).await.node_ids;
    let fork_point = app.get_nodes(&s, &ids[2..3]).await.remove(0);

    let alt = app.create_branch(&s, "alt", &ids[2]).await;
    assert_eq!(alt.name, "alt");
    assert_eq!(alt.head_id, ids[2]);
    assert_eq!(alt.head_hash, fork_point.hash);

    let main_tip = app.append(&s, vec![user("And a third?")]).await;
    let alt_tip = app
        .append_branch(&s, "alt", vec![user("An even prime?"), assistant("2")])
        .await;
    assert_eq!(
        app.get_nodes(&s, &alt_tip.node_ids[..1]).await[0].parent_id,
        ids[2],
        "the first node on the fork hangs under the fork point"
    );

    let main = app.render_branch(&s, "main").await;
    assert_eq!(
        transcript(&main.messages),
        vec![
            "system: You are terse.",
            "user: Name a prime.",
            "assistant: 7",
            "user: Another one?",
            "assistant: 11",
            "user: And a third?",
        ]
    );
    let alt = app.render_branch(&s, "alt").await;
    assert_eq!(
        transcript(&alt.messages),
        vec![
            "system: You are terse.",
            "user: Name a prime.",
            "assistant: 7",
            "user: An even prime?",
            "assistant: 2",
        ]
    );
    assert_eq!(main.head_id, main_tip.head_id);
    assert_eq!(alt.head_id, alt_tip.head_id);
    assert_eq!(main.head_hash, main_tip.head_hash);
    assert_eq!(alt.head_hash, alt_tip.head_hash);
    assert_ne!(main.head_hash, alt.head_hash);

    let log: Vec<String> = app
        .log(&s, "alt")
        .await
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    let want: Vec<String> = alt_tip
        .node_ids
        .iter()
        .rev()
        .chain(ids[..3].iter().rev())
        .cloned()
        .collect();
    assert_eq!(log, want);
}

#[tokio::test]
async fn branches_are_listed_by_name_and_deleting_one_keeps_the_rest() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app.append(&s, conversation()).await.node_ids;

    app.create_branch(&s, "zeta", &ids[4]).await;
    let alt_tip = {
        app.create_branch(&s, "alt", &ids[2]).await;
        app.append_branch(&s, "alt", vec![user("Only on alt.")])
            .await
    };
    let empty = app.create_branch(&s, "feature/empty", "").await;
    assert_eq!(empty.head_id, "", "a branch from no node has no head");

    let names: Vec<String> = app.branches(&s).await.into_iter().map(|b| b.name).collect();
    assert_eq!(names, vec!["alt", "feature/empty", "main", "zeta"]);
    let session = app.get_session(&s).await;
    assert_eq!(session.branches.len(), 4);

    let main_before = app.render_branch(&s, "main").await;
    app.delete_branch(&s, "alt").await;

    let names: Vec<String> = app.branches(&s).await.into_iter().map(|b| b.name).collect();
    assert_eq!(names, vec!["feature/empty", "main", "zeta"]);
    assert_eq!(app.render_branch(&s, "main").await, main_before);
    assert_eq!(app.branch(&s, "zeta").await.head_id, ids[4]);

    // The ref is gone, its nodes are not.
    let nodes = app.get_nodes(&s, &alt_tip.node_ids).await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].parent_id, ids[2]);
    assert_code(
        app.try_render(render_req(&s, Target::Branch("alt".into())))
            .await,
        Code::NotFound,
    );
    let by_node = app
        .render(render_req(&s, Target::NodeId(alt_tip.head_id.clone())))
        .await;
    assert_eq!(by_node.messages.len(), 4);

    // The name is free again.
    let again = app.create_branch(&s, "alt", &alt_tip.head_id).await;
    assert_eq!(again.head_id, alt_tip.head_id);
}

#[tokio::test]
async fn equal_histories_have_equal_head_hashes() {
    let mut app = spawn_app().await;
    let a = app.create_session().await;
    let b = app.create_session().await;
    let c = app.create_session().await;

    let on_a = app.append(&a, conversation()).await;
    let on_b = app.append(&b, conversation()).await;
    let mut different = conversation();
    different[3] = user("Another one!");
    let on_c = app.append(&c, different).await;

    assert_eq!(
        on_a.head_hash, on_b.head_hash,
        "same content, same hash across sessions"
    );
    assert_ne!(on_a.node_ids, on_b.node_ids);
    assert_ne!(
        on_a.head_hash, on_c.head_hash,
        "one different message changes the head hash"
    );
    assert_eq!(app.branch(&b, "main").await.head_hash, on_a.head_hash);
    assert_eq!(
        app.render_branch(&b, "main").await.head_hash,
        on_a.head_hash
    );

    // The nodes before the difference still hash alike.
    let a_nodes = app.get_nodes(&a, &on_a.node_ids).await;
    let c_nodes = app.get_nodes(&c, &on_c.node_ids).await;
    let a_hashes: Vec<&str> = a_nodes.iter().map(|n| n.hash.as_str()).collect();
    let c_hashes: Vec<&str> = c_nodes.iter().map(|n| n.hash.as_str()).collect();
    assert_eq!(a_hashes[..3], c_hashes[..3]);
    assert_ne!(a_hashes[3], c_hashes[3]);

    // Re-appending the same message on a fork reproduces the original hash.
    app.create_branch(&a, "redo", &on_a.node_ids[2]).await;
    let redo = app
        .append_branch(&a, "redo", vec![user("Another one?")])
        .await;
    assert_eq!(redo.head_hash, a_hashes[3]);
}

fn reset_req(session: &str, name: &str, to: &str) -> pb::ResetBranchRequest {
    pb::ResetBranchRequest {
        session_id: session.into(),
        name: name.into(),
        to_node_id: to.into(),
        expected_head_id: None,
    }
}

/// ResetBranch moves a head back (or to none) without touching a node: the next append hangs
/// under the new head, with its pairing state, and the nodes it left stay readable.
#[tokio::test]
async fn a_reset_moves_the_head_and_keeps_every_node() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app.append(&s, conversation()).await.node_ids;
    let before = app.get_nodes(&s, &ids[2..3]).await.remove(0);

    let moved = app
        .client
        .reset_branch(pb::ResetBranchRequest {
            expected_head_id: Some(ids[4].clone()),
            ..reset_req(&s, "main", &ids[2])
        })
        .await
        .expect("ResetBranch")
        .into_inner();
    assert_eq!(
        (moved.head_id.as_str(), moved.head_hash),
        (ids[2].as_str(), before.hash)
    );
    assert_eq!(
        transcript(&app.render_branch(&s, "main").await.messages),
        [
            "system: You are terse.",
            "user: Name a prime.",
            "assistant: 7"
        ]
    );
    let next = app.append(&s, vec![user("Another?")]).await;
    assert_eq!(app.get_nodes(&s, &next.node_ids).await[0].parent_id, ids[2]);
    assert_eq!(
        app.get_nodes(&s, &ids).await.len(),
        5,
        "the nodes left stay"
    );

    // To no head: the branch starts over.
    let cleared = app
        .client
        .reset_branch(reset_req(&s, "main", ""))
        .await
        .expect("ResetBranch to none")
        .into_inner();
    assert_eq!(
        (cleared.head_id.as_str(), cleared.head_hash.as_str()),
        ("", "")
    );
    assert!(app.render_branch(&s, "main").await.messages.is_empty());
    let fresh = app.append(&s, vec![user("again")]).await;
    assert_eq!(app.get_nodes(&s, &fresh.node_ids).await[0].parent_id, "");
}

/// A reset whose expected head is stale is ABORTED and moves nothing; bad targets name their
/// field; an unknown branch is NOT_FOUND.
#[tokio::test]
async fn a_reset_checks_its_head_and_its_target() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app.append(&s, conversation()).await.node_ids;

    let stale = app
        .client
        .reset_branch(pb::ResetBranchRequest {
            expected_head_id: Some(ids[3].clone()),
            ..reset_req(&s, "main", &ids[1])
        })
        .await;
    assert_status(stale, Code::Aborted, "expected_head_id");
    assert_eq!(
        head_of(&mut app.client, &s, "main").await,
        ids[4],
        "nothing moved"
    );

    let unknown = app
        .client
        .reset_branch(reset_req(&s, "main", &unknown_id()))
        .await;
    assert_status(unknown, Code::NotFound, "to_node_id");
    let garbage = app.client.reset_branch(reset_req(&s, "main", "nope")).await;
    assert_status(garbage, Code::InvalidArgument, "to_node_id");
    let no_branch = app
        .client
        .reset_branch(reset_req(&s, "gone", &ids[1]))
        .await;
    assert_code(no_branch, Code::NotFound);

    let function = app
        .append(
            &s,
            vec![
                assistant_calls("", vec![call("f1", "researcher", "{}")]),
                function_call("f1", "look it up", pb::Expose::Io),
            ],
        )
        .await
        .head_id;
    let inner = app
        .append_in_function(&s, &function, vec![user("inside")])
        .await
        .head_id;
    let inside = app.client.reset_branch(reset_req(&s, "main", &inner)).await;
    assert_status(inside, Code::InvalidArgument, "to_node_id");
}
