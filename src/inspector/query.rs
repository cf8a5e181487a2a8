//! Query strings of the inspector's `/api/` routes: each key known to its route, each value
//! parsed with an error that names it, and the Render request they describe.

use std::collections::BTreeMap;

use crate::proto::pb;

/// A route's query: each key at most once (but for the keys a route lets repeat), and only the
/// keys the route knows, so a misspelt parameter is an error instead of silently ignored.
pub struct Query {
    single: BTreeMap<String, String>,
    repeated: BTreeMap<String, Vec<String>>,
}

impl Query {
    pub fn parse(query: Option<&str>, known: &[&str]) -> Result<Self, String> {
        Self::parse_repeating(query, known, &[])
    }

    /// As [`Query::parse`], where each key of `repeating` may come any number of times.
    pub fn parse_repeating(
        query: Option<&str>,
        known: &[&str],
        repeating: &[&str],
    ) -> Result<Self, String> {
        let mut single = BTreeMap::new();
        let mut repeated: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            if repeating.contains(&key.as_ref()) {
                repeated
                    .entry(key.into_owned())
                    .or_default()
                    .push(value.into_owned());
                continue;
            }
            if !known.contains(&key.as_ref()) {
                let all: Vec<&str> = known.iter().chain(repeating).copied().collect();
                let expected = if all.is_empty() {
                    "this route takes none".to_owned()
                } else {
                    format!("expected one of: {}", all.join(", "))
                };
                return Err(format!("unknown query parameter {key:?}; {expected}"));
            }
            if single.insert(key.to_string(), value.into_owned()).is_some() {
                return Err(format!("query parameter {key:?} is given twice"));
            }
        }
        Ok(Self { single, repeated })
    }

    /// Every value of a repeating key, in the order given.
    pub fn all(&self, key: &str) -> &[String] {
        self.repeated.get(key).map_or(&[], Vec::as_slice)
    }

    /// The `KEY=VALUE` pairs of a repeating key; a key given twice must keep its value.
    pub fn pairs(&self, key: &str) -> Result<BTreeMap<String, String>, String> {
        let mut pairs = BTreeMap::new();
        for pair in self.all(key) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                format!("query parameter {key}: expected KEY=VALUE, got {pair:?}")
            })?;
            if let Some(before) = pairs.insert(k.to_owned(), v.to_owned())
                && before != v
            {
                return Err(format!(
                    "query parameter {key}: {k:?} is given two values, {before:?} and {v:?}"
                ));
            }
        }
        Ok(pairs)
    }

    /// The value, or "" when absent (the RPCs' own default for every string field).
    pub fn string(&self, key: &str) -> String {
        self.single.get(key).cloned().unwrap_or_default()
    }

    pub fn u32(&self, key: &str) -> Result<Option<u32>, String> {
        self.number(key)
    }

    pub fn i64(&self, key: &str) -> Result<Option<i64>, String> {
        self.number(key)
    }

    fn number<N: std::str::FromStr>(&self, key: &str) -> Result<Option<N>, String> {
        match self.single.get(key).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                format!("query parameter {key}: {v:?} is not a whole number in range")
            }),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        match self.single.get(key).map(String::as_str) {
            None | Some("") => Ok(None),
            Some("true" | "1") => Ok(Some(true)),
            Some("false" | "0") => Ok(Some(false)),
            Some(v) => Err(format!("query parameter {key}: {v:?} is not true or false")),
        }
    }
}

/// The parameters of `/api/sessions/{id}/render`: RenderRequest's fields, flattened.
pub const RENDER_KEYS: &[&str] = &[
    "branch",
    "node_id",
    "function_id",
    "tokenizer",
    "callers",
    "now_unix_ms",
    "last_call_unix_ms",
    // Budget: present when context_window is.
    "context_window",
    "output_reserve",
    "system_tokens",
    "tools_tokens",
    "schema_tokens",
    // RenderPolicy.
    "microcompact",
    "max_tool_result_chars",
    "microcompact_first",
    "microcompact_every",
    "microcompact_keep",
    "idle_minutes",
    "retain_turns",
    "snip",
    "reactive",
    "recent_tool_result_chars",
    "clear_at_least_tokens",
    "max_tool_input_chars",
    "max_assistant_text_chars",
    "recent_assistant_text_chars",
    "recent_tool_input_chars",
    "payback_odds",
];

/// The Render request a query describes. The values are checked by the RPC itself (an unknown
/// tokenizer, a bad id); here only their syntax, and the choices that are enums.
pub fn render_request(session_id: String, q: &Query) -> Result<pb::RenderRequest, String> {
    let targets = [
        ("branch", q.string("branch")),
        ("node_id", q.string("node_id")),
        ("function_id", q.string("function_id")),
    ];
    let mut given = targets.into_iter().filter(|(_, v)| !v.is_empty());
    let target = match (given.next(), given.next()) {
        (Some(_), Some(_)) => {
            return Err("give at most one of branch, node_id and function_id".to_owned());
        }
        (Some(("node_id", v)), None) => Some(pb::render_request::Target::NodeId(v)),
        (Some(("function_id", v)), None) => Some(pb::render_request::Target::FunctionId(v)),
        (Some((_, v)), None) => Some(pb::render_request::Target::Branch(v)),
        (None, _) => None,
    };
    let callers = match q.string("callers").as_str() {
        "" | "all" => pb::Callers::All,
        "none" => pb::Callers::None,
        other => return Err(format!("callers: {other:?} is not all or none")),
    };
    let microcompact = match q.string("microcompact").as_str() {
        "" | "stepped" => pb::MicrocompactMode::Stepped,
        "over_budget" => pb::MicrocompactMode::OverBudget,
        other => {
            return Err(format!(
                "microcompact: {other:?} is not stepped or over_budget"
            ));
        }
    };
    let budget = match q.u32("context_window")? {
        None => None,
        Some(context_window) => Some(pb::Budget {
            context_window,
            output_reserve: q.u32("output_reserve")?.unwrap_or(0),
            system_tokens: q.u32("system_tokens")?.unwrap_or(0),
            tools_tokens: q.u32("tools_tokens")?.unwrap_or(0),
            schema_tokens: q.u32("schema_tokens")?.unwrap_or(0),
        }),
    };
    let policy = pb::RenderPolicy {
        max_tool_result_chars: q.u32("max_tool_result_chars")?.unwrap_or(0),
        microcompact_first: q.u32("microcompact_first")?.unwrap_or(0),
        microcompact_every: q.u32("microcompact_every")?.unwrap_or(0),
        microcompact_keep: q.u32("microcompact_keep")?.unwrap_or(0),
        idle_minutes: q.u32("idle_minutes")?.unwrap_or(0),
        retain_turns: q.u32("retain_turns")?.unwrap_or(0),
        snip: q.bool("snip")?,
        reactive: q.bool("reactive")?.unwrap_or(false),
        microcompact: microcompact as i32,
        recent_tool_result_chars: q.u32("recent_tool_result_chars")?.unwrap_or(0),
        clear_at_least_tokens: q.u32("clear_at_least_tokens")?,
        max_tool_input_chars: q.u32("max_tool_input_chars")?,
        max_assistant_text_chars: q.u32("max_assistant_text_chars")?,
        recent_assistant_text_chars: q.u32("recent_assistant_text_chars")?,
        recent_tool_input_chars: q.u32("recent_tool_input_chars")?,
        payback_odds: q.u32("payback_odds")?.unwrap_or(0),
        cache_read_price: None,
        cache_write_price: None,
        reasoning: 0,
    };
    Ok(pb::RenderRequest {
        session_id,
        target,
        tokenizer: q.string("tokenizer"),
        callers: callers as i32,
        budget,
        policy: Some(policy),
        now_unix_ms: q.i64("now_unix_ms")?.unwrap_or(0),
        last_call_unix_ms: q.i64("last_call_unix_ms")?.unwrap_or(0),
        format: pb::Format::Neutral as i32,
        // Neutral messages carry every part: nothing for strict_format to refuse.
        ..pb::RenderRequest::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_repeated_keys_are_refused_by_name() {
        let e = Query::parse(Some("page_size=2&pagesize=3"), &["page_size"])
            .err()
            .expect("unknown key");
        assert!(e.contains("\"pagesize\""), "{e}");
        let e = Query::parse(Some("a=1&a=2"), &["a"]).err().expect("twice");
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn repeating_keys_gather_pairs_and_refuse_two_values_for_one_key() {
        let q = Query::parse_repeating(
            Some("metadata=team%3Da&metadata=run=1&page_size=2"),
            &["page_size"],
            &["metadata"],
        )
        .unwrap();
        let pairs = q.pairs("metadata").unwrap();
        assert_eq!(pairs["team"], "a");
        assert_eq!(pairs["run"], "1");
        let refused = |query: &str| {
            let q = Query::parse_repeating(Some(query), &[], &["metadata"]).unwrap();
            q.pairs("metadata").unwrap_err()
        };
        assert!(refused("metadata=a=1&metadata=a=2").contains("two values"));
        assert!(refused("metadata=novalue").contains("KEY=VALUE"));
    }

    #[test]
    fn numbers_and_choices_name_the_parameter() {
        let q = Query::parse(Some("context_window=lots"), RENDER_KEYS).unwrap();
        let e = render_request("s".into(), &q).unwrap_err();
        assert!(e.starts_with("query parameter context_window"), "{e}");
        let q = Query::parse(Some("microcompact=sometimes"), RENDER_KEYS).unwrap();
        assert!(
            render_request("s".into(), &q)
                .unwrap_err()
                .contains("microcompact")
        );
        let q = Query::parse(Some("branch=a&node_id=b"), RENDER_KEYS).unwrap();
        assert!(render_request("s".into(), &q).is_err());
    }

    #[test]
    fn a_budget_needs_a_window_and_the_target_defaults_to_main() {
        let q = Query::parse(Some("context_window=1000&output_reserve=10"), RENDER_KEYS).unwrap();
        let r = render_request("s".into(), &q).unwrap();
        assert_eq!(r.budget.unwrap().output_reserve, 10);
        assert!(r.target.is_none());
        let q = Query::parse(Some("output_reserve=10&reactive=true"), RENDER_KEYS).unwrap();
        let r = render_request("s".into(), &q).unwrap();
        assert!(r.budget.is_none());
        assert!(r.policy.unwrap().reactive);
    }
}
