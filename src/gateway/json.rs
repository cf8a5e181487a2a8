//! JSON the gateway handles without changing it: a request body's top-level fields in their
//! order and bytes (only `messages` is replaced).

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
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

    /// The bytes of member `field` when the body has it once (a JSON reader takes the last of
    /// several, this the first: a body with several is not read by its bytes).
    pub fn only(&self, field: &str) -> Option<&'a RawValue> {
        let mut named = self.0.iter().filter(|(k, _)| k == field);
        let (_, value) = named.next()?;
        named.next().is_none().then_some(*value)
    }

    /// The bytes of member `field`.
    pub fn get(&self, field: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == field).map(|(_, v)| *v)
    }

    /// The body with member `field` replaced by an array of `entries` (each a JSON value's
    /// text), every other member byte-identical and in its place, written once.
    pub fn with_entries<S: AsRef<str>>(&self, field: &str, entries: &[S]) -> Option<Vec<u8>> {
        let len = entries.iter().map(|e| e.as_ref().len() + 1).sum::<usize>() + 2;
        self.written(Some(field), len, |out| {
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

    /// The body with member `field` set to `value` (a JSON value's text): in its place when the
    /// body has it, else last; every other member byte-identical.
    pub fn with_member(&self, field: &str, value: &str) -> Option<Vec<u8>> {
        if self.get(field).is_some() {
            return self.written(Some(field), value.len(), |out| {
                out.extend_from_slice(value.as_bytes());
            });
        }
        let mut out = self.written(None, 0, |_| {})?;
        out.pop();
        if !self.0.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(field).ok()?.as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        out.push(b'}');
        Some(out)
    }

    /// The body with member `field`'s value written by `value` (`len` bytes, for the
    /// capacity); `None` for no field: the members as they are.
    fn written(
        &self,
        field: Option<&str>,
        len: usize,
        value: impl FnOnce(&mut Vec<u8>),
    ) -> Option<Vec<u8>> {
        // Exact, but for escapes in keys: a body of many megabytes is not grown (and copied)
        // for the last few bytes.
        let size: usize = self
            .0
            .iter()
            .map(|(k, v)| {
                k.len()
                    + 4
                    + if Some(k.as_ref()) == field {
                        len
                    } else {
                        v.get().len()
                    }
            })
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
            match value.take_if(|_| Some(k.as_ref()) == field) {
                Some(write) => write(&mut out),
                None => out.extend_from_slice(v.get().as_bytes()),
            }
        }
        out.push(b'}');
        Some(out)
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
        let set = members.with_member("z", "null").unwrap();
        assert_eq!(
            std::str::from_utf8(&set).unwrap(),
            r#"{"model":"m","messages":[1,2],"z":null,"k\"q":0}"#
        );
        let added = members.with_member("cm", r#"{"a":1}"#).unwrap();
        assert_eq!(
            std::str::from_utf8(&added).unwrap(),
            r#"{"model":"m","messages":[1,2],"z":{"b":1,"a":2},"k\"q":0,"cm":{"a":1}}"#
        );
    }
}
