#!/usr/bin/env bash
# Two builds of gpupilot as a user runs them (a console and the daemon it starts), side by
# side with nvtop, to compare their CPU on one node.
#
#   bench/pair-ab.sh BINARY_A BINARY_B [SETTLE_SECONDS] [SECONDS]
#
# Each binary's console runs in its own 200×50 tmux pane at a 1 s refresh, with a home of its
# own, so each starts its own daemon; nvtop (`-d 10`) runs in a third pane. All three read the
# same 8 fake H100s (crates/fake-nvml, scenarios/8xh100.toml, a busy node, or the scenario
# GPUPILOT_BENCH_SCENARIO names) at the same time, so they see the same data and the same
# noise from the rest of the machine. After SETTLE_SECONDS (default 20) it measures each
# process's CPU (schedstat of all its threads) over SECONDS (default 60), in microseconds per
# second, and prints one line. Run it twice with the binaries swapped.
#
# With GPUPILOT_BENCH_THREADS=1 it also prints each console's and daemon's threads over the
# same window: µs of CPU per second and runs per second (a run is a wake-up, or a return after
# preemption), from each thread's schedstat; a thread that ends in between is left out.
#
# Needs: tmux, nvtop, and a release build of fake-nvml (built here if missing).
set -euo pipefail

[[ $# -ge 2 ]] || {
    sed -n '2,19p' "$0" >&2
    exit 2
}
a=$(realpath "$1")
b=$(realpath "$2")
settle=${3:-20}
secs=${4:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v tmux >/dev/null || { echo "bench/pair-ab.sh needs tmux" >&2; exit 1; }
command -v nvtop >/dev/null || { echo "bench/pair-ab.sh needs nvtop" >&2; exit 1; }
[[ -f target/release/libnvidia_ml.so ]] || cargo build --release -p fake-nvml
lib=$root/target/release/libnvidia_ml.so
work=$(mktemp -d)
sock=gpupilot-pair-$$
export FAKE_NVML_SCENARIO=${GPUPILOT_BENCH_SCENARIO:-$root/crates/fake-nvml/scenarios/8xh100.toml}
export FAKE_NVML_STATE=$work/node.state

daemon_of() { # the daemon whose lock is in home $1
    local lock=$work/$1/run/daemon.lock
    [[ -f $lock ]] && head -1 "$lock"
}
cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    local d pids=()
    for h in a b; do
        d=$(daemon_of "$h" || true)
        [[ -n $d ]] && kill "$d" 2>/dev/null && pids+=("$d")
    done
    # A daemon writes its state as it stops: let it finish (5 s at most) before the home goes.
    for _ in $(seq 50); do
        local alive=0
        for d in "${pids[@]}"; do kill -0 "$d" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    rm -rf "$work"
}
trap cleanup EXIT

for h in a b; do
    bin=$a
    [[ $h == b ]] && bin=$b
    tmux -L "$sock" new-session -d -x 200 -y 50 -s "$h" \
        "GPUPILOT_HOME=$work/$h exec $bin --source nvml --nvml-lib $lib --refresh 1"
done
tmux -L "$sock" new-session -d -x 200 -y 50 -s n "exec $root/bench/peers/with-fake-nvml.sh nvtop -d 10"
sleep "$settle"

pane() { tmux -L "$sock" list-panes -t "$1" -F '#{pane_pid}'; }
ca=$(pane a)
cb=$(pane b)
nv=$(pane n)
da=$(daemon_of a) || { echo "console A started no daemon" >&2; exit 1; }
db=$(daemon_of b) || { echo "console B started no daemon" >&2; exit 1; }
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }
# One line per thread of consoles and daemons A and B: "A-console|…:tid:name cpu_ns runs".
threads() {
    local who p t ns runs name
    for who in A-console:$ca A-daemon:$da B-console:$cb B-daemon:$db; do
        p=${who#*:}
        who=${who%%:*}
        for t in /proc/"$p"/task/*; do
            # A thread may end while it is read: left out.
            { read -r ns _ runs <"$t/schedstat" && name=$(tr ' ' _ <"$t/comm"); } 2>/dev/null ||
                continue
            echo "$who:${t##*/}:$name $ns $runs"
        done
    done | sort
}
per_thread=${GPUPILOT_BENCH_THREADS:-}
[[ -z $per_thread ]] || threads >"$work/threads-before"
declare -A before
for p in "$ca" "$da" "$cb" "$db" "$nv"; do before[$p]=$(cpu_ns "$p"); done
sleep "$secs"
[[ -z $per_thread ]] || threads >"$work/threads-after"
us() { echo $((($(cpu_ns "$1") - before[$1]) / secs / 1000)); }
ua=$(us "$ca") uda=$(us "$da") ub=$(us "$cb") udb=$(us "$db") un=$(us "$nv")
echo "A $a: console $ua, daemon $uda, together $((ua + uda)) us/s"
echo "B $b: console $ub, daemon $udb, together $((ub + udb)) us/s"
echo "nvtop: $un us/s"
awk -v a=$((ua + uda)) -v b=$((ub + udb)) -v n="$un" \
    'BEGIN { printf "against nvtop: A %.2f, B %.2f; B/A %.2f\n", a / n, b / n, b / a }'
[[ -z $per_thread ]] && exit 0
echo "each process's threads over $secs s:"
join "$work/threads-before" "$work/threads-after" | awk -v s="$secs" '{
    split($1, k, ":"); us = ($4 - $2) / s / 1000; runs = ($5 - $3) / s
    printf "%-9s %-18s %8.1f us/s %6.2f runs/s\n", k[1], k[3], us, runs
    tot[k[1]] += us; wk[k[1]] += runs
} END { for (w in tot) printf "%-9s total              %8.1f us/s %6.2f runs/s\n", w, tot[w], wk[w] }' | sort -s -k1,1
