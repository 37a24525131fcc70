"""`cvmc run`: run an artifact, or a model on the reference interpreter."""
from __future__ import annotations

import argparse

from cvmc.cli.common import (
    load_artifact,
    read_inputs,
    write_outputs,
)
from cvmc.errors import CvmcError


def cmd_run(args: argparse.Namespace) -> int:
    """Run a compiled artifact (or, with --reference, a graph on the interpreter)."""
    feeds = read_inputs(args.input)
    if args.reference:
        if args.dequantize:
            raise CvmcError("--dequantize applies to an artifact (its plan records the "
                            "scales), not with --reference")
        from cvmc.frontend import load_checked
        from cvmc.reference import reference_run
        graph = load_checked(args.model, quant=args.quant, params=args.params)
        outputs = reference_run(graph, feeds, saturate=args.saturate)
    else:
        if args.quant or args.params:
            raise CvmcError("--quant/--params apply with --reference (to a model, not an artifact)")
        model = load_artifact(args)
        outputs = model.run(feeds, saturate=args.saturate, dequantize=args.dequantize)
    write_outputs(outputs, args.output_dir)
    return 0
