"""The guard-page harness itself: a read just outside a guarded tensor kills the worker,
the call fails naming what the worker was doing, and the next call gets a fresh worker."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cvmc_runtime.model import ALIGNMENT

from tests.guard_pages import PLACEMENTS, GuardWorker, guarded, progress


def read_outside(placement: str, nbytes: int) -> None:
    """Worker side: read the byte just before (after_guard) or the first byte past the
    aligned end (before_guard) of a guarded tensor of `nbytes`."""
    tensor = guarded(nbytes, placement, np.zeros(1, np.uint8))
    address = tensor.ctypes.data
    ctypes.string_at(address, nbytes)  # the tensor itself is readable
    progress(f"reading outside ({placement})")
    ctypes.string_at(address - 1 if placement == "after_guard" else
                     address + -(-nbytes // ALIGNMENT) * ALIGNMENT, 1)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_read_outside_fails_the_call_and_the_worker_restarts(placement, tmp_path):
    worker = GuardWorker(tmp_path / "progress")
    try:
        with pytest.raises(AssertionError, match=rf"signal SIGSEGV\) while reading outside "
                                                 rf"\({placement}\)"):
            worker.call(f"{__name__}:read_outside", placement=placement, nbytes=100)
        worker.call("tests.guard_pages:progress", what="alive")  # a fresh worker answers
    finally:
        worker.close()
