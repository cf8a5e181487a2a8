//! Requests read: Gemini CLI's real bodies written back as they came, ids and pairing, the
//! identity of what a client varies, refusals naming their field.

use serde_json::json;

use super::*;
use crate::domain::{Part, Role, ToolCall};
use crate::provider::codec::Action;
use crate::provider::conversation::estimate;
use crate::provider::gemini::{WIRE, call_id, part_marker, target};
use crate::provider::message_of;

#[test]
fn every_corpus_request_is_written_back_as_it_came() {
    for n in 0..5 {
        let body = corpus(n);
        let (conv, contents, sources) = round_trip(&body);
        let sent = body["contents"].as_array().unwrap();
        assert_eq!(same(&contents), same(sent), "request {n:02}");
        assert_eq!(sources.len(), sent.len(), "request {n:02}");
        for item in &conv.items {
            item.content.validate("n").unwrap();
        }
    }
}

#[test]
fn a_gemini_cli_request_reads_as_its_nodes() {
    let body = corpus(2);
    let conv = read(body.clone()).unwrap();
    assert_eq!(conv.model, "gemini-3.1-pro-preview");
    assert!(conv.stream);
    assert_eq!(conv.output_reserve, 65_536, "Gemini's default, none asked");
    let system = body["systemInstruction"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert_eq!(conv.system_tokens as u64, estimate(system.len()));
    assert!(conv.tools_tokens > 0);
    assert!(conv.opening.starts_with(system));
    assert!(conv.reasoning, "the call's signature");
    let at: Vec<usize> = conv.items.iter().map(|i| i.message).collect();
    assert_eq!(at, [0, 1, 2]);
    let (role, parts, _) = message_of(&conv.items[0].content);
    assert_eq!(role, Role::User);
    assert_eq!(parts.len(), 2, "the session context and the prompt");
    let args = json!({"command": "echo ctxd-gemini-marker > out.txt",
                      "description": "Write the marker into out.txt."});
    let id = call_id(0, "run_shell_command", &canonical(&args));
    let (role, parts, tool_calls) = message_of(&conv.items[1].content);
    assert_eq!(role, Role::Assistant);
    assert_eq!(
        tool_calls,
        &vec![ToolCall {
            call_id: id.clone(),
            name: "run_shell_command".into(),
            arguments_json: canonical(&args),
        }]
    );
    // The wire id and the signature, byte for byte, outside the node's identity.
    let (kind, wire) = part_marker(&parts[0]).unwrap();
    assert_eq!(kind, WIRE);
    assert_eq!(wire["id"], "run_shell_command_1796668890921_0");
    assert_eq!(
        wire["thoughtSignature"],
        "Q3R4ZEdlbWluaUNvcnB1c1NpZ25hdHVyZTE="
    );
    assert!(matches!(&parts[0], Part::Block(b) if b.reasoning));
    let NodeContent::ToolResult {
        call_id,
        name,
        parts,
        is_error,
    } = &conv.items[2].content
    else {
        panic!("{:?}", conv.items[2].content)
    };
    assert_eq!(
        (call_id, name.as_str(), *is_error),
        (&id, "run_shell_command", false)
    );
    assert!(Part::text_of(parts).starts_with("<untrusted_context>\nOutput: (empty)"));
}

#[test]
fn a_resumed_history_continues_the_same_nodes() {
    // 02 is the live turn; 04 the same history after `--resume`: the session context lists the
    // new file, the call's signature is Google's dummy value, the result is sent twice. 03 is
    // the CLI's router reading that history under other call ids.
    let live = nodes(&read(corpus(2)).unwrap());
    let resumed = nodes(&read(corpus(4)).unwrap());
    let router = nodes(
        &read_at(
            "/v1beta/models/gemini-3.5-flash-lite:generateContent",
            corpus(3),
        )
        .unwrap(),
    );
    assert_ne!(live[0], resumed[0], "the session context changed");
    for k in 1..3 {
        assert!(live[k].says_same(&resumed[k]), "node {k}");
        assert!(live[k].says_same(&router[k]), "node {k}");
        assert_ne!(live[k], resumed[k], "what the client sent is kept");
    }
    assert_eq!(hashes(&resumed), hashes(&router));
}

#[test]
fn responses_pair_by_id_else_by_name_and_order() {
    let model = json!({"role": "model", "parts": [
        {"functionCall": {"name": "read", "args": {"path": "a"}}},
        {"functionCall": {"name": "ls", "args": {}}},
        {"functionCall": {"name": "read", "args": {"path": "b"}}},
    ]});
    let ids: Vec<String> = [
        ("read", json!({"path": "a"})),
        ("ls", json!({})),
        ("read", json!({"path": "b"})),
    ]
    .iter()
    .enumerate()
    .map(|(k, (name, args))| call_id(k, name, &canonical(args)))
    .collect();
    let answered = |conv: &Conversation| -> Vec<(String, String)> {
        conv.items
            .iter()
            .filter_map(|i| match &i.content {
                NodeContent::ToolResult { call_id, parts, .. } => {
                    Some((call_id.clone(), Part::text_of(parts)))
                }
                _ => None,
            })
            .collect()
    };
    let response = |name: &str, out: &str| json!({"functionResponse": {"name": name, "response": {"output": out}}});
    // No ids: the n-th `read` response answers the n-th `read` call, whatever the order.
    let conv = read(body(json!([user("go"), model, {"role": "user", "parts": [
        response("ls", "L"), response("read", "A"), response("read", "B")]}])))
    .unwrap();
    assert_eq!(
        answered(&conv),
        [
            (ids[1].clone(), "L".into()),
            (ids[0].clone(), "A".into()),
            (ids[2].clone(), "B".into())
        ]
    );
    // Wire ids pair a response to the call with that id, even out of order.
    let mut with_ids = model.clone();
    for (k, id) in ["c0", "c1", "c2"].iter().enumerate() {
        with_ids["parts"][k]["functionCall"]["id"] = json!(id);
    }
    let mut b = response("read", "B");
    b["functionResponse"]["id"] = json!("c2");
    let mut a = response("read", "A");
    a["functionResponse"]["id"] = json!("c0");
    let conv = read(body(
        json!([user("go"), with_ids, {"role": "user", "parts": [
        b, response("ls", "L"), a]}]),
    ))
    .unwrap();
    assert_eq!(
        answered(&conv),
        [
            (ids[2].clone(), "B".into()),
            (ids[1].clone(), "L".into()),
            (ids[0].clone(), "A".into())
        ]
    );
    // A response no call of the content before it made is not recorded.
    assert_eq!(
        read(body(
            json!([user("go"), model, {"role": "user", "parts": [response("write", "W")]}])
        ))
        .unwrap_err(),
        Refusal::Unrecordable("a function response that answers no call of the content before it")
    );
    assert!(matches!(
        read(body(
            json!([{"role": "user", "parts": [response("ls", "L")]}])
        )),
        Err(Refusal::Unrecordable(_))
    ));
}

#[test]
fn parts_it_does_not_reduce_come_back_on_their_part() {
    let signature = "c2lnbmF0dXJl/+==";
    let contents = json!([
        {"parts": [{"text": "look", "videoMetadata": {"startOffset": "1s"}},
                   {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                   {"fileData": {"mimeType": "application/pdf", "fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc"}}]},
        {"role": "model", "parts": [
            {"text": "**Plan** read it", "thought": true, "thoughtSignature": "dGhvdWdodA=="},
            {"text": "Reading.", "thoughtSignature": signature},
            {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
            {"functionCall": {"name": "read", "args": {"p": 1}, "id": "x1", "partialArgs": []},
             "thoughtSignature": signature},
            {"functionCall": {"name": "noargs"}},
            {"text": "then this"},
            {"functionCall": {"name": "last", "args": {}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "read", "id": "x1", "response": {"content": [1, 2]},
                                   "parts": [{"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}],
                                   "willContinue": false}},
            {"functionResponse": {"name": "noargs", "response": {"error": "denied"}}},
            {"functionResponse": {"name": "last", "response": {"output": ""}}},
            {"inlineData": {"mimeType": "image/jpeg", "data": "/9j/4AAQ"}},
            {"text": "and this"}]},
        {"role": "model", "parts": [{"text": "Done."}], "customMember": 1},
    ]);
    let b = body(contents.clone());
    let (conv, written, sources) = round_trip(&b);
    assert_eq!(same(&written), same(contents.as_array().unwrap()));
    assert_eq!(sources, [vec![0], vec![1], vec![2, 3, 4, 5], vec![6]]);
    let NodeContent::Message { parts, .. } = &conv.items[0].content else {
        panic!()
    };
    assert!(
        matches!(parts[0], Part::Block(_)),
        "a content without role says so first"
    );
    assert!(
        parts
            .iter()
            .any(|p| matches!(p, Part::Media { mime_type, .. } if mime_type == "image/png"))
    );
    let NodeContent::ToolResult {
        parts, is_error, ..
    } = &conv.items[3].content
    else {
        panic!()
    };
    assert!(*is_error);
    assert_eq!(Part::text_of(parts), "denied");
    let (role, parts, _) = message_of(&conv.items[5].content);
    assert_eq!(role, Role::User);
    assert!(
        matches!(parts[0], Part::Block(_)),
        "marked as sharing the results' content"
    );
    // The signatures come back byte for byte.
    let text = serde_json::to_string(&written).unwrap();
    assert_eq!(text.matches(signature).count(), 2);
    assert!(text.contains("dGhvdWdodA=="));
}

#[test]
fn what_a_client_varies_is_no_part_of_identity() {
    let answer = |call: serde_json::Value, text: serde_json::Value| {
        body(json!([user("go"),
            {"role": "model", "parts": [{"text": "plan", "thought": true, "thoughtSignature": "a"}, text, call]},
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "o"}}}]}]))
    };
    let plain = read(answer(
        json!({"functionCall": {"name": "f", "args": {"b": 2, "a": 1}}}),
        json!({"text": "ok"}),
    ))
    .unwrap();
    let varied = read(answer(
        json!({"functionCall": {"args": {"a": 1, "b": 2}, "name": "f", "id": "f_123_0"},
               "thoughtSignature": "skip_thought_signature_validator"}),
        json!({"text": "ok", "thoughtSignature": "sig"}),
    ))
    .unwrap();
    let stripped = read(body(json!([user("go"),
        {"role": "model", "parts": [{"text": "ok"}, {"functionCall": {"name": "f", "args": {"a": 1, "b": 2}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "id": "other", "response": {"output": "o"}}}]}])))
    .unwrap();
    assert_eq!(hashes(&nodes(&plain)), hashes(&nodes(&varied)));
    assert_eq!(hashes(&nodes(&plain)), hashes(&nodes(&stripped)));
    // Text the model reads is identity.
    let other = read(answer(
        json!({"functionCall": {"name": "f", "args": {"a": 1, "b": 2}}}),
        json!({"text": "ko"}),
    ))
    .unwrap();
    assert_ne!(hashes(&nodes(&plain))[1], hashes(&nodes(&other))[1]);
}

#[test]
fn paths_name_the_model_and_the_method() {
    let t = target("/v1beta/models/gemini-3.1-pro-preview:streamGenerateContent?alt=sse").unwrap();
    assert_eq!(
        (t.model, t.action, t.sse),
        (
            "gemini-3.1-pro-preview",
            "streamGenerateContent",
            Some(true)
        )
    );
    assert_eq!(
        target("/v1/models/gemini-2.5-flash:generateContent")
            .unwrap()
            .sse,
        None
    );
    assert!(target("/v1beta/models/gemini-2.5-flash").is_none());
    assert!(target("/v1beta/files/abc:download").is_none());
    for (path, action) in [
        ("/v1beta/models/m:generateContent", Action::Generate),
        ("/v1beta/models/m:streamGenerateContent", Action::Generate),
        ("/v1/models/m:countTokens", Action::Count),
        ("/v1beta/models/m:embedContent", Action::Other),
        ("/v1beta/models", Action::Other),
    ] {
        assert_eq!(Gemini.action(path), action, "{path}");
    }
    let b = body(json!([user("hi")]));
    assert!(
        !read_at("/v1beta/models/m:generateContent", b.clone())
            .unwrap()
            .stream
    );
    assert!(
        read_at("/v1beta/models/m:streamGenerateContent", b.clone())
            .unwrap()
            .stream
    );
    assert!(
        !read_at("/v1beta/models/m:streamGenerateContent?key=k", b.clone())
            .unwrap()
            .stream
    );
    // countTokens reads the request it counts.
    let count = json!({"generateContentRequest": {"model": "models/m", "contents": [user("count me")],
                       "generationConfig": {"maxOutputTokens": 100}}});
    let conv = read_at("/v1beta/models/m:countTokens", count).unwrap();
    assert_eq!((conv.model.as_str(), conv.output_reserve), ("m", 100));
    assert_eq!(conv.first_text(Role::User).as_deref(), Some("count me"));
    assert_eq!(
        read_at("/v1beta/models/m:countTokens", b)
            .unwrap()
            .items
            .len(),
        1
    );
}

#[test]
fn bad_requests_name_their_field() {
    let model =
        |part: serde_json::Value| body(json!([user("go"), {"role": "model", "parts": [part]}]));
    assert_eq!(invalid(json!([])), "body");
    assert_eq!(invalid(json!({})), "contents");
    assert_eq!(invalid(body(json!([3]))), "contents[0]");
    assert_eq!(
        invalid(body(json!([{"role": "system", "parts": [{"text": "x"}]}]))),
        "contents[0].role"
    );
    assert_eq!(
        invalid(body(json!([{"role": "user", "parts": []}]))),
        "contents[0].parts"
    );
    assert_eq!(
        invalid(body(json!([{"role": "user", "parts": ["x"]}]))),
        "contents[0].parts[0]"
    );
    assert_eq!(
        invalid(body(json!([{"role": "user", "parts": [{}]}]))),
        "contents[0].parts[0]"
    );
    assert_eq!(
        invalid(body(json!([{"parts": [{"text": 3}]}]))),
        "contents[0].parts[0].text"
    );
    assert_eq!(
        invalid(body(json!([{"parts": [{"text": "x", "thought": "yes"}]}]))),
        "contents[0].parts[0].thought"
    );
    assert_eq!(
        invalid(body(
            json!([{"parts": [{"text": "x", "thoughtSignature": 1}]}])
        )),
        "contents[0].parts[0].thoughtSignature"
    );
    assert_eq!(
        invalid(body(
            json!([{"parts": [{"inlineData": {"mimeType": 1, "data": ""}}]}])
        )),
        "contents[0].parts[0].inlineData.mimeType"
    );
    assert_eq!(
        invalid(model(json!({"functionCall": {"args": {}}}))),
        "contents[1].parts[0].functionCall.name"
    );
    assert_eq!(
        invalid(model(json!({"functionCall": {"name": ""}}))),
        "contents[1].parts[0].functionCall.name"
    );
    assert_eq!(
        invalid(model(json!({"functionCall": {"name": "f", "args": [1]}}))),
        "contents[1].parts[0].functionCall.args"
    );
    assert_eq!(
        invalid(model(json!({"functionCall": {"name": "f", "id": 7}}))),
        "contents[1].parts[0].functionCall.id"
    );
    assert_eq!(
        invalid(model(json!({"functionCall": "f"}))),
        "contents[1].parts[0].functionCall"
    );
    assert_eq!(
        invalid(model(
            json!({"functionResponse": {"name": "f", "response": {}}})
        )),
        "contents[1].parts[0].functionResponse"
    );
    assert_eq!(
        invalid(body(
            json!([{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}])
        )),
        "contents[0].parts[0].functionCall"
    );
    let response = |r: serde_json::Value| {
        body(
            json!([user("go"), {"role": "model", "parts": [{"functionCall": {"name": "f"}}]},
                    {"role": "user", "parts": [{"functionResponse": r}]}]),
        )
    };
    assert_eq!(
        invalid(response(json!({"response": {}}))),
        "contents[2].parts[0].functionResponse.name"
    );
    assert_eq!(
        invalid(response(json!({"name": "f", "response": "ok"}))),
        "contents[2].parts[0].functionResponse.response"
    );
    assert_eq!(
        invalid(response(json!({"name": "f", "response": {}, "parts": {}}))),
        "contents[2].parts[0].functionResponse.parts"
    );
    assert_eq!(
        invalid(json!({"contents": [], "systemInstruction": 3})),
        "systemInstruction"
    );
    assert_eq!(
        invalid(json!({"contents": [], "systemInstruction": {"parts": "x"}})),
        "systemInstruction.parts"
    );
    assert_eq!(
        read_at("/v1beta/models:generateContent", body(json!([]))).unwrap_err(),
        Refusal::invalid("path", "must be /v1beta/models/{model}:{method}")
    );
}

#[test]
fn what_ctxd_cannot_record_goes_as_sent() {
    let unrecordable = |b: serde_json::Value| match read(b) {
        Err(Refusal::Unrecordable(why)) => why,
        other => panic!("{other:?}"),
    };
    let mut cached = body(json!([user("hi")]));
    cached["cachedContent"] = json!("cachedContents/abc");
    assert_eq!(unrecordable(cached), "cachedContent");
    let mut many = body(json!([user("hi")]));
    many["generationConfig"] = json!({"candidateCount": 2});
    assert_eq!(unrecordable(many), "candidateCount over 1");
    assert_eq!(
        unrecordable(body(
            json!([user("go"), {"role": "model", "parts": [{"functionCall": {"name": "f"}}]},
            {"role": "user", "parts": [{"text": "first"}, {"functionResponse": {"name": "f", "response": {}}}]}])
        )),
        "content before function responses"
    );
    let two = body(
        json!([user("go"), {"role": "model", "parts": [{"functionCall": {"name": "f", "id": "a"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "id": "a", "response": {"output": "1"}}},
                                   {"functionResponse": {"name": "f", "id": "a", "response": {"output": "2"}}}]}]),
    );
    assert!(unrecordable(two).contains("answers no call"));
}
