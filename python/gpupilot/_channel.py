"""The trainer channel: one background thread that keeps a connection to the gpupilot daemon.

It connects to the daemon's Unix socket, says ``hello``, attaches to the run, then writes the
frames the training loop queued and answers the daemon's ``knob`` pushes. Any failure (a daemon
that is gone, restarted, or says something this client cannot use) closes the connection and
retries with backoff. Nothing here may raise into, or wait on behalf of, the training loop: the
loop only appends to a bounded queue (see ``Outbox``) and nudges a pipe.

The wire format is described in docs/protocol.md ("The trainer channel").
"""

import collections
import json
import logging
import os
import select
import socket
import struct
import threading
import time

from . import _software

log = logging.getLogger("gpupilot")

PROTOCOL_VERSION = 1
# Frames a client sends are at most 1 MiB (newline excluded); the daemon keeps its own below 16 MiB.
MAX_SEND_FRAME = 1 << 20
MAX_RECV_FRAME = 16 << 20
BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
# A daemon that neither answers the handshake nor takes our bytes within this is treated as gone.
IO_TIMEOUT_S = 5.0
# An attach relayed to another node waits for SSH and that node's daemon too.
RELAY_TIMEOUT_S = 30.0
# The daemon stamps metrics with its own clock, so a report held back longer than this (while the
# daemon was away) would be recorded at the wrong time: it is dropped instead.
MAX_REPORT_AGE_S = 10.0


class ChannelError(Exception):
    """The connection failed or the daemon said something this client cannot use: reconnect."""


class VersionMismatch(ChannelError):
    """The daemon speaks another protocol version: nothing changes until one side is replaced."""


def encode(frame):
    """One frame as bytes on the wire, or None (logged) when it cannot be sent.

    NaN and infinities are not JSON; the daemon would close the connection on them, so callers
    strip them first and a frame that still holds one is dropped here.
    """
    try:
        text = json.dumps(frame, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        log.warning("gpupilot: dropping a %s frame that is not valid JSON: %s", frame.get("type"), exc)
        return None
    data = text.encode("utf-8")
    if len(data) > MAX_SEND_FRAME:
        log.warning(
            "gpupilot: dropping a %s frame of %d bytes (the daemon takes at most %d): report fewer extra fields",
            frame.get("type"),
            len(data),
            MAX_SEND_FRAME,
        )
        return None
    return data + b"\n"


class Outbox(object):
    """A bounded queue of frames for the daemon; full, it drops the oldest. Never blocks."""

    def __init__(self, maxlen):
        self.maxlen = max(1, int(maxlen))
        self.dropped = 0
        self._items = collections.deque()
        # Re-entrant: a signal handler may report while the main thread is inside `put`.
        self._lock = threading.RLock()

    def put(self, frame):
        with self._lock:
            if len(self._items) >= self.maxlen:
                self._items.popleft()
                self.dropped += 1
            self._items.append((time.monotonic(), frame))

    def take_all(self):
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def note_dropped(self, count):
        with self._lock:
            self.dropped += count

    def __len__(self):
        return len(self._items)


class Channel(object):
    """The background connection of one trainer.

    ``handler`` gives ``attach_payload()`` -> (knobs, ranges), ``attached(knobs)`` (the daemon's
    values), ``apply_pushed_knob(name, value)`` -> (applied, reason), and for a run of several
    ranks ``propose_knob(seq, name, value, apply_step)`` -> (ready, reason, step) and
    ``decide_knob(seq, commit, reason)``; all run on this channel's thread. ``rank`` (a dict:
    rank, world_size, local_rank, host, gpu, gpu_uuid) goes with the attach.
    """

    def __init__(self, socket_path, run_id, handler, client_name, queue_size=1024, rank=None):
        self.socket_path = socket_path
        self.run_id = run_id
        self.rank = rank
        # The run's node, when it is not this one: this node's daemon relays the attach there.
        self.via_node = None
        self.client_name = client_name
        self.connected = False
        # How many times the channel attached (a test and `repr` read it; only this thread writes).
        self.attach_count = 0
        self.metrics = Outbox(queue_size)
        self.errors = Outbox(64)
        self._handler = handler
        self._next_id = 0
        self._stop = threading.Event()
        self._writing = False
        # A socket pair rather than a pipe: once closed, its objects refuse writes instead of
        # writing to whatever file later reuses the descriptor number.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._wake_flag = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gpupilot-channel", daemon=True)

    # --- called from the training loop -------------------------------------------------------

    def start(self):
        self._thread.start()

    def send(self, frame, priority=False):
        (self.errors if priority else self.metrics).put(frame)
        self._wake()

    def flush(self, timeout):
        """Wait up to ``timeout`` seconds for the queued frames to be written; True if they were."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            idle = not self._writing and len(self.metrics) == 0 and len(self.errors) == 0
            if idle:
                return True
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(0.005)

    def close(self, timeout=1.0):
        if self._closed:
            return
        self._closed = True
        on_our_thread = threading.current_thread() is self._thread
        if self._thread.is_alive() and not on_our_thread:
            self.flush(timeout)
        self._stop.set()
        self._wake()
        if self._thread.is_alive() and not on_our_thread:
            self._thread.join(max(0.1, timeout))
        if not self._thread.is_alive():
            self._wake_r.close()
            self._wake_w.close()

    def _wake(self):
        if self._wake_flag:
            return
        self._wake_flag = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            # Full pipe (the thread is already due to wake) or closed: nothing to do.
            pass

    # --- the background thread ---------------------------------------------------------------

    def _run(self):
        backoff = BACKOFF_START_S
        failures = 0
        mismatch = None
        while not self._stop.is_set():
            sock = None
            try:
                sock = self._connect()
                self._handshake(sock)
                backoff = BACKOFF_START_S
                failures = 0
                self.connected = True
                self.attach_count += 1
                log.info("gpupilot: attached to run %s through %s", self.run_id, self.socket_path)
                self._serve(sock)
            except VersionMismatch as exc:
                # Said once (again only if it changes), not at every retry: only a daemon
                # restarted after an upgrade, or another SDK, ends it.
                failures += 1
                if str(exc) != mismatch:
                    mismatch = str(exc)
                    log.warning("gpupilot: %s", exc)
            except (ChannelError, OSError, ValueError) as exc:
                failures += 1
                level = logging.WARNING if self.connected or failures == 1 else logging.DEBUG
                log.log(
                    level,
                    "gpupilot: no connection to the daemon at %s (%s); retrying in the background",
                    self.socket_path,
                    exc,
                )
            except Exception:  # the thread must outlive any bug; the training loop never sees it
                failures += 1
                log.exception("gpupilot: unexpected error in the channel; reconnecting")
            finally:
                self.connected = False
                self._writing = False
                if sock is not None:
                    try:
                        sock.close()
                    except OSError:
                        pass
            if self._stop.wait(backoff):
                break
            backoff = min(backoff * 2.0, BACKOFF_MAX_S)

    def _connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(IO_TIMEOUT_S)
            sock.connect(self.socket_path)
            self._check_peer(sock)
        except BaseException:
            sock.close()
            raise
        self._rbuf = bytearray()
        self._logged_codes = set()
        return sock

    def _check_peer(self, sock):
        # Knob changes steer this process: accept them only from our own user or root.
        if not hasattr(socket, "SO_PEERCRED"):
            return
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", raw)
        if uid not in (0, os.getuid()):
            raise ChannelError(
                "refusing the socket {}: it is served by uid {}, not by this user or root".format(
                    self.socket_path, uid
                )
            )

    def _new_id(self):
        self._next_id += 1
        return self._next_id

    def _write(self, sock, frame):
        data = encode(frame)
        if data is not None:
            sock.sendall(data)

    def _request(self, sock, frame, expect, timeout=IO_TIMEOUT_S):
        """Send a handshake request and wait for its answer, serving pushes meanwhile."""
        frame["id"] = self._new_id()
        self._write(sock, frame)
        deadline = time.monotonic() + timeout
        while True:
            for answer in self._read_frames(sock, deadline):
                if answer.get("id") != frame["id"]:
                    self._dispatch(sock, answer)
                    continue
                kind = answer.get("type")
                if kind == expect:
                    return answer
                if kind == "error" and answer.get("code") == "version_mismatch":
                    raise VersionMismatch(self._mismatch(answer.get("message")))
                if kind == "error":
                    raise ChannelError(
                        "the daemon refused {}: {}: {}".format(
                            frame["type"], answer.get("code"), answer.get("message")
                        )
                    )
                raise ChannelError("the daemon answered {} with {!r}".format(frame["type"], kind))

    def _handshake(self, sock):
        welcome = self._request(
            sock,
            {"type": "hello", "version": PROTOCOL_VERSION, "client": self.client_name},
            "welcome",
        )
        if welcome.get("version") != PROTOCOL_VERSION:
            raise VersionMismatch(
                self._mismatch("the daemon speaks protocol version {!r}".format(welcome.get("version")))
            )
        knobs, ranges = self._handler.attach_payload()
        attach = {"type": "trainer_attach", "run": self.run_id, "pid": os.getpid(), "knobs": knobs,
                  "software": _software.versions()}
        if ranges:
            attach["ranges"] = ranges
        if self.rank:
            attach.update(self.rank)
        timeout = IO_TIMEOUT_S
        if self.via_node:
            attach["via_node"] = self.via_node
            timeout = RELAY_TIMEOUT_S
        answer = self._request(sock, attach, "trainer_attached", timeout)
        values = answer.get("knobs")
        if isinstance(values, dict):
            self._handler.attached(values)

    def _mismatch(self, detail):
        """What to tell the user when the daemon and this SDK speak different protocol versions."""
        return (
            "this SDK ({}) speaks protocol version {} and the daemon at {} does not ({}). Install "
            "the SDK of the daemon's gpupilot release (its wheel, or `pip install ./python` from its "
            "source), or restart the daemon if gpupilot was upgraded; until then this run trains on "
            "without reporting to gpupilot or following its knobs".format(
                self.client_name, PROTOCOL_VERSION, self.socket_path, detail
            )
        )

    def _read_frames(self, sock, deadline=None):
        """Block (up to ``deadline``) for data, then return the complete frames it finished."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([sock], [], [], timeout)
        if not readable:
            raise ChannelError("the daemon did not answer within {:.0f} s".format(IO_TIMEOUT_S))
        return self._recv(sock)

    def _recv(self, sock):
        data = sock.recv(65536)
        if not data:
            raise ChannelError("the daemon closed the connection")
        self._rbuf.extend(data)
        frames = []
        while True:
            end = self._rbuf.find(b"\n")
            if end < 0:
                break
            line = bytes(self._rbuf[:end])
            del self._rbuf[: end + 1]
            frame = self._parse(line)
            if frame is not None:
                frames.append(frame)
        if len(self._rbuf) > MAX_RECV_FRAME:
            raise ChannelError("the daemon sent a frame longer than {} bytes".format(MAX_RECV_FRAME))
        return frames

    @staticmethod
    def _parse(line):
        if not line.strip():
            return None
        try:
            frame = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            log.warning("gpupilot: ignoring a line from the daemon that is not JSON: %r", line[:200])
            return None
        if not isinstance(frame, dict):
            log.warning("gpupilot: ignoring a frame from the daemon that is not an object: %r", line[:200])
            return None
        return frame

    def _serve(self, sock):
        self._drain(sock)
        while not self._stop.is_set():
            readable, _, _ = select.select([sock, self._wake_r], [], [], 1.0)
            if self._wake_r in readable:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
                # Cleared before draining, so a frame queued from now on wakes us again.
                self._wake_flag = False
            if sock in readable:
                for frame in self._recv(sock):
                    self._dispatch(sock, frame)
            self._drain(sock)

    def _drain(self, sock):
        self._writing = True
        try:
            chunks = []
            for _, frame in self.errors.take_all():
                chunks.append(self._with_id(frame))
            now = time.monotonic()
            stale = 0
            for queued_at, frame in self.metrics.take_all():
                if now - queued_at > MAX_REPORT_AGE_S:
                    stale += 1
                    continue
                chunks.append(self._with_id(frame))
            if stale:
                self.metrics.note_dropped(stale)
                log.debug("gpupilot: dropped %d reports older than %.0f s", stale, MAX_REPORT_AGE_S)
            data = b"".join(chunk for chunk in chunks if chunk is not None)
            if data:
                sock.sendall(data)
        finally:
            self._writing = False

    def _with_id(self, frame):
        frame = dict(frame)
        frame["id"] = self._new_id()
        return encode(frame)

    def _dispatch(self, sock, frame):
        kind = frame.get("type")
        if "id" in frame:
            # An answer: `ok` needs nothing; an error is worth a line in the log, never an exception.
            if kind == "error":
                # Once per code and connection at warning level: a daemon that refuses every
                # report must not flood the training log at the step rate.
                code = frame.get("code")
                level = logging.DEBUG if code in self._logged_codes else logging.WARNING
                self._logged_codes.add(code)
                log.log(
                    level,
                    "gpupilot: the daemon answered request %s with %s: %s",
                    frame.get("id"),
                    code,
                    frame.get("message"),
                )
            return
        if kind == "knob" and frame.get("apply_step") is not None:
            self._on_proposal(sock, frame)
        elif kind == "knob":
            self._on_knob(sock, frame)
        elif kind == "knob_decision":
            self._on_decision(frame)
        elif kind == "shutdown":
            log.info("gpupilot: the daemon is stopping (%s); reconnecting in the background", frame.get("reason"))
        elif kind == "error":
            log.warning("gpupilot: the daemon reported %s: %s", frame.get("code"), frame.get("message"))

    def _on_knob(self, sock, frame):
        seq = frame.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int):
            log.warning("gpupilot: ignoring a knob push without a usable seq: %r", frame)
            return
        name = frame.get("knob")
        try:
            applied, reason = self._handler.apply_pushed_knob(name, frame.get("value"))
        except Exception as exc:  # apply_pushed_knob catches callbacks; this is a last resort
            log.exception("gpupilot: applying knob %r failed", name)
            applied, reason = False, "the SDK failed to apply it: {}".format(exc)
        ack = {"id": self._new_id(), "type": "knob_ack", "seq": seq, "applied": bool(applied)}
        if not applied:
            ack["reason"] = reason or "rejected"
        elif reason:
            # Applied, with a note: what the script changed with it (a learning rate scaled).
            ack["reason"] = reason
        # Written at once, ahead of queued reports: the daemon times this round trip.
        self._write(sock, ack)

    def _on_proposal(self, sock, frame):
        """A change to several ranks: vote on it now; it is applied at its step, if committed."""
        seq, step = frame.get("seq"), frame.get("apply_step")
        if isinstance(seq, bool) or not isinstance(seq, int) or isinstance(step, bool) or not isinstance(step, int):
            log.warning("gpupilot: ignoring a knob proposal without a usable seq and step: %r", frame)
            return
        name = frame.get("knob")
        try:
            ready, reason, at = self._handler.propose_knob(seq, name, frame.get("value"), step)
        except Exception as exc:  # propose_knob catches callbacks; this is a last resort
            log.exception("gpupilot: voting on knob %r failed", name)
            ready, reason, at = False, "the SDK failed to check it: {}".format(exc), None
        vote = {"id": self._new_id(), "type": "knob_vote", "seq": seq, "ready": bool(ready)}
        if not ready:
            vote["reason"] = reason or "not ready"
        if at is not None:
            vote["step"] = at
        # At once, ahead of queued reports: every rank's vote is waited for.
        self._write(sock, vote)

    def _on_decision(self, frame):
        seq = frame.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int):
            log.warning("gpupilot: ignoring a knob decision without a usable seq: %r", frame)
            return
        self._handler.decide_knob(seq, frame.get("commit") is True, frame.get("reason"))
