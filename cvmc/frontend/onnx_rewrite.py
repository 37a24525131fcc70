"""Rewrites of an ONNX model that cvmc makes before NNEF-Tools 1.0.11 reads it.

The converter has no rule for some ops that exported models contain, and cannot convert
shapes computed in the graph. Each rewrite below replaces such nodes, in the ModelProto,
by ONNX ops the converter converts (`rewrite` folds first, which may make the shapes the
others need static, then rewrites node by node):
- `_fold_constants`: Shape / Size of statically shaped tensors, and every node computing
  only from them and from constants (Gather, Concat, Unsqueeze, Slice, Cast, Equal,
  Where, ...), plus ConstantOfShape and Range of constants and every node computing from
  int64 constants alone (index arithmetic such as torch's `Mod(2, 3)`), become
  initializers: what onnx-simplifier does for `x.view(x.size(0), -1)` and for the
  attention reshapes of torch's transformer exports, evaluated by onnx's NumPy reference
  evaluator. Other constant nodes are left to the converter (QDQ weights stay as they are).
- `_layer_normalization`: LayerNormalization (opset 17) becomes the plain decomposition
  ReduceMean, Sub, Mul (the square), ReduceMean, Add (epsilon), Sqrt, Div, Mul (scale),
  Add (bias), the pattern a later fusion pass can find.
- `_hard_sigmoid`, `_hard_swish`: HardSigmoid becomes Mul, Add, Clip; HardSwish
  x * HardSigmoid(x) with alpha 1/6 and beta 1/2 (MobileNetV3).
- `_reshape_allowzero`: Reshape's allowzero = 1 is dropped where its constant shape holds
  no 0 (it means nothing there; torch's dynamo exporter sets it, the converter refuses it).
- `_gru`, `_lstm`: GRU always, and an LSTM the converter's `lstm_loop` cannot express
  (its output Y used, reverse or bidirectional, no initial state, sequence_lens, other
  activations), are unrolled over their static sequence into Gemm, Add, Split, the
  activations, Mul and Reshape / Concat for the outputs.
`check_batch` first refuses, naming the node, a new batch given to a model exported with
a fixed one where the graph pins the old batch. Attributes a rewrite does not model are
refused with a CvmcError naming the op and the attribute.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from cvmc.errors import CvmcError

# Shape computations whose values the converter needs as constants, not as ops it lacks.
_SHAPE_SOURCES = ("Shape", "Size")
# Constant producers the converter has no rule for: folded whenever their inputs are known.
_FOLD_ALWAYS = ("ConstantOfShape", "Range")
# The activations the unrolled GRU / LSTM cells apply: ONNX op names without parameters.
_ACTIVATIONS = ("Sigmoid", "Tanh", "Relu")


def rewrite(model, opset: int, batches: dict[str, int] | None = None) -> None:
    """Fold shape computations, then decompose the ops NNEF-Tools lacks (module docstring).
    `batches`: the inputs given a new batch, with the model's own (`check_batch`)."""
    if batches:
        check_batch(model, batches)
    _fold_constants(model)
    rewrites = {"LayerNormalization": _layer_normalization, "HardSigmoid": _hard_sigmoid,
                "HardSwish": _hard_swish, "GRU": _gru, "LSTM": _lstm,
                "Reshape": _reshape_allowzero}
    if not any(node.op_type in rewrites for node in model.graph.node):
        return
    shapes = _static_shapes(model)
    values = _constants(model)
    names = _all_names(model.graph)
    nodes = []
    for node in model.graph.node:
        emit = _Emitter(model.graph, opset, names, _label(node))
        with internal_errors(f"{node.op_type} '{_label(node)}'"):
            rewritten = node.op_type in rewrites and rewrites[node.op_type](emit, node, shapes,
                                                                            values)
        nodes.extend(emit.nodes if rewritten else [node])
    del model.graph.node[:]
    model.graph.node.extend(nodes)


@contextmanager
def internal_errors(where: str) -> Iterator[None]:
    """Run cvmc's own converter code at `where` (a node): an exception other than a
    CvmcError is a bug in cvmc, told as one naming the node, never as the model's fault
    or NNEF-Tools' (its cause stays chained for a debugger)."""
    try:
        yield
    except CvmcError:
        raise
    except Exception as e:  # any other failure here is cvmc's own
        raise CvmcError(f"{where}: internal error in cvmc's ONNX converter ({type(e).__name__}: "
                        f"{e}); this is a bug in cvmc, not in the model: please report it") \
            from e


# ---- constant folding ---------------------------------------------------------------------
def _fold_constants(model) -> None:
    """Replace shape computations by initializers until none is left (each pass may make
    more shapes static for the next one's shape inference)."""
    from onnx import numpy_helper

    graph = model.graph
    if not any(n.op_type in _SHAPE_SOURCES + _FOLD_ALWAYS for n in graph.node):
        return
    folded_any = False
    derived: set[str] = set()  # values computed from a Shape (initializers once folded)
    while True:
        shapes = _static_shapes(model)
        values = _constants(model)
        folded = []
        for node in graph.node:
            with internal_errors(f"{node.op_type} '{_label(node)}'"):
                if _fold_node(node, shapes, values, derived, model.opset_import):
                    folded.append(node)
        if not folded:
            break
        folded_any = True
        used = _used(graph, skip=folded)
        for node in folded:
            graph.node.remove(node)
            graph.initializer.extend(numpy_helper.from_array(values[o], o)
                                     for o in node.output if o in used)
    if folded_any:
        _drop_dead_constants(graph)


def check_batch(model, batches: dict[str, int]) -> None:
    """Refuse, naming the node, a new batch that the graph does not carry: `batches` maps
    the inputs given a new batch (`model` has it) to the model's own. Both models are
    folded and shape-inferred; every node that reads a tensor whose shape the batch
    changed must pass it on: an output whose shape changes too (not Shape / Size, whose
    values carry it), and a Reshape to a shape the exporter wrote as a constant keeps it
    in dimension 0 where it did so at the old batch (`x.view(1, -1)` traced at batch 1
    does not; a shape computed from a Shape follows the data). Then the new batch must
    pass strict shape inference."""
    import onnx

    traced = {t.name for t in model.graph.initializer}
    traced.update(n.output[0] for n in model.graph.node if n.op_type == "Constant")
    old = onnx.ModelProto()
    old.CopyFrom(model)
    for info in old.graph.input:
        if info.name in batches:
            info.type.tensor_type.shape.dim[0].dim_value = batches[info.name]
    _fold_constants(old)
    _fold_constants(model)
    name = next(iter(batches))
    new = next(i for i in model.graph.input if i.name == name).type.tensor_type.shape.dim[0]
    what = f"--input-shape {name}: the model's batch {batches[name]} cannot be changed to " \
        f"{new.dim_value}"
    before, after = _static_shapes(old), _static_shapes(model)
    carried = set(batches)  # tensors whose shape the new batch changes
    for node in model.graph.node:
        if node.op_type in _SHAPE_SOURCES or not carried.intersection(node.input):
            continue
        changed = [o for o in node.output if o and (after.get(o) != before.get(o) or
                                                   after.get(o) is None or None in after[o])]
        if not changed or node.op_type == "Reshape" and node.input[1] in traced \
                and _drops_batch(node, before, after):
            x, y = next(i for i in node.input if i in carried), node.output[0]
            output = f"becomes {after.get(y)} with the batch moved out of dimension 0" \
                if changed else f"stays {after.get(y)}"
            raise CvmcError(f"{what}: {node.op_type} '{_label(node)}' pins it (its input "
                            f"'{x}' {before.get(x)} becomes {after.get(x)}, its output "
                            f"'{y}' {output}); export the model with a dynamic batch")
        carried.update(changed)
    try:  # what no node above pins may still not fit: a constant joined with the batch
        _static_shapes(model, strict=True)
    except onnx.shape_inference.InferenceError as e:
        found = re.search(r"\(op_type:(\w+)(?:, node name: ([^)]*))?\): (?:\[\w+\] )?(.*)",
                          str(e))
        where = f"{found[1]} '{found[2] or '?'}': {found[3].strip()}" if found \
            else str(e).strip().splitlines()[0]
        raise CvmcError(f"{what}: onnx shape inference fails at {where}; export the model "
                        f"with a dynamic batch") from None


def _drops_batch(node, before: dict, after: dict) -> bool:
    """Whether a Reshape that kept its input's dimension 0 at the old batch no longer does."""
    x, y = node.input[0], node.output[0]
    known = all(s.get(t) for s in (before, after) for t in (x, y))
    return known and before[x][0] == before[y][0] and after[x][0] != after[y][0]


def _fold_node(node, shapes: dict, values: dict, derived: set, opsets) -> bool:
    """Compute a foldable node's outputs into `values`; whether it was foldable."""
    if any(a.g.node or a.graphs for a in node.attribute):  # If, Loop, Scan: left alone
        return False
    if node.op_type in _SHAPE_SOURCES:
        shape = shapes.get(node.input[0])
        if shape is None or None in shape:
            return False
        values[node.output[0]] = _shape_value(node, shape)
    else:
        inputs = [i for i in node.input if i]
        # int64 is ONNX's type of shapes, axes and indices, never of a float model's
        # weights: torch computes the bounds of a Slice of a Shape from constants alone
        # (`unflatten`'s Mod(2, 3)), and the chain must fold for the Slice to fold
        if not all(i in values for i in inputs) or node.op_type == "Constant" or not (
                node.op_type in _FOLD_ALWAYS or any(i in derived for i in inputs)
                or inputs and all(values[i].dtype == np.int64 for i in inputs)):
            return False
        values.update(_evaluate(node, values, opsets))
    derived.update(node.output)
    return True


def _shape_value(node, shape: list[int]) -> np.ndarray:
    """Shape (with opset 15's start / end, which slice as Python does) or Size."""
    if node.op_type == "Size":
        return np.array(int(np.prod(shape)), np.int64)
    attrs = _attributes(node)
    return np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], np.int64)


def _evaluate(node, values: dict, opsets) -> dict[str, np.ndarray]:
    """The outputs of one node whose inputs are all constant (onnx's reference evaluator)."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inputs = sorted({i for i in node.input if i})
    outputs = [o for o in node.output if o]
    graph = helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(o)
                                                   for o in outputs],
                              [numpy_helper.from_array(np.asarray(values[i]), i) for i in inputs])
    try:
        results = ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(None, {})
    except Exception as e:  # noqa: BLE001 - onnx's evaluator: any failure is the model's
        raise CvmcError(f"{node.op_type} '{_label(node)}': cannot fold this constant shape "
                        f"computation ({type(e).__name__}: {e})") from None
    return dict(zip(outputs, (np.asarray(r) for r in results)))


def _drop_dead_constants(graph) -> None:
    """Remove Constant nodes and initializers that only folded nodes read."""
    used = _used(graph)
    dead = [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]
    for node in dead:
        graph.node.remove(node)
    inputs = {i.name for i in graph.input}
    for tensor in [t for t in graph.initializer if t.name not in used | inputs]:
        graph.initializer.remove(tensor)


def _static_shapes(model, strict: bool = False) -> dict[str, list]:
    """Every tensor's shape as ONNX shape inference gives it (None for an unknown dim);
    `strict`: an inconsistent graph raises onnx's InferenceError."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=strict, data_prop=True)
    except Exception:  # the converter's reader reports a broken model
        if strict:
            raise
        inferred = model
    graph = inferred.graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.tensor_type.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None
                                 for d in info.type.tensor_type.shape.dim]
    return shapes


def _constants(model) -> dict[str, np.ndarray]:
    """The values of the initializers and of the Constant nodes."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            try:
                values.update(_evaluate(node, values, model.opset_import))
            except CvmcError:  # a constant no rewrite reads: left to the converter
                continue
    return values


# ---- decompositions -----------------------------------------------------------------------
class _Emitter:
    """Collects the nodes and initializers that replace one node, under fresh names."""

    def __init__(self, graph, opset: int, names: set[str], prefix: str):
        self.graph, self.opset, self.names, self.prefix = graph, opset, names, prefix
        self.nodes = []

    def fresh(self, hint: str) -> str:
        """A tensor name not yet in the graph."""
        name, k = f"{self.prefix}_{hint}", 1
        while name in self.names:
            k += 1
            name = f"{self.prefix}_{hint}_{k}"
        self.names.add(name)
        return name

    def const(self, value, hint: str, dtype=np.float32) -> str:
        """A new initializer holding `value`."""
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str, out: str | None = None,
           **attrs) -> str:
        """Append one node; its output is `out`, else a fresh name; returns the output."""
        from onnx import helper

        out = out or self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def outputs(self, op_type: str, inputs: list[str], hints: list[str], **attrs) -> list[str]:
        """Append one node with several fresh outputs."""
        from onnx import helper

        outs = [self.fresh(h) for h in hints]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs

    def reduce_mean(self, x: str, axes: list[int], hint: str) -> str:
        """ReduceMean keeping dimensions; axes an attribute before opset 18, an input from."""
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.const(axes, "axes", np.int64)], hint)
        return self.op("ReduceMean", [x], hint, axes=axes)

    def clip(self, x: str, low: float, high: float, hint: str, out: str | None = None) -> str:
        """Clip to [low, high]; the bounds are attributes before opset 11, inputs from."""
        if self.opset >= 11:
            return self.op("Clip", [x, self.const(low, "min"), self.const(high, "max")], hint,
                           out)
        return self.op("Clip", [x], hint, out, min=low, max=high)

    def split(self, x: str, sizes: list[int], axis: int, hint: str) -> list[str]:
        """Split into parts of `sizes`; the sizes an attribute before opset 13, an input from."""
        if len(sizes) == 1:
            return [x]
        hints = [f"{hint}{k}" for k in range(len(sizes))]
        if self.opset >= 13:
            return self.outputs("Split", [x, self.const(sizes, "sizes", np.int64)], hints,
                                axis=axis)
        return self.outputs("Split", [x], hints, axis=axis, split=sizes)

    def stack(self, parts: list[str], shape: list[int], axis: int, out: str) -> str:
        """Reshape every part to `shape` and concatenate them along `axis` into `out`."""
        target = self.const(shape, "shape", np.int64)
        if len(parts) == 1:
            return self.op("Reshape", [parts[0], target], "", out)
        parts = [self.op("Reshape", [p, target], "part") for p in parts]
        return self.op("Concat", parts, "", out, axis=axis)


def _layer_normalization(e: _Emitter, node, shapes: dict, values: dict) -> bool:
    """LayerNormalization (opset 17) as ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div,
    Mul, Add: the converter has no rule for it."""
    attrs = _attributes(node)
    _refuse_unknown(node, attrs, {"axis", "epsilon", "stash_type"})
    if attrs.get("stash_type", 1) != 1:
        raise CvmcError(f"LayerNormalization '{_label(node)}': stash_type = "
                        f"{attrs['stash_type']} is not supported (cvmc computes in float32, "
                        f"stash_type 1)")
    used = _used(e.graph)
    for k, what in ((1, "Mean"), (2, "InvStdDev")):
        if len(node.output) > k and node.output[k] in used:
            raise CvmcError(f"LayerNormalization '{_label(node)}': its output {what} is not "
                            f"supported (only Y)")
    rank = len(_shape(node, shapes, 0))
    axis = attrs.get("axis", -1)
    axis += rank if axis < 0 else 0
    axes = list(range(axis, rank))
    x = node.input[0]
    mean = e.reduce_mean(x, axes, "mean")
    centered = e.op("Sub", [x, mean], "centered")
    variance = e.reduce_mean(e.op("Mul", [centered, centered], "square"), axes, "variance")
    eps = e.op("Add", [variance, e.const(attrs.get("epsilon", 1e-5), "epsilon")], "var_eps")
    normed = e.op("Div", [centered, e.op("Sqrt", [eps], "std")], "normed")
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    scaled = e.op("Mul", [normed, node.input[1]], "scaled", None if bias else node.output[0])
    if bias:
        e.op("Add", [scaled, bias], "", node.output[0])
    return True


def _hard_sigmoid(e: _Emitter, node, shapes: dict, values: dict) -> bool:
    """HardSigmoid max(0, min(1, alpha * x + beta)) as Mul, Add, Clip."""
    attrs = _attributes(node)
    _refuse_unknown(node, attrs, {"alpha", "beta"})
    _clipped_line(e, node.input[0], attrs.get("alpha", 0.2), attrs.get("beta", 0.5),
                  node.output[0])
    return True


def _hard_swish(e: _Emitter, node, shapes: dict, values: dict) -> bool:
    """HardSwish x * max(0, min(1, x / 6 + 1/2)) as x times HardSigmoid's decomposition."""
    _refuse_unknown(node, _attributes(node), set())
    gate = _clipped_line(e, node.input[0], 1 / 6, 0.5, None)
    e.op("Mul", [node.input[0], gate], "", node.output[0])
    return True


def _clipped_line(e: _Emitter, x: str, alpha: float, beta: float, out: str | None) -> str:
    """max(0, min(1, alpha * x + beta)): Mul, Add, Clip."""
    scaled = e.op("Mul", [x, e.const(alpha, "alpha")], "scaled")
    shifted = e.op("Add", [scaled, e.const(beta, "beta")], "shifted")
    return e.clip(shifted, 0.0, 1.0, "hard_sigmoid", out)


def _reshape_allowzero(e: _Emitter, node, shapes: dict, values: dict) -> bool:
    """Drop Reshape's allowzero = 1 (torch's dynamo exports set it) where the constant shape
    holds no 0, which is where it means nothing: the converter refuses the attribute. The
    node stays (False)."""
    attrs = _attributes(node)
    shape = values.get(node.input[1]) if len(node.input) > 1 else None
    if attrs.get("allowzero", 0) and shape is not None and 0 not in shape:
        for a in [a for a in node.attribute if a.name == "allowzero"]:
            node.attribute.remove(a)
    return False


# ---- recurrent layers, unrolled -----------------------------------------------------------
def _gru(e: _Emitter, node, shapes: dict, values: dict) -> bool:
    """GRU (the converter has no rule) unrolled: per step and direction, z and r gates, the
    candidate with linear_before_reset 0 ((r * h) R_h) or 1 (r * (h R_h + Rb_h)), and
    h = (1 - z) * candidate + z * h."""
    rnn = _recurrent(node, shapes, values, 3, ("Sigmoid", "Tanh"), {"linear_before_reset"})
    before_reset = rnn.attrs.get("linear_before_reset", 0)
    hid = rnn.hidden
    one = e.const(1.0, "one")
    hidden_states, finals = [], []
    for d, (f, g), h in zip(range(rnn.dirs), rnn.acts, _initial_states(e, node, rnn, 5)):
        w_bias, r_bias = np.split(rnn.b[d], 2)
        # biases outside the reset gate's product join the input projection's
        inside = np.repeat([0.0, 0.0, 1.0 if before_reset else 0.0], hid)
        steps = _input_steps(e, node, rnn, d, w_bias + r_bias * (1 - inside))
        r_zr, r_h = rnn.r[d][:2 * hid], rnn.r[d][2 * hid:]
        weights = (e.const(rnn.r[d], "R"), e.const(r_bias * inside, "Rb")) if before_reset \
            else (e.const(r_zr.T, "R_zr"), e.const(r_h.T, "R_h"))
        states = {}
        for t in rnn.order(d):
            x_zr, x_h = e.split(steps[t], [2 * hid, hid], 1, "x")
            if before_reset:
                rec = e.op("Gemm", [h, *weights], "rec", transB=1)
                rec_zr, rec_h = e.split(rec, [2 * hid, hid], 1, "rec")
            else:
                rec_zr = e.op("MatMul", [h, weights[0]], "rec_zr")
            zr = e.op(f, [e.op("Add", [x_zr, rec_zr], "zr_in")], "zr")
            z, reset = e.split(zr, [hid, hid], 1, "zr")
            if before_reset:
                rec_h = e.op("Mul", [reset, rec_h], "reset_rec")
            else:
                rec_h = e.op("MatMul", [e.op("Mul", [reset, h], "reset_h"), weights[1]], "rec_h")
            candidate = e.op(g, [e.op("Add", [x_h, rec_h], "n_in")], "candidate")
            keep = e.op("Mul", [e.op("Sub", [one, z], "update"), candidate], "new")
            h = e.op("Add", [keep, e.op("Mul", [z, h], "old")], "h")
            states[t] = h
        hidden_states.append(states)
        finals.append(h)
    _write_outputs(e, node, rnn, hidden_states, [finals])
    return True


def _lstm(e: _Emitter, node, shapes: dict, values: dict) -> bool:
    """An LSTM the converter's lstm_loop cannot express, unrolled: per step and direction,
    gates (i, o, f, c) from x W^T + h R^T + Wb + Rb, c = f * c + i * g(c~), h = o * h(c).
    The others are left to the converter (False)."""
    if _converter_runs_lstm(node, e.graph):
        return False
    rnn = _recurrent(node, shapes, values, 4, ("Sigmoid", "Tanh", "Tanh"), {"input_forget"})
    if rnn.attrs.get("input_forget", 0):
        raise CvmcError(f"LSTM '{_label(node)}': input_forget = 1 (coupled input and forget "
                        f"gates) is not supported")
    if len(node.input) > 7 and node.input[7]:
        raise CvmcError(f"LSTM '{_label(node)}': peephole weights (input P) are not supported")
    hid = rnn.hidden
    hidden_states, finals_h, finals_c = [], [], []
    for d, (f, g, act), h, c in zip(range(rnn.dirs), rnn.acts, _initial_states(e, node, rnn, 5),
                                    _initial_states(e, node, rnn, 6)):
        steps = _input_steps(e, node, rnn, d, sum(np.split(rnn.b[d], 2)))
        recurrence = e.const(rnn.r[d].T, "R")
        states = {}
        for t in rnn.order(d):
            pre = e.op("Add", [steps[t], e.op("MatMul", [h, recurrence], "rec")], "gates")
            i, o, forget, cell = e.split(pre, [hid] * 4, 1, "gate")
            i, o, forget = (e.op(f, [v], n) for v, n in ((i, "i"), (o, "o"), (forget, "f")))
            update = e.op("Mul", [i, e.op(g, [cell], "cell")], "update")
            c = e.op("Add", [e.op("Mul", [forget, c], "kept"), update], "c")
            h = e.op("Mul", [o, e.op(act, [c], "c_act")], "h")
            states[t] = h
        hidden_states.append(states)
        finals_h.append(h)
        finals_c.append(c)
    _write_outputs(e, node, rnn, hidden_states, [finals_h, finals_c])
    return True


def _converter_runs_lstm(node, graph) -> bool:
    """Whether NNEF-Tools' lstm_loop converts this LSTM: forward, default activations, both
    initial states, no sequence_lens, its output Y unused. What else it does not model
    (clip, input_forget, peepholes) onnx_convert refuses on that path."""
    attrs = _attributes(node)
    inputs = [*node.input, *[""] * (7 - len(node.input))]
    return (attrs.get("direction", "forward") == "forward" and "activations" not in attrs
            and not inputs[4] and bool(inputs[5]) and bool(inputs[6])
            and node.output[0] not in _used(graph))


def _recurrent(node, shapes: dict, values: dict, gates: int, activations: tuple[str, ...],
               extra: set[str]):
    """The checked layout of a GRU / LSTM: static sizes, constant weights, directions and
    their activations; refuses what the unrolled cells do not model."""
    from types import SimpleNamespace

    attrs = _attributes(node)
    _refuse_unknown(node, attrs, {"activations", "direction", "hidden_size", "layout", *extra})
    what = f"{node.op_type} '{_label(node)}'"
    if attrs.get("layout", 0) != 0:
        raise CvmcError(f"{what}: layout = {attrs['layout']} (batch first) is not supported")
    direction = attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise CvmcError(f"{what}: direction '{direction}' is not an ONNX direction")
    dirs = 2 if direction == "bidirectional" else 1
    acts = attrs.get("activations", list(activations) * dirs)
    if len(acts) != len(activations) * dirs or any(a not in _ACTIVATIONS for a in acts):
        raise CvmcError(f"{what}: activations {acts} are not supported (cvmc unrolls "
                        f"{len(activations)} per direction, each one of {_ACTIVATIONS})")
    steps, batch, _ = _shape(node, shapes, 0)
    w, r = _constant_input(node, values, 1), _constant_input(node, values, 2)
    hidden = r.shape[-1]
    if attrs.get("hidden_size", hidden) != hidden or w.shape[:2] != (dirs, gates * hidden):
        raise CvmcError(f"{what}: hidden_size {attrs.get('hidden_size')} does not fit its "
                        f"weights {list(w.shape)} and {list(r.shape)}")
    b = _constant_input(node, values, 3) if len(node.input) > 3 and node.input[3] \
        else np.zeros((dirs, 2 * gates * hidden), np.float32)
    if len(node.input) > 4 and node.input[4]:
        lengths = _constant_input(node, values, 4)
        if np.any(lengths != steps):
            raise CvmcError(f"{what}: sequence_lens {lengths.tolist()} is supported only "
                            f"where every length is the sequence's, {steps}")
    n = len(activations)
    return SimpleNamespace(
        attrs=attrs, steps=steps, batch=batch, hidden=hidden, dirs=dirs, w=w, r=r, b=b,
        acts=[acts[d * n:(d + 1) * n] for d in range(dirs)],
        order=lambda d: range(steps)[::-1] if direction == "reverse" or d == 1
        else range(steps))


def _input_steps(e: _Emitter, node, rnn, d: int, bias: np.ndarray) -> list[str]:
    """x W^T + bias for every step at once (one Gemm over [steps * batch, input]), split
    into the steps."""
    rows = e.op("Reshape", [node.input[0], e.const([rnn.steps * rnn.batch, -1], "shape",
                                                   np.int64)], "x_rows")
    projected = e.op("Gemm", [rows, e.const(rnn.w[d], "W"), e.const(bias, "Wb")], "x_proj",
                     transB=1)
    return e.split(projected, [rnn.batch] * rnn.steps, 0, "x_step")


def _initial_states(e: _Emitter, node, rnn, k: int) -> list[str]:
    """The initial state of every direction, [batch, hidden]: input k, else zeros."""
    if len(node.input) <= k or not node.input[k]:
        return [e.const(np.zeros((rnn.batch, rnn.hidden)), "zeros")] * rnn.dirs
    shape = e.const([rnn.batch, rnn.hidden], "shape", np.int64)
    return [e.op("Reshape", [part, shape], "initial")
            for part in e.split(node.input[k], [1] * rnn.dirs, 0, "initial")]


def _write_outputs(e: _Emitter, node, rnn, hidden_states: list[dict], finals: list[list]):
    """Y [steps, directions, batch, hidden] and the final states [directions, batch,
    hidden] (Y_h, and Y_c of an LSTM), where the node names them."""
    if node.output[0]:
        single = [1, 1, rnn.batch, rnn.hidden]
        per_dir = [e.stack([states[t] for t in range(rnn.steps)], single, 0,
                           node.output[0] if rnn.dirs == 1 else None)
                   for states in hidden_states]
        if rnn.dirs > 1:
            e.op("Concat", per_dir, "", node.output[0], axis=1)
    for out, states in zip(node.output[1:], finals):
        if out:
            e.stack(states, [1, rnn.batch, rnn.hidden], 0, out)


# ---- helpers ------------------------------------------------------------------------------
def _attributes(node) -> dict:
    """A node's attributes as Python values (strings decoded)."""
    from onnx import helper

    def decode(v):
        return v.decode() if isinstance(v, bytes) else v
    attrs = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        attrs[a.name] = [decode(x) for x in v] if isinstance(v, list) else decode(v)
    return attrs


def _refuse_unknown(node, attrs: dict, known: set[str]) -> None:
    """Refuse an attribute the decomposition does not model."""
    for name in attrs:
        if name not in known:
            raise CvmcError(f"{node.op_type} '{_label(node)}': attribute '{name}' is not "
                            f"supported by cvmc's decomposition of {node.op_type}")


def _shape(node, shapes: dict, k: int) -> list[int]:
    """The static shape of input k, refused where shape inference leaves it open."""
    shape = shapes.get(node.input[k])
    if shape is None or None in shape:
        raise CvmcError(f"{node.op_type} '{_label(node)}': the shape of its input "
                        f"'{node.input[k]}' is not static ({shape}); give the input shapes "
                        f"with --input-shape")
    return shape


def _constant_input(node, values: dict, k: int) -> np.ndarray:
    """The value of input k, which must be a constant."""
    if node.input[k] not in values:
        raise CvmcError(f"{node.op_type} '{_label(node)}': its input {k} "
                        f"('{node.input[k]}') must be a constant")
    return values[node.input[k]]


def _used(graph, skip=()) -> set[str]:
    """The names the graph's nodes (except those in `skip`) read, and its outputs."""
    skipped = {id(n) for n in skip}
    used = {i for n in graph.node if id(n) not in skipped for i in n.input if i}
    return used | {o.name for o in graph.output}


def _all_names(graph) -> set[str]:
    """Every tensor name of the graph."""
    names = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    names |= {o.name for o in graph.output}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
    return names


def _label(node) -> str:
    """How an error names an ONNX node: its name, else its first output."""
    return node.name or node.output[0]
