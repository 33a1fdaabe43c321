#!/usr/bin/env bash
# The soak: a run that prints a counter (a line every 50 ms, then exits 3) while its daemon is
# killed with SIGKILL and started again DAEMON_KILLS times and consoles are killed CONSOLE_KILLS
# times, on four fake NVML GPUs (their energy counters live in a state file, so they go on
# while no daemon runs, as a real GPU's do). Then it counts: counter lines lost or doubled,
# runs lost, whether the exit code is known, and the run's energy against the GPUs' own
# counters over the run's life (BENCHMARKS.md, "Soak").
#
#   bench/soak.sh                          # 20 daemon kills, 100 console kills (release build)
#   DAEMON_KILLS=5 CONSOLE_KILLS=20 BIN=target/debug/gpupilot bench/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DAEMON_KILLS=${DAEMON_KILLS:-20}
CONSOLE_KILLS=${CONSOLE_KILLS:-100}
LINES=${LINES_WANTED:-800}
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p gpupilot -p fake-nvml
  BIN=target/release/gpupilot
  LIB=target/release/libnvidia_ml.so
else
  cargo build -q -p fake-nvml
  LIB=${LIB:-target/debug/libnvidia_ml.so}
fi
BIN=$(realpath "$BIN")
dir=$(mktemp -d)
daemon_pid=
cleanup() {
  [ -n "$daemon_pid" ] && kill -9 "$daemon_pid" 2>/dev/null || true
  pkill -9 -f "soak-counter-$$" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ln -s "$(realpath "$LIB")" "$dir/libnvidia-ml.so.1"
export GPUPILOT_HOME="$dir/home" FAKE_NVML_SCENARIO=crates/fake-nvml/scenarios/default-4xh100.toml
export FAKE_NVML_STATE="$dir/nvml-state" GPUPILOT_SOURCE=nvml GPUPILOT_NVML_LIB="$dir/libnvidia-ml.so.1"
mkdir -p "$GPUPILOT_HOME"

start_daemon() {
  "$BIN" daemon --metrics-addr off >>"$dir/daemon.out" 2>&1 &
  daemon_pid=$!
  disown "$daemon_pid"
  for _ in $(seq 100); do
    "$BIN" status --json >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "the daemon did not answer" >&2
  exit 1
}

# Total energy of GPUs 0 and 1 in joules, from the fake library's own counters.
gpu_energy() {
  "$BIN" status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(sum(g["energy_j"] for g in s["gpus"] if g["index"] in (0, 1)))'
}

cat >"$dir/soak.toml" <<EOF
name = "soak"
[run]
command = ["sh", "-c", "i=0; while [ \$i -lt $LINES ]; do i=\$((i+1)); echo \$i; sleep 0.05; done; exit 3", "soak-counter-$$"]
gpus = [0, 1]
EOF

start_daemon
run=$("$BIN" run --detach "$dir/soak.toml")
e0=$(gpu_energy)
t0=$(date +%s.%N)

# Consoles started and killed while everything else goes on.
(
  for _ in $(seq "$CONSOLE_KILLS"); do
    TERM=xterm-256color timeout -s KILL 0.4 script -qfec "$BIN console" /dev/null >/dev/null 2>&1 || true
  done
) &
consoles=$!

# The daemon killed and started again, spread over the run's life.
run_s=$(python3 -c "print($LINES * 0.055)")
gap=$(python3 -c "print(max(0.3, 0.85 * $run_s / $DAEMON_KILLS))")
kill_daemon() {
  kill -9 "$daemon_pid"
  while kill -0 "$daemon_pid" 2>/dev/null; do sleep 0.02; done
}
for _ in $(seq $((DAEMON_KILLS - 1))); do
  sleep "$gap"
  kill_daemon
  sleep 0.2
  start_daemon
done
wait "$consoles"
# The last kill straddles the run's end (about a second before it): it exits while no daemon
# runs, and the next daemon must still know its exit code. The GPUs' counters are read when
# it ends.
out="$GPUPILOT_HOME/state/runs/$run/stdout.log"
while [ "$(wc -l <"$out")" -lt $((LINES - 20)) ]; do sleep 0.05; done
kill_daemon
while pgrep -f "soak-counter-$$" >/dev/null; do sleep 0.05; done
e1=$(gpu_energy)
sleep 0.5
start_daemon

# Wait for the run to end (the counter takes about $run_s s).
for _ in $(seq 600); do
  status=$("$BIN" ps --json | python3 -c "
import json, sys
print(next((r['status'] for r in json.load(sys.stdin) if r['id'] == '$run'), 'lost'))")
  case $status in running|starting|stopping) sleep 0.2 ;; *) break ;; esac
done
t1=$(date +%s.%N)

"$BIN" ps --json >"$dir/ps.json"
python3 - "$dir/ps.json" "$run" "$GPUPILOT_HOME" "$LINES" "$e0" "$e1" "$t0" "$t1" \
  "$DAEMON_KILLS" "$CONSOLE_KILLS" <<'PY'
import json, pathlib, sys
ps, run, home, lines, e0, e1, t0, t1, dk, ck = sys.argv[1:]
lines = int(lines)
runs = json.load(open(ps))
r = next((x for x in runs if x["id"] == run), None)
out = pathlib.Path(home, "state", "runs", run, "stdout.log").read_text().split()
nums = [int(x) for x in out if x.isdigit()]
lost = len(set(range(1, lines + 1)) - set(nums))
doubled = len(nums) - len(set(nums))
print(f"| daemon kills | console kills | lines lost | lines doubled | runs lost | status | exit code | run energy kJ | GPUs' counters kJ | kept |")
print("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
if r is None:
    print(f"| {dk} | {ck} | {lost} | {doubled} | 1 | lost | – | – | – | – |")
    sys.exit(0)
energy = (r.get("energy") or {}).get("energy_j")
gpus = float(e1) - float(e0)
kept = f"{energy / gpus:.3f}" if energy is not None and gpus > 0 else "–"
print(f"| {dk} | {ck} | {lost} | {doubled} | 0 | {r['status']} | {r.get('exit_code')} | "
      f"{(energy or 0) / 1e3:.1f} | {gpus / 1e3:.1f} | {kept} |")
PY
