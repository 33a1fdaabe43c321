"""What the framework integrations share: a training DataLoader made to follow the knobs.

A framework builds its own training DataLoader, and torch forbids giving a DataLoader another
batch sampler once it is made. So the loader's own ``torch.utils.data.BatchSampler`` is turned
into a ``StepBatchSampler`` (its class is swapped; its sampler, batch size and ``drop_last``
stay): it forms each batch with the size the ``batch_size`` knob has *at the optimizer step the
batch belongs to* (``Trainer.knob_for_step``). Frameworks fetch batches ahead of the loop
(Accelerate and Lightning one batch, DataLoader workers ``prefetch_factor * num_workers``), so
a batch is formed before the step that applies a change; sizing by the batch's own step keeps
every rank's switch at the agreed step. Gradient accumulation is kept: a step is
``accumulation`` batches, each of the new size.

``prefetch`` (``prefetch_factor``) is changed in the running DataLoader iterator: deeper
by queueing more batches at once, shallower by queueing fewer as batches are taken.

Where the loader is not one this can drive (no torch ``BatchSampler``, an iterable dataset,
Accelerate's ``split_batches``), ``Plan.why_not`` says why, and the integrations refuse the
change with that reason and save a checkpoint to restart from.

Needs torch; private torch and Accelerate attributes are used only where present (checked
here), never assumed.
"""

import collections
import itertools
import logging

from torch.utils.data import BatchSampler

log = logging.getLogger("gpupilot")

__all__ = ["Hooks", "Plan", "StepBatchSampler", "rescale_lr"]

# Batches formed but not yet in a reported step, kept per plan at most (a bound, not a need).
_MAX_FORMED = 4096


class Plan(object):
    """One training run's link between its loader, its steps and the knobs.

    ``gp`` is the ``gpupilot.Trainer``; ``accumulation`` the batches per optimizer step; the
    framework gives ``done_steps`` (a function: the optimizer steps done) or calls
    ``epoch_started(done_steps)`` before each epoch's batches are drawn, and calls
    ``step_done(step)`` after each optimizer step, which returns this rank's samples so far.
    """

    def __init__(self, gp, accumulation=1, wait_s=1.0, done_steps=None):
        self.gp = gp
        # The optimizer steps done so far, read when an epoch's batches start to be drawn
        # (a framework that draws them before its epoch hook runs); else ``epoch_started``.
        self.done_steps = done_steps
        self.accumulation = max(1, int(accumulation or 1))
        self.wait_s = wait_s
        self.why_not = None  # why the batch size cannot change live here, if it cannot
        self.prefetch_why_not = "the DataLoader was not found"
        self.sampler = None
        self.shard = None  # Accelerate's BatchSamplerShard around the sampler, if any
        self.shards = 1  # batches of the underlying sampler per batch of this rank
        self.loader = None
        self.iterator = None
        self._base = 0
        self._formed = collections.deque()
        self._samples = 0
        self._newest_formed = None

    # --- installing ---------------------------------------------------------------------

    def install(self, loader):
        """Drive ``loader`` (a DataLoader, or Accelerate's ``DataLoaderShard``). Returns
        whether the batch size can change live; ``why_not`` says why not."""
        self.loader = loader
        self._watch_iterators(loader)
        batch_sampler = getattr(loader, "batch_sampler", None)
        inner = batch_sampler
        if batch_sampler is not None and hasattr(batch_sampler, "num_processes") and hasattr(batch_sampler, "batch_sampler"):
            # Accelerate's BatchSamplerShard: rank r takes every num_processes-th batch.
            if getattr(batch_sampler, "split_batches", False):
                self.why_not = "Accelerate splits each batch over the processes (split_batches)"
                return False
            self.shard = batch_sampler
            self.shards = max(1, int(batch_sampler.num_processes))
            inner = batch_sampler.batch_sampler
            # Counted where this rank's batches come out: the shard pads an epoch's end with
            # batches of its own (even_batches), which are trained on too.
            batch_sampler.__class__ = _counting(type(batch_sampler))
            batch_sampler._gp_plan = self
        if inner is None or getattr(loader, "_dataset_kind", 0) != 0:
            self.why_not = "the training data is an iterable dataset, which is not cut into batches by a sampler"
            return False
        if not isinstance(inner, BatchSampler):
            self.why_not = "the DataLoader's batch sampler is a {} rather than torch's BatchSampler".format(
                type(inner).__name__
            )
            return False
        if type(inner) is not BatchSampler and not isinstance(inner, StepBatchSampler):
            self.why_not = "the DataLoader's batch sampler is a subclass of BatchSampler ({})".format(
                type(inner).__name__
            )
            return False
        inner.__class__ = StepBatchSampler
        inner._gp_plan = self
        self.sampler = inner
        return True

    def _watch_iterators(self, loader):
        """Keep the running DataLoader iterator at hand, for ``prefetch`` changes."""
        if not getattr(loader, "num_workers", 0):
            self.prefetch_why_not = "prefetch has no effect without DataLoader workers (dataloader_num_workers is 0)"
            return
        make = getattr(loader, "_get_iterator", None)
        if make is None:
            self.prefetch_why_not = "this torch's DataLoader does not build its iterator through _get_iterator"
            return
        plan = self

        def get_iterator():
            it = make()
            plan.iterator = it
            _bound_puts(it)
            return it

        loader._get_iterator = get_iterator
        self.prefetch_why_not = None

    # --- the clock ----------------------------------------------------------------------

    def epoch_started(self, done_steps):
        self._base = int(done_steps or 0)

    def step_of(self, index):
        """The optimizer step (numbered as reported: the first is ``done + 1``) of this
        epoch's ``index``-th batch of the underlying sampler."""
        return self._base + (index // self.shards) // self.accumulation + 1

    def size_for(self, step):
        size = self.gp.knob_for_step("batch_size", step, self.wait_s)
        if self._newest_formed is None or step > self._newest_formed:
            self._newest_formed = step
        return size if isinstance(size, int) and size >= 1 else int(self.sampler.batch_size)

    def formed(self, step, n):
        """A batch of ``n`` samples of this rank's, for ``step``."""
        if len(self._formed) < _MAX_FORMED:
            self._formed.append((step, n))

    def step_done(self, step):
        """This rank's samples through ``step`` (its batches formed for steps up to it)."""
        while self._formed and self._formed[0][0] <= step:
            self._samples += self._formed.popleft()[1]
        return self._samples

    def lead_steps(self, step):
        """Steps past the next one whose batches are formed already (for ``report``)."""
        if self._newest_formed is None:
            return None
        return max(0, self._newest_formed - (step + 1))

    # --- prefetch -----------------------------------------------------------------------

    def set_prefetch(self, value):
        """Use ``value`` as the loader's ``prefetch_factor`` now; True when it took effect."""
        if self.prefetch_why_not is not None:
            return False
        value = max(1, int(value))
        # Iterators made later (next epoch, unless workers persist) are made with it.
        try:
            self.loader.prefetch_factor = value
        except Exception:
            log.debug("gpupilot: cannot set prefetch_factor on the loader", exc_info=True)
        it = self.iterator
        if it is None or not hasattr(it, "_prefetch_factor"):
            return True
        old = it._prefetch_factor
        it._prefetch_factor = value
        if value > old:
            for _ in range((value - old) * int(getattr(it, "_num_workers", 0))):
                try:
                    it._try_put_index()
                except StopIteration:
                    break
        return True


def _bound_puts(it):
    """Let a multi-process iterator queue fewer batches than it has out (``prefetch``
    lowered): it queues the next one once it is below the new depth."""
    put = getattr(it, "_try_put_index", None)
    if put is None or not hasattr(it, "_tasks_outstanding"):
        return

    def try_put_index():
        if it._tasks_outstanding >= it._prefetch_factor * it._num_workers:
            return None
        return put()

    it._try_put_index = try_put_index


_COUNTING = {}


def _counting(shard_type):
    """A subclass of Accelerate's shard type that counts the batches it hands this rank."""
    if getattr(shard_type, "_gp_counting", False):
        return shard_type
    made = _COUNTING.get(shard_type)
    if made is None:

        def __iter__(self):
            plan = self._gp_plan
            for k, batch in enumerate(shard_type.__iter__(self)):
                plan.formed(plan.step_of(k * plan.shards), len(batch))
                yield batch

        made = type(shard_type.__name__, (shard_type,), {"__iter__": __iter__, "_gp_counting": True})
        _COUNTING[shard_type] = made
    return made


class StepBatchSampler(BatchSampler):
    """A ``BatchSampler`` whose every batch has the batch size of the step it belongs to."""

    def __iter__(self):
        plan = self._gp_plan
        if plan.done_steps is not None:
            plan.epoch_started(plan.done_steps())
        indices = iter(self.sampler)
        for index in itertools.count():
            step = plan.step_of(index)
            size = plan.size_for(step)
            batch = list(itertools.islice(indices, size))
            if not batch or (self.drop_last and len(batch) < size):
                return
            if plan.shard is not None:
                # Accelerate's shard compares each batch with its batch size to tell a full one.
                plan.shard.batch_size = size
            else:
                plan.formed(step, len(batch))
            yield batch

    def __len__(self):
        size = self._gp_plan.gp.knob("batch_size", self.batch_size) or self.batch_size
        total = len(self.sampler)
        return total // size if self.drop_last else (total + size - 1) // size


def rescale_lr(rule, optimizers, new, old, schedulers=()):
    """Scale every parameter group's learning rate for a batch size ``old`` -> ``new``:
    ``linear`` (twice the batch, twice the rate) or ``sqrt``. Schedulers' base rates follow,
    so a schedule goes on from the new rate. Returns the factor (None: no rule)."""
    if rule is None or not old or not new:
        return None
    factor = float(new) / float(old)
    if rule == "sqrt":
        factor = factor ** 0.5
    elif rule != "linear":
        raise ValueError("lr rule must be 'linear' or 'sqrt', not {!r}".format(rule))
    for optimizer in optimizers:
        for group in getattr(optimizer, "param_groups", ()):
            group["lr"] = group["lr"] * factor
            if "initial_lr" in group:
                group["initial_lr"] = group["initial_lr"] * factor
    for scheduler in schedulers:
        base = getattr(scheduler, "base_lrs", None)
        if base is not None:
            scheduler.base_lrs = [lr * factor for lr in base]
    return factor


class Hooks(object):
    """The knob callbacks every integration gives its ``gpupilot.Trainer``: refuse what its
    ``Plan`` cannot do live (saying why, and ``restart``: how to go on), and once a change
    took effect, scale the learning rate by ``lr_rule`` (``lr_targets()`` gives the optimizers
    and schedulers then) and say so in the acknowledgement."""

    def __init__(self, plan, lr_rule, lr_targets, restart=""):
        self.plan = plan
        self.lr_rule = lr_rule
        self.lr_targets = lr_targets
        self.restart = restart
        self.refused = False  # a batch change was refused since the integration last looked

    def register(self, gp):
        gp.on_change("batch_size", self.check_batch)
        gp.on_change("prefetch", self.check_prefetch)
        gp.on_applied("batch_size", self.batch_applied)
        gp.on_applied("prefetch", self.prefetch_applied)

    def check_batch(self, new, old):
        if self.plan.why_not is not None:
            self.refused = True
            raise ValueError("the batch size cannot change live here: {}{}".format(self.plan.why_not, self.restart))
        return True

    def check_prefetch(self, new, old):
        if self.plan.prefetch_why_not is not None:
            raise ValueError(self.plan.prefetch_why_not)
        if new < 1:
            raise ValueError("prefetch must be at least 1 with DataLoader workers")
        return True

    def batch_applied(self, new, old):
        optimizers, schedulers = self.lr_targets()
        factor = rescale_lr(self.lr_rule, optimizers, new, old, schedulers)
        if factor is None:
            return "gradient accumulation kept; learning rate unchanged"
        return "gradient accumulation kept; learning rate x{:.4g} ({} rule)".format(factor, self.lr_rule)

    def prefetch_applied(self, new, old):
        if not self.plan.set_prefetch(new):
            return "prefetch_factor not changed: {}".format(self.plan.prefetch_why_not)
        return None


def check_lr_rule(rule):
    if rule not in (None, "linear", "sqrt"):
        raise ValueError("lr_rule must be None, 'linear' or 'sqrt', not {!r}".format(rule))
    return rule
