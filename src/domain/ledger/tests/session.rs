//! A whole session's ledger: deterministic, a JSON round trip, merged range by range, and
//! derived without panic from arguments of any shape.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn mixed_session() -> Vec<Node> {
    vec![
        user("fix the failing test in card.py"),
        call(
            "1",
            "Read",
            json!({"file_path": "/t/astropy/io/fits/card.py"}),
        ),
        result("1", "Read", "...", false),
        call(
            "2",
            "Edit",
            json!({"file_path": "/t/astropy/io/fits/card.py"}),
        ),
        result(
            "2",
            "Edit",
            "The file /t/astropy/io/fits/card.py has been updated.",
            false,
        ),
        call("3", "Bash", json!({"command": "pytest -x"})),
        result("3", "Bash", "Exit code 1\nE   AssertionError: 1 != 2", true),
        function_call("4", "explore", "where is Card used"),
        function_result("4", "in header.py", FunctionStatus::Completed),
        user("now run the whole suite"),
        call("5", "Bash", json!({"command": "pytest"})),
        result("5", "Bash", "ok", false),
        call(
            "6",
            "Grep",
            json!({"pattern": "Card", "path": "/t/astropy"}),
        ),
        call(
            "7",
            "Read",
            json!({"file_path": "/t/astropy/io/fits/card.py"}),
        ),
    ]
}

#[test]
fn derivation_is_deterministic_and_round_trips_as_json() {
    let nodes = mixed_session();
    let l = derive(&nodes);
    assert_eq!(l, derive(&nodes));
    assert_eq!(
        l.render(None, &Tokenizer::Heuristic),
        derive(&nodes).render(None, &Tokenizer::Heuristic)
    );
    let json = serde_json::to_string(&l).unwrap();
    assert_eq!(serde_json::from_str::<Ledger>(&json).unwrap(), l);
    // Empty categories are left out, and an empty object is an empty ledger.
    assert_eq!(serde_json::to_string(&Ledger::default()).unwrap(), "{}");
    assert_eq!(
        serde_json::from_str::<Ledger>("{}").unwrap(),
        Ledger::default()
    );
    assert!(Ledger::default().is_empty());
    assert_eq!(Ledger::default().render(Some(0), &Tokenizer::Heuristic), "");
    assert!(!l.is_empty());
}

#[test]
fn merge_appends_the_newer_evidence() {
    let nodes = mixed_session();
    // A boundary with no call on one side and its result on the other.
    let (a, b) = nodes.split_at(9);
    let mut merged = derive(a);
    merged.merge(derive(b));
    assert_eq!(merged, derive(&nodes));
    let card = use_of(&merged.files_read, "/t/astropy/io/fits/card.py");
    assert_eq!(card.count, 2);
    // A relative path whose call has no result keeps its place.
    let nodes = [
        call("r1", "open", json!({"path": "rel.py"})),
        call("r2", "Read", json!({"file_path": "/abs.py"})),
    ];
    let mut merged = derive(&nodes[..1]);
    merged.merge(derive(&nodes[1..]));
    assert_eq!(merged, derive(&nodes));
    assert_eq!(paths(&merged.files_read), ["rel.py", "/abs.py"]);
    // Tools are unioned in first-use order.
    let mut older = Ledger {
        files_read: vec![FileUse {
            path: "x".into(),
            tools: vec!["Read".into()],
            count: 1,
        }],
        ..Ledger::default()
    };
    older.merge(Ledger {
        files_read: vec![
            FileUse {
                path: "y".into(),
                tools: vec!["Grep".into()],
                count: 1,
            },
            FileUse {
                path: "x".into(),
                tools: vec!["view".into(), "Read".into()],
                count: 3,
            },
        ],
        user_requests: vec!["go".into()],
        ..Ledger::default()
    });
    assert_eq!(
        older.files_read,
        [
            FileUse {
                path: "x".into(),
                tools: vec!["Read".into(), "view".into()],
                count: 4,
            },
            FileUse {
                path: "y".into(),
                tools: vec!["Grep".into()],
                count: 1,
            },
        ]
    );
    assert_eq!(older.user_requests, ["go"]);
}

#[test]
fn odd_arguments_never_panic() {
    let nodes: Vec<Node> = [
        "null",
        "[1, 2]",
        "\"ls\"",
        "42",
        "{\"path\": 3}",
        "{\"command\": {}}",
        "{\"paths\": [1, null, \"ok.rs\"]}",
        "not json",
    ]
    .iter()
    .enumerate()
    .flat_map(|(i, args)| {
        let id = i.to_string();
        [
            call_raw(&id, "Bash", args),
            call_raw(&id, "Read", args),
            call_raw(&id, "", args),
            result(&id, "", "", true),
        ]
    })
    .collect();
    let l = derive(&nodes);
    assert_eq!(paths(&l.files_read), ["ok.rs"]);
    assert_eq!(commands(&l), ["ls"]);
}

proptest! {
    #[test]
    fn any_tool_call_derives_without_panic(
        name in "[A-Za-z_]{0,12}",
        args in prop_oneof![
            Just(json!(null)),
            "[a-z/ .]{0,12}".prop_map(|s| json!(s)),
            ("[a-z_]{1,10}", "[a-z/ .\n*:]{0,20}").prop_map(|(k, v)| json!({ k: v })),
            ("[a-z_]{1,10}", prop::collection::vec("[a-z/.]{0,8}", 0..3))
                .prop_map(|(k, v)| json!({ k: v })),
        ],
        text in "[a-zA-Z0-9 :/\n<>\\[\\]()-]{0,80}",
        is_error in any::<bool>(),
    ) {
        let nodes = [call("1", &name, args), result("1", &name, &text, is_error)];
        let l = derive(&nodes);
        prop_assert_eq!(&l, &derive(&nodes));
        let odd = l.paths().iter().any(|p| p.contains([',', '{', '}', '(', ')']));
        let ok = odd || round_trips(&l, Some(0));
        prop_assert!(ok);
    }
}
