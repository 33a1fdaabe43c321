"""gpupilot: let a training script report metrics to gpupilot and follow its knob changes.

    import gpupilot

    gp = gpupilot.connect(knobs={"batch_size": 64, "prefetch": 2})
    for step, batch in enumerate(loader):
        ...
        gp.report(step=step, loss=loss, samples_per_s=rate)

Under gpupilot (``GPUPILOT_SOCKET`` and ``GPUPILOT_RUN_ID`` set by the daemon for a supervised
run) a background thread attaches to the run, sends the reports and applies the knob changes the
operator asks for. In a distributed job (``RANK`` and ``WORLD_SIZE`` set, as torchrun and
``gpupilot ranks`` do) every rank attaches as itself, and a change is applied by every rank at
the same step: the one after the step it reported last when that step comes (see ``report``). Anywhere else ``connect`` returns a trainer that does nothing over the wire but
still holds the knobs, so the same script runs unchanged. Nothing here raises into the training
loop or waits on the daemon. Standard library only; PyTorch helpers live in ``gpupilot.torch``.

Imported under a gpupilot run (``GPUPILOT_RUN_ID`` set), it makes ``sys.stdout`` and
``sys.stderr`` write each whole line in one ``write()`` (``whole_lines``), so that ranks sharing
one output file never glue their lines together.
"""

import atexit
import logging
import math
import numbers
import os
import socket
import threading
from time import monotonic as _monotonic

from ._channel import Channel
from ._lines import LineWriter, whole_lines

# The release of gpupilot this SDK comes with: the workspace version in Cargo.toml, the one
# source of truth (tests/cli/packaging.rs fails when they differ; the wheel takes it from here).
__version__ = "0.1.0"
__all__ = ["connect", "Trainer", "Watch", "PROTOCOL_KNOBS", "LineWriter", "whole_lines", "__version__"]

log = logging.getLogger("gpupilot")

# The knobs the daemon knows (docs/protocol.md, `knob_set`). Other knobs ("workers", ...) work
# within the script (``Trainer.set``) but are not announced to the daemon.
PROTOCOL_KNOBS = ("batch_size", "prefetch")
# The smallest value that makes sense for a knob; any other knob is a whole number >= 0.
_KNOB_MIN = {"batch_size": 1}

_INT_FIELDS = ("step", "epoch", "batch_size", "prefetch", "samples", "lead_steps")
# Whose figures a report gives: this rank's own (the job's are the sum), or the whole job's.
_SCOPES = ("rank", "job")
_FLOAT_FIELDS = ("loss", "samples_per_s", "step_time_s", "data_wait_s")
_MAX_TEXT = 8192

_live = set()

# Under a gpupilot run, whose ranks may share one output file, every line printed is written
# whole (``_lines``); GPUPILOT_WHOLE_LINES=0 leaves sys.stdout and sys.stderr as they are.
if os.environ.get("GPUPILOT_RUN_ID") and os.environ.get("GPUPILOT_WHOLE_LINES", "1") != "0":
    whole_lines()


def connect(knobs=None, ranges=None, queue_size=1024, env=None, gpu=None):
    """The ``Trainer`` for this process (call it once: each trainer holds its own connection).

    ``knobs`` maps knob names to the script's defaults (whole numbers); ``GPUPILOT_BATCH_SIZE``,
    ``GPUPILOT_PREFETCH`` (any ``GPUPILOT_<KNOB>``) in the environment win over them, since the
    operator's profile and restarts set those. ``ranges`` bounds knobs, as ``{"batch_size": (1,
    1024)}`` or ``{"batch_size": {"min": 1, "max": 1024}}``; the daemon uses it for knobs its
    profile does not bound. ``queue_size`` bounds the reports waiting for the daemon (the oldest
    are dropped). ``env`` replaces ``os.environ`` (tests). ``gpu`` is the physical index of the
    GPU this process trains on, where ``LOCAL_RANK`` and ``CUDA_VISIBLE_DEVICES`` do not tell it.

    Without ``GPUPILOT_SOCKET`` and ``GPUPILOT_RUN_ID`` the trainer is local: every method works
    and nothing is sent. On a node other than the run's (``GPUPILOT_RUN_NODE``, a Slurm job's
    compute node) it attaches through this node's own daemon, which relays it there (``_route``).
    """
    env = os.environ if env is None else env
    values = _initial_knobs(knobs, env)
    socket_path = env.get("GPUPILOT_SOCKET") or None
    run_id = env.get("GPUPILOT_RUN_ID") or None
    if socket_path is None or run_id is None:
        return Trainer(values, ranges)
    socket_path, via_node = _route(env, socket_path)
    trainer = Trainer(
        values,
        ranges,
        run_id=run_id,
        socket_path=socket_path,
        queue_size=queue_size,
        rank=_rank_spec(env, gpu),
    )
    trainer._channel.via_node = via_node
    trainer._start()
    return trainer


class Trainer(object):
    """One training process's side of gpupilot: knobs, reports, errors.

    Methods are safe from any thread. ``on_change`` callbacks run on the SDK's background thread.
    """

    def __init__(self, knobs=None, ranges=None, run_id=None, socket_path=None, queue_size=1024, rank=None):
        self.run_id = run_id
        self.socket_path = socket_path
        # Which rank of a distributed job this is (None: a single process).
        self.rank = rank
        # The number of the step the loop does next (after ``report(step=k)``: k + 1).
        self._next_step = None
        # The last step whose batch the data pipeline has formed (``knob_for_step``), when a
        # loader forms batches ahead of the loop.
        self._formed_step = None
        # Changes to several ranks this rank agreed to, by seq: applied at their step once
        # committed (``_advance``).
        self._staged = {}
        self._applied_callbacks = {}
        self._lock = threading.RLock()
        # Signalled when a decision on a change to several ranks comes (``knob_for_step``).
        self._decided = threading.Condition(self._lock)
        # Serialises knob changes (pushes and ``set``) so callbacks see them one at a time.
        self._change_lock = threading.RLock()
        self._knobs = {}
        for name, value in (knobs or {}).items():
            self._knobs[name] = _script_value(name, value)
        self._ranges = _normalize_ranges(ranges)
        self._generation = dict((name, 0) for name in self._knobs)
        # Knobs the script reads or declared: a change to any other would have no effect, so it
        # is refused rather than acknowledged.
        self._used = set(self._knobs)
        self._callbacks = {}
        self._pending_watches = {}
        self._closed = False
        self._channel = None
        if socket_path is not None and run_id is not None:
            self._channel = Channel(
                socket_path,
                run_id,
                _Handler(self),
                "gpupilot-python {}".format(__version__),
                queue_size=queue_size,
                rank=rank,
            )

    def _start(self):
        try:
            self._channel.start()
            _live.add(self)
        except Exception as exc:  # no thread, no channel: carry on locally
            log.warning("gpupilot: cannot start the background thread (%s); not reporting", exc)
            self._channel = None

    # --- state -------------------------------------------------------------------------------

    @property
    def enabled(self):
        """True under gpupilot (there is a daemon to talk to), False for a local trainer."""
        return self._channel is not None

    @property
    def connected(self):
        """True while attached to the run through the daemon."""
        return self._channel is not None and self._channel.connected

    @property
    def knobs(self):
        """A copy of every knob's current value."""
        with self._lock:
            return dict(self._knobs)

    @property
    def dropped(self):
        """Reports dropped so far (the queue was full, or they waited too long for the daemon)."""
        return self._channel.metrics.dropped if self._channel is not None else 0

    @property
    def queued(self):
        """Reports waiting to be sent."""
        return len(self._channel.metrics) if self._channel is not None else 0

    def knob(self, name, default=None):
        """The knob's current value, or ``default`` when it has none. Reading a knob marks it used."""
        with self._lock:
            self._used.add(name)
            return self._knobs.get(name, default)

    def watch(self, name):
        """A ``Watch`` on one knob, with its own memory of which change it saw last."""
        return Watch(self, name)

    def pending(self, name):
        """The knob's new value if it changed since the last ``pending(name)``, else None.

        Call it at a batch boundary to apply a change there; the first call reports any change
        made since ``connect``. One consumer per knob: others should use their own ``watch``.
        """
        with self._lock:
            watch = self._pending_watches.get(name)
            if watch is None:
                watch = Watch(self, name, since_start=True)
                self._pending_watches[name] = watch
        return watch.take()

    def on_change(self, name, callback=None):
        """Call ``callback(new, old)`` before a change of ``name`` takes effect.

        It runs on the background thread, before the daemon gets its acknowledgement, so it must
        be quick. Raising, or returning False, refuses the change: the knob keeps its value and the
        daemon is told why (the exception's text). Usable as a decorator.
        """
        if callback is None:
            return lambda cb: self.on_change(name, cb)
        with self._lock:
            self._used.add(name)
            self._callbacks.setdefault(name, []).append(callback)
        return callback

    def on_applied(self, name, callback=None):
        """Call ``callback(new, old)`` once a change of ``name`` has taken effect.

        For a change to several ranks it runs on the training thread, inside the ``report`` that
        reaches the change's step (so between two steps, on every rank at the same step); for a
        single process, on the background thread right after the change. Exceptions are logged,
        never raised. A callback that returns a string says what it changed with it ("learning
        rate ×2 (linear rule)"): the acknowledgement carries it to the daemon, which records it
        with the change. Usable as a decorator.
        """
        if callback is None:
            return lambda cb: self.on_applied(name, cb)
        with self._lock:
            self._used.add(name)
            self._applied_callbacks.setdefault(name, []).append(callback)
        return callback

    def set(self, name, value):
        """Change a knob from the script (the same checks and callbacks as a daemon push).

        Returns True when it took effect; a refusal is logged with its reason.
        """
        with self._lock:
            self._used.add(name)
        applied, reason = self._change(name, value)
        if not applied:
            log.warning("gpupilot: knob %s stays as it is: %s", name, reason)
        return applied

    # --- reporting ---------------------------------------------------------------------------

    def report(
        self,
        step=None,
        epoch=None,
        loss=None,
        samples_per_s=None,
        step_time_s=None,
        data_wait_s=None,
        batch_size=None,
        prefetch=None,
        samples=None,
        scope=None,
        lead_steps=None,
        **extra
    ):
        """Queue a metrics report; never blocks, never raises.

        Every field is optional. ``batch_size`` and ``prefetch`` default to the knobs' current
        values. ``extra`` maps names to numbers (anything else is left out; ``tokens_per_s``
        is summed over ranks like ``samples_per_s``). NaN and infinite values are left out
        too: they are not JSON.

        In a job of several ranks each rank reports its own figures, and gpupilot sums them
        (samples/s, samples, tokens/s). ``samples`` is the samples trained so far (a
        cumulative count; without it, steps times the batch size are counted, from the first
        report on, so report every step or give the count). Where a framework logs figures
        that are already the whole job's (global throughput on rank 0 only), pass
        ``scope="job"``: those are then the job's and are never summed with the others.

        ``step`` is the step just done. In a distributed job it is also the clock of knob
        changes: one agreed for step S takes effect in the ``report`` of step S − 1, so the next
        ``knob()`` read (and the next batch a ``KnobBatchSampler`` forms) sees it on every rank
        at the same step. Report the step every step, or at the same steps on every rank.

        ``lead_steps``: how many steps past the next one the data pipeline has formed batches
        for already (a loader that fetches ahead, read through ``knob_for_step``); the daemon
        proposes changes for a step beyond them.
        """
        channel = self._channel
        if channel is None or self._closed:
            return
        try:
            self._report(
                channel, step, epoch, loss, samples_per_s, step_time_s, data_wait_s, batch_size, prefetch, extra,
                samples=samples, scope=scope, lead_steps=lead_steps,
            )
        except Exception:
            log.debug("gpupilot: report failed", exc_info=True)
        done = _as_count(step)
        if done is not None:
            try:
                self._advance(done + 1)
            except Exception:
                log.debug("gpupilot: applying a staged change failed", exc_info=True)

    def _report(
        self, channel, step, epoch, loss, samples_per_s, step_time_s, data_wait_s, batch_size, prefetch, extra,
        samples=None, scope=None, lead_steps=None,
    ):
        if batch_size is None:
            batch_size = self._knobs.get("batch_size")
        if prefetch is None:
            prefetch = self._knobs.get("prefetch")
        given = {
            "step": step,
            "epoch": epoch,
            "loss": loss,
            "samples_per_s": samples_per_s,
            "step_time_s": step_time_s,
            "data_wait_s": data_wait_s,
            "batch_size": batch_size,
            "prefetch": prefetch,
            "samples": samples,
            "lead_steps": lead_steps,
        }
        frame = {"type": "metrics"}
        if scope is not None:
            if scope not in _SCOPES:
                # Summed or not is the whole difference: a report of unknown scope is left out.
                log.warning("gpupilot: report left out: scope must be one of %s, not %r", ", ".join(_SCOPES), scope)
                return
            frame["scope"] = scope
        for key in _INT_FIELDS:
            value = _as_count(given[key])
            if value is not None:
                frame[key] = value
        for key in _FLOAT_FIELDS:
            value = _as_number(given[key])
            if value is not None:
                frame[key] = value
        numbers_only = {}
        for key, value in extra.items():
            value = _as_number(value)
            if value is not None:
                numbers_only[key] = value
        if numbers_only:
            frame["extra"] = numbers_only
        channel.send(frame)

    def _advance(self, next_step):
        """The loop is about to do step ``next_step``: apply the agreed changes due by then."""
        with self._lock:
            self._next_step = next_step
            due = [(seq, st) for seq, st in self._staged.items() if st["apply_step"] <= next_step]
            for seq, _ in due:
                del self._staged[seq]
        for seq, st in sorted(due, key=lambda item: item[1]["apply_step"]):
            name, value = st["name"], st["value"]
            ack = {"type": "knob_ack", "seq": seq, "step": next_step}
            if st["committed"]:
                old = self._commit(name, value)
                ack["applied"] = True
                note = self._run_applied(name, value, old)
                if note:
                    ack["reason"] = note
            else:
                # No decision before the step: nothing changes here (the daemon brings every
                # rank back to one value if another rank did change).
                ack["applied"] = False
                if st.get("too_late") is not None:
                    ack["reason"] = "the batch of step {} was formed before a decision came; keeping {} = {}".format(
                        st["too_late"], name, self._knobs.get(name)
                    )
                else:
                    ack["reason"] = "no decision had come by step {}; keeping {} = {}".format(
                        st["apply_step"], name, self._knobs.get(name)
                    )
                log.warning("gpupilot: %s", ack["reason"])
            channel = self._channel
            if channel is not None:
                channel.send(ack, priority=True)

    def knob_for_step(self, name, step, wait_s=1.0):
        """The value ``name`` has at step ``step``, for a data pipeline that forms the batch of
        ``step`` before the loop gets there (a loader that fetches ahead).

        In a distributed job a change agreed for step S takes effect in the ``report`` of step
        S − 1, which comes after a loader that fetches ahead has formed the batch of S. This
        gives the value step ``step`` will have: a committed change due by then counts. From
        this call on the rank votes against changes for steps up to ``step`` (their batches
        are formed); a change proposed for a step up to ``step`` and not decided yet is waited
        for, up to ``wait_s`` seconds (the daemon decides within a fraction of a second), and
        then kept out: the rank will not apply it, and says so when the step comes. Steps are
        numbered as ``report`` numbers them.
        """
        deadline = None
        with self._lock:
            self._used.add(name)
            if self._formed_step is None or step > self._formed_step:
                self._formed_step = step
            while True:
                due = [st for st in self._staged.values() if st["name"] == name and st["apply_step"] <= step]
                open_ = [st for st in due if not st["committed"] and st.get("too_late") is None]
                if not open_:
                    break
                if deadline is None:
                    deadline = _monotonic() + max(0.0, wait_s)
                left = deadline - _monotonic()
                if left <= 0:
                    for st in open_:
                        st["too_late"] = step
                    break
                self._decided.wait(left)
            value = self._knobs.get(name)
            for st in sorted(due, key=lambda st: st["apply_step"]):
                if st["committed"]:
                    value = st["value"]
            return value

    def error(self, kind, message, **fields):
        """Tell the daemon the training failed: ``kind`` is "oom" or "other". Never raises.

        ``fields`` adds numbers or short texts (``batch_size`` defaults to the knob's value). The
        report goes ahead of queued metrics; ``close`` (also run at exit) waits briefly for it.
        """
        channel = self._channel
        if channel is None or self._closed:
            return
        try:
            if kind not in ("oom", "other"):
                log.warning("gpupilot: error kind %r is neither 'oom' nor 'other'; sending 'other'", kind)
                kind = "other"
            frame = {"type": "trainer_error", "kind": kind, "message": str(message)[:_MAX_TEXT]}
            if "batch_size" not in fields and self._knobs.get("batch_size") is not None:
                fields["batch_size"] = self._knobs.get("batch_size")
            for key, value in fields.items():
                if key in ("type", "id", "kind", "message"):
                    continue
                if isinstance(value, str):
                    frame[key] = value[:_MAX_TEXT]
                    continue
                number = _as_count(value) if key in _INT_FIELDS else _as_number(value)
                if number is not None:
                    frame[key] = number
            channel.send(frame, priority=True)
        except Exception:
            log.debug("gpupilot: error report failed", exc_info=True)

    def flush(self, timeout=1.0):
        """Wait up to ``timeout`` s for queued frames to be written; True if they were."""
        if self._channel is None:
            return True
        return self._channel.flush(timeout)

    def close(self, timeout=1.0):
        """Send what is queued (waiting up to ``timeout`` s) and stop the background thread."""
        if self._closed:
            return
        self._closed = True
        if self._channel is not None:
            try:
                self._channel.close(timeout)
            except Exception:
                log.debug("gpupilot: close failed", exc_info=True)
        _live.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    def __repr__(self):
        if self._channel is None:
            where = "local"
        else:
            where = "run {} ({})".format(self.run_id, "connected" if self.connected else "connecting")
        return "<gpupilot.Trainer {} knobs={}>".format(where, self.knobs)

    # --- knob changes ------------------------------------------------------------------------

    def _generation_of(self, name):
        with self._lock:
            return self._generation.get(name, 0), self._knobs.get(name)

    def _change(self, name, value):
        """Check, run the callbacks, then commit; returns (applied, reason)."""
        with self._change_lock:
            new, old, reason = self._vet(name, value)
            if reason is not None:
                return False, reason
            if new == old:
                return True, None
            self._commit(name, new)
        return True, self._run_applied(name, new, old)

    def _vet(self, name, value):
        """(new, old, None) when ``value`` may be used for ``name`` (callbacks agreeing), else
        (None, old, why not)."""
        if not isinstance(name, str) or not name:
            return None, None, "a knob push without a knob name"
        with self._lock:
            used = name in self._used
            old = self._knobs.get(name)
            callbacks = list(self._callbacks.get(name, ()))
            bounds = self._ranges.get(name)
        if not used:
            return None, old, "this script does not use the knob {}".format(name)
        new, reason = _check_value(name, value, bounds)
        if reason is not None:
            return None, old, reason
        if new == old:
            return new, old, None
        for callback in callbacks:
            try:
                verdict = callback(new, old)
            except Exception as exc:
                return None, old, str(exc) or type(exc).__name__
            if verdict is False:
                return None, old, "the script refused {} = {}".format(name, new)
        return new, old, None

    def _commit(self, name, new):
        """Use ``new`` for ``name`` from now on; returns the old value."""
        with self._lock:
            old = self._knobs.get(name)
            if old == new:
                return old
            self._knobs[name] = new
            self._generation[name] = self._generation.get(name, 0) + 1
        log.info("gpupilot: knob %s %s -> %s", name, old, new)
        return old

    def _run_applied(self, name, new, old):
        """Run the ``on_applied`` callbacks; returns their notes joined (None: no note)."""
        if new == old:
            return None
        with self._lock:
            callbacks = list(self._applied_callbacks.get(name, ()))
        notes = []
        for callback in callbacks:
            try:
                note = callback(new, old)
            except Exception:
                log.exception("gpupilot: an on_applied callback of %s failed", name)
                continue
            if isinstance(note, str) and note:
                notes.append(note[:_MAX_TEXT])
        return "; ".join(notes) or None


class Watch(object):
    """Follows one knob for one consumer: ``take()`` hands each change over once."""

    def __init__(self, trainer, name, since_start=False):
        self.name = name
        self._trainer = trainer
        with trainer._lock:
            trainer._used.add(name)
        self._seen = 0 if since_start else trainer._generation_of(name)[0]

    @property
    def value(self):
        """The knob's current value (None when it has none)."""
        return self._trainer._generation_of(self.name)[1]

    def changed(self):
        """True when the knob changed since this watch last looked (``take``/``read``)."""
        return self._trainer._generation_of(self.name)[0] != self._seen

    def read(self):
        """The current value, marking it seen."""
        generation, value = self._trainer._generation_of(self.name)
        self._seen = generation
        return value

    def take(self):
        """The new value if the knob changed since this watch last looked, else None."""
        generation, value = self._trainer._generation_of(self.name)
        if generation == self._seen:
            return None
        self._seen = generation
        return value


class _Handler(object):
    """What the channel asks of its trainer (a connected trainer lives until ``close`` or exit)."""

    def __init__(self, trainer):
        self._trainer = trainer

    def attach_payload(self):
        trainer = self._trainer
        with trainer._lock:
            knobs = dict((k, v) for k, v in trainer._knobs.items() if k in PROTOCOL_KNOBS)
            ranges = {}
            for name, bounds in trainer._ranges.items():
                if name in PROTOCOL_KNOBS:
                    # The daemon's range always has a minimum; the knob's own floor stands in.
                    entry = {"min": bounds.get("min", _KNOB_MIN.get(name, 0))}
                    if "max" in bounds:
                        entry["max"] = bounds["max"]
                    ranges[name] = entry
        return knobs, ranges

    def apply_pushed_knob(self, name, value):
        trainer = self._trainer
        applied, reason = trainer._change(name, value)
        if not applied:
            log.warning("gpupilot: refused knob %s = %r: %s", name, value, reason)
        return applied, reason

    def attached(self, values):
        """The daemon's values for the run. A rank of a distributed job that has not started
        training yet takes the job's values (it attached late, or was restarted alone)."""
        trainer = self._trainer
        if not trainer.rank or trainer.rank.get("world_size", 1) <= 1:
            return
        with trainer._lock:
            started = trainer._next_step is not None
            differ = dict(
                (k, v) for k, v in values.items()
                if k in PROTOCOL_KNOBS and k in trainer._used and trainer._knobs.get(k) != v
            )
        if started or not differ:
            return
        for name, value in sorted(differ.items()):
            applied, reason = trainer._change(name, value)
            if applied:
                log.info("gpupilot: taking the job's %s = %s", name, value)
            else:
                log.warning("gpupilot: cannot take the job's %s = %r: %s", name, value, reason)

    def propose_knob(self, seq, name, value, apply_step):
        """A change to several ranks proposed for ``apply_step``: (ready, reason, step)."""
        trainer = self._trainer
        with trainer._lock:
            next_step = trainer._next_step
        done = None if next_step is None else next_step - 1
        if next_step is not None and next_step >= apply_step:
            return False, "already at step {}, past the apply step {}".format(next_step, apply_step), done
        with trainer._lock:
            formed = trainer._formed_step
        if formed is not None and formed >= apply_step:
            return False, "the batches up to step {} are formed already, past the apply step {}".format(
                formed, apply_step), done
        with trainer._change_lock:
            new, _old, reason = trainer._vet(name, value)
        if reason is not None:
            log.warning("gpupilot: refused knob %s = %r: %s", name, value, reason)
            return False, reason, done
        with trainer._lock:
            trainer._staged[seq] = {"name": name, "value": new, "apply_step": apply_step, "committed": False}
        return True, None, done

    def decide_knob(self, seq, commit, reason):
        trainer = self._trainer
        with trainer._lock:
            st = trainer._staged.get(seq)
            if st is None:
                return
            if commit and st.get("too_late") is None:
                st["committed"] = True
            elif not commit:
                del trainer._staged[seq]
            trainer._decided.notify_all()
        if not commit:
            log.info("gpupilot: knob change %s called off: %s", seq, reason)


# --- values ------------------------------------------------------------------------------------


def _whole(value):
    """``value`` as an int when it is a whole number (not a bool), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isfinite(value) and value == int(value):
            return int(value)
    return None


def _as_count(value):
    """A JSON-safe whole number >= 0, or None."""
    if value is None:
        return None
    if not isinstance(value, (numbers.Number, str, bytes)) and hasattr(value, "__index__"):
        try:
            value = value.__index__()
        except Exception:
            return None
    number = _whole(value)
    if number is None:
        number = _whole(_as_number(value))
    if number is None or number < 0:
        return None
    return number


def _as_number(value):
    """A JSON-safe finite int or float, or None (0-d tensors and numpy scalars are numbers)."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
    elif hasattr(value, "__float__"):
        try:
            value = float(value)
        except Exception:
            return None
    else:
        return None
    return value if math.isfinite(value) else None


def _check_value(name, value, bounds):
    """(whole number, None) when ``value`` suits the knob, else (None, why not)."""
    number = _whole(value)
    if number is None:
        return None, "{} must be a whole number, not {!r}".format(name, value)
    low = _KNOB_MIN.get(name, 0)
    if number < low:
        return None, "{} must be at least {}, not {}".format(name, low, number)
    if bounds:
        if "min" in bounds and number < bounds["min"]:
            return None, "{} = {} is below this script's minimum {}".format(name, number, bounds["min"])
        if "max" in bounds and number > bounds["max"]:
            return None, "{} = {} is above this script's maximum {}".format(name, number, bounds["max"])
    return number, None


def _script_value(name, value):
    number, reason = _check_value(name, value, None)
    if reason is not None:
        raise ValueError("gpupilot.connect: knob " + reason)
    return number


def _initial_knobs(knobs, env):
    if knobs is not None and not isinstance(knobs, dict):
        raise TypeError("gpupilot.connect: knobs must be a dict of knob names to whole numbers")
    values = {}
    for name, value in (knobs or {}).items():
        if not isinstance(name, str):
            raise TypeError("gpupilot.connect: knob names must be strings, not {!r}".format(name))
        values[name] = _script_value(name, value)
    for name in sorted(set(values) | set(PROTOCOL_KNOBS)):
        var = "GPUPILOT_" + name.upper()
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            number = int(raw.strip())
        except ValueError:
            number = None
        number, reason = _check_value(name, number, None) if number is not None else (None, "not a whole number")
        if reason is not None:
            log.warning("gpupilot: ignoring %s=%r (%s)", var, raw, reason)
            continue
        values[name] = number
    return values


def _normalize_ranges(ranges):
    if not ranges:
        return {}
    if not isinstance(ranges, dict):
        raise TypeError('gpupilot.connect: ranges must be a dict like {"batch_size": (1, 1024)}')
    out = {}
    for name, bounds in ranges.items():
        if isinstance(bounds, dict):
            low, high = bounds.get("min"), bounds.get("max")
        elif isinstance(bounds, (tuple, list)) and len(bounds) == 2:
            low, high = bounds
        else:
            raise TypeError(
                "gpupilot.connect: the range of {} must be (min, max) or {{'min': .., 'max': ..}}".format(name)
            )
        entry = {}
        if low is not None:
            entry["min"] = _script_value(name, low)
        if high is not None:
            entry["max"] = _script_value(name, high)
        if "min" in entry and "max" in entry and entry["min"] > entry["max"]:
            raise ValueError("gpupilot.connect: the range of {} has min > max".format(name))
        out[name] = entry
    return out


def _env_int(env, name):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        log.warning("gpupilot: ignoring %s=%r (not a whole number)", name, raw)
        return None
    return value if value >= 0 else None


def _route(env, socket_path):
    """(socket, via_node): where the trainer connects, and the node to be relayed to.

    ``GPUPILOT_RUN_NODE`` names the node whose daemon started the run (and serves
    ``GPUPILOT_SOCKET``). A process on another node (a rank of a Slurm job) cannot reach that
    socket: it connects to its own node's daemon instead, which relays it to the run's node over
    SSH (docs/protocol.md, "Ranks on other nodes").
    """
    run_node = (env.get("GPUPILOT_RUN_NODE") or "").strip()
    if not run_node or run_node == _node_name(env):
        return socket_path, None
    return env.get("GPUPILOT_NODE_SOCKET") or _user_socket(env), run_node


def _node_name(env):
    """This node's name as its daemon says it: ``GPUPILOT_NODE_NAME``, else the host name."""
    name = (env.get("GPUPILOT_NODE_NAME") or "").strip()
    if name:
        return name
    try:
        return socket.gethostname()
    except OSError:
        return None


def _user_socket(env):
    """The socket of this user's own daemon on this node (docs/protocol.md, "Connecting")."""
    home = env.get("GPUPILOT_HOME")
    if home:
        return os.path.join(home, "run", "daemon.sock")
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "gpupilot", "daemon.sock")
    return "/tmp/gpupilot-{}/daemon.sock".format(os.getuid())


def _rank_spec(env, gpu=None):
    """Which rank of a distributed job this process is, from torchrun's environment (RANK,
    WORLD_SIZE, LOCAL_RANK), or None for a single process."""
    rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    if rank is None or world is None or world < 1 or rank >= world:
        if rank is not None or world is not None:
            log.warning("gpupilot: RANK=%r WORLD_SIZE=%r do not name a rank; attaching as one process",
                        env.get("RANK"), env.get("WORLD_SIZE"))
        return None
    spec = {"rank": rank, "world_size": world}
    local = _env_int(env, "LOCAL_RANK")
    if local is not None:
        spec["local_rank"] = local
    try:
        spec["host"] = socket.gethostname()
    except OSError:
        pass
    # The physical GPU: CUDA_VISIBLE_DEVICES renumbers devices from 0, and the script's device
    # is its LOCAL_RANK (the torchrun convention) unless it says otherwise.
    if gpu is None:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        index = local if local is not None else 0
        if visible is not None and visible.strip():
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if index < len(entries):
                entry = entries[index]
                if entry.isdigit():
                    spec["gpu"] = int(entry)
                elif entry.startswith("GPU-"):
                    spec["gpu_uuid"] = entry
        elif local is not None:
            spec["gpu"] = local
    else:
        spec["gpu"] = int(gpu)
    return spec


@atexit.register
def _close_all():
    # Runs before daemon threads stop, so a last `error` or report still reaches the daemon.
    for trainer in list(_live):
        trainer.close(timeout=1.0)
