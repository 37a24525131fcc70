"""CPU schedules of float row reductions: `sum_reduce` (mean_reduce, global average
pooling), `layer_norm` (instance normalization is layer_norm over H*W) and
`fused_softmax`, each with its element-wise epilogue.

A row is one output of the reduction: all of it runs in one parallel step, so the bits do
not depend on the thread count. Over innermost (contiguous) axes, the row's K elements are
summed into L partial sums held in vector lanes (L = the largest divisor of K up to 8; a
prime K keeps one sum in order):
element k goes to lane k mod L, in the order k = 0, 1, ...; then the L partial sums are
added in lane order. That is another fixed order of the same K terms: `sum_reduce`'s bound
gamma(K + 2) * sum(|terms|) (docs/float.md) holds for any order. Over outer axes (NCHW
summed over C), the contiguous axis is in the lanes and each output sums its K terms in
the order k = 0, 1, ..., as the default schedule does.

layer_norm takes two vectorised passes over its row for the statistics (the mean, then the
sum of the squares of x - mean: the reference's formula, so its bound stays as it is) and a
third for the output with the scale and shift fused. fused_softmax: the row's max (exact in
any order), then exp(x - max) once per element into a row buffer, the sum of those in lanes
as above, and the division, each vectorised.
"""
from __future__ import annotations

from cvmc.lowering.schedule import epilogue_under, inline_all, largest_divisor, root_blocks

_LANES = 8  # float32 lanes of one AVX2 register


def _reduced(sch, block) -> int:
    """How many reduction iterators `block` has."""
    return sum(1 for it in sch.get(block).iter_vars if it.iter_type != 0)


def _reduction_blocks(sch, func_name: str):
    """([(reduction block, its reduction iterators)], [the other blocks]) of the kernel."""
    blocks = [(b, _reduced(sch, b)) for b in root_blocks(sch, func_name)]
    return [b for b in blocks if b[1]], [b for b, n in blocks if not n]


def _reduces_trailing(sch, block) -> bool:
    """True if the block's reduction iterators index the last axes of the input it reads,
    in order (a row reduction over contiguous memory)."""
    node = sch.get(block)
    reduced = [it.var for it in node.iter_vars if it.iter_type != 0]
    source = next(r for r in node.reads
                  if not any(r.source.same_as(w.source) for w in node.writes))
    last = [d.min for d in source.region[-len(reduced):]]
    return len(last) == len(reduced) and all(i.same_as(v) for i, v in zip(last, reduced))


def rfactor_lanes(sch, block, lanes: int = _LANES):
    """Split `block`'s reduction (its loops last, over innermost axes of its input) into
    partial sums over a lane axis (rfactor); `block` then adds the lanes in lane order.
    The partial block, or None for a row of prime length (one sum in order). Call before
    moving either block: `vectorize_lanes` then vectorises the partial one where it is."""
    loops, reductions = sch.get_loops(block), _reduced(sch, block)
    k = sch.fuse(*loops[-reductions:]) if reductions > 1 else loops[-1]
    width = largest_divisor(int(sch.get(k).extent), lanes)
    if width == 1:
        return None
    _, lane = sch.split(k, [None, width])
    return sch.rfactor(lane, factor_axis=0)


def vectorize_lanes(sch, partial, row) -> None:
    """The partial sums' block (`rfactor_lanes`), computed under `row`: the lanes (its
    first axis, the first loop under `row`) moved innermost and vectorised, init too."""
    loops = sch.get_loops(partial)
    position = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(row)))
    lane, outer = loops[position + 1], loops[-1]
    sch.reorder(outer, lane)
    sch.vectorize(lane)
    init = sch.decompose_reduction(partial, outer)
    sch.vectorize(sch.get_loops(init)[-1])


def _columns_in_lanes(sch, block, lanes: int = _LANES) -> None:
    """A reduction over outer axes: the block's last spatial loop (its input's contiguous
    axis) split into vector lanes under the reduction loops."""
    loops = sch.get_loops(block)
    spatial, reduced = loops[:-_reduced(sch, block)], loops[-_reduced(sch, block):]
    column, lane = sch.split(spatial[-1], [None, largest_divisor(
        int(sch.get(spatial[-1]).extent), lanes)])
    sch.reorder(column, *reduced, lane)
    sch.vectorize(lane)
    init = sch.decompose_reduction(block, reduced[0])
    sch.vectorize(sch.get_loops(init)[-1])


def schedule_sum_rows(sch, func_name: str) -> None:
    """A float sum_reduce kernel (with its normalize division and element-wise epilogue):
    one parallel step per row of outputs, the sum in vector lanes; ValueError for any
    other kernel."""
    inline_all(sch, func_name)
    reductions, _ = _reduction_blocks(sch, func_name)
    if len(reductions) != 1 or sch.get(reductions[0][0]).name_hint != "sum_reduce_":
        raise ValueError(f"{func_name}: not one sum_reduce block")
    (block, count), = reductions
    spatial = len(sch.get_loops(block)) - count
    if _reduces_trailing(sch, block):
        partial = rfactor_lanes(sch, block)
        row = _fused_rows(sch, block, spatial)
        _compute_at(sch, [partial], [partial], row)
        epilogue_under(sch, block, row)
        return
    # over other axes: rows are all but the last spatial loop, which goes in the lanes
    if spatial < 2:
        raise ValueError(f"{func_name}: no row loop outside the contiguous axis")
    row = _fused_rows(sch, block, spatial - 1)
    epilogue_under(sch, block, row)
    _columns_in_lanes(sch, block)


def _fused_rows(sch, block, count: int):
    """The first `count` loops of `block` fused into one parallel loop."""
    rows = sch.get_loops(block)[:count]
    if not rows:
        raise ValueError("no row loop outside the reduced axes")
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    sch.parallel(row)
    return row


def _compute_at(sch, blocks, partials, row) -> None:
    """Each of `blocks` (consumers first; None skipped) computed under `row`, then each of
    `partials` (`rfactor_lanes`' blocks among them) vectorised over its lanes."""
    for block in blocks:
        if block is not None:
            sch.compute_at(block, row, preserve_unit_loops=True)
    for partial in partials:
        if partial is not None:
            vectorize_lanes(sch, partial, row)


def _vectorize_row(sch, block) -> None:
    """The block's loops under its row loop fused, the inner part of them in lanes."""
    inner = sch.get_loops(block)[1:]
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    _, lane = sch.split(fused, [None, largest_divisor(int(sch.get(fused).extent), _LANES)])
    sch.vectorize(lane)


def schedule_layer_norm(sch, func_name: str) -> None:
    """A layer_norm kernel over trailing axes (with its scale and shift): rows parallel,
    the mean and the centred sum of squares each in vector lanes, then the output
    vectorised; ValueError for any other kernel."""
    inline_all(sch, func_name)
    reductions, others = _reduction_blocks(sch, func_name)
    names = [sch.get(b).name_hint for b, _ in reductions]
    if names != ["layer_norm_sum", "layer_norm_var"] or len(others) != 1:
        raise ValueError(f"{func_name}: not a layer_norm kernel")
    (total, count), (var, _) = reductions
    if not _reduces_trailing(sch, total):
        raise ValueError(f"{func_name}: layer_norm over axes that are not the last ones")
    partials = [rfactor_lanes(sch, total), rfactor_lanes(sch, var)]
    output = others[0]
    row = _fused_rows(sch, output, len(sch.get_loops(output)) - count)
    _vectorize_row(sch, output)
    _compute_at(sch, [var, partials[1], total, partials[0]], partials, row)


def schedule_softmax(sch, func_name: str) -> None:
    """A fused_softmax kernel over its last axes: rows parallel, the max and the sum of
    the exps in vector lanes, each exp computed once into a row buffer, the division
    vectorised; ValueError for any other kernel."""
    blocks = {sch.get(b).name_hint: b for b in root_blocks(sch, func_name)}
    if set(blocks) != {"softmax_max", "softmax_exp", "softmax_sum", "fused_softmax"}:
        raise ValueError(f"{func_name}: not a fused_softmax kernel")
    peak, total, output = blocks["softmax_max"], blocks["softmax_sum"], blocks["fused_softmax"]
    if not _reduces_trailing(sch, peak):
        raise ValueError(f"{func_name}: softmax over axes that are not the last ones")
    count = _reduced(sch, peak)
    partials = [rfactor_lanes(sch, peak), rfactor_lanes(sch, total)]
    row = _fused_rows(sch, output, len(sch.get_loops(output)) - count)
    _vectorize_row(sch, output)
    _compute_at(sch, [total, partials[1], blocks["softmax_exp"], peak, partials[0]], partials,
                row)
    _vectorize_row(sch, blocks["softmax_exp"])
