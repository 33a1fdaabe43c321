"""The framework integrations: a loader's batches sized by their step, the SDK's step clock for
loaders that fetch ahead, and the callbacks in real frameworks (transformers + Accelerate here;
Lightning where it imports). Each framework's tests are skipped, with the reason, where it is
not installed (``GPUPILOT_REQUIRE_TORCH=1``, as in CI, makes missing torch a failure).

The real daemon with two ranks is tests/distributed/frameworks.rs.
"""

import os
import threading
import time
import unittest

import gpupilot


def _have(module):
    try:
        __import__(module)
        return True
    except Exception:
        return False


HAVE_TORCH = _have("torch")
HAVE_HF = HAVE_TORCH and _have("transformers") and _have("accelerate")
HAVE_LIGHTNING = HAVE_TORCH and (_have("lightning.pytorch") or _have("pytorch_lightning"))
REQUIRED = os.environ.get("GPUPILOT_REQUIRE_TORCH") == "1"
# CI runs this file again on torch 2, where Lightning must import (.ci/run).
LIGHTNING_REQUIRED = os.environ.get("GPUPILOT_REQUIRE_LIGHTNING") == "1"


class Sent(object):
    """Stands in for the channel: keeps what the trainer sends."""

    def __init__(self):
        self.frames = []
        self.connected = True

    def send(self, frame, priority=False):
        self.frames.append(frame)

    def acks(self):
        return [f for f in self.frames if f.get("type") == "knob_ack"]


def ranked(batch_size=4):
    """A rank of a 2-rank job with a stand-in channel, as the SDK makes one under gpupilot."""
    gp = gpupilot.Trainer({"batch_size": batch_size}, rank={"rank": 0, "world_size": 2})
    gp._channel = Sent()
    return gp, gpupilot._Handler(gp)


class KnobForStepTest(unittest.TestCase):
    def test_a_committed_change_counts_from_its_step_on(self):
        gp, handler = ranked()
        gp.report(step=3)
        ready, reason, _ = handler.propose_knob(1, "batch_size", 8, 6)
        self.assertTrue(ready, reason)
        handler.decide_knob(1, True, None)
        self.assertEqual(gp.knob_for_step("batch_size", 5), 4)
        self.assertEqual(gp.knob_for_step("batch_size", 6), 8)
        self.assertEqual(gp.knob("batch_size"), 4, "not applied before its step")
        # The batches of steps up to 6 are formed: a change for step 6 is refused.
        ready, reason, _ = handler.propose_knob(2, "batch_size", 16, 6)
        self.assertFalse(ready)
        self.assertIn("formed already", reason)
        gp.report(step=5)
        self.assertEqual(gp.knob("batch_size"), 8)
        ack = gp._channel.acks()[-1]
        self.assertEqual((ack["seq"], ack["applied"], ack["step"]), (1, True, 6))

    def test_an_undecided_change_is_waited_for_then_kept_out(self):
        gp, handler = ranked()
        gp.report(step=1)
        ready, _, _ = handler.propose_knob(1, "batch_size", 8, 4)
        self.assertTrue(ready)
        started = time.monotonic()
        self.assertEqual(gp.knob_for_step("batch_size", 4, wait_s=0.2), 4)
        self.assertGreaterEqual(time.monotonic() - started, 0.2)
        # The decision comes too late for this rank: it does not apply the change.
        handler.decide_knob(1, True, None)
        gp.report(step=3)
        self.assertEqual(gp.knob("batch_size"), 4)
        ack = gp._channel.acks()[-1]
        self.assertFalse(ack["applied"])
        self.assertIn("formed before a decision came", ack["reason"])

    def test_a_decision_that_comes_while_waiting_is_taken(self):
        gp, handler = ranked()
        gp.report(step=1)
        handler.propose_knob(1, "batch_size", 8, 4)
        timer = threading.Timer(0.05, handler.decide_knob, (1, True, None))
        timer.start()
        try:
            self.assertEqual(gp.knob_for_step("batch_size", 4, wait_s=5.0), 8)
        finally:
            timer.join()

    def test_an_applied_note_goes_with_the_ack(self):
        gp, handler = ranked()
        gp.on_applied("batch_size", lambda new, old: "learning rate x{} (linear rule)".format(new // old))
        gp.report(step=1)
        handler.propose_knob(1, "batch_size", 8, 3)
        handler.decide_knob(1, True, None)
        gp.report(step=2)
        ack = gp._channel.acks()[-1]
        self.assertEqual((ack["applied"], ack["reason"]), (True, "learning rate x2 (linear rule)"))


@unittest.skipUnless(HAVE_TORCH or REQUIRED, "torch is not installed here")
class StepBatchSamplerTest(unittest.TestCase):
    def test_batches_take_their_steps_size_and_are_counted(self):
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from gpupilot.integrations._loader import Plan, StepBatchSampler

        gp = gpupilot.connect(knobs={"batch_size": 4}, env={})
        loader = DataLoader(TensorDataset(torch.arange(40)), batch_size=4)
        plan = Plan(gp, accumulation=2)
        self.assertTrue(plan.install(loader), plan.why_not)
        self.assertIsInstance(loader.batch_sampler, StepBatchSampler)
        plan.epoch_started(0)
        sizes = []
        for i, (x,) in enumerate(loader):
            sizes.append(len(x))
            if i == 1:
                gp.set("batch_size", 8)
        # Two batches a step; the change came after the second batch (step 1's last).
        self.assertEqual(sizes, [4, 4, 8, 8, 8, 8])
        self.assertEqual(plan.step_done(1), 8)
        self.assertEqual(plan.step_done(3), 40)
        self.assertEqual(sum(sizes), 40, "every sample once")

    def test_a_custom_batch_sampler_is_not_driven_and_says_why(self):
        import torch
        from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

        from gpupilot.integrations._loader import Plan

        class Mine(BatchSampler):
            pass

        ds = TensorDataset(torch.arange(8))
        loader = DataLoader(ds, batch_sampler=Mine(SequentialSampler(ds), 2, False))
        plan = Plan(gpupilot.connect(knobs={"batch_size": 2}, env={}))
        self.assertFalse(plan.install(loader))
        self.assertIn("subclass of BatchSampler (Mine)", plan.why_not)

    def test_lr_rules(self):
        import torch

        from gpupilot.integrations._loader import rescale_lr

        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
        self.assertEqual(rescale_lr("linear", [opt], 8, 4, [sched]), 2.0)
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.2)
        self.assertAlmostEqual(sched.base_lrs[0], 0.2)
        self.assertAlmostEqual(rescale_lr("sqrt", [opt], 16, 4, [sched]), 2.0)
        self.assertIsNone(rescale_lr(None, [opt], 16, 4))
        with self.assertRaises(ValueError):
            rescale_lr("cubic", [opt], 16, 4)


def _tiny_bert():
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    return BertForSequenceClassification(config)


class _Tokens(object):
    def __init__(self, n):
        import torch

        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 64, (n, 8), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i, 0] % 2}


@unittest.skipUnless(HAVE_HF or REQUIRED, "transformers and accelerate are not installed here")
class TransformersCallbackTest(unittest.TestCase):
    def _train(self, gp, dataset, **kwargs):
        import tempfile

        from transformers import Trainer, TrainerCallback, TrainingArguments

        from gpupilot.integrations.transformers import GpupilotCallback

        sizes = {}

        class Sizes(Trainer):
            def training_step(self, model, inputs):
                sizes[self.state.global_step + 1] = int(inputs["input_ids"].shape[0])
                return super().training_step(model, inputs)

        class ChangeAt(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step == 3:
                    gp.set("batch_size", 8)

        callback = GpupilotCallback(gp=gp, lr_rule="linear")
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, num_train_epochs=1,
                                     report_to=[], disable_tqdm=True, save_strategy="no", use_cpu=True,
                                     learning_rate=1e-3, lr_scheduler_type="constant", **kwargs)
            trainer = Sizes(model=_tiny_bert(), args=args, train_dataset=dataset,
                            callbacks=[callback, ChangeAt()])
            trainer.train()
            saved = sorted(os.listdir(out))
        return sizes, callback, trainer, saved

    def test_a_change_reaches_the_next_batch_formed_with_the_rate_scaled(self):
        gp = gpupilot.connect(knobs={"batch_size": 4}, env={})
        sizes, callback, trainer, saved = self._train(gp, _Tokens(64))
        self.assertEqual(saved, [], "no checkpoint where the change was made live")
        # Accelerate fetches one batch ahead: at the end of step 3 the batch of step 4 is
        # formed; step 5 is the first of the new size.
        self.assertEqual([sizes[s] for s in range(1, 6)], [4, 4, 4, 4, 8], sizes)
        self.assertEqual(sum(sizes.values()), 64, "every sample once")
        self.assertEqual(callback.plan.step_done(trainer.state.global_step), 64)
        self.assertAlmostEqual(trainer.optimizer.param_groups[0]["lr"], 2e-3)

    def test_an_iterable_dataset_refuses_with_why_and_asks_for_a_checkpoint(self):
        import torch

        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                return iter(_Tokens(32)[i] for i in range(32))

        gp = gpupilot.connect(knobs={"batch_size": 4}, env={})
        sizes, callback, _, saved = self._train(gp, Stream(), max_steps=8)
        self.assertEqual(set(sizes.values()), {4})
        # Refused at the end of step 3; saved at the end of the next.
        self.assertEqual(saved, ["checkpoint-4"])
        self.assertEqual(gp.knob("batch_size"), 4)
        self.assertIn("iterable dataset", callback.plan.why_not)


@unittest.skipUnless(HAVE_HF or REQUIRED, "accelerate is not installed here")
class AccelerateHelperTest(unittest.TestCase):
    def test_a_prepared_loader_follows_the_batch_size(self):
        import torch
        from accelerate import Accelerator
        from torch.utils.data import DataLoader, TensorDataset

        from gpupilot.integrations.accelerate import follow_knobs

        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.arange(48).float().unsqueeze(1)), batch_size=4, shuffle=True)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        gp = gpupilot.connect(knobs={"batch_size": 4}, env={})
        knobs = follow_knobs(loader, gp=gp, optimizers=[opt], lr_rule="sqrt")
        self.assertTrue(knobs.live, knobs.why_not)
        sizes = []
        step = 0
        knobs.epoch_started(step)
        for (x,) in loader:
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            sizes.append(len(x))
            knobs.step_done(step, loss=loss.item())
            if step == 2:
                gp.set("batch_size", 16)
        self.assertEqual(sizes, [4, 4, 4, 16, 16, 4], "one batch fetched ahead, then the rest")
        self.assertEqual(knobs.plan.step_done(step), 48)
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.2)


@unittest.skipUnless(
    HAVE_LIGHTNING or LIGHTNING_REQUIRED, "Lightning does not import here (it needs torch 2; Debian's torch is 1.13)"
)
class LightningCallbackTest(unittest.TestCase):
    def test_a_change_reaches_the_next_batch_formed(self):
        import tempfile

        import torch
        from torch.utils.data import DataLoader, TensorDataset

        try:
            import lightning.pytorch as pl
        except ImportError:
            import pytorch_lightning as pl

        from gpupilot.integrations.lightning import GpupilotCallback

        gp = gpupilot.connect(knobs={"batch_size": 4}, env={})
        sizes = {}

        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(1, 1)

            def training_step(self, batch, batch_idx):
                (x,) = batch
                sizes[self.trainer.global_step + 1] = len(x)
                if self.trainer.global_step == 3:
                    gp.set("batch_size", 8)
                return self.layer(x).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        loader = DataLoader(TensorDataset(torch.arange(64).float().unsqueeze(1)), batch_size=4)
        callback = GpupilotCallback(gp=gp, lr_rule="linear")
        with tempfile.TemporaryDirectory() as out:
            trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, default_root_dir=out,
                                 enable_progress_bar=False, logger=False, enable_checkpointing=False,
                                 callbacks=[callback])
            trainer.fit(Model(), train_dataloaders=loader)
        # Asked for in step 4's training_step: the next batch Lightning draws is of the new size.
        self.assertEqual(list(sizes.values()), [4] * 4 + [8] * 6, sizes)
        self.assertEqual(callback.plan.step_done(trainer.global_step), 64)
        self.assertAlmostEqual(trainer.optimizers[0].param_groups[0]["lr"], 0.2)


if __name__ == "__main__":
    unittest.main()
