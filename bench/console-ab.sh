#!/usr/bin/env bash
# Two builds of the console side by side, to compare them on one node.
#
#   bench/console-ab.sh BINARY_A BINARY_B [SETTLE_SECONDS] [SECONDS]
#
# One daemon (BINARY_B's) samples the 8 fake H100s (crates/fake-nvml, scenarios/8xh100.toml,
# or the scenario GPUPILOT_BENCH_SCENARIO names);
# each binary's console runs in its own 200×50 tmux pane as its client, at a 1 s refresh, both
# at once, so both see the same data and the same noise from the rest of the machine. After
# SETTLE_SECONDS (default 100: the node warms up meanwhile) it measures each console's CPU
# (schedstat of all its threads, in ms per second) and the bytes it writes to its pane over
# SECONDS (default 90). Run it twice with the binaries swapped: a pane's position is not
# always neutral.
#
# Needs: tmux and a release build of fake-nvml (built here if missing).
set -euo pipefail

[[ $# -ge 2 ]] || {
    sed -n '2,14p' "$0" >&2
    exit 2
}
a=$(realpath "$1")
b=$(realpath "$2")
settle=${3:-100}
secs=${4:-90}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v tmux >/dev/null || { echo "bench/console-ab.sh needs tmux" >&2; exit 1; }
[[ -f target/release/libnvidia_ml.so ]] || cargo build --release -p fake-nvml
lib=$root/target/release/libnvidia_ml.so
work=$(mktemp -d)
sock=gpupilot-ab-$$
export FAKE_NVML_SCENARIO=${GPUPILOT_BENCH_SCENARIO:-$root/crates/fake-nvml/scenarios/8xh100.toml}
export FAKE_NVML_STATE=$work/node.state
export GPUPILOT_HOME=$work/home

cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    if [[ -f $work/home/run/daemon.lock ]]; then
        kill "$(head -1 "$work/home/run/daemon.lock")" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$b" --source nvml --nvml-lib "$lib" daemon --detach >/dev/null
for s in a b; do
    bin=$a
    [[ $s == b ]] && bin=$b
    tmux -L "$sock" -f /dev/null new-session -d -x 200 -y 50 -s "$s" \
        "env TERM=xterm-256color $bin --source nvml --nvml-lib $lib"
    tmux -L "$sock" pipe-pane -o -t "$s" "cat >> $work/$s.bytes"
done
sleep "$settle"

cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }
declare -A pid bytes0 cpu0
for s in a b; do
    pid[$s]=$(tmux -L "$sock" display-message -p -t "$s" '#{pane_pid}')
    bytes0[$s]=$(stat -c %s "$work/$s.bytes")
    cpu0[$s]=$(cpu_ns "${pid[$s]}")
done
sleep "$secs"
for s in a b; do
    bin=$a
    [[ $s == b ]] && bin=$b
    bytes1=$(stat -c %s "$work/$s.bytes")
    cpu1=$(cpu_ns "${pid[$s]}")
    awk -v n="$s" -v bin="$bin" -v c0="${cpu0[$s]}" -v c1="$cpu1" -v b0="${bytes0[$s]}" \
        -v b1="$bytes1" -v t="$secs" \
        'BEGIN { printf "%s: %s  console %.3f ms/s  %d bytes/s\n", n, bin, (c1 - c0) / 1e6 / t, (b1 - b0) / t }'
done
