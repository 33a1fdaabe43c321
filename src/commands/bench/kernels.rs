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

/// `bench gemm --json` and `bench memory --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report<R> {
    /// `"gemm"` or `"memory"`.
    pub bench: &'static str,
    /// `cuDriverGetVersion`, as `13.0`.
    pub cuda_driver: String,
    /// Timed seconds asked for per measurement.
    pub duration_s: f64,
    pub results: Vec<R>,
    pub failures: Vec<Failure>,
}

pub type GemmReport = Report<GemmResult>;
pub type MemoryReport = Report<CopyResult>;

impl<R: Serialize> Report<R> {
    /// Measure each (GPU, precision) of `jobs` in turn with `measure`, saying which on stderr.
    fn run(
        bench: &'static str,
        cuda_driver: String,
        duration: Duration,
        jobs: Vec<(u32, Option<Precision>)>,
        mut measure: impl FnMut(u32, Option<Precision>) -> Result<R, cuda::CudaError>,
    ) -> Report<R> {
        let mut report = Report {
            bench,
            cuda_driver,
            duration_s: duration.as_secs_f64(),
            results: Vec::new(),
            failures: Vec::new(),
        };
        for (gpu, precision) in jobs {
            let what = precision.map_or(String::new(), |p| format!(" {}", p.label()));
            progress(&format!(
                "bench {bench}: GPU {gpu}{what} for {:.0} s",
                duration.as_secs_f64()
            ));
            match measure(gpu, precision) {
                Ok(r) => report.results.push(r),
                Err(e) => report.failures.push(Failure {
                    gpu,
                    precision,
                    error: e.to_string(),
                }),
            }
        }
        report
    }

    /// Print it (JSON, or `text`'s table); 0 when every measurement ran, else 1.
    fn print(&self, json: bool, text: fn(&Self) -> String) -> anyhow::Result<ExitCode> {
        if json {
            println!("{}", serde_json::to_string_pretty(self)?);
        } else {
            print!("{}", text(self));
        }
        Ok(if self.failures.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
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
            let mut list: Vec<u32> = Vec::new();
            if asked.is_empty() {
                list.extend(0..devices as u32);
            }
            // Each GPU once, in the order asked.
            for g in asked {
                if !list.contains(g) {
                    list.push(*g);
                }
            }
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
    let jobs = list
        .iter()
        .flat_map(|&gpu| {
            precisions(args.precision)
                .into_iter()
                .map(move |p| (gpu, Some(p)))
        })
        .collect();
    Report::run("gemm", cuda_driver, args.duration, jobs, |gpu, p| {
        cuda::gemm(gpu, p.unwrap_or(Precision::Fp32), args.duration)
    })
    .print(args.json, render_gemm)
}

/// `gpupilot bench memory`.
pub fn memory(g: &GlobalArgs, args: &BenchMemoryArgs) -> anyhow::Result<ExitCode> {
    let (cuda_driver, list) = match gpus(g, &args.gpu) {
        Ok(x) => x,
        Err(why) => return unusable("memory", &why),
    };
    let jobs = list.iter().map(|&gpu| (gpu, None)).collect();
    Report::run("memory", cuda_driver, args.duration, jobs, |gpu, _| {
        cuda::memory(gpu, args.duration)
    })
    .print(args.json, render_memory)
}

/// Min and max of a measurement's windows, for the table.
fn spread(windows: &[f64]) -> (f64, f64) {
    windows
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        })
}

/// A title, a header and rows (the header only when there are rows), then the failures.
fn table(title: String, header: String, rows: Vec<String>, failures: &[Failure]) -> String {
    let mut out = title;
    if !rows.is_empty() {
        out.push_str(&header);
    }
    for r in rows {
        out.push_str(&r);
    }
    for f in failures {
        out.push_str(&match f.precision {
            Some(p) => format!("GPU {} {}: {}\n", f.gpu, p.label(), f.error),
            None => format!("GPU {}: {}\n", f.gpu, f.error),
        });
    }
    out
}

/// The table of `bench gemm`.
pub fn render_gemm(r: &GemmReport) -> String {
    let rows = r
        .results
        .iter()
        .map(|g| {
            let (lo, hi) = spread(&g.tflops_windows);
            format!(
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
            )
        })
        .collect();
    table(
        format!(
            "bench gemm: CUDA {}, {:.0} s per measurement, TFLOP/s the median of its windows (2n³ FLOP per GEMM)\n",
            r.cuda_driver, r.duration_s
        ),
        format!(
            "{:<4} {:<22} {:<13} {:<5} {:>6} {:>9} {:>9} {:>9} {:>7}\n",
            "GPU", "NAME", "BUS", "PREC", "N", "TFLOP/S", "MIN", "MAX", "GEMMS"
        ),
        rows,
        &r.failures,
    )
}

/// The table of `bench memory`.
pub fn render_memory(r: &MemoryReport) -> String {
    let rows = r
        .results
        .iter()
        .map(|c| {
            let (lo, hi) = spread(&c.gb_per_s_windows);
            format!(
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
            )
        })
        .collect();
    table(
        format!(
            "bench memory: CUDA {}, {:.0} s per measurement, device-to-device copies, GB/s counting bytes read and written (the median of its windows)\n",
            r.cuda_driver, r.duration_s
        ),
        format!(
            "{:<4} {:<22} {:<13} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n",
            "GPU", "NAME", "BUS", "BUFFER", "GB/S", "MIN", "MAX", "PEAK", "OF PEAK"
        ),
        rows,
        &r.failures,
    )
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
