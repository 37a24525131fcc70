"""CVM-Runtime graph JSON: hand-built models, every corrupt case, export round trip, CLI."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from cvmc.cli import main
from cvmc.errors import CvmcError
from cvmc.frontend import load_graph
from cvmc.frontend.cvm_json import (
    CVM_RUNTIME_SEEDS,
    export_cvm,
    format_attr_value,
    parse_attr_value,
)
from cvmc.frontend.cvm_params import params_bytes, read_params
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import all_ops, lookup
from cvmc.ops.infer import retype
from cvmc.reference import reference_run
from tests.codegen.op_cases import X_SHAPE, exports, weight
from tests.frontend.test_cvm_params import pack_array, pack_params


def _null(name: str) -> dict:
    return {"op": "null", "name": name, "inputs": []}


def _op(name: str, func: str, inputs: list[list[int]]) -> dict:
    return {"op": "cvm_op", "name": name, "inputs": inputs,
            "attrs": {"func_name": func, "num_inputs": str(len(inputs)), "num_outputs": "1",
                      "flatten_data": "0"}}


def _doc(nodes: list, shapes: list, precisions: list, op_attrs: list, heads: list,
         version: str = "cvm_1.1.0") -> dict:
    n = len(shapes)
    return {"version": version, "nodes": nodes,
            "arg_nodes": [i for i, nd in enumerate(nodes) if nd["op"] == "null"],
            "node_row_ptr": list(range(n + 1)), "heads": heads,
            "attrs": {"dltype": ["list_str", ["int32"] * n],
                      "storage_id": ["list_int", list(range(n))],
                      "shape": ["list_shape", shapes], "precision": ["list_int", precisions],
                      "op_attrs": ["list_str", op_attrs]}}


# conv2d(data, w, b) -> cvm_right_shift(shift_bit 1) -> cvm_clip(precision 4).
# conv2d sums: [[7, 9], [13, 15]]; + bias 3; right shift floor((X + 1) / 2); clip to +-7.
CONV_EXPECTED = [[[[5, 6], [7, 7]]]]
CONV_DATA = np.arange(1, 10, dtype=np.int32).reshape(1, 1, 3, 3)
# precisions: data 8, w 3, b 3, conv 8 + 3 + bitlen(4) = 14, with bias 15, shift 8, clip 4.
CONV_PRECISIONS = [8, 3, 3, 15, 8, 4]


def _conv_doc() -> dict:
    nodes = [_null("data"), _null("w"), _null("b"),
             _op("conv", "conv2d", [[0, 0, 0], [1, 0, 0], [2, 0, 0]]),
             _op("shift", "cvm_right_shift", [[3, 0, 0]]), _op("clip", "cvm_clip", [[4, 0]])]
    conv_attrs = {"channels": "1", "kernel_size": "(2, 2)", "strides": "(1, 1)",
                  "padding": "(0, 0)", "dilation": "(1, 1)", "groups": "1", "use_bias": "True",
                  "layout": "NCHW", "kernel_layout": "OIHW", "out_dtype": "same",
                  "out_layout": ""}
    op_attrs = ["{}", "{}", "{}", json.dumps(conv_attrs),
                '{"precision": "8", "shift_bit": "1"}', '{"precision": "4"}']
    shapes = [[1, 1, 3, 3], [1, 1, 2, 2], [1], [1, 1, 2, 2], [1, 1, 2, 2], [1, 1, 2, 2]]
    return _doc(nodes, shapes, list(CONV_PRECISIONS), op_attrs, [[5, 0, 0]], "cvm_1.0.0")


def _conv_params() -> bytes:
    return pack_params({"w": pack_array((1, 1, 2, 2), [1, 0, -1, 2], bits=8),
                        "b": pack_array((1,), [3])})


# dense: x = [1, -2, 3], W = [[1, 1, 1], [2, 0, -1]], b = [0, 5] -> [2, -1] + b = [2, 4].
def _dense_doc() -> dict:
    nodes = [_null("data"), _null("w"), _null("b"),
             _op("fc", "dense", [[0, 0, 0], [1, 0, 0], [2, 0, 0]])]
    op_attrs = ["{}", "{}", "{}", '{"units": "2", "use_bias": "True"}']
    # precisions: w 3 (|2| <= 3), b 4 (|5| <= 7), dense max(8 + 3 + bitlen(3), 4) + 1 = 14.
    return _doc(nodes, [[1, 3], [2, 3], [2], [1, 2]], [8, 3, -1, 14], op_attrs, [[3, 0, 0]])


def _dense_params() -> bytes:
    return pack_params({"w": pack_array((2, 3), [1, 1, 1, 2, 0, -1]),
                        "b": pack_array((2,), [0, 5])})


def _write(tmp_path: Path, doc: dict, params: bytes, stem: str = "m") -> Path:
    (tmp_path / f"{stem}.json").write_text(json.dumps(doc))
    (tmp_path / f"{stem}.params").write_bytes(params)
    return tmp_path / f"{stem}.json"


def test_hand_built_conv_model(tmp_path: Path) -> None:
    g = load_graph(_write(tmp_path, _conv_doc(), _conv_params()))
    assert [n.op for n in g.nodes] == ["conv2d", "cvm_right_shift", "cvm_clip"]
    assert g.inputs == ["data"] and set(g.constants) == {"w", "b"}
    assert g.nodes[0].attrs["stride"] == (1, 1) and g.nodes[0].attrs["use_bias"] is True
    assert [g.types[v].precision for v in ["data", "w", "b", "conv", "shift", "clip"]] == \
        CONV_PRECISIONS
    out = reference_run(g, {"data": CONV_DATA})["clip"]
    assert np.array_equal(out, CONV_EXPECTED)


def test_hand_built_dense_model(tmp_path: Path) -> None:
    g = load_graph(_write(tmp_path, _dense_doc(), _dense_params()))
    assert g.types["b"].precision == 4 and g.types["fc"].precision == 14
    out = reference_run(g, {"data": np.array([[1, -2, 3]], np.int32)})["fc"]
    assert np.array_equal(out, [[2, 4]])


def test_cli_check_run_and_export(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _write(tmp_path, _conv_doc(), b"")
    (tmp_path / "w.params").write_bytes(_conv_params())
    (tmp_path / "m.params").unlink()
    args = [str(path), "--params", str(tmp_path / "w.params")]
    assert main(["check", *args]) == 0
    assert "conv2d" in capsys.readouterr().out
    np.save(tmp_path / "x.npy", CONV_DATA)
    out_dir = tmp_path / "out"
    assert main(["run", "--reference", *args, "--input", f"data={tmp_path / 'x.npy'}",
                 "--output-dir", str(out_dir)]) == 0
    assert np.array_equal(np.load(out_dir / "clip.npy"), CONV_EXPECTED)
    assert main(["export", *args, "-o", str(tmp_path / "exp")]) == 0
    again = load_graph(tmp_path / "exp" / "symbol.json")  # params found beside it
    assert np.array_equal(reference_run(again, {"data": CONV_DATA})["clip"], CONV_EXPECTED)
    assert main(["check", str(tmp_path / "exp" / "symbol.json"), "--params",
                 str(tmp_path / "nope")]) == 1
    assert "cannot read" in capsys.readouterr().err


def _mutate(doc: dict, path: str, value) -> dict:
    """A copy of doc with the item at 'a/b/0' replaced (value None deletes it)."""
    doc = copy.deepcopy(doc)
    *parents, last = [int(k) if k.isdigit() else k for k in path.split("/")]
    obj = doc
    for k in parents:
        obj = obj[k]
    if value is None:
        del obj[last]
    else:
        obj[last] = value
    return doc


@pytest.mark.parametrize("path,value,words", [
    ("nodes", None, "missing key 'nodes'"),
    ("attrs/shape", None, "attrs: missing key 'shape'"),
    ("attrs/op_attrs", None, "missing key 'op_attrs'"),
    ("heads", "x", "'heads' must be a JSON list"),
    ("nodes/3/name", None, "node 3: missing key 'name'"),
    ("version", "cvm_2.0.0", "unsupported version 'cvm_2.0.0'"),
    ("nodes/4/inputs/0", [5, 0, 0], "does not come before it"),
    ("nodes/4/inputs/0", [9, 0, 0], "node id 9 is out of range"),
    ("nodes/4/inputs/0", [3, 1, 0], "output index 1 of node 3 is out of range"),
    ("nodes/4/attrs/func_name", "cvm_rigth_shift", "unknown op 'cvm_rigth_shift'; did you mean"),
    ("attrs/shape/1", [[1]] * 5, "attrs: 'shape' has 5 entries, expected 6"),
    ("attrs/shape/1/4", [1, 1, 2, 3], "output 0 has shape [1, 1, 2, 2] but the JSON declares"),
    ("attrs/precision/1/3", 16, "'conv': output 0 has precision 15 but the JSON declares 16"),
    ("attrs/precision/1/0", -1, "input 'data' must declare a precision"),
    ("attrs/precision/1/1", 2, "weight 'w': value 2 at index [0, 0, 1, 1] does not fit precision 2"),
    ("attrs/op_attrs/1/4", '{"precision": "8"}', "missing required attribute 'shift_bit"),
    ("attrs/op_attrs/1/4", '{"precision": "8", "shift": "1"}', "unknown attribute 'shift'"),
    ("attrs/op_attrs/1/4", "[1]", "op_attrs must encode a JSON object"),
    ("nodes/4/attrs/num_inputs", "2", "num_inputs is 2 but it lists 1 inputs"),
    ("arg_nodes", [0, 1], "arg_nodes [0, 1] must list the null nodes [0, 1, 2]"),
    ("attrs/shape/1/1", [1, 1, 2, 3], "weight 'w' has shape [1, 1, 2, 2], the graph declares"),
    ("attrs/shape/1/0", [], "shape #0 must be 1 to 6 positive integers"),
    ("nodes/2/name", "w", "name 'w' is used twice"),
])
def test_corrupt_graph_json(tmp_path: Path, path: str, value, words: str) -> None:
    model = _write(tmp_path, _mutate(_conv_doc(), path, value), _conv_params())
    with pytest.raises(CvmcError) as e:
        load_graph(model)
    assert words in str(e.value) and ("m.json" in str(e.value) or "m.params" in str(e.value))


def test_unused_params_array_and_bad_json(tmp_path: Path) -> None:
    params = pack_params({"w": pack_array((1, 1, 2, 2), [1, 0, -1, 2]), "b": pack_array((1,), [3]),
                          "extra": pack_array((1,), [0])})
    with pytest.raises(CvmcError, match="array 'extra' matches no null node"):
        load_graph(_write(tmp_path, _conv_doc(), params))
    (tmp_path / "bad.json").write_text('{"nodes": [')
    with pytest.raises(CvmcError, match="not valid JSON"):
        load_graph(tmp_path / "bad.json")


def test_missing_params_makes_weights_inputs_without_precision(tmp_path: Path) -> None:
    doc = _mutate(_conv_doc(), "attrs/precision/1/1", -1)
    path = _write(tmp_path, doc, _conv_params())
    (tmp_path / "m.params").unlink()
    with pytest.raises(CvmcError, match="input 'w' must declare a precision"):
        load_graph(path)


@pytest.mark.parametrize("name", ["m.params", "params"])
def test_params_found_beside_the_json_stay_in_its_folder(tmp_path: Path, name: str) -> None:
    # a params file found by name is the folder's, as a weight file is: a link to
    # outside is refused (the user's own --params may point anywhere)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "real.params").write_bytes(_conv_params())
    (tmp_path / "model").mkdir()
    path = _write(tmp_path / "model", _conv_doc(), b"")
    (tmp_path / "model" / "m.params").unlink()
    (tmp_path / "model" / name).symlink_to(tmp_path / "elsewhere" / "real.params")
    with pytest.raises(CvmcError, match="params file .* resolves outside the model folder"):
        load_graph(path)
    assert load_graph(path, params=tmp_path / "elsewhere" / "real.params").constants


@pytest.mark.parametrize("text,kind,value", [
    ("(1, 1)", "ints", [1, 1]), ("[1,2]", "ints", [1, 2]), ("(3,)", "ints", [3]),
    ("()", "ints", []), ("True", "bool", True), ("false", "bool", False), ("0", "bool", False),
    ("None", "int?", None), ("-7", "int", -7), ("NCHW", "str", "NCHW"), ("None", "str", "None"),
])
def test_attribute_strings(text: str, kind: str, value) -> None:
    assert parse_attr_value(text, kind) == value


def test_attribute_formatting() -> None:
    assert [format_attr_value(v) for v in [(1, 2), (3,), (), True, -4, "NCHW"]] == \
        ["(1, 2)", "(3,)", "()", "True", "-4", "NCHW"]


# ---- round trip over every CVM op ---------------------------------------------------------
RNG = np.random.default_rng(7)


def _all_ops_graph() -> Graph:
    """One node per CVM-Runtime op (each a graph output), from the ops' test records."""
    types = {"x": TensorType(X_SHAPE, "int32", 8)}
    nodes, consts = [], {}
    for name, (operands, attrs) in exports().items():
        d = lookup(name)
        ins = []
        for k, operand in enumerate(operands):
            if isinstance(operand, np.ndarray):
                consts[f"{name}_w{k}"] = operand
                types[f"{name}_w{k}"] = TensorType(operand.shape, "int32")
                operand = f"{name}_w{k}"
            ins.append(operand)
        a = d.normalize_attrs(attrs)
        outs = (name,) + tuple(f"{name}_out{k}" for k in range(1, len(d.outputs)))
        for out, shape in zip(outs, d.infer_shapes([types[i] for i in ins], a)):
            types[out] = TensorType(shape, "int32")
        nodes.append(Node(d.name, tuple(ins), outs, dict(a)))
    outputs = [o for n in nodes for o in n.outputs]
    return retype(Graph("all_ops", ["x"], outputs, nodes, types, consts))


def test_round_trip_every_cvm_op(tmp_path: Path) -> None:
    graph = _all_ops_graph()
    with pytest.warns(UserWarning, match="refuses outputs of different row counts"):
        paths = export_cvm(graph, tmp_path / "out")
    assert [p.name for p in paths] == ["symbol.json", "params"]
    doc = json.loads(paths[0].read_text())
    assert doc["version"] == "cvm_1.1.0" and doc["nodes"][0]["name"] == "data"
    funcs = {n["name"]: n["attrs"]["func_name"] for n in doc["nodes"] if n["op"] != "null"}
    assert funcs["slice"] == "strided_slice" and funcs["get_valid_count"] == "get_valid_counts"
    op_attrs = doc["attrs"]["op_attrs"][1]
    # CVM-Runtime's parsers read "None" for no attribute but take's optional axis
    assert not [a for a in op_attrs if "None" in json.loads(a).values()]
    keys = {n["name"]: set(json.loads(a)) for n, a in zip(doc["nodes"], op_attrs)}
    assert {"axis"} <= keys["sum"] and {"stride"} <= keys["slice"] and "strides" in keys["conv2d"]
    assert "shape" in keys["reshape"] and "axis" in keys["squeeze"]
    back = load_graph(paths[0], params=paths[1])
    expected = graph
    assert back.inputs == ["data"] and back.outputs == expected.outputs
    for a, b in zip(back.nodes, expected.nodes, strict=True):
        # export fills in what CVM-Runtime requires (cvm_lut's in_dim: the table's size)
        assert (a.op, a.inputs, a.outputs) == (b.op, tuple("data" if i == "x" else i
                                                           for i in b.inputs), b.outputs)
        assert {k: v for k, v in b.attrs.items() if v is not None}.items() <= a.attrs.items()
    assert back.nodes[[n.op for n in back.nodes].index("cvm_lut")].attrs["in_dim"] == 256
    assert {k: v for k, v in back.types.items() if k != "data"} == \
        {k: v for k, v in expected.types.items() if k != "x"}
    assert back.constants.keys() == expected.constants.keys()
    assert all(np.array_equal(back.constants[k], v) for k, v in expected.constants.items())
    x = RNG.integers(-127, 128, X_SHAPE).astype(np.int8)
    want, got = reference_run(expected, {"x": x}), reference_run(back, {"data": x})
    assert all(np.array_equal(want[o], got[o]) for o in expected.outputs)


def test_round_trip_covers_every_cvm_runtime_op() -> None:
    missing = [d.name for d in all_ops()
               if CVM_RUNTIME_SEEDS & set(d.seeds) and d.name not in exports()]
    assert not missing, f"give these ops' records in tests/codegen/op_cases.py an export: " \
                        f"{missing}"


def test_every_unset_attribute_is_derived_or_optional_in_cvm_runtime() -> None:
    """Export writes no "None": an attribute that may be unset (None) is derived from the
    inputs, or is one CVM-Runtime's parser also leaves unset (take's axis)."""
    unset = [(d.name, at.name) for d in all_ops() if CVM_RUNTIME_SEEDS & set(d.seeds)
             for at in d.attrs if at.default is None or at.kind == "int?"]
    derived = {(d.name, at.name) for d in all_ops() for at in d.attrs if at.cvm_derive}
    assert [u for u in unset if u not in derived] == [("take", "axis")]


def test_export_spellings_and_derived_attrs(tmp_path: Path) -> None:
    w = weight((3, 2, 3, 3))
    a = lookup("conv2d").normalize_attrs({})
    types = {"in": TensorType(X_SHAPE, "int32", 8), "w": TensorType(w.shape, "int32"),
             "c": TensorType((1, 3, 2, 2), "int32")}
    g = Graph("g", ["in"], ["c"], [Node("conv2d", ("in", "w"), ("c",), a)], types, {"w": w})
    doc = json.loads(export_cvm(retype(g), tmp_path)[0].read_text())
    attrs = json.loads(doc["attrs"]["op_attrs"][1][2])
    assert attrs["strides"] == "(1, 1)" and attrs["channels"] == "3"
    assert attrs["kernel_size"] == "(3, 3)" and attrs["use_bias"] == "False"
    assert doc["nodes"][0]["name"] == "data" and doc["attrs"]["precision"][1][0] == 8


def test_export_writes_expand_dims_of_no_axis_as_a_reshape(tmp_path: Path) -> None:
    """num_newaxis 0 (the spec allows it; CVM-Runtime's parser wants >= 1)."""
    a = lookup("expand_dims").normalize_attrs({"axis": 1, "num_newaxis": 0})
    types = {"x": TensorType((2, 3), "int32", 8), "y": TensorType((2, 3), "int32")}
    g = retype(Graph("g", ["x"], ["y"], [Node("expand_dims", ("x",), ("y",), a)], types))
    doc = json.loads(export_cvm(g, tmp_path)[0].read_text())
    assert doc["nodes"][1]["attrs"]["func_name"] == "reshape"
    assert json.loads(doc["attrs"]["op_attrs"][1][1]) == {"shape": "(2, 3)"}
    back = load_graph(tmp_path / "symbol.json")
    x = np.arange(6).reshape(2, 3)
    assert np.array_equal(reference_run(back, {"data": x})["y"], x)


def test_export_warns_of_outputs_cvm_runtime_cannot_return_together(tmp_path: Path) -> None:
    t = TensorType((1, 4, 6), "int32", 8)
    types = {"x": t, "n": TensorType((1,), "int32"), "y": TensorType((1, 4, 6), "int32")}
    g = retype(Graph("g", ["x"], ["n", "y"],
                     [Node("get_valid_count", ("x",), ("n", "y"), {"score_threshold": 0})],
                     types))
    with pytest.warns(UserWarning, match="refuses outputs of different row counts.*n: 1, y: 4"):
        export_cvm(g, tmp_path)


def test_export_rejects_what_cvm_runtime_cannot_run(tmp_path: Path) -> None:
    t = TensorType((2,), "int32", 8)
    two = Graph("g", ["a", "b"], ["c"], [Node("elemwise_add", ("a", "b"), ("c",), {})],
                {"a": t, "b": t, "c": TensorType((2,), "int32")})
    with pytest.raises(CvmcError, match="exactly one input"):
        export_cvm(two, tmp_path)
    float_ops = [d for d in all_ops() if not d.integer_op]
    if float_ops:
        d = float_ops[0]
        g = Graph("g", ["a"], ["c"], [Node(d.name, ("a",), ("c",), {})],
                  {"a": t, "c": t})
        with pytest.raises(CvmcError, match=f"{d.name} 'c'.*cannot export"):
            export_cvm(g, tmp_path)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "small_cnn"


def test_example_model_round_trips_and_compiles_from_cvm_files(tmp_path, capsys):
    """Export the bundled example, import it back, then compile and run the imported model:
    same ops, attributes, weights, precisions, and the same bits as the original."""
    original = retype(load_graph(EXAMPLE))
    out = tmp_path / "cvm"
    assert main(["export", str(EXAMPLE), "--format", "cvm", "-o", str(out)]) == 0
    imported = load_graph(out / "symbol.json", params=out / "params")
    assert [n.op for n in imported.nodes] == [n.op for n in original.nodes]
    for a, b in zip(imported.nodes, original.nodes):
        # export fills in CVM-Runtime's derived conv2d/dense attributes (channels, units ...)
        assert {k: v for k, v in b.attrs.items() if v is not None}.items() <= a.attrs.items()
    assert imported.constants.keys() == original.constants.keys()
    for name, value in original.constants.items():
        assert np.array_equal(imported.constants[name], value), name
    assert {k: t.precision for k, t in imported.types.items()} == \
        {k: t.precision for k, t in original.types.items()}
    x = np.load(EXAMPLE / "data.npy")
    want = reference_run(original, {"data": x})["logits"]
    (got,) = reference_run(imported, {"data": x}).values()
    assert np.array_equal(got, want)
    artifact = tmp_path / "m.cvmx"
    assert main(["compile", str(out / "symbol.json"), "--params", str(out / "params"),
                 "-o", str(artifact)]) == 0
    assert main(["run", str(artifact), "--input", f"data={EXAMPLE / 'data.npy'}",
                 "--output-dir", str(tmp_path / "res")]) == 0
    (result,) = (tmp_path / "res").glob("*.npy")
    assert np.array_equal(np.load(result), want)


# ---- CVM-Runtime's reshape codes (issue 9, item 14) -----------------------------------------
# Every example of CVM-Runtime's own reshape documentation (src/top/tensor/transform.cc).
RESHAPE_EXAMPLES = [
    ((2, 3, 4), (4, 0, 2), (4, 3, 2)), ((2, 3, 4), (2, 0, 0), (2, 3, 4)),
    ((2, 3, 4), (6, 1, -1), (6, 1, 4)), ((2, 3, 4), (3, -1, 8), (3, 1, 8)),
    ((2, 3, 4), (-1,), (24,)), ((2, 3, 4), (-2,), (2, 3, 4)), ((2, 3, 4), (2, -2), (2, 3, 4)),
    ((2, 3, 4), (-2, 1, 1), (2, 3, 4, 1, 1)), ((2, 3, 4), (-3, 4), (6, 4)),
    ((2, 3, 4, 5), (-3, -3), (6, 20)), ((2, 3, 4), (0, -3), (2, 12)),
    ((2, 3, 4), (-3, -2), (6, 4)), ((2, 3, 4), (-4, 1, 2, -2), (1, 2, 3, 4)),
    ((2, 3, 4), (2, -4, -1, 3, -2), (2, 1, 3, 4)),
]


def _reshape_doc(in_shape, code, out_shape) -> dict:
    nodes = [_null("data"), _op("r", "reshape", [[0, 0, 0]])]
    attrs = ['{}', json.dumps({"shape": str(tuple(code))})]
    return _doc(nodes, [list(in_shape), list(out_shape)], [8, 8], attrs, [[1, 0, 0]])


@pytest.mark.parametrize("in_shape, code, out_shape", RESHAPE_EXAMPLES)
def test_reshape_special_values_resolve_at_import(tmp_path, in_shape, code, out_shape):
    g = load_graph(_write(tmp_path, _reshape_doc(in_shape, code, out_shape), pack_params({})))
    assert g.nodes[0].attrs["target_shape"] == out_shape
    x = np.arange(int(np.prod(in_shape))).reshape(in_shape) % 100
    assert np.array_equal(reference_run(g, {"data": x})["r"], x.reshape(out_shape))


@pytest.mark.parametrize("code, words", [((-1, -1), "more than one -1"),
                                         ((-4, -1, -1, -2), "cannot split into -1 and -1"),
                                         ((-4, 5, 2, -2), "does not make dimension 2"),
                                         ((2, -5), "unknown code -5")])
def test_reshape_bad_codes(tmp_path, code, words):
    with pytest.raises(CvmcError, match=words):
        load_graph(_write(tmp_path, _reshape_doc((2, 3, 4), code, (24,)), pack_params({})))


# ---- JSON edge cases (issue 9, items 10 to 12) ------------------------------------------------
def test_json_with_bom_huge_integer_and_duplicate_heads(tmp_path, capsys):
    from cvmc.cli import main

    text = json.dumps(_conv_doc())
    path = _write(tmp_path, _conv_doc(), _conv_params())
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # a UTF-8 BOM: still a JSON model
    assert [n.op for n in load_graph(path).nodes] == ["conv2d", "cvm_right_shift", "cvm_clip"]
    path.write_text(text.replace('"version": "cvm_1.0.0"', '"version": ' + "9" * 5000))
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "Traceback" not in err and err.count("\n") == 1
    doc = _conv_doc()
    doc["heads"] = [[5, 0, 0], [5, 0, 0]]
    with pytest.raises(CvmcError, match="heads: 'clip' is listed twice"):
        load_graph(_write(tmp_path, doc, _conv_params()))


def test_json_without_params_warns(tmp_path, capsys):
    from cvmc.cli import main

    (tmp_path / "m.json").write_text(json.dumps(_conv_doc()))
    main(["check", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert "warning:" in err and "pass the weights with --params FILE" in err
    assert "3 null nodes (data, w, b)" in err


# ---- export for CVM-Runtime (issue 9, item 16) ----------------------------------------------
def _where_graph() -> Graph:
    """where(c, x, y) with a 2-bit condition and 8- and 12-bit operands: output 12 bits."""
    types = {"x": TensorType((2, 3), "int32", 8), "c": TensorType((2, 3), "int32"),
             "y": TensorType((2, 3), "int32"), "o": TensorType((2, 3), "int32")}
    consts = {"c": np.array([[1, 0, 1], [0, 0, 1]], np.int32),
              "y": np.array([[2000, -2000, 7], [1, 2, 3]], np.int32)}
    return retype(Graph("w", ["x"], ["o"], [Node("where", ("c", "x", "y"), ("o",), {})],
                                 types, consts))


def test_export_widens_a_narrow_where_condition(tmp_path: Path) -> None:
    graph = _where_graph()
    symbol, params = export_cvm(graph, tmp_path)
    doc = json.loads(symbol.read_text())
    names = [n["name"] for n in doc["nodes"]]
    precision = doc["attrs"]["precision"][1]
    clip = names.index("c_as_12_bits")
    assert doc["nodes"][clip]["attrs"]["func_name"] == "cvm_clip" and precision[clip] == 12
    # CVM-Runtime's rule (the condition's precision) now gives where its 12 bits.
    assert precision[names.index("o")] == 12 == precision[clip]
    back = load_graph(symbol, params=params)
    x = np.array([[5, -6, 7], [-8, 9, -10]])
    assert reference_run(back, {"data": x})["o"].tolist() == [[5, -2000, 7], [1, 2, -10]]


def test_export_params_int8_and_storage_shared_by_liveness(tmp_path: Path) -> None:
    graph = load_graph(Path(__file__).resolve().parents[2] / "examples" / "small_cnn")
    symbol, params = export_cvm(graph, tmp_path)
    arrays = read_params(params)  # widened to int32 on reading, as CVM-Runtime does
    # w1 (8*3*3*3 = 216 values) and w2 (10*512 = 5120) have precision 8: one byte each
    # instead of four; b1 (12 bits) and b2 (16 bits) stay int32.
    all_int32 = params_bytes({k: v.astype(np.int32) for k, v in arrays.items()})
    assert len(params.read_bytes()) == len(all_int32) - 3 * (216 + 5120)
    doc = json.loads(symbol.read_text())
    sids, shapes = doc["attrs"]["storage_id"][1], doc["attrs"]["shape"][1]
    nodes = doc["nodes"]
    variables = [k for k, n in enumerate(nodes) if n["op"] == "null"]
    # (single-output nodes: entry k is node k) Variables keep their own storage.
    assert all(sids.count(sids[k]) == 1 for k in variables)
    # No op writes the storage of one of its inputs.
    for k, n in enumerate(nodes):
        assert all(sids[k] != sids[e[0]] for e in n["inputs"]), n["name"]
    # Sharing storage needs disjoint lifetimes: produced at k, last read at last[k].
    last = {k: max([j for j, n in enumerate(nodes) if any(e[0] == k for e in n["inputs"])],
                   default=len(nodes)) for k in range(len(nodes))}
    for k in range(len(nodes)):
        for j in range(k + 1, len(nodes)):
            if sids[j] == sids[k] and k not in variables:
                assert last[k] < j, (nodes[k]["name"], nodes[j]["name"])
    assert len(set(sids)) < len(sids)  # a chain reuses storage
    size = {s: max(int(np.prod(shapes[k])) for k in range(len(sids)) if sids[k] == s)
            for s in set(sids)}
    assert sum(size.values()) < sum(int(np.prod(s)) for s in shapes)
    x = np.load(Path(__file__).resolve().parents[2] / "examples" / "small_cnn" / "data.npy")
    back = load_graph(symbol, params=params)
    assert np.array_equal(reference_run(back, {"data": x})["logits"],
                          reference_run(graph, {"data": x})["logits"])
