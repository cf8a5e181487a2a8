//! ExportSession: ctxd JSONL read back by ImportSession into an equivalent session (the same
//! render on every branch, the same summaries and pins), the one-branch formats read back by
//! their importers, a consistent export under concurrent appends, and bad input.

use std::collections::HashMap;

use ctxd::api::pb;
use pb::{Expose, FunctionStatus};
use serde_json::Value;
use tokio_stream::StreamExt;
use tonic::Code;

use crate::helpers::*;

/// An export's data, and its first chunk's heads and warnings.
type Exported = (Vec<u8>, Vec<pb::Branch>, Vec<String>);

/// Exports `session` as `format` (branch `branch`); the data, and the first chunk's heads and
/// warnings.
pub(crate) async fn export(
    client: &mut Client,
    session: &str,
    format: pb::ExportFormat,
    branch: &str,
) -> Result<Exported, tonic::Status> {
    let mut stream = client
        .export_session(pb::ExportSessionRequest {
            session_id: session.into(),
            format: format as i32,
            branch: branch.into(),
        })
        .await?
        .into_inner();
    let mut data = Vec::new();
    let mut first: Option<(Vec<pb::Branch>, Vec<String>)> = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if first.is_none() {
            first = Some((chunk.branches, chunk.warnings));
        } else {
            assert!(chunk.branches.is_empty() && chunk.warnings.is_empty());
        }
        data.extend(chunk.data);
    }
    let (branches, warnings) = first.expect("a first chunk");
    Ok((data, branches, warnings))
}

pub(crate) async fn import(
    client: &mut Client,
    format: pb::ImportFormat,
    data: &[u8],
) -> Result<pb::ImportSessionResponse, tonic::Status> {
    let chunks: Vec<pb::ImportChunk> = data
        .chunks(64 * 1024)
        .enumerate()
        .map(|(i, chunk)| pb::ImportChunk {
            format: if i == 0 { format as i32 } else { 0 },
            data: chunk.to_vec(),
            ..Default::default()
        })
        .collect();
    client
        .import_session(tokio_stream::iter(chunks))
        .await
        .map(|r| r.into_inner())
}

/// A render of `target` as the OpenAI document, with and without a tight budget.
async fn renders(app: &mut TestApp, session: &str, target: Target) -> Vec<String> {
    let mut out = Vec::new();
    for budget in [None, Some(small_budget())] {
        let r = app
            .render(pb::RenderRequest {
                session_id: session.into(),
                target: Some(target.clone()),
                budget,
                format: pb::Format::OpenaiChat as i32,
                ..Default::default()
            })
            .await;
        out.push(r.messages_json);
    }
    out
}

/// The records of a ctxd export with every id replaced by its position (node ids by the order
/// of node records, summary ids by the order of summary records) and node and session times
/// left out: two exports of equivalent sessions are equal this way.
fn normalized(data: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(data).expect("UTF-8");
    let mut ids: HashMap<String, String> = HashMap::new();
    let mut records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    for r in &records {
        let prefix = match r["ctxd"].as_str() {
            Some("node") => "n",
            Some("summary") => "s",
            _ => continue,
        };
        let id = r["id"].as_str().expect("id").to_owned();
        let n = ids.len();
        ids.insert(id, format!("{prefix}{n}"));
    }
    fn map(v: &mut Value, ids: &HashMap<String, String>) {
        match v {
            Value::String(s) => {
                if let Some(to) = ids.get(s.as_str()) {
                    *s = to.clone();
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|x| map(x, ids)),
            Value::Object(o) => o.values_mut().for_each(|x| map(x, ids)),
            _ => {}
        }
    }
    for r in &mut records {
        if let Value::Object(o) = r
            && matches!(o["ctxd"].as_str(), Some("node" | "session"))
        {
            o.remove("created_at_ms");
        }
        for field in [
            "id",
            "parent",
            "function",
            "head",
            "node",
            "covers",
            "range",
            "rolls_over",
            "base_head",
        ] {
            if let Some(v) = r.get_mut(field) {
                map(v, &ids);
            }
        }
    }
    records
}

/// Exports `session`, imports the export, and checks the copy: every branch renders the same,
/// and its own export is the same records (summaries with their covers, pins, branches).
async fn round_trip(app: &mut TestApp, session: &str, what: &str) -> pb::ImportSessionResponse {
    let (data, heads, _warnings) =
        export(&mut app.client, session, pb::ExportFormat::CtxdJsonl, "")
            .await
            .expect("ExportSession");
    let imported = import(&mut app.client, pb::ImportFormat::Unspecified, &data)
        .await
        .unwrap_or_else(|e| panic!("{what}: ImportSession of the export: {e:?}"));
    assert_eq!(
        imported.format,
        pb::ImportFormat::CtxdJsonl as i32,
        "{what}"
    );
    let copy = imported.session.clone().expect("session");
    let names = |b: &[pb::Branch]| b.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&copy.branches), names(&heads), "{what}");
    for branch in &heads {
        // The original at the exported head, the copy at its branch.
        let target = if branch.head_id.is_empty() {
            Target::Branch(branch.name.clone())
        } else {
            Target::NodeId(branch.head_id.clone())
        };
        let before = renders(app, session, target).await;
        let after = renders(app, &copy.session_id, Target::Branch(branch.name.clone())).await;
        assert!(
            before == after,
            "{what}: branch {} renders differently",
            branch.name
        );
    }
    let (again, _, _) = export(
        &mut app.client,
        &copy.session_id,
        pb::ExportFormat::CtxdJsonl,
        "",
    )
    .await
    .expect("ExportSession of the copy");
    assert_eq!(normalized(&data), normalized(&again), "{what}");
    let (a, b) = (
        summaries(&mut app.client, session).await,
        summaries(&mut app.client, &copy.session_id).await,
    );
    let texts = |r: &pb::ListSummariesResponse| {
        r.summaries
            .iter()
            .map(|s| (s.text.clone(), s.covers_ids.len(), s.active))
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&a), texts(&b), "{what}: summaries");
    imported
}

/// Adds a branch at a middle node with its own append, a summary on `main` and a pin; whether
/// a summary was applied.
async fn add_structure(app: &mut TestApp, session: &str) -> bool {
    let log = app.log(session, "main").await;
    let top: Vec<&pb::Node> = log
        .iter()
        .rev()
        .filter(|n| n.function_id.is_empty())
        .collect();
    let mut forked = false;
    for node in top.iter().skip(top.len() / 2) {
        let name = "side";
        let made = app
            .client
            .create_branch(create_branch_req(session, name, &node.node_id))
            .await;
        if made.is_err() {
            continue;
        }
        let appended = app
            .try_append(pb::AppendRequest {
                branch: name.into(),
                ..append_req(session, vec![user("a question on the side")])
            })
            .await;
        if appended.is_ok() {
            forked = true;
            break;
        }
        app.delete_branch(session, name).await;
    }
    assert!(forked, "no middle node takes a user message");
    if let Some(middle) = top.get(top.len() / 3) {
        app.client
            .pin(pb::PinRequest {
                session_id: session.into(),
                node_ids: vec![middle.node_id.clone()],
            })
            .await
            .expect("Pin");
    }
    let plan = app
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: session.into(),
            budget: Some(small_budget()),
            ..Default::default()
        })
        .await
        .expect("PrepareCompaction")
        .into_inner();
    if !plan.needed {
        return false;
    }
    app.commit_summary(&plan.compaction_id, "The user asked; the agent worked.")
        .await
        .applied
}

fn testdata(dir: &str) -> Vec<(String, Vec<u8>)> {
    let dir = format!("{}/testdata/{dir}", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("read"))
        })
        .collect()
}

#[tokio::test]
async fn every_trace_round_trips_with_a_branch_a_summary_and_a_pin() {
    let mut app = spawn_app().await;
    let mut files = testdata("traces");
    // A Claude Code sub-agent file goes with its session's file (it holds no main chain).
    let (agents, sessions): (Vec<_>, Vec<_>) = testdata("claude-code")
        .into_iter()
        .partition(|(name, _)| name.contains("-agent-"));
    files.extend(sessions.into_iter().map(|(name, mut data)| {
        let prefix = name.split('-').next().unwrap_or_default().to_owned();
        for (agent, more) in &agents {
            if agent.starts_with(&prefix) {
                data.extend(more);
            }
        }
        (name, data)
    }));
    let mut summarized = 0;
    for (name, data) in files {
        let imported = import(&mut app.client, pb::ImportFormat::Unspecified, &data)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let session = imported.session.expect("session").session_id;
        summarized += usize::from(add_structure(&mut app, &session).await);
        round_trip(&mut app, &session, &name).await;
    }
    assert!(
        summarized > 5,
        "summaries were applied on only {summarized} traces"
    );
}

/// Functions (running and closed, every `expose`), media, errors, a pending call, rolled
/// summaries and an unpinned node.
#[tokio::test]
async fn a_session_with_every_kind_of_node_round_trips() {
    let mut app = spawn_app().await;
    let s = four_file_reads(&mut app.client).await;
    let first = prepare_needed(&mut app.client, &s).await;
    assert!(app.commit_summary(&first, "first summary").await.applied);
    for t in 0..3 {
        app.append(
            &s,
            vec![user(&format!("more {t}")), assistant(&big_text(2000, "x"))],
        )
        .await;
    }
    let second = prepare_needed(&mut app.client, &s).await;
    assert!(app.commit_summary(&second, "rolled summary").await.applied);
    let mut calls = Vec::new();
    for (k, expose) in [Expose::Io, Expose::Full, Expose::None]
        .into_iter()
        .enumerate()
    {
        let id = format!("f{k}");
        let fc = app
            .append(
                &s,
                vec![
                    message(
                        pb::Role::User,
                        vec![
                            text("look"),
                            media_data("image/png", vec![1, 2, 3, k as u8]),
                        ],
                        Vec::new(),
                    ),
                    assistant_calls("delegating", vec![call(&id, "helper", r#"{"a":1}"#)]),
                    function_call(&id, "do it", expose),
                ],
            )
            .await
            .node_ids[2]
            .clone();
        app.append_in_function(
            &s,
            &fc,
            vec![
                user("inner request"),
                assistant_calls("", vec![call("t1", "ls", "{}")]),
                tool_error("t1", "no such dir"),
                message(
                    pb::Role::Assistant,
                    vec![media_url("image/jpeg", "https://example.com/x.jpg")],
                    Vec::new(),
                ),
            ],
        )
        .await;
        app.append(
            &s,
            vec![function_result(&id, "done", FunctionStatus::Completed)],
        )
        .await;
        calls.push(fc);
    }
    // A function left running, with a chain, and a pending call after it on a branch.
    let head = head_of(&mut app.client, &s, "main").await;
    app.create_branch(&s, "pending", &head).await;
    let running = app
        .append_branch(
            &s,
            "pending",
            vec![
                user("again"),
                assistant_calls("", vec![call("r1", "helper", "{}")]),
                function_call("r1", "still going", Expose::Io),
            ],
        )
        .await
        .node_ids[2]
        .clone();
    app.append_in_function(&s, &running, vec![user("working")])
        .await;
    app.create_branch(&s, "empty", "").await;
    app.client
        .pin(pb::PinRequest {
            session_id: s.clone(),
            node_ids: vec![calls[0].clone(), head.clone()],
        })
        .await
        .expect("Pin");
    app.client
        .unpin(pb::PinRequest {
            session_id: s.clone(),
            node_ids: vec![calls[0].clone()],
        })
        .await
        .expect("Unpin");
    let imported = round_trip(&mut app, &s, "rich session").await;
    assert_eq!(imported.summaries, 2);
    assert_eq!(imported.functions, 4);
    let copy = imported.session.expect("session");
    assert_eq!(copy.compaction_count, 2);
}

#[tokio::test]
async fn one_branch_formats_read_back_and_say_what_they_leave_out() {
    let mut app = spawn_app().await;
    let s = four_file_reads(&mut app.client).await;
    let plan = prepare_needed(&mut app.client, &s).await;
    assert!(app.commit_summary(&plan, "summary").await.applied);
    let head = head_of(&mut app.client, &s, "main").await;
    app.create_branch(&s, "other", &head).await;
    app.append(
        &s,
        vec![
            user("delegate"),
            assistant_calls("", vec![call("c9", "helper", "{}")]),
            tool_error("c9", "failed"),
            assistant("sorry"),
        ],
    )
    .await;
    let log = app.log(&s, "main").await;
    let (data, _, warnings) = export(
        &mut app.client,
        &s,
        pb::ExportFormat::OpenaiMessages,
        "main",
    )
    .await
    .expect("export openai");
    let doc: Value = serde_json::from_slice(&data).expect("a JSON array");
    assert_eq!(doc.as_array().map(Vec::len), Some(log.len()));
    let joined = warnings.join("\n");
    for said in ["other", "summar", "error flag"] {
        assert!(joined.contains(said), "{said}: {joined}");
    }
    let back = import(&mut app.client, pb::ImportFormat::OpenaiMessages, &data)
        .await
        .expect("import openai");
    assert_eq!(back.nodes as usize, log.len());
    assert!(back.warnings.is_empty(), "{:?}", back.warnings);

    let (data, _, warnings) = export(&mut app.client, &s, pb::ExportFormat::ClaudeCodeJsonl, "")
        .await
        .expect("export claude code");
    assert!(warnings.join("\n").contains("other"), "{warnings:?}");
    let back = import(&mut app.client, pb::ImportFormat::Unspecified, &data)
        .await
        .expect("import claude code");
    assert_eq!(back.format, pb::ImportFormat::ClaudeCodeJsonl as i32);
    assert_eq!(back.nodes as usize, log.len());
    let copy = back.session.expect("session").session_id;
    let a = app.render_branch(&s, "main").await;
    let b = app.render_branch(&copy, "main").await;
    // The raw history (no summary) comes back: every message of the branch, in order.
    assert_eq!(b.messages.len(), log.len());
    assert!(a.messages.len() < b.messages.len());

    // A sub-agent chain comes back as a function.
    let dir = format!("{}/testdata/claude-code", env!("CARGO_MANIFEST_DIR"));
    let mut data = std::fs::read(format!("{dir}/258c7280-ae70-4798-800f-63464d01a85d.jsonl"))
        .expect("a session file");
    data.extend(std::fs::read(format!("{dir}/258c7280-agent-a881341.jsonl")).expect("its agent"));
    let first = import(&mut app.client, pb::ImportFormat::Unspecified, &data)
        .await
        .expect("import");
    assert!(first.functions > 0);
    let sid = first.session.expect("session").session_id;
    let (data, _, _) = export(
        &mut app.client,
        &sid,
        pb::ExportFormat::ClaudeCodeJsonl,
        "main",
    )
    .await
    .expect("export");
    let again = import(&mut app.client, pb::ImportFormat::ClaudeCodeJsonl, &data)
        .await
        .expect("import the export");
    assert_eq!(again.functions, first.functions);
    assert_eq!(again.nodes, first.nodes);
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
}

#[tokio::test]
async fn bad_requests_name_the_field_and_unknown_ids_are_not_found() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(&s, vec![user("hi")]).await;
    let err = |r: Result<Exported, tonic::Status>| r.map(|_| ());
    assert_status(
        err(export(
            &mut app.client,
            &unknown_id(),
            pb::ExportFormat::CtxdJsonl,
            "",
        )
        .await),
        Code::NotFound,
        "session",
    );
    assert_status(
        err(export(&mut app.client, "nope", pb::ExportFormat::CtxdJsonl, "").await),
        Code::InvalidArgument,
        "session_id",
    );
    assert_status(
        err(export(
            &mut app.client,
            &s,
            pb::ExportFormat::OpenaiMessages,
            "missing",
        )
        .await),
        Code::NotFound,
        "branch",
    );
    assert_status(
        err(export(
            &mut app.client,
            &s,
            pb::ExportFormat::ClaudeCodeJsonl,
            "bad name!",
        )
        .await),
        Code::InvalidArgument,
        "branch",
    );
    let bad = app
        .client
        .export_session(pb::ExportSessionRequest {
            session_id: s.clone(),
            format: 99,
            branch: String::new(),
        })
        .await
        .map(|_| ());
    assert_status(bad, Code::InvalidArgument, "format");
}

#[tokio::test]
async fn malformed_ctxd_jsonl_names_the_line_and_field_and_writes_nothing() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(
        &s,
        vec![
            user("hi"),
            assistant_calls("", vec![call("c1", "ls", "{}")]),
            tool_result("c1", "ok"),
        ],
    )
    .await;
    let (data, _, _) = export(&mut app.client, &s, pb::ExportFormat::CtxdJsonl, "")
        .await
        .expect("export");
    let lines: Vec<String> = String::from_utf8(data)
        .expect("UTF-8")
        .lines()
        .map(str::to_owned)
        .collect();
    let before = app.session_count().await;
    let with = |k: usize, edit: &dyn Fn(&mut Value)| {
        let mut lines = lines.clone();
        let mut v: Value = serde_json::from_str(&lines[k]).expect("JSON");
        edit(&mut v);
        lines[k] = v.to_string();
        lines.join("\n").into_bytes()
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            with(3, &|v| v["parent"] = Value::from(unknown_id())),
            "line 4.parent",
        ),
        (with(2, &|v| v["kind"] = Value::from("note")), "line 3.kind"),
        (
            with(0, &|v| v["version"] = Value::from(7)),
            "line 1.version",
        ),
        (with(4, &|v| v["head"] = Value::from(7)), "line 5.head"),
        (
            with(1, &|v| v["role"] = Value::from("robot")),
            "line 2.role",
        ),
        // The tool result answers no call: the store's pairing check, at that line.
        (with(3, &|v| v["call_id"] = Value::from("zz")), "line 4"),
    ];
    for (data, field) in cases {
        let r = import(&mut app.client, pb::ImportFormat::CtxdJsonl, &data).await;
        assert_status(r, Code::InvalidArgument, field);
    }
    assert_eq!(app.session_count().await, before, "nothing is half-written");
}

#[tokio::test]
async fn another_tenants_session_is_not_found() {
    let (_db, server) = serve_fresh(ctxd::server::Options {
        api_keys: Some(two_keys()),
        ..Default::default()
    })
    .await;
    let mut acme = keyed(server.addr, "acme-key-0123456789").await;
    let mut globex = keyed(server.addr, "globex-key-0123456789").await;
    let s = acme
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("create")
        .into_inner()
        .session_id;
    let request = |id: &str| pb::ExportSessionRequest {
        session_id: id.into(),
        format: pb::ExportFormat::CtxdJsonl as i32,
        branch: String::new(),
    };
    let theirs = globex.export_session(request(&s)).await.map(|_| ());
    let unknown = unknown_id();
    let none = globex.export_session(request(&unknown)).await.map(|_| ());
    let (a, b) = (theirs.expect_err("foreign"), none.expect_err("unknown"));
    assert_eq!(a.code(), Code::NotFound);
    assert_eq!(
        a.message().replace(&s, "ID"),
        b.message().replace(&unknown, "ID")
    );
    assert!(acme.export_session(request(&s)).await.is_ok());
}

fn two_keys() -> ctxd::auth::ApiKeys {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(
        &keys,
        "acme acme-key-0123456789\nglobex globex-key-0123456789\n",
    )
    .expect("keys");
    ctxd::auth::ApiKeys::load(keys.path()).expect("keys")
}

type Keyed = pb::context_store_client::ContextStoreClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

#[derive(Clone)]
struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

async fn keyed(addr: std::net::SocketAddr, key: &str) -> Keyed {
    let bearer = Bearer(format!("Bearer {key}").parse().expect("ASCII"));
    pb::context_store_client::ContextStoreClient::with_interceptor(channel(addr).await, bearer)
}

/// Four appenders on four branches while the export runs: the export is exactly the session
/// at the heads its first chunk names.
#[tokio::test]
async fn an_export_during_appends_is_the_session_at_its_heads() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(&s, vec![user("start"), assistant(&big_text(3000, "seed"))])
        .await;
    let head = head_of(&mut app.client, &s, "main").await;
    for k in 1..4 {
        app.create_branch(&s, &format!("b{k}"), &head).await;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for k in 0..4 {
        let mut client = connect(app.addr).await;
        let (s, stop) = (s.clone(), stop.clone());
        let branch = if k == 0 {
            "main".to_owned()
        } else {
            format!("b{k}")
        };
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                client
                    .append(pb::AppendRequest {
                        branch: branch.clone(),
                        ..append_req(
                            &s,
                            vec![
                                user(&format!("{branch} {n}")),
                                assistant(&big_text(500, "a")),
                            ],
                        )
                    })
                    .await
                    .expect("Append");
                n += 1;
            }
            n
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut exports = Vec::new();
    for _ in 0..3 {
        exports.push(
            export(&mut app.client, &s, pb::ExportFormat::CtxdJsonl, "")
                .await
                .expect("export"),
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        assert!(w.await.expect("writer") > 0);
    }
    for (data, heads, _) in exports {
        let copy = import(&mut app.client, pb::ImportFormat::CtxdJsonl, &data)
            .await
            .expect("import")
            .session
            .expect("session")
            .session_id;
        for branch in heads {
            let at = renders(&mut app, &s, Target::NodeId(branch.head_id.clone())).await;
            let copied = renders(&mut app, &copy, Target::Branch(branch.name.clone())).await;
            assert!(at == copied, "branch {} differs from its head", branch.name);
        }
    }
}
