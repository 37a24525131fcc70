"""Where the shared corpus and specs are: `../shared` beside the checkout.

A user's clone has no `../shared`: tests that need it are skipped with the reason. CI has
it and must run them, so under CI (`CI` set, as `.ci/run` is run) its absence is an error.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
HAVE_SHARED = SHARED.is_dir()

if not HAVE_SHARED and os.environ.get("CI"):
    raise RuntimeError(f"CI runs need the shared corpus beside the checkout at {SHARED}")

requires_shared = pytest.mark.skipif(
    not HAVE_SHARED, reason=f"needs the shared corpus at {SHARED} (beside the checkout; "
                            f"CI has it)")
