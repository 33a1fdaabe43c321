"""What a console's polls cost its daemon: `run_events` at the end of a long event log
(bench/run-events.sh) and `runs` on a node that keeps many ended runs (bench/run-list.sh).

    python3 bench/polls.py events EVENTS POLLS ROUNDS BINARY...
    python3 bench/polls.py list ENDED POLLS ROUNDS BINARY...

Each measurement starts a daemon of BINARY on the simulator (`--source sim`) in a home of its
own; the daemon's CPU is the schedstat of all its threads (ns resolution). The binaries take
turns, ROUNDS times; the medians come last.
"""
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

LIVE = ("running", "paused", "stopping", "backoff")


def cpu_ns(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


class Node:
    """A daemon of `binary` in a fresh home, and one connection to it."""

    def __init__(self, binary):
        self.binary = binary
        self.home = tempfile.mkdtemp()
        self.env = dict(os.environ, GPUPILOT_HOME=self.home, GPUPILOT_SOURCE="sim",
                        XDG_RUNTIME_DIR=self.home)
        self.env.pop("GPUPILOT_SYSTEM", None)
        self.daemon = subprocess.Popen([binary, "daemon"], env=self.env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.live = []
        self.sock = None
        for _ in range(100):
            if self.cli("ps", check=False).returncode == 0:
                break
            time.sleep(0.1)

    def cli(self, *args, check=True):
        return subprocess.run([self.binary, *args], env=self.env, capture_output=True, text=True,
                              check=check)

    def run(self, name, *argv):
        rid = self.cli("run", "--detach", "--name", name, "--", *argv).stdout.strip()
        if argv[0] == "sleep":
            self.live.append(rid)
        return rid

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(os.path.join(self.home, "run", "daemon.sock"))
        self.frames = self.sock.makefile("rb")
        self.ids = iter(range(1, 1 << 62))
        self.ask({"type": "hello", "version": 1, "client": "bench"})

    def ask(self, req):
        """The answer to `req`, as the line it came in."""
        req = dict(req, id=next(self.ids))
        self.sock.sendall((json.dumps(req) + "\n").encode())
        while True:
            line = self.frames.readline()
            if json.loads(line).get("id") == req["id"]:
                return line

    def cpu_per(self, polls, req):
        """The daemon's CPU per answer to `req`, in ms, and the last answer."""
        c0 = cpu_ns(self.daemon.pid)
        for _ in range(polls):
            line = self.ask(req)
        return (cpu_ns(self.daemon.pid) - c0) / 1e6 / polls, line

    def close(self):
        if self.sock:
            self.sock.close()
        for rid in self.live:
            self.cli("stop", rid, check=False)
        self.daemon.terminate()
        self.daemon.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def events(node, n, polls):
    """`run_events` from `next` at the end of a log of `n` knob changes."""
    rid = node.run("ev", "sleep", "600")
    time.sleep(0.5)
    with open(os.path.join(node.home, "state", "runs", rid, "events.jsonl"), "a") as f:
        for i in range(n):
            f.write('{"time":"2026-12-03T00:%02d:%02d.000Z","event":"changed","by":"alice '
                    '(uid 1000) via gpupilot (pid 4242)","what":"batch_size","old":"%d",'
                    '"new":"%d","why":null}\n' % (i // 60 % 60, i % 60, i, i + 1))
    node.connect()
    at = 0
    while True:
        answer = json.loads(node.ask({"type": "run_events", "run": rid, "since": at}))
        if not answer["events"]:
            break
        at = answer["next"]
    assert at >= n, at
    t0 = time.perf_counter()
    cpu, line = node.cpu_per(polls, {"type": "run_events", "run": rid, "since": at})
    wall = (time.perf_counter() - t0) * 1e3 / polls
    answer = json.loads(line)
    assert answer["next"] == at and not answer["events"], answer
    return {"daemon CPU, ms/poll": cpu, "wall, ms/poll": wall}


def run_list(node, ended, polls):
    """`runs` whole and `runs` live on a node of `ended` ended runs and one live."""
    for i in range(ended):
        node.run(f"done{i}", "true")
    node.run("live", "sleep", "600")
    node.connect()
    for _ in range(300):  # until every run but the live one has ended
        runs = json.loads(node.ask({"type": "runs"}))["runs"]
        if sum(r["status"] in LIVE for r in runs) == 1:
            break
        time.sleep(0.1)
    out = {}
    for name, req in (("runs", {"type": "runs"}), ("runs live", {"type": "runs", "live": True})):
        cpu, line = node.cpu_per(polls, req)
        out[f"{name}: daemon CPU, ms"] = cpu
        out[f"{name}: answer, B"] = len(line)
    return out


def main():
    mode, n, polls, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    binaries = sys.argv[5:]
    if mode not in ("events", "list") or not binaries:
        sys.exit(__doc__)
    measure = events if mode == "events" else run_list
    results = {b: [] for b in binaries}
    for r in range(rounds):
        for b in binaries:
            node = Node(b)
            try:
                out = measure(node, n, polls)
            finally:
                node.close()
            results[b].append(out)
            print(f"round {r + 1}: {b}: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()),
                  flush=True)
    what = f"{n} events" if mode == "events" else f"{n} ended runs and one live"
    print(f"\n{what}, {polls} polls, {rounds} rounds: medians")
    for b, rs in results.items():
        print(f"{b}: " + ", ".join(f"{k} {statistics.median(o[k] for o in rs):.3f}"
                                   for k in rs[0]))


if __name__ == "__main__":
    main()
