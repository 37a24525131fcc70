"""CPU schedule of the `attention_scores` kernel (cvmc/ops/transformer.py): softmax over
the key axis of (q * a) @ (k * b) * c, one (batch..., query row) at a time.

The parallel loop runs over the rows. Under each, the row of scores is computed into a
row buffer, the D products of each score summed in the order d = 0, 1, ... with the key
axis in the vector lanes (k's rows are contiguous along it: the exporters' explicit
transpose of K puts the key axis last); then the row's max, its exps (once each, into a
second row buffer, vectorised: the CPU's exp is a polynomial, cvmc/ops/fastmath.py), their
sum in key order, and the division, vectorised. A row is one
thread's, so the result has the same bits at any TVM_NUM_THREADS.
"""
from __future__ import annotations

from cvmc.lowering.schedule import root_blocks

# The blocks of `attention_scores`' lower rule, by name: producers first.
_DOT, _SCALED, _MAX, _EXP, _SUM = ("attention_dot", "attention_scores_scaled", "softmax_max",
                                   "softmax_exp", "softmax_sum")


def schedule_attention(sch, func_name: str) -> None:
    """Schedule the attention_scores kernel `func_name` (rows parallel, score and exp rows
    in per-row buffers, the key axis vectorised); ValueError for any other kernel."""
    blocks = {sch.get(b).name_hint: b for b in root_blocks(sch, func_name)}
    if not {_DOT, _SCALED, _MAX, _EXP, _SUM} <= set(blocks) or len(blocks) != 6:
        raise ValueError("not an attention_scores kernel")
    output = next(b for name, b in blocks.items()
                  if name not in (_DOT, _SCALED, _MAX, _EXP, _SUM))
    sch.compute_inline(blocks[_SCALED])  # one multiply, in the max's and the exp's reads
    *rows, key = sch.get_loops(output)
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    sch.parallel(row)
    for name in (_SUM, _EXP, _MAX, _DOT):
        sch.compute_at(blocks[name], row, preserve_unit_loops=True)
    # the scores: the key axis in the lanes, inside the d loop (a fixed order per score)
    n, d = sch.get_loops(blocks[_DOT])[-2:]
    sch.reorder(d, n)
    sch.vectorize(n)
    init = sch.decompose_reduction(blocks[_DOT], d)
    sch.vectorize(sch.get_loops(init)[-1])
    # the exps (cvmc/ops/fastmath.py's polynomial on the CPU) over the key axis in lanes
    sch.vectorize(sch.get_loops(blocks[_EXP])[-1])
    sch.vectorize(key)
