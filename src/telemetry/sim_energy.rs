//! The simulator's energy counters kept across openings of the source, so that a restarted
//! `--source sim` daemon reads counters that go on, as NVML's total-energy counter does (it
//! counts from when the driver loaded, whatever gpupilot does).
//!
//! A new simulated node counts from zero (its warm-up included). The daemon gives the source a
//! file in its state directory (`$STATE/sim-energy.json`, see [`FILE`]); the source saves each
//! GPU's counter, power and time there at most every [`SAVE_EVERY_S`], and a source opened
//! later on the same file starts each GPU's counter where it was saved, plus what the GPU drew
//! while no source ran (its last power for the time since the save): the energy ledger then
//! sees the counter move across a restart by what the GPU used, never go backwards.
//!
//! The file is the daemon's own: written whole through a fresh temporary file, read within a
//! bound and never through a link (`config::safe_fs`). A file that does not parse, or is for
//! other GPUs (another seed, model or count: each GPU's UUID and name are kept with it), is
//! passed over: the counters then start afresh, as after a driver reload.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::safe_fs;

/// The file in the state directory.
pub const FILE: &str = "sim-energy.json";
/// How often the counters are saved, seconds.
pub const SAVE_EVERY_S: f64 = 1.0;
/// The most read of the file: a few figures per GPU.
const MAX_FILE: u64 = 256 << 10;
/// The highest power believed of a saved GPU, watts (no GPU draws more).
const MAX_POWER_W: f64 = 5_000.0;

/// One GPU as saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedGpu {
    pub uuid: String,
    pub name: String,
    /// The counter as reported, joules.
    pub energy_j: f64,
    /// The power it drew then, watts.
    pub power_w: f64,
    /// When (Unix seconds).
    pub at_s: f64,
}

impl SavedGpu {
    fn plausible(&self) -> bool {
        self.energy_j.is_finite()
            && self.energy_j >= 0.0
            && self.power_w.is_finite()
            && (0.0..=MAX_POWER_W).contains(&self.power_w)
            && self.at_s.is_finite()
    }

    /// The counter at `now_s`: as saved, plus the saved power for the time since.
    pub fn counter_at(&self, now_s: f64) -> f64 {
        self.energy_j + self.power_w * (now_s - self.at_s).max(0.0)
    }
}

/// The file's content: by GPU index.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Saved {
    gpus: Vec<Option<SavedGpu>>,
}

/// The counters of one source: what is added to each GPU's own counter, and what is saved.
#[derive(Debug)]
pub struct Counters {
    path: PathBuf,
    /// Joules added to each GPU's own counter.
    offset_j: Vec<f64>,
    /// Each GPU as last read (reported counter), to be saved.
    last: Vec<Option<SavedGpu>>,
    /// When they were last saved (Unix seconds).
    saved_s: f64,
}

impl Counters {
    /// The counters of a node whose GPUs are `gpus` (UUID, name, own counter in joules), read
    /// from `path` at `now_s`.
    pub fn open(path: &Path, gpus: &[(String, String, f64)], now_s: f64) -> Counters {
        let saved = match read(path) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Saved::default(),
            Err(e) => {
                tracing::warn!(
                    "simulator: {}: {e}; energy counters start afresh",
                    path.display()
                );
                Saved::default()
            }
        };
        let offset_j = gpus
            .iter()
            .enumerate()
            .map(
                |(i, (uuid, name, own_j))| match saved.gpus.get(i).and_then(Option::as_ref) {
                    Some(s) if s.uuid == *uuid && s.name == *name && s.plausible() => {
                        (s.counter_at(now_s) - own_j).max(0.0)
                    }
                    _ => 0.0,
                },
            )
            .collect();
        Counters {
            path: path.to_path_buf(),
            offset_j,
            last: vec![None; gpus.len()],
            saved_s: now_s,
        }
    }

    /// What GPU `index` reports: its own counter plus what went before.
    pub fn offset_j(&self, index: usize) -> f64 {
        self.offset_j.get(index).copied().unwrap_or(0.0)
    }

    /// GPU `index` was read: its reported counter and power at `now_s`. Saved when
    /// [`SAVE_EVERY_S`] has passed since the last save.
    pub fn read(&mut self, index: usize, gpu: SavedGpu, now_s: f64) {
        if let Some(slot) = self.last.get_mut(index) {
            *slot = Some(gpu);
        }
        if now_s - self.saved_s >= SAVE_EVERY_S || now_s < self.saved_s {
            self.saved_s = now_s;
            self.save();
        }
    }

    fn save(&self) {
        let saved = Saved {
            gpus: self.last.clone(),
        };
        let written = serde_json::to_vec(&saved)
            .map_err(io::Error::other)
            .and_then(|json| safe_fs::write_atomic(&self.path, &json));
        if let Err(e) = written {
            tracing::warn!(
                "simulator: saving energy counters to {}: {e}",
                self.path.display()
            );
        }
    }
}

fn read(path: &Path) -> io::Result<Saved> {
    let bytes = safe_fs::read_capped(path, MAX_FILE)?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(energy_j: f64, power_w: f64, at_s: f64) -> SavedGpu {
        SavedGpu {
            uuid: "GPU-a".into(),
            name: "H100".into(),
            energy_j,
            power_w,
            at_s,
        }
    }

    #[test]
    fn counters_go_on_from_the_save_plus_the_power_drawn_since() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(FILE);
        let node = [("GPU-a".to_string(), "H100".to_string(), 100.0)];
        let mut c = Counters::open(&path, &node, 1000.0);
        assert_eq!(c.offset_j(0), 0.0);
        c.read(0, gpu(5000.0, 400.0, 1000.5), 1000.5);
        assert!(!path.exists(), "saved at most every {SAVE_EVERY_S} s");
        c.read(0, gpu(5200.0, 400.0, 1001.0), 1001.0);
        assert!(path.exists());
        // Opened 3 s after the save, on a node whose own counter is at 100 J: it reports
        // 5200 + 3 × 400 J.
        let again = Counters::open(&path, &node, 1004.0);
        assert_eq!(again.offset_j(0) + 100.0, 6400.0);
        // Another GPU in that place, or none saved there: afresh.
        let other = [("GPU-b".to_string(), "H100".to_string(), 100.0)];
        assert_eq!(Counters::open(&path, &other, 1004.0).offset_j(0), 0.0);
        let two = [node[0].clone(), ("GPU-c".into(), "H100".into(), 7.0)];
        let c2 = Counters::open(&path, &two, 1004.0);
        assert_eq!((c2.offset_j(0) + 100.0, c2.offset_j(1)), (6400.0, 0.0));
    }

    #[test]
    fn a_bad_file_starts_the_counters_afresh() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(FILE);
        let node = [("GPU-a".to_string(), "H100".to_string(), 0.0)];
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(Counters::open(&path, &node, 10.0).offset_j(0), 0.0);
        let nan =
            r#"{"gpus":[{"uuid":"GPU-a","name":"H100","energy_j":1e400,"power_w":1,"at_s":1}]}"#;
        std::fs::write(&path, nan).unwrap();
        assert_eq!(Counters::open(&path, &node, 10.0).offset_j(0), 0.0);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        assert_eq!(Counters::open(&path, &node, 10.0).offset_j(0), 0.0);
    }
}
