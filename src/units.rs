//! Parsing and printing of sizes and durations, as users type and read them.

use std::time::Duration;

/// Parses a byte size: a number with an optional K/M/G/T suffix (powers of 1024; an optional
/// trailing `B` or `iB` is accepted), e.g. `512M`, `8G`, `1.5T`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("\"{text}\": expected a number with a K/M/G/T suffix, e.g. 8G");
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| t.strip_suffix('B'))
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        Some(c) if c.is_ascii_digit() || c == '.' => (t, 0),
        _ => return Err(bad()),
    };
    let value: f64 = num.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    let bytes = value * (1u64 << shift) as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("\"{text}\": too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a duration: a number with a unit of `ms`, `s`, `m`, `h` or `d` (seconds if none),
/// e.g. `500ms`, `30s`, `5m`, `24h`, `0`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("\"{text}\": expected a duration such as 500ms, 30s, 5m or 24h");
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86400.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || !(0.0..=1e12).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration as `parse_duration` reads it, in its largest whole unit: `24h`, `90s`,
/// `1500ms`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_string(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// A byte count for people: `1.5 GiB`, `640 KiB`, `12 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("4096", 4096),
            ("1K", 1024),
            ("1k", 1024),
            ("512M", 512 << 20),
            ("8G", 8 << 30),
            ("8GiB", 8 << 30),
            ("8GB", 8 << 30),
            ("1.5G", 3 << 29),
            ("2T", 2 << 40),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(*want), "{text}");
        }
        for bad in ["", "12Q", "G", "-1G", "1.2.3M", "abc", "1e400"] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
        assert_eq!(
            parse_size("12Q").unwrap_err(),
            "\"12Q\": expected a number with a K/M/G/T suffix, e.g. 8G"
        );
    }

    #[test]
    fn durations() {
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("30", Duration::from_secs(30)),
            ("500ms", Duration::from_millis(500)),
            ("1.5s", Duration::from_millis(1500)),
            ("5m", Duration::from_secs(300)),
            ("24h", Duration::from_secs(86400)),
            ("2d", Duration::from_secs(172800)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(*want), "{text}");
        }
        for bad in ["", "s", "5 parsecs", "-1s", "1x"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(12), "12 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(3 << 30), "3.0 GiB");
        assert_eq!(format_size(200 << 20), "200 MiB");
        for (d, text) in [(86400, "24h"), (90, "90s"), (300, "5m"), (0, "0s")] {
            assert_eq!(format_duration(Duration::from_secs(d)), text);
        }
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }
}
