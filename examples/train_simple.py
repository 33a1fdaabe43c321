#!/usr/bin/env python3
"""SimpleNet on synthetic CIFAR-like images, with gpupilot steering its DataLoader.

A few conv layers and a classifier on 3x32x32 images of 10 classes, made up on the fly from a
seed (no download). The batch size follows the ``batch_size`` knob (``KnobBatchSampler``); the
DataLoader is rebuilt between two batches when ``prefetch`` (its ``prefetch_factor``) or
``workers`` changes (``KnobLoader``). Each step reports loss, samples/s, step time and the time
spent waiting for data, and prints them as one JSON line. Runs on CUDA when there is a GPU and on
the CPU otherwise.

    python3 examples/train_simple.py --steps 20
    gpupilot run -- python3 examples/train_simple.py --epochs 10 --workers 4

CUDA running out of memory is reported to gpupilot as an ``oom`` error (so a profile with
``on_oom = "halve_batch"`` restarts with half the batch) and exits with status 3. SIGTERM or
SIGINT stops it cleanly at the next step (exit status 0).
"""

import argparse
import json
import os
import signal
import sys
import time

try:
    import gpupilot
except ImportError:  # running from a checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import gpupilot

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

from gpupilot.torch import KnobBatchSampler, KnobLoader, loader_kwargs

EXIT_OOM = 3


class SyntheticCifar(Dataset):
    """CIFAR-shaped samples: a per-class pattern plus noise, each made from (seed, index).

    Making samples on demand costs CPU in the loader, as decoding and augmenting real images
    does, so the worker and prefetch knobs have something to hide.
    """

    def __init__(self, size, seed=0, classes=10):
        self.size = size
        self.seed = seed
        gen = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(classes, 3, 32, 32, generator=gen)
        self.classes = classes

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        gen = torch.Generator().manual_seed(self.seed * 1000003 + index)
        label = index % self.classes
        image = 0.5 * self.patterns[label] + torch.randn(3, 32, 32, generator=gen)
        return image, label


class SimpleNet(nn.Module):
    """Three conv blocks and two fully connected layers: small enough for a CPU."""

    def __init__(self, classes=10):
        super(SimpleNet, self).__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(128 * 4 * 4, 256)
        self.fc2 = nn.Linear(256, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 16x16
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 8x8
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)  # 4x4
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def is_oom(exc):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    parser.add_argument("--batch-size", type=int, default=64, help="initial batch size (GPUPILOT_BATCH_SIZE wins)")
    parser.add_argument("--prefetch", type=int, default=2, help="initial prefetch_factor (GPUPILOT_PREFETCH wins)")
    parser.add_argument("--workers", type=int, default=2, help="initial DataLoader workers")
    parser.add_argument("--samples", type=int, default=10000, help="images per epoch")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--log-every", type=int, default=1, help="print a JSON line every N steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    stop = []
    signal.signal(signal.SIGTERM, lambda signum, _: stop.append(signal.Signals(signum).name))
    signal.signal(signal.SIGINT, lambda signum, _: stop.append(signal.Signals(signum).name))

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gp = gpupilot.connect(
        knobs={"batch_size": args.batch_size, "prefetch": args.prefetch, "workers": args.workers},
        ranges={"batch_size": (1, 8192), "prefetch": (1, 32), "workers": (0, 64)},
    )
    dataset = SyntheticCifar(args.samples, seed=args.seed)
    sampler = KnobBatchSampler(RandomSampler(dataset), gp)
    loader = KnobLoader(
        # One shared sampler: a rebuilt loader goes on with the epoch where the old one was.
        lambda prefetch, workers: DataLoader(
            dataset,
            batch_sampler=sampler,
            pin_memory=device.type == "cuda",
            **loader_kwargs(prefetch, workers)
        ),
        gp,
    )
    model = SimpleNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(json.dumps({"event": "start", "device": str(device), "under_gpupilot": gp.enabled,
                      "knobs": gp.knobs}), flush=True)

    step = 0
    batch_size = None
    try:
        for epoch in range(args.epochs):
            last = time.perf_counter()
            for images, labels in loader:
                if stop:
                    break
                batch_size = len(labels)
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
                loss_value = loss.item()  # waits for the device, so the step time is real
                now = time.perf_counter()
                step_time, last = now - last, now
                step += 1
                gp.report(
                    step=step,
                    epoch=epoch,
                    loss=loss_value,
                    samples_per_s=batch_size / step_time,
                    step_time_s=step_time,
                    data_wait_s=loader.wait_s,
                    batch_size=batch_size,
                    lr=optimizer.param_groups[0]["lr"],
                )
                if step % max(1, args.log_every) == 0:
                    print(json.dumps({
                        "step": step, "epoch": epoch, "loss": round(loss_value, 4),
                        "batch_size": batch_size, "prefetch": gp.knob("prefetch"),
                        "workers": gp.knob("workers"),
                        "samples_per_s": round(batch_size / step_time, 1),
                        "step_time_s": round(step_time, 4), "data_wait_s": round(loader.wait_s, 4),
                    }), flush=True)
                if args.steps and step >= args.steps:
                    break
            if stop or (args.steps and step >= args.steps):
                break
    except RuntimeError as exc:
        if is_oom(exc):
            gp.error("oom", str(exc).splitlines()[0], batch_size=batch_size, step=step)
            gp.close(timeout=2.0)
            print(json.dumps({"event": "oom", "step": step, "batch_size": batch_size}), flush=True)
            return EXIT_OOM
        if not stop:  # a worker killed by the same SIGTERM is part of stopping, not a failure
            gp.error("other", "{}: {}".format(type(exc).__name__, exc), step=step)
            gp.close(timeout=2.0)
            raise
    gp.close()
    end = {"event": "stopped" if stop else "done", "step": step}
    if stop:
        end["signal"] = stop[0]
    print(json.dumps(end), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
