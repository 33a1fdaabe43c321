//! Compact number formatting for the console: `71 %`, `54.2/80.0 GiB`, `63 °C / 87`,
//! `612/700 W`. An absent value is `N/A`, never a zero.

/// What an absent metric prints as.
pub const NA: &str = "N/A";

const GIB: f64 = (1u64 << 30) as f64;

/// `71 %`
pub fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| NA.into(), |v| format!("{v:.0} %"))
}

/// Bytes as GiB with one decimal, no unit: `54.2`.
pub fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / GIB)
}

/// `54.2/80.0 GiB`; an absent part is `N/A`.
pub fn memory(used: Option<u64>, total: Option<u64>) -> String {
    match (used, total) {
        (None, None) => NA.into(),
        (u, t) => format!(
            "{}/{} GiB",
            u.map_or_else(|| NA.into(), gib),
            t.map_or_else(|| NA.into(), gib)
        ),
    }
}

/// `63 °C / 87` (against the slowdown threshold), `63 °C` without one.
pub fn temperature(t: Option<f64>, slowdown: Option<f64>) -> String {
    match (t, slowdown) {
        (None, _) => NA.into(),
        (Some(t), Some(s)) => format!("{t:.0} °C / {s:.0}"),
        (Some(t), None) => format!("{t:.0} °C"),
    }
}

/// `612/700 W` (against the cap), `612 W` without one.
pub fn power(p: Option<f64>, cap: Option<f64>) -> String {
    match (p, cap) {
        (None, _) => NA.into(),
        (Some(p), Some(c)) => format!("{p:.0}/{c:.0} W"),
        (Some(p), None) => format!("{p:.0} W"),
    }
}

/// `1980 MHz`
pub fn mhz(v: Option<u32>) -> String {
    v.map_or_else(|| NA.into(), |v| format!("{v} MHz"))
}

/// `1755/1980 MHz`
pub fn mhz_of(v: Option<u32>, max: Option<u32>) -> String {
    match (v, max) {
        (None, _) => NA.into(),
        (Some(v), Some(m)) => format!("{v}/{m} MHz"),
        (Some(v), None) => format!("{v} MHz"),
    }
}

/// A rate given in KB/s, scaled: `850 KB/s`, `12.3 MB/s`, `1.2 GB/s`.
pub fn kbps(v: Option<u64>) -> String {
    let Some(v) = v else { return NA.into() };
    let v = v as f64;
    if v < 1000.0 {
        format!("{v:.0} KB/s")
    } else if v < 1_000_000.0 {
        format!("{:.1} MB/s", v / 1000.0)
    } else {
        format!("{:.1} GB/s", v / 1_000_000.0)
    }
}

/// Energy in joules as Wh/kWh/MWh: `12.3 kWh`.
pub fn energy(j: Option<f64>) -> String {
    let Some(j) = j else { return NA.into() };
    let wh = j / 3600.0;
    if wh < 1000.0 {
        format!("{wh:.1} Wh")
    } else if wh < 1_000_000.0 {
        format!("{:.1} kWh", wh / 1000.0)
    } else {
        format!("{:.1} MWh", wh / 1_000_000.0)
    }
}

/// A span of seconds the way a chart axis says it: `1m`, `10m`, `1h`, `24h`, `7d`, `45s`.
pub fn span(s: f64) -> String {
    let s = s.round() as u64;
    if s >= 2 * 86400 && s % 86400 == 0 {
        format!("{}d", s / 86400)
    } else if s >= 3600 && s % 3600 == 0 {
        format!("{}h", s / 3600)
    } else if s >= 60 && s % 60 == 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// Seconds as `3 s`, `4 min`, `2 h`: how long ago something was.
pub fn ago(s: f64) -> String {
    let s = s.max(0.0);
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.0} h", s / 3600.0)
    }
}

/// `s` cut to `width` characters, with `…` where it was cut.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(width - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_numbers() {
        assert_eq!(pct(Some(71.4)), "71 %");
        assert_eq!(pct(None), "N/A");
        assert_eq!(
            memory(Some(58_196_377_600), Some(85_899_345_920)),
            "54.2/80.0 GiB"
        );
        assert_eq!(memory(Some(1 << 30), None), "1.0/N/A GiB");
        assert_eq!(memory(None, None), "N/A");
        assert_eq!(temperature(Some(63.2), Some(87.0)), "63 °C / 87");
        assert_eq!(temperature(Some(63.2), None), "63 °C");
        assert_eq!(temperature(None, Some(87.0)), "N/A");
        assert_eq!(power(Some(612.4), Some(700.0)), "612/700 W");
        assert_eq!(power(None, Some(700.0)), "N/A");
        assert_eq!(mhz_of(Some(1755), Some(1980)), "1755/1980 MHz");
        assert_eq!(kbps(Some(850)), "850 KB/s");
        assert_eq!(kbps(Some(12_345)), "12.3 MB/s");
        assert_eq!(kbps(Some(1_234_567)), "1.2 GB/s");
        assert_eq!(energy(Some(3.6e6 * 12.34)), "12.3 kWh");
        assert_eq!(energy(Some(3600.0 * 5.0)), "5.0 Wh");
    }

    #[test]
    fn spans_and_fitting() {
        assert_eq!(span(60.0), "1m");
        assert_eq!(span(600.0), "10m");
        assert_eq!(span(3600.0), "1h");
        assert_eq!(span(86400.0), "24h");
        assert_eq!(span(7.0 * 86400.0), "7d");
        assert_eq!(span(45.0), "45s");
        assert_eq!(ago(12.4), "12 s");
        assert_eq!(ago(600.0), "10 min");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
        assert_eq!(fit("abc", 0), "");
    }
}
