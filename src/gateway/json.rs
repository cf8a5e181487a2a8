//! JSON the gateway handles without changing it: a request body's top-level fields in their
//! order and bytes (only `messages` is replaced), and the canonical form that makes a block's
//! identity independent of key order, spacing and cache markers.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON object's members in their order, each value as its bytes.
pub struct Fields(pub Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// `body` with its top-level `field` replaced by `value` (already JSON), every other member
/// byte-identical and in its place. `None` when `body` is not a JSON object.
pub fn replace_field(body: &[u8], field: &str, value: &str) -> Option<Vec<u8>> {
    let Fields(members) = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    out.push(b'{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(k).ok()?.as_bytes());
        out.push(b':');
        if k == field {
            out.extend_from_slice(value.as_bytes());
        } else {
            out.extend_from_slice(v.get().as_bytes());
        }
    }
    out.push(b'}');
    Some(out)
}

/// `value` with object keys sorted and no spacing (serde_json's map is ordered by key), and
/// from the top-level object `cache_control` removed (a marker a client moves from call to call
/// is not part of what a block says) and members that are `null` (a client that resends an item
/// may add `"content": null` where the provider sent no such member: absent and null alike).
pub fn canonical_block(value: &Value) -> String {
    match value {
        Value::Object(map)
            if map.contains_key("cache_control") || map.values().any(Value::is_null) =>
        {
            let map: serde_json::Map<String, Value> = map
                .iter()
                .filter(|(k, v)| *k != "cache_control" && !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            canonical(&Value::Object(map))
        }
        _ => canonical(value),
    }
}

/// `value` with object keys sorted and no spacing.
pub fn canonical(value: &Value) -> String {
    // serde_json's `Map` is a BTreeMap unless `preserve_order` is on, which this crate never
    // turns on; sort explicitly anyway, so a feature enabled elsewhere cannot change identities.
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sorted(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// Tool-call arguments in canonical form: the same object however a client spaced or ordered
/// it. Text that is not JSON is kept as it is (the store refuses it, and the request passes
/// through unrecorded).
pub fn canonical_arguments(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value) => canonical(&value),
        Err(_) => arguments.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_keeps_other_members_byte_exact() {
        let body = br#"{"model" : "m",  "messages":[1,2], "z":{"b":1,"a":2}}"#;
        let out = replace_field(body, "messages", "[3]").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m","messages":[3],"z":{"b":1,"a":2}}"#
        );
        assert!(replace_field(b"[1]", "messages", "[]").is_none());
    }

    #[test]
    fn canonical_ignores_order_spacing_and_markers() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": 2, "x": 1}}"#).unwrap();
        let b: Value = serde_json::from_str(
            r#"{"a":{"x":1,"y":2},"b":1,"cache_control":{"type":"ephemeral"},"content":null}"#,
        )
        .unwrap();
        assert_eq!(canonical_block(&a), canonical_block(&b));
        assert_eq!(canonical_arguments("{ \"p\" : 1 }"), r#"{"p":1}"#);
    }
}
