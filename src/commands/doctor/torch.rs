//! `doctor`'s PyTorch line: which PyTorch the runs' Python has, the CUDA it was built for and
//! whether it finds a GPU (`torch.cuda.is_available()`), judged against the CUDA the driver
//! runs.
//!
//! The interpreter (`--python`, `GPUPILOT_PYTHON`, default `python3`) is asked once, with a time
//! limit, and at most [`MAX_ANSWER`] bytes of what it prints are kept. No PyTorch, or no
//! interpreter, is a note, not a problem: not every node trains with PyTorch.

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::checks::{Check, MINOR_COMPAT_MIN_DRIVER, Status, cuda_verdict, parse_cuda};

/// The interpreter asked about PyTorch unless `--python` or `GPUPILOT_PYTHON` names another.
pub const DEFAULT_PYTHON: &str = "python3";

/// At most this much of the interpreter's output is read: the answer is one short line, and an
/// import that prints warnings says a little more.
pub const MAX_ANSWER: u64 = 64 * 1024;

/// What `python -c` prints: one JSON object.
const TORCH_PROBE: &str = r#"
import json
try:
    import torch
except Exception as e:
    print(json.dumps({"torch": None, "error": str(e)[:400]}))
else:
    try:
        available = bool(torch.cuda.is_available())
    except Exception:
        available = None
    print(json.dumps({"torch": str(torch.__version__), "cuda": torch.version.cuda, "available": available}))
"#;

/// What the installed PyTorch said about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Torch {
    /// The interpreter could not be run, or timed out.
    NoPython {
        python: String,
        error: String,
    },
    NotInstalled {
        python: String,
    },
    /// Built without CUDA.
    CpuOnly {
        python: String,
        version: String,
    },
    Cuda {
        python: String,
        version: String,
        cuda: String,
        /// `torch.cuda.is_available()`; absent where the interpreter did not say.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        available: Option<bool>,
    },
}

/// Run `cmd` in a process group of its own with no input, keeping at most [`MAX_ANSWER`]
/// bytes of its stdout; the group is killed after `timeout`, and once the child has ended (so
/// nothing it started lives on). The output is read on a thread of its own, so a child that
/// prints more than a pipe holds never blocks; what is past the bound is read and dropped.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<(ExitStatus, Vec<u8>), String> {
    use crate::supervisor::signal::{Sig, to_group};
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel();
    if let Some(mut out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut out).take(MAX_ANSWER).read_to_end(&mut kept);
            let _ = std::io::copy(&mut out, &mut std::io::sink());
            let _ = tx.send(kept);
        });
    }
    let start = Instant::now();
    let group = child.id();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = to_group(group, Sig::Kill);
                let _ = child.wait();
                return Err(format!("no answer within {:.1} s", timeout.as_secs_f64()));
            }
            Err(e) => {
                let _ = to_group(group, Sig::Kill);
                let _ = child.wait();
                return Err(e.to_string());
            }
        }
    };
    // Whatever the interpreter left running goes with it.
    let _ = to_group(group, Sig::Kill);
    // The output ends with the child, unless a process it started still holds the pipe: that
    // one is not waited for.
    let out = rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
    Ok((status, out))
}

/// Ask `python` which PyTorch it has, within `timeout`.
pub fn probe(python: &str, timeout: Duration) -> Torch {
    let no_python = |error: String| Torch::NoPython {
        python: python.to_string(),
        error,
    };
    let (status, out) = match run_bounded(Command::new(python).args(["-c", TORCH_PROBE]), timeout) {
        Ok(answer) => answer,
        Err(e) => return no_python(e),
    };
    let text = String::from_utf8_lossy(&out);
    if !status.success() {
        return no_python(format!("it exited with {status}"));
    }
    let Some(v) = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(serde_json::Value::is_object)
    else {
        let shown: String = text.trim().chars().take(200).collect();
        return no_python(format!(
            "unexpected answer {:?}",
            crate::text::printable(&shown)
        ));
    };
    let python = python.to_string();
    let field = |k: &str| {
        v[k].as_str()
            .map(|s| crate::text::printable(&s.chars().take(100).collect::<String>()))
    };
    match (field("torch"), field("cuda")) {
        (None, _) => Torch::NotInstalled { python },
        (Some(version), None) => Torch::CpuOnly { python, version },
        (Some(version), Some(cuda)) => Torch::Cuda {
            python,
            version,
            cuda,
            available: v["available"].as_bool(),
        },
    }
}

/// What the PyTorch line is judged against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Against<'a> {
    /// The node is the simulator: no driver, no GPU that PyTorch could use.
    pub simulated: bool,
    /// How many GPUs NVML sees; absent where NVML could not be loaded.
    pub gpus: Option<usize>,
    /// The driver's version (NVML's), if known.
    pub driver: Option<&'a str>,
    /// The newest CUDA the driver runs (NVML's, else libcuda's `cuDriverGetVersion`).
    pub driver_cuda: Option<(u32, u32)>,
}

fn line(status: Status, detail: String) -> Check {
    Check {
        name: "pytorch".into(),
        status,
        detail,
    }
}

/// The `pytorch` line.
pub fn check(t: &Torch, a: Against<'_>) -> Check {
    // A real node where PyTorch is meant to use GPUs: NVML sees some, or no driver is there yet.
    let needs_gpu = !a.simulated && a.gpus.is_none_or(|n| n > 0);
    match t {
        Torch::NoPython { python, error } => line(
            Status::Info,
            format!(
                "could not ask `{python}` about PyTorch ({error}); set GPUPILOT_PYTHON (or --python) to the interpreter your runs use"
            ),
        ),
        Torch::NotInstalled { python } => line(
            Status::Info,
            format!(
                "PyTorch is not installed for `{python}` (GPUPILOT_PYTHON or --python names another interpreter)"
            ),
        ),
        Torch::CpuOnly { version, .. } if needs_gpu => {
            let which = match a.driver_cuda {
                Some((m, n)) => format!(" for CUDA {m}.{n} or older (the newest this driver runs)"),
                None => String::new(),
            };
            line(
                Status::Fail,
                format!(
                    "PyTorch {version} is built without CUDA (CPU only): it cannot use the GPUs; install a CUDA build{which} (the selector on pytorch.org/get-started gives the pip command)"
                ),
            )
        }
        Torch::CpuOnly { version, .. } => line(
            Status::Info,
            format!(
                "PyTorch {version} is built without CUDA (CPU only): {}",
                if a.simulated {
                    "enough on a simulated node; a GPU node needs a CUDA build"
                } else {
                    "NVML sees no GPU here for it to use"
                }
            ),
        ),
        Torch::Cuda {
            version,
            cuda: built,
            available,
            ..
        } => cuda_build(version, built, *available, a, needs_gpu),
    }
}

fn cuda_build(
    version: &str,
    built: &str,
    available: Option<bool>,
    a: Against<'_>,
    needs_gpu: bool,
) -> Check {
    let head = format!("PyTorch {version} built for CUDA {built}");
    if a.simulated {
        return line(
            Status::Info,
            format!("{head}: a simulated node has no driver to judge it against"),
        );
    }
    let Some(b) = parse_cuda(built) else {
        return line(
            Status::Warn,
            format!("PyTorch {version} reports CUDA `{built}`, which is not a version"),
        );
    };
    let (status, verdict) = match a.driver_cuda {
        Some(dc) => cuda_verdict(a.driver.unwrap_or("(version unknown)"), dc, b),
        None if a.gpus.is_none() => {
            let min = MINOR_COMPAT_MIN_DRIVER
                .iter()
                .find(|(m, _)| *m == b.0)
                .map_or(String::new(), |(_, v)| {
                    format!(" (any driver ≥ {v} through minor-version compatibility)")
                });
            (
                Status::Info,
                format!(
                    "it needs a driver that runs CUDA {}.{} or newer{min}, and no driver is found (see the driver line)",
                    b.0, b.1
                ),
            )
        }
        None => (
            Status::Warn,
            "the driver's CUDA version is unknown, so compatibility cannot be judged".into(),
        ),
    };
    match available {
        Some(false) if needs_gpu && a.gpus.is_some() => line(
            Status::Fail,
            format!(
                "{head}: {verdict}; and torch.cuda.is_available() is False: PyTorch finds no GPU (CUDA_VISIBLE_DEVICES empty or wrong, the driver's libcuda.so.1 missing or older than CUDA {built}: see the CUDA lines)"
            ),
        ),
        Some(true) if status == Status::Ok => line(
            status,
            format!("{head}: {verdict}; torch.cuda.is_available() is True"),
        ),
        _ => line(status, format!("{head}: {verdict}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real(driver_cuda: Option<(u32, u32)>, gpus: Option<usize>) -> Against<'static> {
        Against {
            simulated: false,
            gpus,
            driver: driver_cuda.map(|_| "550.54.15"),
            driver_cuda,
        }
    }

    fn cuda(version: &str, built: &str, available: Option<bool>) -> Torch {
        Torch::Cuda {
            python: "python3".into(),
            version: version.into(),
            cuda: built.into(),
            available,
        }
    }

    #[test]
    fn a_cpu_only_build_is_a_problem_where_gpus_wait_for_it() {
        let t = Torch::CpuOnly {
            python: "/usr/bin/python3".into(),
            version: "1.13.0a0".into(),
        };
        let c = check(&t, real(Some((12, 4)), Some(2)));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.starts_with(
                "PyTorch 1.13.0a0 is built without CUDA (CPU only): it cannot use the GPUs; install a CUDA build for CUDA 12.4 or older"
            ),
            "{}",
            c.detail
        );
        // No driver yet: still a problem, the build is wrong whatever driver comes.
        let c = check(&t, real(None, None));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("install a CUDA build (the selector"),
            "{}",
            c.detail
        );
        // No GPU, or the simulator: a note.
        assert_eq!(check(&t, real(Some((12, 4)), Some(0))).status, Status::Info);
        let sim = Against {
            simulated: true,
            gpus: None,
            driver: None,
            driver_cuda: None,
        };
        let c = check(&t, sim);
        assert_eq!(c.status, Status::Info);
        assert!(c.detail.contains("simulated"), "{}", c.detail);
        assert_eq!(
            check(&cuda("2.3.1", "12.1", None), sim).status,
            Status::Info
        );
    }

    #[test]
    fn a_cuda_build_is_judged_against_the_driver_and_its_own_answer() {
        let ok = check(
            &cuda("2.3.1", "12.1", Some(true)),
            real(Some((12, 4)), Some(2)),
        );
        assert_eq!(ok.status, Status::Ok);
        assert!(
            ok.detail.ends_with("; torch.cuda.is_available() is True"),
            "{}",
            ok.detail
        );
        // Compatible on paper, yet PyTorch finds no GPU.
        let blind = check(
            &cuda("2.3.1", "12.1", Some(false)),
            real(Some((12, 4)), Some(2)),
        );
        assert_eq!(blind.status, Status::Fail);
        assert!(
            blind.detail.contains("torch.cuda.is_available() is False"),
            "{}",
            blind.detail
        );
        // Newer major than the driver runs.
        let old = check(
            &cuda("2.3.1", "12.1", Some(false)),
            real(Some((11, 4)), Some(2)),
        );
        assert_eq!(old.status, Status::Fail);
        assert!(old.detail.contains("incompatible"), "{}", old.detail);
        // No driver at all: a note naming the driver it needs; the driver line is the problem.
        let none = check(&cuda("2.3.1", "12.1", Some(false)), real(None, None));
        assert_eq!(none.status, Status::Info);
        assert!(
            none.detail
                .contains("needs a driver that runs CUDA 12.1 or newer")
                && none.detail.contains("525.60.13"),
            "{}",
            none.detail
        );
        // A driver whose version NVML did not give, its CUDA from libcuda.
        let a = Against {
            driver: None,
            ..real(Some((12, 2)), Some(1))
        };
        let c = check(&cuda("2.4.0", "12.4", None), a);
        assert_eq!(c.status, Status::Warn, "{}", c.detail);
    }

    #[test]
    fn the_interpreter_is_asked_with_a_bound_and_a_time_limit() {
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = dir.path().join(name);
            crate::config::safe_fs::write_atomic(&p, format!("#!/bin/sh\n{body}\n").as_bytes())
                .unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            p.display().to_string()
        };
        let py = script(
            "py",
            r#"echo 'warning: noise'; echo '{"torch": "2.3.1", "cuda": "12.1", "available": true}'"#,
        );
        assert_eq!(
            probe(&py, Duration::from_secs(10)),
            Torch::Cuda {
                python: py.clone(),
                version: "2.3.1".into(),
                cuda: "12.1".into(),
                available: Some(true),
            }
        );
        // Endless output: bounded, and the answer is "no answer" once the time is up.
        let loud = script("loud", "yes '{\"torch\": null}'");
        let t0 = Instant::now();
        let t = probe(&loud, Duration::from_millis(500));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(&t, Torch::NoPython { error, .. } if error.contains("no answer")),
            "{t:?}"
        );
        let slow = script("slow", "sleep 30");
        assert!(matches!(
            probe(&slow, Duration::from_millis(200)),
            Torch::NoPython { .. }
        ));
        let cpu = script(
            "cpu",
            r#"echo '{"torch": "1.13.0a0", "cuda": null, "available": false}'"#,
        );
        assert_eq!(
            probe(&cpu, Duration::from_secs(10)),
            Torch::CpuOnly {
                python: cpu.clone(),
                version: "1.13.0a0".into()
            }
        );
    }
}
