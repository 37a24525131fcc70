"""Graph nodes -> TE -> PrimFuncs, and a whole graph -> IRModule + execution plan.

Kernel inputs and outputs use the tensors' storage dtypes (int8 / int32 / float32 /
bool); an op's `lower` rule sees int32 views of its integer inputs (inlined casts) and
float32 / bool inputs as they are, and returns tensors that are cast to the output
storage dtype here. The precision rules guarantee that an integer cast never changes a
value.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from cvmc.errors import CvmcError
from cvmc.ir import Graph, Node, TensorType
from cvmc.lowering.rules import kernel_facts
from cvmc.ops import lookup
from cvmc.ops.arith import node_ops
from cvmc.ops.fastmath import polynomial_exp
from cvmc.ops.infer import intervals
from cvmc.ops.registry import Attrs
from cvmc.ops.te import ANCHOR_ATTR
from cvmc.passes.fusion import Group, kernel_groups
from cvmc.passes.target import Target


def node_compute(node: Node, types: Mapping[str, TensorType], inputs: Mapping[str, object]):
    """TE outputs of `node`, reading its inputs from `inputs` (name -> te.Tensor)."""
    from cvmc.ops.te import cast, convert

    views = []
    for name in node.inputs:
        t = inputs[name]
        integer = types[name].is_integer
        views.append(cast(t, "int32", f"{name}_i32") if integer and t.dtype != "int32" else t)
    outs = lookup(node.op).run_lower(views, Attrs(node.attrs))
    result = []
    for name, out in zip(node.outputs, outs):
        dtype = types[name].dtype
        result.append(out if out.dtype == dtype else convert(out, dtype, f"{name}_cast"))
    return result


def lower_kernel(nodes: Sequence[Node], inputs: Sequence[str], outputs: Sequence[str],
                 types: Mapping[str, TensorType], symbol: str, target: Target,
                 scratch: bool = False, facts: Mapping[str, object] | None = None):
    """(PrimFunc `symbol(inputs..., outputs..., scratch...)` for `target`, scratch specs).
    exp is the polynomial where `target.polynomial_exp` (`with_polynomial_exp`); `facts`
    are attributes of the PrimFunc that its schedule row reads (`kernel_facts`).

    With `scratch`, every stage that cannot be inlined (a reduction or extern stage that
    is not an output) becomes a trailing argument the caller allocates: CUDA kernels built
    for `cuda_host` cannot allocate global memory themselves. Specs are (shape, dtype).
    """
    from cvmc.ops.te import te

    # `n_`: a value may be named like a C++ keyword (`and`, `new`), which CUDA source cannot
    # take as a parameter name
    env = {n: te.placeholder(types[n].shape, types[n].dtype, name=f"{n}_") for n in inputs}
    for node in nodes:
        env.update(zip(node.outputs, node_compute(node, types, env)))
    outs, seen = [], set()
    for name in outputs:
        t = env[name]
        # A kernel output must be a fresh compute stage: an op may return its input
        # unchanged (identity, a no-op reshape) or two outputs may share one tensor.
        if isinstance(t.op, te.PlaceholderOp) or t in seen:
            t = te.compute(t.shape, _copy_of(t), name=f"{name}_copy")
        seen.add(t)
        outs.append(t)
    extra = _materialized_stages(outs) if scratch else []
    args = [env[n] for n in inputs] + outs + extra
    # The anchor op (a group's first node) selects the kernel's rule in the schedule table.
    func = te.create_prim_func(args).with_attr("global_symbol", symbol) \
        .with_attr(ANCHOR_ATTR, nodes[0].op)
    for key, value in (facts or {}).items():
        func = func.with_attr(key, value)
    if target.polynomial_exp:
        func = with_polynomial_exp(func)
    return func, [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in extra]


def with_polynomial_exp(func):
    """The PrimFunc `func` with every call to expf (`cvmc.ops.fastmath.te_exp`) replaced
    by the polynomial (`polynomial_exp`)."""
    import tvm
    import tvm_ffi

    extern = tvm.ir.Op.get("tirx.call_pure_extern")

    def call(value, mutator):
        if value.op.same_as(extern) and value.args[0].value == "expf":
            return polynomial_exp(mutator.mutate(value.args[1]))
        return mutator.default_mutate(value)

    return tvm_ffi.structural_mutate(func, [(tvm.ir.expr.Call, call)])


def needs_global_memory(func, target: Target, table: Sequence) -> bool:
    """True if `func`, scheduled for the GPU of `target` (the rows of the schedule table
    `table`, then dlight), still allocates a global intermediate buffer, or if one of its
    reductions reads another's result (argmax: the maximum, then its index): dlight cannot
    keep that on chip, and TVM's fallback then needs a global workspace, which CUDA kernels
    built for `cuda_host` cannot allocate."""
    import tvm
    from tvm import s_tir

    from cvmc.lowering.rules import schedule_cuda_module

    mod, _ = schedule_cuda_module(tvm.IRModule({"f": func}), target, table)
    allocs = [line for line in mod.script().splitlines() if "alloc_buffer(" in line]
    if any("scope=" not in line or 'scope="global"' in line for line in allocs):
        return True
    sch = s_tir.Schedule(tvm.IRModule({"f": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root", func_name="f"))]
    reductions = [b for b in blocks if any(it.iter_type == 2 for it in b.iter_vars)]
    results = [w.source for b in reductions for w in b.writes]
    return any(r.source.same_as(w) for b in reductions for r in b.reads for w in results
               if not any(r.source.same_as(own.source) for own in b.writes))


def _materialized_stages(outs) -> list:
    """Reduction and extern stages feeding `outs` (they get a buffer of their own)."""
    from cvmc.ops.te import te

    found, visited = [], set()

    def visit(op) -> None:
        if op in visited or isinstance(op, te.PlaceholderOp):
            return
        visited.add(op)
        for t in op.input_tensors:
            visit(t.op)
        if isinstance(op, te.ExternOp) or (isinstance(op, te.ComputeOp) and op.reduce_axis):
            found.extend(op.output(i) for i in range(op.num_outputs))

    for t in outs:
        visit(t.op)
    return [t for t in found if t not in outs]


def _copy_of(t):
    """Index function copying `t` (a closure: TE lambdas cannot take default arguments)."""
    return lambda *i: t(*i)


def lower_node(node: Node, types: Mapping[str, TensorType], symbol: str, target: Target):
    """A PrimFunc `symbol(inputs..., outputs...)` computing one node for `target`."""
    return lower_kernel([node], list(dict.fromkeys(node.inputs)), list(node.outputs), types,
                        symbol, target)[0]


def nbytes(t: TensorType) -> int:
    """Storage size of a tensor in bytes."""
    return t.size * np.dtype(t.dtype).itemsize


def lower_graph(graph: Graph, target: Target, prefix: str = "k", table: Sequence = ()):
    """(IRModule of one PrimFunc per fused group, groups, execution plan dict) of `graph`
    for `target`. The groups are the partition the graph carries (the fuse-kernels pass,
    the last of every target's passes); a graph without one is a CvmcError.

    Kernel symbols are `<prefix><index>_<ops>`; a kernel that computes what an earlier one
    does, on buffers of the same shapes, calls that one's function (`share_identical`).
    For cuda, a kernel whose non-inlinable intermediate stages its schedule (the rows of
    the backend's schedule table `table`, then dlight) would keep in global memory takes
    them as scratch buffers the runtime allocates (`needs_global_memory`).
    """
    import tvm

    cuda = target.kind == "cuda"
    for node in graph.nodes:
        if target.kind not in lookup(node.op).backends:
            raise CvmcError(f"{node.op} ('{node.outputs[0]}'): a layout of the "
                            f"{'/'.join(lookup(node.op).backends)} backend, which its own "
                            f"passes write; --target {target.kind} does not compile it")
    if graph.nodes and not graph.kernels:
        raise CvmcError("lower_graph: the graph has no kernel partition; run the target's "
                        "passes (fuse-kernels last) first")
    groups = kernel_groups(graph)
    funcs, scratch = {}, {}
    proven = functools.cache(lambda: intervals(graph))
    for index, group in enumerate(groups):
        ops = "_".join(dict.fromkeys(op.replace(".", "_") for op in group.ops))
        symbol = f"{prefix}{index}_{ops}"[:60]  # a C identifier (nnef.abs -> nnef_abs)
        facts = kernel_facts(group.nodes[0], proven, target, table)
        funcs[symbol], specs = lower_kernel(group.nodes, group.inputs, group.outputs,
                                            graph.types, symbol, target, facts=facts)
        if cuda and needs_global_memory(funcs[symbol], target, table):
            funcs[symbol], specs = lower_kernel(group.nodes, group.inputs, group.outputs,
                                                graph.types, symbol, target, scratch=True)
        scratch[symbol] = [{"name": f"{symbol}.scratch{i}", "shape": list(shape),
                            "dtype": dtype, "bytes": int(np.prod(shape, dtype=np.int64))
                            * np.dtype(dtype).itemsize} for i, (shape, dtype) in enumerate(specs)]
    plan = execution_plan(graph, groups, list(funcs))
    for kernel in plan["kernels"]:
        kernel["args"] += [s["name"] for s in scratch[kernel["symbol"]]]
        plan["buffers"] += scratch[kernel["symbol"]]
    plan["arena"] = plan_arena(plan)
    return tvm.IRModule(share_identical(funcs, plan)), groups, plan


def share_identical(funcs: dict, plan: dict) -> dict:
    """The functions to build: one for each set of structurally equal kernels (names aside),
    whose calls in `plan` all take the first one's symbol, each with its own arguments. A
    model of repeated blocks, or a long element-wise chain cut into equal groups, builds
    each distinct kernel once."""
    import tvm_ffi

    bodies: dict[str, object] = {}  # each kept function without its name
    by_hash: dict[int, list[str]] = {}
    shared: dict[str, str] = {}
    for symbol, func in funcs.items():
        body = func.without_attr("global_symbol")
        candidates = by_hash.setdefault(tvm_ffi.structural_hash(body), [])
        same = next((s for s in candidates if tvm_ffi.structural_equal(body, bodies[s])), None)
        if same is None:
            bodies[symbol] = body
            candidates.append(symbol)
        else:
            shared[symbol] = same
    for kernel in plan["kernels"]:
        kernel["symbol"] = shared.get(kernel["symbol"], kernel["symbol"])
    return {symbol: funcs[symbol] for symbol in bodies}


def plan_arena(plan: dict) -> dict:
    """Offsets of the intermediate buffers in one arena: a buffer may reuse bytes of any
    buffer whose lifetime (first writer to last user, in kernel order) is disjoint from
    its own. Greedy, largest first, lowest 64-byte aligned offset that fits."""
    from cvmc_runtime import ARENA_ALIGNMENT, buffer_lifetimes, tensor_bytes

    life = buffer_lifetimes(plan)
    placed: list[tuple[int, int, tuple[int, int]]] = []  # (start, end, lifetime)
    offsets = {}
    for spec in sorted(plan["buffers"], key=lambda b: -tensor_bytes(b)):
        size, (first, last) = tensor_bytes(spec), life[spec["name"]]
        offset = 0
        for start, end, (f, g) in sorted(placed):
            if f <= last and first <= g and offset < end and start < offset + size:
                offset = -(-end // ARENA_ALIGNMENT) * ARENA_ALIGNMENT
        offsets[spec["name"]] = offset
        placed.append((offset, offset + size, (first, last)))
    return {"bytes": max((end for _, end, _ in placed), default=0), "offsets": offsets}


def _spec(graph: Graph, name: str) -> dict:
    t = graph.types[name]
    return {"name": name, "shape": list(t.shape), "dtype": t.dtype, "precision": t.precision}


def execution_plan(graph: Graph, groups: list[Group], symbols: list[str]) -> dict:
    """The JSON-ready plan: signature, weights, intermediate buffers, kernel calls, memory."""
    # A weight is stored when a kernel reads it or when it is itself a graph output (a
    # weight passed straight out, or an output that constant folding computed).
    weights = [w for w in graph.weights()
               if w in graph.outputs or any(w in g.inputs for g in groups)]
    io = set(graph.inputs) | set(graph.outputs) | set(weights)
    buffers = [v for g in groups for v in g.outputs if v not in io]
    kernels = [{"symbol": s, "ops": g.ops, "args": [*g.inputs, *g.outputs],
                "num_inputs": len(g.inputs),
                "arith_ops": sum(node_ops(n, graph.types) for n in g.nodes)}
               for s, g in zip(symbols, groups)]
    return {
        "inputs": [_spec(graph, n) for n in graph.inputs],
        "outputs": [_spec(graph, n) for n in graph.outputs],
        "weights": [_spec(graph, n) for n in weights],
        "buffers": [{**_spec(graph, n), "bytes": nbytes(graph.types[n])} for n in buffers],
        "kernels": kernels,
        "weight_bytes": sum(nbytes(graph.types[w]) for w in weights),
        "peak_activation_bytes": peak_activation_bytes(graph, groups),
    }


def peak_activation_bytes(graph: Graph, groups: list[Group]) -> int:
    """Largest total size of live activations (inputs, buffers, outputs) over the kernels.

    A value is live from the kernel that writes it (graph inputs: from the start) to the
    last kernel that reads it (graph outputs: to the end).
    """
    first = {v: -1 for v in graph.inputs}
    first.update({v: i for i, g in enumerate(groups) for v in g.outputs})
    last = dict(first)
    last.update({v: i for i, g in enumerate(groups) for v in g.inputs if v in first})
    last.update({v: len(groups) for v in graph.outputs})
    steps = range(-1, len(groups))
    return max(sum(nbytes(graph.types[v]) for v in first if first[v] <= step <= last[v])
               for step in steps)
