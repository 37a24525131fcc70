"""The runtime trusts nothing in an artifact's plan (issue 22, items 1, 2, 4 and 6b).

An edited plan that places inputs, weights or outputs in the arena, has a field of the
wrong type, calls the library's kernels with other arguments, or claims CPU features
other than its library's is one ModelError (one `error:` line from `cvmc run` / `bench`),
never a traceback, a wrong result with exit 0, or a SIGILL.
"""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import ModelError

from cvmc.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "small_cnn"
DATA = EXAMPLE / "data.npy"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trust") / "m.cvmx"
    assert main(["compile", str(EXAMPLE), "-o", str(path)]) == 0
    return path


def edited(artifact: Path, folder: Path, edit) -> Path:
    """A copy of `artifact` whose plan.json is `edit(plan)` applied (other members kept)."""
    with zipfile.ZipFile(artifact) as z:
        members = {n: z.read(n) for n in z.namelist()}
    plan = json.loads(members["plan.json"])
    edit(plan)
    members["plan.json"] = json.dumps(plan).encode()
    out = folder / "edited.cvmx"
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    return out


def cvmc_process(*argv) -> subprocess.CompletedProcess:
    """`cvmc ARGV` in a child process (the CLI prints a given warning once per process)."""
    return subprocess.run([sys.executable, "-m", "cvmc.cli", *map(str, argv)], check=False,
                          capture_output=True, text=True)


def one_error_line(capsys, *argv) -> str:
    """`cvmc ARGV` exits 1 with exactly one `error:` line on stderr and no traceback."""
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _offset(name, value):
    return lambda p: p["arena"]["offsets"].__setitem__(name, value)


def _kernel(index, **fields):
    return lambda p: p["kernels"][index].update(fields)


def _target(**fields):
    return lambda p: p["target"].update(fields)


# ---- item 1: every offset, lifetime and type in the plan ----------------------------------
@pytest.mark.parametrize("edit, words", [
    # the reproductions: exit 0 with wrong (or luckily right) logits before
    (_offset("w1_packed", 0), "'w1_packed' is not an intermediate buffer"),
    (_offset("b1", 0), "'b1' is not an intermediate buffer"),
    (_offset("data", 2048), "'data' is not an intermediate buffer"),
    (_offset("logits", -64), "'logits' is not an intermediate buffer"),
    (_offset("nothing", 0), "'nothing' is not an intermediate buffer"),
    # a buffer's own offset: not an integer, a float, a bool, 10**30, negative
    (_offset("r1", "0"), "buffer 'r1' needs an offset"),
    (_offset("r1", 0.0), "buffer 'r1' needs an offset"),
    (_offset("r1", True), "buffer 'r1' needs an offset"),
    (_offset("r1", 10**30), "buffer 'r1' needs an offset"),
    (_offset("p1", -2048), "buffer 'p1' needs an offset"),
    (lambda p: p["arena"].update(bytes=10**30), "buffers end at byte"),
    (lambda p: p["arena"].update(bytes=2.5), "integer 'bytes'"),
    # a name in two lists: the arena would place an input (or weight) on a buffer's bytes
    (lambda p: p["buffers"].append(p["inputs"][0]), "'data' is declared in both"),
    (lambda p: p["inputs"].append(p["inputs"][0]), "'data' is declared twice in 'inputs'"),
    (lambda p: p["outputs"].append(p["buffers"][0]), "'r1' is declared in both"),
    # kernel fields cvmc run and bench read
    (_kernel(0, arith_ops="many"), "arith_ops must be an integer"),
    (_kernel(0, arith_ops=10**30), "arith_ops must be an integer"),
    (_kernel(0, arith_ops=-1), "arith_ops must be an integer"),
    (_kernel(0, arith_ops=1.5), "arith_ops must be an integer"),
    (_kernel(1, schedule=3), "schedule must be a rule name"),
    (_kernel(1, schedule=["x"]), "schedule must be a rule name"),
    (_kernel(1, num_inputs=10**30), "num_inputs must be an integer"),
    (_kernel(1, num_inputs="1"), "num_inputs must be an integer"),
    (_kernel(1, args=["r1", "r1"]), "names one tensor twice"),
    # the target
    (lambda p: p.update(target="llvm"), "target must be"),
    (lambda p: p.pop("target"), "target must be"),
    (_target(mcpu=5), "target must be"),
    (_target(features="avx2"), "target must be"),
    (_target(features=[7]), "target must be"),
    (_target(kind="cuda"), "target must be"),
    (lambda p: p.update(device="cuda"), "target must be"),
])
@pytest.mark.parametrize("command", ["run", "bench"])
def test_edited_plans_are_one_error(artifact, tmp_path, capsys, edit, words, command):
    path = edited(artifact, tmp_path, edit)
    args = ["--repeat", "1", "--warmup", "1"] if command == "bench" else []
    err = one_error_line(capsys, command, path, "--input", f"data={DATA}", *args)
    assert "invalid plan" in err and words in err, err


def test_the_compiled_plan_places_only_buffers_and_runs_like_the_reference(artifact):
    """The compiler's own contract, as the runtime now checks it, and its result."""
    from cvmc.frontend import load_graph
    from cvmc.reference import reference_run

    plan = json.loads(zipfile.ZipFile(artifact).read("plan.json"))
    assert set(plan["arena"]["offsets"]) == {b["name"] for b in plan["buffers"]}
    x = np.load(DATA)
    want = reference_run(load_graph(str(EXAMPLE)), {"data": x})["logits"]
    assert np.array_equal(cvmc_runtime.load(artifact).run({"data": x})["logits"], want)


# ---- item 2: the plan against the library's own signature ---------------------------------
def _swap_args(index, i, j):
    def edit(plan):
        args = plan["kernels"][index]["args"]
        args[i], args[j] = args[j], args[i]
    return edit


def _rename(old, new):
    """`old` renamed to `new` everywhere in the plan: a consistent plan, but not the
    library's."""
    def edit(plan):
        for key in ("inputs", "weights", "buffers", "outputs"):
            for spec in plan[key]:
                spec["name"] = new if spec["name"] == old else spec["name"]
        for kernel in plan["kernels"]:
            kernel["args"] = [new if a == old else a for a in kernel["args"]]
        offsets = plan["arena"]["offsets"]
        if old in offsets:
            offsets[new] = offsets.pop(old)
    return edit


@pytest.mark.parametrize("edit, words", [
    # w1_compensation and b1 are both int32 [8]: exit 0 with wrong logits before
    (_swap_args(0, 2, 3), "argument 2 is 'b1' in the plan but 'w1_compensation' in the lib"),
    (_rename("r1", "r9"), "argument 4 is 'r9' in the plan but 'r1' in the library"),
    (_rename("b2", "b9"), "argument 3 is 'b9' in the plan but 'b2' in the library"),
    (_kernel(4, num_inputs=0), "0 inputs in the plan but 1 in the library"),
    (_kernel(0, args=["data", "w1_packed", "b1", "r1"], num_inputs=3),
     "3 inputs in the plan but 4 in the library"),
    # a wider precision would let values in that void the overflow proof (the int8 input
    # is at its widest, 8: any other precision than the library's is refused)
    (lambda p: p["inputs"][0].update(precision=7), "precision 7 in the plan but "),
    (lambda p: p["weights"][0].update(precision=31), "precision 31 in the plan but "),
])
def test_plans_that_differ_from_their_library_are_refused(artifact, tmp_path, capsys, edit,
                                                          words):
    path = edited(artifact, tmp_path, edit)
    with pytest.raises(ModelError, match="the plan does not match its kernel library") as e:
        cvmc_runtime.load(path)
    assert words in str(e.value)
    assert words in one_error_line(capsys, "run", path, "--input", f"data={DATA}")


def _signature_of(plan: dict) -> dict:
    return {"target": plan["target"], "kernels": [
        {"symbol": k["symbol"], "num_inputs": k["num_inputs"],
         "args": [{"name": a, "shape": [4], "dtype": "int8", "precision": 8}
                  for a in k["args"]]}
        for k in plan["kernels"]]}


class _Library:
    """A stand-in module whose `cvmc_signature` returns `text`."""

    def __init__(self, text: str):
        self.text = text

    def __getitem__(self, name: str):
        assert name == "cvmc_signature"
        return lambda: self.text


def test_reordered_dropped_kernels_and_other_shapes_are_refused():
    """Two independent kernels swapped or one dropped (valid dataflows), a tensor declared
    with another shape than the library's."""
    from cvmc_runtime.library import check_library
    from cvmc_runtime.plan import validate_plan

    spec = {"shape": [4], "dtype": "int8", "precision": 8}
    plan = {"device": "cpu", "target": {"kind": "llvm", "mcpu": "x86-64", "features": []},
            "inputs": [{"name": "x", **spec}], "weights": [], "buffers": [],
            "outputs": [{"name": "y", **spec}, {"name": "z", **spec}],
            "kernels": [{"symbol": "ky", "args": ["x", "y"], "num_inputs": 1},
                        {"symbol": "kz", "args": ["x", "z"], "num_inputs": 1}]}
    library = _Library(json.dumps(_signature_of(plan)))
    check_library(plan, library)
    plan["kernels"].reverse()
    validate_plan(plan)
    with pytest.raises(ModelError, match="kernel 0 is 'kz' in the plan but 'ky'"):
        check_library(plan, library)
    plan["kernels"].reverse()
    dropped = {**plan, "kernels": plan["kernels"][:1], "outputs": plan["outputs"][:1]}
    validate_plan(dropped)
    with pytest.raises(ModelError, match="the plan calls 1 kernels, its library holds 2"):
        check_library(dropped, library)
    # a call repeated (a valid dataflow: identical kernels share a symbol, so only the
    # signature, which lists every call, can tell)
    repeated = {**plan, "kernels": [*plan["kernels"], plan["kernels"][1]]}
    validate_plan(repeated)
    with pytest.raises(ModelError, match="the plan calls 3 kernels, its library holds 2"):
        check_library(repeated, library)
    plan["outputs"][0]["shape"] = [2, 2]
    with pytest.raises(ModelError, match=r"'y' is dtype int8, shape \[2, 2\], precision 8 in "
                                         r"the plan but dtype 'int8', shape \[4\], precision 8"):
        check_library(plan, library)


@pytest.mark.parametrize("text, words", [
    ("not json", "not valid JSON"), ("[1]", "no kernel list"), ("7", "no kernel list")])
def test_damaged_signatures_are_refused(text, words):
    from cvmc_runtime.library import check_library

    with pytest.raises(ModelError, match=words):
        check_library({}, _Library(text))


def test_a_library_without_signature_is_refused(artifact, tmp_path):
    """A library built without the signature (as by an older cvmc): recompile."""
    from cvmc.codegen.build import build_llvm
    from cvmc.codegen.targets import backend
    from cvmc.frontend import load_graph
    from cvmc.lowering.lower import lower_graph
    from cvmc.passes.target import Target
    from tests.oputil import compile_passes

    target = Target.make()
    mod, _, _ = lower_graph(compile_passes(load_graph(str(EXAMPLE)), target=target), target)
    library = build_llvm(mod, target, backend(target).schedules).library
    with zipfile.ZipFile(artifact) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["kernels.so"] = library
    path = tmp_path / "old.cvmx"
    with zipfile.ZipFile(path, "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    with pytest.raises(ModelError, match="has no signature .* recompile the model"):
        cvmc_runtime.load(path)


def test_cuda_libraries_carry_the_signature_too(tmp_path):
    """A CUDA library loads without a GPU (nothing runs): its signature matches its plan,
    and a plan with two same-shaped arguments swapped does not."""
    import tvm_ffi
    from cvmc_runtime.library import check_library

    from cvmc.codegen.targets.cuda import find_nvcc

    try:
        find_nvcc()
    except Exception as e:  # noqa: BLE001
        pytest.skip(str(e))
    out = tmp_path / "gpu.cvmx"
    assert main(["compile", str(EXAMPLE), "--target", "cuda", "-o", str(out)]) == 0
    with zipfile.ZipFile(out) as z:
        (tmp_path / "kernels.so").write_bytes(z.read("kernels.so"))
        plan = json.loads(z.read("plan.json"))
    module = tvm_ffi.load_module(str(tmp_path / "kernels.so"))
    check_library(plan, module)
    assert json.loads(module["cvmc_signature"]())["target"] == {"kind": "cuda",
                                                               "arch": "sm_80"}
    _swap_args(0, 2, 3)(plan)
    with pytest.raises(ModelError, match="argument 2 is 'b1' in the plan but "
                                         "'w1_compensation' in the library"):
        check_library(plan, module)


# ---- item 4: CPU features ------------------------------------------------------------------
def _host_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text()
    return set(next(line for line in text.splitlines() if line.startswith("flags"))
               .split(":")[1].split())


def test_an_artifact_for_a_cpu_this_host_is_not_is_refused(tmp_path):
    """--mcpu alderlake needs AVX-VNNI (cpuinfo: avx_vnni), which this Zen host lacks: a
    warning at compile time, a ModelError (not SIGILL) at load."""
    if "avx_vnni" in _host_flags():
        pytest.skip("this host has AVX-VNNI")
    out = tmp_path / "alder.cvmx"
    proc = cvmc_process("compile", EXAMPLE, "-o", out, "--mcpu", "alderlake")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --mcpu alderlake is not this "
                                                   "machine's CPU") and "avxvnni" in lines[0]
    plan = json.loads(zipfile.ZipFile(out).read("plan.json"))
    assert "avxvnni" in plan["target"]["features"]
    run = cvmc_process("run", out, "--input", f"data={DATA}")
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert "built for alderlake: needs " in run.stderr and "avxvnni" in run.stderr
    assert "which this CPU lacks" in run.stderr
    # Its plan edited to claim only what this host has: the library still declares more.
    host = edited(out, tmp_path, _target(features=[]))
    with pytest.raises(ModelError, match="the plan does not match its kernel library: "
                                         "target .* in the plan but .*avxvnni.* in the library"):
        cvmc_runtime.load(host)


def test_a_host_build_records_only_what_the_host_has(tmp_path):
    from cvmc_runtime.cpu import CPUINFO_FLAGS

    proc = cvmc_process("compile", EXAMPLE, "-o", tmp_path / "host.cvmx")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # no warning
    plan = json.loads(zipfile.ZipFile(tmp_path / "host.cvmx").read("plan.json"))
    assert plan["target"]["features"] and all(CPUINFO_FLAGS[f] in _host_flags()
                                              for f in plan["target"]["features"])
    cvmc_runtime.load(tmp_path / "host.cvmx")
    old = edited(tmp_path / "host.cvmx", tmp_path, lambda p: p["target"].pop("features"))
    with pytest.raises(ModelError, match="compiled by an older cvmc: recompile the model"):
        cvmc_runtime.load(old)


def test_a_plan_claiming_other_features_is_refused(artifact, tmp_path):
    from cvmc_runtime.cpu import CPUINFO_FLAGS

    path = edited(artifact, tmp_path, lambda p: p["target"]["features"].append("fakefeature"))
    with pytest.raises(ModelError, match="needs CPU feature 'fakefeature', which this runtime "
                                         "cannot check"):
        cvmc_runtime.load(path)
    lacking = sorted(f for f, flag in CPUINFO_FLAGS.items() if flag not in _host_flags())
    path = edited(artifact, tmp_path, lambda p: p["target"]["features"].append(lacking[0]))
    with pytest.raises(ModelError, match=f"needs {lacking[0]}, which this CPU lacks"):
        cvmc_runtime.load(path)


def test_every_llvm_x86_feature_is_classified():
    """A feature LLVM may enable for some --mcpu is checked, known never to be emitted,
    or tuning; APX and AVX10 (no cpuinfo flag) make the compile fail."""
    import tvm
    from tvm.target import codegen

    from cvmc.codegen.cpu_features import classify, needed_features
    from cvmc.errors import CvmcError
    from cvmc.passes.target import Target, llvm_features

    cpus = [str(c) for c in codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm"}))]
    unknown = {f: cpu for cpu in cpus for f in llvm_features(cpu) if classify(f) == "unknown"}
    assert set(unknown) == {"avx10.1", "avx10.2", "egpr", "ndd", "ppx", "push2pop2", "ccmp",
                            "nf", "zu"}, unknown
    with pytest.raises(CvmcError, match="--mcpu diamondrapids: LLVM enables avx10.1"):
        needed_features(Target.make("llvm", "diamondrapids"))
    assert "avxvnni" in needed_features(Target.make("llvm", "alderlake"))
    assert "avx512vnni" in needed_features(Target.make("llvm", "znver4"))


# ---- item 6b: wrong argument types ---------------------------------------------------------
@pytest.mark.parametrize("value", [None, 3, b"m.cvmx", ["m.cvmx"], {"path": "m.cvmx"}])
def test_load_of_a_non_path_is_a_model_error(value):
    with pytest.raises(ModelError, match="load expects the path of a .cvmx file"):
        cvmc_runtime.load(value)


@pytest.mark.parametrize("call, words", [
    (lambda m, x: m.run({"data": x}, saturate="no"), "saturate must be True or False"),
    (lambda m, x: m.run({"data": x}, saturate=None), "saturate must be True or False"),
    (lambda m, x: m.profile({"data": x}, repeat=0), "repeat must be an integer >= 1"),
    (lambda m, x: m.profile({"data": x}, repeat="3"), "repeat must be an integer >= 1"),
    (lambda m, x: m.profile({"data": x}, warmup=-1), "warmup must be an integer >= 0"),
    (lambda m, x: m.profile({"data": x}, warmup=1.5), "warmup must be an integer >= 0"),
])
def test_model_methods_check_their_arguments(artifact, call, words):
    with pytest.raises(ModelError, match=words):
        call(cvmc_runtime.load(artifact), np.load(DATA))
