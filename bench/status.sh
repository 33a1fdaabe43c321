#!/usr/bin/env bash
# Wall time of a one-shot status on 8 fake GPUs, gpupilot against gpustat (BENCHMARKS.md,
# "status"). Needs hyperfine (apt) and gpustat (.venv, as .ci/run installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p gpupilot -p fake-nvml
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ln -s "$PWD/target/release/libnvidia_ml.so" "$dir/libnvidia-ml.so.1"
export FAKE_NVML_SCENARIO=crates/fake-nvml/scenarios/8xh100.toml FAKE_NVML_STATE="$dir/state"
export LD_LIBRARY_PATH="$dir"
gpustat=${GPUSTAT:-.venv/bin/gpustat}
hyperfine -N --warmup 3 --runs "${RUNS:-20}" --style basic --export-json "$dir/status.json" \
  -n "gpupilot status (sim)" "target/release/gpupilot status --source sim --gpus 8" \
  -n "gpupilot status (fake NVML)" "target/release/gpupilot status --source nvml --nvml-lib $dir/libnvidia-ml.so.1" \
  -n "gpupilot status --json (fake NVML)" "target/release/gpupilot status --json --source nvml --nvml-lib $dir/libnvidia-ml.so.1" \
  -n "gpustat (fake NVML)" "$gpustat" \
  -n "gpustat --json (fake NVML)" "$gpustat --json"
# Medians (this machine is shared and noisy), with the CPU each command used.
python3 - "$dir/status.json" <<'PY'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))["results"]
print("| command | median wall ms | mean user ms | mean system ms |")
print("|---|---:|---:|---:|")
for r in rows:
    print(f"| {r['command']} | {statistics.median(r['times'])*1e3:.1f} | {r['user']*1e3:.1f} | {r['system']*1e3:.1f} |")
PY
