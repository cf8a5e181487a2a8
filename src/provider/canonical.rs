//! The one identity canonicalisation of provider JSON: a block, an item or tool-call arguments
//! written the same whoever sent them (gateway or import), however keys were ordered or spaced.

use serde_json::Value;

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
