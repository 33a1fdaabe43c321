//! Who holds a GPU: for a process on it, its user (the owner of `/proc/PID`, named from
//! `/etc/passwd`) and, from `/proc/PID/cgroup`, the Slurm job, container or Kubernetes pod it
//! runs in.
//!
//! [`parse_cgroup`] reads cgroup v1 (`N:controllers:/path`) and v2 (`0::/path`) lines as
//! Slurm, Docker, containerd (CRI), CRI-O, Podman and the kubelet (cgroupfs and systemd
//! drivers) write them. Reads are bounded ([`MAX_CGROUP_BYTES`]), and [`OwnerCache`] reads a
//! process again only every [`OWNER_TTL`]: a sampler at 10 Hz does not reread `/proc` 10 times
//! a second for a process whose job does not change.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The most of `/proc/PID/cgroup` read: a real one is a few hundred bytes.
pub const MAX_CGROUP_BYTES: u64 = 16 * 1024;
/// How long what was read about a process is kept before it is read again.
pub const OWNER_TTL: Duration = Duration::from_secs(30);
/// Processes remembered at most (entries of processes gone are dropped first).
const MAX_CACHED: usize = 4096;

/// Who a GPU process belongs to. Every field absent when it cannot be told.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOwner {
    pub uid: Option<u32>,
    /// The user's name; absent when the uid has none in `/etc/passwd`.
    pub user: Option<String>,
    /// The Slurm job id (`job_NNN` in a slurm cgroup path).
    pub slurm_job: Option<String>,
    /// The container id (Docker, containerd, CRI-O, Podman), in full.
    pub container: Option<String>,
    /// The Kubernetes pod's UID (from a kubepods path).
    pub pod: Option<String>,
}

impl ProcessOwner {
    /// The user's name, else `uid N`.
    pub fn user_label(&self) -> Option<String> {
        self.user
            .clone()
            .or_else(|| self.uid.map(|u| format!("uid {u}")))
    }

    /// Where it runs, in a few words: `slurm 4242`, `pod 0e3a2b6c`, `ctr 3f8e9b1c2d4a`.
    pub fn place(&self) -> Option<String> {
        if let Some(j) = &self.slurm_job {
            return Some(format!("slurm {j}"));
        }
        if let Some(p) = &self.pod {
            return Some(format!("pod {}", short(p, 8)));
        }
        self.container
            .as_ref()
            .map(|c| format!("ctr {}", short(c, 12)))
    }
}

/// The first `n` characters of an id (`docker ps` shows 12).
pub fn short(id: &str, n: usize) -> &str {
    id.get(..n).unwrap_or(id)
}

/// Where a process runs, as its cgroup paths tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupPlace {
    pub slurm_job: Option<String>,
    pub container: Option<String>,
    pub pod: Option<String>,
}

/// Read `/proc/PID/cgroup`'s text: the Slurm job, container and pod of its first line that
/// names each.
pub fn parse_cgroup(text: &str) -> CgroupPlace {
    let mut place = CgroupPlace::default();
    for line in text.lines() {
        // `hierarchy-id:controllers:path`; the path may itself hold colons.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let found = parse_path(path);
        place.slurm_job = place.slurm_job.or(found.slurm_job);
        place.container = place.container.or(found.container);
        place.pod = place.pod.or(found.pod);
    }
    place
}

/// One cgroup path.
fn parse_path(path: &str) -> CgroupPlace {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut place = CgroupPlace::default();
    // Slurm: `/slurm/uid_1000/job_42/step_0` (v1), `/system.slice/slurmstepd.scope/job_42/…`
    // (v2), `/slurm_node7/uid_1000/job_42` (several slurmd on one host).
    if parts.iter().any(|p| p.starts_with("slurm")) {
        place.slurm_job = parts.iter().find_map(|p| {
            let id = p.strip_prefix("job_")?;
            (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_string())
        });
    }
    if parts.iter().any(|p| p.starts_with("kubepods")) {
        place.pod = parts.iter().find_map(|p| pod_uid(p));
    }
    place.container = parts.iter().rev().find_map(|p| container_id(p));
    place
}

/// `pod0e3a…` (cgroupfs) or `kubepods-burstable-pod0e3a2b6c_1f2d_….slice` (systemd): the
/// pod's UID with dashes.
fn pod_uid(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let at = part.rfind("pod")?;
    let uid = part[at + 3..].replace('_', "-");
    let well_formed = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    well_formed.then_some(uid)
}

/// A container's id from one path part: 64 hex digits alone (`/docker/<id>`, kubepods
/// cgroupfs), or after a runtime's prefix in a systemd scope (`docker-<id>.scope`,
/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`). Podman's
/// `libpod-conmon-…` is its monitor, not the container.
fn container_id(part: &str) -> Option<String> {
    let hex64 = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if hex64(part) {
        return Some(part.to_string());
    }
    let scope = part.strip_suffix(".scope")?;
    ["docker-", "cri-containerd-", "crio-", "libpod-", "nerdctl-"]
        .iter()
        .find_map(|prefix| scope.strip_prefix(prefix))
        .filter(|id| hex64(id))
        .map(str::to_string)
}

/// Reads a process's owner from a `/proc`-like tree (`/proc` on a live system).
pub fn read_owner(proc_root: &Path, pid: u32) -> Option<ProcessOwner> {
    let dir = proc_root.join(pid.to_string());
    // /proc/PID belongs to the process's effective uid: enough to name its user.
    let uid = std::fs::metadata(&dir).ok()?.uid();
    let place = read_bounded(&dir.join("cgroup"))
        .map(|t| parse_cgroup(&t))
        .unwrap_or_default();
    Some(ProcessOwner {
        uid: Some(uid),
        user: crate::ipc::user_name(uid),
        slurm_job: place.slurm_job,
        container: place.container,
        pod: place.pod,
    })
}

/// At most [`MAX_CGROUP_BYTES`] of a file, as text.
fn read_bounded(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_CGROUP_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Owners of GPU processes, each read again after [`OWNER_TTL`]. Shared by the sampling
/// threads (a mutex held for one lookup, never across a read of `/proc`).
#[derive(Debug)]
pub struct OwnerCache {
    proc_root: PathBuf,
    entries: Mutex<HashMap<u32, (Instant, Option<ProcessOwner>)>>,
}

impl Default for OwnerCache {
    fn default() -> Self {
        OwnerCache::new("/proc")
    }
}

impl OwnerCache {
    pub fn new(proc_root: impl Into<PathBuf>) -> OwnerCache {
        OwnerCache {
            proc_root: proc_root.into(),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// `pid`'s owner: remembered, or read now. None: the process is not visible here (another
    /// PID namespace, or it ended).
    pub fn owner(&self, pid: u32) -> Option<ProcessOwner> {
        let lock = || self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, owner)) = lock().get(&pid) {
            if at.elapsed() < OWNER_TTL {
                return owner.clone();
            }
        }
        let owner = read_owner(&self.proc_root, pid);
        let mut entries = lock();
        if entries.len() >= MAX_CACHED {
            entries.retain(|_, (at, _)| at.elapsed() < OWNER_TTL);
            if entries.len() >= MAX_CACHED {
                entries.clear();
            }
        }
        entries.insert(pid, (Instant::now(), owner.clone()));
        owner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCKER_ID: &str = "3f8e9b1c2d4a5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f";
    const POD: &str = "0e3a2b6c-1f2d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn slurm_cgroup_v1() {
        let text = "12:pids:/slurm/uid_1000/job_4242/step_0/task_0\n\
                    11:memory:/slurm/uid_1000/job_4242/step_0/task_0\n\
                    4:freezer:/slurm/uid_1000/job_4242/step_0\n\
                    1:name=systemd:/system.slice/slurmd.service\n";
        let p = parse_cgroup(text);
        assert_eq!(p.slurm_job.as_deref(), Some("4242"));
        assert_eq!(p.container, None);
        assert_eq!(p.pod, None);
    }

    #[test]
    fn slurm_cgroup_v2_and_a_node_named_slurmd() {
        let v2 = "0::/system.slice/slurmstepd.scope/job_17/step_batch/user/task_0\n";
        assert_eq!(parse_cgroup(v2).slurm_job.as_deref(), Some("17"));
        let multi = "7:devices:/slurm_gpu-node-03/uid_2001/job_880123/step_extern\n";
        assert_eq!(parse_cgroup(multi).slurm_job.as_deref(), Some("880123"));
        // `job_` outside a slurm hierarchy, or not a number, is no Slurm job.
        assert_eq!(parse_cgroup("0::/user.slice/job_12\n").slurm_job, None);
        assert_eq!(parse_cgroup("0::/slurm/uid_1/job_x\n").slurm_job, None);
    }

    #[test]
    fn docker_v1_cgroupfs_and_v2_systemd() {
        let v1 = format!("12:memory:/docker/{DOCKER_ID}\n11:cpu,cpuacct:/docker/{DOCKER_ID}\n");
        assert_eq!(parse_cgroup(&v1).container.as_deref(), Some(DOCKER_ID));
        let v2 = format!("0::/system.slice/docker-{DOCKER_ID}.scope\n");
        let p = parse_cgroup(&v2);
        assert_eq!(p.container.as_deref(), Some(DOCKER_ID));
        assert_eq!((p.slurm_job, p.pod), (None, None));
    }

    #[test]
    fn kubernetes_pods_with_either_cgroup_driver() {
        let cgroupfs = format!("0::/kubepods/besteffort/pod{POD}/{DOCKER_ID}\n");
        let p = parse_cgroup(&cgroupfs);
        assert_eq!(p.pod.as_deref(), Some(POD));
        assert_eq!(p.container.as_deref(), Some(DOCKER_ID));
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{DOCKER_ID}.scope\n",
            POD.replace('-', "_")
        );
        let p = parse_cgroup(&systemd);
        assert_eq!(p.pod.as_deref(), Some(POD), "underscores back to dashes");
        assert_eq!(p.container.as_deref(), Some(DOCKER_ID));
        let guaranteed_v1 = format!("9:memory:/kubepods/pod{POD}/crio-{DOCKER_ID}.scope\n");
        assert_eq!(parse_cgroup(&guaranteed_v1).pod.as_deref(), Some(POD));
    }

    #[test]
    fn podman_not_its_monitor() {
        let rootless = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{DOCKER_ID}.scope/container\n"
        );
        assert_eq!(
            parse_cgroup(&rootless).container.as_deref(),
            Some(DOCKER_ID)
        );
        let conmon = format!("0::/machine.slice/libpod-conmon-{DOCKER_ID}.scope\n");
        assert_eq!(parse_cgroup(&conmon).container, None);
    }

    #[test]
    fn plain_hosts_and_junk_say_nothing() {
        for text in [
            "0::/\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "12:memory:/process_api/810012005b7e0c456708348994ef52e4\n",
            "",
            "garbage without colons\n",
            "0::/docker/not-an-id\n",
            "0::/kubepods/podshort/x\n",
        ] {
            assert_eq!(parse_cgroup(text), CgroupPlace::default(), "{text:?}");
        }
    }

    #[test]
    fn an_owner_from_a_proc_tree_and_a_bounded_cgroup_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("4242");
        std::fs::create_dir(&dir).unwrap();
        // A huge cgroup file: only the first MAX_CGROUP_BYTES count.
        let mut text = "0::/slurm/uid_1000/job_77/step_0\n".to_string();
        text.push_str(&"x".repeat(2 * MAX_CGROUP_BYTES as usize));
        text.push_str(&format!("\n0::/docker/{DOCKER_ID}\n"));
        std::fs::write(dir.join("cgroup"), text).unwrap();
        let me = rustix::process::getuid().as_raw();
        let cache = OwnerCache::new(tmp.path());
        let o = cache.owner(4242).unwrap();
        assert_eq!(o.uid, Some(me));
        assert_eq!(o.slurm_job.as_deref(), Some("77"));
        assert_eq!(o.container, None, "past the read limit");
        assert_eq!(o.place().as_deref(), Some("slurm 77"));
        assert!(cache.owner(999).is_none(), "no such process");
        // Remembered: a changed file is not read again within the TTL.
        std::fs::write(dir.join("cgroup"), "0::/\n").unwrap();
        assert_eq!(cache.owner(4242).unwrap().slurm_job.as_deref(), Some("77"));
    }

    #[test]
    fn labels() {
        let o = ProcessOwner {
            uid: Some(4321),
            container: Some(DOCKER_ID.into()),
            ..ProcessOwner::default()
        };
        assert_eq!(o.user_label().as_deref(), Some("uid 4321"));
        assert_eq!(o.place().as_deref(), Some("ctr 3f8e9b1c2d4a"));
    }
}
