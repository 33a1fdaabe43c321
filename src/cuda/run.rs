//! The measurements on a GPU: set up, warm up, time windows, take the median. GPU-only: on a
//! machine without CUDA each returns [`CudaError::Missing`] before touching cudarc.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::measure::{self, median};
use super::{CudaError, Kernel, Precision, Unit, Work, check_gpu};

/// How long one batch of queued work should take between two waits.
const BATCH_S: f64 = 0.05;

/// Words of input uploaded once and repeated over a buffer on the GPU.
const SEED_WORDS: usize = 1 << 20;

/// A timed GEMM on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GemmResult {
    pub gpu: u32,
    pub name: String,
    pub pci_bus_id: Option<String>,
    pub precision: Precision,
    /// Side of the square matrices (C = A·B, each n×n).
    pub n: usize,
    /// GEMMs in the timed windows (warm-up excluded).
    pub iterations: u64,
    pub seconds: f64,
    /// Median over the timed windows, in 10¹² FLOP/s (2n³ FLOP per GEMM).
    pub tflops: f64,
    pub tflops_windows: Vec<f64>,
    /// The cuBLAS call: `cublasSgemm` or `cublasGemmEx`.
    pub routine: &'static str,
}

/// Timed device-to-device copies on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyResult {
    pub gpu: u32,
    pub name: String,
    pub pci_bus_id: Option<String>,
    /// Size of the source (and of the destination).
    pub buffer_bytes: u64,
    pub copies: u64,
    pub seconds: f64,
    /// Median over the timed windows, in 10⁹ bytes/s, counting each byte read and written:
    /// a copy of B bytes moves 2·B.
    pub gb_per_s: f64,
    pub gb_per_s_windows: Vec<f64>,
    /// Always `read+write` (said in the JSON so no reader has to guess).
    pub counted: &'static str,
    /// The memory's theoretical peak (driver's memory clock × bus width × 2), when reported.
    pub peak_gb_per_s: Option<f64>,
    /// `gb_per_s / peak_gb_per_s`.
    pub share_of_peak: Option<f64>,
}

/// An opened device and its identity.
struct Opened {
    dev: gpuload::Device,
    name: String,
    pci_bus_id: Option<String>,
}

fn open(gpu: u32) -> Result<Opened, CudaError> {
    check_gpu(gpu)?;
    let dev = gpuload::Device::open(gpu as usize).map_err(|f| CudaError::Context {
        gpu,
        reason: f.to_string(),
    })?;
    let name = dev.name().unwrap_or_else(|_| format!("GPU {gpu}"));
    let pci_bus_id = dev.pci_bus_id().ok();
    Ok(Opened {
        dev,
        name,
        pci_bus_id,
    })
}

fn fault(gpu: u32) -> impl Fn(gpuload::Fault) -> CudaError {
    move |f| CudaError::from_fault(gpu, f)
}

/// The GEMM of `precision` on `dev`, sized from its free memory.
fn gemm_setup(gpu: u32, dev: &gpuload::Device, p: Precision) -> Result<gpuload::Gemm, CudaError> {
    if let Err(f) = gpuload::blas_library() {
        return Err(CudaError::BlasMissing {
            what: f.to_string(),
        });
    }
    let cc = dev.compute_capability().map_err(fault(gpu))?;
    let min = p.min_compute_capability();
    if cc < min {
        return Err(CudaError::Unsupported {
            gpu,
            what: format!(
                "{} GEMM needs tensor cores for it (compute capability {}.{} or newer); this GPU is {}.{}",
                p.label(),
                min.0,
                min.1,
                cc.0,
                cc.1
            ),
        });
    }
    let (free, _) = dev.memory().map_err(fault(gpu))?;
    let elem = p.element();
    let n = measure::gemm_side(free as u64, elem.bytes()).ok_or(CudaError::OutOfMemory {
        gpu,
        during: format!("sizing the matrices ({} MiB free)", free >> 20),
    })?;
    dev.gemm(elem, n, &measure::seed_words(p, SEED_WORDS))
        .map_err(fault(gpu))
}

/// Two copy buffers on `dev`, sized from its free memory.
fn copy_setup(gpu: u32, dev: &gpuload::Device) -> Result<gpuload::Copy, CudaError> {
    let (free, _) = dev.memory().map_err(fault(gpu))?;
    let bytes = measure::copy_bytes(free as u64).ok_or(CudaError::OutOfMemory {
        gpu,
        during: format!("sizing the copy buffers ({} MiB free)", free >> 20),
    })?;
    dev.copy_buffers(
        bytes as usize,
        &measure::seed_words(Precision::Fp32, SEED_WORDS),
    )
    .map_err(fault(gpu))
}

/// Operations done and seconds taken: in all, and per timed window.
struct Timed {
    ops: u64,
    seconds: f64,
    windows: Vec<(u64, f64)>,
}

impl Timed {
    /// Each window's rate: its operations × `units` (per operation) per second, over `scale`.
    fn rates(&self, units: f64, scale: f64) -> Vec<f64> {
        self.windows
            .iter()
            .map(|(k, s)| *k as f64 * units / s / scale)
            .collect()
    }
}

/// Run `step(batch)` then wait, for warm-up and then `duration` split into windows; the work
/// per window over its time. `step` queues that many operations.
fn time_windows(
    gpu: u32,
    dev: &gpuload::Device,
    duration: Duration,
    mut step: impl FnMut(usize) -> Result<(), gpuload::Fault>,
) -> Result<Timed, CudaError> {
    let sync = |d: &gpuload::Device| d.synchronize().map_err(fault(gpu));
    // Warm-up: clocks up, cuBLAS's kernels chosen and loaded; also how long one takes.
    let total = duration.as_secs_f64();
    let warm = (total / 10.0).clamp(0.2, 2.0);
    let start = Instant::now();
    let mut done = 0u64;
    while done < 2 || start.elapsed().as_secs_f64() < warm {
        step(1).map_err(fault(gpu))?;
        sync(dev)?;
        done += 1;
    }
    let one = start.elapsed().as_secs_f64() / done as f64;
    let batch = measure::batch_for(one, BATCH_S);
    let (count, each) = measure::windows(total);
    let mut windows = Vec::with_capacity(count);
    let (mut ops, mut seconds) = (0u64, 0.0);
    for _ in 0..count {
        let t = Instant::now();
        let mut n = 0u64;
        while n == 0 || t.elapsed().as_secs_f64() < each {
            step(batch).map_err(fault(gpu))?;
            sync(dev)?;
            n += batch as u64;
        }
        let s = t.elapsed().as_secs_f64();
        windows.push((n, s));
        ops += n;
        seconds += s;
    }
    Ok(Timed {
        ops,
        seconds,
        windows,
    })
}

/// GEMM throughput of GPU `gpu` in `precision` over about `duration` (plus set-up and
/// warm-up): square matrices as large as a quarter of the free memory holds (up to 16384),
/// the median of five timed windows. GPU-only.
pub fn gemm(gpu: u32, precision: Precision, duration: Duration) -> Result<GemmResult, CudaError> {
    let o = open(gpu)?;
    let mut g = gemm_setup(gpu, &o.dev, precision)?;
    let n = g.n();
    let timed = time_windows(gpu, &o.dev, duration, |k| g.run(k))?;
    let tflops_windows = timed.rates(measure::gemm_flops(n), 1e12);
    Ok(GemmResult {
        gpu,
        name: o.name,
        pci_bus_id: o.pci_bus_id,
        precision,
        n,
        iterations: timed.ops,
        seconds: timed.seconds,
        tflops: median(&tflops_windows).unwrap_or(0.0),
        tflops_windows,
        routine: match precision {
            Precision::Fp32 => "cublasSgemm",
            Precision::Bf16 | Precision::Fp16 => "cublasGemmEx",
        },
    })
}

/// Device-to-device copy bandwidth of GPU `gpu` over about `duration`: two buffers of a
/// quarter of the free memory each (up to 4 GiB), the median of five timed windows, against
/// the memory's theoretical peak when the driver reports its clock and bus. GPU-only.
pub fn memory(gpu: u32, duration: Duration) -> Result<CopyResult, CudaError> {
    let o = open(gpu)?;
    let mut c = copy_setup(gpu, &o.dev)?;
    let bytes = c.bytes() as u64;
    let timed = time_windows(gpu, &o.dev, duration, |k| c.run(k))?;
    let gb_per_s_windows = timed.rates(measure::copy_traffic(bytes), 1e9);
    let gb_per_s = median(&gb_per_s_windows).unwrap_or(0.0);
    let peak_gb_per_s = o
        .dev
        .memory_clock_and_bus()
        .map(|(clock, bus)| measure::peak_bytes_per_s(clock, bus) / 1e9);
    Ok(CopyResult {
        gpu,
        name: o.name,
        pci_bus_id: o.pci_bus_id,
        buffer_bytes: bytes,
        copies: timed.ops,
        seconds: timed.seconds,
        gb_per_s,
        gb_per_s_windows,
        counted: "read+write",
        peak_gb_per_s,
        share_of_peak: peak_gb_per_s.map(|p| gb_per_s / p),
    })
}

/// One step of [`check_device`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Step {
    Ok,
    Failed {
        reason: String,
    },
    /// Not tried because an earlier step failed.
    Skipped,
}

/// What `doctor` learns of one GPU through CUDA.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceCheck {
    pub gpu: u32,
    pub name: Option<String>,
    pub pci_bus_id: Option<String>,
    /// `"9.0"`.
    pub compute_capability: Option<String>,
    /// A context opens (the primary context, as PyTorch uses).
    pub context: Step,
    /// The check kernel (PTX, JIT-compiled by the driver) computed every word right.
    pub kernel: Step,
    /// Words copied to the GPU, copied there, and back, unchanged.
    pub memory_round_trip: Step,
}

impl DeviceCheck {
    pub fn passed(&self) -> bool {
        [&self.context, &self.kernel, &self.memory_round_trip]
            .iter()
            .all(|s| **s == Step::Ok)
    }

    /// Each failed step with its reason.
    pub fn problems(&self) -> Vec<String> {
        [
            ("a context does not open", &self.context),
            ("the check kernel", &self.kernel),
            ("the memory round trip", &self.memory_round_trip),
        ]
        .into_iter()
        .filter_map(|(what, s)| match s {
            Step::Failed { reason } => Some(format!("{what}: {reason}")),
            _ => None,
        })
        .collect()
    }
}

/// Words the checks send: distinct, with high and low bits set.
fn check_words() -> Vec<u32> {
    (0..65_536u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ 0xdead_beef)
        .collect()
}

/// Compare what came back with what was expected: `Ok`, or the first difference.
fn compare(got: &[u32], want: impl Iterator<Item = u32>) -> Step {
    let mut n = 0;
    for (i, w) in want.enumerate() {
        match got.get(i) {
            Some(g) if *g == w => n += 1,
            Some(g) => {
                return Step::Failed {
                    reason: format!("word {i} came back {g:#010x}, expected {w:#010x}"),
                };
            }
            None => {
                return Step::Failed {
                    reason: format!("{} words came back, expected more", got.len()),
                };
            }
        }
    }
    if n == got.len() {
        Step::Ok
    } else {
        Step::Failed {
            reason: format!("{} words came back, expected {n}", got.len()),
        }
    }
}

/// Open a context on `gpu`, run the check kernel and a memory round trip, read the compute
/// capability and name: each failure with its reason. Never panics; GPU-only beyond the
/// first step.
pub fn check_device(gpu: u32) -> DeviceCheck {
    let mut c = DeviceCheck {
        gpu,
        name: None,
        pci_bus_id: None,
        compute_capability: None,
        context: Step::Skipped,
        kernel: Step::Skipped,
        memory_round_trip: Step::Skipped,
    };
    let o = match open(gpu) {
        Ok(o) => o,
        Err(e) => {
            c.context = Step::Failed {
                reason: e.to_string(),
            };
            return c;
        }
    };
    c.context = Step::Ok;
    c.name = Some(o.name.clone());
    c.pci_bus_id = o.pci_bus_id.clone();
    c.compute_capability = o
        .dev
        .compute_capability()
        .ok()
        .map(|(a, b)| format!("{a}.{b}"));
    let words = check_words();
    c.memory_round_trip = match o.dev.round_trip(&words) {
        Ok(back) => compare(&back, words.iter().copied()),
        Err(f) => Step::Failed {
            reason: f.to_string(),
        },
    };
    c.kernel = match o.dev.check_kernel(&words) {
        Ok(back) => compare(
            &back,
            words.iter().map(|w| w.wrapping_mul(3).wrapping_add(7)),
        ),
        Err(f) => Step::Failed {
            reason: f.to_string(),
        },
    };
    c
}

/// Sustained load on one GPU, on a thread of its own, until [`Load::stop`]. GPU-only.
pub struct Load {
    gpu: u32,
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    work: Work,
    error: Option<CudaError>,
}

impl Load {
    /// Open GPU `gpu`, set `kernel` up (sized from free memory, as [`gemm`] and [`memory`]
    /// are), and start it on a thread. Returns once the work runs, or with why it cannot.
    pub fn start(gpu: u32, kernel: Kernel) -> Result<Load, CudaError> {
        check_gpu(gpu)?;
        let unit = match kernel {
            Kernel::Gemm(_) => Unit::Flop,
            Kernel::Copy => Unit::Byte,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Shared {
            work: Work {
                units: 0.0,
                unit,
                seconds: 0.0,
            },
            error: None,
        }));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let (stop, shared) = (stop.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("gpu{gpu}-load"))
                .spawn(move || load_thread(gpu, kernel, &stop, &shared, &ready_tx))
                .map_err(|e| CudaError::Failed {
                    gpu,
                    what: format!("starting the load thread: {e}"),
                })?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Load {
                gpu,
                stop,
                shared,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(CudaError::Failed {
                    gpu,
                    what: "the load thread ended during set-up".into(),
                })
            }
        }
    }

    /// Work done so far (cumulative), updated after each batch (about every 50 ms).
    pub fn work(&self) -> Work {
        match self.shared.lock() {
            Ok(s) => s.work,
            Err(poisoned) => poisoned.into_inner().work,
        }
    }

    /// Stop, wait for the GPU to finish what was queued, and say what was done — or why the
    /// load ended early.
    pub fn stop(mut self) -> Result<Work, CudaError> {
        self.stop.store(true, Ordering::Relaxed);
        let joined = self.thread.take().map(JoinHandle::join);
        if let Some(Err(_)) = joined {
            return Err(CudaError::Failed {
                gpu: self.gpu,
                what: "the load thread stopped unexpectedly".into(),
            });
        }
        let s = match self.shared.lock() {
            Ok(s) => (s.work, s.error.clone()),
            Err(poisoned) => {
                let s = poisoned.into_inner();
                (s.work, s.error.clone())
            }
        };
        match s {
            (_, Some(e)) => Err(e),
            (work, None) => Ok(work),
        }
    }
}

impl Drop for Load {
    /// A dropped load stops too: no GPU is left busy by a forgotten handle.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a [`Load`]'s thread runs: set up, say so, then batches until told to stop.
fn load_thread(
    gpu: u32,
    kernel: Kernel,
    stop: &AtomicBool,
    shared: &Mutex<Shared>,
    ready: &mpsc::Sender<Result<(), CudaError>>,
) {
    enum Work_ {
        Gemm(gpuload::Gemm),
        Copy(gpuload::Copy),
    }
    let set_up = (|| {
        let o = open(gpu)?;
        let w = match kernel {
            Kernel::Gemm(p) => Work_::Gemm(gemm_setup(gpu, &o.dev, p)?),
            Kernel::Copy => Work_::Copy(copy_setup(gpu, &o.dev)?),
        };
        Ok::<_, CudaError>((o, w))
    })();
    let (o, mut w) = match set_up {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let per_op = match &w {
        Work_::Gemm(g) => measure::gemm_flops(g.n()),
        Work_::Copy(c) => measure::copy_traffic(c.bytes() as u64),
    };
    let mut step = |k: usize| match &mut w {
        Work_::Gemm(g) => g.run(k),
        Work_::Copy(c) => c.run(k),
    };
    let run_batch = |step: &mut dyn FnMut(usize) -> Result<(), gpuload::Fault>, k: usize| {
        step(k).and_then(|()| o.dev.synchronize())
    };
    // One operation first, to size the batches (and so the first `work()` comes soon).
    let t = Instant::now();
    if let Err(f) = run_batch(&mut step, 1) {
        let _ = ready.send(Err(CudaError::from_fault(gpu, f)));
        return;
    }
    let batch = measure::batch_for(t.elapsed().as_secs_f64(), BATCH_S);
    let started = t;
    let record = |ops: f64, err: Option<CudaError>| {
        let mut s = match shared.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        s.work.units += ops * per_op;
        s.work.seconds = started.elapsed().as_secs_f64();
        if err.is_some() {
            s.error = err;
        }
    };
    record(1.0, None);
    let _ = ready.send(Ok(()));
    while !stop.load(Ordering::Relaxed) {
        match run_batch(&mut step, batch) {
            Ok(()) => record(batch as f64, None),
            Err(f) => {
                record(0.0, Some(CudaError::from_fault(gpu, f)));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_finds_the_first_wrong_word() {
        assert_eq!(compare(&[1, 2, 3], [1, 2, 3].into_iter()), Step::Ok);
        assert_eq!(
            compare(&[1, 5, 3], [1, 2, 3].into_iter()),
            Step::Failed {
                reason: "word 1 came back 0x00000005, expected 0x00000002".into()
            }
        );
        assert!(matches!(
            compare(&[1], [1, 2].into_iter()),
            Step::Failed { .. }
        ));
        assert!(matches!(
            compare(&[1, 2], [1].into_iter()),
            Step::Failed { .. }
        ));
        let w = check_words();
        assert_eq!(w.len(), 65_536);
        let distinct: std::collections::HashSet<_> = w.iter().collect();
        assert_eq!(distinct.len(), w.len());
    }

    #[test]
    fn a_device_check_lists_each_failed_step() {
        let c = DeviceCheck {
            gpu: 2,
            name: Some("NVIDIA H200".into()),
            pci_bus_id: None,
            compute_capability: Some("9.0".into()),
            context: Step::Ok,
            kernel: Step::Failed {
                reason: "JIT-compiling the check kernel: CUDA_ERROR_INVALID_PTX".into(),
            },
            memory_round_trip: Step::Ok,
        };
        assert!(!c.passed());
        assert_eq!(
            c.problems(),
            ["the check kernel: JIT-compiling the check kernel: CUDA_ERROR_INVALID_PTX"]
        );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["kernel"]["result"], "failed");
        assert_eq!(v["context"]["result"], "ok");
        assert_eq!(v["compute_capability"], "9.0");
    }
}
