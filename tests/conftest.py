"""Test-wide settings."""
import os

# Every pass's result is checked against the op rules (`cvmc.ops.infer.verify`), not only
# structurally: a pass that changes nodes without retyping fails the test that compiles.
# Set before cvmc.passes.pipeline is imported, which reads it once.
os.environ.setdefault("CVMC_VERIFY_TYPES", "1")
