//! Time, passed in: the supervisor asks a [`Clock`] instead of the system, so tests move time
//! forward past a backoff instead of sleeping through it.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time: a monotonic instant for deadlines, a wall time for records.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
    fn wall(&self) -> SystemTime;
}

/// The real clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    instant: Instant,
    wall: SystemTime,
    offset: Mutex<Duration>,
}

impl ManualClock {
    /// Starts at the real current time.
    pub fn new() -> ManualClock {
        ManualClock::at(SystemTime::now())
    }

    /// Starts at `wall`.
    pub fn at(wall: SystemTime) -> ManualClock {
        ManualClock {
            instant: Instant::now(),
            wall,
            offset: Mutex::new(Duration::ZERO),
        }
    }

    pub fn advance(&self, by: Duration) {
        *self.offset.lock().expect("clock lock") += by;
    }

    fn offset(&self) -> Duration {
        *self.offset.lock().expect("clock lock")
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.instant + self.offset()
    }
    fn wall(&self) -> SystemTime {
        self.wall + self.offset()
    }
}

/// UTC calendar fields of a wall time: (year, month, day, hour, minute, second, millisecond).
pub fn utc_fields(t: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
        d.subsec_millis(),
    )
}

/// `2026-11-30T03:15:00.123Z`: the time format of `events.jsonl` and `summary.json`.
pub fn rfc3339(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, ms) = utc_fields(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

/// Read back a time written by [`rfc3339`] (only that exact form).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 24 || b[4] != b'-' || b[10] != b'T' || b[19] != b'.' || b[23] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    // Howard Hinnant's days-from-civil.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let millis = ((days * 86_400 + h * 3600 + mi * 60 + sec) * 1000 + ms)
        .try_into()
        .ok()?;
    Some(UNIX_EPOCH + Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2026-11-30T03:15:00Z = 1796008500
        let t = UNIX_EPOCH + Duration::from_millis(1_796_008_500_123);
        assert_eq!(rfc3339(t), "2026-11-30T03:15:00.123Z");
        // a leap day
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn parses_what_it_writes() {
        for ms in [0, 951_782_400_007, 1_796_008_500_123, 4_102_444_799_999] {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        }
        assert_eq!(parse_rfc3339("2026-11-30 03:15:00"), None);
    }

    #[test]
    fn manual_clock_moves_both_clocks() {
        let c = ManualClock::at(UNIX_EPOCH);
        let i0 = c.now();
        c.advance(Duration::from_secs(90));
        assert_eq!(c.now() - i0, Duration::from_secs(90));
        assert_eq!(rfc3339(c.wall()), "1970-01-01T00:01:30.000Z");
    }
}
