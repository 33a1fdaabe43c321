//! Time, passed in: the supervisor asks a [`Clock`] instead of the system, so tests move time
//! forward past a backoff instead of sleeping through it.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

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

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn manual_clock_moves_both_clocks() {
        let c = ManualClock::at(UNIX_EPOCH);
        let i0 = c.now();
        c.advance(Duration::from_secs(90));
        assert_eq!(c.now() - i0, Duration::from_secs(90));
        assert_eq!(crate::time::rfc3339(c.wall()), "1970-01-01T00:01:30.000Z");
    }
}
