"""The float model at the level its author wrote it, and the float rewrites before calibration.

The frontend expands NNEF's compound fragments (`relu`, `sigmoid`, `batch_normalization`,
`linear`, `max_pool`, `softmax`, ...) into primitives; every primitive of one call keeps
the call's source position. `group_layers` folds each such run back into one *layer*
node named after the fragment (`Node.origin`), keeping its primitives as the
layer's body, so that the quantizer's rules see `sigmoid` rather than neg/exp/add/div.
`fold_batch_norm` then folds a per-channel affine layer (BatchNorm) into the conv before
it, and `fuse_elementwise` makes one layer of element-wise layers that compute from one
tensor. Each is a Graph -> Graph pass; `--dump-ir` prints the graphs between them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cvmc.errors import CvmcError
from cvmc.ir import Graph, Node, TensorType
from cvmc.ops import lookup
from cvmc.ops.registry import Attrs, Fusion
from cvmc.passes.simplify import fold_constants
from cvmc.reference import evaluate, stored


@dataclass
class Layers:
    """A graph whose nodes are layers, and the primitives of each compound layer (the
    integer graph the quantize pass hands on has none)."""

    graph: Graph
    bodies: dict[str, list[Node]] = field(default_factory=dict)

    def weights_of(self, node: Node) -> list[str]:
        """The inputs of a layer that are weights."""
        return [i for i in node.inputs if i in self.graph.constants]

    def activations_of(self, node: Node) -> list[str]:
        """The inputs of a layer that are not weights."""
        return [i for i in node.inputs if i not in self.graph.constants]

    def primitives(self) -> Graph:
        """The graph with each compound layer replaced by its body: what defines every
        value the graph types."""
        return self.graph.replace(nodes=[n for layer in self.graph.nodes
                                         for n in self.bodies.get(layer.name, [layer])])


def group_layers(graph: Graph) -> Layers:
    """Fold each run of primitives expanded from one fragment call into a layer node (after
    evaluating what depends on weights only: a reshaped weight, BatchNorm's sqrt(var + eps))."""
    graph = fold_constants(graph)
    runs: list[list[Node]] = []
    for node in graph.nodes:
        if runs and node.span is not None and runs[-1][-1].span == node.span:
            runs[-1].append(node)
        else:
            runs.append([node])
    nodes, bodies = [], {}
    for run in runs:
        if len(run) == 1:
            nodes.append(run[0])
            continue
        made = {o for n in run for o in n.outputs}
        ins = list(dict.fromkeys(i for n in run for i in n.inputs if i not in made))
        out = run[-1].outputs
        layer = Node(run[-1].origin or run[-1].op, tuple(ins), out, {}, run[-1].span)
        nodes.append(layer)
        bodies[layer.name] = run
    return Layers(graph.replace(nodes=nodes), bodies)


def run_layer(layers: Layers, node: Node, env: dict[str, np.ndarray]) -> None:
    """Evaluate one layer (its body, or the node itself) into `env`."""
    types = layers.graph.types
    for n in layers.bodies.get(node.name, [node]):
        env.update(zip(n.outputs, evaluate(n, [env[i] for i in n.inputs], types)))


def run_float(layers: Layers, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of the float graph on one set of inputs (shapes as declared)."""
    g = layers.graph
    env = {k: stored(np.asarray(v), g.types[k]) for k, v in feeds.items()}
    env.update({k: stored(v, g.types[k]) for k, v in g.constants.items()})
    for node in g.nodes:
        run_layer(layers, node, env)
    return env


def is_elementwise(layers: Layers, node: Node) -> bool:
    """One activation input, same shape out, and only element-wise primitives whose weights
    are scalars: the layer is one real function applied to every element (a LUT)."""
    g = layers.graph
    acts = layers.activations_of(node)
    if len(acts) != 1 or g.types[acts[0]].shape != g.types[node.name].shape:
        return False
    for n in layers.bodies.get(node.name, [node]):
        opdef = lookup(n.op)
        if opdef is None or opdef.fusion not in (Fusion.ELEMWISE, Fusion.BROADCAST):
            return False
        if any(i in g.constants and g.constants[i].size != 1 for i in n.inputs):
            return False
    return True


def apply_elementwise(layers: Layers, node: Node, x: np.ndarray) -> np.ndarray:
    """The function of an element-wise layer (`is_elementwise`) on any array of reals."""
    g = layers.graph
    (act,) = layers.activations_of(node)
    env = {act: np.asarray(x, np.float64)}
    env.update({k: v.reshape(()) for k, v in g.constants.items() if v.size == 1})
    with np.errstate(all="ignore"):
        for n in layers.bodies.get(node.name, [node]):
            outs = lookup(n.op).run_reference([env[i] for i in n.inputs], Attrs(n.attrs))
            for name, value in zip(n.outputs, outs):
                kind = g.types[name].dtype
                env[name] = np.asarray(value).astype(np.float32 if kind == "float32" else kind)
    return env[node.name].astype(np.float64)


def _affine(layers: Layers, node: Node, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(a, b) per channel (along `axis`) when the layer computes a * x + b of its one activation
    x, with every other input a weight; else None. Found by evaluating the layer at 0 and 1
    (two points fix an affine map) and checked at -3.5 and 2 (relu is not affine) and at
    random values."""
    g = layers.graph
    acts = layers.activations_of(node)
    if len(acts) != 1 or g.types[acts[0]].shape != g.types[node.name].shape \
            or g.types[node.name].ndim < 2:
        return None
    shape = g.types[acts[0]].shape
    env = {k: stored(v, g.types[k]) for k, v in g.constants.items()}

    def at(v: float) -> np.ndarray:
        env[acts[0]] = np.full(shape, v, np.float32)
        run_layer(layers, node, env)
        return env[node.name].astype(np.float64)
    f0, f1 = at(0.0), at(1.0)
    if not (np.isfinite(f0).all() and np.isfinite(f1).all()):
        return None  # calibration names the layer whose output is not finite
    a, b = f1 - f0, f0
    if not all(np.allclose(at(v), v * a + b, rtol=1e-4, atol=1e-6) for v in (-3.5, 2.0)):
        return None
    per_channel = [np.moveaxis(v, axis, 0).reshape(shape[axis], -1) for v in (a, b)]
    if not all(np.allclose(v, v[:, :1], rtol=1e-6, atol=1e-7) for v in per_channel):
        return None
    # and at a tensor of differing values (softmax maps every constant tensor to one value)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    env[acts[0]] = x
    run_layer(layers, node, env)
    if not np.allclose(env[node.name], x * a + b, rtol=1e-4, atol=1e-5):
        return None
    return per_channel[0][:, 0], per_channel[1][:, 0]


def _linear_parts(layers: Layers, node: Node):
    """(x, weight with output channels first, bias per channel) of a conv, of a matmul by
    a weight, or of a linear layer (matmul then add of a weight); else None."""
    g = layers.graph
    body = layers.bodies.get(node.name, [node])
    ops = [n.op for n in body]
    if ops == ["conv"] and all(i in g.constants for i in node.inputs[1:]):
        w = g.constants[node.inputs[1]].astype(np.float64)
        bias = g.constants[node.inputs[2]] if len(node.inputs) > 2 else np.zeros(w.shape[0])
    elif ops in (["matmul"], ["matmul", "add"]) and body[0].inputs[1] in g.constants \
            and not body[0].attrs.get("transposeA"):
        w = g.constants[body[0].inputs[1]].astype(np.float64)
        if w.ndim < 2 or any(d != 1 for d in w.shape[:-2]):
            return None
        w = w.reshape(w.shape[-2:])  # leading unit axes (an unsqueezed weight) dropped
        w = w if body[0].attrs.get("transposeB") else w.T
        consts = [i for i in body[-1].inputs if i in g.constants] if len(body) == 2 else []
        if len(body) == 2 and len(consts) != 1:
            return None
        bias = g.constants[consts[0]] if consts else np.zeros(w.shape[0])
    else:
        return None
    bias = np.broadcast_to(np.asarray(bias, np.float64).reshape(-1), (w.shape[0],))
    return body[0].inputs[0], w, bias


def fold_batch_norm(layers: Layers) -> Layers:
    """A per-channel affine layer (BatchNorm, or mul / add by per-channel weights) right
    after a conv, matmul or linear layer that nothing else reads is folded into its
    weights and bias (repeatedly: conv, BatchNorm, mul, add become one conv)."""
    g = layers.graph
    consumers = g.consumers()
    constants, types, bodies = dict(g.constants), dict(g.types), dict(layers.bodies)
    producers: dict[str, Node] = {}
    nodes: list[Node] = []
    for node in g.nodes:
        acts = layers.activations_of(node)
        prev = producers.get(acts[0]) if len(acts) == 1 else None
        parts = None if prev is None else \
            _linear_parts(Layers(g.replace(constants=constants, types=types), bodies), prev)
        affine = None
        if parts is not None and len(consumers[prev.name]) == 1 and prev.name not in g.outputs:
            # a conv's channels are axis 1, a matmul's the last
            affine = _affine(layers, node, 1 if prev.op == "conv" else -1)
        if affine is None:
            nodes.append(node)
            producers.update((o, node) for o in node.outputs)
            continue
        (a, b), (x, w, bias) = affine, parts
        w_name, b_name = f"{node.name}_folded_weight", f"{node.name}_folded_bias"
        with np.errstate(over="ignore"):  # beyond float32: calibration names the layer
            constants[w_name] = (w * a.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32)
            # NNEF broadcasts from the left: a conv's bias [1, C], a matmul's [1, ..., 1, C]
            b_shape = (1, w.shape[0]) if prev.op == "conv" else \
                (1,) * (g.types[node.name].ndim - 1) + (w.shape[0],)
            constants[b_name] = (bias * a + b).astype(np.float32).reshape(b_shape)
        types[w_name] = TensorType(w.shape, "float32")
        types[b_name] = TensorType(b_shape, "float32")
        if prev.op == "conv":
            folded = Node("conv", (x, w_name, b_name), node.outputs, prev.attrs, prev.span)
        else:  # a linear layer: matmul by the (output, input) weight, then the bias
            product = f"{node.name}__product"
            types[product] = types[node.name]
            folded = Node("linear", (x, w_name, b_name), node.outputs, {}, prev.span)
            bodies[node.name] = [
                Node("matmul", (x, w_name), (product,), {"transposeA": False,
                                                         "transposeB": True}, prev.span),
                Node("add", (product, b_name), node.outputs, {}, prev.span)]
        nodes[nodes.index(prev)] = folded
        bodies.pop(prev.name, None)
        if folded.op == "conv":
            bodies.pop(node.name, None)
        producers.update((o, folded) for o in node.outputs)
    used = {i for n in nodes for i in n.inputs}
    labels = {w: label for w, label in g.labels.items() if w not in constants or w in used}
    constants = {w: v for w, v in constants.items() if w in used}
    defined = {*g.inputs, *constants, *labels,
               *(o for n in nodes for b in bodies.get(n.name, [n]) for o in b.outputs)}
    types = {v: t for v, t in types.items() if v in defined}  # of what folding dropped
    return Layers(g.replace(nodes=nodes, constants=constants, types=types, labels=labels),
                  bodies)


def _pointwise(layers: Layers, node: Node) -> bool:
    """Element-wise primitives only, weights that are scalars, activations of the output's
    shape: each output element is a function of the same elements of the activations."""
    g = layers.graph
    acts = layers.activations_of(node)
    if not acts or any(g.types[a].shape != g.types[node.name].shape for a in acts):
        return False
    for n in layers.bodies.get(node.name, [node]):
        opdef = lookup(n.op)
        if opdef is None or opdef.fusion not in (Fusion.ELEMWISE, Fusion.BROADCAST) or any(
                i in g.constants and g.constants[i].size != 1 for i in n.inputs):
            return False
    return True


def fuse_elementwise(layers: Layers) -> Layers:
    """Element-wise layers that all compute from one activation x (hardswish's
    x * clamp(x + 3, 0, 6) / 6, swish's x * sigmoid(x)), and whose intermediate values
    nothing else reads, become one layer: one real function of x, one lookup table; then a
    division by such a layer becomes a product with its reciprocal."""
    g = layers.graph
    consumers = g.consumers()
    root: dict[str, str] = {}
    for node in g.nodes:
        if _pointwise(layers, node):
            roots = {root.get(a, a) for a in layers.activations_of(node)}
            if len(roots) == 1:
                root[node.name] = roots.pop()
    regions: dict[str, list[Node]] = {}
    for node in g.nodes:
        if node.name in root:
            regions.setdefault(root[node.name], []).append(node)
    bodies, merged = dict(layers.bodies), {}
    for x, members in regions.items():
        names = {m.name for m in members}
        exits = [m for m in members if m.name in g.outputs
                 or any(c.name not in names for c in consumers.get(m.name, []))]
        if len(members) < 2 or exits != [members[-1]]:
            continue
        last = members[-1]
        merged.update((m.name, None) for m in members[:-1])
        merged[last.name] = Node("+".join(m.op for m in members), (x,), last.outputs, {},
                                 last.span)
        bodies[last.name] = [n for m in members for n in bodies.pop(m.name, [m])]
    nodes = [merged.get(n.name, n) for n in g.nodes]
    return _reciprocal_divisors(Layers(g.replace(nodes=[n for n in nodes if n is not None]),
                                       bodies))


def _reciprocal_divisors(layers: Layers) -> Layers:
    """div(a, b) of two activations where b is an element-wise layer's f(v) that nothing
    else reads (LayerNorm's sqrt(var + eps)) becomes mul(a, b) with b = 1 / f(v): one table
    of the reciprocal."""
    g = layers.graph
    consumers, producer = g.consumers(), {n.name: n for n in g.nodes}
    types, bodies, nodes = dict(g.types), dict(layers.bodies), list(g.nodes)
    for k, node in enumerate(g.nodes):
        if node.op != "div" or node.name in bodies or len(layers.activations_of(node)) != 2:
            continue
        divisor = producer.get(node.inputs[1])
        if divisor is None or divisor.name in g.outputs or len(consumers[divisor.name]) != 1 \
                or not is_elementwise(layers, divisor):
            continue
        rcp = f"{divisor.name}__rcp"  # a new name: the report has no float twin of it
        types[rcp] = g.types[divisor.name]
        bodies[rcp] = [*bodies.pop(divisor.name, [divisor]),
                       Node("rcp", (divisor.name,), (rcp,), {}, divisor.span)]
        nodes[nodes.index(divisor)] = Node(f"{divisor.op}+rcp", divisor.inputs, (rcp,), {},
                                           divisor.span)
        nodes[k] = Node("mul", (node.inputs[0], rcp), node.outputs, {}, node.span)
    return Layers(g.replace(nodes=nodes, types=types), bodies)


def unsupported(node: Node, why: str) -> CvmcError:
    """The one error for a layer the quantizer's rules do not cover."""
    return CvmcError(f"cvmc quantize: layer '{node.name}' ({node.op}): {why}", node.span)
