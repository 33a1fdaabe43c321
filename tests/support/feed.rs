//! Reading a console feed's updates in a test, with a bound on every wait.

use std::time::{Duration, Instant};

use gpupilot::tui::feed::{Feed, Request, Update};

pub struct Reader {
    rt: tokio::runtime::Runtime,
    pub feed: Feed,
    /// The longest any one wait may take.
    wait: Duration,
    /// Everything received, in order.
    pub seen: Vec<Update>,
}

impl Reader {
    pub fn new(feed: Feed, wait: Duration) -> Reader {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        Reader {
            rt,
            feed,
            wait,
            seen: Vec::new(),
        }
    }

    /// Receive until `done` holds for one update (at most the reader's wait); that update.
    pub fn until(&mut self, what: &str, mut done: impl FnMut(&Update) -> bool) -> Update {
        let deadline = Instant::now() + self.wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let updates = &mut self.feed.updates;
            let got = self
                .rt
                .block_on(async { tokio::time::timeout(left, updates.recv()).await });
            match got {
                Ok(Some(u)) => {
                    self.seen.push(u.clone());
                    if done(&u) {
                        return u;
                    }
                }
                Ok(None) => panic!("the feed ended while waiting for {what}"),
                Err(_) => panic!(
                    "timed out after {:?} waiting for {what}; got {} updates, the last: {:?}",
                    self.wait,
                    self.seen.len(),
                    self.seen.iter().rev().take(5).collect::<Vec<_>>()
                ),
            }
        }
    }

    /// Everything received over the next `d` (also kept in `seen`).
    pub fn during(&mut self, d: Duration) -> Vec<Update> {
        self.during_timed(d).into_iter().map(|(_, u)| u).collect()
    }

    /// [`Reader::during`], each update with when it came.
    pub fn during_timed(&mut self, d: Duration) -> Vec<(Instant, Update)> {
        let deadline = Instant::now() + d;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let updates = &mut self.feed.updates;
            match self
                .rt
                .block_on(async { tokio::time::timeout(left, updates.recv()).await })
            {
                Ok(Some(u)) => {
                    self.seen.push(u.clone());
                    got.push((Instant::now(), u));
                }
                Ok(None) => panic!("the feed ended"),
                Err(_) => return got,
            }
        }
    }

    pub fn send(&self, r: Request) {
        self.feed.requests.send(r).unwrap();
    }
}
