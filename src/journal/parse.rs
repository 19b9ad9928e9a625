//! Reading one record from its line: the envelope's fields typed as they
//! come, every other field kept as it is, in one pass over the line (the
//! derived reader of a flattened map buffers every field first, and costs
//! twice the time and memory on a journal of a million records).
//!
//! A journal's own lines are read by [`Record::from_line`]: the envelope
//! (and the run key) in one pass, the kind's typed event straight from the
//! line in a second, the line's text kept for the other fields (no map of
//! them made unless asked for).

use super::{Line, LineText, Record};
use crate::event::Event;
use serde::de::{
    Deserialize, DeserializeSeed, Deserializer, Error, IgnoredAny, MapAccess, Visitor,
};
use serde_json::{Map, Value};

/// The keys that are not a record's event's: the envelope's and the run
/// key (stamped on every record).
const NOT_THE_EVENTS: &[&str] = &["v", "ts", "kind", "attempt", "rank", "node", "run"];

impl Record {
    /// Read one journal line. A kind this build knows, whose fields read as
    /// its event: the envelope, the event and the line's text; else (a kind
    /// of a later build, a field of the wrong type) the record read whole,
    /// its fields in `data`. An error for what is not a record.
    pub fn from_line(line: &[u8]) -> serde_json::Result<Record> {
        Record::from_line_of(&std::sync::Arc::new(line.to_vec()), 0..line.len())
    }

    /// [`Record::from_line`] of the line at `span` of a file's text, which
    /// the record then shares rather than copies.
    pub(super) fn from_line_of(
        file: &std::sync::Arc<Vec<u8>>,
        span: std::ops::Range<usize>,
    ) -> serde_json::Result<Record> {
        let line = &file[span.clone()];
        let mut head: Head = serde_json::from_slice(line)?;
        let event = Event::deserialize_kind(
            &head.kind,
            EventFields(&mut serde_json::Deserializer::from_slice(line)),
        );
        match (event, std::str::from_utf8(line)) {
            (Some(Ok(event)), Ok(_)) => {
                let text = LineText(Some(Box::new(Line {
                    file: file.clone(),
                    span,
                    run: head.run.take().map(String::into_boxed_str),
                    fields: Default::default(),
                })));
                let parsed = super::Parsed(std::sync::OnceLock::from(Some(Box::new(event))));
                Ok(head.into_record(Map::new(), parsed, text))
            }
            _ => serde_json::from_slice(line),
        }
    }
}

/// The fields of a record's line but the envelope's (the line was read
/// once already: it reads again).
pub(super) fn fields_of(text: &str) -> Map<String, Value> {
    serde_json::from_str::<Record>(text)
        .map(|r| r.data)
        .unwrap_or_default()
}

/// A record's envelope and run key; its other fields passed over.
struct Head {
    v: u32,
    ts: chrono::DateTime<chrono::Utc>,
    kind: String,
    attempt: u32,
    rank: Option<u32>,
    node: Option<String>,
    run: Option<String>,
}

impl Head {
    fn into_record(
        self,
        data: Map<String, Value>,
        parsed: super::Parsed,
        text: LineText,
    ) -> Record {
        Record {
            v: self.v,
            ts: self.ts,
            kind: self.kind,
            attempt: self.attempt,
            rank: self.rank,
            node: self.node,
            data,
            parsed,
            text,
        }
    }
}

impl<'de> Deserialize<'de> for Head {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Head, D::Error> {
        d.deserialize_map(Envelope { keep: false })
            .map(|(head, _)| head)
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Record, D::Error> {
        let (head, data) = d.deserialize_map(Envelope { keep: true })?;
        Ok(head.into_record(data, Default::default(), Default::default()))
    }
}

/// Reads a record's envelope, typed, and its other fields: kept in a map
/// (`keep`, the run key among them), or passed over but the run key.
struct Envelope {
    keep: bool,
}

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

impl<'de> Visitor<'de> for Envelope {
    type Value = (Head, Map<String, Value>);

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a journal record (an object with v, ts, kind and attempt)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut v, mut ts, mut kind, mut attempt) = (None, None::<Ts>, None, None);
        let (mut rank, mut node): (Option<Option<u32>>, Option<Option<String>>) = (None, None);
        let mut run: Option<Value> = None;
        let mut data = Map::new();
        while let Some(key) = map.next_key::<KeyText<'de>>()? {
            match key.as_str() {
                "v" => once(&mut map, &mut v, "v")?,
                "ts" => once(&mut map, &mut ts, "ts")?,
                "kind" => once(&mut map, &mut kind, "kind")?,
                "attempt" => once(&mut map, &mut attempt, "attempt")?,
                "rank" => once(&mut map, &mut rank, "rank")?,
                "node" => once(&mut map, &mut node, "node")?,
                _ if self.keep => {
                    let value: Value = map.next_value()?;
                    data.insert(key.into_string(), value);
                }
                // A repeated run key: the last, as in a map of the fields.
                "run" => run = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let head = Head {
            v: v.ok_or_else(|| A::Error::missing_field("v"))?,
            ts: ts.ok_or_else(|| A::Error::missing_field("ts"))?.0,
            kind: kind.ok_or_else(|| A::Error::missing_field("kind"))?,
            attempt: attempt.ok_or_else(|| A::Error::missing_field("attempt"))?,
            rank: rank.flatten(),
            node: node.flatten(),
            // As `Record::run` reads it from a map: a string, or none.
            run: match run {
                Some(Value::String(s)) => Some(s),
                _ => None,
            },
        };
        Ok((head, data))
    }
}

/// A record's line as its event's fields: every key but the envelope's
/// and the run key (as [`Event::parse`] reads them from a map).
struct EventFields<'a, 'de>(&'a mut serde_json::Deserializer<serde_json::de::SliceRead<'de>>);

impl<'de> Deserializer<'de> for EventFields<'_, 'de> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_map(SkipVisitor(visitor))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// Hands a map on with the keys that are not the event's passed over.
struct SkipVisitor<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for SkipVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(SkipKeys(map))
    }
}

struct SkipKeys<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipKeys<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        use serde::de::IntoDeserializer;
        loop {
            let Some(key) = self.0.next_key::<KeyText<'de>>()? else {
                return Ok(None);
            };
            if NOT_THE_EVENTS.contains(&key.as_str()) {
                self.0.next_value::<IgnoredAny>()?;
                continue;
            }
            return match key {
                KeyText::Borrowed(k) => seed.deserialize(k.into_deserializer()).map(Some),
                KeyText::Owned(k) => seed.deserialize(k.into_deserializer()).map(Some),
            };
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(seed)
    }
}

/// A record's time as resilio writes it (`2026-11-29T06:00:04.155749823Z`)
/// read by hand; any other form chrono reads as a date and time with an
/// offset (a million records spent a second in chrono's general reader).
struct Ts(chrono::DateTime<chrono::Utc>);

impl<'de> Deserialize<'de> for Ts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ts, D::Error> {
        struct TsText;
        impl Visitor<'_> for TsText {
            type Value = Ts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a date and time (RFC 3339)")
            }
            fn visit_str<E: Error>(self, t: &str) -> Result<Ts, E> {
                match utc_of(t) {
                    Some(ts) => Ok(Ts(ts)),
                    None => t
                        .parse::<chrono::DateTime<chrono::FixedOffset>>()
                        .map(|t| Ts(t.to_utc()))
                        .map_err(E::custom),
                }
            }
        }
        d.deserialize_str(TsText)
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z`, or `None` for any other form.
fn utc_of(t: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let b = t.as_bytes();
    if b.len() < 20 || b[b.len() - 1] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        b[r].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let seps = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if seps.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let nanos = match &b[19..b.len() - 1] {
        [] => 0,
        [b'.', digits @ ..] if (1..=9).contains(&digits.len()) => {
            num(20..19 + 1 + digits.len())? * 10u32.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    let date = chrono::NaiveDate::from_ymd_opt(num(0..4)? as i32, num(5..7)?, num(8..10)?)?;
    // A leap second (`:60`) is left to chrono.
    let time =
        chrono::NaiveTime::from_hms_nano_opt(num(11..13)?, num(14..16)?, num(17..19)?, nanos)?;
    Some(date.and_time(time).and_utc())
}

/// A key as the line has it: borrowed when it has no escape.
enum KeyText<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl KeyText<'_> {
    fn as_str(&self) -> &str {
        match self {
            KeyText::Borrowed(k) => k,
            KeyText::Owned(k) => k,
        }
    }

    fn into_string(self) -> String {
        match self {
            KeyText::Borrowed(k) => k.to_string(),
            KeyText::Owned(k) => k,
        }
    }
}

impl<'de> Deserialize<'de> for KeyText<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeyText<'de>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyText<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: Error>(self, k: &'de str) -> Result<KeyText<'de>, E> {
                Ok(KeyText::Borrowed(k))
            }
            fn visit_str<E: Error>(self, k: &str) -> Result<KeyText<'de>, E> {
                Ok(KeyText::Owned(k.to_string()))
            }
        }
        d.deserialize_str(V)
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
    fn a_time_reads_as_chrono_reads_it() {
        let chrono_of = |t: &str| {
            t.parse::<chrono::DateTime<chrono::FixedOffset>>()
                .ok()
                .map(|t| t.to_utc())
        };
        let ours = |t: &str| {
            read(&format!(r#"{{"v":1,"ts":"{t}","kind":"x","attempt":0}}"#))
                .ok()
                .map(|r| r.ts)
        };
        for t in [
            "2026-11-29T06:00:04.155749823Z",
            "2026-11-29T06:00:04Z",
            "2026-11-29T06:00:04.1Z",
            "2026-11-29T06:00:04.123456Z",
            "2024-02-29T23:59:59.999999999Z",
            "2016-12-31T23:59:60Z",
            "2026-11-29T06:00:04.1234567891Z",
            "2026-11-29t06:00:04z",
            "2026-11-29T06:00:04+02:00",
            "2026-11-29 06:00:04Z",
            "2025-02-29T06:00:04Z",
            "2026-13-01T06:00:04Z",
            "2026-11-29T24:00:04Z",
            "2026-11-29T06:00:04.Z",
            "2026-11-29T06:00:04.12a4Z",
            "+2026-11-29T06:00:04Z",
            "yesterday",
        ] {
            assert_eq!(ours(t), chrono_of(t), "{t}");
        }
        assert!(super::utc_of("2026-11-29T06:00:04.155749823Z").is_some());
        assert!(super::utc_of("2026-11-29T06:00:04+00:00").is_none());
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

    /// Read both ways: from its line as the journal reader does, and whole
    /// (every field in a map).
    fn both(line: &str) -> (Record, Record) {
        (
            Record::from_line(line.as_bytes()).unwrap(),
            read(line).unwrap(),
        )
    }

    #[test]
    fn a_line_of_a_known_kind_keeps_its_event_and_text_and_reads_as_the_whole_record() {
        let lines = [
            // Fields in any order, the run key among them, an escape in a key.
            r#"{"step":250,"v":1,"run":"slurm-7","ts":"2026-11-29T06:00:04.155749823Z","kind":"progress","attempt":2,"rank":5,"node":"gpu0000","source":"output","metr\u0069cs":{"loss":2.5}}"#,
            // A field this build's event does not have.
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"progress","attempt":0,"rank":0,"step":3,"later_build":[1,{"a":null}]}"#,
            // No run key; a run key that is not a string.
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"stall","attempt":1,"rank":1,"run":7,"last_step":9}"#,
        ];
        for line in lines {
            let (held, whole) = both(line);
            assert!(held.data.is_empty(), "{line}: held as text");
            assert!(!whole.fields().is_empty());
            assert_eq!(held, whole, "{line}");
            assert_eq!(held.fields(), &whole.data, "{line}");
            assert_eq!(held.run(), whole.run(), "{line}");
            assert_eq!(held.event(), whole.event(), "{line}");
            assert!(held.event().is_some(), "{line}");
            // Written back, the same line as the whole record's.
            assert_eq!(
                serde_json::to_string(&held).unwrap(),
                serde_json::to_string(&whole).unwrap()
            );
        }
        let (held, _) = both(lines[0]);
        assert_eq!(held.run(), Some("slurm-7"));
        assert_eq!(held.u64("step"), Some(250));
        assert_eq!(held.get("metrics"), Some(&serde_json::json!({"loss": 2.5})));
        let (held, _) = both(lines[2]);
        assert_eq!(held.run(), None);
    }

    #[test]
    fn a_line_whose_fields_do_not_read_as_its_kind_is_read_whole() {
        for line in [
            // A kind of a later build.
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"from_the_future","attempt":0,"x":1}"#,
            // A field of the wrong type.
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"progress","attempt":0,"rank":0,"step":"three"}"#,
            // A field given twice (a map keeps the last).
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"progress","attempt":0,"rank":0,"step":3,"step":4}"#,
        ] {
            let (held, whole) = both(line);
            assert!(!held.data.is_empty(), "{line}: read whole");
            assert_eq!(held, whole, "{line}");
            assert_eq!(held.event(), whole.event(), "{line}");
        }
        // Not a record: no more read one way than the other.
        for bad in [
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"progress"}"#,
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"progress","attempt":0,"rank":0,"step":3} x"#,
            r#"{"v":1,"ts":"2026-11-29T06:00:04Z","kind":"progress","attempt":0,"rank":0,"#,
        ] {
            assert!(Record::from_line(bad.as_bytes()).is_err(), "{bad}");
            assert!(read(bad).is_err(), "{bad}");
        }
    }
}
