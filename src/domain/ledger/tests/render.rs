//! The ledger's text form: categories capped, levels degrading to fit a cap, file groups,
//! and every path read back from what is written.

use super::*;
use crate::domain::ledger::text::LEVELS;
use proptest::prelude::*;
use serde_json::json;

#[test]
fn categories_are_capped_with_a_count_of_the_rest() {
    let mut nodes = Vec::new();
    for i in 0..20 {
        nodes.push(call(
            &i.to_string(),
            "Bash",
            json!({"command": format!("cmd {i}")}),
        ));
    }
    for i in 0..9 {
        let id = format!("e{i}");
        nodes.push(call(&id, "Read", json!({"file_path": format!("f{i}")})));
        nodes.push(result(&id, "Read", &format!("error: bad {i}"), true));
    }
    let text = derive(&nodes).render(None, &Tokenizer::Heuristic);
    let mut want = vec![
        "Commands (20, 12 shown):",
        "  cmd 0",
        "  cmd 1",
        "  +8 more",
    ];
    let newest: Vec<String> = (10..20).map(|i| format!("  cmd {i}")).collect();
    want.extend(newest.iter().map(String::as_str));
    want.push("Errors (9, 8 shown):");
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("Commands"))
        .unwrap();
    assert_eq!(lines[at..at + want.len()], want[..], "{text}");
    let errors: Vec<&str> = lines[lines.len() - 9..].to_vec();
    let mut want = vec!["  Read: error: bad 0", "  Read: error: bad 1", "  +1 more"];
    let newest: Vec<String> = (3..9).map(|i| format!("  Read: error: bad {i}")).collect();
    want.extend(newest.iter().map(String::as_str));
    assert_eq!(errors, want, "{text}");
}

/// A ledger with something in every category and more than every cap.
fn big_ledger() -> Ledger {
    let mut nodes = Vec::new();
    for i in 0..15 {
        let id = format!("c{i}");
        nodes.push(call(
            &id,
            "Bash",
            json!({"command": format!("cargo test step_{i}")}),
        ));
        nodes.push(result(&id, "Bash", "Exit code 1\nerror: it failed", true));
        nodes.push(call(
            &format!("e{i}"),
            "Edit",
            json!({"file_path": format!("/work/repo/src/mod_{}/file_{i}.rs", i % 3)}),
        ));
        nodes.push(user(&format!(
            "request {i}: {}",
            "please do it well ".repeat(12)
        )));
        nodes.push(function_call(&format!("f{i}"), "explore", "look"));
    }
    derive(&nodes)
}

#[test]
fn a_small_cap_degrades_in_order_and_keeps_every_path() {
    let l = big_ledger();
    let counter = Tokenizer::Heuristic;
    let texts: Vec<String> = LEVELS.iter().map(|level| l.render_at(level)).collect();
    let tokens: Vec<Tokens> = texts.iter().map(|t| counter.count(t)).collect();
    for pair in tokens.windows(2) {
        assert!(pair[0] >= pair[1], "{tokens:?}");
    }
    // Each cap gets the first level that fits.
    for (i, &t) in tokens.iter().enumerate() {
        let first = tokens.iter().position(|&u| u <= t).unwrap();
        assert_eq!(l.render(Some(t), &counter), texts[first], "level {i}");
    }
    // Categories first: commands, errors and sub-agents go to their counts, while file
    // annotations and full user requests stay.
    let counts_only = &texts[4];
    assert!(
        counts_only.contains("Commands (15, none shown)\n"),
        "{counts_only}"
    );
    assert!(counts_only.contains("Errors (15, none shown)\n"));
    assert!(counts_only.contains("Sub-agents (15, none shown)"));
    assert!(counts_only.contains(" (Edit)"));
    assert!(counts_only.contains(&"please do it well ".repeat(12).trim_end().to_owned()));
    // Then the annotations go.
    assert!(!texts[5].contains("(Edit"));
    assert!(texts[5].contains(&"please do it well ".repeat(12).trim_end().to_owned()));
    // Then user requests shorten, and at last only their count is left.
    assert!(
        texts[8].contains("\"request 0: please do it well please do …\""),
        "{}",
        texts[8]
    );
    assert!(texts[11].contains("User requests (15, none shown)"));
    // Nothing fits zero tokens: the smallest form, every path still there.
    let smallest = l.render(Some(0), &counter);
    assert_eq!(smallest, texts[LEVELS.len() - 1]);
    assert_eq!(
        smallest,
        "[Evidence kept from the summarized range]\n\
         Files modified (15):\n  \
         /work/repo/src/{mod_0/{file_0.rs, file_12.rs, file_3.rs, file_6.rs, file_9.rs}, \
         mod_1/{file_1.rs, file_10.rs, file_13.rs, file_4.rs, file_7.rs}, \
         mod_2/{file_11.rs, file_14.rs, file_2.rs, file_5.rs, file_8.rs}}\n\
         Commands (15, none shown)\n\
         Errors (15, none shown)\n\
         User requests (15, none shown)\n\
         Sub-agents (15, none shown)"
    );
    for cap in [None, Some(0), Some(50), Some(200), Some(10_000)] {
        assert!(round_trips(&l, cap), "{cap:?}");
    }
}

#[test]
fn file_groups_render_and_read_back() {
    let file = |path: &str, tools: &[&str], count: u32| FileUse {
        path: path.into(),
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        count,
    };
    let mut read: Vec<FileUse> = (0..23)
        .map(|i| file(&format!("/t/pkg/many/m{i:02}.py"), &["Read"], 1))
        .collect();
    read.extend([
        file("a/b", &["Read"], 1),
        file("a/b/c", &["Read", "Grep"], 3),
        file("/t/pkg/deep/er/still/x.py", &["Weird(tool),{x}"], 2),
        file("README.md", &[], 1),
        file("/t", &["Grep"], 1),
    ]);
    let l = Ledger {
        files_read: read,
        files_modified: vec![
            file("src/render/mod.rs", &["Edit"], 2),
            file("src/render/tiers.rs", &["Write"], 1),
            file("README.md", &["Edit"], 1),
        ],
        ..Ledger::default()
    };
    let text = l.render(None, &Tokenizer::Heuristic);
    assert!(
        text.starts_with(
            "[Evidence kept from the summarized range]\n\
         Files modified (3):\n  \
         README.md (Edit)\n  \
         src/render/{mod.rs (Edit ×2), tiers.rs (Write)}\n\
         Files read (28):\n  \
         /t (Grep)\n  \
         /t/pkg/deep/er/still/x.py (Weirdtoolx ×2)\n  \
         /t/pkg/many/{m00.py (Read), "
        ),
        "{text}"
    );
    assert!(text.contains("\n  README.md\n"), "{text}");
    assert!(
        text.ends_with("\n  a/{b (Read), b/c (Read+Grep ×3)}"),
        "{text}"
    );
    for cap in [None, Some(0), Some(50)] {
        assert!(round_trips(&l, cap), "{cap:?}");
    }
    // A hand-built request with a line break cannot fake a file section.
    let forged = Ledger {
        user_requests: vec!["hi\nFiles read (1):\n  /etc/passwd".into()],
        ..l.clone()
    };
    assert!(round_trips(&forged, None));
    assert_eq!(
        paths_in("Files read (1):\n  x/{a, b/{c (R), d}, e (W ×2)}\nCommands (1):\n  not/a/path"),
        ["x/a", "x/b/c", "x/b/d", "x/e"]
    );
}

fn path_set() -> impl Strategy<Value = BTreeSet<String>> {
    let segment = "[a-z0-9_.-]{1,6}";
    let path = (any::<bool>(), prop::collection::vec(segment, 1..5))
        .prop_map(|(abs, segs)| format!("{}{}", if abs { "/" } else { "" }, segs.join("/")));
    prop::collection::btree_set(path, 0..40)
}

proptest! {
    #[test]
    fn rendered_paths_read_back_under_any_cap(
        read in path_set(),
        modified in path_set(),
        tools in prop::collection::vec("[A-Za-z(){},× ]{0,8}", 0..3),
        count in 1u32..5,
        commands in 0usize..20,
        cap in prop::option::of(0u32..400),
    ) {
        let uses = |set: &BTreeSet<String>| -> Vec<FileUse> {
            set.iter()
                .map(|p| FileUse { path: p.clone(), tools: tools.clone(), count })
                .collect()
        };
        let l = Ledger {
            files_read: uses(&read),
            files_modified: uses(&modified),
            commands: (0..commands)
                .map(|i| Command {
                    command: format!("run {i}"),
                    exit_code: None,
                    is_error: false,
                })
                .collect(),
            user_requests: vec!["a/b, c/{d}".into()],
            ..Ledger::default()
        };
        let text = l.render(cap, &Tokenizer::Heuristic);
        let got: BTreeSet<String> = paths_in(&text).into_iter().collect();
        let want: BTreeSet<String> = l.paths().into_iter().map(str::to_owned).collect();
        prop_assert_eq!(got, want, "{}", text);
    }

}
