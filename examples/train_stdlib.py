#!/usr/bin/env python3
"""A training loop with gpupilot's knobs and nothing but the standard library.

Linear regression by minibatch SGD on synthetic data. The batch size comes from the
``batch_size`` knob; a simulated data loader fills a queue ``prefetch`` batches deep on a
producer thread whose load time is bursty, so a deeper queue hides more of the stalls. Every step
is reported to gpupilot and printed as one JSON line.

    python3 examples/train_stdlib.py --steps 50        # standalone
    gpupilot run -- python3 examples/train_stdlib.py   # supervised: knobs follow the console

SIGTERM or SIGINT stops it cleanly at the next step (exit status 0).
"""

import argparse
import json
import os
import queue
import random
import signal
import sys
import threading
import time

try:
    import gpupilot
except ImportError:  # running from a checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import gpupilot

TRUE_W = (3.0, -2.0)
TRUE_B = 0.5


def make_data(n, rng):
    data = []
    for _ in range(n):
        x = (rng.uniform(-1, 1), rng.uniform(-1, 1))
        y = TRUE_W[0] * x[0] + TRUE_W[1] * x[1] + TRUE_B + rng.gauss(0, 0.1)
        data.append((x, y))
    return data


class SimulatedLoader(object):
    """Batches made on a producer thread, ``prefetch`` of them queued ahead of the training loop.

    Each batch takes a random time to load (exponential, ``load_s`` on average for 64 samples),
    so a loader that is fast enough on average still stalls now and then; a deeper queue rides
    out more of those bursts.
    """

    def __init__(self, data, batch_size, prefetch, load_s, seed, start_epoch=0, start_pos=0, backlog=()):
        self.data = data
        self.backlog = list(backlog)  # batches an earlier loader had loaded, served first
        self.batch_size = batch_size  # a function: the size of the next batch
        self.load_s = load_s
        self.rng = random.Random(seed)
        self.queue = queue.Queue(maxsize=max(1, prefetch))
        self.stop = threading.Event()
        self.epoch = start_epoch
        self.pos = start_pos
        self.order = self._shuffled(start_epoch)
        self.thread = threading.Thread(target=self._produce, name="loader", daemon=True)
        self.thread.start()

    def _shuffled(self, epoch):
        order = list(range(len(self.data)))
        random.Random(epoch).shuffle(order)
        return order

    def _produce(self):
        while not self.stop.is_set():
            size = self.batch_size()
            batch = []
            for _ in range(size):
                if self.pos == len(self.order):
                    self.epoch += 1
                    self.pos = 0
                    self.order = self._shuffled(self.epoch)
                batch.append(self.data[self.order[self.pos]])
                self.pos += 1
            mean = self.load_s * size / 64.0
            if self.stop.wait(self.rng.expovariate(1.0 / mean) if mean > 0 else 0):
                return
            item = (self.epoch, batch)
            while not self.stop.is_set():
                try:
                    self.queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def get(self, stop):
        """The next (epoch, batch) and the seconds waited for it; None once ``stop`` is set."""
        started = time.perf_counter()
        if self.backlog:
            return self.backlog.pop(0), 0.0
        while not stop.is_set():
            try:
                item = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            return item, time.perf_counter() - started
        return None, time.perf_counter() - started

    def close(self):
        """Stop the producer; returns the batches it had queued, not yet served."""
        self.stop.set()
        self.thread.join(1.0)
        left = self.backlog
        while True:
            try:
                left.append(self.queue.get_nowait())
            except queue.Empty:
                return left


def sgd_step(w, b, batch, lr):
    gw0 = gw1 = gb = 0.0
    loss = 0.0
    for (x0, x1), y in batch:
        err = w[0] * x0 + w[1] * x1 + b - y
        loss += err * err
        gw0 += err * x0
        gw1 += err * x1
        gb += err
    n = float(len(batch))
    w = (w[0] - lr * 2 * gw0 / n, w[1] - lr * 2 * gw1 / n)
    b = b - lr * 2 * gb / n
    return w, b, loss / n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500, help="steps to train (default 500)")
    parser.add_argument("--batch-size", type=int, default=64, help="initial batch size (GPUPILOT_BATCH_SIZE wins)")
    parser.add_argument("--prefetch", type=int, default=2, help="initial queue depth (GPUPILOT_PREFETCH wins)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=4096, help="size of the synthetic data set")
    parser.add_argument("--compute-s", type=float, default=0.01, help="simulated compute time per 64 samples")
    parser.add_argument("--load-s", type=float, default=0.008, help="mean simulated load time per 64 samples")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    stop = threading.Event()
    stopped_by = []

    def on_signal(signum, _frame):
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    gp = gpupilot.connect(
        knobs={"batch_size": args.batch_size, "prefetch": args.prefetch},
        ranges={"batch_size": (1, 4096), "prefetch": (1, 64)},
    )
    rng = random.Random(args.seed)
    data = make_data(args.samples, rng)
    loader = SimulatedLoader(data, lambda: gp.knob("batch_size"), gp.knob("prefetch"), args.load_s, args.seed)
    gp.pending("prefetch")  # the loader was built with the current value
    w, b = (0.0, 0.0), 0.0
    step = 0
    print(json.dumps({"event": "start", "under_gpupilot": gp.enabled, "knobs": gp.knobs}), flush=True)
    try:
        while step < args.steps and not stop.is_set():
            # A batch boundary: a new prefetch depth takes effect here, with a new loader that
            # goes on from where the old one was in the data.
            prefetch = gp.pending("prefetch")
            if prefetch is not None:
                backlog = loader.close()
                loader = SimulatedLoader(
                    data,
                    lambda: gp.knob("batch_size"),
                    prefetch,
                    args.load_s,
                    args.seed + step,
                    loader.epoch,
                    loader.pos,
                    backlog,
                )
            started = time.perf_counter()
            item, wait_s = loader.get(stop)
            if item is None:
                break
            epoch, batch = item
            w, b, loss = sgd_step(w, b, batch, args.lr)
            time.sleep(args.compute_s * len(batch) / 64.0)  # the accelerator's share of a step
            step_time = time.perf_counter() - started
            step += 1
            line = {
                "step": step,
                "epoch": epoch,
                "loss": round(loss, 6),
                "batch_size": len(batch),
                "prefetch": gp.knob("prefetch"),
                "samples_per_s": round(len(batch) / step_time, 1),
                "step_time_s": round(step_time, 5),
                "data_wait_s": round(wait_s, 5),
            }
            gp.report(
                step=step,
                epoch=epoch,
                loss=loss,
                samples_per_s=len(batch) / step_time,
                step_time_s=step_time,
                data_wait_s=wait_s,
                batch_size=len(batch),
                w0=w[0],
                w1=w[1],
                bias=b,
            )
            print(json.dumps(line), flush=True)
    finally:
        loader.close()
        gp.close()
    end = {"event": "stopped" if stopped_by else "done", "step": step, "w": [round(w[0], 4), round(w[1], 4)],
           "b": round(b, 4)}
    if stopped_by:
        end["signal"] = stopped_by[0]
    print(json.dumps(end), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
