#!/usr/bin/env bash
# What a console watching a run costs the daemon in `run_events` polls (BENCHMARKS.md, "A run's
# events, polled"): a run whose events.jsonl holds EVENTS events (knob changes, written as the
# daemon writes them), paged through to its end, then asked again from `next` POLLS times, as
# the console's run view does once a refresh. Prints the daemon's CPU (schedstat of all its
# threads, ns resolution) and the wall time per poll, for each BINARY in turn, ROUNDS times
# (alternating), and the medians.
#
#   bench/run-events.sh EVENTS POLLS ROUNDS BINARY...
#
# The daemon runs on the simulator (`--source sim`), with a home of its own per measurement.
set -euo pipefail

[[ $# -ge 4 ]] || {
    sed -n '2,10p' "$0" >&2
    exit 2
}
events=$1 polls=$2 rounds=$3
shift 3
python3 - "$events" "$polls" "$rounds" "$@" <<'PY'
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

events, polls, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
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
    rid = None
    try:
        for _ in range(100):
            if subprocess.run([binary, "ps"], env=env, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        rid = subprocess.run([binary, "run", "--detach", "--name", "ev", "--", "sleep", "600"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
        time.sleep(0.5)
        with open(os.path.join(home, "state", "runs", rid, "events.jsonl"), "a") as f:
            for i in range(events):
                f.write('{"time":"2026-12-03T00:%02d:%02d.000Z","event":"changed","by":"alice '
                        '(uid 1000) via gpupilot (pid 4242)","what":"batch_size","old":"%d",'
                        '"new":"%d","why":null}\n' % (i // 60 % 60, i % 60, i, i + 1))
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(30)
        sock.connect(os.path.join(home, "run", "daemon.sock"))
        frames = sock.makefile("rb")
        ids = iter(range(1, 1 << 62))

        def ask(req):
            req["id"] = next(ids)
            sock.sendall((json.dumps(req) + "\n").encode())
            while True:
                frame = json.loads(frames.readline())
                if frame.get("id") == req["id"]:
                    return frame

        ask({"type": "hello", "version": 1, "client": "bench"})
        at = 0
        while True:
            answer = ask({"type": "run_events", "run": rid, "since": at})
            if not answer["events"]:
                break
            at = answer["next"]
        assert at >= events, at
        c0, t0 = cpu_ns(daemon.pid), time.perf_counter()
        for _ in range(polls):
            answer = ask({"type": "run_events", "run": rid, "since": at})
            assert answer["next"] == at and not answer["events"], answer
        t1, c1 = time.perf_counter(), cpu_ns(daemon.pid)
        sock.close()
        return (c1 - c0) / 1e6 / polls, (t1 - t0) * 1e3 / polls
    finally:
        if rid:
            subprocess.run([binary, "stop", rid], env=env, capture_output=True)
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(home, ignore_errors=True)


results = {b: [] for b in binaries}
for r in range(rounds):
    for b in binaries:
        cpu, wall = measure(b)
        results[b].append((cpu, wall))
        print(f"round {r + 1}: {b}: daemon CPU {cpu:.3f} ms/poll, wall {wall:.3f} ms/poll",
              flush=True)
print(f"\n{events} events, {polls} polls from the end, {rounds} rounds: medians")
for b, rs in results.items():
    cpu = statistics.median(c for c, _ in rs)
    wall = statistics.median(w for _, w in rs)
    print(f"{b}: daemon CPU {cpu:.3f} ms/poll, wall {wall:.3f} ms/poll")
PY
