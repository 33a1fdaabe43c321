"""The example training scripts, standalone and under a fake daemon."""

import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from tests.fake_daemon import FakeDaemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STDLIB = os.path.join(ROOT, "examples", "train_stdlib.py")
SIMPLE = os.path.join(ROOT, "examples", "train_simple.py")
RUN = "20261130-041500-example"


def clean_env(**extra):
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("GPUPILOT_"))
    env.pop("PYTHONPATH", None)  # the example must find the SDK in the checkout by itself
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class StdlibExampleTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpupilot-ex-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_runs_standalone(self):
        done = subprocess.run(
            [sys.executable, STDLIB, "--steps", "50"],
            cwd=self.dir, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
        )
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        lines = json_lines(done.stdout.decode())
        steps = [line for line in lines if "step" in line and "loss" in line]
        self.assertEqual(len(steps), 50)
        self.assertEqual(lines[-1]["event"], "done")
        self.assertLess(steps[-1]["loss"], steps[0]["loss"] / 4, "SGD makes progress")

    def test_under_a_daemon_follows_knobs_and_stops_on_sigterm(self):
        path = os.path.join(self.dir, "daemon.sock")
        daemon = FakeDaemon(path).start()
        self.addCleanup(daemon.stop)
        out = open(os.path.join(self.dir, "stdout"), "w+")
        self.addCleanup(out.close)
        err = open(os.path.join(self.dir, "stderr"), "w+")
        self.addCleanup(err.close)
        proc = subprocess.Popen(
            [sys.executable, STDLIB, "--steps", "100000", "--batch-size", "32"],
            cwd=self.dir, stdout=out, stderr=err,
            env=clean_env(GPUPILOT_SOCKET=path, GPUPILOT_RUN_ID=RUN, GPUPILOT_PREFETCH="3"),
        )
        self.addCleanup(proc.kill)
        (attach,) = daemon.wait_for("trainer_attach", timeout=20)
        self.assertEqual(attach["knobs"], {"batch_size": 32, "prefetch": 3})
        self.assertEqual(attach["pid"], proc.pid)
        # The stdlib example imports no framework: it says Python's version alone.
        self.assertEqual(attach["software"], {"python": platform.python_version()})
        daemon.wait_for("metrics", 3, timeout=20)

        daemon.push({"type": "knob", "run": RUN, "seq": 1, "knob": "batch_size", "value": 48})
        daemon.push({"type": "knob", "run": RUN, "seq": 2, "knob": "prefetch", "value": 6})
        daemon.push({"type": "knob", "run": RUN, "seq": 3, "knob": "batch_size", "value": 100000})
        acks = daemon.wait_for("knob_ack", 3, timeout=20)
        self.assertEqual([(a["seq"], a["applied"]) for a in acks], [(1, True), (2, True), (3, False)])
        self.assertIn("maximum", acks[2]["reason"])
        daemon.wait_for("metrics", where=lambda f: f.get("batch_size") == 48 and f.get("prefetch") == 6,
                        timeout=20)

        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=20), 0, open(err.name).read())
        out.seek(0)
        lines = json_lines(out.read())
        self.assertEqual(lines[0]["under_gpupilot"], True)
        self.assertEqual(lines[-1]["event"], "stopped")
        self.assertEqual(lines[-1]["signal"], "SIGTERM")
        metrics = daemon.received("metrics")
        self.assertTrue(all("loss" in m and "data_wait_s" in m and "extra" in m for m in metrics))


def torch_available():
    try:
        importlib.import_module("torch")
    except ImportError as exc:
        return str(exc)
    return None


TORCH_MISSING = torch_available()
if TORCH_MISSING:
    sys.stderr.write(
        "SKIP test_examples.SimpleExampleTest: PyTorch is not installed ({})\n".format(TORCH_MISSING)
    )


@unittest.skipIf(TORCH_MISSING, "PyTorch is not installed ({})".format(TORCH_MISSING))
class SimpleExampleTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpupilot-ex-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_trains_a_few_steps_standalone(self):
        done = subprocess.run(
            [sys.executable, SIMPLE, "--steps", "6", "--batch-size", "16", "--samples", "256"],
            cwd=self.dir, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300,
        )
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        lines = json_lines(done.stdout.decode())
        steps = [line for line in lines if "loss" in line]
        self.assertEqual(len(steps), 6)
        self.assertEqual(steps[0]["batch_size"], 16)

    def test_under_a_daemon_follows_the_batch_size_and_workers(self):
        path = os.path.join(self.dir, "daemon.sock")
        daemon = FakeDaemon(path).start()
        self.addCleanup(daemon.stop)
        proc = subprocess.Popen(
            [sys.executable, SIMPLE, "--steps", "100000", "--batch-size", "16", "--samples", "512",
             "--workers", "1"],
            cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=clean_env(GPUPILOT_SOCKET=path, GPUPILOT_RUN_ID=RUN),
        )
        self.addCleanup(proc.stderr.close)
        self.addCleanup(proc.kill)
        (attach,) = daemon.wait_for("trainer_attach", timeout=60)
        torch = importlib.import_module("torch")
        self.assertEqual(attach["software"]["torch"], torch.__version__)
        self.assertEqual(attach["software"]["python"], platform.python_version())
        # A CPU build of PyTorch was built without CUDA: it is not said.
        self.assertEqual("torch_cuda" in attach["software"], torch.version.cuda is not None)
        daemon.wait_for("metrics", 2, timeout=120)
        daemon.push({"type": "knob", "run": RUN, "seq": 1, "knob": "batch_size", "value": 24})
        daemon.push({"type": "knob", "run": RUN, "seq": 2, "knob": "prefetch", "value": 3})
        acks = daemon.wait_for("knob_ack", 2, timeout=30)
        self.assertTrue(all(a["applied"] for a in acks), acks)
        daemon.wait_for("metrics", where=lambda f: f.get("batch_size") == 24 and f.get("prefetch") == 3,
                        timeout=120)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=60), 0, proc.stderr.read().decode())


if __name__ == "__main__":
    unittest.main()
