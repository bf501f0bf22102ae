//! Durations as flags, environment variables and fault descriptions write them: a whole number and
//! a unit (`500us`, `250ms`, `25s`, `2m`, `1h`). One parser, so `--grace 2m` and a simulator fault
//! `delay:2m` mean the same thing. A bare number is seconds, as `--grace 25` always was.

use std::time::Duration;

/// A string that is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a duration; expected a whole number and a unit (ns, us, ms, s, m or h), e.g. 250ms, 25s, 2m")]
pub struct DurationError {
    pub value: String,
}

/// Parse `250ms`, `25s`, `2m`, …
///
/// # Errors
/// No number, an unknown unit, or more than `u64` nanoseconds' worth.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError { value: s.to_string() };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let nanos_per: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(nanos_per).map(Duration::from_nanos).ok_or_else(bad)
}

/// The shortest text [`parse`] reads back as exactly `d`.
pub fn format(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, per) in
        [("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)]
    {
        if ns >= per && ns.is_multiple_of(per) {
            return format!("{}{unit}", ns / per);
        }
    }
    format!("{ns}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_parses() {
        let cases = [
            ("7ns", Duration::from_nanos(7)),
            ("500us", Duration::from_micros(500)),
            ("500µs", Duration::from_micros(500)),
            ("250ms", Duration::from_millis(250)),
            ("25s", Duration::from_secs(25)),
            ("25", Duration::from_secs(25)),
            (" 2m ", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("0s", Duration::ZERO),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_input_names_the_value_and_the_units() {
        for text in ["", "ms", "1.5s", "-1s", "2 weeks", "1d", "99999999999h"] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.starts_with(&format!("{text:?} is not a duration")), "{err}");
            assert!(err.contains("ns, us, ms, s, m or h"), "{err}");
        }
    }

    #[test]
    fn format_round_trips_with_the_largest_exact_unit() {
        let cases = [
            (Duration::ZERO, "0ns"),
            (Duration::from_nanos(1500), "1500ns"),
            (Duration::from_micros(2), "2us"),
            (Duration::from_millis(300), "300ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7200), "2h"),
        ];
        for (d, text) in cases {
            assert_eq!(format(d), text);
            assert_eq!(parse(text), Ok(d));
        }
    }
}
