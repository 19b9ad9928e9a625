//! Reading one record from its line: the envelope's fields typed as they
//! come, every other field kept as it is, in one pass over the line (the
//! derived reader of a flattened map buffers every field first, and costs
//! twice the time and memory on a journal of a million records).

use super::Record;
use serde::de::{Deserialize, Deserializer, Error, MapAccess, Visitor};
use serde_json::{Map, Value};

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Record, D::Error> {
        d.deserialize_map(RecordVisitor)
    }
}

struct RecordVisitor;

/// Take `key`'s value once: a second one is an error, as in a derived
/// reader.
fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
    key: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(A::Error::duplicate_field(key));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

impl<'de> Visitor<'de> for RecordVisitor {
    type Value = Record;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a journal record (an object with v, ts, kind and attempt)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Record, A::Error> {
        let (mut v, mut ts, mut kind, mut attempt) = (None, None, None, None);
        let (mut rank, mut node): (Option<Option<u32>>, Option<Option<String>>) = (None, None);
        let mut data = Map::new();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::V => once(&mut map, &mut v, "v")?,
                Key::Ts => once(&mut map, &mut ts, "ts")?,
                Key::Kind => once(&mut map, &mut kind, "kind")?,
                Key::Attempt => once(&mut map, &mut attempt, "attempt")?,
                Key::Rank => once(&mut map, &mut rank, "rank")?,
                Key::Node => once(&mut map, &mut node, "node")?,
                Key::Other(key) => {
                    let value: Value = map.next_value()?;
                    data.insert(key, value);
                }
            }
        }
        Ok(Record {
            v: v.ok_or_else(|| A::Error::missing_field("v"))?,
            ts: ts.ok_or_else(|| A::Error::missing_field("ts"))?,
            kind: kind.ok_or_else(|| A::Error::missing_field("kind"))?,
            attempt: attempt.ok_or_else(|| A::Error::missing_field("attempt"))?,
            rank: rank.flatten(),
            node: node.flatten(),
            data,
            parsed: Default::default(),
        })
    }
}

/// A record's key: one of the envelope's, or another kept by its name.
enum Key {
    V,
    Ts,
    Kind,
    Attempt,
    Rank,
    Node,
    Other(String),
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        d.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: Error>(self, k: &str) -> Result<Key, E> {
        Ok(match k {
            "v" => Key::V,
            "ts" => Key::Ts,
            "kind" => Key::Kind,
            "attempt" => Key::Attempt,
            "rank" => Key::Rank,
            "node" => Key::Node,
            other => Key::Other(other.to_string()),
        })
    }

    fn visit_string<E: Error>(self, k: String) -> Result<Key, E> {
        match self.visit_str::<E>(&k)? {
            Key::Other(_) => Ok(Key::Other(k)),
            known => Ok(known),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Record;

    fn read(line: &str) -> Result<Record, serde_json::Error> {
        serde_json::from_str(line)
    }

    #[test]
    fn a_record_reads_its_envelope_typed_and_keeps_every_other_field() {
        let r = read(
            r#"{"v":1,"ts":"2026-11-29T06:00:04.155749823Z","kind":"progress","attempt":2,"rank":5,"node":"gpu0000","run":"slurm-7","step":250,"st\u0065p2":[1,{"a":null}]}"#,
        )
        .unwrap();
        assert_eq!((r.v, r.attempt, r.rank), (1, 2, Some(5)));
        assert_eq!(r.kind, "progress");
        assert_eq!(r.node.as_deref(), Some("gpu0000"));
        assert_eq!(r.ts.to_rfc3339(), "2026-11-29T06:00:04.155749823+00:00");
        assert_eq!(r.run(), Some("slurm-7"));
        assert_eq!(r.u64("step"), Some(250));
        assert_eq!(r.get("step2"), Some(&serde_json::json!([1, {"a": null}])));
        assert_eq!(r.data.len(), 3, "{:?}", r.data);
        // Written back, it is the same record (the envelope first).
        let again = read(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
        // A rank or node of null is none.
        let r = read(
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"x","attempt":0,"rank":null,"node":null}"#,
        )
        .unwrap();
        assert_eq!((r.rank, r.node), (None, None));
        assert!(r.data.is_empty());
    }

    #[test]
    fn a_record_lacking_an_envelope_field_or_giving_one_twice_or_mistyped_does_not_read() {
        let base = r#""ts":"2026-11-29T06:00:04Z","kind":"x","attempt":0"#;
        assert!(read(&format!(r#"{{"v":1,{base}}}"#)).is_ok());
        for bad in [
            format!(r#"{{{base}}}"#),
            format!(r#"{{"v":1,"v":1,{base}}}"#),
            format!(r#"{{"v":1,{base},"rank":1,"rank":2}}"#),
            format!(r#"{{"v":"1",{base}}}"#),
            format!(r#"{{"v":null,{base}}}"#),
            format!(r#"{{"v":1,{base},"rank":-1}}"#),
            format!(r#"{{"v":1,{base},"node":3}}"#),
            r#"{"v":1,"ts":"yesterday","kind":"x","attempt":0}"#.to_string(),
            r#"[1,2]"#.to_string(),
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"x","attempt":0"#.to_string(),
        ] {
            assert!(read(&bad).is_err(), "{bad} read");
        }
    }
}
