//! What the daemon bounds, in one place: how many connections one user and everyone together
//! may hold, how long a connection may take to say hello or to finish a frame it began, how
//! fast a peer may ask, how much memory unfinished frames and unread answers may take, and how
//! often a refusal is written down. `docs/operations.md` ("What the daemon bounds") says the
//! same for people; keep the two together.
//!
//! "Trusted" peers are root and the user the daemon runs as: they may stop the daemon anyway,
//! so limiting them protects nothing, and their consoles, scripts and trainers must never be
//! slowed by someone else's flood. They get a larger share of the connections, no rate limit,
//! and a budget for their unfinished frames apart from the one others share. Everyone else (other
//! users of the system daemon) gets the limits below.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// Connections the daemon holds at once, from everyone.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections one user other than root and the daemon's own may hold at once.
pub const MAX_CONNECTIONS_PER_USER: usize = 64;
/// Connections root, or the daemon's own user, may hold at once.
pub const MAX_CONNECTIONS_PER_TRUSTED_USER: usize = 256;
/// A connection that has not said hello this long after it was accepted is closed.
pub const HANDSHAKE_WITHIN: Duration = Duration::from_secs(5);
/// A frame begun but not ended (no newline) this long is dropped and its connection closed.
/// A full 1 MiB frame takes milliseconds on a Unix socket; only a stalled client waits.
pub const FRAME_WITHIN: Duration = Duration::from_secs(30);
/// Requests a second one user (other than root and the daemon's own) may make, on all its
/// connections together, once its burst is spent; more are answered `rate_limited`.
pub const RATE_PER_S: f64 = 200.0;
/// Requests such a user may make at once before the rate applies.
pub const RATE_BURST: f64 = 400.0;
/// Bytes a connection's read buffer starts with and shrinks back to after a long frame; it
/// grows with a frame, up to the frame limit (1 MiB), never allocated whole up front.
pub const READ_BUFFER: usize = 8 * 1024;
/// Bytes of unfinished frames, beyond each connection's first [`READ_BUFFER`], that the
/// connections of untrusted users may hold together; a connection that needs more stops
/// reading (the kernel holds its client back) until others finish or are closed.
pub const UNFINISHED_BYTES: usize = 8 << 20;
/// The same for the connections of root and the daemon's own user, which draw on a budget of
/// their own so that nobody else's flood can hold up their frames.
pub const TRUSTED_UNFINISHED_BYTES: usize = 64 << 20;
/// Bytes of answers waiting for a client to read them, per connection, before the daemon stops
/// reading that client's requests. A larger answer still goes, alone.
pub const QUEUED_ANSWER_BYTES: usize = 256 * 1024;
/// The kernel's send buffer of a connection subscribed to telemetry (the kernel doubles what it
/// is given). Small, so that a subscriber that stops reading has a snapshot or two waiting in
/// the socket, not seconds of them (the newest waits in the daemon); its large answers just
/// take more wakeups. Other connections keep the kernel's default.
pub const SUBSCRIBER_SEND_BUFFER: usize = 4 * 1024;
/// The send buffer of a dedicated subscriber (`server::direct`; the kernel doubles it): a whole
/// snapshot (10 KB for eight busy GPUs) is written at once, and pushes are skipped once a
/// quarter of it waits unread (the kernel's rule for writable, 8 KiB counted as the kernel
/// holds it: one push of a busy node, a few of a small one).
/// Larger than [`SUBSCRIBER_SEND_BUFFER`] because nothing waits in the daemon to finish a frame
/// the socket did not take whole: its end goes at the next push.
pub const DEDICATED_SEND_BUFFER: usize = 16 * 1024;
/// Refusals of one kind from one user are written to the log and to `events.jsonl` one by one
/// [`AUDIT_EACH`] times in this window; the rest are counted: one more line with the count when
/// the window ends.
pub const AUDIT_WINDOW: Duration = Duration::from_secs(10);
/// See [`AUDIT_WINDOW`].
pub const AUDIT_EACH: u64 = 5;

/// The hidden variable that shrinks these for tests (`conns=6,handshake_ms=400,…`); not for
/// production, and not documented for users.
pub const TEST_ENV: &str = "GPUPILOT_TEST_LIMITS";

/// The limits one daemon applies: the constants above, unless a test says otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub conns: usize,
    pub conns_per_user: usize,
    pub conns_per_trusted_user: usize,
    pub handshake: Duration,
    pub frame: Duration,
    pub rate_per_s: f64,
    pub burst: f64,
    pub unfinished_bytes: usize,
    pub trusted_unfinished_bytes: usize,
    pub queued_answer_bytes: usize,
    pub audit_window: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            conns: MAX_CONNECTIONS,
            conns_per_user: MAX_CONNECTIONS_PER_USER,
            conns_per_trusted_user: MAX_CONNECTIONS_PER_TRUSTED_USER,
            handshake: HANDSHAKE_WITHIN,
            frame: FRAME_WITHIN,
            rate_per_s: RATE_PER_S,
            burst: RATE_BURST,
            unfinished_bytes: UNFINISHED_BYTES,
            trusted_unfinished_bytes: TRUSTED_UNFINISHED_BYTES,
            queued_answer_bytes: QUEUED_ANSWER_BYTES,
            audit_window: AUDIT_WINDOW,
        }
    }
}

impl Limits {
    /// The defaults, with what [`TEST_ENV`] overrides.
    pub fn from_env() -> Limits {
        match std::env::var(TEST_ENV) {
            Ok(spec) if !spec.trim().is_empty() => {
                let limits = Limits::parse(&spec);
                tracing::warn!("limits changed for a test ({TEST_ENV}={spec}): {limits:?}");
                limits
            }
            _ => Limits::default(),
        }
    }

    /// The defaults with `key=value,…` applied; unknown keys and bad values are ignored.
    pub fn parse(spec: &str) -> Limits {
        let mut l = Limits::default();
        for (key, value) in spec.split(',').filter_map(|kv| kv.trim().split_once('=')) {
            let Ok(n) = value.trim().parse::<u64>() else {
                continue;
            };
            let count = usize::try_from(n).unwrap_or(usize::MAX).max(1);
            let ms = Duration::from_millis(n.max(1));
            match key.trim() {
                "conns" => l.conns = count,
                "conns_per_user" => l.conns_per_user = count,
                "conns_per_trusted_user" => l.conns_per_trusted_user = count,
                "handshake_ms" => l.handshake = ms,
                "frame_ms" => l.frame = ms,
                "rate" => l.rate_per_s = count as f64,
                "burst" => l.burst = count as f64,
                "unfinished_bytes" => l.unfinished_bytes = count,
                "trusted_unfinished_bytes" => l.trusted_unfinished_bytes = count,
                "queued_answer_bytes" => l.queued_answer_bytes = count,
                "window_ms" => l.audit_window = ms,
                _ => {}
            }
        }
        l
    }
}

/// The connections held, per user and in all, and each untrusted user's request allowance.
#[derive(Debug)]
pub struct Bounds {
    pub limits: Limits,
    users: Mutex<Users>,
    /// [`UNFINISHED_BYTES`] in KiB permits, drawn by the read buffers of untrusted peers.
    unfinished: Arc<Semaphore>,
    /// [`TRUSTED_UNFINISHED_BYTES`], the same for trusted ones.
    trusted_unfinished: Arc<Semaphore>,
}

#[derive(Debug, Default)]
struct Users {
    total: usize,
    by_uid: HashMap<u32, User>,
}

#[derive(Debug)]
struct User {
    conns: usize,
    bucket: Bucket,
}

/// A refused connection: `reason` for the audit log, `message` for the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    pub reason: String,
    pub message: String,
}

impl Bounds {
    pub fn new(limits: Limits) -> Bounds {
        let kib = |bytes: usize| (bytes / 1024).clamp(1, Semaphore::MAX_PERMITS);
        Bounds {
            unfinished: Arc::new(Semaphore::new(kib(limits.unfinished_bytes))),
            trusted_unfinished: Arc::new(Semaphore::new(kib(limits.trusted_unfinished_bytes))),
            users: Mutex::default(),
            limits,
        }
    }

    /// Count a new connection of `uid` in, or say why there is no room. The connection is
    /// counted out when the returned [`Admitted`] is dropped.
    pub fn admit(self: &Arc<Bounds>, uid: u32, trusted: bool) -> Result<Admitted, Full> {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        let per_user = if trusted {
            self.limits.conns_per_trusted_user
        } else {
            self.limits.conns_per_user
        };
        let held = users.by_uid.get(&uid).map_or(0, |u| u.conns);
        if held >= per_user {
            return Err(Full {
                reason: format!("too many connections ({per_user} for one user)"),
                message: format!(
                    "too many connections: uid {uid} already has {per_user} connections open to \
                     this daemon, the most one user may have; close some and try again"
                ),
            });
        }
        if users.total >= self.limits.conns {
            let all = self.limits.conns;
            return Err(Full {
                reason: format!("too many connections ({all} in all)"),
                message: format!(
                    "too many connections: this daemon holds {all} connections, the most it \
                     serves at once; try again when some have closed"
                ),
            });
        }
        users.total += 1;
        let burst = self.limits.burst;
        users
            .by_uid
            .entry(uid)
            .or_insert_with(|| User {
                conns: 0,
                bucket: Bucket::full(burst),
            })
            .conns += 1;
        Ok(Admitted {
            bounds: Arc::clone(self),
            uid,
        })
    }

    /// Whether `uid` may make one more request now (its allowance is spent otherwise).
    pub fn allow(&self, uid: u32, now: Instant) -> bool {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        let (rate, burst) = (self.limits.rate_per_s, self.limits.burst);
        match users.by_uid.get_mut(&uid) {
            Some(u) => u.bucket.take(rate, burst, now),
            None => true,
        }
    }

    /// Forget users with no connection whose allowance has refilled (kept until then, so that
    /// closing every connection does not buy a new burst).
    /// Whether [`prune`](Self::prune) may have work: a user with no connection left.
    pub fn prunable(&self) -> bool {
        let users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.by_uid.values().any(|u| u.conns == 0)
    }

    pub fn prune(&self, now: Instant) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        let (rate, burst) = (self.limits.rate_per_s, self.limits.burst);
        users
            .by_uid
            .retain(|_, u| u.conns > 0 || u.bucket.level(rate, burst, now) < burst);
        users.by_uid.shrink_to_fit();
    }

    /// The budget the read buffers of trusted or untrusted peers draw on (KiB permits).
    pub fn unfinished(&self, trusted: bool) -> Arc<Semaphore> {
        Arc::clone(if trusted {
            &self.trusted_unfinished
        } else {
            &self.unfinished
        })
    }

    /// Connections held now: in all, and by `uid`.
    #[cfg(test)]
    pub fn held(&self, uid: u32) -> (usize, usize) {
        let users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        (users.total, users.by_uid.get(&uid).map_or(0, |u| u.conns))
    }
}

/// A counted connection; dropping it counts it out.
#[derive(Debug)]
pub struct Admitted {
    bounds: Arc<Bounds>,
    uid: u32,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut users = self.bounds.users.lock().unwrap_or_else(|e| e.into_inner());
        users.total = users.total.saturating_sub(1);
        if let Some(u) = users.by_uid.get_mut(&self.uid) {
            u.conns = u.conns.saturating_sub(1);
        }
    }
}

/// A token bucket: `burst` requests at once, then `rate` a second.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Option<Instant>,
}

impl Bucket {
    fn full(burst: f64) -> Bucket {
        Bucket {
            tokens: burst,
            at: None,
        }
    }

    fn level(&self, rate: f64, burst: f64, now: Instant) -> f64 {
        let refill = self.at.map_or(0.0, |at| {
            now.saturating_duration_since(at).as_secs_f64() * rate
        });
        (self.tokens + refill).min(burst)
    }

    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        self.tokens = self.level(rate, burst, now);
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(spec: &str) -> Arc<Bounds> {
        Arc::new(Bounds::new(Limits::parse(spec)))
    }

    #[test]
    fn the_test_variable_overrides_only_what_it_names() {
        let l = Limits::parse("conns=6, handshake_ms=400,frame_ms=x,nonsense=3,rate=0");
        assert_eq!(l.conns, 6);
        assert_eq!(l.handshake, Duration::from_millis(400));
        assert_eq!(l.frame, FRAME_WITHIN, "a bad value is ignored");
        assert_eq!(l.rate_per_s, 1.0, "never zero");
        assert_eq!(Limits::parse(""), Limits::default());
    }

    #[test]
    fn connections_are_capped_per_user_and_in_all_and_counted_out_on_drop() {
        let b = bounds("conns=5,conns_per_user=2,conns_per_trusted_user=3");
        let a1 = b.admit(1000, false).unwrap();
        let _a2 = b.admit(1000, false).unwrap();
        let full = b.admit(1000, false).unwrap_err();
        assert!(
            full.message.contains("uid 1000 already has 2 connections"),
            "{full:?}"
        );
        assert_eq!(full.reason, "too many connections (2 for one user)");
        // Root has a larger share, and the total caps everyone.
        let _r: Vec<_> = (0..3).map(|_| b.admit(0, true).unwrap()).collect();
        assert!(
            b.admit(0, true)
                .unwrap_err()
                .message
                .contains("3 connections")
        );
        assert_eq!(b.held(1000), (5, 2));
        let full = b.admit(2000, false).unwrap_err();
        assert!(full.message.contains("holds 5 connections"), "{full:?}");
        drop(a1);
        assert_eq!(b.held(1000), (4, 1));
        let _a3 = b.admit(2000, false).unwrap();
    }

    #[test]
    fn the_rate_allows_a_burst_then_refills_and_survives_reconnecting() {
        let b = bounds("rate=10,burst=20");
        let t0 = Instant::now();
        let conn = b.admit(7, false).unwrap();
        assert_eq!((0..100).filter(|_| b.allow(7, t0)).count(), 20);
        assert!(!b.allow(7, t0));
        let later = t0 + Duration::from_millis(500);
        assert_eq!((0..100).filter(|_| b.allow(7, later)).count(), 5);
        // Closing and reopening does not refill it.
        drop(conn);
        b.prune(later);
        let _conn = b.admit(7, false).unwrap();
        assert!(!b.allow(7, later));
        // Once refilled and gone, the user is forgotten.
        drop(_conn);
        b.prune(later + Duration::from_secs(3));
        assert!(b.users.lock().unwrap().by_uid.is_empty());
    }
}
