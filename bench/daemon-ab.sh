#!/usr/bin/env bash
# Two builds' daemons side by side, to compare their CPU on one node.
#
#   bench/daemon-ab.sh BINARY_A BINARY_B [SECONDS]
#
# Both daemons sample the same fake node (crates/fake-nvml, scenarios/8xh100.toml, or
# GPUPILOT_BENCH_SCENARIO) at their default 1 Hz, each with a home of its own and no client,
# at the same time, so both see the same data and the same noise from the rest of the machine.
# After 30 s it measures each daemon's CPU (schedstat of all its threads) over SECONDS
# (default 90), in microseconds per second.
#
# Needs: a release build of fake-nvml (built here if missing).
set -euo pipefail

[[ $# -ge 2 ]] || {
    sed -n '2,11p' "$0" >&2
    exit 2
}
root=$(cd "$(dirname "$0")/.." && pwd)
a_bin=$1
b_bin=$2
secs=${3:-90}
[[ -f $root/target/release/libnvidia_ml.so ]] || cargo build --release -p fake-nvml
lib=$root/target/release/libnvidia_ml.so
work=$(mktemp -d)
export FAKE_NVML_SCENARIO=${GPUPILOT_BENCH_SCENARIO:-$root/crates/fake-nvml/scenarios/8xh100.toml}
export FAKE_NVML_STATE=$work/node.state
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }

GPUPILOT_HOME=$work/a "$a_bin" --source nvml --nvml-lib "$lib" daemon >"$work/a.log" 2>&1 &
a=$!
GPUPILOT_HOME=$work/b "$b_bin" --source nvml --nvml-lib "$lib" daemon >"$work/b.log" 2>&1 &
b=$!
trap 'kill "$a" "$b" 2>/dev/null || true; rm -rf "$work"' EXIT
sleep 30
a0=$(cpu_ns "$a")
b0=$(cpu_ns "$b")
sleep "$secs"
a1=$(cpu_ns "$a")
b1=$(cpu_ns "$b")
echo "a: $a_bin  daemon $(((a1 - a0) / secs / 1000)) us/s"
echo "b: $b_bin  daemon $(((b1 - b0) / secs / 1000)) us/s"
