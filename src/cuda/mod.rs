//! Real load on the GPU through CUDA: is CUDA there ([`availability`]), a timed GEMM
//! ([`gemm`]), device-to-device copies ([`memory`]), sustained load on a thread of its own
//! ([`Load`], for burn-in and power sweeps), and the checks `doctor` makes ([`check_device`]).
//!
//! The CUDA calls are in the `gpuload` crate (cudarc, loaded at run time; the unsafe edge).
//! Every entry point here first checks that the driver library loads with the symbols used,
//! so a node without CUDA gets [`CudaError::Missing`] — one message naming what is missing —
//! and never a panic. GPU numbers are CUDA ordinals: on a node of identical GPUs without
//! `CUDA_VISIBLE_DEVICES` they are the NVML indices `status` shows (CUDA orders equal GPUs by
//! PCI bus, as NVML does); each result carries the PCI bus id to match them.
//!
//! It may not print, nor know the command line: `commands::bench` and `commands::doctor` do.
//! The measuring code runs only on a machine with an NVIDIA GPU; [`measure`] holds its
//! arithmetic, tested everywhere.

pub mod measure;
mod run;

use std::sync::OnceLock;

use serde::Serialize;
use thiserror::Error;

pub use run::{CopyResult, DeviceCheck, GemmResult, Load, Step, check_device, gemm, memory};

/// Whether CUDA can be used on this machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Availability {
    /// The driver library is not there, not usable, or does not start; `what` says which.
    Missing { what: String },
    /// `driver_version` as `cuDriverGetVersion` gives it (`major * 1000 + minor * 10`).
    Present { driver_version: i32, devices: usize },
}

/// Whether CUDA is usable: `libcuda.so.1` (the file cudarc would load) opens and has every
/// function used, and `cuInit` succeeds. Never panics; asked once per process.
pub fn availability() -> Availability {
    static ONCE: OnceLock<Availability> = OnceLock::new();
    ONCE.get_or_init(probe).clone()
}

fn probe() -> Availability {
    let missing = |what: String| Availability::Missing { what };
    if let Err(f) = gpuload::driver_library() {
        return missing(f.to_string());
    }
    let driver_version = match gpuload::driver_version() {
        Ok(v) => v,
        Err(f) => return missing(format!("libcuda.so.1 loads but {f}")),
    };
    match gpuload::device_count() {
        Ok(devices) => Availability::Present {
            driver_version,
            devices,
        },
        Err(f) => missing(format!("the CUDA driver does not start ({f})")),
    }
}

/// `13000` → `"13.0"`.
pub fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// A GEMM's number format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// `cublasSgemm` with cuBLAS's default math mode: FP32 on the CUDA cores, no TF32.
    Fp32,
    /// `cublasGemmEx`, BF16 inputs and output, FP32 accumulation: tensor cores (compute
    /// capability 8.0 and later).
    Bf16,
    /// `cublasGemmEx`, FP16 inputs and output, FP32 accumulation: tensor cores (7.0 and later).
    Fp16,
}

impl Precision {
    pub const ALL: [Precision; 3] = [Precision::Fp32, Precision::Bf16, Precision::Fp16];

    pub fn label(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    fn element(self) -> gpuload::Element {
        match self {
            Precision::Fp32 => gpuload::Element::F32,
            Precision::Bf16 => gpuload::Element::Bf16,
            Precision::Fp16 => gpuload::Element::F16,
        }
    }

    /// The oldest compute capability this precision is measured on: the first with tensor
    /// cores for it (FP32 runs everywhere).
    pub fn min_compute_capability(self) -> (i32, i32) {
        match self {
            Precision::Fp32 => (0, 0),
            Precision::Bf16 => (8, 0),
            Precision::Fp16 => (7, 0),
        }
    }
}

/// What a [`Load`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kernel", content = "precision")]
pub enum Kernel {
    Gemm(Precision),
    /// Device-to-device copies: memory-bound load.
    Copy,
}

/// What a unit of [`Work`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Floating-point operations (a GEMM's 2n³).
    Flop,
    /// Bytes moved through memory, read and write both counted.
    Byte,
}

/// Work done so far: `units` of `unit` in `seconds` of wall time (since the load started,
/// set-up excluded). Cumulative, so a caller's rate over an interval is the difference of two.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Work {
    pub units: f64,
    pub unit: Unit,
    pub seconds: f64,
}

impl Work {
    /// Units per second over the whole load (`None` before any time has passed).
    pub fn rate(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.units / self.seconds)
    }
}

/// Why GPU work could not be done. Each message says what failed and what to do.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CudaError {
    #[error(
        "no CUDA: {what}. This needs an NVIDIA GPU and its driver; `bench burn` and `bench power-sweep` run on the simulator with `--source sim`"
    )]
    Missing { what: String },
    #[error("CUDA sees no GPU (is CUDA_VISIBLE_DEVICES empty?)")]
    NoDevice,
    #[error("GPU {gpu} does not exist: CUDA sees {count} (0 to {last})", last = count.saturating_sub(1))]
    NoSuchGpu { gpu: u32, count: usize },
    #[error("GPU {gpu}: a CUDA context does not open: {reason}")]
    Context { gpu: u32, reason: String },
    #[error(
        "no cuBLAS, which the GEMM needs: {what}. Install the CUDA toolkit's libcublas, or add the directory holding PyTorch's (site-packages/nvidia/cublas/lib, with a libcublas.so link to its libcublas.so.12) to LD_LIBRARY_PATH"
    )]
    BlasMissing { what: String },
    #[error(
        "GPU {gpu}: out of memory while {during}: free memory on it (stop what runs there) and retry"
    )]
    OutOfMemory { gpu: u32, during: String },
    #[error("GPU {gpu}: {what}")]
    Unsupported { gpu: u32, what: String },
    #[error("GPU {gpu}: {what}")]
    Failed { gpu: u32, what: String },
}

impl CudaError {
    /// The error for `fault` on `gpu`.
    fn from_fault(gpu: u32, fault: gpuload::Fault) -> CudaError {
        use gpuload::Fault;
        match &fault {
            Fault::Driver {
                during,
                out_of_memory: true,
                ..
            }
            | Fault::Blas {
                during,
                out_of_memory: true,
                ..
            } => CudaError::OutOfMemory {
                gpu,
                during: (*during).to_string(),
            },
            Fault::Unsupported(what) => CudaError::Unsupported {
                gpu,
                what: what.clone(),
            },
            Fault::Library { .. } => CudaError::Missing {
                what: fault.to_string(),
            },
            _ => CudaError::Failed {
                gpu,
                what: fault.to_string(),
            },
        }
    }
}

/// CUDA's device count when CUDA is usable and `gpu` is one of its devices.
pub fn check_gpu(gpu: u32) -> Result<usize, CudaError> {
    match availability() {
        Availability::Missing { what } => Err(CudaError::Missing { what }),
        Availability::Present { devices: 0, .. } => Err(CudaError::NoDevice),
        Availability::Present { devices, .. } if gpu as usize >= devices => {
            Err(CudaError::NoSuchGpu {
                gpu,
                count: devices,
            })
        }
        Availability::Present { devices, .. } => Ok(devices),
    }
}

/// cuBLAS, which [`gemm`] and GEMM loads need: loadable with every function used?
pub fn blas_availability() -> Result<(), CudaError> {
    gpuload::blas_library()
        .map(|_| ())
        .map_err(|f| CudaError::BlasMissing {
            what: f.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_and_what_to_do() {
        let m = CudaError::Missing {
            what: "libcuda.so.1 could not be loaded: libcuda.so.1: cannot open shared object file"
                .into(),
        }
        .to_string();
        assert!(
            m.starts_with("no CUDA: libcuda.so.1 could not be loaded"),
            "{m}"
        );
        assert!(m.contains("--source sim"), "{m}");
        assert_eq!(
            CudaError::NoSuchGpu { gpu: 3, count: 2 }.to_string(),
            "GPU 3 does not exist: CUDA sees 2 (0 to 1)"
        );
        let oom = CudaError::from_fault(
            1,
            gpuload::Fault::Driver {
                during: "allocating GPU memory",
                error: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                out_of_memory: true,
            },
        );
        assert_eq!(
            oom.to_string(),
            "GPU 1: out of memory while allocating GPU memory: free memory on it (stop what runs there) and retry"
        );
    }

    #[test]
    fn without_a_driver_library_everything_says_missing() {
        // No machine that runs the tests has libcuda; one that does has it whole.
        if let Availability::Missing { what } = availability() {
            assert!(what.contains("libcuda.so.1"), "{what}");
            assert!(matches!(check_gpu(0), Err(CudaError::Missing { .. })));
            assert!(matches!(
                Load::start(0, Kernel::Copy),
                Err(CudaError::Missing { .. })
            ));
            let c = check_device(0);
            assert!(!c.passed());
            assert!(
                c.problems()[0].contains("libcuda.so.1"),
                "{:?}",
                c.problems()
            );
        }
    }

    #[test]
    fn versions_and_rates() {
        assert_eq!(version_text(13000), "13.0");
        assert_eq!(version_text(12040), "12.4");
        let w = Work {
            units: 10.0,
            unit: Unit::Byte,
            seconds: 4.0,
        };
        assert_eq!(w.rate(), Some(2.5));
        assert_eq!(Work { seconds: 0.0, ..w }.rate(), None);
        assert_eq!(
            serde_json::to_value(Kernel::Gemm(Precision::Bf16)).unwrap(),
            serde_json::json!({"kernel": "gemm", "precision": "bf16"})
        );
    }
}
