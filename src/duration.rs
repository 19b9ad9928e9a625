//! Human durations as written on the command line and in config:
//! `90s`, `5m`, `1h30m`, `250ms`, `1.5s`; a bare number means seconds.

use std::time::Duration;

/// Parse a duration such as `1h30m`, `90s`, `250ms` or `2.5s`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s.starts_with('-') {
        return Err(format!("invalid duration '{text}': must not be negative"));
    }
    if let Ok(secs) = s.parse::<f64>() {
        return from_secs(secs, text);
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("invalid duration '{text}': expected a number"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("invalid duration '{text}'"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "" => {
                return Err(format!(
                    "invalid duration '{text}': missing unit (ms, s, m, h)"
                ))
            }
            unit => return Err(format!("invalid duration '{text}': unknown unit '{unit}'")),
        };
        total += value * factor;
        rest = &rest[unit_len..];
    }
    from_secs(total, text)
}

/// A duration that must be longer than zero (a timeout: zero would fire at
/// once). The error names the value; the caller prefixes the flag or key.
pub fn parse_positive(text: &str) -> Result<Duration, String> {
    positive(parse(text)?, text)
}

/// `d`, unless it is zero.
pub fn positive(d: Duration, text: &str) -> Result<Duration, String> {
    if d.is_zero() {
        Err(format!("must be greater than zero (got '{}')", text.trim()))
    } else {
        Ok(d)
    }
}

fn from_secs(secs: f64, text: &str) -> Result<Duration, String> {
    if !secs.is_finite() || !(0.0..=1e10).contains(&secs) {
        return Err(format!("invalid duration '{text}'"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Format a duration compactly for humans (`1h02m`, `4m05s`, `12.3s`, `250ms`).
pub fn format(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1.0 {
        format!("{}ms", d.as_millis())
    } else if secs < 60.0 {
        format!("{secs:.1}s")
    } else if secs < 3600.0 {
        format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
    } else {
        format!("{}h{:02}m", d.as_secs() / 3600, (d.as_secs() % 3600) / 60)
    }
}

/// Serde helpers so config structs can hold `Duration` written as text.
pub mod serde_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*d))
    }

    /// Text (`"90s"`) or a bare number of seconds (`90`, `0.5`).
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum TextOrSeconds {
        Text(String),
        Int(u64),
        Float(f64),
    }

    fn convert<E: serde::de::Error>(v: TextOrSeconds) -> Result<Duration, E> {
        match v {
            TextOrSeconds::Text(t) => super::parse(&t).map_err(E::custom),
            TextOrSeconds::Int(n) => Ok(Duration::from_secs(n)),
            TextOrSeconds::Float(f) => super::parse(&f.to_string()).map_err(E::custom),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        convert(TextOrSeconds::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a duration such as \"90s\", \"5m\" or a number of seconds",
            )
        })?)
    }

    /// The same for `Option<Duration>`.
    pub mod option {
        use serde::{Deserializer, Serializer};
        use std::time::Duration;

        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => s.serialize_str(&super::super::format(*d)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("42").unwrap(), Duration::from_secs(42));
        assert_eq!(parse(" 2m30s ").unwrap(), Duration::from_secs(150));
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for bad in ["", "abc", "5x", "m5", "-3s", "1..2s", "5 m"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn zero_is_no_timeout_and_negatives_say_so() {
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        for zero in ["0", "0s", "0ms", "0.0", " 0m "] {
            let err = parse_positive(zero).unwrap_err();
            assert!(err.contains("greater than zero"), "{zero}: {err}");
        }
        assert_eq!(parse_positive("1ms").unwrap(), Duration::from_millis(1));
        for neg in ["-1", "-5s", " -0.5"] {
            assert!(parse(neg).unwrap_err().contains("negative"), "{neg}");
        }
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format(Duration::from_millis(250)), "250ms");
        assert_eq!(format(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(format(Duration::from_secs(245)), "4m05s");
        assert_eq!(format(Duration::from_secs(3720)), "1h02m");
    }
}
