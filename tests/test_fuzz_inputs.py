"""Fuzzing every input surface: bad input raises CvmcError / ModelError, never a traceback,
a hang or a crash. Mutations start from real files (the NNEF corpus, the bundled example,
its export and its compiled artifact). The fast variants run in CI; `@pytest.mark.slow`
variants run many more examples. Below the fuzz properties, one plain regression test per
crash the fuzzing found."""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import cvmc_runtime
import numpy as np
import pytest
from cvmc_runtime import ModelError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.frontend.container import open_model
from cvmc.frontend.cvm_json import export_cvm, read_cvm_model
from cvmc.frontend.nnef import load_nnef, parse_nnef
from cvmc.frontend.quant import parse_quant
from cvmc.frontend.tensorfile import HEADER_SIZE, read_tensor_bytes, tensor_bytes
from cvmc.ir import Graph
from cvmc.ops.infer import retype
from tests.shared import HAVE_SHARED, SHARED

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "small_cnn"
CORPUS = SHARED / "data" / "nnef-corpus" / "valid"


def _documents(max_chars: int) -> list[str]:
    """The corpus documents (only the bundled example where ../shared is absent)."""
    corpus = sorted(CORPUS.iterdir()) if HAVE_SHARED else []
    files = [p / "graph.nnef" if p.is_dir() else p for p in corpus]
    texts = [p.read_text() for p in files + [EXAMPLE / "graph.nnef"]]
    return [t for t in texts if len(t) <= max_chars]


SMALL_DOCS = _documents(4000)
ALL_DOCS = _documents(10**6)
# Replacement tokens: extreme numbers, negatives, keywords, operators, odd identifiers.
TOKENS = ["0", "-1", "1", "2147483648", "99999999999999999999", "1e400", "1.5", "-0.0",
          "16777217", "[]", "[0]", "()", "'s'", "true", "x", "_", "graph", "fragment",
          "version", "extension", "external", "variable", "constant", "<integer>", "yield",
          "for", "in", "if", "else", "range_of", "length_of", "shape_of", "(", ")", "[", "]",
          "{", "}", ",", ";", ":", "=", "->", "^", "*", "+", "/", "..", "#", "\n", "\"",
          "é", "\0", "add_n", "cvm_clip", "conv2d", "precision", "shape", "label"]
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=2000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _mutate_text(text: str, data: st.DataObject, rounds: int = 3) -> str:
    """Apply a few random edits: delete, insert, replace a token, truncate, duplicate or
    swap lines."""
    for _ in range(data.draw(st.integers(1, rounds))):
        kind = data.draw(st.sampled_from(["delete", "insert", "token", "truncate", "dup",
                                          "swap", "number"]))
        n = len(text)
        i = data.draw(st.integers(0, max(n - 1, 0)))
        if kind == "delete":
            text = text[:i] + text[i + data.draw(st.integers(1, 8)):]
        elif kind == "insert":
            text = text[:i] + data.draw(st.sampled_from(TOKENS)) + text[i:]
        elif kind == "token":
            j = i + data.draw(st.integers(1, 12))
            text = text[:i] + data.draw(st.sampled_from(TOKENS)) + text[j:]
        elif kind == "truncate":
            text = text[:i]
        elif kind == "number":  # swap the next number for an extreme one
            k = next((k for k in range(i, n) if text[k].isdigit()), None)
            if k is not None:
                end = k
                while end < n and text[end].isdigit():
                    end += 1
                text = text[:k] + data.draw(st.sampled_from(TOKENS[:9])) + text[end:]
        else:
            lines = text.split("\n")
            a = data.draw(st.integers(0, len(lines) - 1))
            b = data.draw(st.integers(0, len(lines) - 1))
            if kind == "dup":
                lines.insert(b, lines[a])
            else:
                lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
    return text


def _parse_located(text: str) -> None:
    """The property: a Graph, or a CvmcError located in the document."""
    try:
        assert isinstance(parse_nnef(text, "f.nnef"), Graph)
    except CvmcError as e:
        # Every error of a document's text is located (parse_nnef gets no .dat/.quant data).
        assert str(e).startswith("f.nnef:"), str(e)


# ---- 1. NNEF text -------------------------------------------------------------------------
@FAST
@given(st.sampled_from(range(len(SMALL_DOCS))), st.data())
def test_nnef_mutations(doc, data):
    _parse_located(_mutate_text(SMALL_DOCS[doc], data))


@pytest.mark.slow
@SLOW
@given(st.sampled_from(range(len(ALL_DOCS))), st.data())
def test_nnef_mutations_exhaustive(doc, data):
    _parse_located(_mutate_text(ALL_DOCS[doc], data, rounds=8))


# Random compile-time expressions reach the evaluator, which text mutations rarely do.
LEAVES = st.sampled_from(["0", "1", "-1", "2", "63", "64", "1.5", "1e300", "'ab'", "[1]", "[]",
                          "true", "x", "range_of([1, 2])", "99999999999999999999", "1e400"])
OPS = ["+", "-", "*", "/", "^", "<", "==", "&&", "in"]
EXPRS = st.recursive(LEAVES, lambda e: st.one_of(
    st.tuples(e, st.sampled_from(OPS), e).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    st.lists(e, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
    st.tuples(st.sampled_from(["integer", "scalar", "length_of", "range_of", "-"]), e)
    .map(lambda t: f"{t[0]}({t[1]})"),
    st.tuples(e, e).map(lambda t: f"[for i in range_of({t[0]}) yield {t[1]}]"),
    st.tuples(e, e, e).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})")), max_leaves=10)
GRAPH = ("version 1.0;\nextension KHR_enable_operator_expressions;\n"
         "graph G( x ) -> ( y )\n{{\n    x = external<integer>(shape = [2], precision = 8);\n"
         "    {body}\n}}\n")


@FAST
@given(EXPRS, st.sampled_from(["n = {e}; y = x;", "y = add(x, {e});",
                               "y = cvm_clip(x, precision = {e});", "y = reshape(x, shape = {e});"]))
def test_nnef_expressions(expr, statement):
    _parse_located(GRAPH.format(body=statement.format(e=expr)))


@pytest.mark.slow
@SLOW
@given(EXPRS, st.sampled_from(["n = {e}; y = x;", "y = add(x, {e});"]))
def test_nnef_expressions_exhaustive(expr, statement):
    _parse_located(GRAPH.format(body=statement.format(e=expr)))


def _cli(argv: list[str]) -> tuple[int, str]:
    """Run the CLI in-process: (exit code, stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue() + err.getvalue()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_cli_check_mutations(data):
    text = _mutate_text((EXAMPLE / "graph.nnef").read_text(), data)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "m"
        shutil.copytree(EXAMPLE, model)
        (model / "graph.nnef").write_text(text)
        rc, out = _cli(["check", str(model)])
    assert rc in (0, 1) and "Traceback" not in out, out


# ---- 2. graph.quant -----------------------------------------------------------------------
QUANT = ('"data": cvm_precision_spec(precision = 8);\n'
         '"w1": linear_quantize(min = -1.5, max = 2, bits = 8, signed = true, '
         'axes = [0, (1, 2)], name = "q");  # comment\n')


@FAST
@given(st.data())
def test_quant_mutations(data):
    try:
        parse_quant(_mutate_text(QUANT, data), "g.quant")
    except CvmcError as e:
        assert str(e).startswith("g.quant:"), str(e)


# ---- 3. .dat tensor files -----------------------------------------------------------------
def _mutate_bytes(blob: bytes, data: st.DataObject, header_bias: bool = True) -> bytes:
    """Overwrite, delete or append bytes; truncate. Edits favour the header."""
    buf = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["set", "set", "delete", "append", "truncate"]))
        hi = min(len(buf), HEADER_SIZE) if header_bias and data.draw(st.booleans()) \
            else len(buf)
        i = data.draw(st.integers(0, max(hi - 1, 0)))
        if kind == "set" and buf:
            buf[i] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF,
                                                data.draw(st.integers(0, 255))]))
        elif kind == "delete":
            del buf[i:i + data.draw(st.integers(1, 16))]
        elif kind == "append":
            buf += bytes(data.draw(st.integers(1, 16)))
        elif kind == "truncate":
            del buf[i:]
    return bytes(buf)


DAT_ARRAYS = st.sampled_from(["int8", "uint8", "int16", "int32", "int64", "float32", "bool"]) \
    .flatmap(lambda dt: st.lists(st.integers(1, 4), max_size=3).map(
        lambda shape: np.arange(int(np.prod(shape)), dtype=np.int64).astype(dt).reshape(shape)))


def _check_dat(blob: bytes) -> None:
    try:
        arr = read_tensor_bytes(blob, "t.dat")
    except CvmcError as e:
        assert "t.dat" in str(e)
        return
    # Never more than the file holds: 1-bit bools unpack to 8 items per byte at most.
    assert arr.nbytes <= 8 * max(len(blob) - HEADER_SIZE, 0)


@FAST
@given(DAT_ARRAYS, st.data())
def test_dat_mutations(array, data):
    _check_dat(_mutate_bytes(tensor_bytes(array), data))


@pytest.mark.slow
@SLOW
@given(DAT_ARRAYS, st.data())
def test_dat_mutations_exhaustive(array, data):
    _check_dat(_mutate_bytes(tensor_bytes(array), data))


# ---- 4. tar containers --------------------------------------------------------------------
def _tar_bytes(mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for p in sorted(EXAMPLE.iterdir()):
            tar.add(p, arcname=f"m/{p.name}")
    return buf.getvalue()


TARS = {".tar": _tar_bytes("w"), ".tar.gz": _tar_bytes("w:gz")}


def _check_tar(blob: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"m{suffix}"
        path.write_bytes(blob)
        try:
            open_model(path)
            assert isinstance(load_nnef(path, None), Graph)
        except CvmcError:
            pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(TARS)), st.data())
def test_tar_mutations(suffix, data):
    _check_tar(_mutate_bytes(TARS[suffix], data, header_bias=False), suffix)


@settings(max_examples=20, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from(sorted(TARS)))
def test_tar_random_bytes(blob, suffix):
    _check_tar(blob, suffix)


# ---- 5. CVM-Runtime JSON + params ---------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[dict, bytes]:
    """(symbol.json document, params bytes) of the exported example."""
    out = tmp_path_factory.mktemp("cvm")
    export_cvm(load_nnef(EXAMPLE, None), out)
    return json.loads((out / "symbol.json").read_text()), (out / "params").read_bytes()


JSON_VALUES = st.sampled_from([None, True, 0, -1, 1, 2**31, 2**63, 10**30, 1.5, "", "x",
                               "(1, 1)", "{}", "[", [], [0], [-1, 0, 0], [[1]], {}, {"a": 1},
                               "null", "cvm_op", "conv2d", "dense", "cvm_clip"])


def _mutate_json(doc: object, data: st.DataObject) -> object:
    """Replace, delete or duplicate a randomly chosen node of a JSON tree (a deep copy)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(data.draw(st.integers(1, 3))):
        parent, key, node = None, None, doc
        while isinstance(node, (dict, list)) and node and data.draw(st.integers(0, 4)):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            parent, key = node, data.draw(st.sampled_from(keys))
            node = node[key]
        if parent is None:
            continue
        kind = data.draw(st.sampled_from(["replace", "replace", "delete", "dup"]))
        if kind == "replace":
            parent[key] = json.loads(json.dumps(data.draw(JSON_VALUES)))  # never share
        elif kind == "delete":
            del parent[key]
        elif isinstance(parent, list):
            parent.append(parent[key])
    return doc


def _check_cvm(symbol: bytes, params: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "symbol.json").write_bytes(symbol)
        (Path(tmp) / "params").write_bytes(params)
        try:
            graph = read_cvm_model(Path(tmp) / "symbol.json")
        except CvmcError:
            return
    retype(graph)  # an accepted graph is consistent


@FAST
@given(st.data())
def test_cvm_json_mutations(exported, data):
    doc, params = exported
    _check_cvm(json.dumps(_mutate_json(doc, data)).encode(), params)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_cvm_text_and_params_mutations(exported, data):
    doc, params = exported
    text = _mutate_text(json.dumps(doc), data).encode("utf-8", "surrogatepass")
    _check_cvm(text, _mutate_bytes(params, data, header_bias=False))


# ---- 6. .cvmx artifacts (in a subprocess: a segfault must fail the test, not pytest) ------
LOAD_AND_RUN = """
import sys
import numpy as np
import cvmc_runtime
for path in sys.argv[1:]:
    try:
        model = cvmc_runtime.load(path)
        model.run({s.name: np.zeros(s.shape, s.dtype) for s in model.inputs})
        print("ok", path)
    except cvmc_runtime.ModelError as e:
        print("error", path, str(e).replace(chr(10), " ")[:300])
"""


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """The example compiled once for llvm."""
    from cvmc.codegen import compile_model
    from tests.oputil import compile_passes
    path = tmp_path_factory.mktemp("cvmx") / "m.cvmx"
    compile_model(compile_passes(load_nnef(EXAMPLE, None)), path, "llvm")
    return path


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def _rezip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, blob in members.items():
            z.writestr(name, blob)


def _mutated_plan(plan: dict, rng: random.Random) -> dict:
    """A plan with one targeted edit: a wrong buffer in a kernel call, a changed shape or
    dtype, a missing or unknown symbol, a weight spec that no longer matches its array."""
    plan = json.loads(json.dumps(plan))
    kernel = rng.choice(plan["kernels"])
    tensors = [s for key in ("inputs", "weights", "buffers", "outputs") for s in plan[key]]
    spec = rng.choice(tensors)
    edit = rng.choice(["swap_arg", "drop_arg", "extra_arg", "unknown_arg", "shape", "dtype",
                       "symbol", "rank", "huge", "device", "weights_type"])
    if edit == "swap_arg":
        kernel["args"][rng.randrange(len(kernel["args"]))] = rng.choice(tensors)["name"]
    elif edit == "drop_arg":
        kernel["args"].pop()
    elif edit == "extra_arg":
        kernel["args"].append(rng.choice(tensors)["name"])
    elif edit == "unknown_arg":
        kernel["args"][0] = "nope"
    elif edit == "shape":
        spec["shape"][rng.randrange(len(spec["shape"]))] += rng.choice([-1, 1, 7])
    elif edit == "dtype":
        spec["dtype"] = "int32" if spec["dtype"] == "int8" else "int8"
    elif edit == "symbol":
        kernel["symbol"] = rng.choice(["cvmc_empty", "k9_nothing", "__TVMBackendParallelLaunch"])
    elif edit == "rank":
        spec["shape"] = spec["shape"][1:] if rng.random() < 0.5 else spec["shape"] + [1]
    elif edit == "huge":
        spec["shape"] = [1 << 24] * 3
    elif edit == "device":
        plan["device"] = rng.choice(["tpu", None, 3])
    else:
        plan["weights"] = rng.choice([None, {}, [1], [{"name": 1}]])
    return plan


def _mutated_artifacts(src: Path, out: Path, count: int, seed: int) -> list[Path]:
    """`count` damaged copies of `src`: plan edits (re-zipped, so the checksums are valid),
    raw byte edits, truncations, and damaged cvmx.json / weights members."""
    rng = random.Random(seed)
    members, raw = _members(src), src.read_bytes()
    paths = []
    for k in range(count):
        path = out / f"m{k}.cvmx"
        kind = ["plan", "plan", "plan", "bytes", "truncate", "member"][k % 6]
        if kind == "plan":
            changed = dict(members)
            changed["plan.json"] = json.dumps(
                _mutated_plan(json.loads(members["plan.json"]), rng)).encode()
            _rezip(path, changed)
        elif kind == "bytes":
            blob = bytearray(raw)
            for _ in range(rng.randint(1, 8)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
            path.write_bytes(bytes(blob))
        elif kind == "truncate":
            path.write_bytes(raw[:rng.randrange(len(raw))])
        else:
            changed = dict(members)
            name = rng.choice(["cvmx.json", "plan.json", "weights/0.npy", "weights/2.npy"])
            blob = bytearray(changed[name])
            i = rng.randrange(len(blob))
            blob[i:i + rng.randint(1, 4)] = bytes([rng.randrange(256)])
            changed[name] = bytes(blob)
            _rezip(path, changed)
        paths.append(path)
    return paths


def _check_artifacts(paths: list[Path]) -> None:
    """Load and run each in a child process: it must exit 0 with one line per artifact."""
    result = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, *map(str, paths)],
                            check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    lines = result.stdout.splitlines()
    assert len(lines) == len(paths), result.stdout + result.stderr[-2000:]
    assert all(line.split()[0] in ("ok", "error") for line in lines), result.stdout


def test_cvmx_mutations(artifact, tmp_path):
    _check_artifacts(_mutated_artifacts(artifact, tmp_path, 24, seed=1))


@pytest.mark.slow
def test_cvmx_mutations_exhaustive(artifact, tmp_path):
    _check_artifacts(_mutated_artifacts(artifact, tmp_path, 300, seed=2))


# ---- 7. runtime inputs --------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(artifact):
    return cvmc_runtime.load(artifact)


SHAPE = (1, 3, 16, 16)
DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float32", "float64", "bool", "object", "complex64", "U3"]
EXTREMES = [0, 1, -1, 127, -127, 128, -128, 255, 2**31 - 1, -2**31, 2**63 - 1, -2**63,
            2**64 - 1]


@st.composite
def feeds(draw) -> object:
    """A feed dict (sometimes not a dict) with arrays of odd dtypes, shapes and layouts."""
    shape = draw(st.sampled_from([SHAPE, (), (1, 3, 16), (1, 3, 16, 17), (2, 3, 16, 16)]))
    dtype = draw(st.sampled_from(DTYPES))
    values = draw(st.lists(st.sampled_from(EXTREMES), min_size=1, max_size=4))
    flat = np.resize(np.array(values, dtype=object), int(np.prod(shape, dtype=np.int64)))
    try:
        arr = flat.astype(dtype).reshape(shape)
    except (OverflowError, ValueError, TypeError):
        arr = flat.reshape(shape)
    layout = draw(st.sampled_from(["plain", "transposed", "strided", "list", "ragged"]))
    if layout == "transposed" and arr.ndim:
        arr = np.ascontiguousarray(arr.T).T  # same shape, Fortran order
    elif layout == "strided" and arr.ndim:
        arr = np.repeat(arr, 2, axis=-1)[..., ::2]  # same shape, non-contiguous view
    elif layout == "list":
        arr = arr.tolist()
    elif layout == "ragged":
        arr = [[1, 2], [3]]
    feed = {"data": arr}
    extra = draw(st.sampled_from([None, "x", 3, ("t",)]))
    if extra is not None:
        feed[extra] = arr
    return draw(st.sampled_from([feed, feed, [arr], None]))


@FAST
@given(feeds(), st.booleans())
def test_runtime_input_fuzz(model, feed, saturate):
    try:
        got = model.run(feed, saturate=saturate)
    except ModelError:
        return
    # Accepted: equal to running the same values given as int8 (clipped with saturate).
    x = np.asarray(feed["data"])
    want = model.run({"data": np.clip(x.astype(object), -127, 127).astype(np.int8)})
    assert np.array_equal(got["logits"], want["logits"])


# ---- regression tests: one per crash found --------------------------------------------------
HEADER = ("version 1.0;\nextension KHR_enable_fragment_definitions, "
          "KHR_enable_operator_expressions;\n")


def _doc(body: str, fragments: str = "") -> str:
    return (HEADER + fragments + "graph G( x ) -> ( y )\n{\n"
            "    x = external<integer>(shape = [2], precision = 8);\n" + body + "\n}\n")


REC = "fragment f( a: tensor<integer> ) -> ( b: tensor<integer> ) { b = f(a); }\n"
MUTUAL = ("fragment f( a: tensor<integer> ) -> ( b: tensor<integer> ) { b = g(a); }\n"
          "fragment g( a: tensor<integer> ) -> ( b: tensor<integer> ) { b = f(a); }\n")
COUNTDOWN = ("fragment f( a: tensor<integer>, n: integer ) -> ( b: tensor<integer> )\n"
             "{ b = f(a, n = n - 1) if n > 0 else a; }\n")
DEFAULT = ("fragment f( a: tensor<integer>, k: integer = 1 + 2 ) -> ( b: tensor<integer> )\n"
           "{ b = a; }\n")


@pytest.mark.parametrize("text, line, message", [
    # was: hang (a 30-million-digit integer), then ValueError converting it to a string
    (_doc("n = 2 ^ 99999999; y = x;"), 6, "'^' on 2 and 99999999: the result is outside"),
    (_doc("n = 2.0 ^ 10000; y = x;"), 6, "'^' cannot apply to 2.0 and 10000"),  # Overflow
    (_doc("n = [1] * 1000000000; y = x;"), 6, "more than 1048576 items"),  # MemoryError
    (_doc("n = 1000000000 * 'ab'; y = x;"), 6, "more than 1048576 items"),  # MemoryError
    (_doc("y = add(x, " + "9" * 5000 + ");"), 6, "outside the range of 64-bit"),  # ValueError
    (_doc("y = add(x, integer(1e400));"), 6, "number 1e400 is outside"),  # OverflowError
    (_doc("n = " + "[" * 500 + "1" + "]" * 500 + "; y = x;"), 6, "nested more than 64"),
    (_doc("y = add(x, " + "-" * 500 + "1);"), 6, "nested more than 64"),  # RecursionError
    (_doc("y = f(x);", REC), 3, "'f' is expanded more than 100 levels deep"),  # Recursion
    (_doc("y = f(x);", MUTUAL), 4, "'f' is expanded more than 100 levels deep"),
    (_doc("y = f(x, n = 100000);", COUNTDOWN), 4, "'f' is expanded more than 100 levels deep"),
    (_doc("y = f(x);", DEFAULT), 3, "default value of parameter 'k' must be a literal"),
    (_doc("n = (0 in 0); y = x;"), 6, "'in' cannot apply to 0 and 0"),  # was ValueError
    # was: a hang (10^12 iterations)
    (_doc("n = [for i in range_of([1] * 1000000) yield [for j in range_of([1] * 1000000) "
          "yield i]]; y = x;"), 6, "more than 1000000 steps"),
])
def test_nnef_regressions(text, line, message):
    with pytest.raises(CvmcError) as e:
        parse_nnef(text, "f.nnef")
    assert str(e.value).startswith(f"f.nnef:{line}:") and message in str(e.value), str(e.value)


def test_in_operator():
    """`a in b` evaluates (it used to fail unpacking the parse tree)."""
    text = _doc("y = cvm_clip(x, precision = 8 if 2 in [1, 2] else 4);")
    graph = parse_nnef(text, "f.nnef")
    assert graph.nodes[0].attrs["precision"] == 8


def test_recursion_with_base_case_still_works():
    """Bounded recursion is fine: stdlib add_n recurses once per tensor (90 here)."""
    text = _doc("y = add_n([" + ", ".join(["x"] * 90) + "]);")
    # add_n sums scalar tensors (on integers typing would refuse NNEF's add)
    graph = parse_nnef(text.replace("external<integer>(shape = [2], precision = 8)",
                                    "external(shape = [2])"), "f.nnef")
    assert sum(n.op == "add" for n in graph.nodes) == 90
    assert isinstance(parse_nnef(_doc("y = f(x, n = 50);", COUNTDOWN), "f.nnef"), Graph)


def test_error_messages_stay_short():
    """A huge compile-time value is cut in messages (was: a 4000-digit message)."""
    with pytest.raises(CvmcError) as e:
        parse_nnef(_doc("n = [for i in range_of([1] * 5000) yield i]; y = x;"), "f.nnef")
    assert len(str(e.value)) < 200 and "..." in str(e.value), str(e.value)


@pytest.mark.parametrize("text, message", [
    ('"a": f(x = ' + "[" * 3000 + "]" * 3000 + ");", "nested more than 64"),  # Recursion
    ('"a": f(x = ' + "9" * 5000 + ");", "more than 19 digits"),  # ValueError
])
def test_quant_regressions(text, message):
    with pytest.raises(CvmcError, match=message):
        parse_quant(text, "g.quant")


@pytest.mark.parametrize("value, saturated", [
    (np.uint64(2**64 - 1), 127),  # was accepted: wrapped to -1 by the cast to int64
    (np.int64(-2**63), -127),  # was accepted: |int64 min| overflows to a negative
    (np.uint64(2**63), 127),
])
def test_runtime_extreme_integers(model, value, saturated):
    x = np.zeros(SHAPE, dtype=type(value))
    x[0, 1, 2, 3] = value
    with pytest.raises(ModelError, match=rf"value {int(value)} at index \[0, 1, 2, 3\]"):
        model.run({"data": x})
    want = np.zeros(SHAPE, np.int8)
    want[0, 1, 2, 3] = saturated
    got = model.run({"data": x}, saturate=True)["logits"]
    assert np.array_equal(got, model.run({"data": want})["logits"])


@pytest.mark.parametrize("feed, message", [
    ({"data": [[1, 2], [3]]}, "input 'data': not an array"),  # was ValueError
    ([np.zeros(SHAPE, np.int8)], "inputs must be a mapping"),  # was TypeError
    ({1: 0, "a": 0, 2.5: 0}, "unknown input"),  # was TypeError sorting the names
])
def test_runtime_bad_feeds(model, feed, message):
    with pytest.raises(ModelError, match=message):
        model.run(feed)


def _with_plan(artifact: Path, tmp_path: Path, edit) -> Path:
    members = _members(artifact)
    plan = json.loads(members["plan.json"])
    edit(plan)
    members["plan.json"] = json.dumps(plan).encode()
    path = tmp_path / "edited.cvmx"
    _rezip(path, members)
    return path


def _set(obj: dict, key: str, value: object) -> None:
    obj[key] = value


@pytest.mark.parametrize("edit, message", [
    (lambda p: _set(p["kernels"][1], "args", ["r1", "zz"]), "argument 'zz' is not a declared"),
    (lambda p: _set(p["buffers"][0], "shape", [-1]), "shape must be a list of integers"),
    (lambda p: _set(next(w for w in p["weights"] if w["dtype"] == "int8"), "dtype", "int32"),
     "stored array is int8"),
    (lambda p: _set(p, "weights", [7]), "weights[0]: expected an object"),  # was TypeError
    (lambda p: _set(p["outputs"][0], "shape", [1 << 24] * 4), "more than 1073741824"),
    (lambda p: _set(p, "device", "tpu"), "device must be one of cpu, cuda"),
])
def test_plan_validated_on_load(artifact, tmp_path, edit, message):
    with pytest.raises(ModelError, match=re.escape(message)):
        cvmc_runtime.load(_with_plan(artifact, tmp_path, edit))


def test_plan_kernel_argument_mismatch_is_model_error(artifact, tmp_path):
    """A declared buffer of the wrong size for a kernel: refused at load, by the library's
    signature, before any native code touches memory (was a bare ValueError at run)."""
    # The last kernel reads the pool's output (written earlier, of another shape).
    path = _with_plan(artifact, tmp_path, lambda p: _set(
        p["kernels"][-1], "args", ["p1", *p["kernels"][-1]["args"][p["kernels"][-1]
                                                                    ["num_inputs"]:]]))
    with pytest.raises(ModelError, match="the plan does not match its kernel library: kernel "
                                         "'k[0-9]+_[a-z_0-9]+': argument 0 is 'p1'"):
        cvmc_runtime.load(path)


def test_deeply_nested_json(exported, tmp_path):
    """Deep JSON nesting is a CvmcError / ModelError (was RecursionError)."""
    doc, params = exported
    deep = "[" * 100_000 + "]" * 100_000
    doc = json.loads(json.dumps(doc))
    doc["attrs"]["op_attrs"][1][-1] = deep
    for text in (deep, json.dumps(doc)):
        with pytest.raises(CvmcError, match="not valid JSON|not a JSON object string"):
            _check_cvm_strict(text.encode(), params)


def _check_cvm_strict(symbol: bytes, params: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "symbol.json").write_bytes(symbol)
        (Path(tmp) / "params").write_bytes(params)
        read_cvm_model(Path(tmp) / "symbol.json")


def test_cvm_weight_precision_not_an_integer(exported):
    """A weight's declared precision that is not an integer (was TypeError)."""
    doc, params = exported
    doc = json.loads(json.dumps(doc))
    doc["attrs"]["precision"][1][1] = None  # node 1 is the weight w1
    with pytest.raises(CvmcError, match="weight 'w1' must declare a precision in 1..32"):
        _check_cvm_strict(json.dumps(doc).encode(), params)


def test_damaged_gzip_stream(tmp_path):
    """Single-byte damage all through a .tar.gz is a CvmcError or loads (some positions
    gave zlib.error: 'invalid distance too far back')."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(EXAMPLE.iterdir()):
            info = tarfile.TarInfo(p.name)
            info.size = p.stat().st_size
            tar.addfile(info, io.BytesIO(p.read_bytes()))
    blob = gzip.compress(buf.getvalue(), mtime=0)
    path = tmp_path / "m.tar.gz"
    for i in range(10, len(blob) - 8, 9):
        damaged = bytearray(blob)
        damaged[i] ^= 0x5A
        path.write_bytes(bytes(damaged))
        with contextlib.suppress(CvmcError):
            open_model(path)
