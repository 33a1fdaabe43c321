#!/usr/bin/env bash
# Instruction profile of the console and its daemon (BENCHMARKS.md, "The console against nvtop
# and nvitop on a busy node"): both under valgrind's callgrind for SECONDS (default 60) on 8
# fake H100s, the console in a 200x50 tmux pane. Writes bench/out/prof/{console,daemon}.cg; read them with
# `callgrind_annotate --inclusive=yes FILE`. GPUPILOT_BENCH_BIN=PATH profiles another gpupilot
# binary (built here otherwise). Last, the console's instructions per sparkline drawn: 32 a
# frame on this node (8 GPUs, 4 meters each), so a figure per frame that does not depend on
# how many frames the run drew.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
secs=${1:-60}
out=$root/bench/out/prof
rm -rf "$out" && mkdir -p "$out/home"
command -v valgrind >/dev/null || { echo "bench/profile.sh needs valgrind" >&2; exit 1; }
bin=${GPUPILOT_BENCH_BIN:-$root/target/release/gpupilot}
[[ -n ${GPUPILOT_BENCH_BIN:-} ]] || cargo build --release -q -p gpupilot --bin gpupilot
cargo build --release -q -p fake-nvml
export GPUPILOT_HOME=$out/home FAKE_NVML_SCENARIO=$root/crates/fake-nvml/scenarios/8xh100.toml
export FAKE_NVML_STATE=$out/node.state
lib=$root/target/release/libnvidia_ml.so
sock=gpupilot-prof-$$
valgrind --tool=callgrind --callgrind-out-file="$out/daemon.cg" "$bin" --source nvml --nvml-lib "$lib" daemon >"$out/daemon.log" 2>&1 &
daemon=$!
trap 'tmux -L "$sock" kill-server 2>/dev/null || true; kill -s TERM "$daemon" 2>/dev/null || true' EXIT
sleep 8
tmux -L "$sock" -f /dev/null new-session -d -x 200 -y 50 -s p \
    "env GPUPILOT_HOME=$GPUPILOT_HOME FAKE_NVML_SCENARIO=$FAKE_NVML_SCENARIO FAKE_NVML_STATE=$FAKE_NVML_STATE TERM=xterm-256color valgrind --tool=callgrind --callgrind-out-file=$out/console.cg $bin --source nvml --nvml-lib $lib; sleep 5"
sleep "$secs"
tmux -L "$sock" send-keys -t p q
sleep 8
kill -s TERM "$daemon"
wait "$daemon" || true
for f in console daemon; do
    echo "== $f"
    # awk reads all of what callgrind_annotate writes (`grep -m` would break its pipe, and
    # pipefail end the script).
    callgrind_annotate --inclusive=yes "$out/$f.cg" 2>/dev/null |
        awk '/^ *[0-9,]+ / && n < 12 { print; n++ }'
done
total=$(callgrind_annotate "$out/console.cg" 2>/dev/null |
    awk '!t && /PROGRAM TOTALS/ { t = $1; gsub(",", "", t) } END { print t + 0 }')
# The calls of take_bars, as the caller tree counts them.
bars=$(callgrind_annotate --tree=calling "$out/console.cg" 2>/dev/null | awk '
    !n && />.*screen::take_bars/ && match($0, /\([0-9,]+x\)/) {
        n = substr($0, RSTART + 1, RLENGTH - 3); gsub(",", "", n)
    } END { print n + 0 }')
if [[ -n $bars && $bars -gt 0 ]]; then
    echo "console: $total instructions, $bars sparklines drawn: $((total / bars)) a sparkline"
fi
