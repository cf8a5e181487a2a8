//! A server restarted on the same file answers exactly as before.

use ctxd::api::pb;
use pb::{Callers, Expose, FunctionStatus};

use crate::helpers::*;

/// Everything a client can read about one session.
#[derive(Debug, PartialEq)]
struct Snapshot {
    session: pb::Session,
    sessions: Vec<pb::Session>,
    branches: Vec<pb::Branch>,
    main_log: Vec<pb::Node>,
    alt_log: Vec<pb::Node>,
    function_chain: Vec<pb::Node>,
    renders: Vec<pb::RenderResponse>,
}

async fn snapshot(app: &mut TestApp, s: &str, fc: &str, inner: &[String], node: &str) -> Snapshot {
    let sessions = app
        .client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("ListSessions")
        .into_inner()
        .sessions;
    let mut renders = Vec::new();
    for tokenizer in ["", "o200k_base", "cl100k_base"] {
        for target in [
            Target::Branch("main".into()),
            Target::Branch("alt".into()),
            Target::FunctionId(fc.into()),
            Target::NodeId(node.into()),
        ] {
            renders.push(
                app.render(pb::RenderRequest {
                    tokenizer: tokenizer.into(),
                    ..render_req(s, target)
                })
                .await,
            );
        }
    }
    renders.push(
        app.render(pb::RenderRequest {
            callers: Callers::None as i32,
            ..render_req(s, Target::FunctionId(fc.into()))
        })
        .await,
    );
    Snapshot {
        session: app.get_session(s).await,
        sessions,
        branches: app.branches(s).await,
        main_log: app.log(s, "main").await,
        alt_log: app.log(s, "alt").await,
        function_chain: app.get_nodes(s, inner).await,
        renders,
    }
}

#[tokio::test]
async fn everything_survives_a_restart() {
    let mut app = spawn_app().await;
    let other = app.create_session().await;
    app.append(&other, vec![user("another session")]).await;

    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                system("You are careful."),
                message(
                    pb::Role::User,
                    vec![
                        text("Summarise this picture. 絵 🖼️"),
                        media_data("image/png", vec![137, 80, 78, 71, 0, 255]),
                        media_url("image/jpeg", "https://example.com/a.jpg"),
                    ],
                    vec![],
                ),
                assistant_calls(
                    "Delegating.",
                    vec![
                        call("c1", "vision", r#"{"detail":"high"}"#),
                        call("c2", "clock", "{}"),
                    ],
                ),
                tool_error("c2", "clock unavailable"),
                function_call("c1", "describe", Expose::Full),
            ],
        )
        .await
        .node_ids;
    let fc = ids[4].clone();
    let inner = app
        .append_in_function(&s, &fc, vec![user("describe"), assistant("A cat.")])
        .await
        .node_ids;
    app.append(
        &s,
        vec![
            function_result("c1", "A cat.", FunctionStatus::Completed),
            assistant("It shows a cat."),
        ],
    )
    .await;
    app.create_branch(&s, "alt", &ids[1]).await;
    app.append_branch(&s, "alt", vec![assistant("No tools needed.")])
        .await;

    let before = snapshot(&mut app, &s, &fc, &inner, &ids[3]).await;
    assert_eq!(before.sessions.len(), 2);
    assert_eq!(before.main_log.len(), 7);
    assert!(before.renders.iter().all(|r| r.total_tokens > 0));

    app.restart().await;
    let after = snapshot(&mut app, &s, &fc, &inner, &ids[3]).await;
    assert_eq!(after, before);

    // And the restarted server keeps writing on top of the same history.
    let next = app.append(&s, vec![user("Thanks!")]).await;
    let node = app.get_nodes(&s, &next.node_ids).await.remove(0);
    assert_eq!(node.parent_id, before.main_log[0].node_id);
}
