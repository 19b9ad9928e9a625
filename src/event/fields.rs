//! An [`Event`] to and from a record's fields.

use super::Event;
use serde::Deserialize;
use serde_json::{Map, Value};

impl Event {
    /// The attempt a record written later is about (a verdict on an
    /// earlier attempt), when it says so.
    pub fn about_attempt(&self) -> Option<u32> {
        match self {
            Event::Failure(x) => x.about_attempt,
            Event::Decision(x) => x.about_attempt,
            Event::PreviousAttempt(x) => Some(x.about_attempt),
            _ => None,
        }
    }

    /// The fields of the record, without `kind`.
    pub fn into_fields(self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut m)) => {
                m.remove("kind");
                m
            }
            _ => Map::new(),
        }
    }

    /// Read a record's kind and fields; `None` for a kind this build does not
    /// know or fields of the wrong type.
    pub fn from_fields(kind: &str, fields: &Map<String, Value>) -> Option<Event> {
        Event::parse(kind, fields).ok()
    }

    /// The same, saying what did not read.
    pub fn parse(kind: &str, fields: &Map<String, Value>) -> Result<Event, String> {
        // Read in place (no copy of the fields), straight into the kind's
        // struct: the fields but the run key, which is the envelope's
        // (stamped on every record).
        use serde::de::value::MapDeserializer;
        let entries = fields
            .iter()
            .filter(|(k, _)| k.as_str() != "run")
            .map(|(k, v)| (k.as_str(), v));
        let de = MapDeserializer::<_, serde_json::Error>::new(entries);
        match Event::deserialize_kind(kind, de) {
            None => Err(format!("unknown kind '{kind}'")),
            Some(e) => e.map_err(|e| format!("{kind}: {e}")),
        }
    }
}

/// A required field as a record resilio did not write may hold it: absent
/// (serde's `default`) or `null`, both read as the type's zero, as the
/// schema's doc says (`events!`), rather than the record being dropped.
pub(crate) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
