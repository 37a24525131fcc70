"""`cvmc bench`: time an artifact, kernel by kernel and whole."""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from cvmc_runtime import atomic_write, pool_stats
from rich.table import Table

from cvmc.cli.common import (
    console,
    load_artifact,
    read_inputs,
)
from cvmc.ops.common import prec_max


def _random_inputs(model) -> dict[str, np.ndarray]:
    """Random values filling each integer input's precision, standard normal floats and
    fair coin logicals (fixed seed)."""
    rng = np.random.default_rng(0)

    def draw(s) -> np.ndarray:
        if s.dtype == "float32":
            return rng.standard_normal(s.shape).astype(np.float32)
        if s.dtype == "bool":
            return rng.integers(0, 2, s.shape).astype(bool)
        bound = prec_max(s.precision)
        return rng.integers(-bound, bound + 1, s.shape).astype(s.dtype)

    return {s.name: draw(s) for s in model.inputs}


def cmd_bench(args: argparse.Namespace) -> int:
    """Time an artifact: every kernel alone, then whole runs (see README, Speed)."""
    model = load_artifact(args)
    feeds = {**_random_inputs(model), **read_inputs(args.input)}
    per_kernel, runs = model.profile(feeds, repeat=args.repeat, warmup=args.warmup)
    total = sum(statistics.median(t) for t in per_kernel) or 1.0
    table = Table("kernel", "schedule", "median ms", "min ms", "max ms", "GOPS", "share",
                  box=None)
    table.columns[0].overflow = "fold"  # kernel names stay whole on narrow terminals
    rows = []
    for spec, times in zip(model.plan["kernels"], per_kernel):
        med = statistics.median(times)
        # a kernel that only moves data has no operations: no GOPS rather than a 0
        ops = spec.get("arith_ops", 0)
        gops = ops / med / 1e9 if ops and med else None
        rows.append({"kernel": spec["symbol"], "schedule": spec.get("schedule", "-"),
                     "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
                     "max_ms": max(times) * 1e3, "gops": gops, "share": med / total})
        table.add_row(spec["symbol"], rows[-1]["schedule"], f"{med * 1e3:.3f}",
                      f"{min(times) * 1e3:.3f}", f"{max(times) * 1e3:.3f}",
                      "-" if gops is None else f"{gops:.1f}", f"{med / total:.1%}")
    console.print(table)
    run = {"median_ms": statistics.median(runs) * 1e3, "min_ms": min(runs) * 1e3,
           "max_ms": max(runs) * 1e3}
    threads = pool_stats()["threads"]
    console.print(f"end to end ({len(runs)} runs, {threads} "
                  f"threads): median {run['median_ms']:.3f} ms, min {run['min_ms']:.3f} ms, "
                  f"max {run['max_ms']:.3f} ms")
    if args.json:
        report = {"artifact": str(args.model), "threads": threads,
                  "repeat": args.repeat, "kernels": rows, "run": run}
        atomic_write(args.json, lambda f: f.write(json.dumps(report, indent=1, allow_nan=False).encode()))
    return 0
