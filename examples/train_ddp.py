"""Data-parallel training under gpupilot: one process per rank, torch.distributed (NCCL on GPUs,
gloo on CPU), a batch size that the operator can change while it trains.

Start it with torchrun, or where torchrun is missing with gpupilot's own launcher
(profiles/ranks-4.toml: ``launcher = "ranks"``). Each rank attaches to the run as itself
(RANK, LOCAL_RANK, WORLD_SIZE come from the launcher). ``gpupilot set RUN batch-size 64``
reaches every rank, and every rank forms its batches with the new size from the same step on:
its ``DistributedSampler`` shard is cut by a ``KnobBatchSampler``, so every rank's epoch keeps
the same number of steps and no collective waits for a rank that ran out of batches.

Each step prints one JSON line: rank, step, epoch, the batch's size. The data is synthetic
(a noisy linear map), made the same on every rank from a seed, so the script needs no files.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import gpupilot
from gpupilot.torch import KnobBatchSampler, scale_lr_with_batch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=8192, help="samples in the data set (all ranks)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank, until the operator changes it")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--scale-lr", action="store_true", help="scale the learning rate with the batch size (linear rule)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to wait each step (a slower demo)")
    return p.parse_args()


def main():
    args = parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    gp = gpupilot.connect(knobs={"batch_size": args.batch_size}, ranges={"batch_size": (1, 4096)})

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.01 * torch.randn(args.samples, 1, generator=g)
    dataset = TensorDataset(x, y)
    shard = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_sampler=KnobBatchSampler(shard, gp))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    model = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    if args.scale_lr:
        scale_lr_with_batch(opt, gp)
    loss_fn = torch.nn.MSELoss()

    step = 0
    seen = 0  # this rank's samples: gpupilot sums the ranks' counts into the job's
    for epoch in range(args.epochs):
        shard.set_epoch(epoch)
        for xb, yb in loader:
            started = time.perf_counter()
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            took = time.perf_counter() - started
            # One write per line: the ranks share one log file, and print() writes the line
            # and its newline apart when Python's output is unbuffered.
            sys.stdout.write(json.dumps({"rank": rank, "step": step, "epoch": epoch, "bs": len(xb)}) + "\n")
            sys.stdout.flush()
            seen += len(xb)
            gp.report(
                step=step, epoch=epoch, loss=loss.item(), samples_per_s=len(xb) / took, step_time_s=took, samples=seen
            )
            step += 1
    dist.barrier()
    dist.destroy_process_group()
    gp.close()


if __name__ == "__main__":
    main()
