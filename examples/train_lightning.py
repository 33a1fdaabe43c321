"""PyTorch Lightning under gpupilot: one callback brings live knobs and the job's figures.

    gpupilot run -- python3 examples/train_lightning.py
    gpupilot set RUN batch-size 64        # at one step on every rank
    gpupilot set RUN prefetch 4           # the DataLoader's prefetch_factor (with --workers > 0)

A small regression on synthetic data, on the CPU or a GPU. Lightning needs torch 2 (python/
README.md says which versions were tried). ``--no-gpupilot`` leaves the callback out: an
unmodified Lightning script, whose progress bar gpupilot reads through its ``lightning``
preset.
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


class Regression(pl.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
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
    p.add_argument("--lr-rule", choices=["linear", "sqrt"])
    p.add_argument("--no-gpupilot", action="store_true")
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    callbacks = []
    if not args.no_gpupilot:
        from gpupilot.integrations.lightning import GpupilotCallback

        callbacks.append(GpupilotCallback(lr_rule=args.lr_rule))
    trainer = pl.Trainer(max_epochs=args.epochs, callbacks=callbacks, logger=False)
    trainer.fit(Regression(lr=0.01), train_dataloaders=loader)


if __name__ == "__main__":
    main()
