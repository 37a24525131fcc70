"""Test-wide settings."""
import atexit
import os
import shutil
import tempfile

# Every pass's result is checked against the op rules (`cvmc.ops.infer.verify`), not only
# structurally: a pass that changes nodes without retyping fails the test that compiles.
# Set before cvmc.passes.pipeline is imported, which reads it once.
os.environ.setdefault("CVMC_VERIFY_TYPES", "1")

# A test run has a kernel cache of its own (cvmc.codegen.cache), removed at its end: tests
# write nothing into the user's ~/.cache, and no entry outlives the run.
if "CVMC_CACHE_DIR" not in os.environ:
    os.environ["CVMC_CACHE_DIR"] = tempfile.mkdtemp(prefix="cvmc-test-kernels-")
    atexit.register(shutil.rmtree, os.environ["CVMC_CACHE_DIR"], True)
