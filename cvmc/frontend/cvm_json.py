"""CVM-Runtime models: graph JSON (NNVM style, "cvm_1.0.0" / "cvm_1.1.0") + params file.

Import: `null` nodes with data in the params file are weights, the other `null` nodes are
graph inputs (their declared precision is their input precision). Op nodes are
`{"op": "cvm_op", "attrs": {"func_name": OP, ...}}`; their attributes are the per-node
JSON strings of `attrs.op_attrs`, whose values are strings such as "(1, 1)", "True",
"None". Shapes and precisions declared in the JSON are recomputed with the registry's
rules and must agree (-1 means "not declared", as CVM-Runtime allows). The params file
defaults to `<stem>.params` beside the JSON, else `params` in the same folder (the
name `export_cvm` writes). Extra outputs of a multi-output node are named
`<node>_out<k>`.

Export writes `symbol.json` ("cvm_1.1.0") and `params` (int8 arrays for weights of
precision <= 8, int32 for the others: the two widths CVM-Runtime loads), every attribute
as CVM-Runtime's parser reads it (docs/cvm-runtime.md; never "None"). CVM-Runtime feeds one
input named `data`, so a single graph input of another name is renamed `data` in the
exported files.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from cvmc.errors import CvmcError, OpRuleError
from cvmc.frontend.container import file_in_folder
from cvmc.frontend.cvm_params import params_bytes, read_params
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import OpDef, lookup
from cvmc.ops.common import integer_data_error
from cvmc.ops.infer import require_typed, retype
from cvmc.ops.registry import Attrs, suggest

VERSIONS = ("cvm_1.0.0", "cvm_1.1.0")
EXPORT_VERSION = "cvm_1.1.0"
MAX_RANK = 6  # CVM-Runtime's limit on every tensor

# NNVM conv2d/dense attributes with no effect on integer results, checked then dropped.
_INERT_ATTRS = {"out_dtype": ("same", "int32", "-1", ""), "out_layout": ("", "NCHW", "None")}


# ---- attribute strings ------------------------------------------------------------------
def parse_attr_value(text: Any, kind: str) -> Any:
    """A CVM-Runtime attribute string ("(1, 1)", "True", "None", "3") as a Python value."""
    if not isinstance(text, str) or kind == "str":
        return text
    s = text.strip()
    if s in ("None", "none"):
        return None
    if s in ("True", "true", "False", "false"):
        return s in ("True", "true")
    if s[:1] in "([" and s[-1:] in ")]":
        return [parse_attr_value(p, "int") for p in s[1:-1].split(",") if p.strip()]
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)
    if kind == "bool" and s in ("0", "1"):
        return s == "1"
    return s


def format_attr_value(value: Any) -> str:
    """A Python attribute value in CVM-Runtime's string spelling."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        items = [format_attr_value(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    return str(value)


# ---- import -----------------------------------------------------------------------------
class _Doc:
    """The JSON document with typed, error-reporting field access."""

    def __init__(self, doc: Any, where: str):
        self.where = where
        self.doc = self.field({"document": doc}, "document", dict, "")

    def fail(self, message: str) -> CvmcError:
        return CvmcError(f"{self.where}: {message}")

    def field(self, obj: dict, key: str, kind: type, what: str) -> Any:
        if key not in obj:
            raise self.fail(f"{what}missing key '{key}'")
        if not isinstance(obj[key], kind) or isinstance(obj[key], bool):
            raise self.fail(f"{what}'{key}' must be a JSON {kind.__name__}, "
                            f"got {type(obj[key]).__name__}")
        return obj[key]

    def graph_attr(self, key: str, tag: str, length: int) -> list:
        """One `attrs` entry: ["tag", [values...]] with `length` values."""
        entry = self.field(self.field(self.doc, "attrs", dict, ""), key, list, "attrs: ")
        if len(entry) != 2 or entry[0] != tag or not isinstance(entry[1], list):
            raise self.fail(f"attrs: '{key}' must be [\"{tag}\", [...]]")
        if len(entry[1]) != length:
            raise self.fail(f"attrs: '{key}' has {len(entry[1])} entries, expected {length} "
                            f"(one per node output)" if key != "op_attrs" else
                            f"attrs: 'op_attrs' has {len(entry[1])} entries, expected {length} "
                            f"(one per node)")
        return entry[1]


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as e:
        raise CvmcError(f"{path}: cannot read: {e.strerror}") from None
    # ValueError covers JSONDecodeError (with line and column) and integers of more digits
    # than Python converts; RecursionError, deep nesting. A UTF-8 BOM is accepted (json
    # detects it in bytes).
    except (ValueError, RecursionError) as e:
        raise CvmcError(f"{path}: not valid JSON ({e})") from None


def _default_params(path: Path) -> Path | None:
    """The params file found beside a graph JSON (`<stem>.params`, else `params`): like a
    folder's weights, it must stay inside the JSON's folder, symlinks included."""
    root = path.resolve().parent
    for name in (path.with_suffix(".params").name, "params"):
        found = file_in_folder(root, name, "params file")
        if found is not None:
            return found
    return None


class _Importer:
    """Builds a Graph from a parsed CVM-Runtime JSON document and its params arrays."""

    def __init__(self, doc: _Doc, arrays: dict[str, np.ndarray], params_name: str, name: str):
        self.d, self.arrays, self.params_name, self.name = doc, arrays, params_name, name
        self.nodes = self.d.field(self.d.doc, "nodes", list, "")
        self.ops: list[OpDef | None] = [self._node_op(i, n) for i, n in enumerate(self.nodes)]
        self.row_ptr = [0]
        for op in self.ops:
            self.row_ptr.append(self.row_ptr[-1] + (len(op.outputs) if op else 1))
        n_entries = self.row_ptr[-1]
        self.shapes = self.d.graph_attr("shape", "list_shape", n_entries)
        self.precisions = self.d.graph_attr("precision", "list_int", n_entries)
        self.op_attrs = self.d.graph_attr("op_attrs", "list_str", len(self.nodes))
        for key, tag in (("dltype", "list_str"), ("storage_id", "list_int")):
            self.d.graph_attr(key, tag, n_entries)
        self.values: list[list[str]] = []  # node id -> its value names
        self.types: dict[str, TensorType] = {}

    def _node_op(self, i: int, node: Any) -> OpDef | None:
        """The OpDef of node i (None for a `null` variable node)."""
        what = f"node {i}: "
        if not isinstance(node, dict):
            raise self.d.fail(f"{what}must be a JSON object")
        op = self.d.field(node, "op", str, what)
        self.d.field(node, "name", str, what)
        self.d.field(node, "inputs", list, what)
        if op == "null":
            return None
        if op == "cvm_op":
            op = self.d.field(self.d.field(node, "attrs", dict, what), "func_name", str, what)
        opdef = lookup(re.sub(r"_\d+$", "", op)) or lookup(op)
        if opdef is None or not opdef.integer_op:
            raise self.d.fail(f"node {i} '{node['name']}': unknown op '{op}'{suggest(op)}")
        return opdef

    def run(self) -> Graph:
        inputs, constants, nodes = [], {}, []
        for i, node in enumerate(self.nodes):
            names = self._value_names(i, node["name"])
            if self.ops[i] is None:
                self._variable(i, names[0], inputs, constants)
            else:
                nodes.append(self._op_node(i, names))
        unused = sorted(set(self.arrays) - set(constants))
        if unused:
            raise CvmcError(f"params file '{self.params_name}': array '{unused[0]}' matches "
                            f"no null node of the graph")
        outputs = [self._entry(e, len(self.nodes), "heads") for e in
                   self.d.field(self.d.doc, "heads", list, "")]
        twice = [v for k, v in enumerate(outputs) if v in outputs[:k]]
        if twice:
            raise self.d.fail(f"heads: '{twice[0]}' is listed twice; each graph output must "
                              f"be listed once")
        if not self.arrays and len(inputs) > 1:
            warnings.warn(f"{self.d.where}: no params file given or found beside it, so its "
                          f"{len(inputs)} null nodes ({', '.join(inputs[:4])}"
                          f"{', ...' if len(inputs) > 4 else ''}) all become graph inputs; "
                          f"pass the weights with --params FILE", stacklevel=2)
        self._check_arg_nodes()
        graph = Graph(self.name, inputs, outputs, nodes, self.types, constants)
        return self._check_precisions(retype(graph))

    def _value_names(self, i: int, name: str) -> list[str]:
        n_out = self.row_ptr[i + 1] - self.row_ptr[i]
        names = [name] + [f"{name}_out{k}" for k in range(1, n_out)]
        for k, v in enumerate(names):
            if v in self.types:
                raise self.d.fail(f"node {i}: name '{v}' is used twice")
            self.types[v] = TensorType(self._shape(self.row_ptr[i] + k))
        self.values.append(names)
        return names

    def _shape(self, eid: int) -> tuple[int, ...]:
        shape = self.shapes[eid]
        if not (isinstance(shape, list) and 1 <= len(shape) <= MAX_RANK and
                all(isinstance(d, int) and d >= 1 for d in shape)):
            raise self.d.fail(f"attrs: shape #{eid} must be 1 to {MAX_RANK} positive integers, "
                              f"got {shape}")
        return tuple(shape)

    def _variable(self, i: int, name: str, inputs: list, constants: dict) -> None:
        t, prec = self.types[name], self.precisions[self.row_ptr[i]]
        if name not in self.arrays:
            if not (isinstance(prec, int) and 1 <= prec <= 32):
                raise self.d.fail(f"input '{name}' must declare a precision in 1..32, got {prec}")
            inputs.append(name)
            self.types[name] = TensorType(t.shape, "int32", prec)
            return
        data = self.arrays[name]
        if data.shape != t.shape:
            raise CvmcError(f"params file '{self.params_name}': weight '{name}' has shape "
                            f"{list(data.shape)}, the graph declares {list(t.shape)}")
        if prec != -1 and not (isinstance(prec, int) and 1 <= prec <= 32):
            raise self.d.fail(f"weight '{name}' must declare a precision in 1..32 or -1, "
                              f"got {prec}")
        problem = integer_data_error(data, None if prec == -1 else prec)
        if problem:
            raise CvmcError(f"params file '{self.params_name}': weight '{name}': {problem}")
        constants[name] = data
        self.types[name] = TensorType(t.shape, "int32", None if prec == -1 else prec)

    def _entry(self, entry: Any, limit: int, what: str) -> str:
        """The value name of a [node id, output index(, version)] reference."""
        if not (isinstance(entry, list) and len(entry) in (2, 3) and
                all(isinstance(x, int) for x in entry)):
            raise self.d.fail(f"{what}: entry {entry} must be [node id, output index, version]")
        nid, idx = entry[0], entry[1]
        if not 0 <= nid < len(self.nodes):
            raise self.d.fail(f"{what}: node id {nid} is out of range (0..{len(self.nodes) - 1})")
        if nid >= limit:
            raise self.d.fail(f"{what}: input node {nid} does not come before it "
                              f"(nodes must be in topological order)")
        if not 0 <= idx < len(self.values[nid]):
            raise self.d.fail(f"{what}: output index {idx} of node {nid} is out of range")
        return self.values[nid][idx]

    def _op_node(self, i: int, outputs: list[str]) -> Node:
        node, opdef = self.nodes[i], self.ops[i]
        assert opdef is not None
        where = f"node {i} {opdef.name} '{node['name']}'"
        ins = tuple(self._entry(e, i, where) for e in node["inputs"])
        attrs = self._attrs(i, opdef, where, [self.types[v].shape for v in ins])
        try:
            shapes = opdef.infer_shapes([self.types[v] for v in ins], attrs)
        except OpRuleError as e:
            raise self.d.fail(f"{where}: {e.message}") from None
        for k, (out, shape) in enumerate(zip(outputs, shapes)):
            if shape != self.types[out].shape:
                raise self.d.fail(f"{where}: output {k} has shape {list(shape)} but the JSON "
                                  f"declares {list(self.types[out].shape)}")
        return Node(opdef.name, ins, tuple(outputs), attrs)

    def _attrs(self, i: int, opdef: OpDef, where: str, in_shapes: list) -> Attrs:
        declared = self.nodes[i].get("attrs", {})
        n_in = declared.get("num_inputs") if isinstance(declared, dict) else None
        if n_in is not None and str(n_in) != str(len(self.nodes[i]["inputs"])):
            raise self.d.fail(f"{where}: num_inputs is {n_in} but it lists "
                              f"{len(self.nodes[i]['inputs'])} inputs")
        text = self.op_attrs[i]
        try:
            given = json.loads(text) if isinstance(text, str) and text.strip() else {}
        except (json.JSONDecodeError, RecursionError) as e:
            raise self.d.fail(f"{where}: op_attrs is not a JSON object string ({e})") from None
        if not isinstance(given, dict):
            raise self.d.fail(f"{where}: op_attrs must encode a JSON object, got {text!r}")
        values = {}
        for key, value in given.items():
            if key in _INERT_ATTRS and str(value) in _INERT_ATTRS[key]:
                continue
            at = opdef.attr(key)
            values[key] = parse_attr_value(value, at.kind if at else "str")
            if opdef.name == "reshape" and at is not None and at.name == "target_shape":
                values[key] = self._resolve_reshape(values[key], in_shapes[0], where)
        try:
            return opdef.normalize_attrs(values)
        except OpRuleError as e:
            raise self.d.fail(f"{where}: {e.message}") from None

    def _resolve_reshape(self, target, shape: tuple[int, ...], where: str) -> list[int]:
        """CVM-Runtime's reshape codes resolved against the input shape (its shape rule,
        src/top/tensor/transform.cc): 0 copies the next input dimension, -1 is inferred
        from the rest (at most once), -2 copies every remaining input dimension, -3 merges
        the next two, -4 splits the next one into the two values after it (one may be
        -1). Positive values take the place of one input dimension."""
        if not isinstance(target, (list, tuple)) or not all(isinstance(v, int) for v in target):
            return target  # the op's own attribute check reports it
        out, src, infer, k = [], 0, None, 0

        def need(cond: bool, what: str) -> None:
            if not cond:
                raise self.d.fail(f"{where}: reshape shape {list(target)} on input "
                                  f"{list(shape)}: {what}")
        while k < len(target):
            v = target[k]
            if v > 0:
                out.append(v)
                src += 1
            elif v == 0:
                need(src < len(shape), "0 copies a dimension the input does not have")
                out.append(shape[src])
                src += 1
            elif v == -1:
                need(infer is None, "more than one -1")
                infer = len(out)
                out.append(1)
                src += 1
            elif v == -2:
                out.extend(shape[src:])
                src = len(shape)
            elif v == -3:
                need(src + 1 < len(shape), "-3 merges two dimensions the input does not have")
                out.append(shape[src] * shape[src + 1])
                src += 2
            elif v == -4:
                need(k + 2 < len(target) and src < len(shape), "-4 needs two values after it "
                     "and an input dimension to split")
                d0, d1, d2 = shape[src], target[k + 1], target[k + 2]
                need(d1 != -1 or d2 != -1, "-4 cannot split into -1 and -1")
                d1 = d0 // d2 if d1 == -1 and d2 else d1
                d2 = d0 // d1 if d2 == -1 and d1 else d2
                need(d1 > 0 and d2 > 0 and d1 * d2 == d0,
                     f"-4 split {d1} x {d2} does not make dimension {d0}")
                out += [d1, d2]
                src += 1
                k += 2
            else:
                need(False, f"unknown code {v} (expected a size or 0, -1, -2, -3, -4)")
            k += 1
        if infer is not None:
            known = int(np.prod(out, dtype=np.int64))
            need(known > 0 and int(np.prod(shape, dtype=np.int64)) % known == 0,
                 "the -1 dimension cannot be inferred")
            out[infer] = int(np.prod(shape, dtype=np.int64)) // known
        return out

    def _check_arg_nodes(self) -> None:
        arg_nodes = self.d.field(self.d.doc, "arg_nodes", list, "")
        variables = [i for i, op in enumerate(self.ops) if op is None]
        # cvm_1.1.0 recomputes arg_nodes and node_row_ptr; cvm_1.0.0 requires them exact.
        if self.d.doc.get("version", VERSIONS[0]) == "cvm_1.0.0":
            if arg_nodes != variables:
                raise self.d.fail(f"arg_nodes {arg_nodes} must list the null nodes {variables}")
            row_ptr = self.d.doc.get("node_row_ptr", self.row_ptr)
            if row_ptr != self.row_ptr:
                raise self.d.fail(f"node_row_ptr {row_ptr} must be {self.row_ptr}")

    def _check_precisions(self, graph: Graph) -> Graph:
        for i, names in enumerate(self.values):
            for k, v in enumerate(names):
                declared = self.precisions[self.row_ptr[i] + k]
                if declared != -1 and declared != graph.types[v].precision:
                    raise self.d.fail(f"node {i} '{self.nodes[i]['name']}': output {k} has "
                                      f"precision {graph.types[v].precision} but the JSON "
                                      f"declares {declared}")
        return graph


def read_cvm_model(path: Path, params: Path | None = None) -> Graph:
    """Read a CVM-Runtime graph JSON and its params file into a precision-inferred Graph."""
    path = Path(path)
    d = _Doc(_load_json(path), str(path))
    version = d.doc.get("version", VERSIONS[0])
    if version not in VERSIONS:
        raise d.fail(f"unsupported version {version!r} (expected {' or '.join(VERSIONS)})")
    params_path = Path(params) if params is not None else _default_params(path)
    arrays = read_params(params_path) if params_path is not None else {}
    return _Importer(d, arrays, str(params_path), path.stem).run()


# ---- export -----------------------------------------------------------------------------
def _cvm_attrs(node: Node, opdef: OpDef, types: dict[str, TensorType]) -> dict[str, str]:
    """The node's attributes as CVM-Runtime op_attrs strings, in its spellings. An unset
    attribute (None) is derived from the input shapes where CVM-Runtime requires it (the
    attribute's `cvm_derive`), else left out: CVM-Runtime's default for the one optional
    field (take's axis) is unset too, and its parser refuses "None" for a required int
    (cvm_lut's in_dim, for example)."""
    shapes = [types[i].shape for i in node.inputs]
    out = {}
    for at in opdef.attrs:  # in CVM-Runtime's spelling (`cvm_name`, an alias: import reads it)
        value = node.attrs[at.name]
        if value is None and at.cvm_derive is not None:
            value = at.cvm_derive(shapes)
        if value is not None:
            out[at.cvm_name or at.name] = format_attr_value(value)
    return out


# Op sets CVM-Runtime implements (its own additions to the spec's set included).
CVM_RUNTIME_SEEDS = {"cvm", "cvm-runtime"}


def _check_exportable(graph: Graph) -> None:
    for node in graph.nodes:
        seeds = lookup(node.op).seeds
        if not CVM_RUNTIME_SEEDS & set(seeds):
            raise CvmcError(f"{node.op} '{node.name}': an op of the {', '.join(seeds)} op set "
                            f"with no CVM-Runtime counterpart; cannot export to CVM-Runtime",
                            node.span)
    rows = {o: graph.types[o].size // graph.types[o].shape[-1] for o in graph.outputs}
    if len(set(rows.values())) > 1:
        warnings.warn(f"CVM-Runtime's CVMAPIInference returns several outputs row by row (a "
                      f"row: the last dimension) and refuses outputs of different row counts "
                      f"('detection model output cannot concat'); these have "
                      f"{', '.join(f'{o}: {n}' for o, n in rows.items())}", stacklevel=3)
    for v in graph.values():
        if not 1 <= len(graph.types[v].shape) <= MAX_RANK:
            raise CvmcError(f"tensor '{v}' has rank {len(graph.types[v].shape)}; CVM-Runtime "
                            f"supports ranks 1..{MAX_RANK}")
    if len(graph.inputs) != 1:
        raise CvmcError(f"CVM-Runtime models have exactly one input ('data'); this graph has "
                        f"{len(graph.inputs)}: {', '.join(graph.inputs) or 'none'}")


def _widen_where_conditions(graph: Graph) -> Graph:
    """CVM-Runtime gives `where` the precision of its condition (cvmc: max(p_x, p_y)) and
    stores the output at that precision, so a wider x or y would come back truncated. The
    condition is passed through `cvm_clip` at the output's precision first: its values
    already fit, so they are unchanged, and CVM-Runtime then gives `where` the right one."""
    nodes, types = [], dict(graph.types)
    for node in graph.nodes:
        cond = node.inputs[0] if node.op == "where" else None
        want = types[node.outputs[0]].precision if cond else None
        if cond and types[cond].precision < want:
            wide = f"{cond}_as_{want}_bits"
            k = 0
            while wide in types:
                k += 1
                wide = f"{cond}_as_{want}_bits_{k}"
            types[wide] = TensorType(types[cond].shape, "int32", want).with_precision(want)
            nodes.append(Node("cvm_clip", (cond,), (wide,),
                              dict(lookup("cvm_clip").normalize_attrs({"precision": want}))))
            node = Node(node.op, (wide, *node.inputs[1:]), node.outputs, node.attrs, node.span)
        nodes.append(node)
    return graph.replace(nodes=nodes, types=types)


def _cvm_runtime_form(node: Node, types: dict[str, TensorType]) -> Node:
    """The node as CVM-Runtime runs it: an expand_dims of no new axis (num_newaxis 0, which
    the spec allows and CVM-Runtime's parser refuses: its lower bound is 1) is the reshape
    to its own shape."""
    if node.op == "expand_dims" and node.attrs["num_newaxis"] == 0:
        shape = list(types[node.outputs[0]].shape)
        return Node("reshape", node.inputs, node.outputs,
                    dict(lookup("reshape").normalize_attrs({"target_shape": shape})), node.span)
    return node


def _storage_ids(graph: Graph, order: list[str]) -> list[int]:
    """Storage ids shared by liveness, as CVM-Runtime allows (graph_runtime.cc): inputs and
    weights keep their own storage (weights are loaded once); an op output takes storage
    freed by values whose last reader ran before it (never its own inputs', which
    CVM-Runtime forbids for most ops); graph outputs stay live to the end. A shared
    storage is as large as its largest user."""
    last_use = {v: len(graph.nodes) if v in graph.outputs else -1 for v in order}
    for j, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[v] = max(last_use[v], j)
    sid = {v: k for k, v in enumerate([*graph.inputs, *graph.weights()])}
    free: list[int] = []
    live: list[tuple[int, str]] = []  # (last use, value) of op outputs holding storage
    for j, node in enumerate(graph.nodes):
        for end, v in [x for x in live if x[0] < j]:
            live.remove((end, v))
            free.append(sid[v])
        for out in node.outputs:
            sid[out] = free.pop(0) if free else len(set(sid.values()))
            live.append((last_use[out], out))
    return [sid[v] for v in order]


def cvm_document(graph: Graph) -> tuple[dict, dict[str, np.ndarray]]:
    """The CVM-Runtime JSON document and params arrays for a graph."""
    _check_exportable(graph)
    require_typed(graph)
    graph = _widen_where_conditions(graph)
    rename = {graph.inputs[0]: "data"} if "data" not in graph.types else {}
    nodes, entries, op_attrs = [], {}, []
    for v in [*graph.inputs, *graph.weights()]:
        entries[v] = [len(nodes), 0, 0]
        nodes.append({"op": "null", "name": rename.get(v, v), "inputs": []})
        op_attrs.append("{}")
    for node in graph.nodes:
        node = _cvm_runtime_form(node, graph.types)
        opdef = lookup(node.op)
        nodes.append({"op": "cvm_op", "name": node.name,
                      "attrs": {"func_name": opdef.cvm_name,
                                "num_inputs": str(len(node.inputs)),
                                "num_outputs": str(len(node.outputs)), "flatten_data": "0"},
                      "inputs": [entries[i] for i in node.inputs]})
        op_attrs.append(json.dumps(_cvm_attrs(node, opdef, graph.types)))
        for k, out in enumerate(node.outputs):
            entries[out] = [len(nodes) - 1, k, 0]
    order = list(entries)  # entry ids follow node order, outputs of a node consecutively
    row_ptr = [0]
    for n in nodes:
        row_ptr.append(row_ptr[-1] + int(n.get("attrs", {}).get("num_outputs", 1)))
    doc = {
        "version": EXPORT_VERSION, "nodes": nodes,
        "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"],
        "node_row_ptr": row_ptr, "heads": [entries[o] for o in graph.outputs],
        "attrs": {"dltype": ["list_str", ["int32"] * len(order)],
                  "storage_id": ["list_int", _storage_ids(graph, order)],
                  "shape": ["list_shape", [list(graph.types[v].shape) for v in order]],
                  "precision": ["list_int", [graph.types[v].precision for v in order]],
                  "op_attrs": ["list_str", op_attrs]},
    }
    # Weights of precision <= 8 are written as int8 (CVM-Runtime widens them on load,
    # graph_runtime.cc): params a quarter of the size.
    return doc, {w: graph.constants[w].astype(np.int8 if graph.types[w].precision <= 8
                                              else np.int32) for w in graph.weights()}


def export_cvm(graph: Graph, out_dir: str | Path) -> list[Path]:
    """Write `out_dir/symbol.json` and `out_dir/params` for CVM-Runtime; returns the paths."""
    from cvmc_runtime import atomic_write_bytes

    doc, arrays = cvm_document(graph)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CvmcError(f"export -o {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    symbol, params = out / "symbol.json", out / "params"
    for path in (symbol, params):
        if path.is_dir():
            raise CvmcError(f"export: {path} is a folder; cannot write the file there")
    atomic_write_bytes(symbol, (json.dumps(doc) + "\n").encode())
    atomic_write_bytes(params, params_bytes(arrays))
    return [symbol, params]
