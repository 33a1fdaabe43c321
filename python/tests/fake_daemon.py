"""A stand-in for the gpupilot daemon's trainer channel, served from a thread on a Unix socket.

It speaks the protocol of docs/protocol.md as far as a trainer needs: ``hello`` -> ``welcome``,
``trainer_attach`` -> ``trainer_attached``, anything else -> ``ok``. It records every frame it
receives, can push frames, go away and come back on the same path, and misbehave on request.
"""

import json
import os
import socket
import threading
import time


class FakeDaemon(object):
    def __init__(self, path):
        self.path = path
        self.frames = []  # (connection number, frame), in arrival order
        self.connections = 0
        # type -> a function(frame) returning the answer (a dict, bytes sent raw, or None)
        self.answers = {}
        self._cond = threading.Condition()
        self._listener = None
        self._conns = []
        self._threads = []
        self._stopping = False
        self._send_lock = threading.Lock()

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self):
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._stopping = False
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(8)
        listener.settimeout(0.05)
        self._listener = listener
        thread = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self):
        """Go away: close the listener and every connection, and remove the socket."""
        self._stopping = True
        for thread in self._threads:
            thread.join(2.0)
        self._threads = []
        with self._cond:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    # --- what the tests use ------------------------------------------------------------------

    def received(self, type_=None):
        with self._cond:
            return [f for _, f in self.frames if type_ is None or f.get("type") == type_]

    def wait_for(self, type_, count=1, timeout=5.0, where=None):
        """The first ``count`` frames of ``type_`` (matching ``where``), waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [
                    f for _, f in self.frames
                    if f.get("type") == type_ and (where is None or where(f))
                ]
                if len(found) >= count:
                    return found[:count]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        "the fake daemon got {} of {} {} frames in {} s; it got: {}".format(
                            len(found), count, type_, timeout, [f for _, f in self.frames]
                        )
                    )
                self._cond.wait(left)

    def push(self, frame):
        """Send a frame (a dict, or raw bytes) on the newest connection."""
        data = frame if isinstance(frame, bytes) else (json.dumps(frame) + "\n").encode()
        with self._cond:
            conn = self._conns[-1]
        with self._send_lock:
            conn.sendall(data)

    # --- serving -----------------------------------------------------------------------------

    def _accept_loop(self, listener):
        while not self._stopping:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._cond:
                self.connections += 1
                number = self.connections
                self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn, number), daemon=True)
            thread.start()

    def _serve(self, conn, number):
        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                frame = json.loads(line.decode("utf-8"))
                with self._cond:
                    self.frames.append((number, frame))
                    self._cond.notify_all()
                answer = self._answer(frame)
                if answer is None:
                    continue
                data = answer if isinstance(answer, bytes) else (json.dumps(answer) + "\n").encode()
                try:
                    with self._send_lock:
                        conn.sendall(data)
                except OSError:
                    return

    def _answer(self, frame):
        kind = frame.get("type")
        if kind in self.answers:
            return self.answers[kind](frame)
        if kind == "hello":
            return {"id": frame["id"], "type": "welcome", "version": 1, "daemon_pid": os.getpid(),
                    "node": "test-node", "readonly": False}
        if kind == "trainer_attach":
            return {"id": frame["id"], "type": "trainer_attached", "run": frame.get("run"),
                    "knobs": frame.get("knobs", {})}
        return {"id": frame["id"], "type": "ok"}
