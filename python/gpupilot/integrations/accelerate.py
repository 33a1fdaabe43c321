"""gpupilot for a loop of your own over Accelerate: ``follow_knobs``.

    loader = accelerator.prepare(DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2))
    knobs = follow_knobs(loader, accumulation=accelerator.gradient_accumulation_steps)
    step = 0
    for epoch in range(epochs):
        knobs.epoch_started(step)               # before the epoch's batches are drawn
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:      # an optimizer step is done
                step += 1
                knobs.step_done(step, loss=loss.item())

The prepared DataLoader (Accelerate's ``DataLoaderShard``, whose ``BatchSamplerShard`` hands
each process its batches) then forms every batch with the batch size its step has, and the
same step on every rank takes a change (see ``gpupilot.integrations._loader``); ``prefetch``
changes its ``prefetch_factor`` (with workers). ``knobs.live`` says whether the batch size can
change live, ``knobs.why_not`` why not. Accelerate's ``split_batches`` (each batch split over
the processes) is not followed: the change is refused, with that reason.

Tested with accelerate 0.30.1 (through ``transformers.Trainer``, which prepares its loader the
same way).
"""

import time

import gpupilot

from ._loader import Hooks, Plan, check_lr_rule

__all__ = ["follow_knobs", "KnobSteps"]


def follow_knobs(loader, gp=None, accumulation=1, optimizers=(), schedulers=(), lr_rule=None, wait_s=1.0):
    """Make ``loader`` (prepared by Accelerate, or a plain DataLoader) follow the knobs of
    ``gp`` (default: ``gpupilot.connect`` with the loader's batch size and prefetch factor).
    ``lr_rule`` (``"linear"``, ``"sqrt"``) scales ``optimizers`` and ``schedulers`` with the
    batch size. Returns the ``KnobSteps`` that the loop tells its epochs and steps."""
    check_lr_rule(lr_rule)
    if gp is None:
        knobs, ranges = {}, {}
        inner = getattr(loader, "batch_sampler", None)
        inner = getattr(inner, "batch_sampler", inner)
        size = getattr(inner, "batch_size", None)
        if isinstance(size, int) and size >= 1:
            knobs["batch_size"] = size
        if getattr(loader, "num_workers", 0):
            knobs["prefetch"] = int(getattr(loader, "prefetch_factor", None) or 2)
            ranges["prefetch"] = (1, 64)
        gp = gpupilot.connect(knobs=knobs, ranges=ranges)
    return KnobSteps(loader, gp, accumulation, list(optimizers), list(schedulers), lr_rule, wait_s)


class KnobSteps(object):
    """A loop's side of ``follow_knobs``: it is told the epochs and the optimizer steps."""

    def __init__(self, loader, gp, accumulation, optimizers, schedulers, lr_rule, wait_s):
        self.gp = gp
        self.plan = Plan(gp, accumulation, wait_s)
        self.live = self.plan.install(loader)
        self._last = (time.perf_counter(), 0)
        self.hooks = Hooks(self.plan, lr_rule, lambda: (optimizers, schedulers))
        self.hooks.register(gp)

    @property
    def why_not(self):
        return self.plan.why_not

    def epoch_started(self, done_steps):
        """Call before each epoch's batches are drawn, with the optimizer steps done so far."""
        self.plan.epoch_started(done_steps)

    def step_done(self, step, **metrics):
        """Call after optimizer step ``step`` (numbered from 1): reports it with this rank's
        samples, samples/s and step time, and ``metrics`` (``loss=…``, any numbers)."""
        now = time.perf_counter()
        samples = self.plan.step_done(step)
        then, before = self._last
        took = now - then
        self._last = (now, samples)
        fields = {
            "samples": samples,
            "samples_per_s": (samples - before) / took if took > 0 else None,
            "step_time_s": took,
            "lead_steps": self.plan.lead_steps(step),
        }
        fields.update(metrics)
        self.gp.report(step=step, **fields)
