"""The SDK as a wheel: built offline from python/, installed with pip into a fresh venv, imported
there, with the version of the gpupilot it comes with (Cargo.toml's workspace version).

Building needs setuptools and wheel in this interpreter (no build isolation: nothing is
downloaded). Where they are missing the test is skipped, with the reason printed, unless
GPUPILOT_REQUIRE_PEERS=1 (CI, `.ci/run`, which installs them), where that is a failure.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PYTHON_DIR)
REQUIRED = os.environ.get("GPUPILOT_REQUIRE_PEERS") == "1"
# Each step is a few seconds; a hung pip must not hold the suite.
STEP_TIMEOUT_S = 120


def missing_build_tools():
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
    except ImportError as exc:
        return "building the wheel needs setuptools and wheel ({})".format(exc)
    return None


def workspace_version():
    """``version`` of ``[workspace.package]`` in Cargo.toml: the one version of a release."""
    with open(os.path.join(REPO, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("[workspace.package]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


def run(args, cwd):
    return subprocess.run(
        args,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        timeout=STEP_TIMEOUT_S,
        check=False,
    )


class WheelTest(unittest.TestCase):
    def setUp(self):
        why = missing_build_tools()
        if why and REQUIRED:
            self.fail(why + "; required here (GPUPILOT_REQUIRE_PEERS=1): .ci/run installs them")
        if why:
            print("SKIPPED: " + why, file=sys.stderr)
            self.skipTest(why)
        self.dir = tempfile.mkdtemp(prefix="gpupilot-wheel-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def step(self, args, cwd=None):
        out = run(args, cwd or self.dir)
        self.assertEqual(out.returncode, 0, "{} failed:\n{}".format(" ".join(args), out.stdout))
        return out.stdout

    def test_the_wheel_installs_into_a_fresh_venv_with_the_release_version(self):
        version = workspace_version()
        # Built from a copy: an in-tree build leaves build/ and *.egg-info in python/.
        source = os.path.join(self.dir, "src")
        shutil.copytree(
            PYTHON_DIR, source, ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info")
        )
        dist = os.path.join(self.dir, "dist")
        self.step(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
             "--disable-pip-version-check", "--quiet", "--wheel-dir", dist, source]
        )
        wheels = os.listdir(dist)
        self.assertEqual(wheels, ["gpupilot-{}-py3-none-any.whl".format(version)])

        venv = os.path.join(self.dir, "venv")
        self.step([sys.executable, "-m", "venv", venv])
        python = os.path.join(venv, "bin", "python")
        self.step(
            [python, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
             "--quiet", os.path.join(dist, wheels[0])]
        )
        # From elsewhere than python/, so that the installed package is the one imported.
        said = self.step([python, "-c", "import gpupilot; print(gpupilot.__version__, gpupilot.__file__)"]).split()
        self.assertEqual(said[0], version, "the SDK's version is the workspace version of Cargo.toml")
        self.assertTrue(said[1].startswith(venv), said[1])
        # The PyTorch helpers come along (they import torch only when used).
        installed = os.listdir(os.path.dirname(said[1]))
        self.assertTrue({"torch.py", "_channel.py", "integrations"} <= set(installed), installed)
        integrations = os.listdir(os.path.join(os.path.dirname(said[1]), "integrations"))
        self.assertTrue(
            {"transformers.py", "lightning.py", "accelerate.py", "_loader.py"} <= set(integrations), integrations
        )


if __name__ == "__main__":
    unittest.main()
