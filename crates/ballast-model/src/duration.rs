//! Durations in Gateway API form (GEP-2257): one to four `<number><unit>` parts, units `h`, `m`,
//! `s`, `ms`, e.g. `1s`, `250ms`, `1m30s`. The same strings work unchanged in Kubernetes.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::spanned::Spanned;

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {text:?}: expected up to 4 parts of a number (at most 5 digits) and a unit \
     h, m, s or ms, e.g. \"1s\", \"250ms\", \"1m30s\""
)]
pub struct DurationError {
    pub text: String,
}

/// Parses a Gateway API duration string.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        text: text.to_owned(),
    };
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return Err(err());
    }
    let mut total = Duration::ZERO;
    let mut parts = 0;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &text[start..i];
        if digits.is_empty() || digits.len() > 5 {
            return Err(err());
        }
        let n: u64 = digits.parse().map_err(|_| err())?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let part = match &text[unit_start..i] {
            "h" => Duration::from_secs(n * 3600),
            "m" => Duration::from_secs(n * 60),
            "s" => Duration::from_secs(n),
            "ms" => Duration::from_millis(n),
            _ => return Err(err()),
        };
        total += part;
        parts += 1;
        if parts > 4 {
            return Err(err());
        }
    }
    Ok(total)
}

/// Formats a duration in the form [`parse_duration`] reads (for messages and round trips).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, ms) = (rest / 1000, rest % 1000);
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s"), (ms, "ms")] {
        if n != 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

/// Deserializes through `String` so a bad duration is reported at its own YAML position.
struct DurationText(Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(DurationText)
            .map_err(serde::de::Error::custom)
    }
}

/// `deserialize_with` for required (or defaulted) duration fields.
pub(crate) fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Spanned<Duration>, D::Error> {
    let s = Spanned::<DurationText>::deserialize(d)?;
    Ok(Spanned::new(s.value.0, s.pos))
}

/// `deserialize_with` for optional duration fields (use with `#[serde(default)]`).
pub(crate) fn de_opt_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Spanned<Duration>>, D::Error> {
    let s = Option::<Spanned<DurationText>>::deserialize(d)?;
    Ok(s.map(|s| Spanned::new(s.value.0, s.pos)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_gateway_api_durations() {
        let ok = [
            ("1s", Duration::from_secs(1)),
            ("250ms", Duration::from_millis(250)),
            ("1m", Duration::from_secs(60)),
            ("2h", Duration::from_secs(7200)),
            ("1m30s", Duration::from_secs(90)),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
            ("0s", Duration::ZERO),
            ("99999ms", Duration::from_millis(99_999)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_durations() {
        for text in [
            "",
            "1",
            "s",
            "1x",
            "1.5s",
            "-1s",
            " 1s",
            "1s ",
            "100000s",
            "1h1h1h1h1h",
            "1S",
            "1us",
        ] {
            assert_eq!(
                parse_duration(text),
                Err(DurationError {
                    text: text.to_owned()
                }),
                "{text:?}"
            );
        }
    }

    #[test]
    fn error_message_names_the_text_and_the_format() {
        let e = parse_duration("5x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid duration \"5x\": expected up to 4 parts of a number (at most 5 digits) and a \
             unit h, m, s or ms, e.g. \"1s\", \"250ms\", \"1m30s\""
        );
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(h in 0u64..1000, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let d = Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }

        #[test]
        fn never_panics(text in ".{0,12}") {
            let _ = parse_duration(&text);
        }
    }
}
