//! Compact number formatting for the console: `71 %`, `54.2/80.0 GiB`, `63 °C / 87`,
//! `612/700 W`. An absent value is `N/A`, never a zero.

/// What an absent metric prints as.
pub const NA: &str = "N/A";

const GIB: f64 = (1u64 << 30) as f64;

/// `v` with `decimals` decimals, written exactly as `{v:.0}` or `{v:.1}` writes it (the
/// nearest to the value's exact binary expansion, a tie to the even digit, a sign on every
/// negative value), through integer formatting: the float formatter's exact mode costs a
/// thousand instructions a value, and the console writes dozens of values a frame. Other
/// precisions, and values too large to scale exactly, go to the float formatter. Takes no
/// width or fill.
#[derive(Debug, Clone, Copy)]
pub struct Fixed(pub f64, pub u8);

impl std::fmt::Display for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Fixed(v, decimals) = *self;
        let scale = match decimals {
            0 => 1.0,
            1 => 10.0,
            d => return write!(f, "{v:.*}", usize::from(d)),
        };
        // Below 2^50 a scaled value's halves and its integers are exact (NaN and the
        // infinities fail this too).
        if v.is_nan() || v.abs() * scale >= (1u64 << 50) as f64 {
            return write!(f, "{v:.*}", usize::from(decimals));
        }
        let p = v * scale;
        let mut q = p.round_ties_even();
        // The scaled value is rounded once: it moves across no half (halves are exact) but
        // may land on one. Then the exact product's error (which a fused multiply-add gives
        // exactly) says on which side of the half the value lies.
        if decimals > 0 && (p - p.trunc()).abs() == 0.5 {
            let e = v.mul_add(scale, -p);
            if e > 0.0 {
                q = p.ceil();
            } else if e < 0.0 {
                q = p.floor();
            }
        }
        let q = q.abs() as u64;
        let sign = if v.is_sign_negative() { "-" } else { "" };
        match decimals {
            0 => write!(f, "{sign}{q}"),
            _ => write!(f, "{sign}{}.{}", q / 10, q % 10),
        }
    }
}

/// `71 %`
pub fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| NA.into(), |v| format!("{} %", Fixed(v, 0)))
}

/// Bytes as GiB with one decimal, no unit: `54.2`.
pub fn gib(bytes: u64) -> String {
    Fixed(bytes as f64 / GIB, 1).to_string()
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
        (Some(t), Some(s)) => format!("{} °C / {}", Fixed(t, 0), Fixed(s, 0)),
        (Some(t), None) => format!("{} °C", Fixed(t, 0)),
    }
}

/// `612/700 W` (against the cap), `612 W` without one.
pub fn power(p: Option<f64>, cap: Option<f64>) -> String {
    match (p, cap) {
        (None, _) => NA.into(),
        (Some(p), Some(c)) => format!("{}/{} W", Fixed(p, 0), Fixed(c, 0)),
        (Some(p), None) => format!("{} W", Fixed(p, 0)),
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
        format!("{} KB/s", Fixed(v, 0))
    } else if v < 1_000_000.0 {
        format!("{} MB/s", Fixed(v / 1000.0, 1))
    } else {
        format!("{} GB/s", Fixed(v / 1_000_000.0, 1))
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

    /// What `Fixed` must write: what the float formatter writes.
    fn float(v: f64, decimals: u8) -> String {
        format!("{v:.*}", usize::from(decimals))
    }

    #[test]
    fn fixed_writes_what_the_float_formatter_writes() {
        // Ties to even, values just off a tie both ways, signs of zero, the edges.
        let cases = [
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -2.5,
            87.5,
            88.5,
            0.25,
            0.75,
            -1.25,
            0.35,
            0.45,
            0.05,
            0.15,
            -0.04,
            0.95,
            9.95,
            99.95,
            1e15,
            -1e15,
            1.125e14,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for v in cases {
            for d in 0..=2 {
                assert_eq!(
                    Fixed(v, d).to_string(),
                    float(v, d),
                    "{v:e} with {d} decimals"
                );
            }
        }
        // Every multiple of a sixteenth (ties at both precisions), and the doubles either
        // side of each.
        for k in -40_000i32..40_000 {
            let v = f64::from(k) / 16.0;
            for v in [v.next_down(), v, v.next_up()] {
                for d in 0..=1 {
                    assert_eq!(Fixed(v, d).to_string(), float(v, d), "{v:e}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn fixed_matches_the_float_formatter_anywhere(
            bits in proptest::num::u64::ANY,
            small in -1e6f64..1e6,
            decimals in 0u8..=1,
        ) {
            for v in [f64::from_bits(bits), small, (small * 10.0).round() / 10.0 + 0.05] {
                proptest::prop_assert_eq!(Fixed(v, decimals).to_string(), float(v, decimals));
            }
        }
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
