//! `gpupilot bench gemm` and `bench memory`: each GPU measured on its own, one after another
//! (so no two loads share a node's power or cooling), a table or JSON at the end. The JSON
//! schema is in docs/cuda.md; [`GemmReport`] and [`MemoryReport`] are it.
//!
//! Exit status: 0 every measurement ran, 1 some failed (each said with its reason), 2 nothing
//! could run (no CUDA, no cuBLAS for a GEMM, a GPU that does not exist): one line on stderr.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use crate::cli::{BenchGemmArgs, BenchMemoryArgs, BenchPrecision, GlobalArgs, SourceKind};
use crate::cuda::{self, Availability, CopyResult, GemmResult, Precision};

/// A measurement that did not run, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    pub gpu: u32,
    /// The GEMM's precision; absent for `bench memory`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    pub error: String,
}

/// `bench gemm --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GemmReport {
    /// `"gemm"`.
    pub bench: &'static str,
    /// `cuDriverGetVersion`, as `13.0`.
    pub cuda_driver: String,
    /// Timed seconds asked for per measurement.
    pub duration_s: f64,
    pub results: Vec<GemmResult>,
    pub failures: Vec<Failure>,
}

/// `bench memory --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryReport {
    /// `"memory"`.
    pub bench: &'static str,
    pub cuda_driver: String,
    pub duration_s: f64,
    pub results: Vec<CopyResult>,
    pub failures: Vec<Failure>,
}

/// Why a bench cannot run at all: its one line (exit status 2).
fn unusable(command: &str, why: &str) -> anyhow::Result<ExitCode> {
    let _ = writeln!(std::io::stderr().lock(), "gpupilot bench {command}: {why}");
    Ok(ExitCode::from(2))
}

/// CUDA's driver version and the GPUs to measure (`asked`, or all), or the line that says why
/// there are none (`--source sim` among the reasons: the simulator has no GEMM to time).
fn gpus(g: &GlobalArgs, asked: &[u32]) -> Result<(String, Vec<u32>), String> {
    if g.source == SourceKind::Sim {
        return Err("times a real GPU through CUDA, and the simulator has none to time (`--source sim` runs `bench burn` and `bench power-sweep`)".into());
    }
    match cuda::availability() {
        Availability::Missing { what } => Err(cuda::CudaError::Missing { what }.to_string()),
        Availability::Present { devices: 0, .. } => Err(cuda::CudaError::NoDevice.to_string()),
        Availability::Present {
            driver_version,
            devices,
        } => {
            if let Some(bad) = asked.iter().find(|g| **g as usize >= devices) {
                return Err(format!(
                    "--gpu {bad}: {}",
                    cuda::CudaError::NoSuchGpu {
                        gpu: *bad,
                        count: devices
                    }
                ));
            }
            let mut list: Vec<u32> = if asked.is_empty() {
                (0..devices as u32).collect()
            } else {
                asked.to_vec()
            };
            list.dedup();
            Ok((cuda::version_text(driver_version), list))
        }
    }
}

fn precisions(p: BenchPrecision) -> Vec<Precision> {
    match p {
        BenchPrecision::Fp32 => vec![Precision::Fp32],
        BenchPrecision::Bf16 => vec![Precision::Bf16],
        BenchPrecision::Fp16 => vec![Precision::Fp16],
        BenchPrecision::All => Precision::ALL.to_vec(),
    }
}

fn progress(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `gpupilot bench gemm`.
pub fn gemm(g: &GlobalArgs, args: &BenchGemmArgs) -> anyhow::Result<ExitCode> {
    let (cuda_driver, list) = match gpus(g, &args.gpu) {
        Ok(x) => x,
        Err(why) => return unusable("gemm", &why),
    };
    if let Err(e) = cuda::blas_availability() {
        return unusable("gemm", &e.to_string());
    }
    let mut report = GemmReport {
        bench: "gemm",
        cuda_driver,
        duration_s: args.duration.as_secs_f64(),
        results: Vec::new(),
        failures: Vec::new(),
    };
    for &gpu in &list {
        for p in precisions(args.precision) {
            progress(&format!(
                "bench gemm: GPU {gpu} {} for {}",
                p.label(),
                secs(args.duration)
            ));
            match cuda::gemm(gpu, p, args.duration) {
                Ok(r) => report.results.push(r),
                Err(e) => report.failures.push(Failure {
                    gpu,
                    precision: Some(p),
                    error: e.to_string(),
                }),
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_gemm(&report));
    }
    Ok(exit(&report.failures))
}

/// `gpupilot bench memory`.
pub fn memory(g: &GlobalArgs, args: &BenchMemoryArgs) -> anyhow::Result<ExitCode> {
    let (cuda_driver, list) = match gpus(g, &args.gpu) {
        Ok(x) => x,
        Err(why) => return unusable("memory", &why),
    };
    let mut report = MemoryReport {
        bench: "memory",
        cuda_driver,
        duration_s: args.duration.as_secs_f64(),
        results: Vec::new(),
        failures: Vec::new(),
    };
    for &gpu in &list {
        progress(&format!(
            "bench memory: GPU {gpu} for {}",
            secs(args.duration)
        ));
        match cuda::memory(gpu, args.duration) {
            Ok(r) => report.results.push(r),
            Err(e) => report.failures.push(Failure {
                gpu,
                precision: None,
                error: e.to_string(),
            }),
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_memory(&report));
    }
    Ok(exit(&report.failures))
}

fn exit(failures: &[Failure]) -> ExitCode {
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn secs(d: Duration) -> String {
    format!("{:.0} s", d.as_secs_f64())
}

/// Min and max of a measurement's windows, for the table.
fn spread(windows: &[f64]) -> (f64, f64) {
    windows
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        })
}

fn failures_text(failures: &[Failure]) -> String {
    failures
        .iter()
        .map(|f| match f.precision {
            Some(p) => format!("GPU {} {}: {}\n", f.gpu, p.label(), f.error),
            None => format!("GPU {}: {}\n", f.gpu, f.error),
        })
        .collect()
}

/// The table of `bench gemm`.
pub fn render_gemm(r: &GemmReport) -> String {
    let mut out = format!(
        "bench gemm: CUDA {}, {:.0} s per measurement, TFLOP/s the median of its windows (2n³ FLOP per GEMM)\n",
        r.cuda_driver, r.duration_s
    );
    if !r.results.is_empty() {
        out.push_str(&format!(
            "{:<4} {:<22} {:<13} {:<5} {:>6} {:>9} {:>9} {:>9} {:>7}\n",
            "GPU", "NAME", "BUS", "PREC", "N", "TFLOP/S", "MIN", "MAX", "GEMMS"
        ));
    }
    for g in &r.results {
        let (lo, hi) = spread(&g.tflops_windows);
        out.push_str(&format!(
            "{:<4} {:<22} {:<13} {:<5} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>7}\n",
            g.gpu,
            clip(&g.name, 22),
            g.pci_bus_id.as_deref().unwrap_or("N/A"),
            g.precision.label(),
            g.n,
            g.tflops,
            lo,
            hi,
            g.iterations
        ));
    }
    out.push_str(&failures_text(&r.failures));
    out
}

/// The table of `bench memory`.
pub fn render_memory(r: &MemoryReport) -> String {
    let mut out = format!(
        "bench memory: CUDA {}, {:.0} s per measurement, device-to-device copies, GB/s counting bytes read and written (the median of its windows)\n",
        r.cuda_driver, r.duration_s
    );
    if !r.results.is_empty() {
        out.push_str(&format!(
            "{:<4} {:<22} {:<13} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n",
            "GPU", "NAME", "BUS", "BUFFER", "GB/S", "MIN", "MAX", "PEAK", "OF PEAK"
        ));
    }
    for c in &r.results {
        let (lo, hi) = spread(&c.gb_per_s_windows);
        out.push_str(&format!(
            "{:<4} {:<22} {:<13} {:>9} {:>9.0} {:>9.0} {:>9.0} {:>7} {:>7}\n",
            c.gpu,
            clip(&c.name, 22),
            c.pci_bus_id.as_deref().unwrap_or("N/A"),
            format!("{} MiB", c.buffer_bytes >> 20),
            c.gb_per_s,
            lo,
            hi,
            c.peak_gb_per_s
                .map_or("N/A".to_string(), |p| format!("{p:.0}")),
            c.share_of_peak
                .map_or("N/A".to_string(), |s| format!("{:.0} %", s * 100.0)),
        ));
    }
    out.push_str(&failures_text(&r.failures));
    out
}

fn clip(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm_report() -> GemmReport {
        GemmReport {
            bench: "gemm",
            cuda_driver: "13.0".into(),
            duration_s: 10.0,
            results: vec![GemmResult {
                gpu: 0,
                name: "NVIDIA H200".into(),
                pci_bus_id: Some("0000:1b:00.0".into()),
                precision: Precision::Bf16,
                n: 16384,
                iterations: 900,
                seconds: 10.02,
                tflops: 702.4,
                tflops_windows: vec![700.1, 702.4, 703.0, 699.5, 702.9],
                routine: "cublasGemmEx",
            }],
            failures: vec![Failure {
                gpu: 1,
                precision: Some(Precision::Fp16),
                error: "GPU 1: out of memory while allocating GPU memory".into(),
            }],
        }
    }

    #[test]
    fn the_gemm_table_has_a_row_per_result_and_a_line_per_failure() {
        let text = render_gemm(&gemm_report());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("bench gemm: CUDA 13.0, 10 s per measurement"));
        assert!(lines[1].starts_with("GPU  NAME"), "{text}");
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "0",
                "NVIDIA",
                "H200",
                "0000:1b:00.0",
                "bf16",
                "16384",
                "702.4",
                "699.5",
                "703.0",
                "900"
            ]
        );
        assert_eq!(
            lines[3],
            "GPU 1 fp16: GPU 1: out of memory while allocating GPU memory"
        );
    }

    #[test]
    fn the_json_schema() {
        let v = serde_json::to_value(gemm_report()).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&v),
            ["bench", "cuda_driver", "duration_s", "failures", "results"]
        );
        assert_eq!(
            keys(&v["results"][0]),
            [
                "gpu",
                "iterations",
                "n",
                "name",
                "pci_bus_id",
                "precision",
                "routine",
                "seconds",
                "tflops",
                "tflops_windows"
            ]
        );
        assert_eq!(v["results"][0]["precision"], "bf16");
        assert_eq!(v["failures"][0]["precision"], "fp16");
        let m = MemoryReport {
            bench: "memory",
            cuda_driver: "13.0".into(),
            duration_s: 10.0,
            results: vec![CopyResult {
                gpu: 0,
                name: "NVIDIA H200".into(),
                pci_bus_id: None,
                buffer_bytes: 4 << 30,
                copies: 2000,
                seconds: 10.0,
                gb_per_s: 4000.0,
                gb_per_s_windows: vec![4000.0],
                counted: "read+write",
                peak_gb_per_s: None,
                share_of_peak: None,
            }],
            failures: vec![Failure {
                gpu: 1,
                precision: None,
                error: "x".into(),
            }],
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(
            keys(&v["results"][0]),
            [
                "buffer_bytes",
                "copies",
                "counted",
                "gb_per_s",
                "gb_per_s_windows",
                "gpu",
                "name",
                "pci_bus_id",
                "peak_gb_per_s",
                "seconds",
                "share_of_peak"
            ]
        );
        assert_eq!(v["results"][0]["peak_gb_per_s"], serde_json::Value::Null);
        assert_eq!(keys(&v["failures"][0]), ["error", "gpu"]);
        let text = render_memory(&m);
        assert!(text.contains("4096 MiB"), "{text}");
        assert!(text.contains("N/A"), "{text}");
    }
}
