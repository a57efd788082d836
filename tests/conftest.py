"""Test-wide settings: keep test runs (and the notebooks nbval executes) from writing into the project's
figures/ and data/results/, which hold the outputs of `make run`."""

import os
import tempfile

_scratch = tempfile.mkdtemp(prefix="prefix-cache-lab-tests-")
# Set at import time, before nbval starts kernels, so notebook kernels inherit them.
os.environ.setdefault("LAB_FIGURES_DIR", os.path.join(_scratch, "figures"))
os.environ.setdefault("LAB_RESULTS_DIR", os.path.join(_scratch, "results"))
