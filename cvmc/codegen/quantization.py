"""The scales of a quantized model (`quantization.json`, as `cvmc quantize` writes it),
checked against the graph and recorded on the plan's inputs and outputs.

    {"inputs": {name: {"scale": s, "precision": p}}, "outputs": {name: {"scale": s}}}

real ~= integer / scale. An output that concatenates differently scaled parts has a scale
per slice along the concat axis instead, {"scale": [s1, s2, ...], "axis": a, "sizes": [n1,
n2, ...]} (slice i is the next n_i entries along axis a; the sizes sum to its extent). The runtime quantizes float inputs with these scales and
dequantizes outputs (`Model.run(..., dequantize=True)`, `cvmc run --dequantize`).
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from cvmc_runtime import sliced_problem

from cvmc.errors import CvmcError
from cvmc.ir import Graph

MAX_BYTES = 16 << 20  # a few lines per input and output
# {"inputs": {name: {"scale": s}}, "outputs": {name: {"scale": s} or the per-slice form}}
Scales = dict[str, dict[str, dict]]


def _read(path: Path) -> object:
    """The JSON in `path`, size-checked first."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise CvmcError(f"{path}: larger than {MAX_BYTES} bytes; not a quantization file")
        return json.loads(path.read_bytes())
    except OSError as e:
        raise CvmcError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise CvmcError(f"{path}: not valid JSON ({e})") from None


def check_quantization(source: Mapping | str | os.PathLike, graph: Graph) -> Scales:
    """The scales of `source` (a quantization.json path or its parsed object), checked
    against `graph` (typed): names are its inputs and outputs, each an integer tensor;
    every scale a finite number > 0 (an output's, or a list of them per slice,
    `sliced_problem`); an input's precision is its graph precision."""
    where = "quantization" if isinstance(source, Mapping) else str(source)
    doc = source if isinstance(source, Mapping) else _read(Path(source))

    def fail(field: str, rule: str, got: object) -> CvmcError:
        return CvmcError(f"{where}: {field} {rule}, got {got!r:.80}")

    if not isinstance(doc, Mapping) or not set(doc) <= {"inputs", "outputs"}:
        raise fail("the top level", "must be an object with 'inputs' and 'outputs'",
                   doc if not isinstance(doc, Mapping) else sorted(doc))
    scales: Scales = {}
    for key, names, needed, extra in (
            ("inputs", graph.inputs, {"scale", "precision"}, set()),
            ("outputs", graph.outputs, {"scale"}, {"axis", "sizes"})):
        entries = doc.get(key, {})
        if not isinstance(entries, Mapping):
            raise fail(key, "must be an object mapping names to {scale, ...}", entries)
        scales[key] = {}
        for name, entry in entries.items():
            field = f"{key}.{name}"
            if name not in names:
                raise fail(field, f"must name one of the graph's {key} "
                           f"({', '.join(names)})", name)
            allowed = needed | {"precision"} | extra
            if not isinstance(entry, Mapping) or not needed <= set(entry) <= allowed:
                raise fail(field, f"must be an object with {' and '.join(sorted(needed))}",
                           entry)
            t = graph.types[name]
            if t.precision is None:
                raise fail(field, "must be an integer tensor to have a scale", t.dtype)
            scale = entry["scale"]
            if extra and (isinstance(scale, list) or not set(entry).isdisjoint(extra)):
                problem = sliced_problem(entry, t.shape) if isinstance(scale, list) else \
                    ("scale", "must be a list, one per slice, beside axis and sizes", scale)
                if problem is not None:
                    raise fail(f"{field}.{problem[0]}", problem[1], problem[2])
                scales[key][name] = {"scale": [float(s) for s in scale],
                                     "axis": entry["axis"], "sizes": list(entry["sizes"])}
                continue
            # Compared, not converted: a JSON integer beyond float range must not overflow.
            if type(scale) not in (int, float) or not 0 < scale <= sys.float_info.max:
                raise fail(f"{field}.scale", "must be a finite number > 0", scale)
            precision = entry.get("precision", t.precision)
            if type(precision) is not int or precision != t.precision:
                raise fail(f"{field}.precision", f"must be the graph's precision of "
                           f"'{name}', {t.precision}", precision)
            scales[key][name] = {"scale": float(scale)}
    return scales


def record_scales(plan: dict, scales: Scales) -> None:
    """Write each scale (with its axis and sizes, per slice) onto its input or output
    declaration in `plan`."""
    for key, by_name in scales.items():
        for spec in plan[key]:
            if spec["name"] in by_name:
                spec.update(by_name[spec["name"]])
