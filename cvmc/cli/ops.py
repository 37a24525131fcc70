"""`cvmc ops`: the operator table, from the op records."""
from __future__ import annotations

import argparse

from cvmc.cli.common import (
    console,
)


def cmd_ops(args: argparse.Namespace) -> int:
    """Print the operator table: one block per op (readable at any terminal width), or with
    --markdown the table docs/ops.md holds."""
    from cvmc.ops import all_ops
    from cvmc.ops.describe import cvm_spellings, nnef_declaration, op_table

    if args.markdown:
        print(op_table(), end="")
        return 0
    for d in all_ops():
        aliases = f" (also: {', '.join(d.aliases)})" if d.aliases else ""
        console.print(f"[bold]{d.name}[/bold]{aliases}  op set {', '.join(d.seeds)}, "
                      f"family {d.family}, fusion {d.fusion.value}")
        console.print(f"    inputs:     {', '.join(d.inputs)}")
        if d.attrs:
            console.print(f"    attributes: {'; '.join(a.describe() for a in d.attrs)}")
        if not d.integer_op:
            console.print(f"    types:      {d.types}")
        if d.precision_rule:  # CVM ops, and typed ops with integer results
            console.print(f"    precision:  {d.precision_rule}")
        if d.interval_rule:  # the values it proves (default: the precision's)
            console.print(f"    interval:   {d.interval_rule}", markup=False)
        if d.ulp:  # a float result's accuracy against the reference
            console.print(f"    accuracy:   within {d.ulp} ULP")
        if cvm_spellings(d):
            console.print(f"    CVM-Runtime: {cvm_spellings(d)}")
        if d.backends != ("llvm", "cuda"):
            console.print(f"    backends:   {', '.join(d.backends)}")
        if "nnef" in d.seeds:
            console.print(f"    nnef:       {nnef_declaration(d)}", markup=False)
    return 0
