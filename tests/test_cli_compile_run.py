"""`cvmc compile` + `cvmc run` end to end through cvmc.cli.main, and every bad-input error."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cvmc.cli import main
from cvmc.frontend import load_graph
from cvmc.reference import reference_run

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "small_cnn" / "graph.nnef"
SHAPE = (1, 3, 16, 16)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder with the example compiled for llvm (model.cvmx) and an input (data.npy)."""
    d = tmp_path_factory.mktemp("cli")
    rc = main(["compile", str(EXAMPLE), "-o", str(d / "model.cvmx"),
               "--emit", "plan", "--emit", "tir", "--emit", "source"])
    assert rc == 0
    np.save(d / "data.npy", np.random.default_rng(7).integers(-127, 128, SHAPE, np.int8))
    return d


def run_error(capsys, *argv: str) -> str:
    """Run `cvmc ARGV`, expect exit code 1 and one error line on stderr; return it."""
    capsys.readouterr()
    assert main(list(argv)) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    return err


def test_compile_writes_artifact_and_requested_extras(workdir):
    assert zipfile.is_zipfile(workdir / "model.cvmx")
    plan = json.loads((workdir / "model.plan.json").read_text())
    assert [s["name"] for s in plan["inputs"]] == ["data"]
    assert plan["device"] == "cpu" and plan["target"]["mcpu"] != "generic"
    # conv2d (packed for the CPU by the layout pass) + shift + clip + relu: one kernel.
    assert plan["kernels"][0]["ops"] == ["conv2d_packed", "cvm_right_shift", "cvm_clip", "relu"]
    assert plan["kernels"][0]["schedule"] in ("x86-avx512-vnni", "x86-avx2",
                                               "cpu-packed-vector")
    assert "T.parallel" in (workdir / "model.tir").read_text()
    assert "define" in (workdir / "model.ll").read_text()


def test_compile_prints_summary(tmp_path, capsys):
    assert main(["compile", str(EXAMPLE), "-o", str(tmp_path / "m.cvmx")]) == 0
    out = capsys.readouterr().out
    # Weights, by hand: conv1 packed OIHW16o4i 16*4*3*3 int8 = 576, its compensation 8
    # int32 = 32, conv1_bias 8 int32 = 32; the dense as a packed 1x1 conv: fc_weight
    # 16*512*1*1 int8 = 8192, its compensation 10 int32 = 40, fc_bias 10 int32 = 40:
    # 8912 bytes. Kernels: conv + epilogue, pool, flatten + reshape, the dense's conv,
    # reshape back: 5.
    for word in ("kernels: 5", "weights: 8912 bytes", "peak activation memory", "compile time"):
        assert word in out, out


def test_run_matches_reference(workdir, capsys):
    out_dir = workdir / "out"
    assert main(["run", str(workdir / "model.cvmx"), "--input", f"data={workdir / 'data.npy'}",
                 "--output-dir", str(out_dir)]) == 0
    assert "logits: shape [1, 10] int32" in capsys.readouterr().out
    want = reference_run(load_graph(EXAMPLE), {"data": np.load(workdir / "data.npy")})
    got = np.load(out_dir / "logits.npy")
    assert got.dtype == want["logits"].dtype and np.array_equal(got, want["logits"])


def test_stop_after_and_dump_ir(tmp_path, capsys):
    assert main(["compile", str(EXAMPLE), "-o", str(tmp_path / "m.cvmx"), "--stop-after",
                 "infer-precision", "--dump-ir", str(tmp_path / "ir")]) == 0
    assert "stopped after pass 'infer-precision'" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "ir").iterdir()] == ["00-infer-precision.nnef"]
    assert not (tmp_path / "m.cvmx").exists()


def _save(path: Path, array: np.ndarray) -> str:
    np.save(path, array)
    return str(path)


@pytest.mark.parametrize("make_args, message", [
    (lambda d: ["--input", f"image={d / 'data.npy'}"], "unknown input 'image'"),
    (lambda d: [], "missing input 'data'"),
    (lambda d: ["--input", "data=" + _save(d / "s.npy", np.zeros((1, 3, 8, 8), np.int8))],
     "expected shape [1, 3, 16, 16], got [1, 3, 8, 8]"),
    (lambda d: ["--input", "data=" + _save(d / "f.npy", np.zeros(SHAPE, np.float32))],
     "expected an integer array, got dtype float32"),
    (lambda d: ["--input", "data=" + _save(d / "p.npy", np.full(SHAPE, 200, np.int32))],
     "value 200 at index [0, 0, 0, 0] is outside precision 8"),
])
def test_bad_run_input_is_one_clear_error(workdir, capsys, make_args, message):
    err = run_error(capsys, "run", str(workdir / "model.cvmx"), *make_args(workdir))
    assert message in err, err


def test_saturate_clips_out_of_precision_input(workdir, capsys):
    path = _save(workdir / "big.npy", np.full(SHAPE, 500, np.int32))
    assert main(["run", str(workdir / "model.cvmx"), "--input", f"data={path}",
                 "--saturate"]) == 0


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "not-zip"])
def test_damaged_artifact_is_one_clear_error(workdir, tmp_path, capsys, damage):
    data = (workdir / "model.cvmx").read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "corrupt":
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + \
            data[middle + 64:]
    else:
        data = b"hello"
    bad = tmp_path / "bad.cvmx"
    bad.write_bytes(data)
    err = run_error(capsys, "run", str(bad), "--input", f"data={workdir / 'data.npy'}")
    assert "bad.cvmx" in err and ("corrupt" in err or "not a valid .cvmx" in err), err


def test_cuda_artifact_builds_and_without_gpu_is_one_clear_error(tmp_path, capsys):
    from cvmc_runtime.model import cuda_available

    from cvmc.codegen.targets.cuda import find_nvcc

    try:
        find_nvcc()
    except Exception as e:  # noqa: BLE001
        pytest.skip(str(e))
    out = tmp_path / "gpu.cvmx"
    assert main(["compile", str(EXAMPLE), "--target", "cuda", "--arch", "sm_80",
                 "-o", str(out), "--emit", "source"]) == 0
    assert "__global__" in (tmp_path / "gpu.cu").read_text()
    if cuda_available():
        pytest.skip("a GPU is present: tests/gpu covers running CUDA artifacts")
    data = _save(tmp_path / "d.npy", np.zeros(SHAPE, np.int8))
    err = run_error(capsys, "run", str(out), "--input", f"data={data}")
    assert "built for CUDA (sm_80), but no CUDA GPU is available" in err, err


def test_bad_compile_arguments_are_one_clear_error(tmp_path, capsys):
    err = run_error(capsys, "compile", str(EXAMPLE), "-o", str(tmp_path / "m.cvmx"),
                    "--mcpu", "not-a-cpu")
    assert "--mcpu not-a-cpu" in err, err


@pytest.mark.parametrize("arch", ["80", "sm_", "sm_1", "sm_8", "sm_60", "sm_0080", "sm_90a",
                                  "sm_８０", "compute_80", "sm_80 "])
def test_bad_cuda_arch_is_a_usage_error(tmp_path, capsys, arch):
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["compile", str(EXAMPLE), "-o", str(tmp_path / "m.cvmx"), "--target", "cuda",
              "--arch", arch])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"cvmc compile: error: argument --arch: expected sm_<major><minor> of "
                   f"compute capability 6.1 or newer (the kernels use dp4a), e.g. sm_80 or "
                   f"sm_90; got '{arch}'"), err
    assert not (tmp_path / "m.cvmx").exists()
    # The Python API refuses it too, before any work (no TVM error, no traceback).
    import cvmc
    with pytest.raises(cvmc.CvmcError, match=f"--arch {arch}: expected sm_<major><minor>"):
        cvmc.compile(cvmc.load_graph(EXAMPLE), tmp_path / "m.cvmx", target="cuda", arch=arch)


def test_cuda_arch_this_nvcc_cannot_build_is_one_clear_error(tmp_path, capsys):
    from cvmc.codegen.targets.cuda import find_nvcc
    try:
        find_nvcc()
    except Exception as e:  # noqa: BLE001
        pytest.skip(str(e))
    # Compute capability 99.9 exists in no nvcc's list.
    err = run_error(capsys, "compile", str(EXAMPLE), "-o", str(tmp_path / "m.cvmx"),
                    "--target", "cuda", "--arch", "sm_999")
    assert err.startswith("error: --arch sm_999: ") and "cannot build for it; it builds " \
        "for sm_" in err, err
    assert not (tmp_path / "m.cvmx").exists()


def test_tvm_errors_of_the_cuda_build_are_one_clear_error(monkeypatch):
    from cvmc.codegen.targets import cuda
    from cvmc.errors import CvmcError
    from cvmc.passes.target import Target

    def fail(*args):
        raise ValueError("The arch is not expected sm_80")
    monkeypatch.setattr(cuda, "cuda_translation_unit", fail)
    with pytest.raises(CvmcError) as error:
        cuda.build_cuda(None, Target.make("cuda"))
    assert error.value.message == ("--arch sm_80: TVM could not generate CUDA code (The arch "
                                   "is not expected sm_80)")
