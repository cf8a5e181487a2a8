//! Bad input: the status code, a message naming the field, and nothing written.

use ctxd::api::pb;
use tonic::Code;

use crate::helpers::*;
use crate::raw_codec::RawCodec;

const MALFORMED: [&str; 4] = [
    "not-a-uuid",
    "42",
    "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz",
    "01890a5d-ac96-774b-bcce-b302099a8057-extra",
];

/// A session with two nodes on main.
async fn seeded(app: &mut TestApp) -> (String, Vec<String>) {
    let s = app.create_session().await;
    let ids = app
        .append(&s, vec![user("hi"), assistant("hello")])
        .await
        .node_ids;
    (s, ids)
}

#[tokio::test]
async fn malformed_session_ids_are_invalid() {
    let mut app = spawn_app().await;
    for bad in MALFORMED {
        let c = &mut app.client;
        let field = "session_id";
        assert_status(
            c.get_session(get_session_req(bad)).await,
            Code::InvalidArgument,
            field,
        );
        assert_status(
            c.append(append_req(bad, vec![user("x")])).await,
            Code::InvalidArgument,
            field,
        );
        assert_status(
            c.get_nodes(get_nodes_req(bad, vec![unknown_id()])).await,
            Code::InvalidArgument,
            field,
        );
        assert_status(c.log(log_req(bad)).await, Code::InvalidArgument, field);
        assert_status(
            c.create_branch(create_branch_req(bad, "b", "")).await,
            Code::InvalidArgument,
            field,
        );
        assert_status(
            c.list_branches(list_branches_req(bad)).await,
            Code::InvalidArgument,
            field,
        );
        assert_status(
            c.delete_branch(delete_branch_req(bad, "b")).await,
            Code::InvalidArgument,
            field,
        );
        assert_status(
            c.render(render_req(bad, Target::Branch("main".into())))
                .await,
            Code::InvalidArgument,
            field,
        );
    }
}

#[tokio::test]
async fn malformed_node_and_function_ids_are_invalid() {
    let mut app = spawn_app().await;
    let (s, ids) = seeded(&mut app).await;
    for bad in MALFORMED {
        assert_status(
            app.client
                .get_nodes(get_nodes_req(&s, vec![ids[0].clone(), bad.into()]))
                .await,
            Code::InvalidArgument,
            "node_id",
        );
        assert_status(
            app.client
                .log(pb::LogRequest {
                    node_id: bad.into(),
                    ..log_req(&s)
                })
                .await,
            Code::InvalidArgument,
            "node_id",
        );
        assert_status(
            app.try_render(render_req(&s, Target::NodeId(bad.into())))
                .await,
            Code::InvalidArgument,
            "node_id",
        );
        assert_status(
            app.try_render(render_req(&s, Target::FunctionId(bad.into())))
                .await,
            Code::InvalidArgument,
            "function_id",
        );
        assert_status(
            app.try_append(function_req(&s, bad, vec![user("x")])).await,
            Code::InvalidArgument,
            "function_id",
        );
        assert_status(
            app.client
                .create_branch(create_branch_req(&s, "fork", bad))
                .await,
            Code::InvalidArgument,
            "from_node_id",
        );
    }
}

#[tokio::test]
async fn unknown_ids_and_names_are_not_found() {
    let mut app = spawn_app().await;
    let (s, ids) = seeded(&mut app).await;
    let nobody = unknown_id();

    // Sessions.
    assert_status(
        app.client.get_session(get_session_req(&nobody)).await,
        Code::NotFound,
        "session",
    );
    assert_status(
        app.try_append(append_req(&nobody, vec![user("x")])).await,
        Code::NotFound,
        "session",
    );
    assert_status(
        app.client.log(log_req(&nobody)).await,
        Code::NotFound,
        "session",
    );
    assert_status(
        app.client.list_branches(list_branches_req(&nobody)).await,
        Code::NotFound,
        "session",
    );
    assert_status(
        app.try_render(render_req(&nobody, Target::Branch("main".into())))
            .await,
        Code::NotFound,
        "session",
    );
    assert_status(
        app.client
            .create_branch(create_branch_req(&nobody, "b", ""))
            .await,
        Code::NotFound,
        "session",
    );

    // Branches.
    assert_status(
        app.try_append(pb::AppendRequest {
            branch: "nope".into(),
            ..append_req(&s, vec![user("x")])
        })
        .await,
        Code::NotFound,
        "branch",
    );
    assert_status(
        app.client
            .log(pb::LogRequest {
                branch: "nope".into(),
                ..log_req(&s)
            })
            .await,
        Code::NotFound,
        "branch",
    );
    assert_status(
        app.try_render(render_req(&s, Target::Branch("nope".into())))
            .await,
        Code::NotFound,
        "branch",
    );
    assert_status(
        app.client
            .delete_branch(delete_branch_req(&s, "nope"))
            .await,
        Code::NotFound,
        "branch",
    );

    // Nodes, including a node of another session.
    let elsewhere = app.create_session().await;
    let foreign = app
        .append(&elsewhere, vec![user("elsewhere")])
        .await
        .head_id;
    for missing in [nobody.clone(), foreign] {
        assert_status(
            app.client
                .get_nodes(get_nodes_req(&s, vec![ids[0].clone(), missing.clone()]))
                .await,
            Code::NotFound,
            "node",
        );
        assert_status(
            app.client
                .create_branch(create_branch_req(&s, "fork", &missing))
                .await,
            Code::NotFound,
            "node",
        );
    }
    assert_status(
        app.client
            .log(pb::LogRequest {
                node_id: nobody.clone(),
                ..log_req(&s)
            })
            .await,
        Code::NotFound,
        "node",
    );
    assert_status(
        app.try_render(render_req(&s, Target::NodeId(nobody.clone())))
            .await,
        Code::NotFound,
        "node",
    );
    assert_status(
        app.client
            .log(pb::LogRequest {
                page_token: nobody.clone(),
                ..log_req(&s)
            })
            .await,
        Code::NotFound,
        "page_token",
    );

    // Functions.
    assert_status(
        app.try_append(function_req(&s, &nobody, vec![user("x")]))
            .await,
        Code::NotFound,
        "function",
    );
    assert_status(
        app.try_render(render_req(&s, Target::FunctionId(nobody.clone())))
            .await,
        Code::NotFound,
        "function",
    );
}

#[tokio::test]
async fn malformed_nodes_are_invalid() {
    let mut app = spawn_app().await;
    let (s, _) = seeded(&mut app).await;
    let bad = |nodes: Vec<pb::NodeInput>| append_req(&s, nodes);

    assert_status(
        app.try_append(bad(vec![])).await,
        Code::InvalidArgument,
        "nodes",
    );
    assert_code(
        app.try_append(bad(vec![pb::NodeInput {
            kind: None,
            pinned: false,
        }]))
        .await,
        Code::InvalidArgument,
    );
    assert_status(
        app.try_append(bad(vec![message(
            pb::Role::Unspecified,
            vec![text("x")],
            vec![],
        )]))
        .await,
        Code::InvalidArgument,
        "role",
    );
    for role in [pb::Role::User, pb::Role::System, pb::Role::Developer] {
        assert_status(
            app.try_append(bad(vec![message(
                role,
                vec![text("x")],
                vec![call("c1", "t", "{}")],
            )]))
            .await,
            Code::InvalidArgument,
            "tool_calls",
        );
    }
    for args in ["{not json", "{\"a\":}", "[1,2"] {
        assert_status(
            app.try_append(bad(vec![assistant_calls("", vec![call("c1", "t", args)])]))
                .await,
            Code::InvalidArgument,
            "arguments_json",
        );
    }
    assert_status(
        app.try_append(bad(vec![assistant_calls("", vec![call("", "t", "{}")])]))
            .await,
        Code::InvalidArgument,
        "call_id",
    );
    assert_code(
        app.try_append(bad(vec![message(pb::Role::Assistant, vec![], vec![])]))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        app.try_append(bad(vec![message(pb::Role::User, vec![], vec![])]))
            .await,
        Code::InvalidArgument,
    );
    assert_eq!(app.log(&s, "main").await.len(), 2, "nothing was written");
}

#[tokio::test]
async fn branch_names_are_checked() {
    let mut app = spawn_app().await;
    let (s, ids) = seeded(&mut app).await;
    for name in [
        "",
        "a/../b",
        "..",
        "a..b",
        "x.",
        "/x",
        "x/",
        "a//b",
        "has space",
    ] {
        assert_status(
            app.client
                .create_branch(create_branch_req(&s, name, &ids[0]))
                .await,
            Code::InvalidArgument,
            "name",
        );
    }
    app.create_branch(&s, "feature/retry-2", &ids[0]).await;
    for name in ["feature/retry-2", "main"] {
        assert_code(
            app.client
                .create_branch(create_branch_req(&s, name, &ids[1]))
                .await,
            Code::AlreadyExists,
        );
    }
    let names: Vec<String> = app.branches(&s).await.into_iter().map(|b| b.name).collect();
    assert_eq!(names, vec!["feature/retry-2", "main"]);
    assert_eq!(app.branch(&s, "feature/retry-2").await.head_id, ids[0]);
}

#[tokio::test]
async fn an_unknown_tokenizer_is_invalid() {
    let mut app = spawn_app().await;
    let (s, _) = seeded(&mut app).await;
    assert_status(
        app.try_render(pb::RenderRequest {
            tokenizer: "gpt2-ish".into(),
            ..render_req(&s, Target::Branch("main".into()))
        })
        .await,
        Code::InvalidArgument,
        "tokenizer",
    );
}

#[tokio::test]
async fn a_batch_with_a_bad_later_node_writes_nothing() {
    let mut app = spawn_app().await;
    let (s, _) = seeded(&mut app).await;
    let head = app.branch(&s, "main").await;
    let log = app.log(&s, "main").await;
    let nodes = app.node_count().await;
    let blobs = app.blob_count().await;

    let batches = vec![
        vec![
            user("fine"),
            assistant("fine too"),
            message(pb::Role::Unspecified, vec![text("bad")], vec![]),
        ],
        vec![
            user("fine"),
            pb::NodeInput {
                kind: None,
                pinned: false,
            },
        ],
        vec![
            user("fine"),
            assistant_calls("", vec![call("c1", "t", "{}")]),
            tool_result("c1", "ok"),
            tool_result("c1", "answered twice"),
        ],
        vec![
            user("fine"),
            assistant_calls("", vec![call("c1", "t", "{}")]),
            user("while c1 is open"),
        ],
        vec![
            // Long enough to be stored as a blob rather than in the node's body.
            user(&"fresh text that must not be stored. ".repeat(64)),
            assistant_calls("", vec![call("c1", "t", "{broken")]),
        ],
    ];
    for (i, batch) in batches.into_iter().enumerate() {
        let result = app.try_append(append_req(&s, batch)).await;
        assert!(result.is_err(), "batch {i} should be refused: {result:?}");
        assert_eq!(
            app.branch(&s, "main").await,
            head,
            "batch {i}: head unchanged"
        );
        assert_eq!(app.log(&s, "main").await, log, "batch {i}: log unchanged");
        assert_eq!(app.node_count().await, nodes, "batch {i}: no node written");
    }
    assert_eq!(app.blob_count().await, blobs, "no blob written");
}

async fn raw_call(app: &TestApp, method: &str, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel(app.addr).await);
    grpc.ready().await.expect("ready");
    let path =
        http::uri::PathAndQuery::try_from(format!("/ctxd.v1.ContextStore/{method}")).expect("path");
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

/// Found by the request fuzzer: a body that is not the request's protobuf answered INTERNAL.
#[tokio::test]
async fn undecodable_requests_are_invalid_and_name_the_field() {
    use prost::Message;
    let app = spawn_app().await;
    // session_id (field 1) holding bytes that are not UTF-8.
    let not_utf8 = vec![0x0a, 0x02, 0xff, 0xfe];
    // A length prefix far past the end of the body.
    let underflow = vec![0x0a, 0xff, 0xff, 0x03, b'x'];
    // Field 1 with wire type 6, which does not exist.
    let bad_wire_type = vec![0x0e, 0x00];
    for (method, body, field) in [
        (
            "GetSession",
            not_utf8.clone(),
            "GetSessionRequest.session_id",
        ),
        ("Log", not_utf8, "LogRequest.session_id"),
        ("Append", underflow, "AppendRequest.session_id"),
        ("GetNodes", bad_wire_type, "wire type"),
    ] {
        assert_status(
            raw_call(&app, method, body).await,
            Code::InvalidArgument,
            field,
        );
    }
    // A node's role given as a string where a varint belongs.
    let mut append = append_req(&unknown_id(), vec![user("x")]).encode_to_vec();
    append.extend([0x32, 0x04, 0x0a, 0x02, 0x08, 0xff]);
    assert_status(
        raw_call(&app, "Append", append).await,
        Code::InvalidArgument,
        "AppendRequest.nodes",
    );
}

/// Found by the request fuzzer: an error quoting a huge input (a 1 MiB branch name) made a
/// `grpc-message` header past the client's HTTP/2 limit, which broke the whole connection.
#[tokio::test]
async fn errors_quoting_huge_input_stay_short_and_keep_the_connection() {
    let mut app = spawn_app().await;
    let (s, ids) = seeded(&mut app).await;
    let huge = "日本".repeat(512 * 1024);
    let status = app
        .client
        .create_branch(create_branch_req(&s, &huge, &ids[0]))
        .await
        .expect_err("a 3 MiB branch name");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("name: "),
        "{}",
        status.message()
    );
    assert!(
        status.message().len() < 2048,
        "{} bytes",
        status.message().len()
    );
    assert_status(
        app.client.get_session(get_session_req(&huge)).await,
        Code::InvalidArgument,
        "session_id",
    );
    // The same connection still serves.
    assert_eq!(app.get_session(&s).await.session_id, s);
}

/// Sends `body` as the raw HTTP/2 body of a gRPC call, framing and all, and reads the status.
async fn raw_h2_call(app: &TestApp, method: &str, body: Vec<u8>) -> tonic::Status {
    let tcp = tokio::net::TcpStream::connect(app.addr)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::post(format!("http://{}/ctxd.v1.ContextStore/{method}", app.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(request, body.is_empty()).expect("send");
    if !body.is_empty() {
        send.send_data(body.into(), true).expect("send body");
    }
    let response = response.await.expect("response");
    // Refused before any handler ran: a trailers-only answer, the status in the head.
    tonic::Status::from_header_map(response.headers()).expect("grpc-status in the head")
}

/// Found by the request fuzzer: broken gRPC framing (tonic's INTERNAL) is the caller's mistake.
#[tokio::test]
async fn broken_grpc_framing_is_invalid() {
    use prost::Message;
    let app = spawn_app().await;
    let message = get_session_req(&unknown_id()).encode_to_vec();
    let frame = |flag: u8, len: usize| {
        let mut body = vec![flag];
        body.extend(u32::try_from(len).expect("small").to_be_bytes());
        body.extend(&message);
        body
    };
    for (what, body) in [
        ("no message at all", Vec::new()),
        ("a length past the end", frame(0, message.len() + 10)),
        (
            "a compressed flag without an encoding",
            frame(1, message.len()),
        ),
        ("an invalid compressed flag", frame(7, message.len())),
        ("a body cut inside the header", vec![0, 0]),
    ] {
        let status = raw_h2_call(&app, "GetSession", body).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().starts_with("request: "),
            "{what}: {status:?}"
        );
    }
    // A well-framed message still gets through the same path (and is answered NOT_FOUND).
    let status = raw_h2_call(&app, "GetSession", frame(0, message.len())).await;
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// One row of the error table: the RPC, what was wrong, and what the answer must be.
struct Row {
    rpc: &'static str,
    case: &'static str,
    code: Code,
    /// The field or resource the message must name.
    names: &'static str,
    answer: Result<(), tonic::Status>,
}

fn row<T>(
    rpc: &'static str,
    case: &'static str,
    code: Code,
    names: &'static str,
    answer: Result<T, tonic::Status>,
) -> Row {
    Row {
        rpc,
        case,
        code,
        names,
        answer: answer.map(|_| ()),
    }
}

/// The error table of docs/api.md, RPC by RPC: each documented status, provoked, with a message
/// that names the field or resource.
#[tokio::test]
async fn every_rpc_answers_its_documented_errors() {
    let mut app = spawn_app().await;
    let (s, ids) = seeded(&mut app).await;
    let nobody = unknown_id();
    // A function with an open call inside, and a closed one.
    let f = app
        .append(
            &s,
            vec![
                user("go"),
                assistant_calls(
                    "",
                    vec![call("f1", "agent", "{}"), call("f2", "agent", "{}")],
                ),
                function_call("f1", "task", pb::Expose::Io),
                function_call("f2", "task", pb::Expose::Io),
            ],
        )
        .await
        .node_ids;
    let (open_fn, closed_fn) = (f[2].clone(), f[3].clone());
    let inner = app
        .append_in_function(
            &s,
            &open_fn,
            vec![assistant_calls("", vec![call("i1", "t", "{}")])],
        )
        .await
        .head_id;
    app.append(
        &s,
        vec![function_result("f2", "done", pb::FunctionStatus::Completed)],
    )
    .await;
    // A session whose history needs a summary under a small budget, and its plan.
    let big = four_file_reads(&mut app.client).await;
    let small = small_budget();
    let prepare = |branch: &str| pb::PrepareCompactionRequest {
        session_id: big.clone(),
        branch: branch.into(),
        budget: Some(small),
        ..Default::default()
    };
    let plan = app
        .client
        .prepare_compaction(prepare(""))
        .await
        .expect("prepare")
        .into_inner();
    assert!(plan.needed);
    let cancel = |id: &str| pb::CancelCompactionRequest {
        compaction_id: id.into(),
        reason: String::new(),
    };
    app.client
        .cancel_compaction(cancel(&plan.compaction_id))
        .await
        .expect("cancel");
    let commit = |id: &str, text: &str| pb::CommitSummaryRequest {
        compaction_id: id.into(),
        text: text.into(),
        model: String::new(),
    };
    // Three commits that write nothing on one base: Prepare then refuses.
    let guarded = four_file_reads(&mut app.client).await;
    for _ in 0..3 {
        let plan = app
            .client
            .prepare_compaction(pb::PrepareCompactionRequest {
                session_id: guarded.clone(),
                ..prepare("")
            })
            .await
            .expect("prepare")
            .into_inner();
        let outcome = app
            .client
            .commit_summary(commit(&plan.compaction_id, ""))
            .await
            .expect("commit");
        assert!(!outcome.into_inner().applied);
    }
    app.try_append(pb::AppendRequest {
        idempotency_key: "k".into(),
        ..append_req(&big, vec![user("once")])
    })
    .await
    .expect("append with a key");
    let stats = |target: pb::context_stats_request::Target| pb::ContextStatsRequest {
        session_id: s.clone(),
        target: Some(target),
        ..Default::default()
    };
    let render = |target: Target| render_req(&s, target);
    // The big session's nodes, oldest first: request, call, result, answer, four times.
    let mut turns: Vec<String> = app
        .log(&big, "main")
        .await
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    turns.reverse();
    let segment = |from: &str, to: &str| pb::PrepareCompactionRequest {
        from_node_id: from.into(),
        to_node_id: to.into(),
        ..prepare("")
    };
    let pin = |session: &str, ids: &[&str]| pb::PinRequest {
        session_id: session.into(),
        node_ids: ids.iter().map(|id| id.to_string()).collect(),
    };
    let c = &mut app.client;
    use Code::{Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound};
    let rows = vec![
        // CreateSession
        row(
            "CreateSession",
            "empty metadata key",
            InvalidArgument,
            "metadata",
            c.create_session(pb::CreateSessionRequest {
                metadata: [(String::new(), "v".into())].into(),
                ..Default::default()
            })
            .await,
        ),
        // GetSession
        row(
            "GetSession",
            "malformed id",
            InvalidArgument,
            "session_id",
            c.get_session(get_session_req("x")).await,
        ),
        row(
            "GetSession",
            "unknown session",
            NotFound,
            "session",
            c.get_session(get_session_req(&nobody)).await,
        ),
        // ListSessions
        row(
            "ListSessions",
            "malformed page token",
            InvalidArgument,
            "page_token",
            c.list_sessions(pb::ListSessionsRequest {
                page_size: 1,
                page_token: "x".into(),
                ..Default::default()
            })
            .await,
        ),
        row(
            "ListSessions",
            "an id prefix no id starts with",
            InvalidArgument,
            "id_prefix",
            c.list_sessions(pb::ListSessionsRequest {
                id_prefix: "0193f2a1_".into(),
                ..Default::default()
            })
            .await,
        ),
        row(
            "ListSessions",
            "an empty metadata key",
            InvalidArgument,
            "metadata",
            c.list_sessions(pb::ListSessionsRequest {
                metadata: [(String::new(), "v".into())].into(),
                ..Default::default()
            })
            .await,
        ),
        // Append
        row(
            "Append",
            "malformed session",
            InvalidArgument,
            "session_id",
            c.append(append_req("x", vec![user("x")])).await,
        ),
        row(
            "Append",
            "bad branch name",
            InvalidArgument,
            "branch",
            c.append(pb::AppendRequest {
                branch: "a..b".into(),
                ..append_req(&s, vec![user("x")])
            })
            .await,
        ),
        row(
            "Append",
            "malformed function",
            InvalidArgument,
            "function_id",
            c.append(function_req(&s, "x", vec![user("x")])).await,
        ),
        row(
            "Append",
            "malformed expected head",
            InvalidArgument,
            "expected_head_id",
            c.append(pb::AppendRequest {
                expected_head_id: Some("x".into()),
                ..append_req(&s, vec![user("x")])
            })
            .await,
        ),
        row(
            "Append",
            "no nodes",
            InvalidArgument,
            "nodes",
            c.append(append_req(&s, vec![])).await,
        ),
        row(
            "Append",
            "bad role",
            InvalidArgument,
            "nodes[0].message.role",
            c.append(append_req(
                &s,
                vec![message(pb::Role::Tool, vec![text("x")], vec![])],
            ))
            .await,
        ),
        row(
            "Append",
            "result for no call",
            InvalidArgument,
            "nodes[0].tool_result.call_id",
            c.append(append_req(&big, vec![tool_result("nope", "x")]))
                .await,
        ),
        row(
            "Append",
            "unknown session",
            NotFound,
            "session",
            c.append(append_req(&nobody, vec![user("x")])).await,
        ),
        row(
            "Append",
            "unknown branch",
            NotFound,
            "branch",
            c.append(pb::AppendRequest {
                branch: "nope".into(),
                ..append_req(&s, vec![user("x")])
            })
            .await,
        ),
        row(
            "Append",
            "unknown function",
            NotFound,
            "function",
            c.append(function_req(&s, &nobody, vec![user("x")])).await,
        ),
        row(
            "Append",
            "message while calls are pending",
            FailedPrecondition,
            "nodes[0]",
            c.append(function_req(&s, &open_fn, vec![user("x")])).await,
        ),
        row(
            "Append",
            "into a closed function",
            FailedPrecondition,
            "function_id",
            c.append(function_req(&s, &closed_fn, vec![user("x")]))
                .await,
        ),
        row(
            "Append",
            "idempotency key reused",
            FailedPrecondition,
            "idempotency_key",
            c.append(pb::AppendRequest {
                idempotency_key: "k".into(),
                ..append_req(&big, vec![user("twice")])
            })
            .await,
        ),
        row(
            "Append",
            "head moved",
            Aborted,
            "expected_head_id",
            c.append(pb::AppendRequest {
                expected_head_id: Some(ids[0].clone()),
                ..append_req(&s, vec![user("x")])
            })
            .await,
        ),
        // GetNodes
        row(
            "GetNodes",
            "malformed id",
            InvalidArgument,
            "node_ids[1]",
            c.get_nodes(get_nodes_req(&s, vec![ids[0].clone(), "x".into()]))
                .await,
        ),
        row(
            "GetNodes",
            "unknown session",
            NotFound,
            "session",
            c.get_nodes(get_nodes_req(&nobody, vec![])).await,
        ),
        row(
            "GetNodes",
            "unknown node",
            NotFound,
            "node_ids[0]",
            c.get_nodes(get_nodes_req(&s, vec![nobody.clone()])).await,
        ),
        // Log
        row(
            "Log",
            "branch and node",
            InvalidArgument,
            "node_id",
            c.log(pb::LogRequest {
                branch: "main".into(),
                node_id: ids[0].clone(),
                ..log_req(&s)
            })
            .await,
        ),
        row(
            "Log",
            "malformed page token",
            InvalidArgument,
            "page_token",
            c.log(pb::LogRequest {
                page_token: "x".into(),
                ..log_req(&s)
            })
            .await,
        ),
        row(
            "Log",
            "unknown session",
            NotFound,
            "session",
            c.log(log_req(&nobody)).await,
        ),
        row(
            "Log",
            "unknown branch",
            NotFound,
            "branch",
            c.log(pb::LogRequest {
                branch: "nope".into(),
                ..log_req(&s)
            })
            .await,
        ),
        row(
            "Log",
            "unknown node",
            NotFound,
            "node_id",
            c.log(pb::LogRequest {
                node_id: nobody.clone(),
                ..log_req(&s)
            })
            .await,
        ),
        row(
            "Log",
            "unknown page token",
            NotFound,
            "page_token",
            c.log(pb::LogRequest {
                page_token: nobody.clone(),
                ..log_req(&s)
            })
            .await,
        ),
        // CreateBranch
        row(
            "CreateBranch",
            "bad name",
            InvalidArgument,
            "name",
            c.create_branch(create_branch_req(&s, "-x", "")).await,
        ),
        row(
            "CreateBranch",
            "inside a function",
            InvalidArgument,
            "from_node_id",
            c.create_branch(create_branch_req(&s, "in", &inner)).await,
        ),
        row(
            "CreateBranch",
            "unknown session",
            NotFound,
            "session",
            c.create_branch(create_branch_req(&nobody, "b", "")).await,
        ),
        row(
            "CreateBranch",
            "unknown node",
            NotFound,
            "from_node_id",
            c.create_branch(create_branch_req(&s, "b", &nobody)).await,
        ),
        row(
            "CreateBranch",
            "taken name",
            AlreadyExists,
            "name",
            c.create_branch(create_branch_req(&s, "main", "")).await,
        ),
        // ListBranches
        row(
            "ListBranches",
            "malformed session",
            InvalidArgument,
            "session_id",
            c.list_branches(list_branches_req("")).await,
        ),
        row(
            "ListBranches",
            "unknown session",
            NotFound,
            "session",
            c.list_branches(list_branches_req(&nobody)).await,
        ),
        // DeleteBranch
        row(
            "DeleteBranch",
            "bad name",
            InvalidArgument,
            "name",
            c.delete_branch(delete_branch_req(&s, "")).await,
        ),
        row(
            "DeleteBranch",
            "unknown session",
            NotFound,
            "session",
            c.delete_branch(delete_branch_req(&nobody, "b")).await,
        ),
        row(
            "DeleteBranch",
            "unknown branch",
            NotFound,
            "branch",
            c.delete_branch(delete_branch_req(&s, "nope")).await,
        ),
        // Render
        row(
            "Render",
            "malformed node",
            InvalidArgument,
            "node_id",
            c.render(render(Target::NodeId("x".into()))).await,
        ),
        row(
            "Render",
            "unknown tokenizer",
            InvalidArgument,
            "tokenizer",
            c.render(pb::RenderRequest {
                tokenizer: "gpt-9".into(),
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "unknown callers",
            InvalidArgument,
            "callers",
            c.render(pb::RenderRequest {
                callers: 9,
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "unknown microcompact mode",
            InvalidArgument,
            "policy.microcompact",
            c.render(pb::RenderRequest {
                policy: Some(pb::RenderPolicy {
                    microcompact: 9,
                    ..Default::default()
                }),
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "negative cache read price",
            InvalidArgument,
            "policy.cache_read_price",
            c.render(pb::RenderRequest {
                policy: Some(pb::RenderPolicy {
                    cache_read_price: Some(-1.0),
                    ..Default::default()
                }),
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "cache write price not a number",
            InvalidArgument,
            "policy.cache_write_price",
            c.render(pb::RenderRequest {
                policy: Some(pb::RenderPolicy {
                    cache_write_price: Some(f64::NAN),
                    ..Default::default()
                }),
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "unknown reasoning",
            InvalidArgument,
            "policy.reasoning",
            c.render(pb::RenderRequest {
                model: "claude-opus-5-5".into(),
                policy: Some(pb::RenderPolicy {
                    reasoning: 7,
                    ..Default::default()
                }),
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "budget leaves nothing",
            InvalidArgument,
            "budget",
            c.render(pb::RenderRequest {
                budget: Some(pb::Budget {
                    context_window: 100,
                    output_reserve: 100,
                    ..Default::default()
                }),
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "unknown format",
            InvalidArgument,
            "format",
            c.render(pb::RenderRequest {
                format: 9,
                ..render(Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "Render",
            "unknown session",
            NotFound,
            "session",
            c.render(render_req(&nobody, Target::Branch("main".into())))
                .await,
        ),
        row(
            "Render",
            "unknown branch",
            NotFound,
            "branch",
            c.render(render(Target::Branch("nope".into()))).await,
        ),
        row(
            "Render",
            "unknown node",
            NotFound,
            "node",
            c.render(render(Target::NodeId(nobody.clone()))).await,
        ),
        row(
            "Render",
            "unknown function",
            NotFound,
            "function",
            c.render(render(Target::FunctionId(nobody.clone()))).await,
        ),
        // ContextStats
        row(
            "ContextStats",
            "malformed function",
            InvalidArgument,
            "function_id",
            c.context_stats(stats(pb::context_stats_request::Target::FunctionId(
                "x".into(),
            )))
            .await,
        ),
        row(
            "ContextStats",
            "unknown branch",
            NotFound,
            "branch",
            c.context_stats(stats(pb::context_stats_request::Target::Branch(
                "nope".into(),
            )))
            .await,
        ),
        row(
            "ContextStats",
            "cache read price not a number",
            InvalidArgument,
            "policy.cache_read_price",
            c.context_stats(pb::ContextStatsRequest {
                policy: Some(pb::RenderPolicy {
                    cache_read_price: Some(f64::NAN),
                    ..Default::default()
                }),
                ..stats(pb::context_stats_request::Target::Branch("main".into()))
            })
            .await,
        ),
        row(
            "ContextStats",
            "unknown reasoning",
            InvalidArgument,
            "policy.reasoning",
            c.context_stats(pb::ContextStatsRequest {
                policy: Some(pb::RenderPolicy {
                    reasoning: 7,
                    ..Default::default()
                }),
                ..stats(pb::context_stats_request::Target::Branch("main".into()))
            })
            .await,
        ),
        // PrepareCompaction
        row(
            "PrepareCompaction",
            "no budget",
            InvalidArgument,
            "budget",
            c.prepare_compaction(pb::PrepareCompactionRequest {
                budget: None,
                ..prepare("")
            })
            .await,
        ),
        row(
            "PrepareCompaction",
            "unknown format",
            InvalidArgument,
            "format",
            c.prepare_compaction(pb::PrepareCompactionRequest {
                format: 9,
                ..prepare("")
            })
            .await,
        ),
        row(
            "PrepareCompaction",
            "unknown session",
            NotFound,
            "session",
            c.prepare_compaction(pb::PrepareCompactionRequest {
                session_id: nobody.clone(),
                ..prepare("")
            })
            .await,
        ),
        row(
            "PrepareCompaction",
            "unknown branch",
            NotFound,
            "branch",
            c.prepare_compaction(prepare("nope")).await,
        ),
        row(
            "PrepareCompaction",
            "three fruitless commits",
            FailedPrecondition,
            "branch",
            c.prepare_compaction(pb::PrepareCompactionRequest {
                session_id: guarded.clone(),
                ..prepare("")
            })
            .await,
        ),
        row(
            "PrepareCompaction",
            "from without to",
            InvalidArgument,
            "to_node_id",
            c.prepare_compaction(segment(&turns[0], "")).await,
        ),
        row(
            "PrepareCompaction",
            "from not on the path",
            InvalidArgument,
            "from_node_id",
            c.prepare_compaction(segment(&nobody, &turns[3])).await,
        ),
        row(
            "PrepareCompaction",
            "from after to",
            InvalidArgument,
            "to_node_id",
            c.prepare_compaction(segment(&turns[4], &turns[3])).await,
        ),
        row(
            "PrepareCompaction",
            "a segment splitting a call from its result",
            InvalidArgument,
            "to_node_id",
            c.prepare_compaction(segment(&turns[0], &turns[1])).await,
        ),
        // CommitSummary
        row(
            "CommitSummary",
            "malformed id",
            InvalidArgument,
            "compaction_id",
            c.commit_summary(commit("x", "text")).await,
        ),
        row(
            "CommitSummary",
            "unknown compaction",
            NotFound,
            "compaction",
            c.commit_summary(commit(&nobody, "text")).await,
        ),
        row(
            "CommitSummary",
            "cancelled compaction",
            FailedPrecondition,
            "compaction_id",
            c.commit_summary(commit(&plan.compaction_id, "text")).await,
        ),
        // CancelCompaction
        row(
            "CancelCompaction",
            "malformed id",
            InvalidArgument,
            "compaction_id",
            c.cancel_compaction(cancel("")).await,
        ),
        row(
            "CancelCompaction",
            "unknown compaction",
            NotFound,
            "compaction",
            c.cancel_compaction(cancel(&nobody)).await,
        ),
        row(
            "CancelCompaction",
            "cancelled twice",
            FailedPrecondition,
            "compaction_id",
            c.cancel_compaction(cancel(&plan.compaction_id)).await,
        ),
        // ListSummaries
        row(
            "ListSummaries",
            "bad branch",
            InvalidArgument,
            "branch",
            c.list_summaries(pb::ListSummariesRequest {
                session_id: s.clone(),
                branch: "..".into(),
            })
            .await,
        ),
        row(
            "ListSummaries",
            "unknown session",
            NotFound,
            "session",
            c.list_summaries(pb::ListSummariesRequest {
                session_id: nobody.clone(),
                branch: String::new(),
            })
            .await,
        ),
        // Pin, Unpin
        row(
            "Pin",
            "no node ids",
            InvalidArgument,
            "node_ids",
            c.pin(pin(&s, &[])).await,
        ),
        row(
            "Pin",
            "malformed node id",
            InvalidArgument,
            "node_ids[0]",
            c.pin(pin(&s, &["nope"])).await,
        ),
        row(
            "Pin",
            "unknown session",
            NotFound,
            "session",
            c.pin(pin(&nobody, &[&ids[0]])).await,
        ),
        row(
            "Pin",
            "another session's node",
            NotFound,
            "node_ids[0]",
            c.pin(pin(&s, &[&turns[0]])).await,
        ),
        row(
            "Unpin",
            "unknown node",
            NotFound,
            "node_ids[1]",
            c.unpin(pin(&s, &[&ids[0], &nobody])).await,
        ),
        // Compact (this server has no summarizer)
        row(
            "Compact",
            "no budget",
            InvalidArgument,
            "budget",
            c.compact(pb::CompactRequest {
                session_id: big.clone(),
                ..Default::default()
            })
            .await,
        ),
        row(
            "Compact",
            "no summarizer",
            FailedPrecondition,
            "summarizer",
            c.compact(pb::CompactRequest {
                session_id: big.clone(),
                budget: Some(small),
                ..Default::default()
            })
            .await,
        ),
        // ImportSession
        row(
            "ImportSession",
            "unknown format",
            InvalidArgument,
            "format",
            c.import_session(tokio_stream::iter([import_chunk(9, b"{}")]))
                .await,
        ),
        row(
            "ImportSession",
            "not UTF-8",
            InvalidArgument,
            "data",
            c.import_session(tokio_stream::iter([import_chunk(1, [0xff])]))
                .await,
        ),
        row(
            "ImportSession",
            "empty file",
            InvalidArgument,
            "data",
            c.import_session(tokio_stream::iter(Vec::<pb::ImportChunk>::new()))
                .await,
        ),
        row(
            "ImportSession",
            "malformed line",
            InvalidArgument,
            "line 2",
            c.import_session(tokio_stream::iter([import_chunk(
                1,
                b"{\"role\": \"user\", \"content\": \"hi\"}\n{\"role\": 7}\n",
            )]))
            .await,
        ),
    ];
    let mut wrong = Vec::new();
    for r in &rows {
        match &r.answer {
            Ok(()) => wrong.push(format!("{} ({}): Ok, expected {:?}", r.rpc, r.case, r.code)),
            Err(status) => {
                let names = status
                    .message()
                    .to_lowercase()
                    .contains(&r.names.to_lowercase());
                if status.code() != r.code || !names {
                    wrong.push(format!(
                        "{} ({}): {:?} {:?}, expected {:?} naming {:?}",
                        r.rpc,
                        r.case,
                        status.code(),
                        status.message(),
                        r.code,
                        r.names
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} rows:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
}
