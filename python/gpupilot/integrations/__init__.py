"""gpupilot for training frameworks: a callback each, for live knobs and the job's figures.

- ``gpupilot.integrations.transformers.GpupilotCallback``: Hugging Face ``transformers.Trainer``
- ``gpupilot.integrations.lightning.GpupilotCallback``: PyTorch Lightning's ``Trainer``
- ``gpupilot.integrations.accelerate.follow_knobs``: a loop of your own over
  ``accelerator.prepare``d DataLoaders

Each module imports its framework (and torch) when it is imported; ``import gpupilot`` and
``import gpupilot.integrations`` import neither.
"""
