#!/usr/bin/env bash
# Recordings: bytes per GPU-hour at 1 Hz, and the console's CPU replaying at 10×.
#
#   bench/recording.sh [MINUTES] [RUNS]        (default 5 minutes, 3 replays)
#
# A daemon at 1 Hz on the fake NVML's busy 8 × H100 node (crates/fake-nvml/scenarios/8xh100.toml,
# whose figures move every second) with the synthetic trainer as a run; `gpupilot record --for
# MINUTES` takes it, and the size is scaled to one GPU-hour (size × 3600 / (8 × seconds)). Then
# `gpupilot replay --speed 10` plays the file RUNS times in a 200×50 tmux pane: CPU seconds of
# the console (utime+stime of /proc/PID/stat) over the playback's wall time, the median of the
# runs. Needs tmux and release builds of gpupilot and fake-nvml (built here if missing);
# GPUPILOT_BENCH_BIN=PATH measures another gpupilot binary.
set -euo pipefail

minutes=${1:-5}
runs=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=$(mktemp -d)
sock=gpupilot-bench-rec-$$
bin=${GPUPILOT_BENCH_BIN:-$root/target/release/gpupilot}
cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    [[ -n ${GPUPILOT_HOME:-} ]] && "$bin" stop last --kill >/dev/null 2>&1 || true
    [[ -s $work/home/run/daemon.lock ]] && kill "$(head -1 "$work/home/run/daemon.lock")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

command -v tmux >/dev/null || { echo "bench/recording.sh needs tmux" >&2; exit 1; }
[[ -x $bin ]] || cargo build --release --bin gpupilot
[[ -f target/release/libnvidia_ml.so ]] || cargo build --release -p fake-nvml
lib=$root/target/release/libnvidia_ml.so
export FAKE_NVML_SCENARIO=$root/crates/fake-nvml/scenarios/8xh100.toml
export FAKE_NVML_STATE=$work/node.state
export GPUPILOT_HOME=$work/home
gp=("$bin" --source nvml --nvml-lib "$lib")

"${gp[@]}" daemon --detach --rate 1 >/dev/null
cat >"$work/synth.toml" <<EOF
name = "synth"
[run]
command = ["$bin", "synthetic-train", "--speed", "4"]
[knobs.batch_size]
initial = 256
min = 8
max = 4096
EOF
"${gp[@]}" run --detach "$work/synth.toml" >/dev/null
sleep 3

file=$work/node.gprec
"${gp[@]}" record --out "$file" --for "${minutes}m"
size=$(stat -c %s "$file")
per_gpu_hour=$(awk -v b="$size" -v m="$minutes" 'BEGIN { printf "%.0f", b * 3600 / (8 * m * 60) }')
echo "recording: $size bytes for $minutes min of 8 GPUs at 1 Hz = $per_gpu_hour bytes per GPU-hour"

clk_tck=$(getconf CLK_TCK)
play_s=$(awk -v m="$minutes" 'BEGIN { printf "%.1f", m * 60 / 10 }')
cpus=()
for ((i = 1; i <= runs; i++)); do
    tmux -L "$sock" -f /dev/null new-session -d -s r$i -x 200 -y 50 \
        "env TERM=xterm-256color LANG=C.UTF-8 $bin replay $file --speed 10; sleep 600"
    sleep 0.5
    pid=$(pgrep -P "$(tmux -L "$sock" display-message -p -t r$i '#{pane_pid}')" | head -1)
    t0=$(date +%s.%N)
    c0=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    until tmux -L "$sock" capture-pane -p -t r$i | grep -q 'ends at +'; do sleep 0.2; done
    t1=$(date +%s.%N)
    c1=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    cpu=$(awk -v a="$c0" -v b="$c1" -v t="$clk_tck" -v w0="$t0" -v w1="$t1" \
        'BEGIN { printf "%.1f", 100 * (b - a) / t / (w1 - w0) }')
    echo "replay $i at 10×: ${cpu}% of a core over $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s (playback ${play_s} s)"
    cpus+=("$cpu")
    tmux -L "$sock" kill-session -t r$i
done
median=$(printf '%s\n' "${cpus[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "replay at 10×: median ${median}% of a core over $runs runs"
