"""The SDK against a fake daemon: handshake, attach, reports, knob pushes and acks, reconnects."""

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

import gpupilot
from gpupilot import _channel
from tests.fake_daemon import FakeDaemon

RUN = "20261130-041500-train"
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_until(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after {} s waiting for {}".format(timeout, what))
        time.sleep(0.01)


class DaemonTest(unittest.TestCase):
    """Each test gets a fake daemon on a socket in a fresh temporary directory."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpupilot-sdk-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "daemon.sock")
        self.daemon = FakeDaemon(self.path)
        self.addCleanup(self.daemon.stop)

    def env(self, **extra):
        env = {"GPUPILOT_SOCKET": self.path, "GPUPILOT_RUN_ID": RUN}
        env.update(extra)
        return env

    def connect(self, knobs=None, env=None, **kwargs):
        gp = gpupilot.connect(knobs=knobs, env=self.env() if env is None else env, **kwargs)
        self.addCleanup(gp.close, 0.2)
        return gp

    def attached(self, knobs=None, **kwargs):
        self.daemon.start()
        gp = self.connect(knobs, **kwargs)
        wait_until(lambda: gp.connected, what="the SDK to attach")
        return gp


class LocalTrainerTest(unittest.TestCase):
    def test_without_the_environment_the_trainer_is_local_and_inert(self):
        threads = threading.active_count()
        gp = gpupilot.connect(knobs={"batch_size": 64, "prefetch": 2}, env={"GPUPILOT_RUN_ID": RUN})
        self.assertFalse(gp.enabled)
        self.assertFalse(gp.connected)
        self.assertEqual(threading.active_count(), threads, "a local trainer starts no thread")
        self.assertEqual(gp.knobs, {"batch_size": 64, "prefetch": 2})
        self.assertIsNone(gp.report(step=1, loss=0.5))
        self.assertIsNone(gp.error("oom", "out of memory"))
        self.assertEqual(gp.queued, 0)
        # Knobs still work within the script.
        seen = []
        gp.on_change("batch_size", lambda new, old: seen.append((new, old)))
        self.assertTrue(gp.set("batch_size", 128))
        self.assertEqual(seen, [(128, 64)])
        self.assertEqual(gp.knob("batch_size"), 128)
        self.assertEqual(gp.pending("batch_size"), 128)
        self.assertIsNone(gp.pending("batch_size"))
        self.assertTrue(gp.flush())
        with gp as same:
            self.assertIs(same, gp)
        gp.close()

    def test_socket_without_run_id_is_local(self):
        gp = gpupilot.connect(knobs={"batch_size": 8}, env={"GPUPILOT_SOCKET": "/nonexistent.sock"})
        self.assertFalse(gp.enabled)

    def test_os_environ_is_the_default(self):
        with mock.patch.dict(os.environ, {"GPUPILOT_BATCH_SIZE": "96"}, clear=False):
            os.environ.pop("GPUPILOT_SOCKET", None)
            gp = gpupilot.connect(knobs={"batch_size": 64})
        self.assertEqual(gp.knob("batch_size"), 96)

    def test_environment_values_win_over_the_script_defaults(self):
        gp = gpupilot.connect(
            knobs={"batch_size": 64, "prefetch": 2, "workers": 1},
            env={"GPUPILOT_BATCH_SIZE": "256", "GPUPILOT_PREFETCH": " 4 ", "GPUPILOT_WORKERS": "3"},
        )
        self.assertEqual(gp.knobs, {"batch_size": 256, "prefetch": 4, "workers": 3})

    def test_environment_sets_protocol_knobs_the_script_did_not_declare(self):
        gp = gpupilot.connect(knobs={"batch_size": 64}, env={"GPUPILOT_PREFETCH": "6"})
        self.assertEqual(gp.knobs, {"batch_size": 64, "prefetch": 6})

    def test_bad_environment_values_are_ignored_with_a_warning(self):
        with self.assertLogs("gpupilot", "WARNING") as logs:
            gp = gpupilot.connect(
                knobs={"batch_size": 64, "prefetch": 2},
                env={"GPUPILOT_BATCH_SIZE": "lots", "GPUPILOT_PREFETCH": "-1"},
            )
        self.assertEqual(gp.knobs, {"batch_size": 64, "prefetch": 2})
        text = "\n".join(logs.output)
        self.assertIn("GPUPILOT_BATCH_SIZE", text)
        self.assertIn("GPUPILOT_PREFETCH", text)

    def test_bad_script_defaults_are_programming_errors(self):
        with self.assertRaises(ValueError):
            gpupilot.connect(knobs={"batch_size": 0}, env={})
        with self.assertRaises(ValueError):
            gpupilot.connect(knobs={"batch_size": 1.5}, env={})
        with self.assertRaises(TypeError):
            gpupilot.connect(knobs=[("batch_size", 1)], env={})
        with self.assertRaises(ValueError):
            gpupilot.connect(knobs={"batch_size": 8}, ranges={"batch_size": (10, 1)}, env={})

    def test_local_changes_are_checked(self):
        gp = gpupilot.connect(knobs={"batch_size": 64}, ranges={"batch_size": (8, 512)}, env={})
        with self.assertLogs("gpupilot", "WARNING"):
            self.assertFalse(gp.set("batch_size", 1024))
            self.assertFalse(gp.set("batch_size", "big"))
            self.assertFalse(gp.set("batch_size", True))
        self.assertTrue(gp.set("batch_size", 256.0))
        self.assertEqual(gp.knob("batch_size"), 256)
        self.assertIsInstance(gp.knob("batch_size"), int)

    def test_watches_see_each_change_once_and_independently(self):
        gp = gpupilot.connect(knobs={"prefetch": 2}, env={})
        a, b = gp.watch("prefetch"), gp.watch("prefetch")
        self.assertIsNone(a.take())
        gp.set("prefetch", 3)
        self.assertTrue(a.changed())
        self.assertEqual(a.take(), 3)
        self.assertFalse(a.changed())
        self.assertIsNone(a.take())
        gp.set("prefetch", 4)
        self.assertEqual(b.take(), 4, "b missed nothing and sees the newest value")
        self.assertEqual(a.read(), 4)
        self.assertEqual(a.value, 4)

    def test_pending_reports_a_change_made_before_its_first_call(self):
        gp = gpupilot.connect(knobs={"batch_size": 64}, env={})
        gp.set("batch_size", 32)
        self.assertEqual(gp.pending("batch_size"), 32)
        self.assertIsNone(gp.pending("batch_size"))

    def test_importing_gpupilot_does_not_import_torch(self):
        code = "import sys, gpupilot; print('torch' in sys.modules)"
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=PYTHON_DIR, stdout=subprocess.PIPE, check=True
        ).stdout
        self.assertEqual(out.strip(), b"False")

    def test_gpupilot_torch_without_torch_says_what_to_do(self):
        # `sys.modules["torch"] = None` makes `import torch` fail, whether torch is installed or not.
        code = (
            "import sys; sys.modules['torch'] = None\n"
            "try:\n    import gpupilot.torch\nexcept ImportError as e:\n    print(e)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=PYTHON_DIR, stdout=subprocess.PIPE, check=True
        ).stdout.decode()
        self.assertIn("gpupilot.torch needs PyTorch", out)
        self.assertIn("install torch", out)


class ChannelTest(DaemonTest):
    def test_hello_then_attach_with_the_knobs_and_ranges(self):
        gp = self.attached(
            {"batch_size": 64, "prefetch": 2, "workers": 4},
            env=self.env(GPUPILOT_BATCH_SIZE="128"),
            ranges={"batch_size": (None, 1024), "prefetch": {"min": 1}, "workers": (0, 8)},
        )
        frames = self.daemon.received()
        self.assertEqual([f["type"] for f in frames[:2]], ["hello", "trainer_attach"])
        hello, attach = frames[0], frames[1]
        self.assertEqual(hello["version"], 1)
        self.assertEqual(hello["client"], "gpupilot-python " + gpupilot.__version__)
        self.assertEqual(attach["run"], RUN)
        self.assertEqual(attach["pid"], os.getpid())
        # Only the knobs the daemon knows are announced; `workers` stays within the script.
        self.assertEqual(attach["knobs"], {"batch_size": 128, "prefetch": 2})
        self.assertEqual(attach["ranges"], {"batch_size": {"min": 1, "max": 1024}, "prefetch": {"min": 1}})
        self.assertNotEqual(hello["id"], attach["id"])
        self.assertTrue(gp.enabled)
        self.assertIn("connected", repr(gp))

    def test_report_frames_carry_the_fields_and_default_to_the_knobs(self):
        gp = self.attached({"batch_size": 64, "prefetch": 2})
        gp.report(step=120, epoch=1, loss=2.31, samples_per_s=812.5, step_time_s=0.079, data_wait_s=0.012,
                  lr=0.01, tokens=4096, name="resnet", flag=True, nested={"a": 1}, bad=float("nan"))
        gp.report(step=121, batch_size=32, prefetch=0, loss=float("inf"), extra_only=1)
        first, second = self.daemon.wait_for("metrics", 2)
        del first["id"]
        self.assertEqual(first, {
            "type": "metrics", "step": 120, "epoch": 1, "loss": 2.31, "samples_per_s": 812.5,
            "step_time_s": 0.079, "data_wait_s": 0.012, "batch_size": 64, "prefetch": 2,
            "extra": {"lr": 0.01, "tokens": 4096},
        })
        self.assertEqual(second["batch_size"], 32)
        self.assertEqual(second["prefetch"], 0)
        self.assertNotIn("loss", second, "infinity is not JSON and is left out")
        self.assertEqual(second["extra"], {"extra_only": 1})

    def test_report_coerces_numbers_and_drops_what_the_daemon_cannot_read(self):
        gp = self.attached({"batch_size": 64})

        class Scalar(object):  # a numpy scalar or a 0-d tensor, as far as report cares
            def __float__(self):
                return 0.25

        gp.report(step=3.0, epoch=-1, loss=Scalar(), samples_per_s="fast", step_time_s=True)
        (frame,) = self.daemon.wait_for("metrics")
        self.assertEqual(frame["step"], 3)
        self.assertIsInstance(frame["step"], int)
        self.assertNotIn("epoch", frame)
        self.assertEqual(frame["loss"], 0.25)
        self.assertNotIn("samples_per_s", frame)
        self.assertNotIn("step_time_s", frame)
        self.assertNotIn("extra", frame)

    def test_report_says_its_samples_and_whose_figures_they_are(self):
        gp = self.attached({"batch_size": 64})
        gp.report(step=10, samples=640, samples_per_s=3200.0)
        gp.report(step=10, samples=2560, samples_per_s=12800.0, scope="job")
        with self.assertLogs("gpupilot", "WARNING") as logs:
            gp.report(step=11, samples=2624, scope="global")
        gp.report(step=12)
        own, job, last = self.daemon.wait_for("metrics", 3)
        self.assertEqual((own["samples"], own.get("scope")), (640, None))
        self.assertEqual((job["samples"], job["scope"], job["samples_per_s"]), (2560, "job", 12800.0))
        # A report of unknown scope would be summed or not by guess: it is left out, and said.
        self.assertEqual(last["step"], 12)
        self.assertIn("scope must be one of rank, job", logs.output[0])

    def test_request_ids_are_unique(self):
        gp = self.attached({"batch_size": 64})
        for step in range(20):
            gp.report(step=step)
        self.daemon.wait_for("metrics", 20)
        ids = [f["id"] for f in self.daemon.received()]
        self.assertEqual(len(ids), len(set(ids)))
        self.assertTrue(all(isinstance(i, int) and i > 0 for i in ids))

    def test_knob_push_runs_the_callback_then_acks(self):
        gp = self.attached({"batch_size": 64, "prefetch": 2})
        calls = []

        def on_batch_size(new, old):
            calls.append((new, old, threading.current_thread().name, gp.knob("batch_size")))

        gp.on_change("batch_size", on_batch_size)
        self.daemon.push({"type": "knob", "run": RUN, "seq": 7, "knob": "batch_size", "value": 128})
        (ack,) = self.daemon.wait_for("knob_ack")
        self.assertEqual(ack["seq"], 7)
        self.assertIs(ack["applied"], True)
        self.assertNotIn("reason", ack)
        # The callback ran on the SDK's thread, before the value became current.
        self.assertEqual(calls, [(128, 64, "gpupilot-channel", 64)])
        self.assertEqual(gp.knob("batch_size"), 128)
        self.assertEqual(gp.pending("batch_size"), 128)
        gp.report(step=1)
        (frame,) = self.daemon.wait_for("metrics")
        self.assertEqual(frame["batch_size"], 128)

    def test_a_raising_callback_rejects_with_its_reason(self):
        gp = self.attached({"batch_size": 64})

        def refuse(new, old):
            if new > 1024:
                raise ValueError("batch {} does not fit in memory".format(new))

        gp.on_change("batch_size", refuse)
        with self.assertLogs("gpupilot", "WARNING"):
            self.daemon.push({"type": "knob", "run": RUN, "seq": 8, "knob": "batch_size", "value": 4096})
            (ack,) = self.daemon.wait_for("knob_ack")
        self.assertEqual(ack, {"id": ack["id"], "type": "knob_ack", "seq": 8, "applied": False,
                               "reason": "batch 4096 does not fit in memory"})
        self.assertEqual(gp.knob("batch_size"), 64)
        self.assertIsNone(gp.pending("batch_size"))

    def test_a_callback_returning_false_rejects(self):
        gp = self.attached({"prefetch": 2})

        @gp.on_change("prefetch")
        def no(new, old):
            return False

        self.daemon.push({"type": "knob", "run": RUN, "seq": 1, "knob": "prefetch", "value": 4})
        (ack,) = self.daemon.wait_for("knob_ack")
        self.assertIs(ack["applied"], False)
        self.assertIn("prefetch", ack["reason"])
        self.assertEqual(gp.knob("prefetch"), 2)

    def test_pushes_the_script_cannot_apply_are_rejected(self):
        gp = self.attached({"batch_size": 64}, ranges={"batch_size": (1, 256)})
        pushes = [
            ("prefetch", 4, "does not use"),  # never declared nor read
            ("batch_size", "huge", "whole number"),
            ("batch_size", 0, "at least 1"),
            ("batch_size", 512, "maximum 256"),
        ]
        for seq, (knob, value, _) in enumerate(pushes, 1):
            self.daemon.push({"type": "knob", "run": RUN, "seq": seq, "knob": knob, "value": value})
        acks = self.daemon.wait_for("knob_ack", len(pushes))
        for ack, (_, _, why) in zip(acks, pushes):
            self.assertIs(ack["applied"], False)
            self.assertIn(why, ack["reason"])
        self.assertEqual(gp.knob("batch_size"), 64)

    def test_a_push_to_the_current_value_is_acked_without_callbacks(self):
        gp = self.attached({"batch_size": 64})
        calls = []
        gp.on_change("batch_size", lambda new, old: calls.append(new))
        self.daemon.push({"type": "knob", "run": RUN, "seq": 3, "knob": "batch_size", "value": 64})
        (ack,) = self.daemon.wait_for("knob_ack")
        self.assertIs(ack["applied"], True)
        self.assertEqual(calls, [])

    def test_error_answers_are_logged_never_raised(self):
        self.daemon.answers["metrics"] = lambda f: {"id": f["id"], "type": "error", "code": "bad_state",
                                                    "message": "attach first"}
        gp = self.attached({"batch_size": 64})
        with self.assertLogs("gpupilot", "DEBUG") as logs:
            for step in range(5):
                gp.report(step=step)
            self.daemon.wait_for("metrics", 5)
            wait_until(lambda: sum("attach first" in line for line in logs.output) == 5, what="the log lines")
        self.assertTrue(gp.connected, "an error answer keeps the connection")
        warned = [line for line in logs.output if "attach first" in line and line.startswith("WARNING")]
        self.assertEqual(len(warned), 1, "the same error is a warning once, then debug")

    def test_trainer_error_goes_out_before_close_returns(self):
        gp = self.attached({"batch_size": 512})
        gp.error("oom", "CUDA out of memory. Tried to allocate 2.00 GiB", step=30, device="cuda:0",
                 junk=[1, 2])
        gp.error("oom", "again", batch_size=256.0)
        gp.error("segfault", "odd")
        gp.close(2.0)
        first, third, second = self.daemon.wait_for("trainer_error", 3)
        self.assertEqual(third["batch_size"], 256)
        self.assertIsInstance(third["batch_size"], int)
        self.assertEqual(first["kind"], "oom")
        self.assertEqual(first["message"], "CUDA out of memory. Tried to allocate 2.00 GiB")
        self.assertEqual(first["batch_size"], 512)
        self.assertEqual(first["step"], 30)
        self.assertEqual(first["device"], "cuda:0")
        self.assertNotIn("junk", first)
        self.assertEqual(second["kind"], "other")
        self.assertFalse(gp.connected)
        gp.report(step=1)  # after close: nothing, no exception
        gp.close()


class ResilienceTest(DaemonTest):
    def test_daemon_goes_away_and_comes_back(self):
        gp = self.attached({"batch_size": 64, "prefetch": 2})
        gp.report(step=0)
        self.daemon.wait_for("metrics")
        self.daemon.stop()
        wait_until(lambda: not gp.connected, what="the SDK to notice the daemon left")
        gp.set("batch_size", 32)  # a change while away is announced on re-attach

        slowest = 0.0
        for step in range(1, 2001):
            started = time.perf_counter()
            gp.report(step=step, loss=1.0 / step)
            slowest = max(slowest, time.perf_counter() - started)
        # Waiting for a reconnect would take a backoff (0.2 s or more) or an I/O timeout (5 s).
        self.assertLess(slowest, 0.15, "report() must not wait for the daemon")

        self.daemon.start()
        wait_until(lambda: gp.connected, timeout=10.0, what="the SDK to reconnect")
        attaches = self.daemon.wait_for("trainer_attach", 2)
        self.assertEqual(attaches[1]["knobs"], {"batch_size": 32, "prefetch": 2})
        self.assertEqual(self.daemon.connections, 2)
        # The newest reports held while away reach the new daemon (the queue kept 1024 of 2000).
        last = self.daemon.wait_for("metrics", where=lambda f: f.get("step") == 2000)
        self.assertEqual(last[0]["batch_size"], 32)
        self.assertEqual(gp.dropped, 2000 - 1024)
        gp.report(step=2001)
        self.daemon.wait_for("metrics", where=lambda f: f.get("step") == 2001)
        # Knob pushes work on the new connection.
        self.daemon.push({"type": "knob", "run": RUN, "seq": 9, "knob": "prefetch", "value": 4})
        self.daemon.wait_for("knob_ack", where=lambda f: f["seq"] == 9 and f["applied"])

    def test_no_daemon_yet_then_one_starts(self):
        gp = self.connect({"batch_size": 64})
        time.sleep(0.3)
        self.assertTrue(gp.enabled)
        self.assertFalse(gp.connected)
        self.daemon.start()
        wait_until(lambda: gp.connected, timeout=10.0, what="the SDK to connect")

    def test_queue_keeps_the_newest_reports(self):
        gp = self.connect({"batch_size": 64}, queue_size=10)
        for step in range(25):
            gp.report(step=step)
        self.assertEqual(gp.queued, 10)
        self.assertEqual(gp.dropped, 15)
        self.daemon.start()
        frames = self.daemon.wait_for("metrics", 10, timeout=10.0)
        self.assertEqual([f["step"] for f in frames], list(range(15, 25)))

    def test_garbage_from_the_daemon_is_survived(self):
        gp = self.attached({"batch_size": 64})
        with self.assertLogs("gpupilot", "WARNING"):
            self.daemon.push(b"this is not json\n")
            self.daemon.push(b"[1, 2, 3]\n")
            self.daemon.push(b"\xff\xfe\n")
            self.daemon.push(b"\n")
            self.daemon.push({"type": "knob", "seq": "x", "knob": "batch_size", "value": 1})
            self.daemon.push({"type": "something_new", "field": 1})
            self.daemon.push({"type": "knob", "run": RUN, "seq": 2, "knob": "batch_size", "value": 16})
            (ack,) = self.daemon.wait_for("knob_ack")
        self.assertEqual(ack["seq"], 2)
        self.assertTrue(ack["applied"])
        self.assertTrue(gp.connected)
        gp.report(step=5)
        self.daemon.wait_for("metrics")

    def test_garbage_handshake_answers_make_it_retry(self):
        state = {"hellos": 0}

        def bad_then_good(frame):
            state["hellos"] += 1
            if state["hellos"] == 1:
                return {"id": frame["id"], "type": "nonsense"}
            if state["hellos"] == 2:
                return b"\x00garbage\n"  # then silence: the SDK gives up waiting and retries
            return {"id": frame["id"], "type": "welcome", "version": 1}

        self.daemon.answers["hello"] = bad_then_good
        with mock.patch.object(_channel, "IO_TIMEOUT_S", 0.3):
            self.daemon.start()
            gp = self.connect({"batch_size": 64})
            started = time.perf_counter()
            gp.report(step=1)
            self.assertLess(time.perf_counter() - started, 0.15)
            wait_until(lambda: gp.connected, timeout=10.0, what="the SDK to attach on the third try")
        self.assertEqual(state["hellos"], 3)

    def test_a_refused_attach_is_retried_without_raising(self):
        self.daemon.answers["trainer_attach"] = lambda f: {
            "id": f["id"], "type": "error", "code": "unknown_run",
            "message": "no run matches `{}`: `gpupilot ps` lists them".format(f["run"])}
        with self.assertLogs("gpupilot", "WARNING") as logs:
            self.daemon.start()
            gp = self.connect({"batch_size": 64})
            self.daemon.wait_for("trainer_attach", 2, timeout=10.0)
        self.assertFalse(gp.connected)
        self.assertTrue(any("unknown_run" in line for line in logs.output))
        gp.report(step=1)

    def test_a_daemon_of_another_protocol_version_is_not_used(self):
        self.daemon.answers["hello"] = lambda f: {"id": f["id"], "type": "welcome", "version": 2}
        with self.assertLogs("gpupilot", "WARNING") as logs:
            self.daemon.start()
            gp = self.connect({"batch_size": 64})
            self.daemon.wait_for("hello", 2, timeout=10.0)
        self.assertFalse(gp.connected)
        self.assertEqual(self.daemon.received("trainer_attach"), [])
        self.assertTrue(any("protocol version" in line for line in logs.output))

    def test_close_from_a_callback_does_not_hang(self):
        gp = self.attached({"batch_size": 64})
        gp.on_change("batch_size", lambda new, old: gp.close(5.0))
        started = time.perf_counter()
        self.daemon.push({"type": "knob", "run": RUN, "seq": 1, "knob": "batch_size", "value": 8})
        wait_until(lambda: not gp.connected, what="the channel to stop")
        self.assertLess(time.perf_counter() - started, 2.0)

    def test_a_slow_callback_blocks_only_the_background_thread(self):
        gp = self.attached({"batch_size": 64})
        release = threading.Event()
        gp.on_change("batch_size", lambda new, old: release.wait(5.0))
        self.daemon.push({"type": "knob", "run": RUN, "seq": 1, "knob": "batch_size", "value": 8})
        time.sleep(0.05)
        started = time.perf_counter()
        for step in range(100):
            gp.report(step=step)
        self.assertLess(time.perf_counter() - started, 0.15)
        release.set()
        self.daemon.wait_for("knob_ack")
        self.daemon.wait_for("metrics", 100)



class SoftwareTest(unittest.TestCase):
    """What a trainer says of its software when it attaches."""

    def test_names_only_frameworks_the_script_imported(self):
        from gpupilot import _software

        numpy = type(sys)("numpy")
        numpy.__version__ = "1.26.4"
        got = _software.versions({"numpy": numpy, "json": json_module()})
        self.assertEqual(got, {"python": platform.python_version(), "numpy": "1.26.4"})

    def test_torch_details_where_torch_can_say_them(self):
        from gpupilot import _software

        torch = type(sys)("torch")
        torch.__version__ = "2.4.0+cu121"
        torch.version = type(sys)("torch.version")
        torch.version.cuda = "12.1"
        torch.backends = type(sys)("torch.backends")
        torch.backends.cudnn = mock.Mock(is_available=lambda: True, version=lambda: 90100)
        # A build whose NCCL query raises: the rest is still said.
        torch.cuda = mock.Mock(is_available=lambda: True)
        torch.cuda.nccl.version.side_effect = RuntimeError("no NCCL")
        got = _software.versions({"torch": torch})
        self.assertEqual(got["torch"], "2.4.0+cu121")
        self.assertEqual(got["torch_cuda"], "12.1")
        self.assertEqual(got["cudnn"], "90100")
        self.assertNotIn("nccl", got)
        torch.cuda.nccl.version.side_effect = None
        torch.cuda.nccl.version.return_value = (2, 20, 5)
        self.assertEqual(_software.versions({"torch": torch})["nccl"], "2.20.5")

    def test_odd_versions_are_left_out(self):
        from gpupilot import _software

        jax = type(sys)("jax")
        jax.__version__ = "x" * (_software.MAX_VERSION + 1)
        tf = type(sys)("tensorflow")
        tf.__version__ = "2.15\n0"
        got = _software.versions({"jax": jax, "tensorflow": tf})
        self.assertEqual(got, {"python": platform.python_version()})


def json_module():
    import json

    return json

if __name__ == "__main__":
    unittest.main()
