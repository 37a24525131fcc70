"""`cvmc convert`: an ONNX model to an NNEF folder (Khronos NNEF-Tools), checked."""
from __future__ import annotations

import argparse
import sys

from cvmc.cli.common import (
    console,
    fmt_shape,
    input_shapes,
)
from cvmc.errors import CvmcError


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert an ONNX model to an NNEF folder with NNEF-Tools, then check it."""
    from cvmc.frontend import load_checked
    from cvmc.frontend.onnx_convert import convert_onnx

    out = convert_onnx(args.model, args.output, input_shapes=input_shapes(args),
                       force=args.force)
    try:
        graph = load_checked(out)
    except CvmcError:
        print(f"wrote {out}, but cvmc refuses what NNEF-Tools made of {args.model}:",
              file=sys.stderr)
        raise

    def sig(names):
        return ", ".join(f"{n} {fmt_shape(graph.types[n].shape)}" for n in names)
    console.print(f"converted {args.model} -> {out}: inputs {sig(graph.inputs)}; outputs "
                  f"{sig(graph.outputs)}; {len(graph.nodes)} ops, {len(graph.weights())} "
                  f"weights; checked")
    return 0
