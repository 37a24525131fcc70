"""`cvmc export`: a model for CVM-Runtime (JSON + params)."""
from __future__ import annotations

import argparse

from cvmc.cli.common import (
    console,
)


def cmd_export(args: argparse.Namespace) -> int:
    """Write a model in another format (CVM-Runtime JSON + params)."""
    from cvmc.frontend import load_checked
    from cvmc.frontend.cvm_json import export_cvm
    graph = load_checked(args.model, quant=args.quant, params=args.params)
    for path in export_cvm(graph, args.output):
        console.print(f"wrote {path}")
    return 0
