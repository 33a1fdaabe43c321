"""gpupilot for PyTorch Lightning: one callback.

    from gpupilot.integrations.lightning import GpupilotCallback

    trainer = L.Trainer(max_epochs=3, callbacks=[GpupilotCallback()])
    trainer.fit(model, train_dataloaders=loader)

The same as ``gpupilot.integrations.transformers.GpupilotCallback``, for Lightning's
``Trainer``: each rank reports its step (Lightning's ``global_step``, optimizer steps), its loss
(the ``loss`` its ``training_step`` returned), learning rate, samples/s and its own samples;
``gpupilot set RUN batch-size N`` changes the training DataLoader's batch size at one step on
every rank (``accumulate_grad_batches`` kept), ``prefetch`` its ``prefetch_factor`` (with
workers). ``lr_rule="linear"`` or ``"sqrt"`` scales every optimizer's rate and its schedulers'
base rates when the batch changes. Where the batch size cannot change live (several training
loaders, an iterable dataset, a custom batch sampler), the change is refused with the reason
and a checkpoint is asked of the checkpoint callback, if there is one, to restart from.

Works by Lightning's ``Callback`` API (``lightning.pytorch``, or the older
``pytorch_lightning`` package). Tested with lightning 2.5.6 on torch 2.5.1: one process, and
two DDP ranks started by gpupilot's launcher (python/README.md).
"""

import time

try:
    import lightning.pytorch as _pl
except ImportError:  # the older package name
    import pytorch_lightning as _pl

import gpupilot

from ._loader import Hooks, Plan, check_lr_rule

__all__ = ["GpupilotCallback"]

DEFAULT_MAX_PREFETCH = 64


def _single_loader(loaders):
    """The one training DataLoader in what Lightning holds, or (None, why not)."""
    if loaders is None:
        return None, "Lightning has no training DataLoader yet"
    if hasattr(loaders, "batch_sampler") or hasattr(loaders, "_get_iterator"):
        return loaders, None
    if isinstance(loaders, (list, tuple)) and len(loaders) == 1:
        return _single_loader(loaders[0])
    if isinstance(loaders, dict) and len(loaders) == 1:
        return _single_loader(next(iter(loaders.values())))
    return None, "the model trains on several DataLoaders at once"


class GpupilotCallback(_pl.Callback):
    """Reports Lightning's figures to gpupilot and applies its knob changes (see the module)."""

    def __init__(self, gp=None, lr_rule=None, ranges=None, wait_s=1.0):
        super().__init__()
        self.gp = gp
        self.lr_rule = check_lr_rule(lr_rule)
        self.ranges = ranges
        self.wait_s = wait_s
        self.plan = None
        self._trainer = None
        self._last = None
        self._reported = None
        self.hooks = None

    def on_train_start(self, trainer, pl_module):
        self._trainer = trainer
        loader, why_not = _single_loader(getattr(trainer, "train_dataloader", None))
        if self.gp is None:
            knobs, ranges = {}, {}
            size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
            if isinstance(size, int) and size >= 1:
                knobs["batch_size"] = size
            if getattr(loader, "num_workers", 0):
                knobs["prefetch"] = int(getattr(loader, "prefetch_factor", None) or 2)
                ranges["prefetch"] = (1, DEFAULT_MAX_PREFETCH)
            ranges.update(self.ranges or {})
            self.gp = gpupilot.connect(knobs=knobs, ranges=ranges)
        self.plan = Plan(
            self.gp,
            getattr(trainer, "accumulate_grad_batches", 1),
            self.wait_s,
            done_steps=lambda: trainer.global_step,
        )
        if loader is None:
            self.plan.why_not = why_not
            self.plan.prefetch_why_not = why_not
        elif self.plan.install(loader):
            # Lightning draws the epoch's first batches before this hook (its fit loop's
            # setup_data): draw them again, through the sampler as it is now. Nothing has been
            # trained on yet.
            fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
            if fetcher is not None:
                iter(fetcher)
        self.plan.epoch_started(trainer.global_step)
        self.hooks = Hooks(
            self.plan,
            self.lr_rule,
            self._lr_targets,
            "; a checkpoint is saved at the next step: start the run again from it (ckpt_path) "
            "with the new batch size",
        )
        self.hooks.register(self.gp)
        self._last = (time.perf_counter(), 0)

    def on_train_epoch_start(self, trainer, pl_module):
        if self.plan is not None:
            self.plan.epoch_started(trainer.global_step)

    def _lr_targets(self):
        trainer = self._trainer
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        schedulers = [c.scheduler for c in (getattr(trainer, "lr_scheduler_configs", []) or [])]
        return optimizers, schedulers

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.plan is None:
            return
        step = trainer.global_step
        if step == self._reported:
            return  # an accumulating batch: no optimizer step yet
        self._reported = step
        if self.hooks.refused:
            self.hooks.refused = False
            self._checkpoint(trainer)
        now = time.perf_counter()
        samples = self.plan.step_done(step)
        then, before = self._last
        took = now - then
        self._last = (now, samples)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        extra = {}
        optimizers = getattr(trainer, "optimizers", None)
        if optimizers:
            extra["lr"] = optimizers[0].param_groups[0]["lr"]
        self.gp.report(
            step=step,
            epoch=trainer.current_epoch,
            loss=loss,
            samples=samples,
            samples_per_s=(samples - before) / took if took > 0 else None,
            step_time_s=took,
            lead_steps=self.plan.lead_steps(step),
            **extra
        )

    def _checkpoint(self, trainer):
        checkpoint = getattr(trainer, "checkpoint_callback", None)
        if checkpoint is None or not getattr(checkpoint, "dirpath", None):
            return
        import os

        path = os.path.join(checkpoint.dirpath, "gpupilot-step{}.ckpt".format(trainer.global_step))
        trainer.save_checkpoint(path)

    def on_train_end(self, trainer, pl_module):
        if self.gp is not None:
            self.gp.flush(1.0)
