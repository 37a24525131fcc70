"""The operator registry: one `OpDef` per op bundles every rule the compiler needs.

An op module declares an entry with `op(...)` and attaches its rules with decorators:

    relu = op("relu", family="nn", inputs=("data",), fusion=Fusion.ELEMWISE,
              precision_rule="p_x")

    @relu.shape
    def _(ins, a): return ins[0].shape

    @relu.precision
    def _(ins, a): return ins[0].precision

    @relu.reference
    def _(xs, a): return np.maximum(xs[0], 0)

    @relu.lower
    def _(xs, a): ...   # TE compute over int32 inputs, returns int32 tensor(s)

Rule signatures (`ins`: input TensorTypes, `xs`: input arrays/tensors, `a`: `Attrs`):
- shape(ins, a) -> shape tuple, or a list of shapes when the op has several outputs.
  Raises `OpRuleError` naming the operand/attribute, expected and actual values.
- precision(ins, a) -> int, or a tuple of ints for several outputs (each 1..32).
- reference(xs, a) -> array(s): literal NumPy of the formal spec. Inputs arrive as
  int64 and outputs are returned as int64; the interpreter checks them against the
  inferred precision and casts to the storage dtype.
- lower(xs, a) -> te.Tensor(s): TE compute over int32 inputs; the lowering casts the
  result to the storage dtype. Import TVM inside the rule (`cvmc.ops.te`),
  never at module level, so checking a graph never loads TVM.
- cost(ins, outs, a) -> int: base operations per output element (default 1), as
  CVM-Runtime's gas counts them.
- arith(ins, outs, a) -> int: the node's arithmetic operations, for GOPS (`cvmc bench`):
  2 per multiply-add, the convention of every GOPS figure. Default by fusion kind:
  element-wise and broadcast ops their output elements x (inputs - 1), at least 1;
  reductions their input elements; injective ops (data movement) 0; any other op its
  output elements. The entries these do not fit attach their own (`common.mac_ops`,
  `no_arith`, `arith_per_input`, `arith_per_output` help).
- kind(kinds, a) -> str: typed ops whose result element kind depends on attributes only
  (`cinn.const_scalar`): the kind, given the input kinds.
- interval(ivs, a) -> (lo, hi), or a list of them for several outputs: the values an
  integer result can take, given `ivs`, its inputs' intervals (`(lo, hi)`, None for a
  non-integer input), with its `interval_rule` words. Optional: without it a result may
  hold anything its precision allows (`precision_interval`); with it the result is that
  interval clamped into the precision's (`infer_intervals`).
Facts beside the rules: `types` (below), `ulp` (a float result's accuracy), `cvm_name`
and `Attr.cvm_name` (CVM-Runtime's JSON spellings, which `cvmc export` writes),
`multiply_add` (the `arith` operations are multiply-adds, 2 each: the MACs `cvmc check`
totals), `backends` (the targets that compile the op), `packed_on` (the targets whose
layout pass packs the op's weight into `conv2d_packed`) and `epilogue_on` (the targets on
which a kernel the op anchors takes its element-wise epilogue).
The storage dtype is not a per-op rule: it follows from precision (`storage_dtype`).

Two kinds of ops share the registry:
- CVM integer ops (no `types`): every tensor is a CVM integer with a precision; they need
  all four rules and a `precision_rule` description.
- Typed ops (`types="scalar, scalar -> logical"`, NNEF's element kinds `scalar` = float32,
  `logical` = bool, `integer` = a CVM integer, `?` = generic, `?[]` = a tensor array,
  `any`: any kind, and cvmc's `numeric`: generic over scalar and integer, not logical):
  NNEF standard primitives, CINN's and oneDNN's. Their results have the declared kind (`?`
  or `numeric`: the kind of the generic inputs, which must agree; a `kind` rule where
  attributes decide); an integer result's precision comes from the `precision` rule (with
  its `precision_rule` words: e.g. onednn.convolution on 8-bit integers, as conv2d), or
  for a generic op that only moves values, from its inputs. `reference` sees float32
  inputs as float64 (the better oracle; the interpreter rounds results to float32) and
  `lower` sees float32 / bool tensors as they are (integer ones as int32, as for CVM ops).
  Every op has shape, reference and lower rules: `check_registry` refuses an entry without.
"""
from __future__ import annotations

import difflib
import enum
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cvmc.errors import OpRuleError
from cvmc.ir.graph import TensorType
from cvmc.ops.common import Interval, precision_interval

MAX_ATTR = 4096  # CVM-Runtime's default attribute bound ("max_attr")


class Fusion(enum.Enum):
    """How an op may be fused with its neighbours."""

    ELEMWISE = "elemwise"
    BROADCAST = "broadcast"
    INJECTIVE = "injective"
    REDUCTION = "reduction"
    OUT_ELEMWISE = "out-elemwise-fusable"  # conv2d, dense: elementwise consumers may fuse in
    OPAQUE = "opaque"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

_NNEF_TYPE = {"int": "integer", "bool": "logical", "ints": "integer[]", "int?": "integer",
              "str": "string", "scalar": "scalar", "scalars": "scalar[]",
              "int_pairs": "(integer,integer)[]", "literal": "scalar|integer|logical"}


@dataclass(frozen=True)
class Attr:
    """A typed attribute with default and inclusive range [lo, hi] (checked per element).

    kind: "int", "bool", "ints" (list of ints), "int?" (int or None), "str", for NNEF
    standard ops "scalar" (a number), "scalars" and "int_pairs" ([(p, q), ...]), and
    "literal" (a number or a logical, kept as given: `cinn.const_scalar`'s value).
    length: required list length for "ints" (a single int is broadcast to it when
    scalar_ok). aliases: other spellings accepted on input (CVM-Runtime, spec variants).
    cvm_name: the alias CVM-Runtime's JSON spells it by, which export writes ("": name).
    cvm_derive: for an optional attribute that CVM-Runtime requires, its value from the
    node's input shapes, which export writes where the node leaves it unset.
    """

    name: str
    kind: str
    default: Any = REQUIRED
    lo: int | None = None
    hi: int | None = None
    length: int | None = None
    scalar_ok: bool = False
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    cvm_name: str = ""
    cvm_derive: Callable[[list[tuple[int, ...]]], Any] | None = None

    @property
    def nnef_type(self) -> str:
        """The NNEF type name used in signatures."""
        return _NNEF_TYPE[self.kind]

    def describe(self) -> str:
        """`name: type = default` for tables and messages."""
        text = f"{self.name}: {self.nnef_type}"
        if self.choices:
            text += f" ({' | '.join(repr(c) for c in self.choices)})"
        if self.default is not REQUIRED:
            text += f" = {nnef_literal(self.default)}"
        return text

    def normalize(self, op: str, value: Any) -> Any:
        """Type-check and range-check one value; returns the canonical form."""
        where = f"{op}: attribute '{self.name}'"
        if self.kind == "int?" and value is None:
            return None
        if self.kind in ("int", "int?"):
            if not _is_int(value):
                raise OpRuleError(f"{where} must be an integer, got {nnef_literal(value)}")
            self._check_range(where, int(value))
            return int(value)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise OpRuleError(f"{where} must be a logical (true/false), "
                                  f"got {nnef_literal(value)}")
            return value
        if self.kind == "str":
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                expect = " or ".join(repr(c) for c in self.choices) or "a string"
                raise OpRuleError(f"{where} must be {expect}, got {nnef_literal(value)}")
            return value
        if self.kind == "scalar":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise OpRuleError(f"{where} must be a number, got {nnef_literal(value)}")
            return value
        if self.kind == "literal":
            if not isinstance(value, (int, float)):
                raise OpRuleError(f"{where} must be a number or a logical, "
                                  f"got {nnef_literal(value)}")
            return value
        if self.kind == "scalars":
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                raise OpRuleError(f"{where} must be a list of numbers, got {nnef_literal(value)}")
            return tuple(value)
        if self.kind == "int_pairs":
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(x) for x in v)
                    for v in value):
                raise OpRuleError(f"{where} must be a list of integer pairs, "
                                  f"got {nnef_literal(value)}")
            return tuple((int(p), int(q)) for p, q in value)
        assert self.kind == "ints", self.kind
        if _is_int(value) and self.scalar_ok:
            value = [int(value)] * (self.length or 1)
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
            raise OpRuleError(f"{where} must be a list of integers, got {nnef_literal(value)}")
        if self.length is not None and len(value) != self.length:
            raise OpRuleError(f"{where} must have {self.length} elements, "
                              f"got {nnef_literal(value)}")
        for v in value:
            self._check_range(where, int(v))
        return tuple(int(v) for v in value)

    def _check_range(self, where: str, v: int) -> None:
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            lo = "-inf" if self.lo is None else self.lo
            hi = "inf" if self.hi is None else self.hi
            raise OpRuleError(f"{where} must be in [{lo}, {hi}], got {v}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def nnef_literal(v: Any, nested: bool = False) -> str:
    """`v` as an NNEF literal (`true`, `'constant'`, `[1, 2]`, `[(0, 1)]`): attribute
    defaults in declarations and tables, values in messages."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if nested and isinstance(v, tuple) and len(v) == 2 and all(_is_int(x) for x in v):
        return f"({v[0]}, {v[1]})"  # an element of an (integer,integer)[] list
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(nnef_literal(x, True) for x in v) + "]"
    if isinstance(v, str):
        return repr(v)
    return "none" if v is None else str(v)


class Attrs(dict):
    """Normalized attribute values with attribute access (`a.padding`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


_RULES = ("shape", "precision", "reference", "lower", "cost", "arith", "kind", "interval")


class OpDef:
    """Everything cvmc knows about one operator. Create with `op(...)`."""

    def __init__(self, name: str, *, family: str, inputs: Sequence[str],
                 outputs: Sequence[str] = ("out",), attrs: Sequence[Attr] = (),
                 aliases: Sequence[str] = (), fusion: Fusion = Fusion.OPAQUE,
                 precision_rule: str = "", interval_rule: str = "", seeds: Sequence[str] = ("cvm",),
                 types: str = "", cvm_name: str = "", ulp: int = 0,
                 backends: Sequence[str] = ("llvm", "cuda"), multiply_add: bool = False,
                 packed_on: Sequence[str] = (), epilogue_on: Sequence[str] = ("llvm",)):
        self.name = name
        # a convolution or matrix product: its `arith` operations are multiply-adds (2
        # each), whose count `cvmc check` totals as MACs
        self.multiply_add = multiply_add
        # the targets whose layout pass (cvmc.passes.layout) gives the op's constant weight
        # the packed layout of `conv2d_packed`
        self.packed_on = tuple(packed_on)
        # the targets on which a kernel the op anchors (out-elementwise-fusable) takes its
        # element-wise epilogue: on llvm every anchor; on CUDA those a row of the CUDA
        # schedule table is anchored on (dlight, which schedules the rest, wants a
        # reduction alone)
        self.epilogue_on = tuple(epilogue_on)
        # the targets that compile the op: ("llvm",) for the float layouts that only the
        # llvm pipeline's passes write (pack-float-convs, block-float-activations,
        # pack-matmul-weights); CUDA refuses them (`lower_graph`)
        self.backends = tuple(backends)
        # float results: units in the last place a kernel may be from the reference (the C
        # math library's functions); 0: bit-exact, or a sum's bound (docs/float.md)
        self.ulp = ulp
        # the alias CVM-Runtime's JSON names the op by, which export writes
        self.cvm_name = cvm_name or name
        self.family = family
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.attrs = tuple(attrs)
        self.aliases = tuple(aliases)
        self.fusion = fusion
        self.precision_rule = precision_rule
        # the words of the interval rule (`cvmc ops`); "": none, the precision's interval
        self.interval_rule = interval_rule
        self.seeds = tuple(seeds)
        self.types = types
        self.in_kinds, self.out_kind = _parse_types(name, types)
        self.rules: dict[str, Callable[..., Any]] = {}
        self._attr_by_name = {}
        for at in self.attrs:
            for spelling in (at.name, *at.aliases):
                self._attr_by_name[spelling] = at

    def __repr__(self) -> str:
        return f"OpDef({self.name!r})"

    # -- rule decorators ---------------------------------------------------------------
    def _rule(kind: str):  # type: ignore[misc]
        def decorator(self: OpDef, fn: Callable[..., Any]) -> Callable[..., Any]:
            assert kind not in self.rules, f"{self.name}: {kind} rule defined twice"
            self.rules[kind] = fn
            return fn
        decorator.__name__ = kind
        decorator.__doc__ = f"Attach the {kind} rule."
        return decorator

    shape = _rule("shape")
    precision = _rule("precision")
    reference = _rule("reference")
    lower = _rule("lower")
    cost = _rule("cost")
    arith = _rule("arith")
    kind = _rule("kind")
    interval = _rule("interval")
    del _rule

    @property
    def integer_op(self) -> bool:
        """True for a CVM integer op (every tensor an integer with a precision)."""
        return not self.types

    def in_kind(self, k: int) -> str:
        """The declared element kind of input `k` (typed ops; a variadic array repeats)."""
        return self.in_kinds[min(k, len(self.in_kinds) - 1)].removesuffix("[]")

    def result_kind(self, kinds: Sequence[str], a: Attrs) -> str | None:
        """The element kind of a typed op's results for inputs of `kinds`: the `kind`
        rule's, the declared one, or that of the first generic input; None for a generic
        result without generic inputs (cast: its generic argument decides)."""
        if "kind" in self.rules:
            return self.rules["kind"](list(kinds), a)
        if self.out_kind not in GENERIC:
            return self.out_kind
        return next((kd for k, kd in enumerate(kinds) if self.in_kind(k) in GENERIC), None)

    # -- inputs ------------------------------------------------------------------------
    @property
    def input_names(self) -> tuple[str, ...]:
        """Input names without the `?` (optional) and `*` (variadic) markers."""
        return tuple(i.strip("?*") for i in self.inputs)

    @property
    def variadic(self) -> bool:
        """True if the op takes any number of tensors (e.g. concatenate)."""
        return any(i.startswith("*") for i in self.inputs)

    @property
    def variadic_outputs(self) -> bool:
        """True if the op returns an array of tensors whose length the shape rule decides
        (NNEF split / unstack)."""
        return self.outputs[0].startswith("*")

    def check_arity(self, n: int) -> None:
        """Raise unless `n` input tensors are acceptable."""
        if self.variadic:
            if n < 1:
                raise OpRuleError(f"{self.name}: needs at least one input tensor")
            return
        required = sum(1 for i in self.inputs if not i.endswith("?"))
        if not required <= n <= len(self.inputs):
            want = str(required) if required == len(self.inputs) else \
                f"{required} to {len(self.inputs)}"
            raise OpRuleError(f"{self.name}: expects {want} input tensors "
                              f"({', '.join(self.inputs)}), got {n}")

    # -- attributes --------------------------------------------------------------------
    def attr(self, name: str) -> Attr | None:
        """The attribute with this name or alias, if any."""
        return self._attr_by_name.get(name)

    def normalize_attrs(self, given: dict[str, Any]) -> Attrs:
        """Map aliases, reject unknown names, check types and ranges, fill defaults."""
        out = Attrs()
        for key, value in given.items():
            at = self._attr_by_name.get(key)
            if at is None:
                raise OpRuleError(f"{self.name}: unknown attribute '{key}'{self._suggest(key)}")
            if at.name in out:
                raise OpRuleError(f"{self.name}: attribute '{at.name}' given twice")
            out[at.name] = at.normalize(self.name, value)
        for at in self.attrs:
            if at.name not in out:
                if at.default is REQUIRED:
                    raise OpRuleError(f"{self.name}: missing required attribute "
                                      f"'{at.describe()}'")
                out[at.name] = at.normalize(self.name, at.default) \
                    if at.default is not None else None
        return out

    def _suggest(self, key: str) -> str:
        close = difflib.get_close_matches(key, list(self._attr_by_name), n=1)
        if close:
            return f"; did you mean '{close[0]}'?"
        names = ", ".join(a.name for a in self.attrs) or "none"
        return f" (attributes: {names})"

    # -- running the rules -------------------------------------------------------------
    def infer_shapes(self, ins: Sequence[TensorType], a: Attrs) -> list[tuple[int, ...]]:
        """Output shapes (one per output), validated."""
        self.check_arity(len(ins))
        result = self.rules["shape"](list(ins), a)
        shapes = [result] if len(self.outputs) == 1 and not self.variadic_outputs \
            else list(result)
        assert self.variadic_outputs or len(shapes) == len(self.outputs), \
            f"{self.name}: shape rule arity"
        return [tuple(int(d) for d in s) for s in shapes]

    def infer_precisions(self, ins: Sequence[TensorType], a: Attrs) -> list[int]:
        """Output precisions (one per output); each must be in 1..32."""
        result = self.rules["precision"](list(ins), a)
        precs = [result] if len(self.outputs) == 1 else list(result)
        return [int(p) for p in precs]

    def infer_intervals(self, ivs: Sequence[Interval | None], precisions: Sequence[int],
                        a: Attrs) -> list[Interval]:
        """The proven interval of each integer result of `precisions`, given its inputs'
        intervals `ivs`: the `interval` rule's, its ends clamped into the precision's
        interval (which holds every result; the ops that clip to it, cvm_clip and the
        shifts, leave the clip to this)."""
        whole = [precision_interval(p) for p in precisions]
        rule = self.rules.get("interval")
        if rule is None:
            return whole
        result = rule(list(ivs), a)
        found = [result] if len(precisions) == 1 and isinstance(result, tuple) else result
        return [(min(max(lo, w[0]), w[1]), min(max(hi, w[0]), w[1]))
                for (lo, hi), w in zip(found, whole)]

    def run_reference(self, xs: Sequence[Any], a: Attrs) -> list[Any]:
        """Reference outputs as a list (int64 arrays)."""
        result = self.rules["reference"](list(xs), a)
        return [result] if self._single_output else list(result)

    def run_lower(self, xs: Sequence[Any], a: Attrs) -> list[Any]:
        """TE output tensors as a list."""
        result = self.rules["lower"](list(xs), a)
        return [result] if self._single_output else list(result)

    @property
    def _single_output(self) -> bool:
        """The rules return one tensor, not a list (a variadic op returns a list)."""
        return len(self.outputs) == 1 and not self.variadic_outputs

    def cost_of(self, ins: Sequence[TensorType], outs: Sequence[TensorType], a: Attrs) -> int:
        """Base operations per output element (CVM-Runtime's gas model)."""
        rule = self.rules.get("cost")
        return int(rule(list(ins), list(outs), a)) if rule else 1

    def arith_ops(self, ins: Sequence[TensorType], outs: Sequence[TensorType],
                  a: Attrs) -> int:
        """Arithmetic operations of one node (see the `arith` rule)."""
        rule = self.rules.get("arith")
        if rule is not None:
            return int(rule(list(ins), list(outs), a))
        if self.fusion in (Fusion.ELEMWISE, Fusion.BROADCAST):
            return outs[0].size * max(len(ins) - 1, 1)
        if self.fusion is Fusion.REDUCTION:
            return ins[0].size
        return 0 if self.fusion is Fusion.INJECTIVE else sum(o.size for o in outs)

    def missing_rules(self) -> list[str]:
        """Rules this entry still lacks."""
        needed = ("shape", "precision", "reference", "lower") if self.integer_op else \
            ("shape", "reference", "lower")
        return [r for r in needed if r not in self.rules]


# NNEF element kinds and the dtype each is stored in ("?": generic, "any": cast's input,
# "numeric": generic over scalar and integer, for ops that have no logical reading)
KINDS = {"scalar": "float32", "logical": "bool", "integer": "int32", "?": None, "any": None,
         "numeric": None}
GENERIC = ("?", "numeric")


def _parse_types(name: str, types: str) -> tuple[tuple[str, ...], str | None]:
    """`"scalar, ?[] -> logical"` as (input kinds, result kind); ((), None) for ""."""
    if not types:
        return (), None
    ins, _, out = types.partition("->")
    kinds = tuple(k.strip() for k in ins.split(",") if k.strip())
    assert out.strip() in KINDS and out.strip() != "any" and all(k.removesuffix("[]") in KINDS for k in kinds), \
        f"{name}: bad types {types!r}"
    return kinds, out.strip()


_REGISTRY: dict[str, OpDef] = {}
_ALIASES: dict[str, str] = {}


def op(name: str, **kwargs: Any) -> OpDef:
    """Declare and register an operator; attach rules with its decorators."""
    assert name not in _REGISTRY and name not in _ALIASES, f"op {name!r} registered twice"
    d = OpDef(name, **kwargs)
    _REGISTRY[name] = d
    for alias in d.aliases:
        assert alias not in _REGISTRY and alias not in _ALIASES, f"alias {alias!r} taken"
        _ALIASES[alias] = name
    return d


def lookup(name: str) -> OpDef | None:
    """The op with this name or alias, or None."""
    return _REGISTRY.get(_ALIASES.get(name, name))


def all_ops() -> list[OpDef]:
    """Every registered op, in registration order."""
    return list(_REGISTRY.values())


def suggest(name: str) -> str:
    """A ` did you mean ...?` suffix for an unknown op name ('' if nothing is close)."""
    close = difflib.get_close_matches(name, list(_REGISTRY) + list(_ALIASES), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def check_registry() -> None:
    """Fail loudly (at import) if any entry lacks a rule it needs."""
    problems = [f"{d.name}: missing {', '.join(d.missing_rules())}"
                for d in _REGISTRY.values() if d.missing_rules()]
    for d in _REGISTRY.values():
        if (d.integer_op or "precision" in d.rules) and not d.precision_rule:
            problems.append(f"{d.name}: missing precision_rule (words for `cvmc ops`)")
        if ("interval" in d.rules) != bool(d.interval_rule):
            problems.append(f"{d.name}: an interval rule and its interval_rule words come "
                            f"together")
        if d.out_kind == "numeric" and not (
                "precision" in d.rules and d.precision_rule):
            problems.append(f"{d.name}: a numeric result needs a precision rule and its "
                            f"precision_rule words (integer results)")
        optional = [i.endswith("?") for i in d.inputs]
        if any(o and not later for o, later in itertools.pairwise(optional)):
            problems.append(f"{d.name}: optional inputs must come last")
        spellings = [(d.cvm_name, d.aliases)] + [(at.cvm_name, at.aliases) for at in d.attrs]
        if any(cvm not in ("", d.name, *aliases) for cvm, aliases in spellings):
            problems.append(f"{d.name}: a CVM-Runtime spelling (cvm_name) must be an alias")
        if not set(d.packed_on) | set(d.epilogue_on) <= set(d.backends):
            problems.append(f"{d.name}: packed_on / epilogue_on name a target outside its "
                            f"backends {d.backends}")
        if d.multiply_add and "arith" not in d.rules:
            problems.append(f"{d.name}: multiply_add needs its own arith rule (2 per "
                            f"multiply-add)")
        bad = set(d.rules) - set(_RULES)
        if bad:
            problems.append(f"{d.name}: unknown rules {sorted(bad)}")
    if problems:
        raise RuntimeError("operator registry is incomplete:\n  " + "\n  ".join(problems))
