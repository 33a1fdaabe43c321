//! The state file one simulated node lives in, shared by every process that loads the library.
//!
//! Layout: a 4096-byte header, then a JSON [`Snapshot`] (the gpusim node at some step plus
//! what gpusim does not model). The header holds a generation counter that writers bump after
//! every change; every process maps the header page and compares the counter on each call, which
//! costs one atomic load, and reloads the JSON only when it moved.
//!
//! Locking: `flock` on the file. Writers hold `LOCK_EX` for read-modify-write; readers hold
//! `LOCK_SH` while reading the body. The header is never truncated, so the mapping stays valid.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

const MAGIC: [u8; 8] = *b"FKNVML01";
const HEADER_LEN: u64 = 4096;

/// Everything that defines the node at one step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// Which scenario this node was built from.
    pub scenario_hash: u64,
    /// Wall-clock start of the node (Unix ns): simulated time is wall time since then.
    pub epoch_unix_ns: u64,
    /// The step the node has been advanced to.
    pub step: u64,
    pub node: gpusim::Node,
    /// Per-GPU settings NVML has and gpusim does not model.
    pub extras: Vec<GpuExtra>,
}

/// Per-GPU settings kept beside the gpusim node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuExtra {
    /// Set through `nvmlDeviceSetTemperatureThreshold(GPU_MAX)`; `None`: the catalog's value.
    pub gpu_max_threshold_c: Option<i32>,
    /// Applications clocks (memory, graphics) set through `nvmlDeviceSetApplicationsClocks`.
    pub app_clocks_mhz: Option<(u32, u32)>,
}

/// The header as it lies in the file, little-endian on the platforms this runs on.
#[repr(C)]
struct Header {
    magic: [u8; 8],
    generation: AtomicU64,
    body_len: AtomicU64,
}

/// An open state file with its header mapped.
pub struct Store {
    file: File,
    path: PathBuf,
    header: NonNull<Header>,
}

// SAFETY: the mapping is process-wide shared memory accessed only through atomics; the raw
// pointer is what makes the type !Send by default.
unsafe impl Send for Store {}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: `header` came from mmap of exactly HEADER_LEN bytes and is unmapped once.
        unsafe {
            libc::munmap(self.header.as_ptr().cast(), HEADER_LEN as usize);
        }
    }
}

/// An exclusive `flock`, released on drop.
pub struct Exclusive<'a> {
    store: &'a Store,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        let _ = flock(&self.store.file, libc::LOCK_UN);
    }
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: plain syscall on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

impl Store {
    /// Opens (creating if needed) the state file at `path`. When the file is new, unreadable or
    /// was made for another scenario, `fresh` builds the node and it is written there.
    /// Returns the store, the current snapshot and its generation.
    pub fn open(
        path: &Path,
        scenario_hash: u64,
        fresh: impl FnOnce() -> Snapshot,
    ) -> io::Result<(Store, Snapshot, u64)> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        flock(&file, libc::LOCK_EX)?;
        if file.metadata()?.len() < HEADER_LEN {
            file.set_len(HEADER_LEN)?;
        }
        // SAFETY: mapping the first page of a file we hold open read-write; the file is at least
        // HEADER_LEN long and is never truncated below it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                HEADER_LEN as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            let _ = flock(&file, libc::LOCK_UN);
            return Err(err);
        }
        let store = Store {
            file,
            path: path.to_path_buf(),
            header: NonNull::new(ptr.cast())
                .ok_or_else(|| io::Error::other("mmap returned null"))?,
        };
        let result = (|| -> io::Result<(Snapshot, u64)> {
            let existing = if store.header().magic == MAGIC {
                store.read_body().ok()
            } else {
                None
            };
            match existing {
                Some(snap) if snap.scenario_hash == scenario_hash => Ok((snap, store.generation())),
                _ => {
                    let snap = fresh();
                    let generation = store.write_body(&snap, true)?;
                    Ok((snap, generation))
                }
            }
        })();
        let _ = flock(&store.file, libc::LOCK_UN);
        let (snap, generation) = result?;
        Ok((store, snap, generation))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn header(&self) -> &Header {
        // SAFETY: valid mapping for the life of `self`; every mutable field is atomic, and the
        // magic is written only under LOCK_EX before the generation is published.
        unsafe { self.header.as_ref() }
    }

    /// The generation writers last published: one atomic load from shared memory.
    pub fn generation(&self) -> u64 {
        self.header().generation.load(Ordering::Acquire)
    }

    /// Reads the current snapshot under a shared lock.
    pub fn read(&self) -> io::Result<(Snapshot, u64)> {
        flock(&self.file, libc::LOCK_SH)?;
        let result = self.read_body().map(|s| (s, self.generation()));
        let _ = flock(&self.file, libc::LOCK_UN);
        result
    }

    /// Takes the exclusive lock (blocking).
    pub fn lock(&self) -> io::Result<Exclusive<'_>> {
        flock(&self.file, libc::LOCK_EX)?;
        Ok(Exclusive { store: self })
    }

    /// Takes the exclusive lock if nobody holds the file.
    pub fn try_lock(&self) -> Option<Exclusive<'_>> {
        flock(&self.file, libc::LOCK_EX | libc::LOCK_NB)
            .ok()
            .map(|()| Exclusive { store: self })
    }

    fn read_body(&self) -> io::Result<Snapshot> {
        let len = self.header().body_len.load(Ordering::Acquire);
        let mut body = Vec::with_capacity(len as usize);
        let mut f = &self.file;
        f.seek(SeekFrom::Start(HEADER_LEN))?;
        f.take(len).read_to_end(&mut body)?;
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Writes the body; with `bump`, publishes a new generation (a change others must load),
    /// without it the write is a checkpoint of an equivalent state. Caller holds LOCK_EX.
    fn write_body(&self, snap: &Snapshot, bump: bool) -> io::Result<u64> {
        let body = serde_json::to_vec(snap).map_err(io::Error::other)?;
        let mut f = &self.file;
        f.seek(SeekFrom::Start(HEADER_LEN))?;
        f.write_all(&body)?;
        self.file.set_len(HEADER_LEN + body.len() as u64)?;
        let h = self.header();
        if h.magic != MAGIC {
            // First write: the magic goes in through the file, before the generation is published.
            self.file.write_all_at(&MAGIC, 0)?;
        }
        h.body_len.store(body.len() as u64, Ordering::Release);
        if bump {
            Ok(h.generation.fetch_add(1, Ordering::AcqRel) + 1)
        } else {
            Ok(h.generation.load(Ordering::Acquire))
        }
    }
}

impl Exclusive<'_> {
    /// The snapshot on disk and its generation.
    pub fn read(&self) -> io::Result<(Snapshot, u64)> {
        Ok((self.store.read_body()?, self.store.generation()))
    }

    /// Publishes a changed snapshot; returns the new generation.
    pub fn publish(&self, snap: &Snapshot) -> io::Result<u64> {
        self.store.write_body(snap, true)
    }

    /// Writes an equivalent, later snapshot so that new processes have less to catch up.
    pub fn checkpoint(&self, snap: &Snapshot) -> io::Result<()> {
        self.store.write_body(snap, false).map(|_| ())
    }

    pub fn generation(&self) -> u64 {
        self.store.generation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(hash: u64, step: u64) -> Snapshot {
        let node = gpusim::Node::new(&gpusim::NodeConfig::default()).unwrap();
        let extras = vec![GpuExtra::default(); node.gpus().len()];
        Snapshot {
            scenario_hash: hash,
            epoch_unix_ns: 1,
            step,
            node,
            extras,
        }
    }

    #[test]
    fn create_reopen_publish() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.state");
        let (a, s, g1) = Store::open(&path, 7, || snap(7, 0)).unwrap();
        assert_eq!((s.step, g1), (0, 1));
        // A second opener with the same scenario finds the node instead of making one.
        let (b, s2, g2) = Store::open(&path, 7, || panic!("must not rebuild")).unwrap();
        assert_eq!((s2.step, g2), (0, 1));
        {
            let x = a.lock().unwrap();
            let mut s = x.read().unwrap().0;
            s.step = 42;
            assert_eq!(x.publish(&s).unwrap(), 2);
        }
        assert_eq!(b.generation(), 2, "the other mapping sees the bump");
        assert_eq!(b.read().unwrap().0.step, 42);
        {
            let x = b.lock().unwrap();
            assert!(a.try_lock().is_none(), "flock is per open file description");
            let mut s = x.read().unwrap().0;
            s.step = 50;
            x.checkpoint(&s).unwrap();
        }
        assert_eq!(a.generation(), 2, "a checkpoint is not a change");
        assert_eq!(a.read().unwrap().0.step, 50);
        // Another scenario at the same path starts over.
        let (_c, s3, g3) = Store::open(&path, 8, || snap(8, 0)).unwrap();
        assert_eq!((s3.scenario_hash, s3.step, g3), (8, 0, 3));
    }
}
