//! `gpupilot export`: the columns and their units, bad input refused with exit status 2, and
//! what pandas reads back (CSV, JSON lines and Parquet, through Debian's python3-pandas and
//! pyarrow in the repository's .venv, both installed by .ci/run) equal to the daemon's history
//! query and to the run's metrics.jsonl.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpupilot::export::gpus::column_name;
use gpupilot::history::Metric;
use serde_json::{Value, json};

use crate::support::home::Home;
use crate::support::peers::missing;
use crate::support::wait::wait_for;

/// `gpupilot export ARGS…` that must fail with status 2; its stderr.
fn refused(home: &Home, args: &[&str]) -> String {
    let mut all = vec!["export"];
    all.extend_from_slice(args);
    let out = home.run(&all, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "export {args:?}: {err}");
    assert!(out.stdout.is_empty(), "export {args:?} wrote to stdout");
    err
}

#[test]
fn bad_input_is_refused_with_status_2_and_says_why() {
    let home = Home::new();
    let err = refused(&home, &["--format", "xml"]);
    assert!(err.contains("xml") && err.contains("parquet"), "{err}");
    let err = refused(&home, &["--since", "yesterday"]);
    assert!(err.contains("not a time") && err.contains("2h"), "{err}");
    let err = refused(&home, &["--since", "2026-11-30 03:15"]);
    assert!(err.contains("RFC 3339"), "{err}");
    let err = refused(&home, &["--since", "1h", "--until", "2h"]);
    assert!(err.contains("is not before --until"), "{err}");
    let err = refused(
        &home,
        &[
            "--since",
            "2026-11-30T04:00:00Z",
            "--until",
            "2026-11-30T03:00:00Z",
        ],
    );
    assert!(err.contains("2026-11-30T04:00:00.000Z"), "{err}");
    let err = refused(&home, &["--run", "no-such-run"]);
    assert!(err.contains("no run `no-such-run`"), "{err}");
    let err = refused(&home, &["--out", "/nonexistent-dir/x/h.csv"]);
    assert!(
        err.contains("the directory /nonexistent-dir/x does not exist"),
        "{err}"
    );
    let err = refused(&home, &["--table", "metrics"]);
    assert!(err.contains("--run"), "{err}");
    let err = refused(&home, &["--run", "x", "--gpu", "0"]);
    assert!(err.contains("per rank"), "{err}");
    let err = refused(&home, &["--step", "0"]);
    assert!(err.contains("0.01"), "{err}");

    // Not bad input: there is no daemon to ask for the history.
    let out = home.run(&["export"], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no daemon answers"));
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn rfc(t: f64) -> String {
    gpupilot::time::rfc3339(UNIX_EPOCH + Duration::from_secs_f64(t))
}

#[test]
fn the_history_and_a_runs_metrics_export_as_pandas_reads_them() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let run = home.start_synthetic();
    let c = home.client();
    let start = now_s();
    wait_for("5 s of history", Duration::from_secs(30), || {
        now_s() - start > 5.0
    });
    home.ok(&["stop", &run]);
    wait_for("the run to end", Duration::from_secs(30), || {
        c.run(&run).is_ok_and(|r| r.is_final())
    });

    // A window in the past that the daemon's full-rate ring still holds: it stays as it is. Its
    // edges are off the 0.5 s grid, as a window given as `--since 6s` is.
    let base = now_s().floor() - 5.0;
    let from = base + 0.3;
    let to = from + 3.0;
    let out = home.dir.path();
    let file = |name: &str| out.join(name).display().to_string();
    let export = |from: f64, to: f64, format: &str, name: &str| {
        home.ok(&[
            "export",
            "--since",
            &rfc(from),
            "--until",
            &rfc(to),
            "--step",
            "0.5",
            "--format",
            format,
            "--out",
            &file(name),
        ]);
    };
    for (format, name) in [
        ("csv", "h.csv"),
        ("jsonl", "h.jsonl"),
        ("parquet", "h.parquet"),
    ] {
        export(from, to, format, name);
    }
    // The same window asked for 27 ms later (as `--since 6s` typed again): the same table, to
    // the byte, so the two join on `time`.
    export(from + 0.027, to + 0.027, "csv", "h2.csv");
    assert_eq!(
        std::fs::read_to_string(out.join("h.csv")).unwrap(),
        std::fs::read_to_string(out.join("h2.csv")).unwrap(),
        "two exports of one window"
    );
    // Its steps on the wall clock's 0.5 s grid: from the step holding `from` (at `base`) to
    // the one holding the last instant before `to`, 7 of them; a row is at its step's start.
    let (grid_from, grid_to) = (base, base + 3.5);
    let mut expected: Vec<Value> = Vec::new();
    for gpu in 0..2u32 {
        for m in Metric::ALL {
            for p in c.history(gpu, m, grid_from, grid_to, 7).unwrap() {
                let t = p.t - 0.25;
                let row = match expected
                    .iter_mut()
                    .find(|r| r["gpu"] == gpu && r["t"].as_f64() == Some(t))
                {
                    Some(r) => r,
                    None => {
                        expected.push(json!({"t": t, "gpu": gpu}));
                        expected.last_mut().unwrap()
                    }
                };
                // The history's reading: an f32, widened.
                row[column_name(m)] = json!(p.mean);
            }
        }
    }
    // Two GPUs, 7 steps; a step the sampler missed on a busy machine is no row in either.
    for gpu in 0..2u32 {
        let rows = expected.iter().filter(|r| r["gpu"] == gpu).count();
        assert!(
            rows >= 3,
            "GPU {gpu}: {rows} steps of 7 in the history: {expected:?}"
        );
    }
    expected.sort_by(|a, b| {
        let key = |r: &Value| (r["t"].as_f64().unwrap(), r["gpu"].as_u64().unwrap());
        key(a).partial_cmp(&key(b)).unwrap()
    });

    // The layout, read here: units in the names, empty cells where a series has no sample.
    let csv = std::fs::read_to_string(out.join("h.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    assert_eq!(&header[..2], ["time", "gpu"]);
    for m in Metric::ALL {
        assert!(header.contains(&column_name(m)), "{header:?}");
    }
    assert_eq!(csv.lines().count(), expected.len() + 1, "{csv}");
    // Rows in time order, then by GPU, each at the start of its step.
    let first: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let want = &expected[0];
    assert_eq!(first[0], rfc(want["t"].as_f64().unwrap()));
    assert_eq!(first[1], want["gpu"].to_string());
    let power = header.iter().position(|h| *h == "power_w").unwrap();
    assert_eq!(
        first[power].parse::<f32>().unwrap(),
        want["power_w"].as_f64().unwrap() as f32
    );
    // Every time a whole multiple of the step since the epoch; every reading written as the
    // f32 it is, without the digits of its widening to f64 (624.4, not 624.4000244140625).
    let f32_exact = |x: f64| (x as f32).to_string().parse::<f64>().unwrap() == x;
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let t = gpupilot::time::parse_rfc3339(cells[0]).unwrap();
        let ms = t.duration_since(UNIX_EPOCH).unwrap().as_millis();
        assert_eq!(ms % 500, 0, "{line}");
        for cell in cells[2..].iter().filter(|c| !c.is_empty()) {
            let x: f64 = cell.parse().unwrap();
            assert!(f32_exact(x) && !cell.starts_with("-0"), "{cell} in {line}");
        }
    }
    let jsonl = std::fs::read_to_string(out.join("h.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), expected.len());
    for line in jsonl.lines() {
        let row: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        for m in Metric::ALL {
            if let Some(x) = row[column_name(m)].as_f64() {
                assert!(f32_exact(x), "{x} in {line}");
            }
        }
    }

    // The run's metrics, every report. Two more, one from rank 1 as a second rank's SDK sends
    // it and one that names no rank (a line parsed from the output): `rank` must stay a column
    // of integers with some absent.
    let metrics_path = home.run_dir(&run).path().join("metrics.jsonl");
    let mut metrics = std::fs::read_to_string(&metrics_path).unwrap();
    let last: Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    for rank in [Some(1), None] {
        let mut line = last.clone();
        line["n"] = json!(metrics.lines().count());
        match rank {
            Some(r) => line["rank"] = json!(r),
            None => {
                line.as_object_mut().unwrap().remove("rank");
            }
        }
        metrics.push_str(&format!("{line}\n"));
    }
    std::fs::write(&metrics_path, &metrics).unwrap();
    for (format, name) in [
        ("csv", "m.csv"),
        ("jsonl", "m.jsonl"),
        ("parquet", "m.parquet"),
    ] {
        home.ok(&[
            "export",
            "--run",
            &run,
            "--format",
            format,
            "--out",
            &file(name),
        ]);
    }
    let reports: Vec<Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(reports.len() > 3, "{metrics}");
    // To stdout, as CSV by default.
    let printed = home.ok(&["export", "--run", &run]);
    assert_eq!(printed, std::fs::read_to_string(out.join("m.csv")).unwrap());
    assert_eq!(printed.lines().count(), reports.len() + 1);
    assert!(printed.starts_with("time,run,rank,n,source,step,epoch,loss,samples_per_s,"));

    let expected_path = out.join("expected.json");
    std::fs::write(
        &expected_path,
        json!({"history": expected, "metrics": reports, "run": run}).to_string(),
    )
    .unwrap();
    let Some(python) = pandas_python() else {
        return;
    };
    let script = out.join("check_export.py");
    std::fs::write(&script, CHECK).unwrap();
    let done = Command::new(&python)
        .arg(&script)
        .arg(&expected_path)
        .arg(out)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "pandas disagrees:\n{}\n{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
    let said = String::from_utf8_lossy(&done.stdout);
    assert!(
        said.contains(&format!("history: {} rows x 3 formats", expected.len())),
        "{said}"
    );
}

/// A Python with pandas and pyarrow: the repository's .venv (Debian's pandas through its system
/// site packages, pyarrow from PyPI), else Debian's own.
fn pandas_python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    for p in [venv, PathBuf::from("/usr/bin/python3")] {
        let ok = Command::new(&p)
            .args(["-c", "import pandas, pyarrow"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(p);
        }
    }
    missing("no Python with pandas and pyarrow (python3-pandas, pyarrow in .venv)");
    None
}

/// Reads every export with pandas as a notebook would, with no options beyond naming the
/// time column, and compares each number with the history query's and metrics.jsonl's.
const CHECK: &str = r#"
import json, math, os, sys
import numpy as np
import pandas as pd

expected = json.load(open(sys.argv[1]))
d = sys.argv[2]

def load(name, dtype=None):
    path = os.path.join(d, name)
    if name.endswith(".csv"):
        df = pd.read_csv(path, parse_dates=["time"], dtype=dtype)
    elif name.endswith(".jsonl"):
        df = pd.read_json(path, lines=True, dtype=dtype)
        df["time"] = pd.to_datetime(df["time"], utc=True)
    else:
        df = pd.read_parquet(path)
    assert str(df["time"].dt.tz) == "UTC", (name, df["time"].dtype)
    epoch = pd.Timestamp(0, tz="UTC")
    df["t"] = (df["time"] - epoch).dt.total_seconds()
    return df

def same(want, got, what):
    if want is None:
        assert got is None or (isinstance(got, float) and math.isnan(got)), (what, "absent, got", got)
        return
    assert got is not None and not (isinstance(got, float) and math.isnan(got)), (what, "want", want, "got nothing")
    assert abs(float(got) - float(want)) <= 1e-9 * max(1.0, abs(float(want))), (what, want, got)

columns = ["util_gpu_pct", "util_mem_pct", "memory_used_bytes", "temperature_c", "power_w",
           "power_limit_w", "sm_clock_mhz", "fan_pct", "pcie_rx_kbps", "pcie_tx_kbps",
           "power_limited_share", "thermal_limited_share"]
for ext in ["csv", "jsonl", "parquet"]:
    df = load("h." + ext)
    assert len(df) == len(expected["history"]), (ext, len(df))
    assert list(df.columns[:2]) == ["time", "gpu"], list(df.columns)
    for row in expected["history"]:
        hit = df[(df["gpu"] == row["gpu"]) & ((df["t"] - row["t"]).abs() < 0.0015)]
        assert len(hit) == 1, (ext, row, len(hit))
        assert hit.iloc[0]["t"] * 1000 % 500 == 0, (ext, row)
        for c in columns:
            v = hit.iloc[0][c]
            # The history holds f32 readings: each is the shortest decimal of its f32.
            want = row.get(c)
            want = None if want is None else float(str(np.float32(want)))
            same(want, None if pd.isna(v) else float(v), (ext, row["gpu"], row["t"], c))
print("history: %d rows x 3 formats" % len(expected["history"]))

reports = expected["metrics"]
assert any("rank" in r for r in reports) and any("rank" not in r for r in reports)
for ext in ["csv", "jsonl", "parquet"]:
    # As docs/operations.md says to read them: Parquet as it is, the text formats naming the
    # dtype of the integer column that may have gaps.
    df = load("m." + ext, None if ext == "parquet" else {"rank": "Int64"})
    assert len(df) == len(reports), (ext, len(df), len(reports))
    assert str(df["rank"].dtype) == "Int64", (ext, df["rank"].dtype)
    assert str(df["n"].dtype) in ("int64", "Int64"), (ext, df["n"].dtype)
    assert list(df["rank"].isna()) == ["rank" not in r for r in reports], ext
    for i, r in enumerate(reports):
        row = df.iloc[i]
        assert abs(row["t"] - r["t"]) < 0.0015, (ext, i, row["t"], r["t"])
        assert row["run"] == expected["run"], (ext, row["run"])
        same(r["n"], float(row["n"]), (ext, i, "n"))
        for c in ["rank", "step", "loss", "samples_per_s", "step_time_s", "data_wait_s", "batch_size"]:
            v = row[c]
            same(r.get(c), None if pd.isna(v) else float(v), (ext, i, c))
print("metrics: %d rows x 3 formats" % len(reports))

# Every check has passed. pyarrow's threads can abort the interpreter's own shutdown now and
# then ("terminate called without an active exception"), which would read as a failure here:
# leave without that shutdown. A failed check raises above and exits 1.
sys.stdout.flush()
os._exit(0)
"#;
