//! `doctor` on a node whose NVML cannot be used: no NVIDIA driver, a driver whose kernel module
//! is not loaded, or a library the loader does not find. What was tried, what is there instead
//! (`nvidia-smi` on `PATH`, the kernel module's version in `/proc/driver/nvidia/version`, a
//! `libnvidia-ml.so.1` in a directory the loader does not search) and what to install, as one
//! `driver` line; the rest of the report goes on without NVML.
//!
//! The library tried is the one `--nvml-lib` / `GPUPILOT_NVML_LIB` names, else the loader's
//! `libnvidia-ml.so.1`; only then are the usual directories looked through, so a test that
//! names a library that is not there gets the same answer on every machine.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checks::{Check, Status};
use crate::telemetry::nvml::NvmlOpenError;

/// The file NVML's loader opens when no path is given.
pub const NVML_NAME: &str = "libnvidia-ml.so.1";

/// Directories where drivers put `libnvidia-ml.so.1` (Debian and Ubuntu, Fedora and RHEL,
/// NVIDIA's container runtime, WSL, the driver container of the GPU operator): a library found
/// here but not by the loader needs `ldconfig` or `--nvml-lib`.
pub const USUAL_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
];

/// At most this much of a small system file is read.
const MAX_SYSTEM_FILE: u64 = 16 * 1024;

/// Why NVML could not be used, and what else the node shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoNvml {
    /// `not_found`, `driver_not_loaded` or `failed`.
    pub reason: String,
    /// NVML's own words.
    pub error: String,
    /// The library tried: a path, or a name the dynamic loader looked up on its search path.
    pub tried: String,
    /// A `libnvidia-ml.so.1` found in one of [`USUAL_DIRS`] (only when none was named).
    pub found_elsewhere: Option<String>,
    /// `nvidia-smi` on `PATH`.
    pub nvidia_smi: Option<String>,
    /// The first line of `/proc/driver/nvidia/version`: the kernel module is loaded.
    pub kernel_module: Option<String>,
    /// `ID` of `/etc/os-release` (`debian`, `ubuntu`, `rhel`…), for the install hint.
    pub distro: Option<String>,
    /// Inside a container (`/.dockerenv` or `/run/.containerenv`).
    pub container: bool,
}

impl NoNvml {
    /// What the node shows, NVML having failed with `e` while opening `named` (or the default).
    pub fn gather(e: &NvmlOpenError, named: Option<&Path>) -> NoNvml {
        let reason = match e {
            NvmlOpenError::NotFound { .. } => "not_found",
            NvmlOpenError::DriverNotLoaded { .. } => "driver_not_loaded",
            NvmlOpenError::Init { .. } => "failed",
        };
        let found_elsewhere = match named {
            Some(_) => None,
            None => USUAL_DIRS
                .iter()
                .map(|d| Path::new(d).join(NVML_NAME))
                .find(|p| p.is_file())
                .map(|p| p.display().to_string()),
        };
        let kernel_module = first_line("/proc/driver/nvidia/version");
        NoNvml {
            reason: reason.into(),
            error: e.to_string(),
            tried: named.map_or_else(|| NVML_NAME.to_string(), |p| p.display().to_string()),
            found_elsewhere,
            nvidia_smi: on_path("nvidia-smi").map(|p| p.display().to_string()),
            kernel_module,
            distro: os_release_id(),
            container: Path::new("/.dockerenv").exists()
                || Path::new("/run/.containerenv").exists(),
        }
    }
}

/// The first [`MAX_SYSTEM_FILE`] bytes of a system file, links followed (`/etc/os-release` is
/// one), as text.
fn system_file(path: &str) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_SYSTEM_FILE)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn first_line(path: &str) -> Option<String> {
    let text = system_file(path)?;
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| crate::text::printable(line))
}

fn os_release_id() -> Option<String> {
    let text = system_file("/etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("ID="))
        .map(|v| v.trim().trim_matches('"').to_ascii_lowercase())
        .filter(|v| !v.is_empty() && v.len() < 64)
}

/// `program` in a directory of `PATH`, as a shell would find it.
fn on_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// How to install the driver on `distro`.
fn install_hint(distro: Option<&str>) -> &'static str {
    match distro {
        Some("debian") => {
            "install the driver: `apt install nvidia-driver` (from Debian's non-free and contrib sections; `nvidia-detect` says which), then reboot"
        }
        Some("ubuntu") => {
            "install the driver: `sudo ubuntu-drivers install` (or `apt install nvidia-driver-<version>`; `-server` for data-centre GPUs), then reboot"
        }
        Some("rhel" | "centos" | "rocky" | "almalinux" | "ol" | "fedora" | "amzn") => {
            "install the driver from NVIDIA's CUDA repository: `dnf install cuda-drivers` (Fedora: RPM Fusion's `akmod-nvidia`), then reboot"
        }
        _ => {
            "install the NVIDIA driver from your distribution's packages or NVIDIA's (docs.nvidia.com/datacenter/tesla/driver-installation-guide), then reboot"
        }
    }
}

/// The `driver` line for a node without a usable NVML: always a problem, with its fix.
pub fn check(n: &NoNvml) -> Check {
    let smi = match &n.nvidia_smi {
        Some(p) => format!("`nvidia-smi` is there ({p})"),
        None => "`nvidia-smi` is not on PATH either".into(),
    };
    let module = match &n.kernel_module {
        Some(v) => format!("the kernel module is loaded ({v})"),
        None => "no kernel module is loaded (no /proc/driver/nvidia/version)".into(),
    };
    let named = n.tried != NVML_NAME;
    let detail = match (n.reason.as_str(), &n.found_elsewhere) {
        ("driver_not_loaded", _) => format!(
            "NVML ({}) loads but the NVIDIA kernel module is not loaded: `sudo modprobe nvidia` and check `dmesg` (Secure Boot refuses an unsigned module: enroll its key or turn Secure Boot off); {smi}",
            n.tried
        ),
        ("failed", _) => format!(
            "{}; {module}; {smi}: reinstall the driver so that its library and kernel module are the same version, or reboot after an upgrade",
            n.error
        ),
        (_, Some(found)) => format!(
            "NVML library not found: tried {} (the loader's search path), yet {found} is there: run `sudo ldconfig`, or pass `--nvml-lib {found}` (GPUPILOT_NVML_LIB)",
            n.tried
        ),
        _ => {
            let tried = if named {
                format!(
                    "{} (--nvml-lib / GPUPILOT_NVML_LIB; unset it to use the loader's {NVML_NAME})",
                    n.tried
                )
            } else {
                format!(
                    "{} (the loader's search path) and {}",
                    n.tried,
                    USUAL_DIRS.join(", ")
                )
            };
            let fix = if n.container {
                "in a container: start it with the NVIDIA Container Toolkit (`docker run --gpus all …`, Podman's `--device nvidia.com/gpu=all`), which mounts the host's driver"
            } else if n.kernel_module.is_some() {
                "install the user-space part of the loaded driver (the same version as the kernel module: its libnvidia-ml and libcuda packages), or reboot if the driver was just upgraded"
            } else {
                install_hint(n.distro.as_deref())
            };
            format!(
                "NVML library not found: tried {tried}; {module}; {smi}: no NVIDIA driver on this node? {fix}"
            )
        }
    };
    Check {
        name: "driver".into(),
        status: Status::Fail,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none_here() -> NoNvml {
        NoNvml {
            reason: "not_found".into(),
            error: "NVML library not found".into(),
            tried: NVML_NAME.into(),
            found_elsewhere: None,
            nvidia_smi: None,
            kernel_module: None,
            distro: Some("debian".into()),
            container: false,
        }
    }

    #[test]
    fn no_driver_says_what_was_tried_and_what_to_install() {
        let c = check(&none_here());
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.name, "driver");
        assert!(
            c.detail.starts_with(
                "NVML library not found: tried libnvidia-ml.so.1 (the loader's search path) and /usr/lib/x86_64-linux-gnu, "
            ),
            "{}",
            c.detail
        );
        assert!(
            c.detail.contains("`nvidia-smi` is not on PATH either"),
            "{}",
            c.detail
        );
        assert!(
            c.detail.contains("`apt install nvidia-driver`"),
            "{}",
            c.detail
        );
        let ubuntu = check(&NoNvml {
            distro: Some("ubuntu".into()),
            ..none_here()
        });
        assert!(
            ubuntu.detail.contains("ubuntu-drivers install"),
            "{}",
            ubuntu.detail
        );
        let boxed = check(&NoNvml {
            container: true,
            ..none_here()
        });
        assert!(boxed.detail.contains("--gpus all"), "{}", boxed.detail);
    }

    #[test]
    fn a_library_off_the_loader_path_or_a_module_not_loaded_is_named() {
        let c = check(&NoNvml {
            found_elsewhere: Some("/usr/lib64/libnvidia-ml.so.1".into()),
            ..none_here()
        });
        assert!(
            c.detail
                .contains("/usr/lib64/libnvidia-ml.so.1 is there: run `sudo ldconfig`"),
            "{}",
            c.detail
        );
        let c = check(&NoNvml {
            reason: "driver_not_loaded".into(),
            nvidia_smi: Some("/usr/bin/nvidia-smi".into()),
            ..none_here()
        });
        assert!(c.detail.contains("`sudo modprobe nvidia`"), "{}", c.detail);
        assert!(c.detail.contains("(/usr/bin/nvidia-smi)"), "{}", c.detail);
        let c = check(&NoNvml {
            kernel_module: Some("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15".into()),
            ..none_here()
        });
        assert!(
            c.detail.contains("the kernel module is loaded (NVRM"),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("user-space part"), "{}", c.detail);
    }

    #[test]
    fn a_named_library_is_the_only_one_tried() {
        let e = NvmlOpenError::NotFound {
            lib: "/nowhere/libnvidia-ml.so.1".into(),
        };
        let n = NoNvml::gather(&e, Some(Path::new("/nowhere/libnvidia-ml.so.1")));
        assert_eq!(n.tried, "/nowhere/libnvidia-ml.so.1");
        assert_eq!(n.found_elsewhere, None);
        let c = check(&n);
        assert!(
            c.detail.starts_with(
                "NVML library not found: tried /nowhere/libnvidia-ml.so.1 (--nvml-lib / GPUPILOT_NVML_LIB"
            ),
            "{}",
            c.detail
        );
    }
}
