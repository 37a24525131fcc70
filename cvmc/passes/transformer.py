"""Transformer patterns as single ops (`cvmc/ops/transformer.py`): the chains an exporter
writes for a layer normalization become one `layer_norm` node, so the compiled model runs
one kernel (with the scale and shift fused under it) instead of seven; softmax and GELU
likewise (one kernel instead of four, and of three or four).

Matched (NNEF-Tools on PyTorch's decomposed layer_norm, and `moments`-style text):

    m = sum_reduce(x, axes, normalize = true)   # mean_reduce
    d = sub(x, m)
    p = pow(d, 2.0)                              # sqr
    v = sum_reduce(p, axes, normalize = true)
    a = add(v, eps)                              # eps: a constant of one element
    s = pow(a, 0.5)                              # sqrt
    y = div(d, s)

and NNEF's softmax fragment, expanded, becomes one `fused_softmax` node:

    m = max_reduce(x, axes);  e = exp(sub(x, m));  y = div(e, sum_reduce(e, axes))

and GELU in its erf form, with NNEF-Tools' erf fragment expanded (`GELU_ERF`, 21 ops), one
`gelu_erf`. Then attention's scores, as NNEF-Tools converts PyTorch's attention (ONNX
opset 14), become one `attention_scores` node (one kernel, `cvmc/lowering/attention.py`):

    s = matmul(mul(q, a), mul(k, b));  t = add(mul(s, c), mask);  y = fused_softmax(t, [-1])

(each mul by a one-element constant, and the mask, optional; k read transposed by the
matmul's transposeB or transposed before). In each, every intermediate has no reader
outside the chain and is no graph output. Each op's reference rule is its chain: the
reference interpreter's result is the same bits.
"""
from __future__ import annotations

import itertools

import numpy as np

from cvmc.ir import Graph, Node
from cvmc.ir.rewrite import Editor, Match, P, Pattern, Rule, V, apply_rules
from cvmc.ops.infer import infer_node
from cvmc.ops.transformer import GELU_ERF
from cvmc.passes.target import Target


def _constant(graph: Graph, name: str) -> float | None:
    """The value of a one-element float constant `name`, else None."""
    value = graph.constants.get(name)
    if value is None or value.size != 1 or value.dtype != np.float32:
        return None
    return float(value.reshape(()))


def _const(value: float | None = None) -> Pattern:
    """A one-element float constant (of `value`, compared as float32)."""
    def test(e: Editor, name: str) -> bool:
        c = _constant(e.graph, name)
        return c is not None and (value is None or np.float32(c) == np.float32(value))
    return V(where=test)


def _normalized(normalize: bool):
    return lambda e, n: bool(n.attrs["normalize"]) == normalize


def _keeps_x(e: Editor, node: Node) -> bool:
    """A node whose result has the shape of its first input (no broadcast beyond it)."""
    return e.types[node.outputs[0]].shape == e.types[node.inputs[0]].shape


# y = div(d, pow(add(mean_reduce(pow(d, 2.0)), eps), 0.5)), d = sub(x, mean_reduce(x)):
# one sub, or two computing x - mean alike (as `moments` text has)
_MEAN = P("sum_reduce", V("x"), name="mean", where=_normalized(True))
LAYER_NORM = P("div", P("sub", V("x"), _MEAN, where=_keeps_x),
               P("pow", P("add", P("sum_reduce", P("pow", P("sub", V("x"), _MEAN, where=_keeps_x),
                                                   _const(2.0)),
                                   name="var", where=_normalized(True)),
                          V("eps", where=lambda e, v: _constant(e.graph, v) is not None)),
                 _const(0.5)))
# y = div(e, sum_reduce(e)), e = exp(sub(x, max_reduce(x))): NNEF's softmax, expanded
_EXP = P("exp", P("sub", V("x"), P("max_reduce", V("x"), name="peak"), where=_keeps_x),
         name="e")
SOFTMAX = P("div", _EXP, P("sum_reduce", _EXP, name="total", where=_normalized(False)))


def _layer_norm(m: Match, e: Editor) -> Node | None:
    axes = m["mean"].attrs["axes"]
    if m["var"].attrs["axes"] != axes:
        return None
    return Node("layer_norm", (m["x"],), m.root.outputs,
                {"axes": tuple(axes), "epsilon": _constant(e.graph, m["eps"])},
                span=m.root.span)


def softmax_axes(m: Match) -> tuple[int, ...] | None:
    """The axes of a `SOFTMAX` match: its max and its sum reduce the same ones (else
    None)."""
    axes = tuple(m["peak"].attrs["axes"])
    return axes if tuple(m["total"].attrs["axes"]) == axes else None


def _softmax(m: Match, e: Editor) -> Node | None:
    axes = softmax_axes(m)
    return None if axes is None else \
        Node("fused_softmax", (m["x"],), m.root.outputs, {"axes": axes}, span=m.root.span)


def _template(t) -> Pattern:
    """The pattern of a `cvmc.ops.transformer` template (add and mul either way round)."""
    if t == "x":
        return V("x")
    if t[0] == "const":
        return _const(t[1])
    return P(t[0], *map(_template, t[1:]), commute=t[0] in ("add", "mul"))


def _gelu(m: Match, e: Editor) -> Node | None:
    if e.types[m["x"]].shape != e.types[m.root.outputs[0]].shape:
        return None
    return Node("gelu_erf", (m["x"],), m.root.outputs, {}, span=m.root.span)


# ---- attention's scores: fused_softmax(add(mul(matmul(mul(q, a), mul(k, b)), c), mask)) --
def _scalar(e: Editor, name: str) -> float | None:
    """The value of a one-element float constant `name`, also through the unsqueeze or
    reshape that exporters put on a scalar before fold-constants runs, else None."""
    node = e.producers.get(name)
    if node is not None and node.op in ("unsqueeze", "nnef.reshape"):
        name = node.inputs[0]
    return _constant(e.graph, name)


def _scaled(inner: Pattern, scale: str, optional: bool) -> list[Pattern]:
    """`inner` times a scalar bound to `scale` (either way round), and, if `optional`,
    `inner` alone."""
    mul = P("mul", inner, V(scale, where=lambda e, v: _scalar(e, v) is not None),
            commute=True, name=f"{scale}_mul")
    return [mul, inner] if optional else [mul]


def _attention_patterns() -> list[Pattern]:
    """Every form of the scores (each scale and the mask optional), most complete first."""
    patterns = []
    for mask, post, q, k in itertools.product(
            (True, False), *([True, False],) * 3):
        matmul = P("matmul", _scaled(V("q"), "a", True)[0 if q else 1],
                   _scaled(V("k"), "b", True)[0 if k else 1], name="matmul",
                   where=lambda e, n: not n.attrs["transposeA"])
        scores = _scaled(matmul, "c", True)[0 if post else 1]
        root = P("add", scores, V("mask"), commute=True, name="add") if mask else scores
        patterns.append(P("fused_softmax", root, where=lambda e, n: tuple(n.attrs["axes"]) == (
            e.types[n.inputs[0]].ndim - 1,)))
    return patterns


def _attention(m: Match, e: Editor) -> Node | None:
    q, k, t = m["q"], m["k"], e.types
    for x, scale in (("q", "a"), ("k", "b"), ("matmul", "c")):
        mul = m.bound.get(f"{scale}_mul")
        inner = m[x].outputs[0] if x == "matmul" else m[x]
        if mul is not None and t[inner].shape != t[mul.outputs[0]].shape:
            return None  # a scalar that broadcasts x to another shape
    if "mask" in m.bound:
        scores = next(i for i in m["add"].inputs if i != m["mask"])
        mask = t[m["mask"]]
        if t[scores].shape != t[m.root.inputs[0]].shape or mask.dtype != "float32" or \
                mask.ndim != t[scores].ndim:
            return None
    shapes = [t[v].shape for v in (q, k)]
    if len(shapes[0]) < 2 or shapes[0][:-2] != shapes[1][:-2] or t[q].dtype != "float32":
        return None  # broadcast batches stay a matmul

    def factor(scale: str) -> float:
        return _scalar(e, m[scale]) if f"{scale}_mul" in m.bound else 1.0
    attrs = {"q_scale": factor("a"), "k_scale": factor("b"), "scale": factor("c"),
             "transposeB": bool(m["matmul"].attrs["transposeB"])}
    inputs = (q, k, m["mask"]) if "mask" in m.bound else (q, k)
    return Node("attention_scores", inputs, m.root.outputs, attrs, span=m.root.span)


TRANSFORMER_RULES = [
    Rule(LAYER_NORM, _layer_norm),
    Rule(SOFTMAX, _softmax),
    Rule(_template(GELU_ERF), _gelu),
    *(Rule(p, _attention) for p in _attention_patterns()),
]


def fuse_transformer(graph: Graph, target: Target | None = None) -> Graph:
    """Rewrite every matched layer-normalization chain into one `layer_norm` node, every
    expanded softmax into one `fused_softmax`, every erf-form GELU into one `gelu_erf`,
    and attention's scores with their softmax into one `attention_scores`
    (`TRANSFORMER_RULES`); the pipeline runs it for llvm."""
    return apply_rules(graph, TRANSFORMER_RULES, infer_node)
