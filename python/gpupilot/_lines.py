"""Whole lines on stdout and stderr, each in one ``write()``.

Ranks of one job often share one output file (torchrun, Slurm, a script that starts its own
processes, all appending to the run's ``stdout.log``). An unbuffered Python (``python -u``,
``PYTHONUNBUFFERED=1``, which gpupilot sets for its runs) writes ``print(x)`` as two
``write()`` calls, the text and then its newline, so another rank's line can land between them:
``{"rank": 1, ...}{"rank": 0, ...}``. ``LineWriter`` holds a line until its newline and writes
it whole; a partial line waits only until ``flush()`` or ``MAX_HELD`` characters.
"""

import threading

# Characters of a line without its newline held at most; then written as they are.
MAX_HELD = 64 * 1024


class LineWriter(object):
    """A text stream that passes whole lines to ``stream`` in one ``write()`` each call.

    Everything but ``write``, ``writelines`` and ``flush`` (``isatty``, ``fileno``,
    ``encoding``, ``errors``, ``buffer``, ...) is the wrapped stream's own.
    """

    def __init__(self, stream):
        self._stream = stream
        self._held = []
        self._held_len = 0
        self._lock = threading.RLock()

    @property
    def wrapped(self):
        """The stream written to."""
        return self._stream

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        with self._lock:
            end = text.rfind("\n")
            if end >= 0:
                self._write_held(text[: end + 1])
            rest = text[end + 1 :]
            if rest:
                self._held.append(rest)
                self._held_len += len(rest)
                if self._held_len >= MAX_HELD:
                    self._write_held("")
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        with self._lock:
            self._write_held("")
            self._stream.flush()

    def _write_held(self, more):
        text = "".join(self._held) + more
        self._held = []
        self._held_len = 0
        if text:
            self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __repr__(self):
        return "<gpupilot.LineWriter of %r>" % (self._stream,)


def whole_lines(sys_module=None):
    """Make ``sys.stdout`` and ``sys.stderr`` write each whole line in one ``write()``.

    Idempotent; a stream that is ``None`` (no console) is left alone. Returns the module's
    streams as they now are.
    """
    if sys_module is None:
        import sys as sys_module
    for name in ("stdout", "stderr"):
        stream = getattr(sys_module, name)
        if stream is not None and not isinstance(stream, LineWriter):
            setattr(sys_module, name, LineWriter(stream))
    return sys_module.stdout, sys_module.stderr
