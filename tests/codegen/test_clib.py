"""The C library (`cvmc compile --emit c-library`, cvmc/codegen/clib.py; issue 32 items 2,
3 and 5): the example main.c built with gcc against libNAME.a and libNAME.so gives the
reference interpreter's bits (integer models) and the Python runtime's bits (float models);
the library needs libc, libm and pthreads only; bad calls return error codes with messages
under AddressSanitizer and UndefinedBehaviorSanitizer; one handle runs from several threads
in turn; a CPU without a feature the kernels need is refused by cpuid as the Python runtime
refuses it by /proc/cpuinfo; the native runtime's ABI version is checked at load."""
from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import CPUINFO_FLAGS, NATIVE_ABI, NATIVE_FOLDER, ModelError, host_flags

import cvmc
from cvmc.cli import main
from cvmc.codegen import compile_model
from cvmc.codegen.clib import CPUID, POOL_SYMBOLS, write_c_library
from cvmc.frontend.nnef import parse_nnef
from cvmc.ops import lookup
from cvmc.passes.target import Target
from tests.codegen.op_cases import CASES
from tests.lowering.test_blocked_activations import benchmark_network
from tests.nnefutil import random_inputs, with_random_weights
from tests.oputil import one_op_graph, ulp_distance
from tests.runtime.test_float_path import GRAPH as FLOAT_GRAPH

EXAMPLE = Path(__file__).parents[2] / "examples" / "small_cnn"
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g")

FLOAT_CONV = """version 1.0;
graph C( x ) -> ( y )
{
    x = external<scalar>(shape = [1, 8, 20, 20]);
    w = variable<scalar>(shape = [32, 8, 3, 3], label = 'w');
    b = variable<scalar>(shape = [1, 32], label = 'b');
    c = conv(x, w, b, padding = [(1, 1), (1, 1)]);
    s = sigmoid(c);
    v = variable<scalar>(shape = [16, 32, 1, 1], label = 'v');
    d = conv(s, v);
    r = relu(d);
    y = max_pool(r, size = [1, 1, 2, 2], stride = [1, 1, 2, 2]);
}
"""


def _input_files(folder: Path, inputs, feeds) -> tuple[list[Path], Path]:
    """(each input written raw beside `folder`, as main.c reads them; the folder for main.c's
    outputs)."""
    paths = []
    for index, spec in enumerate(inputs):
        paths.append(folder.parent / f"{folder.name}-input{index}.bin")
        np.ascontiguousarray(feeds[spec.name], spec.dtype).tofile(paths[-1])
    out = folder.parent / f"{folder.name}-out"
    out.mkdir(exist_ok=True)
    return paths, out


def _gcc(*args: str | Path) -> None:
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", *map(str, args), "-lm",
                    "-pthread"], check=True, capture_output=True, timeout=300)


def _header_name(folder: Path) -> str:
    return next(folder.glob("lib*.a")).name[3:-2]


def _run_example(folder: Path, feeds: dict[str, np.ndarray], specs, shared: bool = False,
                 cflags: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Build main.c against the library of `folder` (static, or the .so), run it on
    `feeds` (raw files in the order of `specs`, the Python runtime's TensorSpecs of inputs
    and outputs) and read its outputs back."""
    name = _header_name(folder)
    exe = folder.parent / f"{folder.name}-main"
    if shared:
        _gcc(*cflags, folder / "main.c", f"-L{folder}", f"-l{name}", f"-Wl,-rpath,{folder}",
             "-o", exe)
    else:
        _gcc(*cflags, folder / "main.c", folder / f"lib{name}.a", "-o", exe)
    inputs, outputs = specs
    paths, out = _input_files(folder, inputs, feeds)
    done = subprocess.run([str(exe), *map(str, paths), str(out)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return {s.name: np.fromfile(out / f"{s.name}.bin", s.dtype).reshape(s.shape)
            for s in outputs}


def _specs(artifact: Path):
    model = cvmc_runtime.load(artifact)
    return model, (model.inputs, model.outputs)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) if a.dtype == np.float32 else a


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example CNN as a C library (by the command line) and as an artifact."""
    d = tmp_path_factory.mktemp("example")
    assert main(["compile", str(EXAMPLE), "--emit", "c-library", "-o",
                 str(d / "small_cnn")]) == 0
    assert main(["compile", str(EXAMPLE), "-o", str(d / "small_cnn.cvmx")]) == 0
    return d


def test_the_example_gives_the_reference_bits(example):
    feeds = {"data": np.load(EXAMPLE / "data.npy")}
    want = cvmc.reference_run(cvmc.load_graph(EXAMPLE), feeds)
    model, specs = _specs(example / "small_cnn.cvmx")
    for shared in (False, True):
        got = _run_example(example / "small_cnn", feeds, specs, shared)
        assert np.array_equal(got["logits"], want["logits"])
        assert np.array_equal(got["logits"], model.run(feeds)["logits"])


def test_the_library_needs_libc_libm_and_pthreads_only(example):
    folder = example / "small_cnn"
    dynamic = subprocess.run(["readelf", "-d", str(folder / "libsmall_cnn.so")],
                             capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\).*\[(.+)\]", dynamic))
    # glibc's dynamic loader provides __tls_get_addr (the pool's thread-local state)
    assert needed <= {"libc.so.6", "libm.so.6", "libpthread.so.0", "ld-linux-x86-64.so.2"}, \
        needed
    # global symbols: the API and the pool's (weak) functions; nothing else is exported
    symbols = subprocess.run(["nm", "-g", "--defined-only", str(folder / "libsmall_cnn.a")],
                             capture_output=True, text=True, check=True).stdout.split("\n")
    names = {line.split()[-1] for line in symbols if len(line.split()) == 3}
    assert {n for n in names if not n.startswith(("small_cnn_", "cvmc_"))} == set()
    assert {"small_cnn_create", "small_cnn_run", "small_cnn_destroy"} <= names
    header = (folder / "small_cnn.h").read_text()
    assert "int small_cnn_run(small_cnn_model* model" in header
    assert "'data' int8 precision 8 [1, 3, 16, 16]" in header


def _float_library(tmp: Path, text: str, name: str, cflags: tuple[str, ...] = ()):
    graph = with_random_weights(parse_nnef(text, f"{name}.nnef"))
    result = compile_model(graph, tmp / f"{name}.cvmx", "llvm")
    write_c_library(result.plan, result.built.objects, result.weights, tmp / name, cflags)
    return graph, tmp / name


@pytest.mark.parametrize("text", [FLOAT_GRAPH, FLOAT_CONV], ids=["select_bool", "conv"])
def test_float_models_give_the_python_runtimes_bits(tmp_path, text):
    """(Under the sanitizers too: float and bool inputs, several outputs.)"""
    graph, folder = _float_library(tmp_path, text, "f", SANITIZE)
    feeds = random_inputs(graph)
    model, specs = _specs(tmp_path / "f.cvmx")
    want = model.run(feeds)
    got = _run_example(folder, feeds, specs, cflags=SANITIZE)
    for spec in specs[1]:
        assert got[spec.name].dtype == want[spec.name].dtype
        assert np.array_equal(_bits(got[spec.name]), _bits(want[spec.name])), spec.name


@pytest.mark.parametrize("net, shape", [("conv_bn_net", (1, 1, 12, 12)),
                                        ("branchy_net", (1, 2, 8, 8))])
def test_quantized_models_give_the_reference_bits_and_their_scales(tmp_path, net, shape):
    """The quantizer's test models (tests/quantize/onnx_nets.py) quantized by `cvmc
    quantize`, as C libraries for this CPU and, under qemu, for AArch64."""
    pytest.importorskip("nnef_tools", reason="needs the convert extra")
    onnx = pytest.importorskip("onnx")
    from tests.quantize import onnx_nets

    onnx.save(getattr(onnx_nets, net)(), tmp_path / "net.onnx")
    samples = np.random.default_rng(3).standard_normal((8, *shape)).astype(np.float32)
    np.save(tmp_path / "x.npy", samples)
    assert main(["quantize", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "q"),
                 "--calib", f"x={tmp_path / 'x.npy'}"]) == 0
    assert main(["compile", str(tmp_path / "q"), "--emit", "c-library", "-o",
                 str(tmp_path / "qnet")]) == 0
    assert main(["compile", str(tmp_path / "q"), "-o", str(tmp_path / "q.cvmx")]) == 0
    model, specs = _specs(tmp_path / "q.cvmx")
    (x,), (y,) = specs
    feeds = {"x": cvmc_runtime.quantize("x", samples[0], x.scale, x.precision)}
    want = cvmc.reference_run(cvmc.load_graph(tmp_path / "q"), feeds)
    got = _run_example(tmp_path / "qnet", feeds, specs)
    assert np.array_equal(got[y.name], want[y.name])
    assert np.array_equal(got[y.name], model.run(feeds)[y.name])
    header = (tmp_path / "qnet" / "qnet.h").read_text()
    assert f"scale {x.scale!r}" in header and f"scale {y.scale!r}" in header
    if _has_aarch64_tools():
        assert main(["compile", str(tmp_path / "q"), "--emit", "c-library", "--mtriple",
                     AARCH64, "--mcpu", "cortex-a76", "-o", str(tmp_path / "qarm")]) == 0
        got = _run_under_qemu(tmp_path / "qarm", feeds, specs)
        assert not isinstance(got, str), got
        assert np.array_equal(got[y.name], want[y.name])


BAD_CALLS_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "NAME.h"

#define EXPECT(call, code) do { \
    int r_ = (call); \
    if (r_ != (code) || (r_ && !NAME_last_error()[0])) { \
      printf("line %d: %s gave %d, expected %d (%s)\n", __LINE__, #call, r_, code, \
             NAME_last_error()); \
      return 1; \
    } \
  } while (0)

static NAME_model* shared;
static const void* in[1];
static size_t in_bytes[1], out_bytes[1];
static unsigned char* want;

static void* runs(void* arg) {
  unsigned char* out = malloc(out_bytes[0]);
  void* outs[1] = {out};
  intptr_t bad = 0;
  for (int i = 0; i < 20 && !bad; i++)
    bad = NAME_run(shared, in, in_bytes, outs, out_bytes) || memcmp(out, want, out_bytes[0]);
  free(out);
  (void)arg;
  return (void*)bad;
}

int main(int argc, char** argv) {
  const NAME_tensor_info *info, *oinfo;
  (void)argc;
  EXPECT(NAME_input_info(0, NULL), UP_ERR_NULL);
  EXPECT(NAME_input_info(-1, &info), UP_ERR_INDEX);
  EXPECT(NAME_input_info(UP_NUM_INPUTS, &info), UP_ERR_INDEX);
  EXPECT(NAME_output_info(UP_NUM_OUTPUTS, &info), UP_ERR_INDEX);
  EXPECT(NAME_create(NULL), UP_ERR_NULL);
  EXPECT(NAME_set_num_threads(-1), UP_ERR_ARGUMENT);
  EXPECT(NAME_create(&shared), UP_OK);
  EXPECT(NAME_input_info(0, &info), UP_OK);
  EXPECT(NAME_output_info(0, &oinfo), UP_OK);
  FILE* f = fopen(argv[1], "rb");
  void* data = malloc(info->bytes);
  if (!f || fread(data, 1, info->bytes, f) != info->bytes) return 2;
  fclose(f);
  in[0] = data;
  in_bytes[0] = info->bytes;
  out_bytes[0] = oinfo->bytes;
  want = malloc(oinfo->bytes);
  void* outs[1] = {want};
  const void* null_in[1] = {NULL};
  void* null_out[1] = {NULL};
  size_t short_in[1] = {info->bytes - 1}, long_out[1] = {oinfo->bytes + 1};
  EXPECT(NAME_run(NULL, in, in_bytes, outs, out_bytes), UP_ERR_NULL);
  EXPECT(NAME_run(shared, NULL, in_bytes, outs, out_bytes), UP_ERR_NULL);
  EXPECT(NAME_run(shared, in, NULL, outs, out_bytes), UP_ERR_NULL);
  EXPECT(NAME_run(shared, in, in_bytes, NULL, out_bytes), UP_ERR_NULL);
  EXPECT(NAME_run(shared, in, in_bytes, outs, NULL), UP_ERR_NULL);
  EXPECT(NAME_run(shared, null_in, in_bytes, outs, out_bytes), UP_ERR_NULL);
  EXPECT(NAME_run(shared, in, in_bytes, null_out, out_bytes), UP_ERR_NULL);
  EXPECT(NAME_run(shared, in, short_in, outs, out_bytes), UP_ERR_SIZE);
  EXPECT(NAME_run(shared, in, in_bytes, outs, long_out), UP_ERR_SIZE);
  /* -128 is outside precision 8 */
  signed char* low = malloc(info->bytes);
  memcpy(low, data, info->bytes);
  low[info->bytes / 2] = -128;
  const void* low_in[1] = {low};
  EXPECT(NAME_run(shared, low_in, in_bytes, outs, out_bytes), UP_ERR_INPUT_RANGE);
  if (!strstr(NAME_last_error(), "value -128 at index")) return 3;
  if (!NAME_strerror(-1)[0] || !NAME_strerror(1000)[0]) return 4;
  EXPECT(NAME_run(shared, in, in_bytes, outs, out_bytes), UP_OK);
  /* one handle from several threads at once: each run waits for the one before */
  EXPECT(NAME_set_num_threads(2), UP_OK);
  pthread_t threads[4];
  for (int t = 0; t < 4; t++) pthread_create(&threads[t], NULL, runs, NULL);
  for (int t = 0; t < 4; t++) {
    void* bad;
    pthread_join(threads[t], &bad);
    if (bad) return 5;
  }
  NAME_destroy(NULL);
  NAME_destroy(shared);
  free(data);
  free(low);
  free(want);
  printf("ok\n");
  return 0;
}
"""


@pytest.mark.parametrize("sanitize", [SANITIZE, ("-fsanitize=thread", "-g")],
                         ids=["address_undefined", "thread"])
def test_bad_calls_return_errors_under_sanitizers(tmp_path, sanitize):
    """The example built with -fsanitize=address,undefined, and with -fsanitize=thread (the
    native runtime, the plan code and the callers; the kernels are LLVM's): bad calls
    return their error codes with messages, four threads share one handle, and main.c
    gives the reference bits; any sanitizer report fails."""
    graph = cvmc.load_graph(EXAMPLE)
    result = compile_model(graph, tmp_path / "s.cvmx", "llvm")
    folder = tmp_path / "small_cnn"
    write_c_library(result.plan, result.built.objects, result.weights, folder, sanitize)
    (tmp_path / "bad.c").write_text(BAD_CALLS_C.replace("NAME", "small_cnn")
                                    .replace("UP_", "SMALL_CNN_"))
    _gcc(*sanitize, f"-I{folder}", tmp_path / "bad.c", folder / "libsmall_cnn.a", "-o",
         tmp_path / "bad")
    feeds = {"data": np.load(EXAMPLE / "data.npy")}
    feeds["data"].tofile(tmp_path / "data.bin")
    env = {"ASAN_OPTIONS": "detect_leaks=1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(tmp_path / "bad"), str(tmp_path / "data.bin")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stdout + done.stderr
    _, specs = _specs(tmp_path / "s.cvmx")
    got = _run_example(folder, feeds, specs, cflags=sanitize)
    assert np.array_equal(got["logits"], cvmc.reference_run(graph, feeds)["logits"])


def test_a_cpu_without_the_kernels_features_is_refused_as_by_cpuinfo(tmp_path):
    """A library whose plan claims every feature cpuid can check: create fails naming
    exactly the features /proc/cpuinfo lacks (the Python runtime's check)."""
    flags = host_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo")
    assert set(CPUID) == set(CPUINFO_FLAGS)
    graph = cvmc.load_graph(EXAMPLE)
    result = compile_model(graph, None, "llvm")
    plan = {**result.plan, "target": {**result.plan["target"], "features": list(CPUID)}}
    folder = tmp_path / "all"
    write_c_library(plan, result.built.objects, result.weights, folder)
    (tmp_path / "create.c").write_text(
        '#include <stdio.h>\n#include "all.h"\nint main(void) {\n  all_model* m;\n'
        '  int r = all_create(&m);\n  printf("%d %s\\n", r, all_last_error());\n'
        '  return 0;\n}\n')
    _gcc(f"-I{folder}", tmp_path / "create.c", folder / "liball.a", "-o", tmp_path / "c")
    out = subprocess.run([str(tmp_path / "c")], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    lacking = [f for f in CPUID if CPUINFO_FLAGS[f] not in flags]
    if not lacking:
        assert out.startswith("0 ")
        return
    assert out.startswith("5 built for "), out
    listed = re.search(r"needs (.*), which this CPU lacks", out).group(1).split(", ")
    assert listed == lacking


def test_the_runtime_checks_the_native_abi(example, tmp_path):
    header = (NATIVE_FOLDER / "cvmc_pool.h").read_text()
    assert f"#define CVMC_ABI_VERSION {NATIVE_ABI}\n" in header
    with zipfile.ZipFile(example / "small_cnn.cvmx") as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    assert json.loads(members["cvmx.json"])["abi"] == NATIVE_ABI
    # an artifact carries kernels only: the pool is the process's (cvmc_runtime.pool)
    (tmp_path / "kernels.so").write_bytes(members["kernels.so"])
    defined = subprocess.run(["nm", "--defined-only", str(tmp_path / "kernels.so")],
                             capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in defined.splitlines() if line.strip()}
    assert not names & set(POOL_SYMBOLS) and "__TVMBackendParallelLaunch" in names
    members["cvmx.json"] = json.dumps({"format": "cvmx", "version": 1,
                                       "abi": NATIVE_ABI + 1}).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    (tmp_path / "other.cvmx").write_bytes(buf.getvalue())
    with pytest.raises(ModelError, match=f"native runtime ABI {NATIVE_ABI + 1}, this "
                                         f"runtime has ABI {NATIVE_ABI}; recompile"):
        cvmc_runtime.load(tmp_path / "other.cvmx")


@pytest.mark.parametrize("args, message", [
    (["--target", "cuda"], "only --target llvm builds a C library"),
    (["--emit", "tir"], "does not combine with --emit tir"),
])
def test_cli_refusals(tmp_path, capsys, args, message):
    code = main(["compile", str(EXAMPLE), "--emit", "c-library", "-o", str(tmp_path / "c"),
                 *args])
    assert code == 1 and message in capsys.readouterr().err


def test_a_relative_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["compile", str(EXAMPLE), "--emit", "c-library", "-o", "rel"]) == 0
    assert sorted(p.name for p in Path("rel").iterdir()) == \
        ["librel.a", "librel.so", "main.c", "rel.h"]
    assert [p.name for p in tmp_path.iterdir()] == ["rel"]  # no temporary folder left


def test_a_library_is_replaced_but_a_folder_with_other_files_is_kept(example, capsys):
    folder = example / "small_cnn"
    before = {p.name: p.stat().st_ino for p in folder.iterdir()}
    assert main(["compile", str(EXAMPLE), "--emit", "c-library", "-o", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(before)
    assert all(p.stat().st_ino != before[p.name] for p in folder.iterdir())
    (folder / "notes.txt").write_text("mine")
    code = main(["compile", str(EXAMPLE), "--emit", "c-library", "-o", str(folder)])
    assert code == 1 and "holds 'notes.txt', which is not part of a C library" in \
        capsys.readouterr().err
    assert (folder / "notes.txt").read_text() == "mine"
    (folder / "notes.txt").unlink()


TWO_C = r"""
#include <stdio.h>
#include <string.h>
#include "a.h"
#include "b.h"

int main(int argc, char** argv) {
  static signed char data[768];
  int32_t want[10], got_a[10], got_b[10];
  FILE* f = fopen(argv[1], "rb");
  FILE* g = fopen(argv[2], "rb");
  if (argc != 3 || !f || !g || fread(data, 1, sizeof(data), f) != sizeof(data) ||
      fread(want, 1, sizeof(want), g) != sizeof(want))
    return 2;
  const void* in[1] = {data};
  size_t in_bytes[1] = {sizeof(data)}, out_bytes[1] = {sizeof(want)};
  void* out_a[1] = {got_a};
  void* out_b[1] = {got_b};
  a_model* ma;
  b_model* mb;
  if (a_create(&ma) || b_create(&mb) || a_set_num_threads(2) ||
      b_run(mb, in, in_bytes, out_b, out_bytes) || a_run(ma, in, in_bytes, out_a, out_bytes))
    return 3;
  a_destroy(ma);
  b_destroy(mb);
  puts(memcmp(got_a, want, sizeof(want)) || memcmp(got_b, want, sizeof(want)) ? "differ" : "ok");
  return 0;
}
"""


def test_two_libraries_with_the_same_kernel_names_link_into_one_program(tmp_path):
    """Two C libraries of one model (the same kernel symbols) in one program: everything
    but the API is local to each library, so both link and each calls its own kernels;
    the pool's functions are weak, so the program has one pool."""
    graph = cvmc.load_graph(EXAMPLE)
    result = compile_model(graph, None, "llvm")
    for name in ("a", "b"):
        write_c_library(result.plan, result.built.objects, result.weights, tmp_path / name)
    feeds = {"data": np.load(EXAMPLE / "data.npy")}
    feeds["data"].tofile(tmp_path / "data.bin")
    cvmc.reference_run(graph, feeds)["logits"].astype(np.int32).tofile(tmp_path / "want.bin")
    (tmp_path / "two.c").write_text(TWO_C)
    _gcc(f"-I{tmp_path / 'a'}", f"-I{tmp_path / 'b'}", tmp_path / "two.c",
         tmp_path / "a" / "liba.a", tmp_path / "b" / "libb.a", "-o", tmp_path / "two")
    done = subprocess.run([str(tmp_path / "two"), str(tmp_path / "data.bin"),
                           str(tmp_path / "want.bin")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stdout + done.stderr
    symbols = subprocess.run(["nm", str(tmp_path / "two")], capture_output=True, text=True,
                             check=True).stdout
    assert symbols.count(" cvmc_parallel_launch\n") == 1


AARCH64 = "aarch64-linux-gnu"


def _has_aarch64_tools() -> bool:
    return all(shutil.which(t) for t in (f"{AARCH64}-gcc", "qemu-aarch64"))


def _aarch64_tools() -> None:
    if not _has_aarch64_tools():
        pytest.skip(f"needs {AARCH64}-gcc and qemu-aarch64 (apt-get install "
                    f"gcc-aarch64-linux-gnu qemu-user)")


def _run_under_qemu(folder: Path, feeds: dict[str, np.ndarray], specs,
                    qemu: tuple[str, ...] = ()) -> dict | str:
    """main.c of the AArch64 library in `folder`, linked statically, run by qemu-aarch64
    (with the options `qemu`): its outputs, or its stderr when it fails."""
    name = _header_name(folder)
    exe = folder.parent / f"{folder.name}-main"
    subprocess.run([f"{AARCH64}-gcc", "-O2", "-static", str(folder / "main.c"),
                    str(folder / f"lib{name}.a"), "-lm", "-pthread", "-o", str(exe)],
                   check=True, capture_output=True, timeout=300)
    inputs, outputs = specs
    paths, out = _input_files(folder, inputs, feeds)
    done = subprocess.run(["qemu-aarch64", *qemu, str(exe), "-t", "2", *map(str, paths),
                           str(out)], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        return done.stderr
    return {s.name: np.fromfile(out / f"{s.name}.bin", s.dtype).reshape(s.shape)
            for s in outputs}


@pytest.mark.parametrize("mcpu", ["generic", "cortex-a76", "neoverse-n2"])
def test_aarch64_under_qemu_gives_the_reference_bits(tmp_path, mcpu):
    """The example cross-compiled for AArch64 (generic: NEON; cortex-a76: its convs by
    `sdot`, dotprod; neoverse-n2: by `usdot`, i8mm) and run by qemu-aarch64 at 2 threads:
    the reference interpreter's bits."""
    _aarch64_tools()
    folder = tmp_path / "arm"
    assert main(["compile", str(EXAMPLE), "--emit", "c-library", "--mtriple", AARCH64,
                 "--mcpu", mcpu, "-o", str(folder)]) == 0
    feeds = {"data": np.load(EXAMPLE / "data.npy")}
    want = cvmc.reference_run(cvmc.load_graph(EXAMPLE), feeds)
    specs = ([cvmc_runtime.TensorSpec("data", (1, 3, 16, 16), "int8", 8)],
             [cvmc_runtime.TensorSpec("logits", (1, 10), "int32", 27)])
    got = _run_under_qemu(folder, feeds, specs)
    assert not isinstance(got, str), got
    assert np.array_equal(got["logits"], want["logits"])
    if mcpu == "cortex-a76":  # a Cortex-A53 has no dotprod: HWCAP says so, create refuses
        refused = _run_under_qemu(folder, feeds, specs, ("-cpu", "cortex-a53"))
        assert "built for cortex-a76: needs dotprod, fullfp16, rdm, which this CPU lacks" \
            in refused, refused


def test_an_artifact_for_another_triple_is_refused(tmp_path, capsys):
    code = main(["compile", str(EXAMPLE), "--mtriple", AARCH64, "-o", str(tmp_path / "a.cvmx")])
    assert code == 1 and "build a C library (--emit c-library)" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_benchmark_networks_give_the_reference_bits_on_x86_and_aarch64(tmp_path, name):
    """Both benchmark networks (at 32x32) as C libraries for this CPU and, under
    qemu-aarch64, for a Neoverse N2 (every conv by `usdot`) and a Cortex-A76 (by `sdot`):
    the reference interpreter's bits."""
    graph = benchmark_network(name, tmp_path)
    rng = np.random.default_rng(32)
    (x,) = graph.inputs
    feeds = {x: rng.integers(-127, 128, graph.types[x].shape).astype(np.int8)}
    want = cvmc.reference_run(graph, feeds)
    targets = [Target.make("llvm")]
    if _has_aarch64_tools():
        targets += [Target.make("llvm", cpu, mtriple=AARCH64)
                    for cpu in ("neoverse-n2", "cortex-a76")]
    rows = {"neoverse-n2": "aarch64-i8mm", "cortex-a76": "aarch64-dotprod"}
    for target in targets:
        result = compile_model(graph, None, target)
        if target.mtriple:
            assert {k["schedule"] for k in result.plan["kernels"]
                    if k["ops"][0].startswith("conv2d")} == {rows[target.mcpu]}
        specs = tuple([cvmc_runtime.TensorSpec.from_json(s) for s in result.plan[key]]
                      for key in ("inputs", "outputs"))
        folder = tmp_path / f"lib_{target.mcpu}".replace("-", "_")
        write_c_library(result.plan, result.built.objects, result.weights, folder)
        run = _run_under_qemu if target.mtriple else _run_example
        got = run(folder, feeds, specs)
        assert not isinstance(got, str), got
        for output, value in want.items():
            assert np.array_equal(got[output], value), (target, output)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=lambda i: f"{i:03d}-{CASES[i].op}")
@pytest.mark.parametrize("cpu", ["host", "cortex-a76"])
def test_every_op_case_gives_the_python_runtimes_bits(tmp_path, index, cpu):
    """Each op case (tests/codegen/op_cases.py) as a C library for this CPU, run by main.c,
    and for an AArch64 Cortex-A76, run under qemu: the bits of the Python runtime here
    (which the op tests compare with the reference). On AArch64 two things the hardware
    and libm decide, not cvmc, are let through for floats: a NaN's encoding (x86 makes the
    quiet NaN 0xffc00000, AArch64 0x7fc00000) and a libm function's last bit (glibc's
    asinf and tanf give 1 ULP apart on the two), within the op's own bound (its entry's
    `ulp`; 0 for the exact ops, which must match)."""
    cross = cpu != "host"
    if cross:
        _aarch64_tools()
    case = CASES[index]
    graph = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
    cvmc.compile(graph, tmp_path / "case.cvmx", target="llvm")
    model, specs = _specs(tmp_path / "case.cvmx")
    feeds = {s.name: case.inputs[int(s.name[1:])][0].astype(s.dtype) for s in model.inputs}
    want = model.run(feeds)
    target = Target.make("llvm", cpu, mtriple=AARCH64) if cross else Target.make("llvm")
    result = compile_model(graph, None, target)
    write_c_library(result.plan, result.built.objects, result.weights, tmp_path / "lib")
    got = (_run_under_qemu if cross else _run_example)(tmp_path / "lib", feeds, specs)
    assert not isinstance(got, str), got
    for name, value in want.items():
        if value.dtype != np.float32 or not cross:
            assert got[name].tobytes() == value.tobytes(), name
        else:
            ulps = ulp_distance(got[name], value)
            assert np.all(ulps <= (lookup(case.op).ulp or 0)), (name, int(ulps.max()))


def test_a_missing_cross_toolchain_is_one_error(tmp_path, monkeypatch):
    result = compile_model(cvmc.load_graph(EXAMPLE), None,
                           Target.make("llvm", mtriple=AARCH64))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(cvmc.CvmcError, match="aarch64-linux-gnu-gcc is not installed"):
        write_c_library(result.plan, result.built.objects, result.weights, tmp_path / "lib")
    assert not (tmp_path / "lib").exists() and list(tmp_path.iterdir()) == []


GUARD_C = r"""
/* Linked into the program before libc: every aligned_alloc (the handle's arena, inputs and
   outputs; the pool's workspace arenas) gets pages of its own with a PROT_NONE page on
   each side, the block starting right after the first (CVMC_GUARD=after) or ending right
   before the last (CVMC_GUARD=before; only the < 64-byte gap that 64-byte alignment
   leaves is then readable), so a kernel that reads outside a buffer faults. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void __libc_free(void* p);

static struct { char* data; char* base; size_t length; } blocks[4096];
static int count;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;  /* the pool's threads allocate */

void* aligned_alloc(size_t alignment, size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t span = (size + alignment - 1) / alignment * alignment;
  size_t pages = (span + page - 1) / page;
  char* base = mmap(NULL, (pages + 2) * page, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) abort();
  mprotect(base, page, PROT_NONE);
  mprotect(base + (pages + 1) * page, page, PROT_NONE);
  const char* where = getenv("CVMC_GUARD");
  char* data = where && !strcmp(where, "after") ? base + page
                                                 : base + (pages + 1) * page - span;
  pthread_mutex_lock(&lock);
  if (count == 4096) abort();
  blocks[count].data = data;
  blocks[count].base = base;
  blocks[count++].length = (pages + 2) * page;
  pthread_mutex_unlock(&lock);
  return data;
}

void free(void* p) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < count; i++)
    if (blocks[i].data == p) {
      char* base = blocks[i].base;
      size_t length = blocks[i].length;
      blocks[i] = blocks[--count];
      pthread_mutex_unlock(&lock);
      munmap(base, length);
      return;
    }
  pthread_mutex_unlock(&lock);
  __libc_free(p);
}
"""


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "mobilenet_v1"])
def test_kernels_read_nothing_outside_their_buffers(tmp_path, name):
    """main.c linked with GUARD_C: the example and both benchmark networks (32x32) run at
    2 threads with every buffer the library allocates next to a guard page, before and
    after, and give the reference bits (a read outside a buffer would kill the program)."""
    graph = cvmc.load_graph(EXAMPLE) if name == "small_cnn" else \
        benchmark_network(name, tmp_path)
    (x,) = graph.inputs
    feeds = {x: np.random.default_rng(7).integers(-127, 128, graph.types[x].shape)
             .astype(np.int8)}
    feeds[x].tofile(tmp_path / "x.bin")
    want = cvmc.reference_run(graph, feeds)
    result = compile_model(graph, None, "llvm")
    folder = tmp_path / "lib"
    write_c_library(result.plan, result.built.objects, result.weights, folder)
    (tmp_path / "guard.c").write_text(GUARD_C)
    _gcc(folder / "main.c", tmp_path / "guard.c", folder / "liblib.a", "-o", tmp_path / "main")
    for where in ("after", "before"):
        out = tmp_path / where
        out.mkdir()
        done = subprocess.run([str(tmp_path / "main"), "-t", "2", str(tmp_path / "x.bin"),
                               str(out)], env={"CVMC_GUARD": where}, capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode == 0, (where, done.returncode, done.stderr)
        for spec in result.plan["outputs"]:
            got = np.fromfile(out / f"{spec['name']}.bin", spec["dtype"]).reshape(spec["shape"])
            assert np.array_equal(got, want[spec["name"]]), (where, spec["name"])


def test_any_tensor_name_reaches_c_safely(tmp_path):
    """Names are any text in CVM JSON: quotes, comment ends, trigraphs, a '/' and UTF-8
    become octal escapes in C strings and harmless text in comments; main.c writes an
    output whose name is no file name by its index."""
    from cvmc.quantize.rewrite import rename

    graph = rename(cvmc.load_graph(EXAMPLE), {"logits": 'a/"b*/c??/\\é', "data": "d??/e"})
    result = compile_model(graph, None, "llvm")
    write_c_library(result.plan, result.built.objects, result.weights, tmp_path / "odd")
    feeds = {"d??/e": np.load(EXAMPLE / "data.npy")}
    specs = tuple([cvmc_runtime.TensorSpec.from_json(s) for s in result.plan[key]]
                  for key in ("inputs", "outputs"))
    specs[1][0] = dataclasses.replace(specs[1][0], name="output0")
    got = _run_example(tmp_path / "odd", feeds, specs)
    want = cvmc.reference_run(graph, feeds)
    assert np.array_equal(got["output0"], want['a/"b*/c??/\\é'])


CONV_CASES = [i for i, case in enumerate(CASES)
              if case.op in ("conv2d", "dense", "conv2d_packed")]


@pytest.mark.parametrize("index", CONV_CASES, ids=lambda i: f"{i:03d}-{CASES[i].op}")
@pytest.mark.parametrize("mcpu", ["neoverse-n2", "cortex-a76"])
def test_conv_and_dense_cases_by_usdot_and_sdot_under_qemu(tmp_path, index, mcpu):
    """The conv and dense op cases for a Neoverse N2 (the `aarch64-i8mm` row where the
    conv is packed) and a Cortex-A76 (`aarch64-dotprod`) under qemu: the reference
    interpreter's bits."""
    _aarch64_tools()
    case = CASES[index]
    graph = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
    result = compile_model(graph, None, Target.make("llvm", mcpu, mtriple=AARCH64))
    write_c_library(result.plan, result.built.objects, result.weights, tmp_path / "arm")
    specs = tuple([cvmc_runtime.TensorSpec.from_json(s) for s in result.plan[key]]
                  for key in ("inputs", "outputs"))
    feeds = {s.name: case.inputs[int(s.name[1:])][0].astype(s.dtype) for s in specs[0]}
    got = _run_under_qemu(tmp_path / "arm", feeds, specs)
    assert not isinstance(got, str), got
    for name, value in cvmc.reference_run(graph, feeds).items():
        assert np.array_equal(got[name], value), name
