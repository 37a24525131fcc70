"""CVM-Runtime itself as a test oracle for `cvmc export --format cvm`.

A graph is exported as `cvmc export` writes it, run by the `cvm_run` driver of
../shared/tools/cvm-runtime (CVM_RUNTIME_DRIVER names it) at DEVTYPE 0 (CPU) and 2 (FORMAL,
CVM-Runtime's executable spec), and must load and give the bits of cvmc's reference
interpreter and of its llvm build. CI has no copy of CVM-Runtime (no package index holds
it): there `needs_cvm_runtime` skips, saying so.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from cvmc.frontend.cvm_json import export_cvm
from cvmc.ir import Graph
from cvmc.reference import reference_run

DRIVER = os.environ.get("CVM_RUNTIME_DRIVER")
DEVICES = {"cpu": 0, "formal": 2}  # cvm_run's DEVTYPE

needs_cvm_runtime = pytest.mark.skipif(
    not DRIVER, reason="CVM_RUNTIME_DRIVER is not set: no CVM-Runtime build to run the export "
                       "on (build it with ../shared/tools/cvm-runtime/build.sh)")


class CvmRuntimeRefused(AssertionError):
    """CVM-Runtime failed to load or run an export (its message)."""


def run_exported(symbol: Path, params: Path, x: np.ndarray, device: str) -> np.ndarray:
    """The output values (flat) of exported files as CVM-Runtime computes them on `device`
    ("cpu" or "formal") for the int32 input x."""
    with tempfile.TemporaryDirectory(prefix="cvmc-cvmrt-") as tmp:
        data = Path(tmp) / "data.i32"
        data.write_bytes(np.asarray(x).astype("<i4").tobytes())
        run = subprocess.run([DRIVER, str(symbol), str(params), str(data),
                              str(DEVICES[device])], check=False, capture_output=True,
                             text=True, timeout=300)
    if run.returncode != 0:
        message = " | ".join(line for line in (run.stderr + run.stdout).splitlines()
                             if line.strip())
        raise CvmRuntimeRefused(f"CVM-Runtime ({device}) exit {run.returncode}: "
                                f"{message[-1500:]}")
    return np.array(run.stdout.splitlines()[-1].split(), dtype=np.int64)


def run_cvm_runtime(graph: Graph, x: np.ndarray, device: str) -> np.ndarray:
    """The graph's one output as CVM-Runtime computes it on `device` for input x."""
    (out,) = graph.outputs
    with tempfile.TemporaryDirectory(prefix="cvmc-cvmrt-") as tmp:
        values = run_exported(*export_cvm(graph, tmp), x, device)
    shape = graph.types[out].shape
    if values.size != int(np.prod(shape)):
        raise CvmRuntimeRefused(f"CVM-Runtime ({device}) gave {values.size} values for "
                                f"output shape {list(shape)}")
    return values.reshape(shape)


def run_llvm(graph: Graph, x: np.ndarray) -> np.ndarray:
    """The graph's one output from its llvm build (a .cvmx run by cvmc_runtime)."""
    import cvmc_runtime

    from cvmc.codegen import compile_model

    with tempfile.TemporaryDirectory(prefix="cvmc-cvmrt-") as tmp:
        compile_model(graph, Path(tmp) / "m.cvmx", "llvm")
        model = cvmc_runtime.load(Path(tmp) / "m.cvmx")
    return model.run({graph.inputs[0]: x})[graph.outputs[0]]


def assert_cvm_runtime_agrees(graph: Graph, x: np.ndarray,
                              deviations: dict[str, str] | None = None) -> None:
    """Reference, llvm and CVM-Runtime on CPU and FORMAL give the same bits for input x.
    `deviations` ({device: reason}) names a known CVM-Runtime bug on a device: there the
    export must still fail to agree (else the entry is stale), and the test is xfailed
    with the reason once every other device has agreed."""
    (out,) = graph.outputs
    want = reference_run(graph, {graph.inputs[0]: x})[out]
    assert np.array_equal(run_llvm(graph, x), want), "llvm differs from the reference"
    deviations = deviations or {}
    for device in DEVICES:
        try:
            got = run_cvm_runtime(graph, x, device)
            problem = None if np.array_equal(got, want) else (
                f"CVM-Runtime ({device}) differs from the reference at "
                f"{int(np.count_nonzero(got != want))} of {want.size} values: first at "
                f"{np.argwhere(got != want)[0].tolist()}")
        except CvmRuntimeRefused as e:
            problem = str(e)
        if device in deviations:
            assert problem, (f"CVM-Runtime ({device}) now agrees: the known deviation "
                             f"'{deviations[device]}' no longer holds; remove it")
        else:
            assert problem is None, problem
    if deviations:
        reasons = {r: [d for d in deviations if deviations[d] == r] for r in deviations.values()}
        pytest.xfail("; ".join(f"CVM-Runtime {', '.join(ds).upper()}: {r}"
                               for r, ds in reasons.items()))
