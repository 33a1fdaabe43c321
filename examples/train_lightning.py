"""PyTorch Lightning under gpupilot: one callback brings live knobs and the job's figures.

    gpupilot run -- python3 examples/train_lightning.py
    gpupilot set RUN batch-size 64        # at one step on every rank
    gpupilot set RUN prefetch 4           # the DataLoader's prefetch_factor (with --workers > 0)

A small regression on synthetic data, on the CPU or a GPU. Lightning needs torch 2 (python/
README.md says which versions were tried). ``--no-gpupilot`` leaves the callback out: an
unmodified Lightning script, whose progress bar gpupilot reads through its ``lightning``
preset. ``--print-batches`` prints one JSON line per training batch: rank, step, batch size.
"""

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


class Regression(pl.LightningModule):
    def __init__(self, lr, print_batches=False, step_sleep=0.0, gp_callback=None):
        super().__init__()
        self.lr = lr
        self.gp_callback = gp_callback
        self.print_batches = print_batches
        self.step_sleep = step_sleep
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.print_batches:
            line = {"rank": self.global_rank, "step": self.trainer.global_step + 1, "bs": len(x)}
            # With DataLoader workers: the running iterator's prefetch factor, and the batches
            # it has asked its workers for and not yet handed over.
            it = getattr(getattr(self.gp_callback, "plan", None), "iterator", None)
            if it is not None and hasattr(it, "_prefetch_factor"):
                line["prefetch"] = it._prefetch_factor
                line["queued"] = it._tasks_outstanding
            # One write per line: ranks may share one output file.
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
        if self.step_sleep:
            time.sleep(self.step_sleep)
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor (with workers)")
    p.add_argument("--lr-rule", choices=["linear", "sqrt"])
    p.add_argument("--no-gpupilot", action="store_true")
    p.add_argument("--print-batches", action="store_true", help="one JSON line per batch: rank, step, size")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to wait each step (a slower demo)")
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g)
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        **({"prefetch_factor": args.prefetch} if args.workers else {}),
    )
    callbacks = []
    gp = None
    if not args.no_gpupilot:
        from gpupilot.integrations.lightning import GpupilotCallback

        gp = GpupilotCallback(lr_rule=args.lr_rule)
        callbacks.append(gp)
    # Several ranks (torchrun, gpupilot's launcher = "ranks": WORLD_SIZE set) train with DDP,
    # one process each; Lightning reads the ranks from the environment.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        devices=world if world > 1 else "auto",
        strategy="ddp" if world > 1 else "auto",
        enable_progress_bar=not args.print_batches,
    )
    model = Regression(lr=0.01, print_batches=args.print_batches, step_sleep=args.step_sleep, gp_callback=gp)
    trainer.fit(model, train_dataloaders=loader)


if __name__ == "__main__":
    main()
