"""Model signatures and input checking, shared by the runtime and cvmc's interpreter.

A CVM tensor of precision p holds integers with |v| <= 2^(p-1) - 1. Inputs are checked
against that before anything runs: a violation is an error naming the input, the first
offending index and value; with saturate=True values are clipped instead (as
CVM-Runtime does for its data input). A float32 input (NNEF scalar) takes any float array
(float64 values are rounded to float32, as NumPy's astype rounds; beyond float32's range
they become +-inf); a bool input (NNEF logical) takes bool arrays only.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


class ModelError(Exception):
    """A problem with a model file or with the inputs given to a model."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape, storage dtype (int8/int32/float32/bool) and precision (integers only)
    of a model input or output, and the scale of a quantized model's integer tensor (real ~=
    integer / scale; None when the artifact records none)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    precision: int | None
    scale: float | np.ndarray | None = None  # an array: one per slice (`sliced_scale`)

    def __post_init__(self) -> None:
        # An integer's precision fits its dtype: int8 with precision 9 would store 200 as
        # -56 (plans are validated alike, cvmc_runtime.plan).
        bits = {"int8": 8, "int32": 32}.get(self.dtype)
        if bits is not None and not (type(self.precision) is int and
                                     1 <= self.precision <= bits):
            raise ModelError(f"tensor '{self.name}': an {self.dtype} needs a precision in "
                             f"1..{bits}, got {self.precision!r:.20}")

    def to_json(self) -> dict:
        """A JSON-serialisable dict (with 'scale' only when there is one)."""
        d = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
             "precision": self.precision}
        return d if self.scale is None else {**d, **scale_entry(self.scale)}

    @staticmethod
    def from_json(d: Mapping) -> TensorSpec:
        """Inverse of to_json."""
        p, scale, shape = d["precision"], d.get("scale"), tuple(int(x) for x in d["shape"])
        if isinstance(scale, list):
            scale = sliced_scale(scale, d["axis"], d["sizes"], len(shape))
        return TensorSpec(str(d["name"]), shape, str(d["dtype"]),
                          None if p is None else int(p), None if scale is None else
                          scale if isinstance(scale, np.ndarray) else float(scale))


def sliced_scale(scales: list[float], axis: int, sizes: list[int], rank: int) -> np.ndarray:
    """The scale of slices along `axis` (of `sizes` elements each, one scale each) as a
    float64 array of `rank` axes that broadcasts along `axis`."""
    shape = [1] * rank
    shape[axis] = sum(sizes)
    return np.repeat(np.asarray(scales, np.float64), sizes).reshape(shape)


def scale_entry(scale: float | np.ndarray) -> dict:
    """quantization.json's form of a scale: {"scale": s}, or for a scale that varies along
    one axis {"scale": [...], "axis": a, "sizes": [...]} (runs of equal scales merged)."""
    v = np.asarray(scale, np.float64)
    if v.size == 1:
        return {"scale": float(v.reshape(-1)[0])}
    axis = next(a for a, n in enumerate(v.shape) if n > 1)
    flat = v.reshape(-1)
    starts = [0] + [i for i in range(1, flat.size) if flat[i] != flat[i - 1]]
    sizes = [b - a for a, b in zip(starts, starts[1:] + [flat.size])]
    return {"scale": [float(flat[i]) for i in starts], "axis": axis, "sizes": sizes}


def sliced_problem(entry: Mapping, shape: tuple[int, ...]) -> tuple[str, str, object] | None:
    """The first fault of a scale per slice {"scale": [...], "axis": a, "sizes": [...]} of
    a tensor of `shape`, as (field, rule, value got), or None where it has none."""
    scales, axis, sizes = entry["scale"], entry.get("axis"), entry.get("sizes")
    if type(axis) is not int or not 0 <= axis < len(shape):
        return "axis", f"must be an axis of the tensor's shape {list(shape)} (0..{len(shape) - 1})", axis
    if not isinstance(sizes, list) or not sizes or \
            not all(type(n) is int and n > 0 for n in sizes):
        return "sizes", "must be a list of integers > 0", sizes
    if sum(sizes) != shape[axis]:
        return "sizes", f"must sum to the extent of axis {axis}, {shape[axis]}", sizes
    if len(scales) != len(sizes) or not all(
            type(s) in (int, float) and 0 < s <= sys.float_info.max for s in scales):
        return "scale", f"must be a list of {len(sizes)} finite numbers > 0, one per size", scales
    return None


def precision_bound(precision: int) -> int:
    """Largest magnitude a tensor of `precision` bits holds: 2^(p-1) - 1 (the runtime's one
    copy of the rule; cvmc's is `cvmc.ops.common.prec_max`)."""
    return (1 << (precision - 1)) - 1


def check_input(spec: TensorSpec, value: object, saturate: bool = False) -> np.ndarray:
    """Validate one input array and return it converted to the spec's storage dtype."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged nested lists, objects with a bad __array__
        raise ModelError(f"input '{spec.name}': not an array ({e})") from None
    kinds, what = {"float32": ("f", "a float"), "bool": ("b", "a bool")}.get(
        spec.dtype, ("iu", "an integer"))
    if arr.dtype.kind not in kinds:
        # Only an input with a recorded scale (a quantized artifact) takes reals; Model.run
        # quantizes them before they get here.
        why = " (it has no scale to quantize reals with)" \
            if arr.dtype.kind == "f" and spec.precision is not None else ""
        raise ModelError(f"input '{spec.name}': expected {what} array, got dtype "
                         f"{arr.dtype}{why}")
    if tuple(arr.shape) != spec.shape:
        raise ModelError(f"input '{spec.name}': expected shape {list(spec.shape)}, "
                         f"got {list(arr.shape)}")
    if spec.precision is None:
        # A float input rounds to the nearest float32 and beyond its range to +-inf (IEEE
        # conversion, as any float32 computation overflows): the values float32 semantics
        # gives them, on the runtime's path and the interpreter's alike, so no warning.
        with np.errstate(over="ignore"):
            return arr.astype(spec.dtype, copy=False)  # the runtime copies it into its buffer
    bound = precision_bound(spec.precision)
    # Two reductions find whether anything is out of range (no temporary arrays: this runs
    # on every call); only then is the first offender located. The extremes are compared
    # as Python ints, and below in the input's own dtype (NumPy compares with Python ints
    # exactly): casting first would wrap uint64 values >= 2^63.
    if -bound <= int(arr.min()) and int(arr.max()) <= bound:
        return arr.astype(spec.dtype, copy=False)  # the runtime copies it into its buffer
    high, low = arr > bound, arr < -bound
    if high.any() or low.any():
        if not saturate:
            idx = tuple(int(i) for i in np.argwhere(high | low)[0])
            raise ModelError(f"input '{spec.name}': value {int(arr[idx])} at index {list(idx)} "
                             f"is outside precision {spec.precision} (|v| <= {bound}); "
                             f"pass saturate to clip")
        wide = np.where(high | low, 0, arr).astype(np.int64)
        wide[high], wide[low] = bound, -bound
        return wide.astype(spec.dtype)
    return arr.astype(spec.dtype, copy=False)  # the runtime copies it into its buffer


def check_inputs(specs: list[TensorSpec], feeds: Mapping[str, object],
                 saturate: bool = False) -> dict[str, np.ndarray]:
    """Check names (none missing, none unknown) and every input; returns converted arrays."""
    if not isinstance(feeds, Mapping):
        raise ModelError(f"inputs must be a mapping from input name to array, got "
                         f"{type(feeds).__name__}")
    if not isinstance(saturate, (bool, np.bool_)):
        raise ModelError(f"saturate must be True or False, got {saturate!r:.40}")
    known = {s.name for s in specs}
    unknown = sorted(set(feeds) - known, key=repr)  # keys of any type, even unorderable
    if unknown:
        raise ModelError(f"unknown input {str(unknown[0])!r:.80}; the model's inputs are: "
                         f"{', '.join(s.name for s in specs)}")
    missing = [s.name for s in specs if s.name not in feeds]
    if missing:
        raise ModelError(f"missing input '{missing[0]}' "
                         f"(shape {list(specs[[s.name for s in specs].index(missing[0])].shape)})")
    return {s.name: check_input(s, feeds[s.name], saturate) for s in specs}
