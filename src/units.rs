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
}
