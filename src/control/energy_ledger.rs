//! A live run's energy on disk, `$RUN/energy.json`: what was measured per GPU and the GPU's
//! energy counter when it was saved, so that a daemon that dies (even by kill -9) loses
//! nothing: the next one adds what each counter moved meanwhile.
//!
//! NVML's total-energy counter counts from when the driver loaded, whatever gpupilot does; for
//! a run still alive when a new daemon adopts it, `counter now − counter saved` is the energy
//! of that GPU while no daemon watched (and since the last save). It is added only for the same
//! GPU (its UUID), a counter that did not go backwards (a driver reload resets it), and never
//! for a run that ended while no daemon ran (its end is not known to the second).
//!
//! Written every [`SAVE_EVERY_S`] by the daemon's control loop, atomically and synced
//! (`config::safe_fs::write_atomic_durable`: a temporary file made with O_EXCL, so a planted
//! link is never followed, renamed over the old one).

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file in the run directory.
pub const FILE: &str = "energy.json";
/// How often a live run's ledger is written, seconds.
pub const SAVE_EVERY_S: f64 = 2.0;

/// What is saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// When it was saved (snapshot time, Unix seconds).
    pub saved_s: f64,
    pub gpus: Vec<LedgerGpu>,
    /// Samples measured by the counter and by integrating power, for saying which measured.
    #[serde(default)]
    pub counter_s: f64,
    #[serde(default)]
    pub power_s: f64,
}

/// One GPU's share of the run, and its counter at the save.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerGpu {
    pub gpu: u32,
    pub energy_j: f64,
    #[serde(default)]
    pub uuid: Option<String>,
    /// NVML's total-energy counter at the save, joules (None: the GPU has none).
    #[serde(default)]
    pub counter_j: Option<f64>,
}

impl Ledger {
    pub fn total_j(&self) -> f64 {
        self.gpus.iter().map(|g| g.energy_j).sum()
    }
}

/// The ledger in `dir`, if there is one that parses (a torn or foreign file is ignored: the
/// run's `summary.json` is then what is known).
pub fn load(dir: &Path) -> Option<Ledger> {
    // A figure or two per GPU: a bounded read, never through a link.
    let text = crate::config::safe_fs::read_capped_string(&dir.join(FILE), 1 << 20).ok()?;
    match serde_json::from_str::<Ledger>(&text) {
        Ok(l)
            if l.gpus
                .iter()
                .all(|g| g.energy_j.is_finite() && g.energy_j >= 0.0) =>
        {
            Some(l)
        }
        Ok(_) => None,
        Err(e) => {
            tracing::warn!("{}: {e}; not used", dir.join(FILE).display());
            None
        }
    }
}

/// Write `ledger` to `dir` atomically, synced (a fresh temporary file renamed over the old).
pub fn save(dir: &Path, ledger: &Ledger) -> io::Result<()> {
    let text = serde_json::to_vec(ledger).map_err(io::Error::other)?;
    crate::config::safe_fs::write_atomic_durable(&dir.join(FILE), &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_atomically_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(load(tmp.path()), None);
        let l = Ledger {
            saved_s: 10.0,
            gpus: vec![LedgerGpu {
                gpu: 1,
                energy_j: 1234.5,
                uuid: Some("GPU-1".into()),
                counter_j: Some(99_000.0),
            }],
            counter_s: 5.0,
            power_s: 0.0,
        };
        // A temporary file left by a killed daemon of the same pid does not stop the next save.
        let left = tmp
            .path()
            .join(format!(".energy.json.tmp{}", std::process::id()));
        std::fs::write(&left, "torn").unwrap();
        save(tmp.path(), &l).unwrap();
        assert!(!left.exists());
        assert_eq!(load(tmp.path()), Some(l.clone()));
        assert_eq!(l.total_j(), 1234.5);
        std::fs::write(tmp.path().join(FILE), "{torn").unwrap();
        assert_eq!(load(tmp.path()), None);
    }
}
