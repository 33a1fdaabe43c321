//! Programs from elsewhere that some tests need (gpustat, tmux, setpriv, sshd, prometheus, a
//! local Slurm, PyTorch). Where one is missing the test passes with a printed reason, unless
//! GPUPILOT_REQUIRE_PEERS=1 (CI, whose .ci/run installs them all), where it fails.

use std::path::{Path, PathBuf};

/// A test cannot run here because of `why`: with GPUPILOT_REQUIRE_PEERS=1 the test fails
/// saying so; otherwise it prints `SKIPPED: WHY` and the caller returns (the test passes).
pub fn missing(why: &str) {
    if std::env::var("GPUPILOT_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("required (GPUPILOT_REQUIRE_PEERS=1), but {why}; .ci/run installs it");
    }
    eprintln!("SKIPPED: {why} (run .ci/run to install it)");
}

/// Find a peer program: the repository's `.venv/bin`, then PATH; [`missing`] when neither
/// has it.
pub fn peer(name: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".venv/bin")
        .join(name);
    let found = if venv.exists() {
        Some(venv)
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|c| c.is_file())
        })
    };
    if found.is_none() {
        missing(&format!("`{name}` is not installed"));
    }
    found
}
