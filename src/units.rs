//! How quantities read to a person, shared by every layer that prints them (the command line,
//! the console, alerts, run reports). A leaf: it imports nothing of the crate.

/// `12s`, `5m03s`, `2h05m`, `3d04h`: whole units, truncated.
pub fn format_duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `x`, with a negative zero made `0`: `-0` printed reads as a tiny loss where there was
/// nothing (`Iterator::sum` of no `f64` is `-0.0`, and so is a rounding of a tiny negative).
pub fn no_negative_zero(x: f64) -> f64 {
    if x == 0.0 { 0.0 } else { x }
}

/// `x` to `decimals` places, never `-0` (`-0.0004` to two places is `0.00`, not `-0.00`).
pub fn fixed(x: f64, decimals: usize) -> String {
    let s = format!("{:.*}", decimals, no_negative_zero(x));
    match s.strip_prefix('-') {
        Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => rest.to_string(),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(format_duration(0.4), "0s");
        assert_eq!(format_duration(59.9), "59s");
        assert_eq!(format_duration(183.0), "3m03s");
        assert_eq!(format_duration(7500.0), "2h05m");
        assert_eq!(format_duration(3.0 * 86_400.0 + 4.0 * 3600.0), "3d04h");
        assert_eq!(format_duration(-1.0), "0s");
    }

    #[test]
    fn no_number_prints_as_minus_zero() {
        let none: [f64; 0] = [];
        let empty_sum: f64 = none.iter().sum();
        assert_eq!(
            format!("{empty_sum:.0}"),
            "-0",
            "what an empty sum prints unguarded"
        );
        assert_eq!(fixed(empty_sum, 0), "0");
        assert_eq!(fixed(-0.0004, 2), "0.00");
        assert_eq!(fixed(-0.4, 0), "0");
        assert_eq!(fixed(-0.6, 0), "-1");
        assert_eq!(fixed(-0.005, 3), "-0.005");
        assert_eq!(fixed(1234.5678, 2), "1234.57");
        assert!(no_negative_zero(empty_sum).is_sign_positive());
        assert_eq!(no_negative_zero(-2.5), -2.5);
    }
}
