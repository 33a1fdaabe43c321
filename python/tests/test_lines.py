"""Whole lines in one write(): what keeps ranks that share one output file from gluing lines."""

import io
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest

import gpupilot
from gpupilot._lines import MAX_HELD, LineWriter, whole_lines

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CountingRaw(io.RawIOBase):
    """A raw stream that keeps each write() it gets."""

    def __init__(self):
        self.calls = []

    def writable(self):
        return True

    def write(self, b):
        self.calls.append(bytes(b))
        return len(b)


def unbuffered():
    """A text stream as ``python -u`` makes sys.stdout: each write() reaches the raw stream."""
    raw = CountingRaw()
    return raw, io.TextIOWrapper(raw, encoding="utf-8", write_through=True)


class LineWriterTest(unittest.TestCase):
    def test_print_is_one_write_per_line(self):
        raw, plain = unbuffered()
        print('{"step": 1}', file=plain)
        # What goes wrong without it: the text, then the newline.
        self.assertEqual(raw.calls, [b'{"step": 1}', b"\n"])

        raw, stream = unbuffered()
        w = LineWriter(stream)
        print('{"step": 1}', file=w)
        print("a", "b", 3, file=w, flush=True)
        w.writelines(["x", "y\nz", "\n"])
        self.assertEqual(raw.calls, [b'{"step": 1}\n', b"a b 3\n", b"xy\n", b"z\n"])

    def test_a_partial_line_waits_for_its_newline_a_flush_or_the_bound(self):
        raw, stream = unbuffered()
        w = LineWriter(stream)
        self.assertEqual(w.write("epoch 1 ... "), 12)
        self.assertEqual(raw.calls, [])
        w.write("done\nnext")
        self.assertEqual(raw.calls, [b"epoch 1 ... done\n"])
        w.flush()
        self.assertEqual(raw.calls[1:], [b"next"])
        w.write("y" * (MAX_HELD - 1))
        self.assertEqual(len(raw.calls), 2)
        w.write("yy")
        self.assertEqual(raw.calls[2:], [b"y" * (MAX_HELD + 1)])
        w.flush()
        self.assertEqual(len(raw.calls), 3, "nothing held, nothing written")
        with self.assertRaises(TypeError):
            w.write(b"bytes")

    def test_the_streams_own_attributes_are_kept(self):
        with tempfile.TemporaryFile("w+", encoding="latin-1") as f:
            w = LineWriter(f)
            self.assertEqual(w.fileno(), f.fileno())
            self.assertEqual(w.encoding, "latin-1")
            self.assertFalse(w.isatty())
            self.assertIs(w.buffer, f.buffer)
            self.assertIs(w.wrapped, f)

    def test_whole_lines_wraps_once_and_leaves_a_missing_stream(self):
        out = io.StringIO()
        fake = types.SimpleNamespace(stdout=out, stderr=None)
        first, err = whole_lines(fake)
        self.assertIsInstance(first, LineWriter)
        self.assertIs(first.wrapped, out)
        self.assertIsNone(err)
        again, _ = whole_lines(fake)
        self.assertIs(again, first)
        self.assertIs(gpupilot.whole_lines, whole_lines)


RANK_SCRIPT = r"""
import json, os, sys, time
import gpupilot
assert isinstance(sys.stdout, gpupilot.LineWriter)
rank, bar = int(sys.argv[1]), sys.argv[2]
open(os.path.join(bar, "up%d" % rank), "w").close()
while len(os.listdir(bar)) < 4:
    time.sleep(0.001)
for step in range(LINES):
    print(json.dumps({"rank": rank, "step": step, "bs": 64}))
"""


class SharedFileTest(unittest.TestCase):
    """Four unbuffered ranks printing at once into one file opened for appending."""

    LINES = 1000

    def ranks(self, extra_env):
        """What the four ranks left in the shared file (``extra_env`` added to theirs)."""
        with tempfile.TemporaryDirectory() as tmp:
            bar = os.path.join(tmp, "bar")
            os.mkdir(bar)
            log = os.path.join(tmp, "stdout.log")
            env = dict(os.environ, PYTHONPATH=PYTHON_DIR, PYTHONUNBUFFERED="1", GPUPILOT_RUN_ID="r1")
            env.update(extra_env)
            script = RANK_SCRIPT.replace("LINES", str(self.LINES))
            procs = []
            for rank in range(4):
                with open(log, "ab") as out:
                    procs.append(
                        subprocess.Popen([sys.executable, "-c", script, str(rank), bar], stdout=out, env=env)
                    )
            for p in procs:
                self.assertEqual(p.wait(timeout=60), 0)
            with open(log) as f:
                return f.read()

    def test_every_line_is_whole(self):
        text = self.ranks({})
        steps = {}
        for line in text.splitlines():
            v = json.loads(line)  # a glued line is not one JSON object
            steps.setdefault(v["rank"], []).append(v["step"])
        self.assertEqual(sorted(steps), [0, 1, 2, 3])
        for rank, s in steps.items():
            self.assertEqual(s, list(range(self.LINES)), "rank %d" % rank)

    def test_a_partial_line_is_written_at_exit(self):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, PYTHONUNBUFFERED="1", GPUPILOT_RUN_ID="r1")
        script = "import sys, gpupilot; print('a'); sys.stdout.write('no newline')"
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
        self.assertEqual((out.returncode, out.stdout), (0, b"a\nno newline"))
        # Not under a run, or turned off: sys.stdout is left as it is.
        for extra in ({"GPUPILOT_RUN_ID": ""}, {"GPUPILOT_WHOLE_LINES": "0"}):
            script = "import sys, gpupilot; print(type(sys.stdout).__name__)"
            out = subprocess.run([sys.executable, "-c", script], env=dict(env, **extra), capture_output=True)
            self.assertEqual(out.stdout, b"TextIOWrapper\n", extra)

if __name__ == "__main__":
    unittest.main()
