"""PyTorch helpers: a DataLoader whose batch size and prefetch depth follow gpupilot's knobs.

    from gpupilot.torch import KnobBatchSampler, KnobLoader, loader_kwargs

    sampler = KnobBatchSampler(RandomSampler(dataset), gp)           # batch size from the knob
    loader = KnobLoader(
        lambda prefetch, workers: DataLoader(
            dataset, batch_sampler=sampler, **loader_kwargs(prefetch, workers)),
        gp)
    for epoch in range(epochs):
        for x, y in loader:
            ...

``KnobBatchSampler`` forms each batch with the knob's value at that moment. ``KnobLoader``
rebuilds the DataLoader when the ``prefetch`` (``prefetch_factor``) or ``workers`` knob changed,
between two batches; when the loader's batch sampler is the same ``KnobBatchSampler`` each time,
the epoch goes on where it was (the batches the old workers had loaded but not delivered are
loaded again, none is lost or repeated).

Importing this module needs torch; ``import gpupilot`` never imports it.
"""

import logging
import time

try:
    import torch as _torch
    from torch.utils.data import Sampler as _Sampler
except ImportError as _exc:  # pragma: no cover - exercised where torch is missing
    raise ImportError(
        "gpupilot.torch needs PyTorch, which is not installed here ({}); install torch, or use "
        "gpupilot's knobs directly (gp.pending('batch_size'), gp.knob('prefetch'))".format(_exc)
    )

__all__ = ["KnobBatchSampler", "KnobLoader", "loader_kwargs", "scale_lr_with_batch"]

log = logging.getLogger("gpupilot")


def loader_kwargs(prefetch, workers):
    """DataLoader keyword arguments for a prefetch depth and a worker count.

    ``prefetch_factor`` only exists with workers: torch 2 wants it left out (None) with
    ``num_workers=0`` and older torch rejects any value but its default there, so it is left out.
    """
    workers = int(workers or 0)
    kwargs = {"num_workers": workers}
    if workers > 0 and prefetch is not None:
        kwargs["prefetch_factor"] = max(1, int(prefetch))
    return kwargs


class _Epoch(object):
    """One pass over the sampler, resumable after a rebuild of the loader."""

    def __init__(self, indices):
        self.indices = indices
        self.pending = []  # indices drawn from the sampler, not yet in a batch
        self.exhausted = False
        self.handed = []  # batches yielded, not yet delivered (tracked for a KnobLoader only)
        self.requeued = []  # batches to yield again first after a rebuild


class KnobBatchSampler(_Sampler):
    """Batches of indices whose size follows a knob, from the next batch on.

    Use it as ``DataLoader(dataset, batch_sampler=KnobBatchSampler(sampler, gp))``. With workers,
    a DataLoader forms batches ahead of use (``prefetch_factor * num_workers`` of them), so a new
    size reaches the training loop after those.
    """

    def __init__(self, sampler, trainer, knob="batch_size", drop_last=False):
        self.sampler = sampler
        self.trainer = trainer
        self.knob = knob
        self.drop_last = bool(drop_last)
        size = trainer.knob(knob)
        if not isinstance(size, int) or size < 1:
            raise ValueError(
                "KnobBatchSampler needs a batch size: give the knob a default, "
                "gpupilot.connect(knobs={{{!r}: 64}})".format(knob)
            )
        self._epoch = None
        self._resume = False
        self._tracking = False

    def _size(self):
        size = self.trainer.knob(self.knob)
        return size if isinstance(size, int) and size >= 1 else 1

    def __iter__(self):
        if self._resume and self._epoch is not None:
            epoch = self._epoch
        else:
            epoch = self._epoch = _Epoch(iter(self.sampler))
        self._resume = False
        while True:
            # A newer pass (a rebuilt loader) owns the epoch: this generator is a leftover.
            if self._epoch is not epoch:
                return
            if epoch.requeued:
                batch = epoch.requeued.pop(0)
            else:
                batch = self._next_batch(epoch)
                if batch is None:
                    return
            if self._tracking:
                epoch.handed.append(batch)
            yield batch

    def _next_batch(self, epoch):
        size = self._size()
        batch = epoch.pending
        epoch.pending = []
        while len(batch) < size and not epoch.exhausted:
            try:
                batch.append(next(epoch.indices))
            except StopIteration:
                epoch.exhausted = True
        if len(batch) > size:  # the size shrank while indices waited
            epoch.pending = batch[size:]
            batch = batch[:size]
        if not batch or (len(batch) < size and self.drop_last):
            return None
        return batch

    def __len__(self):
        size = self._size()
        total = len(self.sampler)
        return total // size if self.drop_last else (total + size - 1) // size

    # --- used by KnobLoader ------------------------------------------------------------------

    def _start_tracking(self):
        self._tracking = True
        self._epoch = None
        self._resume = False

    def _delivered(self):
        epoch = self._epoch
        if epoch is not None and epoch.handed:
            epoch.handed.pop(0)

    def _suspend(self):
        """The loader is being rebuilt: hand the undelivered batches out again first."""
        epoch = self._epoch
        if epoch is None:
            return
        epoch.requeued = epoch.handed + epoch.requeued
        epoch.handed = []
        self._resume = True


class KnobLoader(object):
    """Iterates a DataLoader that is rebuilt when the prefetch or worker count knob changes.

    ``make_loader(prefetch, workers)`` returns a DataLoader; ``prefetch`` is None when
    ``workers`` is 0 (see ``loader_kwargs``). Each ``iter()`` is one epoch. A change takes effect
    at the next batch: the current batch is finished, the old workers are shut down, and the new
    loader goes on with the epoch (seamlessly when its batch sampler is a shared
    ``KnobBatchSampler``; otherwise it starts a fresh pass and stops after the batches the epoch
    still had, so the epoch keeps its length). ``wait_s`` is how long the last batch took to come.

    A change of ``prefetch`` is refused while there are no workers: it would change nothing.
    """

    def __init__(
        self,
        make_loader,
        trainer,
        prefetch_knob="prefetch",
        workers_knob="workers",
        default_prefetch=2,
        default_workers=0,
    ):
        self.make_loader = make_loader
        self.trainer = trainer
        self.prefetch_knob = prefetch_knob
        self.workers_knob = workers_knob
        self.default_prefetch = default_prefetch
        self.default_workers = default_workers
        self.wait_s = 0.0
        self.rebuilds = 0
        self._prefetch = trainer.watch(prefetch_knob)
        self._workers = trainer.watch(workers_knob)
        self._loader = None
        self._built_with = None
        self._warned = False
        trainer.on_change(prefetch_knob, self._check_prefetch)

    def _check_prefetch(self, new, old):
        workers = self.trainer.knob(self.workers_knob, self.default_workers)
        if not workers:
            raise ValueError(
                "prefetch has no effect without DataLoader workers ({} is 0)".format(self.workers_knob)
            )
        if new < 1:
            raise ValueError("prefetch must be at least 1 with DataLoader workers")
        return True

    @property
    def loader(self):
        """The current DataLoader (built on first use)."""
        if self._loader is None or self._stale():
            self._build()
        return self._loader

    def _values(self):
        prefetch = self._prefetch.read()
        workers = self._workers.read()
        prefetch = self.default_prefetch if prefetch is None else prefetch
        workers = self.default_workers if workers is None else workers
        return (prefetch if workers else None), workers

    def _stale(self):
        return self._prefetch.changed() or self._workers.changed()

    def _build(self):
        prefetch, workers = self._values()
        self._loader = self.make_loader(prefetch, workers)
        self._built_with = (prefetch, workers)
        sampler = getattr(self._loader, "batch_sampler", None)
        if isinstance(sampler, KnobBatchSampler) and not sampler._tracking:
            sampler._start_tracking()
        return self._loader

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        loader = self.loader
        sampler = _knob_sampler(loader)
        if sampler is not None:
            sampler._start_tracking()
        iterator = iter(loader)
        delivered = 0
        remaining = None  # batches the epoch still has, after a rebuild that could not resume
        try:
            while True:
                if self._stale():
                    iterator, loader, sampler, remaining = self._rebuild(
                        iterator, loader, sampler, delivered, remaining
                    )
                if remaining is not None and remaining <= 0:
                    return
                started = time.perf_counter()
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                self.wait_s = time.perf_counter() - started
                delivered += 1
                if sampler is not None:
                    sampler._delivered()
                if remaining is not None:
                    remaining -= 1
                yield batch
        finally:
            _shutdown(iterator)

    def _rebuild(self, iterator, loader, sampler, delivered, remaining):
        old = self._built_with
        if sampler is not None:
            sampler._suspend()
        _shutdown(iterator)
        del iterator
        new_loader = self._build()
        self.rebuilds += 1
        new_sampler = _knob_sampler(new_loader)
        if sampler is not None and new_sampler is sampler:
            log.info("gpupilot: DataLoader rebuilt (prefetch, workers) %s -> %s", old, self._built_with)
            return iter(new_loader), new_loader, sampler, remaining
        # The epoch cannot go on where it was: take the rest of it from a fresh pass.
        if remaining is None:
            try:
                remaining = len(loader) - delivered
            except TypeError:
                remaining = None
        if not self._warned:
            self._warned = True
            log.warning(
                "gpupilot: the DataLoader was rebuilt mid-epoch and its batch sampler cannot resume, "
                "so the rest of this epoch comes from a fresh pass; give make_loader one shared "
                "gpupilot.torch.KnobBatchSampler to keep the epoch exact"
            )
        if new_sampler is not None:
            new_sampler._start_tracking()
        return iter(new_loader), new_loader, new_sampler, remaining


def _knob_sampler(loader):
    sampler = getattr(loader, "batch_sampler", None)
    return sampler if isinstance(sampler, KnobBatchSampler) else None


def _shutdown(iterator):
    # Stop the old workers now rather than when the iterator is collected.
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        try:
            stop()
        except Exception:
            log.debug("gpupilot: shutting down DataLoader workers failed", exc_info=True)


def cuda_oom_error():
    """The exception type torch raises when CUDA runs out of memory (RuntimeError on old torch)."""
    return getattr(_torch.cuda, "OutOfMemoryError", RuntimeError)


def scale_lr_with_batch(optimizer, trainer, knob="batch_size"):
    """Scale every parameter group's learning rate with the batch size (the linear rule: twice
    the batch, twice the rate), each time a change of ``knob`` takes effect. Off unless called.

    It runs as an ``on_applied`` callback: in a distributed job on the training thread, between
    two steps, at the same step on every rank, so the ranks' optimizers stay alike. Returns the
    callback (``trainer``'s, until the process ends).
    """

    def rescale(new, old):
        if not old or not new:
            return
        factor = float(new) / float(old)
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * factor
        log.info("gpupilot: learning rate scaled by %.4g for %s %s -> %s", factor, knob, old, new)

    return trainer.on_applied(knob, rescale)
