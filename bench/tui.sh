#!/usr/bin/env bash
# The console against nvtop and nvitop, side by side, on the same 8 simulated H100s (fake NVML).
#
#   bench/tui.sh [SECONDS]          (default 60)
#
# Each program runs in its own 200×50 tmux pane at the same refresh, at the same time, for
# SECONDS. For each: CPU seconds (utime+stime from /proc/PID/stat, all threads; the steady
# figure from the threads' schedstat, in ns), peak RSS
# (VmHWM), bytes written to the terminal (tmux pipe-pane), and time to first frame (from the
# Enter that starts it to the first capture-pane that shows a GPU name, polled every 10 ms).
#
# The node is crates/fake-nvml/scenarios/8xh100.toml: eight H100s training under its
# [activity], so utilization, power, clocks, temperature and PCIe move every second.
#
# Needs: tmux, nvtop, release builds of gpupilot and fake-nvml (built here if missing); nvitop
# in .venv (.ci/run installs it) is measured when it is there.
# Environment: GPUPILOT_BENCH_SOURCE=sim measures `gpupilot demo --gpus 8` instead of the NVML
# path; GPUPILOT_BENCH_WARMUP=SECONDS (default 120) lets the shared node reach steady training
# temperatures before any program starts; GPUPILOT_BENCH_SETTLE=SECONDS (default 5) is
# where the steady-state columns start counting; GPUPILOT_BENCH_REFRESH=SECONDS (default 1, a
# whole number) is every program's refresh (gpupilot --refresh, nvtop -d in tenths, nvitop
# --interval); GPUPILOT_BENCH_BIN=PATH measures another gpupilot binary;
# GPUPILOT_BENCH_SCENARIO=FILE another fake-NVML scenario. Results: a table on
# stdout and bench/out/tui-<time>.json.
set -euo pipefail

secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scenario=${GPUPILOT_BENCH_SCENARIO:-$root/crates/fake-nvml/scenarios/8xh100.toml}
out=$root/bench/out
mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
work=$(mktemp -d)
sock=gpupilot-bench-$$

cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    # The daemon the console started outlives its terminal (by design): stop it, or it goes on
    # sampling and loads the next run's measurements.
    local lock=$work/home/run/daemon.lock d
    if [[ -s $lock ]]; then
        d=$(head -1 "$lock")
        kill "$d" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$d" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT

command -v tmux >/dev/null || { echo "bench/tui.sh needs tmux" >&2; exit 1; }
command -v nvtop >/dev/null || { echo "bench/tui.sh needs nvtop (Debian contrib)" >&2; exit 1; }
refresh=${GPUPILOT_BENCH_REFRESH:-1}
[[ $refresh =~ ^[1-9][0-9]*$ ]] || { echo "GPUPILOT_BENCH_REFRESH must be a whole number of seconds" >&2; exit 2; }
bin=${GPUPILOT_BENCH_BIN:-$root/target/release/gpupilot}
[[ -x $bin ]] || cargo build --release --bin gpupilot
[[ -f target/release/libnvidia_ml.so ]] || cargo build --release -p fake-nvml
lib=$root/target/release/libnvidia_ml.so

# A fresh shared node for this run, so both programs read the same GPUs from the same start.
export FAKE_NVML_SCENARIO=$scenario
export FAKE_NVML_STATE=$work/node.state
export GPUPILOT_HOME=$work/home

# Let the node warm up first (GPUPILOT_BENCH_WARMUP seconds, default 120): a cold node's
# temperatures climb for minutes, and a busy node in steady training is what is compared.
warmup=${GPUPILOT_BENCH_WARMUP:-120}
if ((warmup > 0)); then
    "$bin" --source nvml --nvml-lib "$lib" status >/dev/null
    echo "warming the simulated node up for ${warmup} s" >&2
    sleep "$warmup"
fi

if [[ ${GPUPILOT_BENCH_SOURCE:-nvml} == sim ]]; then
    gp_cmd="exec $bin demo --gpus 8 --refresh $refresh"
    gp_label="gpupilot demo --gpus 8 (simulator in-process)"
else
    gp_cmd="exec $bin --source nvml --nvml-lib $lib --refresh $refresh"
    gp_label="gpupilot --refresh $refresh"
fi
nv_cmd="exec $root/bench/peers/with-fake-nvml.sh nvtop -d $((refresh * 10))"
nv_label="nvtop -d $((refresh * 10))"
programs=(gp nv)
if [[ -x $root/.venv/bin/nvitop ]]; then
    vi_cmd="exec $root/bench/peers/with-fake-nvml.sh $root/.venv/bin/nvitop --interval $refresh"
    vi_label="nvitop --interval $refresh"
    programs+=(vi)
fi

clk_tck=$(getconf CLK_TCK)
now_ms() { date +%s%3N; }
cpu_s() { awk -v t="$clk_tck" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
hwm_kb() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }
# Nanosecond CPU time of the live threads (schedstat), for the steady-state figure: the
# tick-based stat counters are too coarse for a program that uses a fraction of a percent.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }

start_pane() { # name
    tmux -L "$sock" -f /dev/null new-session -d -s "$1" -x 200 -y 50 \
        "env PS1='\$ ' TERM=xterm-256color LANG=C.UTF-8 bash --norc --noprofile"
    tmux -L "$sock" pipe-pane -o -t "$1" "cat >> $work/$1.bytes"
}

# Start them all, then wait for each one's first frame (a GPU name on screen).
for s in "${programs[@]}"; do
    start_pane "$s"
done
sleep 0.5
declare -A t0 first pid
for s in "${programs[@]}"; do
    : >"$work/$s.bytes"
    cmd_var=${s}_cmd
    tmux -L "$sock" send-keys -t "$s" -l "${!cmd_var}"
done
for s in "${programs[@]}"; do
    t0[$s]=$(now_ms)
    tmux -L "$sock" send-keys -t "$s" Enter
done
deadline=$(($(now_ms) + 20000))
waiting=("${programs[@]}")
while ((${#waiting[@]} > 0)); do
    left=()
    for s in "${waiting[@]}"; do
        # nvitop at 200 columns leaves the names out: its first memory figure is the mark.
        if tmux -L "$sock" capture-pane -p -t "$s" | grep -q -e 'H100' -e 'GiB / 79'; then
            first[$s]=$(($(now_ms) - t0[$s]))
        else
            left+=("$s")
        fi
    done
    waiting=("${left[@]}")
    (($(now_ms) < deadline)) || { echo "no first frame within 20 s from: ${waiting[*]}" >&2; for s in "${waiting[@]}"; do tmux -L "$sock" capture-pane -p -t "$s"; done; exit 1; }
    sleep 0.01
done
for s in "${programs[@]}"; do
    pid[$s]=$(tmux -L "$sock" display-message -p -t "$s" '#{pane_pid}')
done
# The console started a daemon (the sampler lives there): its CPU counts for gpupilot too.
keys=("${programs[@]}")
lockfile=$GPUPILOT_HOME/run/daemon.lock
if [[ -s $lockfile ]]; then
    pid[dm]=$(head -1 "$lockfile")
    keys+=(dm)
fi

# Start-up (and the first full frame) is over after a few seconds: steady-state figures are
# taken from there to the end.
settle=${GPUPILOT_BENCH_SETTLE:-5}
sleep "$settle"
declare -A cpu0 cpu1 bytes0 cpu hwm bytes
bytes[dm]=0
bytes0[dm]=0
first[dm]=0
for s in "${keys[@]}"; do
    cpu0[$s]=$(cpu_ns "${pid[$s]}")
    [[ $s == dm ]] || bytes0[$s]=$(stat -c %s "$work/$s.bytes")
done
sleep "$((secs - settle))"
for s in "${keys[@]}"; do
    cpu1[$s]=$(cpu_ns "${pid[$s]}")
    cpu[$s]=$(cpu_s "${pid[$s]}")
    hwm[$s]=$(hwm_kb "${pid[$s]}")
    [[ $s == dm ]] || bytes[$s]=$(stat -c %s "$work/$s.bytes")
done
for s in "${programs[@]}"; do
    tmux -L "$sock" send-keys -t "$s" q
done

steady=$((secs - settle))
row() { # label key
    local s=$2
    awk -v l="$1" -v c="${cpu[$s]}" -v c0="${cpu0[$s]}" -v c1="${cpu1[$s]}" -v st="$steady" \
        -v h="${hwm[$s]}" -v b="${bytes[$s]}" -v b0="${bytes0[$s]}" -v f="${first[$s]}" 'BEGIN {
        printf "| %-44s | %6.2f s | %6.3f %% | %6.1f MiB | %8d B | %6.0f B/s | %5d ms |\n",
            l, c, 100 * (c1 - c0) / 1e9 / st, h / 1024, b, (b - b0) / st, f }'
}
echo
echo "8 simulated H100s, busy (node warmed ${warmup} s), 200x50 tmux panes, ${refresh} s refresh, ${secs} s, all at once ($(nproc) cores)"
echo "| program | CPU total | CPU after ${settle} s (of a core) | peak RSS | to terminal | rate after ${settle} s | first frame |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
row "$gp_label" gp
if [[ -n ${pid[dm]:-} ]]; then
    row "  its daemon (sampling, history)" dm
    kill -s TERM "${pid[dm]}" 2>/dev/null || true
fi
row "$nv_label" nv
[[ -z ${pid[vi]:-} ]] || row "$vi_label" vi

gp_ns=$((cpu1[gp] - cpu0[gp] + ${cpu1[dm]:-0} - ${cpu0[dm]:-0}))
awk -v g="$gp_ns" -v n="$((cpu1[nv] - cpu0[nv]))" -v gb="$((bytes[gp] - bytes0[gp]))" -v nb="$((bytes[nv] - bytes0[nv]))" 'BEGIN {
    printf "\ngpupilot (console + daemon) against nvtop after the settle: CPU %.2f, bytes %.2f\n", g / n, gb / nb }'

json=$out/tui-$stamp.json
cat >"$json" <<EOF
{"seconds": $secs, "warmup_s": $warmup, "cores": $(nproc), "size": "200x50", "refresh_s": $refresh,
 "settle_s": $settle,
 "gpupilot": {"command": "$gp_label", "cpu_s": ${cpu[gp]}, "steady_cpu_ns": $((cpu1[gp] - cpu0[gp])), "peak_rss_kb": ${hwm[gp]}, "bytes": ${bytes[gp]}, "bytes_at_settle": ${bytes0[gp]}, "first_frame_ms": ${first[gp]}},
 "daemon": {"cpu_s": ${cpu[dm]:-0}, "steady_cpu_ns": $(( ${cpu1[dm]:-0} - ${cpu0[dm]:-0} )), "peak_rss_kb": ${hwm[dm]:-0}},
 "nvtop": {"command": "$nv_label", "cpu_s": ${cpu[nv]}, "steady_cpu_ns": $((cpu1[nv] - cpu0[nv])), "peak_rss_kb": ${hwm[nv]}, "bytes": ${bytes[nv]}, "bytes_at_settle": ${bytes0[nv]}, "first_frame_ms": ${first[nv]}},
 "nvitop": $(if [[ -n ${pid[vi]:-} ]]; then echo "{\"command\": \"$vi_label\", \"cpu_s\": ${cpu[vi]}, \"steady_cpu_ns\": $((cpu1[vi] - cpu0[vi])), \"peak_rss_kb\": ${hwm[vi]}, \"bytes\": ${bytes[vi]}, \"bytes_at_settle\": ${bytes0[vi]}, \"first_frame_ms\": ${first[vi]}}"; else echo null; fi)}
EOF
echo
echo "(CPU total and bytes include start-up and the first full frame; first frame is measured through tmux, polling every 10 ms)"
echo "wrote $json"
