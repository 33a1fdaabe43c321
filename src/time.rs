//! Wall times as text: the RFC 3339 form that `events.jsonl`, `summary.json` and the protocol
//! carry, and the compact form in run ids. Calendars and leap days are jiff's job, not ours.
//!
//! A leaf: it imports nothing from the crate. Monotonic clocks for supervision (and the manual
//! clock tests drive) stay in `supervisor::clock`.

use std::time::{Duration, SystemTime};

use jiff::Timestamp;

/// `t` as a timestamp; a time before 1970 (a clock set wrong) reads as the epoch, as it always
/// has in these files.
fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t)
        .ok()
        .filter(|ts| *ts >= Timestamp::UNIX_EPOCH)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `2026-11-30T03:15:00.123Z`: UTC, milliseconds (truncated), the form of every file gpupilot
/// writes.
pub fn rfc3339(t: SystemTime) -> String {
    timestamp(t).strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Read an RFC 3339 time (any offset, any precision), such as one [`rfc3339`] wrote. A time
/// without an offset is refused: it names no instant.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    SystemTime::try_from(s.parse::<Timestamp>().ok()?).ok()
}

/// A length of time as people write it: `90s`, `15m`, `2h`, `1d 6h`, `1h30m` (jiff's friendly
/// form; a day is 24 hours). Weeks and longer units, a negative or a non-finite length are
/// refused: `None`.
pub fn parse_span(s: &str) -> Option<Duration> {
    let span: jiff::Span = s.trim().parse().ok()?;
    if span.is_negative()
        || span.get_weeks() != 0
        || span.get_months() != 0
        || span.get_years() != 0
    {
        return None;
    }
    let secs = span
        .total(jiff::SpanTotal::from(jiff::Unit::Second).days_are_24_hours())
        .ok()?;
    Duration::try_from_secs_f64(secs).ok()
}

/// `20261130-031500`: UTC to the second, the time part of a run id.
pub fn compact(t: SystemTime) -> String {
    timestamp(t).strftime("%Y%m%d-%H%M%S").to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn formats_utc_to_the_millisecond() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2026-11-30T03:15:00Z = 1796008500
        let t = UNIX_EPOCH + Duration::from_millis(1_796_008_500_123);
        assert_eq!(rfc3339(t), "2026-11-30T03:15:00.123Z");
        // Truncated, not rounded: .9999 is still in second 00.
        let t = UNIX_EPOCH + Duration::from_micros(1_796_008_500_999_900);
        assert_eq!(rfc3339(t), "2026-11-30T03:15:00.999Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
        // Before the epoch: the epoch.
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(5)),
            rfc3339(UNIX_EPOCH)
        );
    }

    #[test]
    fn parses_what_it_writes_and_other_offsets() {
        for ms in [0, 951_782_400_007, 1_796_008_500_123, 4_102_444_799_999] {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        }
        assert_eq!(
            parse_rfc3339("2026-11-30T04:15:00+01:00"),
            Some(UNIX_EPOCH + Duration::from_secs(1_796_008_500))
        );
        assert_eq!(parse_rfc3339("2026-11-30 03:15:00"), None);
        assert_eq!(parse_rfc3339("2026-11-30T03:15:00"), None);
        assert_eq!(parse_rfc3339(""), None);
    }

    #[test]
    fn spans_read_as_people_write_them() {
        assert_eq!(parse_span("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_span("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_span("1d 6h"), Some(Duration::from_secs(30 * 3600)));
        assert_eq!(parse_span("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_span("0s"), Some(Duration::ZERO));
        for bad in ["", "2", "h", "-2h", "2 weeks", "3mo", "yesterday"] {
            assert_eq!(parse_span(bad), None, "{bad}");
        }
    }

    #[test]
    fn compact_is_the_run_id_form() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_008_500_123);
        assert_eq!(compact(t), "20261130-031500");
    }
}
