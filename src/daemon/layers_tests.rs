//! The daemon's own layers, checked as the crate's and the console's are
//! (`crate::layering::inner_violations`): a child of `daemon` uses only the children of the
//! layers below its own, through `crate::daemon::…` or `super::…` paths. No part imports back
//! from the state that holds it, and no two parts import each other.

use std::path::Path;

/// Bottom to top. A child of `daemon` may use the children of earlier layers only.
const LAYERS: &[&[&str]] = &[
    // The leaf: what every part uses (`RequestError`, `DaemonError`, the lock helper).
    &["base"],
    // The log, the node's event log, who a peer is and what it may do, the lock file and the
    // runtime directory.
    &["logging", "events", "auth", "lock"],
    // The parts, each with its own locks: telemetry; the runs and their trainer channels; the
    // GPU settings and control loops (which read the runs and the newest snapshot); the
    // energy-tuning jobs.
    &["telemetry"],
    &["runs"],
    &["control", "tune"],
    // The state that holds the parts and does what crosses them.
    &["state"],
    // The requests, a module per family, answered against the state; a trainer relayed to
    // another node's daemon.
    &["requests", "relay"],
    // What serves them: the socket's connections, Prometheus `/metrics`.
    &["server", "metrics"],
    // Starting the daemon in the background, and stopping it.
    &["detach", "stop"],
];

#[test]
fn the_daemon_imports_one_way() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon");
    let bad = crate::layering::inner_violations(&dir, "daemon", LAYERS);
    assert!(
        bad.is_empty(),
        "the daemon's layers are broken:\n{}",
        bad.join("\n")
    );
}
