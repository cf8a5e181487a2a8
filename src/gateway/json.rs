//! JSON the gateway handles without changing it: a request body's top-level fields in their
//! order and bytes (only `messages` is replaced), and the canonical form that makes a block's
//! identity independent of key order, spacing and cache markers.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON object's members in their order, each value borrowed from the body it was read
/// from: read once, it gives a field's bytes and the body with that field replaced, copying
/// nothing in between.
pub struct Members<'a>(Vec<(std::borrow::Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Visit<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'a>, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) =
                    map.next_entry::<std::borrow::Cow<'a, str>, &'a RawValue>()?
                {
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl<'a> Members<'a> {
    /// The members of `body`; `None` when it is not a JSON object.
    pub fn of(body: &'a [u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The bytes of member `field`.
    pub fn get(&self, field: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == field).map(|(_, v)| *v)
    }

    /// The body with member `field` replaced by an array of `entries` (each a JSON value's
    /// text), every other member byte-identical and in its place, written once.
    pub fn with_entries<S: AsRef<str>>(&self, field: &str, entries: &[S]) -> Option<Vec<u8>> {
        let len = entries.iter().map(|e| e.as_ref().len() + 1).sum::<usize>() + 2;
        self.written(field, len, |out| {
            out.push(b'[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(e.as_ref().as_bytes());
            }
            out.push(b']');
        })
    }

    fn written(
        &self,
        field: &str,
        len: usize,
        value: impl FnOnce(&mut Vec<u8>),
    ) -> Option<Vec<u8>> {
        // Exact, but for escapes in keys: a body of many megabytes is not grown (and copied)
        // for the last few bytes.
        let size: usize = self
            .0
            .iter()
            .map(|(k, v)| k.len() + 4 + if k == field { len } else { v.get().len() })
            .sum();
        let mut out = Vec::with_capacity(size + 2);
        let mut value = Some(value);
        out.push(b'{');
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(serde_json::to_string(k.as_ref()).ok()?.as_bytes());
            out.push(b':');
            match value.take_if(|_| k == field) {
                Some(write) => write(&mut out),
                None => out.extend_from_slice(v.get().as_bytes()),
            }
        }
        out.push(b'}');
        Some(out)
    }
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
        let body = br#"{"model" : "m",  "messages":[1,2], "z":{"b":1,"a":2}, "k\"q":0}"#;
        let members = Members::of(body).unwrap();
        assert_eq!(members.get("messages").map(RawValue::get), Some("[1,2]"));
        let out = members
            .with_entries("messages", &["3", "{\"a\":4}"])
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m","messages":[3,{"a":4}],"z":{"b":1,"a":2},"k\"q":0}"#
        );
        assert!(Members::of(b"[1]").is_none());
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
