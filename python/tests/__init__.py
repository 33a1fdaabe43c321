# Tests of the gpupilot Python SDK (standard library unittest only). From the repository root:
#
#     python3 -m unittest discover -s python/tests -t python
#
# The PyTorch helper tests (test_torch.py) run where torch is installed and are skipped, with the
# reason printed, where it is not.

import logging

# The SDK logs what it refuses and why; the tests check those lines with assertLogs and keep the
# rest out of the test output.
logging.getLogger("gpupilot").addHandler(logging.NullHandler())
