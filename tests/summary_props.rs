//! Property tests of the summary overlay: branch isolation and non-destruction.

use std::collections::HashSet;

use ctxd::domain::{
    CompactionId, Hash, Node, NodeContent, NodeId, Part, PathView, Role, Summary, SummaryId,
    SummaryKind,
};
use ctxd::render::{Options, render};
use ctxd::tokens::Tokenizer;
use proptest::prelude::*;

#[path = "common/provider_rules.rs"]
mod provider_rules;

fn message(role: Role, text: String, parent: Option<NodeId>, at: i64) -> Node {
    Node {
        id: NodeId::new(),
        parent_id: parent,
        function_id: None,
        content: NodeContent::Message {
            role,
            parts: vec![Part::Text(text)],
            tool_calls: Vec::new(),
        },
        created_at_ms: at,
        hash: Hash([0; 32]),
    }
}

/// A trunk of `len` alternating user/assistant messages and a fork of `fork_len` more from
/// node `fork_at`: returns (trunk path, fork path).
fn paths(len: usize, fork_at: usize, fork_len: usize) -> (Vec<Node>, Vec<Node>) {
    let mut trunk: Vec<Node> = Vec::new();
    for i in 0..len {
        let role = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        let parent = trunk.last().map(|n| n.id);
        trunk.push(message(role, format!("trunk {i}"), parent, i as i64));
    }
    let mut fork: Vec<Node> = trunk[..=fork_at].to_vec();
    for i in 0..fork_len {
        let role = if (fork_at + 1 + i).is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        };
        let parent = fork.last().map(|n| n.id);
        fork.push(message(role, format!("fork {i}"), parent, (len + i) as i64));
    }
    (trunk, fork)
}

fn summary(covers: Vec<NodeId>, text: &str, base: NodeId, at: i64) -> Summary {
    Summary {
        id: SummaryId::new(),
        compaction_id: CompactionId::new(),
        kind: SummaryKind::Rolling,
        covers,
        range: None,
        text: text.to_owned(),
        rolls_over: Vec::new(),
        ledger: None,
        model: "m".to_owned(),
        base_head: base,
        tokens_before: 0,
        tokens_after: 0,
        created_at_ms: at,
    }
}

fn ids(nodes: &[Node]) -> HashSet<NodeId> {
    nodes.iter().map(|n| n.id).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// A summary shows on a path exactly when every node it covers is on it; then none of the
    /// covered nodes renders, every other node does, in order, and the newest applicable
    /// summary wins.
    #[test]
    fn summaries_show_only_where_all_they_cover_is(
        len in 2usize..30,
        fork_frac in 0.0f64..1.0,
        fork_len in 0usize..6,
        cover_frac in 0.0f64..1.0,
        second in any::<bool>(),
    ) {
        let fork_at = ((len - 1) as f64 * fork_frac) as usize;
        let (trunk, fork) = paths(len, fork_at, fork_len);
        let cover_end = 1 + ((len - 1) as f64 * cover_frac) as usize;
        let covers: Vec<NodeId> = trunk[..cover_end].iter().map(|n| n.id).collect();
        let mut summaries = vec![summary(covers.clone(), "first", trunk[len - 1].id, 1)];
        if second && cover_end > 1 {
            // An older-range summary made later: the newest applicable one wins.
            summaries.push(summary(covers[..cover_end - 1].to_vec(), "second", trunk[len - 1].id, 2));
        }
        for path_nodes in [&trunk, &fork] {
            let on_path = ids(path_nodes);
            let path = PathView { nodes: path_nodes.iter().cloned().map(std::sync::Arc::new).collect(), summaries: summaries.clone(), ..PathView::default() };
            let r = render(&path, &Options::default(), &Tokenizer::Heuristic);
            let winner = summaries.iter().rev().find(|s| s.covers.iter().all(|id| on_path.contains(id)));
            let shown: Vec<&ctxd::render::Message> = r.messages.iter().filter(|m| m.summary_id.is_some()).collect();
            match winner {
                None => {
                    prop_assert!(shown.is_empty());
                    prop_assert_eq!(r.messages.len(), path_nodes.len());
                }
                Some(s) => {
                    prop_assert_eq!(shown.len(), 1);
                    prop_assert_eq!(shown[0].summary_id, Some(s.id));
                    let covered: HashSet<NodeId> = s.covers.iter().copied().collect();
                    let expected: Vec<NodeId> = path_nodes.iter().map(|n| n.id).filter(|id| !covered.contains(id)).collect();
                    let rendered: Vec<NodeId> = r.messages.iter().flat_map(|m| m.node_ids.clone()).collect();
                    prop_assert_eq!(rendered, expected);
                    prop_assert_eq!(r.report.summary, Some(s.id));
                }
            }
            // The provider documents stay valid with the summary in them.
            let openai = ctxd::provider::format::openai_chat(&r.messages);
            prop_assert!(provider_rules::check_openai(&openai).is_ok(), "{openai}");
            let anthropic = ctxd::provider::format::anthropic_messages(&r.messages);
            prop_assert!(provider_rules::check_anthropic(&anthropic).is_ok(), "{anthropic}");
            // Same inputs, same output.
            prop_assert_eq!(&r, &render(&path, &Options::default(), &Tokenizer::Heuristic));
        }
    }
}
