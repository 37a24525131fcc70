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

import numpy as np

from cvmc.ir import Graph, Node
from cvmc.ops.infer import retype
from cvmc.ops.transformer import GELU_ERF
from cvmc.passes.target import Target


def fuse_transformer(graph: Graph, target: Target | None = None) -> Graph:
    """Rewrite every matched layer-normalization chain into one `layer_norm` node, every
    expanded softmax into one `fused_softmax`, every erf-form GELU into one `gelu_erf`,
    then attention's scores and their softmax into one `attention_scores`; the pipeline
    runs it for llvm."""
    consumers, outputs = graph.consumers(), set(graph.outputs)
    replaced: dict[int, Node] = {}  # id of the chain's last node -> the new node
    dropped: set[int] = set()
    producers = graph.producers()
    for node in graph.nodes:
        op, x, attrs = "layer_norm", node.inputs[0] if node.inputs else None, {}
        found = _layer_norm_chain(graph, node, consumers, outputs)
        if found is not None:
            attrs = {"axes": tuple(node.attrs["axes"]),
                     "epsilon": _constant(graph, found[-3].inputs[1])}
        elif (found := _softmax_chain(graph, node, consumers, outputs)) is not None:
            op, attrs = "fused_softmax", {"axes": tuple(node.attrs["axes"])}
        elif (gelu := _gelu_erf(graph, node, producers, consumers, outputs)) is not None:
            op, (x, found) = "gelu_erf", gelu
        if found is None or any(id(n) in dropped for n in found):
            continue
        last = found[-1]
        replaced[id(last)] = Node(op, (x,), last.outputs, attrs, span=last.span)
        dropped.update(id(n) for n in found)
    if replaced:
        graph = _rewrite(graph, replaced, dropped)
    return _fuse_attention(graph)


def _rewrite(graph: Graph, replaced: dict[int, Node], dropped: set[int]) -> Graph:
    """`graph` with each chain's last node replaced and the chain's other nodes dropped."""
    nodes = [replaced.get(id(n), n) for n in graph.nodes
             if id(n) in replaced or id(n) not in dropped]
    return retype(graph.replace(nodes=nodes))


def _fuse_attention(graph: Graph) -> Graph:
    """Rewrite every fused_softmax over the last axis of scaled scores, matmul(q * a,
    k * b) * c (each scale optional, a one-element constant), plus an optional additive
    mask, into one `attention_scores`."""
    consumers, outputs, producers = graph.consumers(), set(graph.outputs), graph.producers()
    replaced: dict[int, Node] = {}
    dropped: set[int] = set()
    for node in graph.nodes:
        if node.op == "fused_softmax" and \
                node.attrs["axes"] == (len(graph.types[node.inputs[0]].shape) - 1,):
            found = _attention_chain(graph, node, producers, consumers, outputs)
            if found is not None and not any(id(n) in dropped for n in found[0]):
                chain, inputs, attrs = found
                replaced[id(node)] = Node("attention_scores", inputs, node.outputs, attrs,
                                          span=node.span)
                dropped.update(id(n) for n in chain)
    return _rewrite(graph, replaced, dropped) if replaced else graph


def _attention_chain(graph: Graph, softmax: Node, producers, consumers, outputs):
    """(the chain's nodes, (q, k), attributes) of the scores `softmax` reads, else None."""
    def inner(value: str, op: str) -> Node | None:
        """The `op` node computing `value`, if the chain is its only reader."""
        node = producers.get(value)
        if node is None or node.op != op or value in outputs or \
                len(consumers.get(value, [])) != 1:
            return None
        return node

    def scaled(value: str) -> tuple[str, float, list[Node]]:
        """(x, c, [the mul]) where `value` = x * c, c a scalar keeping x's shape, else
        (value, 1.0, [])."""
        mul = inner(value, "mul")
        for x, c in (mul.inputs, mul.inputs[::-1]) if mul is not None else ():
            factor = _scalar(graph, producers, c)
            if factor is not None and graph.types[x].shape == graph.types[value].shape:
                return x, factor, [mul]
        return value, 1.0, []

    value, add = softmax.inputs[0], inner(softmax.inputs[0], "add")
    # an additive mask: the add's other operand, of the scores' rank (NNEF aligns left)
    for x, mask in (add.inputs, add.inputs[::-1]) if add is not None else ():
        if graph.types[x].shape == graph.types[value].shape and \
                len(graph.types[mask].shape) == len(graph.types[x].shape) and \
                graph.types[mask].dtype == "float32":
            found = _scores(graph, x, scaled, inner)
            if found is not None:
                chain, inputs, attrs = found
                return [*chain, add], (*inputs, mask), attrs
    return _scores(graph, value, scaled, inner)


def _scores(graph: Graph, value: str, scaled, inner):
    """(nodes, (q, k), attributes) of scores `value` = matmul(q * a, k * b) * c, else None."""
    scores, scale, post = scaled(value)
    matmul = inner(scores, "matmul")
    if matmul is None or matmul.attrs["transposeA"]:
        return None
    (q, q_scale, pre_q), (k, k_scale, pre_k) = (scaled(v) for v in matmul.inputs)
    shapes = [graph.types[v].shape for v in (q, k)]
    if len(shapes[0]) < 2 or shapes[0][:-2] != shapes[1][:-2] or \
            graph.types[q].dtype != "float32":
        return None  # broadcast batches stay a matmul
    attrs = {"q_scale": q_scale, "k_scale": k_scale, "scale": scale,
             "transposeB": bool(matmul.attrs["transposeB"])}
    return [*pre_q, *pre_k, matmul, *post], (q, k), attrs


def _scalar(graph: Graph, producers, name: str) -> float | None:
    """The value of a one-element float constant `name`, also through the unsqueeze or
    reshape that exporters put on a scalar before fold-constants runs, else None."""
    node = producers.get(name)
    if node is not None and node.op in ("unsqueeze", "nnef.reshape"):
        name = node.inputs[0]
    return _constant(graph, name)


def _layer_norm_chain(graph: Graph, mean: Node, consumers, outputs) -> list[Node] | None:
    """[mean, sub (one, or two computing x - mean alike, as `moments` text has), pow, var,
    add, pow, div] of a layer normalization starting at `mean`, else None."""
    if mean.op != "sum_reduce" or not mean.attrs["normalize"]:
        return None
    x, m = mean.inputs[0], mean.outputs[0]
    subs = consumers.get(m, [])
    if m in outputs or len(subs) not in (1, 2) or any(
            s.op != "sub" or s.inputs != (x, m) or s.outputs[0] in outputs or
            graph.types[s.outputs[0]].shape != graph.types[x].shape for s in subs):
        return None
    centered = [s.outputs[0] for s in subs]
    readers = [r for d in centered for r in consumers.get(d, [])]
    if len(readers) != 2:
        return None
    sole = _sole_reader(consumers, outputs)
    square = next((r for r in readers if r.op == "pow" and r.inputs[0] in centered
                   and _constant(graph, r.inputs[1]) == 2.0), None)
    var = square and sole(square, "sum_reduce")
    if var is None or not var.attrs["normalize"] or var.attrs["axes"] != mean.attrs["axes"]:
        return None
    add = sole(var, "add")
    if add is None or add.inputs[0] != var.outputs[0] or _constant(graph, add.inputs[1]) is None:
        return None
    root = sole(add, "pow")
    if root is None or _constant(graph, root.inputs[1]) != 0.5:
        return None
    div = sole(root, "div")
    if div is None or div.inputs[0] not in centered or div.inputs[1] != root.outputs[0] or \
            div not in readers:
        return None
    return [mean, *subs, square, var, add, root, div]


def _softmax_chain(graph: Graph, peak: Node, consumers, outputs) -> list[Node] | None:
    """[max_reduce, sub, exp, sum_reduce, div] of an expanded softmax starting at `peak`,
    else None."""
    if peak.op != "max_reduce":
        return None
    x = peak.inputs[0]
    sole = _sole_reader(consumers, outputs)
    sub = sole(peak, "sub")
    if sub is None or sub.inputs != (x, peak.outputs[0]) or \
            graph.types[sub.outputs[0]].shape != graph.types[x].shape:
        return None
    exp = sole(sub, "exp")
    e = exp and exp.outputs[0]
    readers = consumers.get(e, []) if e else []
    if exp is None or e in outputs or len(readers) != 2:
        return None
    total = next((r for r in readers if r.op == "sum_reduce"), None)
    if total is None or total.attrs["normalize"] or total.attrs["axes"] != peak.attrs["axes"]:
        return None
    div = sole(total, "div")
    if div is None or div.inputs != (e, total.outputs[0]) or div not in readers:
        return None
    return [peak, sub, exp, total, div]


def _gelu_erf(graph: Graph, root: Node, producers, consumers, outputs):
    """(x, the chain's nodes in graph order) of a GELU (`GELU_ERF`) whose last op is `root`,
    else None. Every node but the last is read inside the chain only and is no output."""
    if root.op != "mul":
        return None
    bind: dict[str, str] = {}
    matched: dict[int, Node] = {}
    if not _match(graph, producers, root.outputs[0], GELU_ERF, bind, matched):
        return None
    x = bind["x"]
    inside = set(matched)
    for node in matched.values():
        if node is root:
            continue
        value = node.outputs[0]
        if value in outputs or any(id(c) not in inside for c in consumers.get(value, [])):
            return None
    if graph.types[x].shape != graph.types[root.outputs[0]].shape:
        return None
    order = {id(n): k for k, n in enumerate(graph.nodes)}
    return x, sorted(matched.values(), key=lambda n: order[id(n)])


def _match(graph: Graph, producers, value: str, pattern, bind: dict, matched: dict) -> bool:
    """True if `value` is computed as `pattern` (a template of `cvmc.ops.transformer`;
    add and mul either way round), binding "x" in `bind` and the nodes in `matched`."""
    if pattern == "x":
        return bind.setdefault("x", value) == value
    if pattern[0] == "const":
        c = _constant(graph, value)
        return c is not None and np.float32(c) == np.float32(pattern[1])
    node = producers.get(value)
    if node is None or node.op != pattern[0] or len(node.inputs) != len(pattern) - 1:
        return False
    operands = pattern[1:]
    for order in (operands, operands[::-1]) if node.op in ("add", "mul") else (operands,):
        b, m = dict(bind), dict(matched)
        if all(_match(graph, producers, v, p, b, m) for v, p in zip(node.inputs, order)):
            bind.update(b)
            matched.update(m)
            matched[id(node)] = node
            return True
    return False


def _sole_reader(consumers, outputs):
    """`sole(node, op)`: the one reader of `node`'s result, if it is an `op` node and the
    result is no graph output, else None."""
    def sole(node: Node, op: str) -> Node | None:
        readers = consumers.get(node.outputs[0], [])
        if node.outputs[0] in outputs or len(readers) != 1 or readers[0].op != op:
            return None
        return readers[0]
    return sole


def _constant(graph: Graph, name: str) -> float | None:
    """The value of a one-element float constant `name`, else None."""
    value = graph.constants.get(name)
    if value is None or value.size != 1 or value.dtype != np.float32:
        return None
    return float(value.reshape(()))
