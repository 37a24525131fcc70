"""Hashes of what cvmc generates, to show that a refactor changed no generated code.

    python benchmarks/tir_hashes.py -o before.json               # on the old tree
    python benchmarks/tir_hashes.py -o after.json --compare before.json

For every op case of tests/codegen/op_cases.py and the two benchmark networks
(benchmarks/models.py, ResNet-18 and MobileNet-v1 at 224x224), on each target below: the
sha256 of the scheduled TIR (what `cvmc compile --emit tir` writes: the pass pipeline,
lowering, then each kernel's schedule rule) and of the execution plan (`--emit plan`).
Nothing is compiled to machine code, so a run takes minutes, not the test suite's time.
`--compare` prints every entry whose hash differs and exits 1 if any does. A graph a target
refuses (an op of another backend) is recorded with the refusal.

Targets: llvm for an AVX2 CPU without VNNI (znver3), an AVX-512 VNNI one (znver4) and a
baseline x86-64; AArch64 without dot products (generic), with SDOT (neoverse-n1) and
with I8MM (neoverse-v2); and cuda sm_80: each CPU row of the schedule table is taken by some case.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

# name: (kind, mcpu, arch, mtriple)
TARGETS = {"llvm-znver3": ("llvm", "znver3", None, None),
           "llvm-znver4": ("llvm", "znver4", None, None),
           "llvm-x86-64": ("llvm", "x86-64", None, None),
           "llvm-aarch64": ("llvm", "generic", None, "aarch64-linux-gnu"),
           "llvm-aarch64-dotprod": ("llvm", "neoverse-n1", None, "aarch64-linux-gnu"),
           "llvm-aarch64-i8mm": ("llvm", "neoverse-v2", None, "aarch64-linux-gnu"),
           "cuda-sm_80": ("cuda", None, "sm_80", None)}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def generated(graph, target) -> tuple[str, str]:
    """(scheduled TIR, execution plan JSON) of `graph` for `target`, by its backend's
    passes, lowering and schedules."""
    from cvmc.codegen.targets import backend

    steps = backend(target)
    mod, _, plan = steps.lower(steps.run_passes(graph, target), target)
    return steps.schedule(mod, target)[0].script(), json.dumps(plan, indent=1, sort_keys=True)


def graphs():
    """(name, graph) of every op case and both benchmark networks."""
    from cvmc import load_graph
    from tests.codegen.op_cases import CASES
    from tests.oputil import one_op_graph

    for index, case in enumerate(CASES):
        yield (f"case{index:03d}-{case.op}",
               one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype))
    from benchmarks.models import MODELS

    with tempfile.TemporaryDirectory() as tmp:
        for name, make in MODELS.items():
            yield name, load_graph(make(224).write(Path(tmp) / name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", required=True, help="JSON file of the hashes")
    p.add_argument("--compare", help="an earlier run's JSON: list what differs, exit 1 if any")
    p.add_argument("--targets", default=",".join(TARGETS),
                   help=f"comma-separated, of {', '.join(TARGETS)}")
    args = p.parse_args(argv)
    from cvmc.passes.target import Target

    targets = {name: Target.make(*TARGETS[name]) for name in args.targets.split(",")}
    from cvmc.errors import CvmcError

    hashes = {}
    for name, graph in graphs():
        for tname, target in targets.items():
            try:
                tir, plan = generated(graph, target)
            except CvmcError as e:  # an op this target does not compile (OpDef.backends)
                hashes[f"{name} {tname}"] = {"refused": str(e)}
                continue
            hashes[f"{name} {tname}"] = {"tir": _sha(tir), "plan": _sha(plan)}
        print(name, file=sys.stderr)
    Path(args.output).write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    if not args.compare:
        return 0
    before = json.loads(Path(args.compare).read_text())
    differ = sorted(k for k in before.keys() | hashes.keys() if before.get(k) != hashes.get(k))
    for key in differ:
        print(f"differs: {key}: {before.get(key)} -> {hashes.get(key)}")
    print(f"{len(hashes) - len(differ)} of {len(hashes)} unchanged")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
