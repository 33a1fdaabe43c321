"""The versions a training script runs with, for its run's report and environment.

Python's version, and that of each framework the script has already imported, read from the
loaded module (never by importing a framework here: importing PyTorch takes seconds). For
PyTorch also the CUDA it was built with, cuDNN and NCCL, each only where PyTorch can say it
without error (a CPU build says no CUDA). The daemon keeps at most 16 names of up to 32
characters, with versions of up to 64.
"""

import platform
import sys

MAX_ENTRIES = 16
MAX_NAME = 32
MAX_VERSION = 64

# (name in the report, module as imported), in the order they are kept.
FRAMEWORKS = (
    ("torch", "torch"),
    ("jax", "jax"),
    ("tensorflow", "tensorflow"),
    ("transformers", "transformers"),
    ("deepspeed", "deepspeed"),
    ("accelerate", "accelerate"),
    ("lightning", "lightning"),
    ("pytorch_lightning", "pytorch_lightning"),
    ("numpy", "numpy"),
)


def _text(value):
    """A version as text, or None when there is none to say."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        value = ".".join(str(v) for v in value)
    text = str(value).strip()
    if not text or len(text) > MAX_VERSION or any(ord(c) < 32 for c in text):
        return None
    return text


def _torch_details(torch):
    """PyTorch's CUDA, cuDNN and NCCL versions, each where it can say it."""
    out = {}
    try:
        out["torch_cuda"] = _text(torch.version.cuda)
    except Exception:  # noqa: BLE001 - a framework's odd build must never stop training
        pass
    try:
        if torch.backends.cudnn.is_available():
            out["cudnn"] = _text(torch.backends.cudnn.version())
    except Exception:  # noqa: BLE001
        pass
    try:
        if torch.cuda.is_available():
            out["nccl"] = _text(torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001
        pass
    return {k: v for k, v in out.items() if v}


def versions(modules=None):
    """``{name: version}``: Python, then each imported framework (``modules`` defaults to
    ``sys.modules``), at most :data:`MAX_ENTRIES`."""
    modules = sys.modules if modules is None else modules
    out = {"python": platform.python_version()}
    for name, module in FRAMEWORKS:
        mod = modules.get(module)
        if mod is None:
            continue
        version = _text(getattr(mod, "__version__", None))
        if version:
            out[name] = version
        if module == "torch":
            out.update(_torch_details(mod))
    kept = {}
    for name, version in out.items():
        if len(kept) == MAX_ENTRIES:
            break
        if len(name) <= MAX_NAME:
            kept[name] = version
    return kept
