//! Durations as operators type them: `7d`, `12h`, `30m`, `45s`, or combined (`1d12h`).

use std::time::Duration;

/// Parse a duration like `7d`, `12h`, `30m`, `90s` or `1d12h30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let usage = || {
        format!(
            "`{text}` is not a duration: write a number and a unit (d, h, m or s), like 7d, 12h, 30m or 1d12h"
        )
    };
    if text.is_empty() {
        return Err(usage());
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit: u64 = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(usage()),
        };
        let n: u64 = number.parse().map_err(|_| usage())?;
        number.clear();
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(usage)?;
    }
    if !number.is_empty() {
        return Err(usage());
    }
    Ok(Duration::from_secs(total))
}

/// A duration for people: `3d 4h`, `12m 5s`, `0.4s`.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let (days, hours, minutes, seconds) =
        (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    let parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")];
    let first = parts.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    parts[first..]
        .iter()
        .take(2)
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1_800)));
        assert_eq!(
            parse_duration("1d12h"),
            Ok(Duration::from_secs(86_400 + 12 * 3_600))
        );
        for bad in ["", "7", "d", "7x", "1.5h", "-1d", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_the_two_largest_units() {
        assert_eq!(
            format_duration(Duration::from_secs(3 * 86_400 + 4 * 3_600 + 5)),
            "3d 4h"
        );
        assert_eq!(format_duration(Duration::from_secs(725)), "12m 5s");
        assert_eq!(format_duration(Duration::from_millis(400)), "0.4s");
        assert_eq!(format_duration(Duration::from_secs(3_600)), "1h");
    }

    proptest::proptest! {
        /// Any combination of the four units, written as an operator would, parses to its sum.
        #[test]
        fn combined_units_parse_to_their_sum(
            d in 0u64..10_000, h in 0u64..1_000, m in 0u64..1_000, s in 0u64..100_000,
        ) {
            let text = format!("{d}d{h}h{m}m{s}s");
            let expected = d * 86_400 + h * 3_600 + m * 60 + s;
            proptest::prop_assert_eq!(parse_duration(&text), Ok(Duration::from_secs(expected)));
        }

        /// Arbitrary input never panics, and whatever parses is digits each followed by a unit
        /// and ends with a unit; whatever does not parse gets the usage message naming it.
        #[test]
        fn arbitrary_text_parses_only_when_well_formed(text in "\\PC{0,12}|[0-9dhms]{0,12}") {
            match parse_duration(&text) {
                Ok(_) => {
                    proptest::prop_assert!(text.chars().all(|c| c.is_ascii_digit() || "dhms".contains(c)));
                    proptest::prop_assert!(text.ends_with(['d', 'h', 'm', 's']));
                    proptest::prop_assert!(!text.contains("dd") && !text.starts_with(['d', 'h', 'm', 's']));
                }
                Err(message) => proptest::prop_assert!(message.contains("is not a duration"), "{}", message),
            }
        }

        /// A number too large for the unit is refused, never wrapped around.
        #[test]
        fn overflow_is_refused(n in (u64::MAX / 86_400 + 1)..u64::MAX) {
            let text = format!("{n}d");
            proptest::prop_assert!(parse_duration(&text).is_err(), "{}", text);
        }
    }
}
