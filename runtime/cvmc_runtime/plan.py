"""Validation of an artifact's plan before any buffer is allocated or any kernel runs.

A damaged or hand-edited plan must fail with a ModelError, never reach native code with
buffers it does not expect, nor a traceback: every field the runtime or `cvmc run` /
`bench` reads is checked for its type and bounded before any arithmetic. Every tensor the
plan names is declared once with one shape and dtype, every kernel argument names a
declared tensor, the arena holds only intermediate buffers at disjoint places while they
live, and every weight array matches its declaration. At load the plan is then compared
with its library's own signature (cvmc_runtime.library) and its target's CPU features with
the host's (cvmc_runtime.cpu). The kernels themselves (TVM's packed-function wrappers)
check the rank, shape, dtype and contiguity of each argument on every call.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np

from cvmc_runtime.signature import ModelError, precision_bound, sliced_problem

INT_DTYPES = ("int8", "int32")  # CVM integers, with a precision
DTYPES = (*INT_DTYPES, "float32", "bool")  # NNEF scalar and logical tensors: no precision
DEVICES = ("cpu", "cuda")
MAX_DIM = 1 << 24  # the compiler's limits (CVM-Runtime's): dims 1..2^24, 2^30 elements
MAX_VOLUME = 1 << 30
TENSOR_LISTS = ("inputs", "weights", "buffers", "outputs")


def _fail(message: str) -> ModelError:
    return ModelError(f"invalid plan: {message}")


def _check_spec(where: str, spec: object, scaled: bool = False) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of one tensor declaration; `scaled`: it may carry a scale (a
    quantized model's inputs and outputs)."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise _fail(f"{where}: expected an object with a string 'name', got {spec!r:.80}")
    shape, dtype, precision = spec.get("shape"), spec.get("dtype"), spec.get("precision")
    if not isinstance(shape, list) or not all(
            type(d) is int and 1 <= d <= MAX_DIM for d in shape):
        raise _fail(f"{where} '{spec['name']}': shape must be a list of integers in "
                    f"1..{MAX_DIM}, got {shape!r:.80}")
    if int(np.prod(shape, dtype=object)) > MAX_VOLUME:
        raise _fail(f"{where} '{spec['name']}': shape {shape} has more than {MAX_VOLUME} "
                    f"elements")
    integer = dtype in INT_DTYPES
    # A precision fits its dtype (int8: 1..8, int32: 1..32): a wider one would store
    # values that wrap (precision 9 in int8 holds 200 as -56).
    bits = np.dtype(dtype).itemsize * 8 if integer else 0
    if dtype not in DTYPES or (type(precision) is int and 1 <= precision <= bits) != integer \
            or (not integer and precision is not None):
        raise _fail(f"{where} '{spec['name']}': dtype must be one of {', '.join(DTYPES)}, "
                    f"with a precision in 1..8 for int8, 1..32 for int32 and none otherwise, "
                    f"got {dtype!r:.20} and {precision!r:.20}")
    if "scale" in spec:
        _check_scale(where, spec, scaled and integer, tuple(shape))
    return tuple(shape), dtype


def _check_scale(where: str, spec: Mapping, allowed: bool, shape: tuple[int, ...]) -> None:
    """A scale (real ~= integer / scale) is a finite JSON number > 0 on an integer input or
    output, or a list of them with an axis and sizes (one per slice, `sliced_problem`):
    Model.run multiplies reals by it and divides outputs by it."""
    scale = spec["scale"]
    if not allowed:
        raise _fail(f"{where} '{spec['name']}': only an integer input or output may have a "
                    f"scale, got {scale!r:.40}")
    if isinstance(scale, list):
        problem = sliced_problem(spec, shape)
        if problem is not None:
            field, rule, got = problem
            raise _fail(f"{where} '{spec['name']}': {field} {rule}, got {got!r:.40}")
        return
    # Compared, not converted: a JSON integer beyond float range must not overflow here.
    if type(scale) not in (int, float) or not 0 < scale <= sys.float_info.max:
        raise _fail(f"{where} '{spec['name']}': scale must be a finite number > 0, got "
                    f"{scale!r:.40}")


def _tensors(plan: Mapping) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every declared tensor by name. A name appears once in inputs, weights and buffers
    together (each is allocated and filled once); an output (which a graph may list twice)
    may also be an input or a weight (passed straight out), with the same shape and dtype,
    but not an intermediate buffer."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    names: dict[str, set[str]] = {}
    for key in TENSOR_LISTS:
        specs = plan.get(key)
        if not isinstance(specs, list):
            raise _fail(f"'{key}' must be a list")
        listed = []
        for k, spec in enumerate(specs):
            decl = _check_spec(f"{key}[{k}]", spec, key in ("inputs", "outputs"))
            if out.setdefault(spec["name"], decl) != decl:
                raise _fail(f"tensor '{spec['name']}' is declared twice with different "
                            f"shapes or dtypes")
            listed.append(spec["name"])
        names[key] = set(listed)
        if len(names[key]) < len(listed) and key != "outputs":
            twice = next(n for n in listed if listed.count(n) > 1)
            raise _fail(f"tensor '{twice}' is declared twice in '{key}'")
    for a, b in (("inputs", "weights"), ("inputs", "buffers"), ("weights", "buffers"),
                 ("buffers", "outputs")):
        both = sorted(names[a] & names[b])
        if both:
            raise _fail(f"tensor '{both[0]}' is declared in both '{a}' and '{b}'")
    return out


def _check_kernels(plan: Mapping, tensors: Mapping) -> None:
    """Every argument is declared, and the kernels' dataflow is complete.

    Walking the kernels in order from the tensors that hold data before the first call
    (inputs and weights): a kernel reads only tensors already written, never writes an
    input or a weight, and once all have run every graph output has been written. So a
    plan cannot hand back memory that nothing wrote, nor overwrite what it reads.
    """
    kernels = plan.get("kernels")
    if not isinstance(kernels, list):
        raise _fail("'kernels' must be a list")
    readonly = {s["name"] for key in ("inputs", "weights") for s in plan[key]}
    written = set(readonly)
    for k, kernel in enumerate(kernels):
        if not isinstance(kernel, Mapping) or not isinstance(kernel.get("symbol"), str) or \
                not isinstance(kernel.get("args"), list):
            raise _fail(f"kernels[{k}]: expected an object with 'symbol' and 'args'")
        symbol, args, count = kernel["symbol"], kernel["args"], kernel.get("num_inputs")
        unknown = [a for a in args if not isinstance(a, str) or a not in tensors]
        if unknown:
            raise _fail(f"kernel '{symbol}': argument {unknown[0]!r:.80} is not a "
                        f"declared tensor")
        if type(count) is not int or not 0 <= count <= len(args):
            raise _fail(f"kernel '{symbol}': num_inputs must be an integer in "
                        f"0..{len(args)}, got {count!r:.20}")
        if len(set(args)) < len(args):
            # A kernel reading and writing one tensor would alias its own buffers. (A
            # symbol may be called more than once: identical kernels share one function.)
            raise _fail(f"kernel '{symbol}' names one tensor twice")
        _check_kernel_extras(symbol, kernel)
        unwritten = [a for a in args[:count] if a not in written]
        if unwritten:
            raise _fail(f"kernel '{symbol}' reads '{unwritten[0]}' before anything writes it")
        clobbered = [a for a in args[count:] if a in readonly]
        if clobbered:
            raise _fail(f"kernel '{symbol}' would overwrite the input or weight "
                        f"'{clobbered[0]}'")
        written.update(args[count:])
    missing = [s["name"] for s in plan["outputs"] if s["name"] not in written]
    if missing:
        raise _fail(f"output '{missing[0]}' is never written by any kernel and is neither an "
                    f"input nor a weight")


MAX_ARITH_OPS = 1 << 62  # far above any model (a ResNet-50 run is ~2^33)


def _check_kernel_extras(symbol: str, kernel: Mapping) -> None:
    """The fields `cvmc bench` reports, when present: `arith_ops` (an integer count) and
    `schedule` (a rule name)."""
    ops, rule = kernel.get("arith_ops", 0), kernel.get("schedule", "")
    if type(ops) is not int or not 0 <= ops <= MAX_ARITH_OPS:
        raise _fail(f"kernel '{symbol}': arith_ops must be an integer in 0..{MAX_ARITH_OPS}, "
                    f"got {ops!r:.40}")
    if not isinstance(rule, str) or len(rule) > 200:
        raise _fail(f"kernel '{symbol}': schedule must be a rule name, got {rule!r:.40}")


def _check_target(plan: Mapping) -> None:
    """The target the library was built for: llvm with its CPU name and the CPU features
    its code needs (cvmc_runtime.cpu), or cuda with its compute capability."""
    target, device = plan.get("target"), plan["device"]
    if device == "cpu":
        ok = isinstance(target, Mapping) and set(target) == {"kind", "mcpu", "features"} \
            and target["kind"] == "llvm" and isinstance(target["mcpu"], str) \
            and 0 < len(target["mcpu"]) <= 100 and isinstance(target["features"], list) \
            and all(isinstance(f, str) and len(f) <= 40 for f in target["features"])
        want = "{kind: 'llvm', mcpu: a CPU name, features: a list of LLVM feature names}"
    else:
        arch = target.get("arch") if isinstance(target, Mapping) else None
        ok = isinstance(target, Mapping) and set(target) == {"kind", "arch"} and \
            target["kind"] == "cuda" and isinstance(arch, str) and arch.startswith("sm_") \
            and arch[3:].isdigit() and len(arch) <= 10
        want = "{kind: 'cuda', arch: 'sm_XX'}"
    if not ok:
        old = isinstance(target, Mapping) and "features" not in target and device == "cpu"
        raise _fail(f"a {device} plan's target must be {want}, got {target!r:.120}"
                    + ("; it was compiled by an older cvmc: recompile the model" if old else ""))


ARENA_ALIGNMENT = 64


def buffer_lifetimes(plan: Mapping) -> dict[str, tuple[int, int]]:
    """(first, last) kernel index using each intermediate buffer: from the kernel that
    writes it to the last one that reads or writes it."""
    names = {b["name"] for b in plan["buffers"]}
    spans: dict[str, tuple[int, int]] = {}
    for k, kernel in enumerate(plan["kernels"]):
        for name in kernel["args"]:
            if name in names:
                first, _ = spans.get(name, (k, k))
                spans[name] = (first, k)
    return spans


def tensor_bytes(spec: Mapping) -> int:
    """Bytes of a declared tensor."""
    return int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize


def _check_arena(plan: Mapping) -> None:
    """The arena holds exactly the intermediate buffers, each at an aligned offset inside
    it, and two buffers share bytes only if no kernel needs both (their lifetimes are
    disjoint); its size is where its last buffer ends.

    Only buffers: inputs and weights are live from load (weights are uploaded once, an
    input before each run) and outputs until they are read back after the run, so none
    may share bytes with anything; the compiler gives each its own allocation.
    """
    arena = plan.get("arena")
    if arena is None:
        return
    if not isinstance(arena, Mapping) or type(arena.get("bytes")) is not int or \
            not isinstance(arena.get("offsets"), Mapping):
        raise _fail("'arena' must be an object with integer 'bytes' and 'offsets'")
    buffers = {spec["name"]: spec for spec in plan["buffers"]}
    strangers = [name for name in arena["offsets"] if name not in buffers]
    if strangers:
        raise _fail(f"arena: {strangers[0]!r:.80} is not an intermediate buffer; the arena "
                    f"holds only the plan's 'buffers'")
    places = []
    for name, spec in buffers.items():
        offset, size = arena["offsets"].get(name), tensor_bytes(spec)
        if type(offset) is not int or offset < 0 or offset % ARENA_ALIGNMENT or \
                offset + size > arena["bytes"]:
            raise _fail(f"arena: buffer '{name}' needs an offset that is a multiple "
                        f"of {ARENA_ALIGNMENT} with its {size} bytes inside the arena's "
                        f"{arena['bytes']}, got {offset!r:.20}")
        places.append((name, offset, offset + size))
    end = max((stop for _, _, stop in places), default=0)
    if arena["bytes"] != end:
        raise _fail(f"arena: {arena['bytes']} bytes, but its buffers end at byte {end}")
    life = buffer_lifetimes(plan)
    for i, (a, a0, a1) in enumerate(places):
        for b, b0, b1 in places[i + 1:]:
            (s, e), (t, f) = life.get(a, (-1, -1)), life.get(b, (-1, -1))
            if a0 < b1 and b0 < a1 and s <= f and t <= e:
                raise _fail(f"arena: buffers '{a}' and '{b}' overlap while both are live")


def validate_plan(plan: object) -> None:
    """Raise ModelError unless `plan` is well formed (before its weights are read)."""
    if not isinstance(plan, Mapping):
        raise _fail(f"expected a JSON object, got {type(plan).__name__}")
    if plan.get("device") not in DEVICES:
        raise _fail(f"device must be one of {', '.join(DEVICES)}, got {plan.get('device')!r:.40}")
    _check_target(plan)
    _check_kernels(plan, _tensors(plan))
    _check_arena(plan)


def check_weights(plan: Mapping, weights: Mapping[str, np.ndarray]) -> None:
    """Raise ModelError unless every stored weight has its declared shape and dtype."""
    for spec in plan["weights"]:
        value = weights.get(spec["name"])
        want = (tuple(spec["shape"]), spec["dtype"])
        if value is None or (tuple(value.shape), str(value.dtype)) != want:
            got = "nothing" if value is None else f"{value.dtype} {list(value.shape)}"
            raise _fail(f"weight '{spec['name']}': stored array is {got}, the plan declares "
                        f"{spec['dtype']} {spec['shape']}")
        if spec["dtype"] not in INT_DTYPES:
            continue
        # The compiler proved int32 never overflows from the declared precisions: a weight
        # outside its precision would void that proof.
        bound = precision_bound(spec["precision"])
        outside = np.flatnonzero((value > bound) | (value < -bound))
        if outside.size:
            index = [int(i) for i in np.unravel_index(outside[0], value.shape)]
            raise _fail(f"weight '{spec['name']}': value {int(value.flat[outside[0]])} at index "
                        f"{index} is outside its precision {spec['precision']} "
                        f"(|v| <= {bound})")
