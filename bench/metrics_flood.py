"""Prometheus's view of a daemon whose `/metrics` port is flooded by slow clients.

DRIPPERS loopback connections each send one byte of a request head that never ends every
0.5 s, and open a new connection as soon as theirs is closed; meanwhile a scraper (curl, 3 s
timeout, as a Prometheus would) asks for `/metrics` once a second, SCRAPES times. A scrape is
answered when curl gets a 200 whose page ends in a newline and holds every GPU's power
series. For each BINARY: scrapes answered of SCRAPES, the answered ones' median and largest
time, and how many connections the drippers had to open again. ROUNDS rounds, the binaries
alternating.

    python3 bench/metrics_flood.py DRIPPERS SCRAPES ROUNDS BINARY...
"""

import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

GPUS = 4
HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Drip: "


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url):
    """(answered, seconds) of one curl with a 3 s timeout."""
    with tempfile.NamedTemporaryFile() as body:
        t0 = time.monotonic()
        r = subprocess.run(["curl", "-s", "-m", "3", "-o", body.name, "-w", "%{http_code}", url],
                           capture_output=True, text=True)
        took = time.monotonic() - t0
        page = open(body.name, "rb").read().decode(errors="replace")
    power = sum(1 for l in page.splitlines() if l.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    ok = r.stdout == "200" and page.endswith("\n") and power == GPUS
    return ok, took


def drip(port, n, stop, counts):
    """`n` connections that each send a byte every 0.5 s, reopened when closed, until `stop`."""
    sel = selectors.DefaultSelector()
    socks = {}

    def open_one(i):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            return
        s.setblocking(False)
        socks[i] = [s, 0]
        sel.register(s, selectors.EVENT_READ, i)

    def close(i):
        s = socks.pop(i)[0]
        sel.unregister(s)
        s.close()
        counts["reopened"] += 1

    tick = time.monotonic()
    while not stop.is_set():
        for i in range(n):
            if i not in socks:
                open_one(i)
        for key, _ in sel.select(0.02):
            close(key.data)  # an answer (408, 431) or the end: either way it is over
        if time.monotonic() >= tick:
            tick += 0.5
            for i in list(socks):
                s, sent = socks[i]
                byte = HEAD[sent:sent + 1] or b"a"
                try:
                    s.send(byte)
                    socks[i][1] += 1
                except OSError:
                    close(i)
    for i in list(socks):
        socks.pop(i)[0].close()


def measure(binary, drippers, scrapes):
    home = tempfile.mkdtemp()
    port = free_port()
    env = dict(os.environ, GPUPILOT_HOME=home, XDG_RUNTIME_DIR=home)
    env.pop("GPUPILOT_SYSTEM", None)
    daemon = subprocess.Popen([binary, "--source", "sim", "--gpus", str(GPUS), "daemon",
                               "--metrics-addr", f"127.0.0.1:{port}"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):
            if scrape(url)[0]:
                break
            time.sleep(0.1)
        stop, counts = threading.Event(), {"reopened": 0}
        t = threading.Thread(target=drip, args=(port, drippers, stop, counts))
        t.start()
        time.sleep(2)
        times = []
        for _ in range(scrapes):
            t0 = time.monotonic()
            ok, took = scrape(url)
            if ok:
                times.append(took)
            time.sleep(max(0.0, 1 - (time.monotonic() - t0)))
        stop.set()
        t.join()
        return len(times), times, counts["reopened"]
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(home, ignore_errors=True)


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    drippers, scrapes, rounds = map(int, sys.argv[1:4])
    results = {b: [] for b in sys.argv[4:]}
    for r in range(rounds):
        for b in results:
            answered, times, reopened = measure(b, drippers, scrapes)
            med = statistics.median(times) * 1e3 if times else float("nan")
            top = max(times) * 1e3 if times else float("nan")
            results[b].append((answered, med))
            print(f"round {r + 1} {b}: {answered}/{scrapes} answered, median {med:.1f} ms, "
                  f"max {top:.1f} ms, {reopened} connections reopened", flush=True)
    for b, rs in results.items():
        print(f"{b}: answered (median of rounds) {statistics.median(a for a, _ in rs)}/{scrapes}, "
              f"median time {statistics.median(m for _, m in rs):.1f} ms")


main()
