#!/usr/bin/env bash
# Report generation time for a 24-hour run on 8 GPUs (BENCHMARKS.md, "Run report of a 24-hour
# run"): a run directory synthesised as the daemon leaves one (summary.json with the energy of
# 8 GPUs, launch.json, metrics.jsonl from 8 ranks every 5 s for 24 h, events.jsonl with knob
# changes and restarts, the node's events.jsonl with cap changes and governor steps), then
# `gpupilot report RUN --html FILE` with no daemon, timed RUNS times (default 7); the median
# wall and CPU time (user + system: less moved by other work on a shared machine), and the sizes
# read and written.
#
#   bench/report.sh [RUNS]          (GPUPILOT_BIN=PATH: that binary, no build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${GPUPILOT_BIN:-}
if [[ -z $bin ]]; then
  cargo build --release -q -p gpupilot
  bin=$PWD/target/release/gpupilot
fi
runs=${1:-7}
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
python3 - "$home" "$runs" "$bin" <<'PY'
import json, os, random, resource, statistics, subprocess, sys, time
from datetime import datetime, timezone

home, runs, exe = sys.argv[1], int(sys.argv[2]), sys.argv[3]
random.seed(1)
T0 = 1_796_000_000.0            # 2026-11-30
SPAN = 24 * 3600.0
GPUS, RANKS, EVERY = 8, 8, 5.0

def at(t):
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

state = os.path.join(home, "state")
run_id = "20261130-000000-llm"
d = os.path.join(state, "runs", run_id)
os.makedirs(d)
per_gpu = [{"gpu": g, "energy_j": 650.0 * SPAN * random.uniform(0.9, 1.0)} for g in range(GPUS)]
energy_j = sum(g["energy_j"] for g in per_gpu)
kwh = energy_j / 3.6e6

# metrics.jsonl: every rank reports every EVERY seconds.
n = 0
with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    steps = int(SPAN / EVERY)
    for i in range(steps):
        t = T0 + i * EVERY
        for rank in range(RANKS):
            step_time = 0.5 + random.uniform(0, 0.05) + (0.1 if rank == 3 else 0.0)
            f.write(json.dumps({
                "n": n, "t": t + rank * 0.01, "from": "trainer", "rank": rank,
                "step": i * 10, "loss": 4.0 * 0.9999 ** i + random.uniform(0, 0.01),
                "samples_per_s": 256 / step_time, "step_time_s": step_time,
                "data_wait_s": random.uniform(0.0, 0.05), "batch_size": 256, "prefetch": 4,
                "lr": 3e-4,
            }) + "\n")
            n += 1
samples = int(steps * EVERY * 8 * 450)

events = [{"time": at(T0), "event": "created", "name": "llm", "command": ["python3", "train.py"],
           "cwd": "/work", "profile": None},
          {"time": at(T0), "event": "started", "attempt": 0, "pid": 4242, "start_time": 1,
           "own_session": True}]
for k, t in enumerate([3 * 3600, 9 * 3600, 15 * 3600]):
    events.append({"time": at(T0 + t), "event": "changed", "by": "alice", "what": "batch_size",
                   "old": str(256 * 2 ** k), "new": str(256 * 2 ** (k + 1)), "why": None})
for a, t in enumerate([6 * 3600, 18 * 3600], start=1):
    events.append({"time": at(T0 + t), "event": "exited", "attempt": a - 1, "pid": 4242,
                   "code": 1, "signal": None, "signal_name": None, "description": "exit 1",
                   "duration_s": 3600.0})
    events.append({"time": at(T0 + t + 10), "event": "restarted", "attempt": a, "pid": 5000 + a,
                   "start_time": 2, "own_session": True})
events.append({"time": at(T0 + SPAN), "event": "finished", "status": "succeeded",
               "description": "exit 0"})
with open(os.path.join(d, "events.jsonl"), "w") as f:
    for e in events:
        f.write(json.dumps(e) + "\n")

summary = {
    "id": run_id, "name": "llm", "status": "succeeded", "pid": 5002, "attempt": 2,
    "restarts": 2, "started_at": at(T0), "ended_at": at(T0 + SPAN), "duration_s": SPAN,
    "exit_code": 0, "signal": None, "signal_name": None, "description": "exit 0",
    "energy_j": energy_j, "samples": samples,
    "energy": {"energy_j": energy_j, "kwh": kwh, "per_gpu": per_gpu, "samples": samples,
               "j_per_sample": energy_j / samples, "cost": kwh * 0.21, "currency": "EUR",
               "source": "counter", "co2_g": kwh * 350, "pue": 1.4, "facility_kwh": kwh * 1.4,
               "facility_cost": kwh * 0.21 * 1.4, "facility_co2_g": kwh * 350 * 1.4},
}
json.dump(summary, open(os.path.join(d, "summary.json"), "w"))
json.dump({"argv": ["python3", "train.py"], "cwd": "/work",
           "env": {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(GPUS)))}},
          open(os.path.join(d, "launch.json"), "w"))

# The node's log: a few cap changes, and a governor stepping every 30 s on GPU 5 for 6 hours.
with open(os.path.join(state, "events.jsonl"), "w") as f:
    seq = 0
    for k in range(6):
        seq += 1
        f.write(json.dumps({"seq": seq, "time": at(T0 + 1800 + k * 7200), "event": "gpu_changed",
                            "gpu": k, "what": "power_limit", "old": "700 W", "new": "600 W",
                            "by": "alice", "why": None}) + "\n")
    for i in range(int(6 * 3600 / 30)):
        seq += 1
        f.write(json.dumps({"seq": seq, "time": at(T0 + 40000 + 30 * i), "event": "governor",
                            "gpu": 5, "change": "cap", "target_c": 80.0, "temperature_c": 82.0,
                            "old_w": 600.0, "new_w": 590.0, "by": "daemon",
                            "why": "hold 80 °C"}) + "\n")

env = dict(os.environ, GPUPILOT_HOME=home)
env.pop("GPUPILOT_SYSTEM", None)
out = os.path.join(home, "report.html")
times, cpus = [], []
for _ in range(runs):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([exe, "report", run_id, "--html", out], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    times.append(time.perf_counter() - t)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
size = lambda p: os.path.getsize(p) / 1e6
print(f"metrics.jsonl: {n} reports, {size(os.path.join(d, 'metrics.jsonl')):.1f} MB; "
      f"events: {len(events)}; node log: {seq} lines")
print(f"report.html: {size(out):.2f} MB")
print("wall (s): " + ", ".join(f"{x:.2f}" for x in times))
print("CPU (s):  " + ", ".join(f"{x:.2f}" for x in cpus))
print(f"median: {statistics.median(times):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
      f"over {runs} runs")
PY
