//! `bench gemm`, `bench memory` and `doctor` on a machine without a usable CUDA library: one
//! line naming what is missing, exit status 2, never a panic. The library is made missing or
//! broken on purpose (LD_LIBRARY_PATH to a directory holding a bad `libcuda.so.1`), so these
//! hold on a machine where the loader would find none anyway, as CI's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::support::nvml::FakeNode;

const COMPATIBLE: &str = include_str!("../../crates/fake-nvml/scenarios/doctor-compatible.toml");

/// A directory with `libcuda.so.1` made from `contents` (empty: not a library at all).
fn lib_dir(root: &Path, contents: &[u8]) -> PathBuf {
    let dir = root.join("lib");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("libcuda.so.1"), contents).unwrap();
    dir
}

fn gpupilot(home: &Path, lib_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpupilot"))
        .args(args)
        .env("GPUPILOT_HOME", home.join("home"))
        .env("LD_LIBRARY_PATH", lib_dir)
        .env_remove("GPUPILOT_SOURCE")
        .env_remove("GPUPILOT_NVML_LIB")
        .env_remove("GPUPILOT_SYSTEM")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Exit status 2, nothing on stdout, one line on stderr that starts with `prefix`; the line.
fn one_line(out: &Output, prefix: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(prefix), "{err}");
    err
}

#[test]
fn without_libcuda_each_bench_says_so_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    // An empty file: the loader refuses it, as it would a missing one.
    let lib = lib_dir(tmp.path(), b"");
    for (args, prefix) in [
        (&["bench", "gemm"][..], "gpupilot bench gemm: no CUDA: "),
        (
            &[
                "bench",
                "gemm",
                "--precision",
                "bf16",
                "--gpu",
                "0,1",
                "--json",
            ][..],
            "gpupilot bench gemm: no CUDA: ",
        ),
        (&["bench", "memory"][..], "gpupilot bench memory: no CUDA: "),
        (
            &["bench", "memory", "--json", "--duration", "1s"][..],
            "gpupilot bench memory: no CUDA: ",
        ),
    ] {
        let line = one_line(&gpupilot(tmp.path(), &lib, args), prefix);
        assert!(
            line.contains("libcuda.so.1 could not be loaded"),
            "{args:?}: {line}"
        );
        assert!(line.contains("--source sim"), "{args:?}: {line}");
    }
}

#[test]
fn a_libcuda_without_the_driver_api_is_named_not_a_panic() {
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("a libm.so.6 to stand in for a libcuda without its functions");
    let tmp = tempfile::tempdir().unwrap();
    // A real shared library that loads, with none of CUDA's functions: cudarc would panic on
    // its first call.
    let lib = lib_dir(tmp.path(), &std::fs::read(libm).unwrap());
    let line = one_line(
        &gpupilot(tmp.path(), &lib, &["bench", "gemm"]),
        "gpupilot bench gemm: no CUDA: ",
    );
    assert!(
        line.contains("libcuda.so.1 loads but has no `cuInit`"),
        "{line}"
    );
}

#[test]
fn the_simulator_has_no_gemm_to_time() {
    let tmp = tempfile::tempdir().unwrap();
    let lib = lib_dir(tmp.path(), b"");
    let line = one_line(
        &gpupilot(tmp.path(), &lib, &["--source", "sim", "bench", "gemm"]),
        "gpupilot bench gemm: ",
    );
    assert!(line.contains("real GPU"), "{line}");
}

#[test]
fn doctor_on_a_node_with_gpus_and_no_libcuda_is_a_problem() {
    let node = FakeNode::new(COMPATIBLE);
    let lib = lib_dir(node.dir.path(), b"");
    let py = node.dir.path().join("python3");
    crate::support::write_exec(&py, "#!/bin/sh\necho '{\"torch\": null}'\n");
    let run = |extra: &[&str]| {
        let mut args = vec!["doctor"];
        args.extend_from_slice(extra);
        node.gpupilot(&args)
            .env("GPUPILOT_PYTHON", &py)
            .env("GPUPILOT_HOME", node.dir.path().join("home"))
            .env("LD_LIBRARY_PATH", &lib)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{report}");
    let line = report
        .lines()
        .find(|l| l.contains("CUDA (library)"))
        .unwrap_or_else(|| panic!("no CUDA line in\n{report}"));
    assert!(line.starts_with("  FAIL"), "{line}");
    assert!(line.contains("libcuda.so.1 could not be loaded"), "{line}");
    assert!(line.contains("NVML sees 2 GPUs"), "{line}");

    let out = run(&["--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 2);
    assert_eq!(v["facts"]["cuda"]["state"], "missing");
    let cuda = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "cuda")
        .unwrap();
    assert_eq!(cuda["status"], "fail");

    // --no-cuda: a plain note, and the node's verdict is its other lines'.
    let out = run(&["--no-cuda"]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        report.contains("info  CUDA (library)        not checked (--no-cuda)"),
        "{report}"
    );
}
