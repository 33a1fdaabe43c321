#!/usr/bin/env bash
# The console's first frame and resident size against a daemon that already has history.
#
#   bench/first-frame.sh [RUNS] [BINARY...]      (default 3 runs of target/release/gpupilot)
#
# A console that connects to a daemon which has run a while is sent its history (the last
# hour of each GPU's series) as well as the newest snapshot. This starts the console RUNS times
# per binary, binaries alternated, each in a fresh 200×50 tmux pane against the same daemon
# on the fake 8×H100 node, and prints for each: the time from the Enter that starts it to the
# first capture-pane showing a GPU name (polled every 10 ms), and its peak and current
# resident size 5 s later (when the history has come in).
#
# Environment: GPUPILOT_BENCH_HOME=DIR uses the daemon already running for that
# GPUPILOT_HOME (and the fake node state DIR.state); otherwise a daemon (the first BINARY's) is
# started here and given GPUPILOT_BENCH_HISTORY seconds (default 600) to gather history first.
set -euo pipefail

runs=${1:-3}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bins=("$@")
((${#bins[@]} > 0)) || bins=("$root/target/release/gpupilot")
command -v tmux >/dev/null || { echo "bench/first-frame.sh needs tmux" >&2; exit 1; }
[[ -f target/release/libnvidia_ml.so ]] || cargo build --release -p fake-nvml
lib=$root/target/release/libnvidia_ml.so
export FAKE_NVML_SCENARIO=$root/crates/fake-nvml/scenarios/8xh100.toml
sock=gpupilot-ff-$$
work=
cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    if [[ -n $work ]]; then
        [[ -s $work/home/run/daemon.lock ]] && kill "$(head -1 "$work/home/run/daemon.lock")" 2>/dev/null
        sleep 0.5
        rm -rf "$work"
    fi
}
trap cleanup EXIT

if [[ -n ${GPUPILOT_BENCH_HOME:-} ]]; then
    export GPUPILOT_HOME=$GPUPILOT_BENCH_HOME FAKE_NVML_STATE=$GPUPILOT_BENCH_HOME.state
else
    work=$(mktemp -d)
    export GPUPILOT_HOME=$work/home FAKE_NVML_STATE=$work/node.state
    "${bins[0]}" --source nvml --nvml-lib "$lib" daemon --detach >/dev/null
    history=${GPUPILOT_BENCH_HISTORY:-600}
    echo "letting the daemon gather ${history} s of history" >&2
    sleep "$history"
fi

now_ms() { date +%s%3N; }
for i in $(seq "$runs"); do
    for bin in "${bins[@]}"; do
        tmux -L "$sock" -f /dev/null new-session -d -s c -x 200 -y 50 \
            "env PS1='\$ ' TERM=xterm-256color LANG=C.UTF-8 bash --norc --noprofile"
        sleep 0.5
        tmux -L "$sock" send-keys -t c -l "exec $bin --source nvml --nvml-lib $lib --refresh 1"
        t0=$(now_ms)
        tmux -L "$sock" send-keys -t c Enter
        deadline=$((t0 + 20000))
        until tmux -L "$sock" capture-pane -p -t c | grep -q H100; do
            (($(now_ms) < deadline)) || { echo "no first frame within 20 s" >&2; exit 1; }
            sleep 0.01
        done
        first=$(($(now_ms) - t0))
        pid=$(tmux -L "$sock" display-message -p -t c '#{pane_pid}')
        sleep 5
        awk -v b="$bin" -v f="$first" '/^VmHWM:/ { h = $2 } /^VmRSS:/ { r = $2 }
            END { printf "%s run: first frame %d ms, peak RSS %.1f MiB, RSS %.1f MiB\n", b, f, h / 1024, r / 1024 }' \
            "/proc/$pid/status"
        tmux -L "$sock" send-keys -t c q
        sleep 1
        tmux -L "$sock" kill-server 2>/dev/null || true
    done
done
