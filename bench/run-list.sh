#!/usr/bin/env bash
# What the console's run-list poll costs on a node that keeps many ended runs (BENCHMARKS.md,
# "The run list, polled"): a daemon on the simulator with ENDED ended runs and one live run;
# a client asks `runs` POLLS times as a console did once a refresh (the whole list), then
# `runs` with `live: true` POLLS times as it does now. Prints the answer's size and the
# daemon's CPU (schedstat of all its threads) per request, for each BINARY, ROUNDS times
# (alternating), and the medians. A daemon older than `live` answers the whole list to both.
#
#   bench/run-list.sh ENDED POLLS ROUNDS BINARY...
set -euo pipefail

[[ $# -ge 4 ]] || {
    sed -n '2,10p' "$0" >&2
    exit 2
}
ended=$1 polls=$2 rounds=$3
shift 3
python3 - "$ended" "$polls" "$rounds" "$@" <<'PY'
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

ended, polls, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
binaries = sys.argv[4:]


def cpu_ns(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


def measure(binary):
    home = tempfile.mkdtemp()
    env = dict(os.environ, GPUPILOT_HOME=home, GPUPILOT_SOURCE="sim", XDG_RUNTIME_DIR=home)
    env.pop("GPUPILOT_SYSTEM", None)
    daemon = subprocess.Popen([binary, "daemon"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    live = None
    try:
        for _ in range(100):
            if subprocess.run([binary, "ps"], env=env, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        for i in range(ended):
            subprocess.run([binary, "run", "--detach", "--name", f"done{i}", "--", "true"],
                           env=env, capture_output=True, check=True)
        live = subprocess.run([binary, "run", "--detach", "--name", "live", "--", "sleep", "600"],
                              env=env, capture_output=True, text=True, check=True).stdout.strip()
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(30)
        sock.connect(os.path.join(home, "run", "daemon.sock"))
        frames = sock.makefile("rb")
        ids = iter(range(1, 1 << 62))

        def ask(req):
            req["id"] = next(ids)
            sock.sendall((json.dumps(req) + "\n").encode())
            while True:
                line = frames.readline()
                if json.loads(line).get("id") == req["id"]:
                    return line

        ask({"type": "hello", "version": 1, "client": "bench"})
        # Until every run but the live one has ended.
        for _ in range(300):
            runs = json.loads(ask({"type": "runs"}))["runs"]
            if sum(r["status"] in ("running", "paused", "stopping", "backoff") for r in runs) == 1:
                break
            time.sleep(0.1)
        out = {}
        for name, req in (("whole", {"type": "runs"}), ("live", {"type": "runs", "live": True})):
            size = 0
            c0 = cpu_ns(daemon.pid)
            for _ in range(polls):
                size = len(ask(dict(req)))
            out[name] = ((cpu_ns(daemon.pid) - c0) / 1e6 / polls, size)
        sock.close()
        return out
    finally:
        if live:
            subprocess.run([binary, "stop", live], env=env, capture_output=True)
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(home, ignore_errors=True)


results = {b: [] for b in binaries}
for r in range(rounds):
    for b in binaries:
        out = measure(b)
        results[b].append(out)
        print(f"round {r + 1}: {b}: " + ", ".join(
            f"{k}: {cpu:.3f} ms, {size} B" for k, (cpu, size) in out.items()), flush=True)
print(f"\n{ended} ended runs and one live, {polls} polls each, {rounds} rounds: medians")
for b, rs in results.items():
    parts = []
    for k in ("whole", "live"):
        cpu = statistics.median(o[k][0] for o in rs)
        size = statistics.median(o[k][1] for o in rs)
        parts.append(f"`runs`{' live' if k == 'live' else ''}: {cpu:.3f} ms of daemon CPU, "
                     f"{size:.0f} B per answer")
    print(f"{b}: " + "; ".join(parts))
PY
