"""gpupilot.torch: batch sizes that follow the knob, loaders rebuilt at a batch boundary.

Runs where PyTorch is installed; elsewhere every test is skipped and the reason is printed,
unless GPUPILOT_REQUIRE_TORCH=1 or GPUPILOT_REQUIRE_PEERS=1 (CI, `.ci/run`), where a missing
PyTorch is a failure.
"""

import os
import sys
import unittest

import gpupilot

REQUIRED = "1" in (os.environ.get("GPUPILOT_REQUIRE_TORCH"), os.environ.get("GPUPILOT_REQUIRE_PEERS"))

try:
    import torch
    from torch.utils.data import DataLoader, SequentialSampler, RandomSampler, TensorDataset
except ImportError as exc:
    torch = None
    MISSING = "PyTorch is not installed for {} ({})".format(sys.executable, exc)
    SKIP = MISSING + ": the gpupilot.torch tests are skipped"
    if not REQUIRED:
        sys.stderr.write("SKIP test_torch: " + SKIP + "\n")
else:
    MISSING = SKIP = ""
    from gpupilot.torch import KnobBatchSampler, KnobLoader, loader_kwargs, scale_lr_with_batch


if torch is None and REQUIRED:

    class TorchIsThereTest(unittest.TestCase):
        def test_pytorch_is_installed(self):
            self.fail(
                MISSING + "; it is required here (GPUPILOT_REQUIRE_TORCH=1 or GPUPILOT_REQUIRE_PEERS=1): "
                "install Debian's python3-torch and give the venv the system's packages "
                "(python3 -m venv --system-site-packages .venv), as .ci/run does"
            )


def local(**knobs):
    return gpupilot.connect(knobs=knobs, env={})


def dataset(n):
    return TensorDataset(torch.arange(n))


def flat(batches):
    return [int(i) for batch in batches for i in batch[0]]


@unittest.skipIf(torch is None, SKIP)
class KnobBatchSamplerTest(unittest.TestCase):
    def test_batch_size_follows_the_knob_from_the_next_batch(self):
        gp = local(batch_size=4)
        sampler = KnobBatchSampler(SequentialSampler(range(20)), gp)
        sizes = []
        for batch in sampler:
            sizes.append(len(batch))
            if len(sizes) == 2:
                gp.set("batch_size", 3)
        self.assertEqual(sizes, [4, 4, 3, 3, 3, 3])

    def test_drop_last_and_len(self):
        gp = local(batch_size=8)
        keep = KnobBatchSampler(SequentialSampler(range(20)), gp)
        drop = KnobBatchSampler(SequentialSampler(range(20)), gp, drop_last=True)
        self.assertEqual(len(keep), 3)
        self.assertEqual(len(drop), 2)
        self.assertEqual([len(b) for b in keep], [8, 8, 4])
        self.assertEqual([len(b) for b in drop], [8, 8])

    def test_every_index_once_per_epoch_with_a_dataloader(self):
        gp = local(batch_size=5)
        sampler = KnobBatchSampler(RandomSampler(range(37)), gp)
        loader = DataLoader(dataset(37), batch_sampler=sampler)
        for _ in range(2):
            seen = []
            for i, (x,) in enumerate(loader):
                seen.extend(int(v) for v in x)
                if i == 1:
                    gp.set("batch_size", 7)
            self.assertEqual(sorted(seen), list(range(37)))
            gp.set("batch_size", 5)

    def test_a_knob_without_a_value_is_refused_up_front(self):
        with self.assertRaises(ValueError) as raised:
            KnobBatchSampler(SequentialSampler(range(4)), local(prefetch=2))
        self.assertIn("batch_size", str(raised.exception))


@unittest.skipIf(torch is None, SKIP)
class LoaderKwargsTest(unittest.TestCase):
    def test_prefetch_factor_only_with_workers(self):
        self.assertEqual(loader_kwargs(4, 0), {"num_workers": 0})
        self.assertEqual(loader_kwargs(None, 0), {"num_workers": 0})
        self.assertEqual(loader_kwargs(4, 2), {"num_workers": 2, "prefetch_factor": 4})
        # Both build a DataLoader on this torch.
        DataLoader(dataset(4), batch_size=2, **loader_kwargs(3, 0))
        DataLoader(dataset(4), batch_size=2, **loader_kwargs(3, 1))


@unittest.skipIf(torch is None, SKIP)
class KnobLoaderTest(unittest.TestCase):
    def make(self, gp, n=40, shuffle=False):
        data = dataset(n)
        base = RandomSampler(range(n)) if shuffle else SequentialSampler(range(n))
        sampler = KnobBatchSampler(base, gp)
        built = []

        def make_loader(prefetch, workers):
            built.append((prefetch, workers))
            return DataLoader(data, batch_sampler=sampler, **loader_kwargs(prefetch, workers))

        return KnobLoader(make_loader, gp), built

    def test_rebuilds_at_the_next_batch_and_keeps_the_epoch_exact(self):
        gp = local(batch_size=4, prefetch=2, workers=2)
        loader, built = self.make(gp, n=40, shuffle=True)
        seen = []
        for i, batch in enumerate(loader):
            seen.append(batch)
            if i == 1:
                self.assertTrue(gp.set("prefetch", 4))
            if i == 4:
                self.assertTrue(gp.set("workers", 1))
        self.assertEqual(built, [(2, 2), (4, 2), (4, 1)])
        self.assertEqual(loader.rebuilds, 2)
        indices = flat(seen)
        self.assertEqual(sorted(indices), list(range(40)), "no sample lost or repeated")
        self.assertEqual(len(seen), 10)
        # The next epoch starts afresh on the current loader.
        self.assertEqual(sorted(flat(list(loader))), list(range(40)))
        self.assertEqual(len(built), 3)

    def test_order_is_kept_across_a_rebuild(self):
        gp = local(batch_size=3, prefetch=2, workers=2)
        loader, _ = self.make(gp, n=30)
        seen = []
        for i, batch in enumerate(loader):
            seen.append(batch)
            if i == 0:
                gp.set("workers", 0)
        self.assertEqual(flat(seen), list(range(30)))

    def test_batch_size_and_workers_change_together(self):
        gp = local(batch_size=4, prefetch=2, workers=0)
        loader, built = self.make(gp, n=50)
        seen = []
        for i, batch in enumerate(loader):
            seen.append(batch)
            if i == 2:
                gp.set("batch_size", 6)
                gp.set("workers", 2)
        self.assertEqual(built, [(None, 0), (2, 2)])
        self.assertEqual(flat(seen), list(range(50)))
        self.assertEqual([len(b[0]) for b in seen][:4], [4, 4, 4, 6])

    def test_prefetch_changes_are_refused_without_workers(self):
        gp = local(batch_size=4, prefetch=2, workers=0)
        loader, _ = self.make(gp)
        with self.assertLogs("gpupilot", "WARNING") as logs:
            self.assertFalse(gp.set("prefetch", 4))
        self.assertIn("without DataLoader workers", "\n".join(logs.output))
        gp.set("workers", 1)
        with self.assertLogs("gpupilot", "WARNING"):
            self.assertFalse(gp.set("prefetch", 0))
        self.assertTrue(gp.set("prefetch", 3))
        self.assertEqual(len(list(loader)), 10)

    def test_a_plain_loader_keeps_the_epoch_length(self):
        gp = local(prefetch=2, workers=0)
        data = dataset(24)
        loader = KnobLoader(
            lambda prefetch, workers: DataLoader(data, batch_size=4, **loader_kwargs(prefetch, workers)),
            gp,
            default_workers=0,
        )
        count = 0
        with self.assertLogs("gpupilot", "WARNING"):
            for i, _ in enumerate(loader):
                count += 1
                if i == 1:
                    gp.set("workers", 1)
        self.assertEqual(count, 6)
        self.assertEqual(loader.rebuilds, 1)

    def test_wait_time_is_measured(self):
        gp = local(batch_size=4)
        loader, _ = self.make(gp, n=8)
        for _ in loader:
            self.assertGreaterEqual(loader.wait_s, 0.0)
        self.assertEqual(len(loader), 2)


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(torch is None, SKIP)
class ScaleLrTest(unittest.TestCase):
    def test_the_learning_rate_follows_the_batch_size_once_applied(self):
        gp = local(batch_size=32)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD([{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.01}], lr=0.1)
        scale_lr_with_batch(opt, gp)
        self.assertTrue(gp.set("batch_size", 64))
        self.assertEqual([round(g["lr"], 6) for g in opt.param_groups], [0.2, 0.02])
        self.assertTrue(gp.set("batch_size", 16))
        self.assertEqual([round(g["lr"], 6) for g in opt.param_groups], [0.05, 0.005])

    def test_a_refused_change_leaves_the_rate(self):
        gp = local(batch_size=32)
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        scale_lr_with_batch(opt, gp)
        gp.on_change("batch_size", lambda new, old: new <= 64)
        with self.assertLogs("gpupilot", "WARNING"):
            self.assertFalse(gp.set("batch_size", 128))
        self.assertEqual(opt.param_groups[0]["lr"], 0.1)
