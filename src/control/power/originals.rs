//! The values a GPU had before gpupilot first changed them: `$STATE/control/originals.json`.
//!
//! Each original is written (and synced) before the change it precedes, so a daemon that
//! crashes right after a change still knows what to restore. `reset` restores and forgets;
//! once nothing is recorded the file is removed. An original is recorded once: a second cap
//! does not overwrite the limit found before the first.
//!
//! NVML cannot read back locked clocks, so for clocks the original is "not locked" and what
//! gpupilot locked them to is kept instead (shown by `gpupilot power`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What was recorded for one GPU. Absent fields: gpupilot has not changed that setting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuOriginals {
    /// The GPU's UUID when recorded: after a reboot the index may name another GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The management power limit before the first cap, watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<f64>,
    /// The SM clocks gpupilot locked (`[min, max]` MHz); the original is unlocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_clocks_mhz: Option<[u32; 2]>,
    /// The driver's target temperature before the first change, °C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_max_c: Option<f64>,
}

impl GpuOriginals {
    pub fn is_empty(&self) -> bool {
        self.power_limit_w.is_none() && self.locked_clocks_mhz.is_none() && self.gpu_max_c.is_none()
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    /// GPU index → what was recorded.
    gpus: BTreeMap<u32, GpuOriginals>,
}

/// The record, in memory and on disk. See the module doc.
#[derive(Debug)]
pub struct Originals {
    path: PathBuf,
    gpus: BTreeMap<u32, GpuOriginals>,
}

impl Originals {
    /// Where the record lives under a state directory.
    pub fn path_in(state_dir: &Path) -> PathBuf {
        state_dir.join("control").join("originals.json")
    }

    /// Read the record (none yet: an empty one). A file that does not parse is an error that
    /// names it: restoring from a guess would be worse than saying so.
    pub fn load(path: PathBuf) -> io::Result<Originals> {
        // The directory too: a link there to another user's would have them write the
        // record root restores from.
        if let Some(dir) = path.parent().filter(|d| d.exists()) {
            crate::config::safe_fs::own_dir(dir, crate::config::safe_fs::DirKind::Shared)?;
        }
        // A few settings per GPU: a bounded read, never through a link.
        let gpus = match crate::config::safe_fs::read_capped_string(&path, 1 << 20) {
            Ok(text) => {
                serde_json::from_str::<File>(&text)
                    .map_err(|e| {
                        io::Error::other(format!(
                            "{} does not parse ({e}); move it away to start a new record",
                            path.display()
                        ))
                    })?
                    .gpus
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        Ok(Originals { path, gpus })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, gpu: u32) -> GpuOriginals {
        self.gpus.get(&gpu).cloned().unwrap_or_default()
    }

    /// Every GPU with something recorded.
    pub fn gpus(&self) -> impl Iterator<Item = (u32, &GpuOriginals)> {
        self.gpus.iter().map(|(k, v)| (*k, v))
    }

    /// Change GPU `gpu`'s record with `f` and write the file (synced) before returning.
    pub fn update(
        &mut self,
        gpu: u32,
        uuid: Option<String>,
        f: impl FnOnce(&mut GpuOriginals),
    ) -> io::Result<()> {
        let before = self.gpus.clone();
        let entry = self.gpus.entry(gpu).or_default();
        if entry.uuid.is_none() {
            entry.uuid = uuid;
        }
        f(entry);
        if entry.is_empty() {
            self.gpus.remove(&gpu);
        }
        if self.gpus == before {
            return Ok(());
        }
        if let Err(e) = self.save() {
            self.gpus = before;
            return Err(e);
        }
        Ok(())
    }

    /// Write to a fresh temporary file (never through a link planted there), sync, rename over
    /// the record; remove it when empty.
    fn save(&self) -> io::Result<()> {
        if self.gpus.is_empty() {
            return match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        // Ours, writable by no one else, never a link to someone's directory: a root daemon
        // writes here. (Not secret: older daemons made it 0755, which stays usable.)
        crate::config::safe_fs::own_dir(dir, crate::config::safe_fs::DirKind::Shared)?;
        let mut text = serde_json::to_string_pretty(&File {
            gpus: self.gpus.clone(),
        })
        .map_err(io::Error::other)?;
        text.push('\n');
        crate::config::safe_fs::write_atomic_durable(&self.path, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_before_the_change_kept_once_and_cleared_by_reset() {
        let tmp = tempfile::tempdir().unwrap();
        let path = Originals::path_in(tmp.path());
        let mut o = Originals::load(path.clone()).unwrap();
        assert!(o.gpus().next().is_none());
        o.update(1, Some("GPU-1".into()), |g| {
            g.power_limit_w.get_or_insert(700.0);
        })
        .unwrap();
        // On disk at once: a crash after this point still knows 700 W.
        let text = std::fs::read_to_string(&path).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["gpus"]["1"]["power_limit_w"], 700.0);
        assert_eq!(back["gpus"]["1"]["uuid"], "GPU-1");
        // A second cap keeps the first original.
        o.update(1, None, |g| {
            g.power_limit_w.get_or_insert(250.0);
        })
        .unwrap();
        let o2 = Originals::load(path.clone()).unwrap();
        assert_eq!(o2.get(1).power_limit_w, Some(700.0));
        assert_eq!(o2.get(0), GpuOriginals::default());
        // Reset forgets; with nothing left the file goes.
        o.update(1, None, |g| g.power_limit_w = None).unwrap();
        assert!(!path.exists());
        assert!(
            Originals::load(path.clone())
                .unwrap()
                .gpus()
                .next()
                .is_none()
        );
    }

    #[test]
    fn a_link_planted_at_the_old_temporary_name_is_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let path = Originals::path_in(tmp.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        // Where the record's temporary file used to be made with File::create.
        std::os::unix::fs::symlink(&victim, path.with_extension("json.tmp")).unwrap();
        let mut o = Originals::load(path.clone()).unwrap();
        o.update(0, None, |g| {
            g.power_limit_w.get_or_insert(700.0);
        })
        .unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::read_to_string(&path).unwrap().contains("700"));
    }

    /// `state/control` linked to a directory someone else chose: the record is neither read
    /// from nor written into it.
    #[test]
    fn a_link_in_the_place_of_the_records_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("users-dir");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(
            elsewhere.join("originals.json"),
            r#"{"gpus":{"0":{"power_limit_w":1}}}"#,
        )
        .unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::symlink(&elsewhere, state.join("control")).unwrap();
        let path = Originals::path_in(&state);
        let e = Originals::load(path.clone()).unwrap_err();
        assert!(
            crate::config::safe_fs::refusal(&e)
                .is_some_and(|r| r.problem.contains("symbolic link")),
            "{e}"
        );
        // A record loaded before the link appeared is not written through it either.
        std::fs::remove_file(state.join("control")).unwrap();
        let mut o = Originals::load(path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, state.join("control")).unwrap();
        assert!(
            o.update(1, None, |g| g.power_limit_w = Some(700.0))
                .is_err()
        );
        assert!(
            !std::fs::read_to_string(elsewhere.join("originals.json"))
                .unwrap()
                .contains("700")
        );
    }

    #[test]
    fn a_broken_record_is_an_error_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = Originals::path_in(tmp.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{not json").unwrap();
        let e = Originals::load(path).unwrap_err().to_string();
        assert!(e.contains("originals.json does not parse"), "{e}");
    }
}
