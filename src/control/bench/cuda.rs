//! The benchmarks' load on real GPUs: `crate::cuda`'s [`Load`](crate::cuda::Load), counted on
//! the device. A GEMM runs in BF16 where the GPU has tensor cores for it, else FP16, else FP32
//! (the fastest the GPU has, so the load is as heavy as it can be); the memory load is the
//! device-to-device copy. GPU numbers are CUDA ordinals, which are the NVML indices on a node
//! of identical GPUs without `CUDA_VISIBLE_DEVICES` (see `crate::cuda`).

use super::{Label, Load, Loads, Work, Workload};
use crate::cuda::{self, CudaError, Kernel, Precision};
use crate::telemetry::GpuSample;

/// Loads through CUDA.
#[derive(Debug, Default)]
pub struct CudaLoads;

impl Loads for CudaLoads {
    fn label(&self) -> Label {
        Label::Measured
    }

    fn start(
        &mut self,
        gpu: u32,
        workload: Workload,
        _sample: &GpuSample,
    ) -> anyhow::Result<Box<dyn Load>> {
        let load = match workload {
            Workload::Memory => cuda::Load::start(gpu, Kernel::Copy)?,
            Workload::Gemm => gemm(gpu)?,
        };
        Ok(Box::new(CudaLoad(load)))
    }
}

/// The fastest GEMM the GPU runs: BF16, FP16, then FP32, moving on only when one is not
/// supported.
fn gemm(gpu: u32) -> Result<cuda::Load, CudaError> {
    let mut last = None;
    for p in [Precision::Bf16, Precision::Fp16, Precision::Fp32] {
        match cuda::Load::start(gpu, Kernel::Gemm(p)) {
            Err(e @ CudaError::Unsupported { .. }) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or(CudaError::NoDevice))
}

struct CudaLoad(cuda::Load);

fn work(w: cuda::Work) -> Work {
    Work {
        units: w.units,
        seconds: w.seconds,
    }
}

impl Load for CudaLoad {
    fn observe(&mut self, _t_s: f64, _sample: &GpuSample) {}

    fn work(&self) -> Work {
        work(self.0.work())
    }

    fn stop(self: Box<Self>) -> anyhow::Result<Work> {
        Ok(work(self.0.stop()?))
    }
}
