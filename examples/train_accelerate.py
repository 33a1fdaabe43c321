"""A loop of your own over Accelerate under gpupilot: ``follow_knobs`` on the prepared loader.

    gpupilot run -- python3 examples/train_accelerate.py
    gpupilot set RUN batch-size 64        # at one step on every process
    gpupilot set RUN prefetch 4           # the DataLoader's prefetch_factor (with --workers > 0)

A small regression on synthetic data (the same on every process, from a seed), on the CPU or
a GPU. Several processes (``accelerate launch``, torchrun, gpupilot's ``launcher = "ranks"``)
train it data-parallel; Accelerate sets that up from the environment.
"""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from gpupilot.integrations.accelerate import follow_knobs


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=32, help="per process, until the operator changes it")
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--lr-rule", choices=["linear", "sqrt"])
    return p.parse_args()


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulation)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    knobs = follow_knobs(loader, accumulation=args.accumulation, optimizers=[optimizer], lr_rule=args.lr_rule)
    if not knobs.live:
        accelerator.print("gpupilot: the batch size cannot change live here: {}".format(knobs.why_not))
    step = 0
    for epoch in range(args.epochs):
        knobs.epoch_started(step)
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                knobs.step_done(step, epoch=epoch, loss=loss.item())
        accelerator.print("epoch {} loss {:.4f}".format(epoch, loss.item()))


if __name__ == "__main__":
    main()
