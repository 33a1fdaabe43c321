"""The SDK as one rank of a distributed job: who it says it is, and knob changes agreed for a step."""

import threading
import unittest

import gpupilot
from gpupilot import _rank_spec
from tests.test_sdk import RUN, DaemonTest, wait_until


class RankSpecTest(unittest.TestCase):
    def test_torchrun_environment_names_the_rank_and_its_gpu(self):
        spec = _rank_spec({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
        self.assertEqual((spec["rank"], spec["world_size"], spec["local_rank"], spec["gpu"]), (5, 8, 1, 1))
        self.assertTrue(spec["host"])

    def test_visible_devices_map_the_local_rank_to_the_physical_gpu(self):
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"}
        self.assertEqual(_rank_spec(env)["gpu"], 6)
        env["CUDA_VISIBLE_DEVICES"] = "GPU-aaaa,GPU-bbbb"
        spec = _rank_spec(env)
        self.assertEqual(spec["gpu_uuid"], "GPU-bbbb")
        self.assertNotIn("gpu", spec)
        self.assertEqual(_rank_spec(env, gpu=3)["gpu"], 3)

    def test_no_rank_or_a_bad_one_is_a_single_process(self):
        self.assertIsNone(_rank_spec({}))
        with self.assertLogs("gpupilot", "WARNING"):
            self.assertIsNone(_rank_spec({"RANK": "4", "WORLD_SIZE": "4"}))
        with self.assertLogs("gpupilot", "WARNING"):
            self.assertIsNone(_rank_spec({"RANK": "x", "WORLD_SIZE": "4"}))


class StagedChangeTest(DaemonTest):
    def rank(self, knobs=None, rank=1, world=4):
        env = self.env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        return self.attached(knobs or {"batch_size": 32}, env=env)

    def propose(self, seq, value, step, knob="batch_size"):
        self.daemon.push({"type": "knob", "run": RUN, "seq": seq, "knob": knob, "value": value, "apply_step": step})
        return self.daemon.wait_for("knob_vote", where=lambda f: f["seq"] == seq)[0]

    def decide(self, seq, commit, reason=None):
        frame = {"type": "knob_decision", "run": RUN, "seq": seq, "commit": commit}
        if reason:
            frame["reason"] = reason
        self.daemon.push(frame)

    def test_attach_says_which_rank(self):
        self.rank(rank=2)
        (attach,) = self.daemon.wait_for("trainer_attach")
        self.assertEqual((attach["rank"], attach["world_size"], attach["local_rank"], attach["gpu"]), (2, 4, 2, 2))

    def test_a_committed_change_takes_effect_in_the_report_before_its_step(self):
        gp = self.rank()
        applied = []
        gp.on_applied("batch_size", lambda new, old: applied.append((new, old, threading.current_thread().name)))
        for step in range(3):
            gp.report(step=step)
        vote = self.propose(7, 64, step=10)
        self.assertIs(vote["ready"], True)
        self.assertEqual(vote["step"], 2)
        self.decide(7, True)
        wait_until(lambda: gp._staged.get(7, {}).get("committed"), what="the commit")
        # Not before its step, whatever the decision.
        for step in range(3, 9):
            self.assertEqual(gp.knob("batch_size"), 32)
            gp.report(step=step)
        self.assertEqual(gp.knob("batch_size"), 32)
        gp.report(step=9)
        self.assertEqual(gp.knob("batch_size"), 64)
        (ack,) = self.daemon.wait_for("knob_ack")
        self.assertEqual((ack["seq"], ack["applied"], ack["step"]), (7, True, 10))
        # on_applied ran on the training thread, in that report.
        self.assertEqual(applied, [(64, 32, threading.current_thread().name)])
        # The report of step 9 still said 32: it was the step before the change.
        reports = self.daemon.wait_for("metrics", 10)
        self.assertEqual([r["batch_size"] for r in reports if r["step"] == 9], [32])

    def test_without_a_decision_by_the_step_nothing_changes(self):
        gp = self.rank()
        gp.report(step=0)
        self.assertIs(self.propose(3, 64, step=2)["ready"], True)
        gp.report(step=1)
        self.assertEqual(gp.knob("batch_size"), 32)
        (ack,) = self.daemon.wait_for("knob_ack")
        self.assertIs(ack["applied"], False)
        self.assertIn("no decision had come by step 2", ack["reason"])
        # A commit that comes too late is ignored.
        self.decide(3, True)
        gp.report(step=2)
        gp.report(step=3)
        self.assertEqual(gp.knob("batch_size"), 32)

    def test_a_called_off_change_is_dropped(self):
        gp = self.rank()
        gp.report(step=0)
        self.propose(4, 64, step=3)
        self.decide(4, False, "rank 2 refused")
        wait_until(lambda: 4 not in gp._staged, what="the change to be dropped")
        for step in range(1, 6):
            gp.report(step=step)
        self.assertEqual(gp.knob("batch_size"), 32)
        self.assertEqual(self.daemon.received("knob_ack"), [])

    def test_votes_no_when_past_the_step_or_the_script_refuses(self):
        gp = self.rank()
        for step in range(5):
            gp.report(step=step)
        vote = self.propose(5, 64, step=5)
        self.assertIs(vote["ready"], False)
        self.assertIn("past the apply step 5", vote["reason"])

        def refuse(new, old):
            raise ValueError("batch {} does not fit".format(new))

        gp.on_change("batch_size", refuse)
        vote = self.propose(6, 4096, step=20)
        self.assertIs(vote["ready"], False)
        self.assertEqual(vote["reason"], "batch 4096 does not fit")
        self.assertIs(self.propose(8, 64, step=20, knob="workers")["ready"], False)
        self.assertEqual(gp._staged, {})

    def test_a_late_rank_takes_the_job_value_before_its_first_step(self):
        self.daemon.answers["trainer_attach"] = lambda f: {
            "id": f["id"], "type": "trainer_attached", "run": RUN, "knobs": {"batch_size": 64},
        }
        gp = self.rank()
        self.assertEqual(gp.knob("batch_size"), 64)

    def test_a_rank_that_has_trained_keeps_its_value_on_reattach(self):
        gp = self.rank()
        gp.report(step=0)
        self.daemon.stop()
        self.daemon.answers["trainer_attach"] = lambda f: {
            "id": f["id"], "type": "trainer_attached", "run": RUN, "knobs": {"batch_size": 64},
        }
        self.daemon.start()
        wait_until(lambda: gp._channel.attach_count >= 2, timeout=10, what="the reattach")
        self.assertEqual(gp.knob("batch_size"), 32)

    def test_a_single_process_ignores_the_attach_values(self):
        self.daemon.answers["trainer_attach"] = lambda f: {
            "id": f["id"], "type": "trainer_attached", "run": RUN, "knobs": {"batch_size": 64},
        }
        gp = self.attached({"batch_size": 32})
        self.assertEqual(gp.knob("batch_size"), 32)
        self.assertNotIn("rank", self.daemon.wait_for("trainer_attach")[0])


if __name__ == "__main__":
    unittest.main()
