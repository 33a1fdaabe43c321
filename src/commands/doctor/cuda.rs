//! `doctor`'s CUDA lines: is the driver's CUDA library there and which CUDA it speaks
//! (`cuDriverGetVersion`), and on every GPU whether a context opens, the check kernel computes
//! right and a memory round trip comes back unchanged (see [`crate::cuda::check_device`]).
//!
//! A missing `libcuda.so.1` is a problem on a node whose NVML shows GPUs (the driver is there
//! but nothing can compute on it: PyTorch would find no GPU) and a plain fact on a node without
//! GPUs. `--no-cuda` skips the lines: each GPU's context takes a few hundred MiB of its memory
//! while doctor runs, which a full training job may not spare.

use serde::{Deserialize, Serialize};

use super::checks::{Check, Status};
use crate::cuda::{self, Availability, DeviceCheck};

/// What doctor learned through CUDA.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CudaFacts {
    /// `--no-cuda` (or a report from before these checks).
    #[default]
    NotChecked,
    /// The driver library is missing, broken, or does not start.
    Missing { what: String },
    /// `driver_version` as `cuDriverGetVersion` gives it; one check per CUDA device.
    Present {
        driver_version: i32,
        devices: Vec<DeviceCheck>,
    },
}

/// Ask CUDA (GPU work on every device CUDA sees).
pub fn gather() -> CudaFacts {
    match cuda::availability() {
        Availability::Missing { what } => CudaFacts::Missing { what },
        Availability::Present {
            driver_version,
            devices,
        } => CudaFacts::Present {
            driver_version,
            devices: (0..devices as u32).map(cuda::check_device).collect(),
        },
    }
}

fn line(name: &str, status: Status, detail: String) -> Check {
    Check {
        name: name.into(),
        status,
        detail,
    }
}

/// The `cuda` line and, when CUDA runs, the `cuda_gpus` line. `nvml_gpus`: how many GPUs NVML
/// reports (absent: NVML could not be loaded); `nvml_cuda`: the CUDA version NVML says the
/// driver runs, which libcuda's must match.
pub fn checks(
    f: &CudaFacts,
    nvml_gpus: Option<usize>,
    nvml_cuda: Option<(u32, u32)>,
) -> Vec<Check> {
    let Some(nvml_gpus) = nvml_gpus else {
        return vec![without_nvml(f)];
    };
    match f {
        CudaFacts::NotChecked => vec![line("cuda", Status::Info, "not checked (--no-cuda)".into())],
        CudaFacts::Missing { what } if nvml_gpus > 0 => vec![line(
            "cuda",
            Status::Fail,
            format!(
                "{what}: NVML sees {nvml_gpus} GPU{} but no CUDA program (PyTorch included) can use them; install the CUDA library of this driver (libcuda.so.1, in the driver package: libnvidia-compute-<version> on Debian and Ubuntu) and check that it is on the loader's path (`ldconfig -p | grep libcuda`)",
                if nvml_gpus == 1 { "" } else { "s" }
            ),
        )],
        CudaFacts::Missing { what } => vec![line(
            "cuda",
            Status::Info,
            format!("{what} (no GPU here needs it)"),
        )],
        CudaFacts::Present {
            driver_version,
            devices,
        } => {
            let mut out = Vec::new();
            let v = cuda::version_text(*driver_version);
            let speaks = super::checks::cuda_from_nvml(*driver_version);
            out.push(if let Some((m, n)) = nvml_cuda.filter(|c| *c != speaks) {
                line(
                    "cuda",
                    Status::Warn,
                    format!(
                        "libcuda speaks CUDA {v} (cuDriverGetVersion) but NVML says the driver runs CUDA {m}.{n}: the CUDA library and NVML come from two driver versions; reinstall the driver so that both match (`ldconfig -p | grep -E 'libcuda|libnvidia-ml'` shows which files load)"
                    ),
                )
            } else if devices.len() == nvml_gpus {
                line(
                    "cuda",
                    Status::Ok,
                    format!(
                        "libcuda speaks CUDA {v} (cuDriverGetVersion) and sees {} device{}",
                        devices.len(),
                        if devices.len() == 1 { "" } else { "s" }
                    ),
                )
            } else {
                line(
                    "cuda",
                    Status::Warn,
                    format!(
                        "libcuda speaks CUDA {v} but sees {} device{} where NVML sees {nvml_gpus}: CUDA_VISIBLE_DEVICES hides some, or a GPU is not usable by CUDA (MIG mode, a fault)",
                        devices.len(),
                        if devices.len() == 1 { "" } else { "s" }
                    ),
                )
            });
            if !devices.is_empty() {
                out.push(gpus_line(devices));
            }
            out
        }
    }
}

/// The `cuda` line on a node whose NVML could not be loaded.
fn without_nvml(f: &CudaFacts) -> Check {
    match f {
        CudaFacts::NotChecked => line("cuda", Status::Info, "not checked (--no-cuda)".into()),
        CudaFacts::Missing { what } => line(
            "cuda",
            Status::Info,
            format!("{what}: it comes with the driver (see the driver line)"),
        ),
        CudaFacts::Present {
            driver_version,
            devices,
        } => line(
            "cuda",
            Status::Warn,
            format!(
                "libcuda speaks CUDA {} and sees {} device{}, but NVML does not load: half a driver install; reinstall the driver package",
                cuda::version_text(*driver_version),
                devices.len(),
                if devices.len() == 1 { "" } else { "s" }
            ),
        ),
    }
}

fn gpus_line(devices: &[DeviceCheck]) -> Check {
    let failed: Vec<String> = devices
        .iter()
        .filter(|d| !d.passed())
        .map(|d| format!("GPU {}: {}", d.gpu, d.problems().join("; ")))
        .collect();
    if failed.is_empty() {
        let each: Vec<String> = devices
            .iter()
            .map(|d| {
                format!(
                    "GPU {} compute {}",
                    d.gpu,
                    d.compute_capability.as_deref().unwrap_or("N/A")
                )
            })
            .collect();
        line(
            "cuda_gpus",
            Status::Ok,
            format!(
                "a context, a kernel and a memory round trip run right on every GPU ({})",
                each.join(", ")
            ),
        )
    } else {
        line(
            "cuda_gpus",
            Status::Fail,
            format!(
                "{}: drain {} and check `dmesg` for Xid errors; a reset (`nvidia-smi -r -i N`) or a reboot may bring it back",
                failed.join("; "),
                if failed.len() == 1 {
                    "that GPU"
                } else {
                    "those GPUs"
                }
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::Step;

    fn device(gpu: u32) -> DeviceCheck {
        DeviceCheck {
            gpu,
            name: Some("NVIDIA H200".into()),
            pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x1b + gpu)),
            compute_capability: Some("9.0".into()),
            context: Step::Ok,
            kernel: Step::Ok,
            memory_round_trip: Step::Ok,
        }
    }

    fn present(devices: Vec<DeviceCheck>) -> CudaFacts {
        CudaFacts::Present {
            driver_version: 13000,
            devices,
        }
    }

    #[test]
    fn a_missing_library_is_a_problem_only_where_there_are_gpus() {
        let f = CudaFacts::Missing {
            what: "libcuda.so.1 could not be loaded: libcuda.so.1: cannot open shared object file"
                .into(),
        };
        let with = checks(&f, Some(2), None);
        assert_eq!(with.len(), 1);
        assert_eq!(with[0].status, Status::Fail);
        assert!(
            with[0]
                .detail
                .starts_with("libcuda.so.1 could not be loaded: libcuda.so.1: cannot open"),
            "{}",
            with[0].detail
        );
        assert!(with[0].detail.contains("NVML sees 2 GPUs"));
        let without = checks(&f, Some(0), None);
        assert_eq!(without[0].status, Status::Info);
        assert_eq!(
            checks(&CudaFacts::NotChecked, Some(8), None)[0].status,
            Status::Info
        );
        // No NVML: the driver line says what is wrong; this one is a note.
        let c = checks(&f, None, None);
        assert_eq!(c[0].status, Status::Info);
        assert!(
            c[0].detail.contains("comes with the driver"),
            "{}",
            c[0].detail
        );
    }

    #[test]
    fn every_gpu_that_fails_is_named_with_its_reason() {
        let all = checks(&present(vec![device(0), device(1)]), Some(2), Some((13, 0)));
        assert_eq!(
            all.iter().map(|c| c.status).collect::<Vec<_>>(),
            [Status::Ok, Status::Ok]
        );
        assert!(all[0].detail.contains("CUDA 13.0"), "{}", all[0].detail);
        assert!(
            all[1]
                .detail
                .contains("GPU 0 compute 9.0, GPU 1 compute 9.0"),
            "{}",
            all[1].detail
        );

        let mut bad = device(1);
        bad.kernel = Step::Failed {
            reason: "word 3 came back 0x00000000, expected 0x0000000a".into(),
        };
        let mut dead = device(2);
        dead.context = Step::Failed {
            reason: "opening a context: CUDA_ERROR_ECC_UNCORRECTABLE".into(),
        };
        dead.kernel = Step::Skipped;
        dead.memory_round_trip = Step::Skipped;
        let c = checks(&present(vec![device(0), bad, dead]), Some(3), None);
        assert_eq!(c[1].name, "cuda_gpus");
        assert_eq!(c[1].status, Status::Fail);
        assert!(
            c[1].detail.starts_with(
                "GPU 1: the check kernel: word 3 came back 0x00000000, expected 0x0000000a; \
                 GPU 2: a context does not open: opening a context: CUDA_ERROR_ECC_UNCORRECTABLE: drain those GPUs"
            ),
            "{}",
            c[1].detail
        );
    }

    #[test]
    fn fewer_cuda_devices_than_nvml_gpus_is_a_warning() {
        let c = checks(&present(vec![device(0)]), Some(2), None);
        assert_eq!(c[0].status, Status::Warn);
        assert!(c[0].detail.contains("sees 1 device where NVML sees 2"));
        let none = checks(&present(vec![]), Some(2), None);
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].status, Status::Warn);
    }

    #[test]
    fn libcuda_and_nvml_of_two_driver_versions_are_a_warning() {
        let c = checks(&present(vec![device(0)]), Some(1), Some((12, 4)));
        assert_eq!(c[0].status, Status::Warn);
        assert!(
            c[0].detail.contains("CUDA 13.0") && c[0].detail.contains("runs CUDA 12.4"),
            "{}",
            c[0].detail
        );
        let c = checks(&present(vec![device(0)]), None, None);
        assert_eq!(c[0].status, Status::Warn);
        assert!(
            c[0].detail.contains("NVML does not load"),
            "{}",
            c[0].detail
        );
    }

    #[test]
    fn facts_read_back_from_json() {
        let f = present(vec![device(0)]);
        let text = serde_json::to_string(&f).unwrap();
        assert!(
            text.starts_with("{\"state\":\"present\",\"driver_version\":13000"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<CudaFacts>(&text).unwrap(), f);
    }
}
