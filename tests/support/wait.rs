//! Bounded waits: every test that polls for something goes through [`poll`] (or
//! [`wait_for`]), so each wait has a deadline and its failure says what it waited for.

use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// How often [`wait_for`] looks.
pub const EVERY: Duration = Duration::from_millis(10);

/// Call `probe` every `every` until it gives `Ok`, and return that value. Past `timeout`, panic
/// with "timed out after TIMEOUT waiting for WHAT" followed by the last `Err`'s text (empty, or
/// the state worth showing, such as "; the screen:\n…").
pub fn poll<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(state) => assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}{state}"
            ),
        }
        std::thread::sleep(every);
    }
}

/// Poll `cond` every 10 ms until it holds; panic after `timeout` naming `what`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    poll(what, timeout, EVERY, || {
        if cond() { Ok(()) } else { Err(String::new()) }
    })
}

/// Wait for `child` (its output piped) to end, at most `timeout`; its output. Past the
/// timeout it is killed and the test fails with what it printed.
pub fn finish(mut child: Child, what: &str, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} did not finish within {timeout:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(EVERY);
    }
    child.wait_with_output().unwrap()
}
