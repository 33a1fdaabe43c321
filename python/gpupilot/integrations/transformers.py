"""gpupilot for Hugging Face ``transformers.Trainer``: one callback.

    from gpupilot.integrations.transformers import GpupilotCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[GpupilotCallback()])
    trainer.train()

Under gpupilot each rank reports its step, loss, learning rate, samples/s and its own samples
(gpupilot sums the ranks), and follows ``gpupilot set RUN batch-size N`` (the per-device train
batch; gradient accumulation is kept, so a step is that many batches of the new size) and
``gpupilot set RUN prefetch N`` (the DataLoader's ``prefetch_factor``; needs
``dataloader_num_workers`` > 0), every rank at the same step. ``lr_rule="linear"`` or ``"sqrt"``
scales the learning rate (and the scheduler's base rates) with the batch size when a change
takes effect, and the acknowledgement says so. Outside gpupilot it does nothing.

Where the batch size cannot change live (an iterable dataset, a custom batch sampler,
Accelerate's ``split_batches``), the change is refused with the reason, and a checkpoint is
saved at the next step so that the run can be started again with the new value (the
profile's ``resume_args``, ``--resume_from_checkpoint``) losing nothing.

Works by the Trainer's callback API (``on_train_begin`` gets the training DataLoader, the
optimizer and the scheduler; ``on_log`` the logged loss); tested with transformers 4.40.2 and
accelerate 0.30.1 (python/README.md).
"""

import time

from transformers import TrainerCallback

import gpupilot

from ._loader import Hooks, Plan, check_lr_rule

__all__ = ["GpupilotCallback"]

# The deepest prefetch the operator may ask for where the script gives no range.
DEFAULT_MAX_PREFETCH = 64


class GpupilotCallback(TrainerCallback):
    """Reports the Trainer's figures to gpupilot and applies its knob changes.

    ``gp``: a ``gpupilot.Trainer`` of your own (default: one made at the start of training,
    with the Trainer's batch size and prefetch factor). ``lr_rule``: None (default), ``"linear"``
    or ``"sqrt"``. ``ranges``: bounds for the knobs, as ``gpupilot.connect`` takes them.
    ``wait_s``: how long a loader fetching ahead waits for the decision on a change due at the
    batch it forms (see ``gpupilot.Trainer.knob_for_step``).
    """

    def __init__(self, gp=None, lr_rule=None, ranges=None, wait_s=1.0):
        self.gp = gp
        self.lr_rule = check_lr_rule(lr_rule)
        self.ranges = ranges
        self.wait_s = wait_s
        self.plan = None
        self._optimizer = None
        self._scheduler = None
        self.hooks = None
        self._last = None  # (time, samples) at the last step end
        self._tokens = None  # (time, tokens seen) at the last step end
        self._rank0 = True

    # --- start ----------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if self.gp is None:
            knobs = {"batch_size": int(args.per_device_train_batch_size)}
            ranges = {}
            if args.dataloader_num_workers:
                knobs["prefetch"] = int(args.dataloader_prefetch_factor or 2)
                # A range of its own, so that the operator may change it without a profile's.
                ranges["prefetch"] = (1, DEFAULT_MAX_PREFETCH)
            ranges.update(self.ranges or {})
            self.gp = gpupilot.connect(knobs=knobs, ranges=ranges)
        gp = self.gp
        self._rank0 = bool(getattr(state, "is_world_process_zero", True))
        self._optimizer = kwargs.get("optimizer")
        self._scheduler = kwargs.get("lr_scheduler")
        self.plan = Plan(gp, args.gradient_accumulation_steps, self.wait_s, done_steps=lambda: state.global_step)
        loader = kwargs.get("train_dataloader")
        if loader is None:
            self.plan.why_not = "the Trainer gave its callbacks no training DataLoader"
            self.plan.prefetch_why_not = self.plan.why_not
        else:
            self.plan.install(loader)
        self.plan.epoch_started(state.global_step)
        self.hooks = Hooks(
            self.plan,
            self.lr_rule,
            lambda: (
                [self._optimizer] if self._optimizer is not None else [],
                [self._scheduler] if self._scheduler is not None else [],
            ),
            "; a checkpoint is saved at the next step: start the run again from it "
            "(--resume_from_checkpoint) with the new batch size",
        )
        self.hooks.register(gp)
        self._last = (time.perf_counter(), 0)

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.plan is not None:
            self.plan.epoch_started(state.global_step)

    # --- reports --------------------------------------------------------------------------

    def on_step_end(self, args, state, control, **kwargs):
        if self.plan is None:
            return
        if self.hooks.refused:
            self.hooks.refused = False
            control.should_save = True
        step = state.global_step
        now = time.perf_counter()
        samples = self.plan.step_done(step)
        then, before = self._last
        took = now - then
        self._last = (now, samples)
        extra = {}
        lr = self._lr()
        if lr is not None:
            extra["lr"] = lr
        # The Trainer's token count (include_num_input_tokens_seen) is the whole job's: rank 0
        # reports it, so that the sum over ranks is the job's.
        seen = getattr(state, "num_input_tokens_seen", 0) or 0
        if seen and self._rank0:
            if self._tokens is not None and now > self._tokens[0]:
                extra["tokens_per_s"] = (seen - self._tokens[1]) / (now - self._tokens[0])
            self._tokens = (now, seen)
        self.gp.report(
            step=step,
            epoch=int(state.epoch or 0),
            samples=samples,
            samples_per_s=(samples - before) / took if took > 0 else None,
            step_time_s=took,
            lead_steps=self.plan.lead_steps(step),
            **extra
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.plan is None or not logs:
            return
        loss = logs.get("loss")
        if loss is None:
            return
        extra = {}
        if "learning_rate" in logs:
            extra["lr"] = logs["learning_rate"]
        if "grad_norm" in logs:
            extra["grad_norm"] = logs["grad_norm"]
        # The logged loss is the mean over the steps since the last log, of this process.
        self.gp.report(step=state.global_step, loss=loss, **extra)

    def on_train_end(self, args, state, control, **kwargs):
        if self.gp is not None:
            self.gp.flush(1.0)

    def _lr(self):
        if self._scheduler is not None and hasattr(self._scheduler, "get_last_lr"):
            try:
                return float(self._scheduler.get_last_lr()[0])
            except Exception:
                pass
        if self._optimizer is not None and getattr(self._optimizer, "param_groups", None):
            return float(self._optimizer.param_groups[0]["lr"])
        return None
