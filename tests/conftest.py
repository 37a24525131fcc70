"""Test-wide settings: the kernel cache a run uses, the Hypothesis profiles, the `compile`
marker, and the op cases built once per run (`op_builds`)."""
import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Every pass's result is checked against the op rules (`cvmc.ops.infer.verify`), not only
# structurally: a pass that changes nodes without retyping fails the test that compiles.
# Set before cvmc.passes.pipeline is imported, which reads it once.
os.environ.setdefault("CVMC_VERIFY_TYPES", "1")

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set in a pytest-xdist worker process


def under_ci() -> bool:
    """Whether this run is CI's: `CI` set (as `.ci/run` is run; tests/shared.py reads it
    alike)."""
    return bool(os.environ.get("CI"))


def persistent_cache_folder() -> Path:
    """A developer's persistent test kernel cache: `$XDG_CACHE_HOME/cvmc/test-kernels`,
    else `~/.cache/cvmc/test-kernels` (beside, not in, the user's own kernel cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cvmc" / "test-kernels"


# Test cache entries are deleted this long after they were written (a changed schedule
# rule or TVM makes every key new, so old entries are dead weight; a live one is rebuilt
# once).
CACHE_KEEP_DAYS = 14


def _prune(folder: Path, days: int) -> None:
    """Delete the cache files in `folder` not written for `days` days (the cache allows
    deleting any file at any time)."""
    cutoff = time.time() - days * 86400
    for path in folder.glob("*/*"):
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
        except OSError:
            pass


# The kernel cache of a test run (cvmc.codegen.cache), chosen once by the process that
# starts the run: pytest-xdist workers inherit CVMC_CACHE_DIR, so they share one cache and
# a kernel one worker built is a cache hit for the others.
# - CI: a cache of its own, empty at the start and removed at the end: every kernel is
#   compiled cold, and no entry outlives the run.
# - A developer: a persistent, content-keyed test cache (persistent_cache_folder()): a rerun
#   compiles only the kernels whose TIR, target or schedule code changed.
# - CVMC_CACHE_DIR set: that folder (set but empty: no cache), as for `cvmc compile`.
if "CVMC_CACHE_DIR" not in os.environ and WORKER is None:
    if under_ci():
        os.environ["CVMC_CACHE_DIR"] = tempfile.mkdtemp(prefix="cvmc-test-kernels-")
        atexit.register(shutil.rmtree, os.environ["CVMC_CACHE_DIR"], True)
    else:
        persistent_cache_folder().mkdir(parents=True, exist_ok=True)
        _prune(persistent_cache_folder(), CACHE_KEEP_DAYS)
        os.environ["CVMC_CACHE_DIR"] = str(persistent_cache_folder())

# In pytest-xdist workers (`-n auto`) each worker compiles in its own process only: the
# workers are the parallelism (CVMC_JOBS workers per compile on top would oversubscribe).
if WORKER is not None:
    os.environ.setdefault("CVMC_JOBS", "1")

# Hypothesis: HYPOTHESIS_PROFILE=dev for a developer's loop: at most DEV_EXAMPLES examples
# per test (also where a test sets more), the same examples every run (derandomize: so
# the compiled ones hit the persistent kernel cache). Unset, nothing changes: Hypothesis'
# defaults, and its own `ci` profile under CI.
DEV_EXAMPLES = 10
settings.register_profile("dev", max_examples=DEV_EXAMPLES, derandomize=True, deadline=None)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def _cap_examples(items) -> None:
    """Under the dev profile, at most DEV_EXAMPLES examples in the tests that set their
    own max_examples (Hypothesis takes a test's own settings over the profile's)."""
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and own.max_examples > DEV_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(own, max_examples=DEV_EXAMPLES)


def pytest_configure(config):
    # `slow` and `crosscheck` tests stay out unless the -m expression names them (pyproject's
    # addopts says so too; a `-m "not compile"` of one's own replaces addopts' -m).
    expr = config.option.markexpr
    if expr:
        for mark in ("slow", "crosscheck"):
            if mark not in expr:
                expr = f"({expr}) and not {mark}"
        config.option.markexpr = expr


def pytest_collection_modifyitems(config, items):
    from tests.compile_marker import mark_compiling

    mark_compiling(items)
    if os.environ.get("HYPOTHESIS_PROFILE") == "dev":
        _cap_examples(items)


@pytest.fixture(scope="session")
def op_builds(tmp_path_factory):
    """Every op case of tests/codegen/op_cases.py, built for llvm at most once per run (per
    xdist worker) when a test first asks for it (tests/codegen/op_builds.py)."""
    from tests.codegen.op_builds import OpCaseBuilds

    return OpCaseBuilds(tmp_path_factory.mktemp("op-builds"))
