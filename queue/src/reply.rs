//! Parsing of stream replies that redis-rs' typed helpers do not cover faithfully.
//!
//! Stream entries whose payload was deleted come back as `nil` in history reads and in Redis
//! 6.2's XAUTOCLAIM; Redis 7's XAUTOCLAIM adds a third element listing them. Payloads must stay
//! raw bytes (a job may be non-UTF-8 garbage that still has to reach the dead-letter stream).
//! These functions accept both RESP2 arrays and RESP3 maps.

use redis::Value;

/// One stream entry; `fields` is `None` when the entry was deleted but still pending.
#[derive(Debug, Clone)]
pub(crate) struct RawEntry {
    pub id: String,
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl RawEntry {
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .as_ref()?
            .iter()
            .find(|(k, _)| k == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }
}

pub(crate) fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.clone().into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

pub(crate) fn string(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => string(other)?.parse().ok(),
    }
}

/// The elements of an array-like value, or of a map flattened to key, value, key, value.
pub(crate) fn items(v: &Value) -> Option<Vec<&Value>> {
    match v {
        Value::Array(a) | Value::Set(a) => Some(a.iter().collect()),
        Value::Map(m) => Some(m.iter().flat_map(|(k, v)| [k, v]).collect()),
        Value::Attribute { data, .. } => items(data),
        _ => None,
    }
}

/// Key/value pairs of a flat `k v k v` array or a map (XINFO replies).
pub(crate) fn pairs(v: &Value) -> Vec<(String, &Value)> {
    let Some(items) = items(v) else {
        return Vec::new();
    };
    items
        .chunks_exact(2)
        .filter_map(|kv| Some((string(kv[0])?, kv[1])))
        .collect()
}

pub(crate) fn entry(v: &Value) -> Option<RawEntry> {
    match v {
        // Redis 6.2 XAUTOCLAIM: a deleted entry is a bare nil; its id is unknown.
        Value::Nil => None,
        _ => {
            let parts = items(v)?;
            let id = string(parts.first()?)?;
            let fields = match parts.get(1) {
                None | Some(Value::Nil) => None,
                Some(f) => Some(
                    items(f)?
                        .chunks_exact(2)
                        .filter_map(|kv| Some((bytes(kv[0])?, bytes(kv[1])?)))
                        .collect(),
                ),
            };
            Some(RawEntry { id, fields })
        }
    }
}

pub(crate) fn entries(v: &Value) -> Vec<RawEntry> {
    items(v)
        .unwrap_or_default()
        .into_iter()
        .filter_map(entry)
        .collect()
}

/// XREADGROUP: `nil` on timeout, else stream -> entries.
pub(crate) fn xread(v: &Value) -> Vec<(String, Vec<RawEntry>)> {
    if matches!(v, Value::Nil) {
        return Vec::new();
    }
    let mut out = Vec::new();
    match v {
        Value::Map(m) => {
            for (k, e) in m {
                if let Some(k) = string(k) {
                    out.push((k, entries(e)));
                }
            }
        }
        _ => {
            for s in items(v).unwrap_or_default() {
                let Some(parts) = items(s) else { continue };
                if let (Some(k), Some(e)) = (parts.first().and_then(|k| string(k)), parts.get(1)) {
                    out.push((k, entries(e)));
                }
            }
        }
    }
    out
}

/// XAUTOCLAIM: `(next cursor, claimed entries, ids deleted from the stream)`. Redis 7 returns
/// three elements; 6.2 returns two and marks deleted entries with nil (their ids are lost).
pub(crate) fn autoclaim(v: &Value) -> Option<(String, Vec<RawEntry>, Vec<String>)> {
    let parts = items(v)?;
    let cursor = string(parts.first()?)?;
    let claimed = entries(parts.get(1)?);
    let deleted = parts
        .get(2)
        .and_then(|d| items(d))
        .unwrap_or_default()
        .into_iter()
        .filter_map(string)
        .collect();
    Some((cursor, claimed, deleted))
}

/// XPENDING extended form: `(id, consumer, idle_ms, deliveries)` rows.
pub(crate) fn pending_rows(v: &Value) -> Vec<(String, String, u64, u64)> {
    items(v)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|row| {
            let r = items(row)?;
            Some((
                string(r.first()?)?,
                string(r.get(1)?)?,
                int(r.get(2)?)?.max(0) as u64,
                int(r.get(3)?)?.max(0) as u64,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry_value(id: &str) -> Value {
        Value::Array(vec![bulk(id), Value::Array(vec![bulk("job"), bulk("{}")])])
    }

    #[test]
    fn autoclaim_reads_the_redis_7_three_element_reply() {
        let v = Value::Array(vec![
            bulk("5-0"),
            Value::Array(vec![entry_value("1-0"), entry_value("2-0")]),
            Value::Array(vec![bulk("3-0")]),
        ]);
        let (cursor, claimed, deleted) = autoclaim(&v).unwrap();
        assert_eq!(cursor, "5-0");
        let ids: Vec<&str> = claimed.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["1-0", "2-0"]);
        assert_eq!(claimed[0].field("job"), Some(&b"{}"[..]));
        assert_eq!(deleted, ["3-0"]);
    }

    #[test]
    fn autoclaim_reads_the_redis_6_two_element_reply_with_nil_entries() {
        let v = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry_value("1-0"), Value::Nil]),
        ]);
        let (cursor, claimed, deleted) = autoclaim(&v).unwrap();
        assert_eq!(cursor, "0-0");
        assert_eq!(claimed.len(), 1);
        assert!(deleted.is_empty());
    }

    #[test]
    fn history_reads_mark_deleted_entries() {
        let v = Value::Array(vec![Value::Array(vec![
            bulk("forkbox:{q}:jobs"),
            Value::Array(vec![
                entry_value("1-0"),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let streams = xread(&v);
        assert_eq!(streams.len(), 1);
        assert!(streams[0].1[0].fields.is_some());
        assert!(streams[0].1[1].fields.is_none());
        assert!(xread(&Value::Nil).is_empty());
    }
}
