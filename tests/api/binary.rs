//! The `ctxd serve` binary, and health and reflection (through the binary and `serve()`).

use std::path::Path;

use ctxd::api::pb;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::{v1, v1alpha};

use crate::daemon::{Daemon, Serve};
use crate::helpers::*;

const SERVICE: &str = "ctxd.v1.ContextStore";

/// `ctxd serve` on port 0 over `db`, bound to loopback as it says.
async fn start(db: &Path) -> Daemon {
    let daemon = Daemon::start(db, &[]).await;
    assert!(daemon.addr.ip().is_loopback(), "{}", daemon.addr);
    assert_ne!(daemon.addr.port(), 0, "the real port is printed");
    daemon
}

async fn assert_serving(channel: Channel) {
    let mut health = HealthClient::new(channel);
    for service in ["", SERVICE] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health check {service:?}: {e:?}"))
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await;
    assert_code(unknown, tonic::Code::NotFound);
}

async fn reflected_services_v1(channel: Channel) -> Vec<String> {
    use v1::server_reflection_request::MessageRequest;
    use v1::server_reflection_response::MessageResponse;
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let requests = vec![
        v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(SERVICE.into())),
        },
    ];
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("reflection v1")
        .into_inner();
    let services = match stream
        .message()
        .await
        .expect("v1 answer")
        .map(|r| r.message_response)
    {
        Some(Some(MessageResponse::ListServicesResponse(list))) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("expected a service list, got {other:?}"),
    };
    match stream
        .message()
        .await
        .expect("v1 answer")
        .map(|r| r.message_response)
    {
        Some(Some(MessageResponse::FileDescriptorResponse(files))) => {
            assert!(!files.file_descriptor_proto.is_empty());
        }
        other => panic!("expected the descriptor of {SERVICE}, got {other:?}"),
    }
    services
}

async fn reflected_services_v1alpha(channel: Channel) -> Vec<String> {
    use v1alpha::server_reflection_request::MessageRequest;
    use v1alpha::server_reflection_response::MessageResponse;
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1alpha")
        .into_inner();
    match stream
        .message()
        .await
        .expect("v1alpha answer")
        .map(|r| r.message_response)
    {
        Some(Some(MessageResponse::ListServicesResponse(list))) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("expected a service list, got {other:?}"),
    }
}

async fn assert_reflection(channel: Channel) {
    let v1 = reflected_services_v1(channel.clone()).await;
    assert!(v1.iter().any(|s| s == SERVICE), "v1 lists {v1:?}");
    let v1alpha = reflected_services_v1alpha(channel).await;
    assert!(
        v1alpha.iter().any(|s| s == SERVICE),
        "v1alpha lists {v1alpha:?}"
    );
}

#[tokio::test]
async fn serve_answers_health_and_reflection() {
    let app = spawn_app().await;
    assert_serving(channel(app.addr).await).await;
    assert_reflection(channel(app.addr).await).await;
}

#[tokio::test]
async fn the_binary_serves_stops_on_signals_and_keeps_its_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");

    let daemon = start(&db).await;
    assert_serving(channel(daemon.addr).await).await;
    assert_reflection(channel(daemon.addr).await).await;

    let mut client = connect(daemon.addr).await;
    let session = new_session(&mut client).await;
    let appended = client
        .append(append_req(
            &session,
            vec![user("remember me"), assistant("sure")],
        ))
        .await
        .expect("Append")
        .into_inner();
    drop(client);
    daemon.stop_with("TERM").await;

    let daemon = start(&db).await;
    let mut client = connect(daemon.addr).await;
    let rendered = client
        .render(render_req(&session, Target::Branch("main".into())))
        .await
        .expect("Render after restart")
        .into_inner();
    assert_eq!(
        transcript(&rendered.messages),
        vec!["user: remember me", "assistant: sure"]
    );
    assert_eq!(rendered.head_id, appended.head_id);
    assert_eq!(rendered.head_hash, appended.head_hash);
    drop(client);
    daemon.stop_with("INT").await;
}

/// A kill -9 while a summary commits: after a restart the render is exactly the old one or
/// exactly the new one, and the audit trail agrees with it.
#[tokio::test]
async fn a_server_killed_during_a_commit_keeps_the_old_or_the_new_context() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");

    let daemon = start(&db).await;
    let mut client = connect(daemon.addr).await;
    let session = four_file_reads(&mut client).await;
    let render = pb::RenderRequest {
        budget: Some(small_budget()),
        now_unix_ms: 1,
        ..render_req(&session, Target::Branch("main".into()))
    };
    let before = client
        .render(render.clone())
        .await
        .expect("Render")
        .into_inner();
    let compaction_id = prepare_needed(&mut client, &session).await;

    let mut committer = client.clone();
    let commit = tokio::spawn(async move {
        committer
            .commit_summary(pb::CommitSummaryRequest {
                compaction_id,
                text: "Files 0 and 1 were read.".into(),
                model: "m".into(),
            })
            .await
    });
    daemon.kill().await;
    let _ = commit.await;
    drop(client);

    let daemon = start(&db).await;
    let mut client = connect(daemon.addr).await;
    let after = client.render(render).await.expect("Render").into_inner();
    let audit = summaries(&mut client, &session).await;
    let count = client
        .get_session(get_session_req(&session))
        .await
        .expect("GetSession")
        .into_inner()
        .compaction_count;
    if audit.summaries.is_empty() {
        assert_eq!(after, before, "the old context, exactly");
        assert_eq!(count, 0);
    } else {
        assert_eq!(audit.summaries.len(), 1);
        assert_eq!(count, 1);
        assert!(text_of(&after.messages[0].parts).ends_with("Files 0 and 1 were read."));
        assert_eq!(
            after.messages[1..],
            before.messages[before.messages.len() - 8..],
            "the new context: the summary, then the newest turns as they were"
        );
    }
    drop(client);
    daemon.stop_with("TERM").await;
}

/// `--metrics-listen` serves Prometheus text with RPCs by method and status.
#[tokio::test]
async fn the_binary_serves_prometheus_metrics() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let daemon = Serve::new(&db)
        .args(["--metrics-listen", "127.0.0.1:0"])
        .start()
        .await;

    let mut client = connect(daemon.addr).await;
    let session = new_session(&mut client).await;
    client
        .append(append_req(&session, vec![user("hi"), assistant("hello")]))
        .await
        .expect("Append");
    let bad = client
        .append(append_req("not-a-uuid", vec![user("x")]))
        .await;
    assert!(bad.is_err());
    client
        .render(render_req(&session, Target::Branch("main".into())))
        .await
        .expect("Render");

    let scrape = daemon.scrape().await;
    assert!(scrape.starts_with("HTTP/1.1 200 OK"), "{scrape}");
    for line in [
        r#"ctxd_rpc_requests_total{method="ctxd.v1.ContextStore/Append",code="OK"} 1"#,
        r#"ctxd_rpc_requests_total{method="ctxd.v1.ContextStore/Append",code="INVALID_ARGUMENT"} 1"#,
        r#"ctxd_rpc_requests_total{method="ctxd.v1.ContextStore/Render",code="OK"} 1"#,
        "ctxd_appended_nodes_total 2",
        r#"ctxd_renders_total{tokenizer="heuristic"} 1"#,
    ] {
        assert!(scrape.contains(line), "{line} in\n{scrape}");
    }
    assert!(
        scrape.contains("ctxd_rpc_duration_seconds_bucket{method=\"ctxd.v1.ContextStore/Append\"")
    );
    drop(client);
    daemon.stop().await;
}

/// One HTTP/1.1 POST to `addr` on a fresh connection; the whole response as text.
async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: ctxd\r\nContent-Type: application/json\r\n\
         anthropic-version: 2023-06-01\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).expect("connect to the gateway");
        stream.write_all(request.as_bytes()).expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
    })
    .await
    .expect("post")
}

#[tokio::test]
async fn the_binary_serves_the_gateway() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    // An upstream nothing listens on: bound, read, released.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let upstream = format!("http://{}", dead.local_addr().expect("addr"));
    drop(dead);
    let daemon = Serve::new(&db)
        .args([
            "--metrics-listen",
            "127.0.0.1:0",
            "--gateway",
            "127.0.0.1:0",
            "--anthropic-upstream",
            &upstream,
        ])
        .start()
        .await;
    let gateway = daemon.gateway.expect("`ctxd gateway on ADDR` on stdout");

    let bad = post(gateway, "/v1/messages", "{not json").await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    assert!(bad.contains(r#""type":"invalid_request_error""#), "{bad}");
    assert!(bad.contains(r#""message":"body: not JSON"#), "{bad}");

    let body =
        r#"{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    let unreachable = post(gateway, "/v1/messages", body).await;
    assert!(unreachable.starts_with("HTTP/1.1 502"), "{unreachable}");
    assert!(
        unreachable.contains(r#""type":"api_error""#),
        "{unreachable}"
    );

    let scrape = daemon.scrape().await;
    for line in [
        r#"ctxd_gateway_requests_total{api="anthropic",outcome="invalid"} 1"#,
        r#"ctxd_gateway_requests_total{api="anthropic",outcome="upstream_unreachable"} 1"#,
    ] {
        assert!(scrape.contains(line), "{line} in\n{scrape}");
    }
    daemon.stop().await;
}

#[tokio::test]
async fn a_non_loopback_gateway_needs_api_keys() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = crate::daemon::ctxd()
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("ctxd.db"))
        .args(["--gateway", "0.0.0.0:0"])
        .output()
        .expect("run ctxd");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to serve the gateway on 0.0.0.0:0 without API keys"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("ctxd.db").exists(),
        "refused before the database is opened"
    );
}

/// `ctxd sessions --meta K=V --id-prefix P`: the filter runs on the server.
#[tokio::test]
async fn the_sessions_command_filters_by_metadata_and_id_prefix() {
    let dir = tempfile::tempdir().expect("temp dir");
    let daemon = start(&dir.path().join("ctxd.db")).await;
    let mut client = connect(daemon.addr).await;
    let mut ids = Vec::new();
    for team in ["a", "b", "a"] {
        let created = client
            .create_session(pb::CreateSessionRequest {
                metadata: [("team".to_owned(), team.to_owned())].into(),
                ..Default::default()
            })
            .await
            .expect("CreateSession")
            .into_inner();
        ids.push(created.session_id);
    }
    let server = format!("http://{}", daemon.addr);
    let listed = |args: &[&str]| {
        let out = crate::daemon::ctxd()
            .args(["sessions", "--json", "--server", &server])
            .args(args)
            .output()
            .expect("run ctxd sessions");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        json["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .map(|s| s["session_id"].as_str().expect("id").to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(&["--meta", "team=a"]),
        [ids[2].clone(), ids[0].clone()]
    );
    assert_eq!(
        listed(&["--meta", "team=a", "--id-prefix", &ids[0]]),
        [ids[0].clone()]
    );
    assert!(listed(&["--meta", "team=a", "--id-prefix", &ids[1]]).is_empty());

    let bad = crate::daemon::ctxd()
        .args(["sessions", "--id-prefix", "xyz", "--server", &server])
        .output()
        .expect("run ctxd sessions");
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("id_prefix"), "{stderr}");
    drop(client);
    daemon.stop().await;
}

/// Logs to a file or a pipe carry no colour codes (they would be noise in every log viewer);
/// only a terminal gets them.
#[tokio::test]
async fn logs_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let daemon = Serve::new(&db).args(["--log", "ctxd=debug"]).start().await;
    let mut client = connect(daemon.addr).await;
    new_session(&mut client).await;
    drop(client);
    let log = daemon.stop().await;
    assert!(log.contains("INFO"), "the server logged: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "no escape codes in a log file: {log:?}"
    );
}
