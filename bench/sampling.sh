#!/usr/bin/env bash
# Sampling cost and history memory (BENCHMARKS.md, "Sampling" and "History").
#   bench/sampling.sh [RUNS] [SECONDS]
# Samples 8 GPUs at 10 Hz through the simulator and through the fake NVML library (8 × H100),
# both on a busy node whose load moves every second (the simulator with gpusim's default
# Activity, the library on scenarios/8xh100.toml, which has the same [activity]), printing CPU
# seconds per wall second of the sampling process; then fills 8 GPUs × 7 days of history and
# prints its memory. Builds into CARGO_TARGET_DIR when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
secs=${2:-20}
cargo build --release -q -p fake-nvml
cargo bench -q --no-run --bench sampling --bench history
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$PWD/$target ;; esac
ln -s "$target/release/libnvidia_ml.so" "$dir/libnvidia-ml.so.1"
for _ in $(seq "$runs"); do
  cargo bench -q --bench sampling -- sim "$secs" 10 8
  FAKE_NVML_SCENARIO=crates/fake-nvml/scenarios/8xh100.toml FAKE_NVML_STATE="$dir/state" \
    GPUPILOT_NVML_LIB="$dir/libnvidia-ml.so.1" cargo bench -q --bench sampling -- nvml "$secs" 10 8
done
cargo bench -q --bench history
