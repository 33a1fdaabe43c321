#!/usr/bin/env bash
# Instruction profile of the console and its daemon (BENCHMARKS.md, "The console against nvtop
# and nvitop on a busy node"): both under valgrind's callgrind for SECONDS (default 60) on 8
# fake H100s, the console in a 200x50 tmux pane, nvtop (`-d 10`) beside them under callgrind
# too, on the same node. After GPUPILOT_BENCH_SETTLE seconds (default 20: start-up and the
# first frames) every count is zeroed; at the end the steady part is dumped to
# bench/out/prof/{console,daemon,nvtop}.cg.1 (what start-up and shutdown cost is in the
# files without `.1`); read them with `callgrind_annotate --inclusive=yes FILE`.
# GPUPILOT_BENCH_BIN=PATH profiles another gpupilot binary (built here otherwise).
#
# It prints, for the steady part: the top of each gpupilot profile; the console's instructions
# per sparkline drawn (32 a frame on this node: 8 GPUs, 4 meters each), a figure per frame that
# does not depend on how many frames the run drew; and the three programs' instructions a
# second, with how many of them the fake NVML library accounts for (its simulation of the
# node, which every process that loads it runs).
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
peer=0
if command -v nvtop >/dev/null; then
    tmux -L "$sock" -f /dev/null new-session -d -x 200 -y 50 -s n \
        "env FAKE_NVML_SCENARIO=$FAKE_NVML_SCENARIO FAKE_NVML_STATE=$FAKE_NVML_STATE TERM=xterm-256color $root/bench/peers/with-fake-nvml.sh valgrind --tool=callgrind --callgrind-out-file=$out/nvtop.cg nvtop -d 10; sleep 5"
    peer=1
fi
settle=${GPUPILOT_BENCH_SETTLE:-20}
((settle < secs)) || { echo "GPUPILOT_BENCH_SETTLE must be under SECONDS" >&2; exit 2; }
sleep "$settle"
# Every callgrind process of this user: run nothing else under it meanwhile.
callgrind_control -z >/dev/null 2>&1
sleep "$((secs - settle))"
callgrind_control -d >/dev/null 2>&1
sleep 2
tmux -L "$sock" send-keys -t p q
((peer == 0)) || tmux -L "$sock" send-keys -t n q
sleep 8
kill -s TERM "$daemon"
wait "$daemon" || true
for f in console daemon; do
    echo "== $f"
    # awk reads all of what callgrind_annotate writes (`grep -m` would break its pipe, and
    # pipefail end the script).
    callgrind_annotate --inclusive=yes "$out/$f.cg.1" 2>/dev/null |
        awk '/^ *[0-9,]+ / && n < 12 { print; n++ }'
done
total=$(callgrind_annotate "$out/console.cg.1" 2>/dev/null |
    awk '!t && /PROGRAM TOTALS/ { t = $1; gsub(",", "", t) } END { print t + 0 }')
# The calls of take_bars, as the caller tree counts them.
bars=$(callgrind_annotate --tree=calling --threshold=100 "$out/console.cg.1" 2>/dev/null | awk '
    !n && />.*screen::take_bars/ && match($0, /\([0-9,]+x\)/) {
        n = substr($0, RSTART + 1, RLENGTH - 3); gsub(",", "", n)
    } END { print n + 0 }')
if [[ -n $bars && $bars -gt 0 ]]; then
    echo "console: $total instructions, $bars sparklines drawn: $((total / bars)) a sparkline"
fi

# Steady state: the counts dumped after the zeroing, per second, and the fake library's part.
steady=$((secs - settle))
echo
echo "steady state ($steady s after a ${settle} s settle), instructions a second:"
for f in console daemon nvtop; do
    [[ -f $out/$f.cg.1 ]] || continue
    # Self costs by object file, from callgrind's own format: a cost line belongs to the
    # current `ob=` (each name is given once, by `ob=` or `cob=`), except the line after
    # `calls=` (that call's inclusive cost).
    awk -v f="$f" -v s="$steady" '
        /^c?ob=/ { id = $1; sub(/^c?ob=/, "", id); if (NF > 1) { name[id] = $2 } }
        /^ob=/ { ob = name[id]; next }
        /^calls=/ { skip = 1; next }
        /^[0-9+*-]/ { if (skip) { skip = 0; next } c = $NF; total += c; if (ob ~ /libnvidia_ml\.so$/) lib += c; next }
        END { printf "  %-8s %10.0f   of which the fake NVML library %10.0f (%2.0f %%)\n", f, total / s, lib / s, total ? 100 * lib / total : 0 }
    ' "$out/$f.cg.1"
done
