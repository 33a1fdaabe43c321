//! Real work on NVIDIA GPUs through cudarc: the unsafe edge of gpupilot's `bench` and `doctor`.
//!
//! What it offers, all safe to call: whether the CUDA driver library (and cuBLAS) can be
//! loaded, the driver's version and device count, and per device a [`Device`] that allocates,
//! copies, runs a check kernel (PTX text, JIT-compiled by the driver: no NVRTC, no nvcc) and
//! GEMMs through cuBLAS. Measuring (how big, how long, the median of windows) is the caller's.
//!
//! cudarc loads its libraries on first use and *panics* when one is missing or lacks a symbol.
//! So: [`driver_library`] / [`blas_library`] open the same file cudarc would (its own list of
//! names, in its order) and look up the symbols used here before anything calls into cudarc;
//! the callers of this crate call them first. Every entry point below also runs under
//! `catch_unwind` as a last line of defence, turning a panic into [`Fault::Panicked`].
//!
//! It may not: print, read gpupilot's configuration, or know about its commands.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{CUdevice_attribute, cudaError_enum};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

/// Why something could not be done.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// A library could not be opened, or is not the library it is named for.
    Library {
        /// The name looked for, e.g. `libcuda.so.1`.
        name: String,
        reason: String,
    },
    /// A driver API call failed.
    Driver {
        during: &'static str,
        /// The CUresult's name, e.g. `CUDA_ERROR_NO_DEVICE`.
        error: String,
        out_of_memory: bool,
    },
    /// A cuBLAS call failed.
    Blas {
        during: &'static str,
        error: String,
        out_of_memory: bool,
    },
    /// The device cannot do what was asked (BF16 before compute capability 8.0, say).
    Unsupported(String),
    /// A call panicked inside cudarc (a symbol missing from the library, most likely).
    Panicked(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Library { name, reason } => write!(f, "{name} could not be loaded: {reason}"),
            Fault::Driver { during, error, .. } => write!(f, "{during}: {error}"),
            Fault::Blas { during, error, .. } => write!(f, "cuBLAS, {during}: {error}"),
            Fault::Unsupported(what) => f.write_str(what),
            Fault::Panicked(what) => write!(f, "the CUDA bindings stopped: {what}"),
        }
    }
}

impl std::error::Error for Fault {}

fn driver(during: &'static str) -> impl Fn(DriverError) -> Fault {
    move |e| Fault::Driver {
        during,
        error: format!("{:?}", e.0),
        out_of_memory: e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY,
    }
}

fn blas(during: &'static str) -> impl Fn(CublasError) -> Fault {
    move |e| Fault::Blas {
        during,
        error: format!("{:?}", e.0),
        out_of_memory: e.0 == blas_sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED,
    }
}

/// Run `f`, turning a panic inside cudarc into a [`Fault`].
fn guarded<T>(f: impl FnOnce() -> Result<T, Fault>) -> Result<T, Fault> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            Err(Fault::Panicked(what))
        }
    }
}

/// The driver API functions this crate (through cudarc) calls: a library without them is not
/// a CUDA driver library cudarc can use.
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuLaunchKernel",
];

/// The cuBLAS functions this crate calls.
pub const BLAS_SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSgemm_v2",
    "cublasGemmEx",
];

/// Open the first of cudarc's candidate files for `lib` that loads (the one cudarc will use)
/// and check it has `symbols`. Ok: the candidate's name. Err: why not, naming `main` (the
/// file a user knows, `libcuda.so.1`).
pub fn probe(lib: &str, main: &str, symbols: &[&str]) -> Result<String, Fault> {
    probe_files(&candidates(lib), main, symbols)
}

/// The file names cudarc 0.18 tries for `lib`, in its order (`get_lib_name_candidates`, private
/// there), for the CUDA 13.0 bindings chosen in Cargo.toml. The first that loads is the one
/// cudarc uses.
pub fn candidates(lib: &str) -> Vec<String> {
    let (major, minor) = (13, 0);
    vec![
        format!("lib{lib}.so"),
        format!("lib{lib}64.so"),
        format!("lib{lib}64_{major}.so"),
        format!("lib{lib}64_{major}{minor}.so"),
        format!("lib{lib}64_{major}{minor}_0.so"),
        format!("lib{lib}64_{major}0_{minor}.so"),
        format!("lib{lib}64_10.so"),
        format!("lib{lib}64_11.so"),
        format!("lib{lib}64_{major}0_0.so"),
        format!("lib{lib}64_9.so"),
        format!("lib{lib}.so.{major}"),
        format!("lib{lib}.so.11"),
        format!("lib{lib}.so.10"),
        format!("lib{lib}.so.1"),
    ]
}

/// [`probe`] over a list of file names, tried in order.
pub fn probe_files(candidates: &[String], main: &str, symbols: &[&str]) -> Result<String, Fault> {
    let mut main_reason = None;
    for name in candidates {
        // SAFETY: loading a shared library runs its initialisers. The names are cudarc's own
        // candidates for this library, the files cudarc itself would load on first use.
        match unsafe { libloading::Library::new(name) } {
            Ok(loaded) => {
                for symbol in symbols {
                    // SAFETY: only the symbol's presence is checked; the pointer is not used.
                    let found = unsafe { loaded.get::<*const ()>(symbol.as_bytes()) };
                    if found.is_err() {
                        return Err(Fault::Library {
                            name: main.to_string(),
                            reason: format!(
                                "{name} loads but has no `{symbol}`: not a usable {main}"
                            ),
                        });
                    }
                }
                return Ok(name.clone());
            }
            Err(e) => {
                if name == main {
                    main_reason = Some(e.to_string());
                }
            }
        }
    }
    Err(Fault::Library {
        name: main.to_string(),
        reason: main_reason.unwrap_or_else(|| "not found".into()),
    })
}

/// The CUDA driver library (`libcuda.so.1`): loadable with every symbol used here?
pub fn driver_library() -> Result<String, Fault> {
    probe("cuda", "libcuda.so.1", DRIVER_SYMBOLS)
}

/// cuBLAS (`libcublas.so` or `libcublas.so.13`; a CUDA 12 `libcublas.so.12` is found
/// through a `libcublas.so` link to it): loadable with every symbol used here?
pub fn blas_library() -> Result<String, Fault> {
    probe("cublas", "libcublas.so.13", BLAS_SYMBOLS).map_err(|f| match f {
        Fault::Library { reason, .. } => Fault::Library {
            name: "cuBLAS (libcublas.so or libcublas.so.13)".into(),
            reason,
        },
        other => other,
    })
}

/// `cuDriverGetVersion` (callable before `cuInit`): `major * 1000 + minor * 10`. Call
/// [`driver_library`] first.
pub fn driver_version() -> Result<i32, Fault> {
    guarded(|| {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: `v` is a valid out-pointer for the call's duration; the library was probed.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(driver("cuDriverGetVersion"))?;
        Ok(v)
    })
}

/// How many devices CUDA sees (after `CUDA_VISIBLE_DEVICES`; none when `cuInit` says
/// CUDA_ERROR_NO_DEVICE). Call [`driver_library`] first.
pub fn device_count() -> Result<usize, Fault> {
    guarded(|| match CudaContext::device_count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(e) if e.0 == cudaError_enum::CUDA_ERROR_NO_DEVICE => Ok(0),
        Err(e) => Err(driver("cuInit")(e)),
    })
}

/// A GEMM's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    F32,
    Bf16,
    F16,
}

impl Element {
    pub fn bytes(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::Bf16 | Element::F16 => 2,
        }
    }
}

/// One device's primary context and a stream of its own. Not `Sync`: one thread drives it.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl Device {
    /// Open CUDA device `ordinal`. Call [`driver_library`] first.
    pub fn open(ordinal: usize) -> Result<Device, Fault> {
        guarded(|| {
            let ctx = CudaContext::new(ordinal).map_err(driver("opening a context"))?;
            // SAFETY: each buffer here is used on this one stream only, so cudarc's
            // cross-stream events are not needed (and would cost a record per copy).
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
            Ok(Device { ctx, stream })
        })
    }

    pub fn name(&self) -> Result<String, Fault> {
        guarded(|| self.ctx.name().map_err(driver("cuDeviceGetName")))
    }

    /// (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32), Fault> {
        guarded(|| {
            self.ctx
                .compute_capability()
                .map_err(driver("reading the compute capability"))
        })
    }

    fn attribute(&self, a: CUdevice_attribute) -> Result<i32, Fault> {
        guarded(|| {
            self.ctx
                .attribute(a)
                .map_err(driver("cuDeviceGetAttribute"))
        })
    }

    /// `0000:3b:00.0`, as NVML and nvidia-smi write it.
    pub fn pci_bus_id(&self) -> Result<String, Fault> {
        let domain = self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
        let bus = self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
        let dev = self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
        Ok(format!("{domain:04x}:{bus:02x}:{dev:02x}.0"))
    }

    /// The memory clock (kHz) and bus width (bits) the driver reports, when it does.
    pub fn memory_clock_and_bus(&self) -> Option<(i32, i32)> {
        let clock = self
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
            .ok()?;
        let bus = self
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
            .ok()?;
        (clock > 0 && bus > 0).then_some((clock, bus))
    }

    /// (free, total) bytes.
    pub fn memory(&self) -> Result<(usize, usize), Fault> {
        guarded(|| {
            self.ctx
                .bind_to_thread()
                .map_err(driver("binding the context"))?;
            cudarc::driver::result::mem_get_info().map_err(driver("cuMemGetInfo"))
        })
    }

    /// Wait for everything queued on this device's stream.
    pub fn synchronize(&self) -> Result<(), Fault> {
        guarded(|| {
            self.stream
                .synchronize()
                .map_err(driver("waiting for the GPU"))
        })
    }

    /// `words` to the GPU, copied there once more, and back.
    pub fn round_trip(&self, words: &[u32]) -> Result<Vec<u32>, Fault> {
        guarded(|| {
            let there = self
                .stream
                .clone_htod(words)
                .map_err(driver("copying to the GPU"))?;
            let copy = self
                .stream
                .clone_dtod(&there)
                .map_err(driver("copying on the GPU"))?;
            self.stream
                .clone_dtoh(&copy)
                .map_err(driver("copying from the GPU"))
        })
    }

    /// The check kernel over `words`: each becomes `w * 3 + 7` (wrapping), computed on the GPU.
    pub fn check_kernel(&self, words: &[u32]) -> Result<Vec<u32>, Fault> {
        let (major, minor) = self.compute_capability()?;
        guarded(|| {
            let n = u32::try_from(words.len())
                .map_err(|_| Fault::Unsupported("too many words for the check kernel".into()))?;
            let func = self.check_function(major, minor)?;
            let input = self
                .stream
                .clone_htod(words)
                .map_err(driver("copying to the GPU"))?;
            let mut output = self
                .stream
                .alloc_zeros::<u32>(words.len())
                .map_err(driver("allocating GPU memory"))?;
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(256).max(1), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut launch = self.stream.launch_builder(&func);
            launch.arg(&mut output).arg(&input).arg(&n);
            // SAFETY: the kernel's parameters are (u64 out, u64 in, u32 n) as declared in
            // CHECK_PTX; it touches out[i] and in[i] for i < n only, and both hold n words.
            unsafe { launch.launch(cfg) }.map_err(driver("launching the check kernel"))?;
            self.stream
                .clone_dtoh(&output)
                .map_err(driver("copying from the GPU"))
        })
    }

    /// The check kernel, for this device's architecture first (the PTX ISA it needs), then
    /// for sm_50 (which every driver since CUDA 9 JIT-compiles for newer GPUs).
    fn check_function(&self, major: i32, minor: i32) -> Result<CudaFunction, Fault> {
        let target = format!("sm_{major}{minor}");
        let mut last = None;
        for (isa, target) in [
            (ptx_isa_for(major, minor), target.as_str()),
            ("6.0", "sm_50"),
        ] {
            let text = check_ptx(isa, target);
            match self.ctx.load_module(Ptx::from_src(text)) {
                Ok(module) => {
                    return module
                        .load_function("gpupilot_check")
                        .map_err(driver("finding the check kernel"));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(
            || Fault::Unsupported("no PTX to load".into()),
            driver("JIT-compiling the check kernel (cuModuleLoadData)"),
        ))
    }

    /// Three `n`×`n` matrices of `element` for [`Gemm::run`], filled by repeating `seed`
    /// (32-bit words: one f32, or two 16-bit values). Call [`blas_library`] first.
    pub fn gemm(&self, element: Element, n: usize, seed: &[u32]) -> Result<Gemm, Fault> {
        guarded(|| {
            let blas = CudaBlas::new(self.stream.clone()).map_err(blas("creating a handle"))?;
            let words = (n * n * element.bytes()).div_ceil(4);
            let a = self.filled(words, seed)?;
            let b = self.filled(words, seed)?;
            let c = self
                .stream
                .alloc_zeros::<u32>(words)
                .map_err(driver("allocating GPU memory"))?;
            Ok(Gemm {
                blas,
                stream: self.stream.clone(),
                a,
                b,
                c,
                n,
                element,
            })
        })
    }

    /// Two buffers of `bytes` (rounded down to 4) for [`Copy::run`], the source filled with `seed`.
    pub fn copy_buffers(&self, bytes: usize, seed: &[u32]) -> Result<Copy, Fault> {
        guarded(|| {
            let words = bytes / 4;
            let src = self.filled(words, seed)?;
            let dst = self
                .stream
                .alloc_zeros::<u32>(words)
                .map_err(driver("allocating GPU memory"))?;
            Ok(Copy {
                stream: self.stream.clone(),
                src,
                dst,
            })
        })
    }

    /// `words` on the GPU holding `seed` over and over: one upload, then copies on the GPU
    /// that double the filled part.
    fn filled(&self, words: usize, seed: &[u32]) -> Result<CudaSlice<u32>, Fault> {
        let mut buf = self
            .stream
            .alloc_zeros::<u32>(words)
            .map_err(driver("allocating GPU memory"))?;
        let first = seed.len().min(words);
        if first == 0 {
            return Ok(buf);
        }
        self.stream
            .memcpy_htod(&seed[..first], &mut buf.slice_mut(..first))
            .map_err(driver("copying to the GPU"))?;
        let mut done = first;
        while done < words {
            let (head, mut tail) = buf.split_at_mut(done);
            let m = done.min(tail.len());
            self.stream
                .memcpy_dtod(&head.slice(..m), &mut tail.slice_mut(..m))
                .map_err(driver("filling GPU memory"))?;
            done += m;
        }
        Ok(buf)
    }
}

/// The PTX ISA version `sm_XY` needs (PTX ISA reference, "PTX Target Architecture"); newer
/// architectures than this table knows get the newest it knows.
pub fn ptx_isa_for(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (..=6, _) => "5.0",
        (7, 0) => "6.0",
        (7, 2) => "6.1",
        (7, _) => "6.3",
        (8, 0) => "7.0",
        (8, 6) => "7.1",
        (8, 7) => "7.4",
        (8, _) => "7.8",
        (9, _) => "7.8",
        (10, 0) | (10, 1) => "8.6",
        (12, 0) => "8.7",
        _ => "8.8",
    }
}

/// The check kernel: `out[i] = in[i] * 3 + 7` for `i < n`, one thread per word.
pub fn check_ptx(isa: &str, target: &str) -> String {
    format!(
        r#".version {isa}
.target {target}
.address_size 64

.visible .entry gpupilot_check(
    .param .u64 out_ptr,
    .param .u64 in_ptr,
    .param .u32 n
)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [out_ptr];
    ld.param.u64 %rd2, [in_ptr];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd4, %rd5;
    ld.global.u32 %r6, [%rd6];
    mul.lo.s32 %r7, %r6, 3;
    add.s32 %r8, %r7, 7;
    add.s64 %rd7, %rd3, %rd5;
    st.global.u32 [%rd7], %r8;
DONE:
    ret;
}}
"#
    )
}

/// Matrices on one device, ready to multiply: C = A·B, all `n`×`n`, column-major.
pub struct Gemm {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    a: CudaSlice<u32>,
    b: CudaSlice<u32>,
    c: CudaSlice<u32>,
    n: usize,
    element: Element,
}

impl Gemm {
    /// Queue `times` multiplications (not waited for: see [`Device::synchronize`]).
    /// FP32 through `cublasSgemm` (cuBLAS's default math: no TF32); BF16 and FP16 through
    /// `cublasGemmEx` with FP32 accumulation, which cuBLAS runs on tensor cores.
    pub fn run(&mut self, times: usize) -> Result<(), Fault> {
        guarded(|| {
            let n = std::ffi::c_int::try_from(self.n)
                .map_err(|_| Fault::Unsupported("matrix too large".into()))?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            let (a, _ra) = self.a.device_ptr(&self.stream);
            let (b, _rb) = self.b.device_ptr(&self.stream);
            let (c, _rc) = self.c.device_ptr_mut(&self.stream);
            let op = blas_sys::cublasOperation_t::CUBLAS_OP_N;
            for _ in 0..times {
                // SAFETY: a, b and c each hold n*n elements of `self.element` (allocated so in
                // `Device::gemm`) on this handle's stream, with leading dimension n; alpha and
                // beta are host f32 values, as the default pointer mode expects.
                unsafe {
                    match self.element {
                        Element::F32 => cudarc::cublas::result::sgemm(
                            *self.blas.handle(),
                            op,
                            op,
                            n,
                            n,
                            n,
                            &alpha,
                            a as *const f32,
                            n,
                            b as *const f32,
                            n,
                            &beta,
                            c as *mut f32,
                            n,
                        ),
                        Element::Bf16 | Element::F16 => {
                            let t = if self.element == Element::Bf16 {
                                blas_sys::cudaDataType::CUDA_R_16BF
                            } else {
                                blas_sys::cudaDataType::CUDA_R_16F
                            };
                            cudarc::cublas::result::gemm_ex(
                                *self.blas.handle(),
                                op,
                                op,
                                n,
                                n,
                                n,
                                (&alpha as *const f32).cast(),
                                a as *const std::ffi::c_void,
                                t,
                                n,
                                b as *const std::ffi::c_void,
                                t,
                                n,
                                (&beta as *const f32).cast(),
                                c as *mut std::ffi::c_void,
                                t,
                                n,
                                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                            )
                        }
                    }
                }
                .map_err(blas("GEMM"))?;
            }
            Ok(())
        })
    }

    pub fn n(&self) -> usize {
        self.n
    }
}

/// Two buffers on one device for device-to-device copies.
pub struct Copy {
    stream: Arc<CudaStream>,
    src: CudaSlice<u32>,
    dst: CudaSlice<u32>,
}

impl Copy {
    /// Queue `times` copies of the whole source into the destination.
    pub fn run(&mut self, times: usize) -> Result<(), Fault> {
        guarded(|| {
            for _ in 0..times {
                self.stream
                    .memcpy_dtod(&self.src, &mut self.dst)
                    .map_err(driver("copying on the GPU"))?;
            }
            Ok(())
        })
    }

    /// Bytes in each buffer.
    pub fn bytes(&self) -> usize {
        self.src.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_named_with_the_loader_reason() {
        let err = probe("no-such-gpupilot-lib", "libno-such-gpupilot-lib.so.1", &[]).unwrap_err();
        match err {
            Fault::Library { name, reason } => {
                assert_eq!(name, "libno-such-gpupilot-lib.so.1");
                assert!(reason.contains("libno-such-gpupilot-lib.so.1"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_library_without_the_symbols_is_refused() {
        // libm loads everywhere and has no cuInit.
        let libm = ["libm.so.6".to_string()];
        let err = probe_files(&libm, "libm.so.6", &["cos", "cuInit"]).unwrap_err();
        assert!(err.to_string().contains("has no `cuInit`"), "{err}");
        assert_eq!(
            probe_files(&libm, "libm.so.6", &["cos"]),
            Ok("libm.so.6".into())
        );
    }

    #[test]
    fn the_ptx_names_its_target_and_isa() {
        let text = check_ptx(ptx_isa_for(9, 0), "sm_90");
        assert!(text.starts_with(".version 7.8\n.target sm_90\n"), "{text}");
        assert!(text.contains(".visible .entry gpupilot_check("));
        assert_eq!(ptx_isa_for(8, 0), "7.0");
        assert_eq!(ptx_isa_for(7, 5), "6.3");
        assert_eq!(ptx_isa_for(13, 0), "8.8");
    }

    #[test]
    fn guarded_turns_a_panic_into_a_fault() {
        #[allow(clippy::panic)]
        let r: Result<(), Fault> = guarded(|| panic!("Expected function \"cuX\" in library"));
        assert_eq!(
            r,
            Err(Fault::Panicked(
                "Expected function \"cuX\" in library".into()
            ))
        );
    }
}
