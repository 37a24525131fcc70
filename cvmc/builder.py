"""`cvmc.GraphBuilder`: build a graph from Python, CINN's CinnBuilder way (README, "Python
GraphBuilder (CINN primitives)").

    b = cvmc.GraphBuilder("net")
    x = b.input("x", [1, 3, 8, 8], "float32")
    z = b.relu(b.add(x, b.const_scalar(0.5)))
    g = b.build(outputs=[z])          # the Graph the NNEF text frontend makes

Every call is one call of cvmc's NNEF text, evaluated by the text frontend's own
evaluator (`cvmc.frontend.semantics`), so a built graph is exactly the graph its printed
text parses to (`print_graph` round-trips) and every rule is checked once, in one place.
Methods:
- one per CINN primitive, named as in the spec in snake_case with the spec's argument
  names: the `cinn.<name>` ops of `cvmc.ops.cinn` (`conv` is not implemented yet);
- every other operation cvmc's text accepts (CVM operators, NNEF standard operations and
  the standard library's compound fragments) under its text name, resolved as the text
  resolves it (`b.relu(x)` is `relu(x)`: CVM's relu on integers, NNEF's on floats); a
  text name that is also a CINN method takes the prefix `nnef_` (`b.nnef_max(x, axes=[1])`
  is the text `max(x, axes = [1])`, CVM's reduce); a namespaced op takes `_` for its dot
  (`b.onednn_convolution(...)`). These are generated from the registry and the standard
  library.
Tensor arguments are `Var`s of this builder or Python numbers (shape-[] constants, as
literals in text), positional or by their input names (`bias=b`, as in text; None leaves an
optional one out); a Python int that becomes a float32 constant must be one float32
holds exactly (`2**40 + 1` is refused; `np.float32(2**40 + 1)` asks for the rounding), while
a float rounds to the nearest float32, as NNEF reads a decimal literal; attributes are
keywords; `name=` names the result. Shapes and types (with integer precisions) are
inferred as each call is made: a bad call raises a CvmcError naming the op and the rule,
at the call.
"""
from __future__ import annotations

import functools
import inspect
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass
from keyword import iskeyword
from typing import Any

import numpy as np

from cvmc.errors import CvmcError, check_argument
from cvmc.frontend.fragments import NO_DEFAULT, Tensor, stdlib
from cvmc.frontend.semantics import Arg, Scope, caller_number
from cvmc.frontend.semantics import GraphBuilder as _Evaluator
from cvmc.frontend.syntax import KEYWORDS, Source
from cvmc.ir import Graph, TensorType
from cvmc.ops import all_ops, lookup
from cvmc.ops.common import integer_data_error
from cvmc.ops.infer import infer_node, retype, source_type
from cvmc.ops.registry import REQUIRED

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DTYPES = {"float32": "scalar", "int32": "integer", "int8": "integer", "bool": "logical"}


@dataclass(frozen=True)
class Var:
    """A tensor of a graph being built: its value name, shape, element dtype (float32,
    int32 for every CVM integer, bool) and inferred precision (integers)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    precision: int | None
    builder: GraphBuilder

    def __repr__(self) -> str:
        prec = f", precision={self.precision}" if self.precision is not None else ""
        return f"Var({self.name!r}, shape={list(self.shape)}, dtype={self.dtype!r}{prec})"


def _unary(op: str, what: str):
    """The builder method of a one-input CINN primitive."""
    def method(self, x: Var, name: str | None = None) -> Var:
        return self._call(f"cinn.{op}", [x], {}, name)
    return _documented(method, op, what)


def _binary(op: str, what: str):
    """The builder method of a two-input CINN primitive."""
    def method(self, x: Var, y: Var, name: str | None = None) -> Var:
        return self._call(f"cinn.{op}", [x, y], {}, name)
    return _documented(method, op, what)


def _documented(method, op: str, what: str):
    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"{what} (`cinn.{op}`: {lookup('cinn.' + op).types})."
    return method


class GraphBuilder:
    """Builds a `cvmc.ir.Graph` call by call; see the module docstring."""

    def __init__(self, name: str = "net"):
        _check_name(name, "graph name")
        self.name = name
        self._eval = _Evaluator(Source("", f"<GraphBuilder {name}>"), {}, None)
        self._scope = Scope()
        self._inputs: list[str] = []
        # types with inferred precisions as each call adds its nodes, to reject a bad call
        # where it is made (`build` types the whole graph again, with `retype`)
        self._inferred: dict[str, TensorType] = {}
        self._producers: dict[str, Any] = {}

    # ---- tensors entering the graph --------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str,
              precision: int | None = None) -> Var:
        """A graph input. dtype: float32, int32, int8 or bool; integer inputs are CVM
        integers and need `precision` (1..32; int8: at most 8, default 8)."""
        self._check_new(name)
        kind = _DTYPES.get(dtype)
        if kind is None:
            raise CvmcError(f"input '{name}': dtype must be one of {', '.join(_DTYPES)}, got "
                            f"{dtype!r}")
        if dtype == "int8":
            precision = 8 if precision is None else precision
            if not (isinstance(precision, int) and 1 <= precision <= 8):
                raise CvmcError(f"input '{name}': an int8 input has precision 1..8, got "
                                f"{precision}")
        if kind == "integer" and precision is None:
            raise CvmcError(f"input '{name}': an integer input needs precision= (1..32: "
                            f"|v| <= 2^(p-1) - 1)")
        named = {"shape": Arg(_int_list(shape, f"input '{name}': shape"), None)}
        if precision is not None:
            named["precision"] = Arg(precision, None)
        self._eval.introduce("external", kind, [], named, None, name)
        self._inputs.append(name)
        return self._var(name)

    def constant(self, array, name: str | None = None, precision: int | None = None) -> Var:
        """A weight holding `array`: float arrays become float32 (rounded to nearest, every
        value finite), bool arrays bool, integer arrays CVM integers (precision given, or the smallest that holds the data)."""
        name = self._fresh_or(name, "const")
        arr = np.asarray(array)
        kind = {"f": "float32", "b": "bool", "i": "int32", "u": "int32"}.get(arr.dtype.kind)
        if kind is None:
            raise CvmcError(f"constant '{name}': holds {arr.dtype} values; expected numbers "
                            f"or logicals")
        self._eval.check_shape(name, list(arr.shape), None)
        if kind == "int32":
            if precision is not None and not (isinstance(precision, int)
                                              and 1 <= precision <= 32):
                raise CvmcError(f"constant '{name}': precision must be in 1..32, got "
                                f"{precision}")
            problem = integer_data_error(arr, precision)
            if problem:
                raise CvmcError(f"constant '{name}': {problem}")
        elif precision is not None:
            raise CvmcError(f"constant '{name}': precision applies to integer data only")
        if kind == "float32":
            with np.errstate(over="ignore"):
                arr = arr.astype(np.float32)
            if not np.isfinite(arr).all():
                bad = np.argwhere(~np.isfinite(arr))[0].tolist()
                raise CvmcError(f"constant '{name}': value at index {bad} is not a finite "
                                f"float32 (NNEF text has no literal for it)")
        self._eval.constants[name] = arr.astype(kind)
        self._eval.types[name] = TensorType(tuple(arr.shape), kind, precision)
        return self._var(name)

    def const_scalar(self, value: float | bool, name: str | None = None) -> Var:
        """A shape-[] constant (`cinn.const_scalar`): an int is a CVM integer (the smallest
        precision holding it), a float a float32 (rounded to nearest), a bool a logical."""
        if isinstance(value, np.generic):
            value = value.item()
        return self._call("cinn.const_scalar", [], {"value": value}, name)

    # ---- CINN primitives -------------------------------------------------------------------
    abs = _unary("abs", "Element-wise |x|")
    acos = _unary("acos", "Element-wise arc-cosine")
    acosh = _unary("acosh", "Element-wise hyperbolic arc-cosine")
    asin = _unary("asin", "Element-wise arc-sine")
    asinh = _unary("asinh", "Element-wise hyperbolic arc-sine")
    atan = _unary("atan", "Element-wise arc-tangent")
    atanh = _unary("atanh", "Element-wise hyperbolic arc-tangent")
    bitwise_not = _unary("bitwise_not", "Element-wise ~x (two's complement: -x - 1)")
    ceil = _unary("ceil", "Element-wise ceiling")
    cos = _unary("cos", "Element-wise cosine")
    cosh = _unary("cosh", "Element-wise hyperbolic cosine")
    erf = _unary("erf", "Element-wise Gauss error function")
    exp = _unary("exp", "Element-wise e^x")
    floor = _unary("floor", "Element-wise floor")
    identity = _unary("identity", "The input, copied")
    is_finite = _unary("is_finite", "Element-wise: x is finite (integers: always)")
    is_inf = _unary("is_inf", "Element-wise: x is +-inf (integers: never)")
    is_nan = _unary("is_nan", "Element-wise: x is NaN (integers: never)")
    log = _unary("log", "Element-wise natural logarithm")
    log10 = _unary("log10", "Element-wise base-10 logarithm")
    log2 = _unary("log2", "Element-wise base-2 logarithm")
    logical_not = _unary("logical_not", "Element-wise !x")
    negative = _unary("negative", "Element-wise -x")
    round = _unary("round", "Element-wise nearest integer, halves away from zero")
    rsqrt = _unary("rsqrt", "Element-wise 1 / sqrt(x) (two float32 roundings)")
    sign = _unary("sign", "Element-wise -1, 0 or 1 (floats: NaN stays NaN)")
    sin = _unary("sin", "Element-wise sine")
    sinh = _unary("sinh", "Element-wise hyperbolic sine")
    sqrt = _unary("sqrt", "Element-wise square root")
    tan = _unary("tan", "Element-wise tangent")
    tanh = _unary("tanh", "Element-wise hyperbolic tangent")
    trunc = _unary("trunc", "Element-wise rounding toward zero")

    add = _binary("add", "x + y (NumPy broadcasting)")
    sub = _binary("sub", "x - y")
    mul = _binary("mul", "x * y")
    div = _binary("div", "x / y; integers truncate, x / 0 = 0")
    floor_div = _binary("floor_div", "floor(x / y); integers: x / 0 = 0")
    floor_mod = _binary("floor_mod", "x - y * floor(x / y), the sign of y; integers: x mod 0 = 0")
    mod = _binary("mod", "C's remainder x % y (fmodf), the sign of x; integers: x % 0 = 0")
    max = _binary("max", "Element-wise maximum (floats: IEEE 754-2019, NaN wins, +0 > -0)")
    min = _binary("min", "Element-wise minimum (floats: IEEE 754-2019, NaN wins, -0 < +0)")
    power = _binary("power", "x^y; integers: exact, x^-k = trunc(1 / x^k)")
    pow = power
    dot = _binary("dot", "x^T y: matrix / vector products of rank-1 and rank-2 operands")
    bitwise_and = _binary("bitwise_and", "x & y")
    bitwise_or = _binary("bitwise_or", "x | y")
    bitwise_xor = _binary("bitwise_xor", "x ^ y")
    left_shift = _binary("left_shift", "x << y = x * 2^y (a negative y shifts by 0)")
    right_shift = _binary("right_shift", "x >> y = floor(x / 2^y), arithmetic (a negative y "
                                         "shifts by 0)")
    logical_and = _binary("logical_and", "x && y")
    logical_or = _binary("logical_or", "x || y")
    logical_xor = _binary("logical_xor", "(x || y) && !(x && y)")

    def broadcast_to(self, var: Var, out_shape: Sequence[int],
                     broadcast_axes: Sequence[int] | None = None,
                     name: str | None = None) -> Var:
        """`var` broadcast to `out_shape`: input axis i is output axis broadcast_axes[i]
        (strictly increasing; default: the trailing axes, as NumPy aligns them)."""
        if broadcast_axes is None:
            rank = len(getattr(var, "shape", ()))
            broadcast_axes = list(range(len(out_shape) - rank, len(out_shape)))
        return self._call("cinn.broadcast_to", [var], {
            "out_shape": out_shape, "broadcast_axes": broadcast_axes}, name)

    def compare(self, x: Var, y: Var, kind: str, name: str | None = None) -> Var:
        """x (kind) y element-wise, a logical tensor; kind: eq, ne, ge, gt, le, lt (or the
        spec's kEq ... kLt). On NaN every kind is false but ne."""
        return self._call("cinn.compare", [x, y], {"kind": _spec_kind(kind)}, name)

    def concat(self, input_vars: Sequence[Var], axis: int = 0,
               name: str | None = None) -> Var:
        """The tensors joined along an existing `axis`."""
        return self._call("cinn.concat", [list(input_vars)], {"axis": axis}, name)

    def conv(self, lhs: Var, rhs: Var, strides: Sequence[int] = (1, 1),
             paddings: Sequence[int] = (0, 0), dilations: Sequence[int] = (1, 1),
             groups: int = 1, conv_type: str = "forward", data_format: str = "NCHW",
             padding_algorithm: str = "EXPLICIT", output_shape: Sequence[int] = (),
             name: str | None = None) -> Var:
        """CINN's 2-D convolution (float32; filters OIHW): forward (lhs = x, rhs = filter),
        backward_data (lhs = filter, rhs = dy, output_shape = x's shape) or backward_filter
        (lhs = x, rhs = dy, output_shape = the filter's shape); see `cvmc.ops.cinn_conv`."""
        return self._call("cinn.conv", [lhs, rhs], {
            "strides": strides, "paddings": paddings, "dilations": dilations,
            "groups": groups, "conv_type": conv_type, "data_format": data_format,
            "padding_algorithm": padding_algorithm, "output_shape": output_shape}, name)

    def reduce(self, input: Var, kind: str, dim: Sequence[int] = (), keep_dim: bool = False,
               name: str | None = None) -> Var:
        """Reduce over axes `dim` (all when empty); kind: sum, prod, max, min (or kSum ...)."""
        return self._call("cinn.reduce", [input], {"kind": _spec_kind(kind), "dim": dim,
                                                   "keep_dim": keep_dim}, name)

    def reshape(self, input: Var, shape: Sequence[int], name: str | None = None) -> Var:
        """The elements in row-major order under `shape` (one -1 is inferred)."""
        return self._call("cinn.reshape", [input], {"shape": shape}, name)

    def reverse(self, input: Var, axis: Sequence[int], name: str | None = None) -> Var:
        """The elements reversed along each axis in `axis`."""
        return self._call("cinn.reverse", [input], {"axis": axis}, name)

    def select(self, condition: Var, true_value: Var, false_value: Var,
               name: str | None = None) -> Var:
        """condition ? true_value : false_value element-wise (NumPy broadcasting)."""
        return self._call("cinn.select", [condition, true_value, false_value], {}, name)

    def slice(self, input: Var, axes: Sequence[int], starts: Sequence[int],
              ends: Sequence[int], name: str | None = None) -> Var:
        """input[starts:ends] along `axes` (0 <= start < end <= extent)."""
        return self._call("cinn.slice", [input], {"axes": axes, "starts": starts,
                                                  "ends": ends}, name)

    def transpose(self, input: Var, axis: Sequence[int], name: str | None = None) -> Var:
        """The leading len(axis) axes permuted: output axis i is input axis axis[i]."""
        return self._call("cinn.transpose", [input], {"axis": axis}, name)

    def bn_mean_variance(self, input: Var, name: Sequence[str] | None = None
                         ) -> tuple[Var, Var]:
        """(sum x, sum x^2) per channel (axis 1) of a float32 tensor [N, C, ...]."""
        return self._call("cinn.bn_mean_variance", [input], {}, name)

    def bn_grad_bias_scale(self, input: Var, grad: Var, save_mean: Var,
                           name: Sequence[str] | None = None) -> tuple[Var, Var]:
        """(sum grad, sum grad * (input - save_mean)) per channel (axis 1), float32."""
        return self._call("cinn.bn_grad_bias_scale", [input, grad, save_mean], {}, name)

    # ---- the result ------------------------------------------------------------------------
    def build(self, outputs: Sequence[Var]) -> Graph:
        """The graph computing `outputs`, typed as the text frontend's is."""
        if isinstance(outputs, Var):
            outputs = [outputs]
        check_argument("build", "outputs", outputs, isinstance(outputs, Sequence),
                       "a Var or a list of them")
        names = [self._name_of(v, "output") for v in outputs]
        if not names:
            raise CvmcError("build: at least one output is needed")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise CvmcError(f"build: output {twice[0]!r} is listed twice")
        e = self._eval
        graph = Graph(self.name, list(self._inputs), names, list(e.nodes), dict(e.types),
                      dict(e.constants))
        graph.verify()
        return retype(graph)

    # ---- everything else the text accepts ------------------------------------------------
    def __getattr__(self, attr: str):
        text_name = _text_methods().get(attr)
        if text_name is None:
            raise AttributeError(f"'GraphBuilder' has no method {attr!r}")
        return types.MethodType(_text_call(text_name), self)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *_text_methods()})

    # ---- internals -------------------------------------------------------------------------
    def _call(self, op: str, tensors: list, attrs: dict[str, Any], name,
              named_tensors: dict[str, Any] | None = None) -> Any:
        """One call `op(tensors..., named_tensors..., attrs...)` as the text evaluates it
        (tensor inputs by name as in `conv(x, w, bias = b)`); returns its result Var(s)."""
        e = self._eval
        pos = [Arg(self._operand(t), None) for t in tensors]
        named = {**{k: Arg(self._operand(v), None) for k, v in (named_tensors or {}).items()},
                 **{k: Arg(_plain(v), None) for k, v in attrs.items()}}
        state = (len(e.nodes), set(e.types), set(e.constants), set(e.reserved))
        try:
            dest = self._dest(name)
            e.hint = op.rpartition(".")[2]  # fresh names: <op>__<n>
            result = e.call(op, None, pos, named, self._scope, dest, None)
            for node in e.nodes[state[0]:]:
                self._check(node)
        except CvmcError as err:
            self._undo(*state)  # a rejected call leaves the graph as it was
            # raised at this call: a line of the standard library would mislead
            raise CvmcError(err.message) from None
        if isinstance(result, (list, tuple)):
            return type(result)(self._var(t.name) for t in result)
        return self._var(result.name)

    def _undo(self, nodes: int, types: set[str], constants: set[str], reserved: set[str]
              ) -> None:
        """Forget the nodes and values a failed call added."""
        e = self._eval
        del e.nodes[nodes:]
        for k in set(e.types) - types:
            del e.types[k]
            self._inferred.pop(k, None)
        for k in set(e.constants) - constants:
            del e.constants[k]
        e.reserved.intersection_update(reserved)

    def _check(self, node) -> None:
        """Infer `node`'s result types (precisions) now, to reject a bad call here."""
        for value in node.inputs:
            self._source_type(value)
        # infer_node reads the result shapes the evaluator gave from `types`
        self._inferred.update({o: self._eval.types[o] for o in node.outputs})
        infer_node(node, self._inferred, self._producers)
        self._producers.update(dict.fromkeys(node.outputs, node))

    def _source_type(self, name: str) -> TensorType:
        """The inferred type of a value (inputs and weights: from their declaration and
        data, as precision inference gives them)."""
        if name not in self._inferred:
            self._inferred[name] = source_type(self._eval.types[name],
                                               self._eval.constants.get(name))
        return self._inferred[name]

    def _operand(self, v: Any) -> Any:
        """A call argument as the evaluator takes it: Vars as tensors, numbers as
        literals (an int that float32 must hold exactly where it becomes a scalar), lists
        element-wise."""
        if isinstance(v, np.ndarray):
            raise CvmcError(f"a tensor argument must be a Var of this builder or a number, "
                            f"got an array of shape {list(v.shape)}; wrap it with "
                            f"b.constant(array)")
        if isinstance(v, (list, tuple)):
            return [self._operand(x) for x in v]
        if isinstance(v, Var):
            return Tensor(self._name_of(v, "argument"), v.dtype)
        v = _plain(v)
        if isinstance(v, (int, float)):
            return caller_number(v)
        raise CvmcError(f"a tensor argument must be a Var of this builder or a number, got "
                        f"{type(v).__name__}")

    def _name_of(self, v: Any, what: str) -> str:
        if not isinstance(v, Var) or v.builder is not self:
            raise CvmcError(f"{what} {v!r} is not a Var of this GraphBuilder")
        return v.name

    def _var(self, name: str) -> Var:
        t, inferred = self._eval.types[name], self._source_type(name)
        return Var(name, t.shape, t.dtype, inferred.precision, self)

    def _dest(self, name: Any) -> Any:
        """The destination the evaluator names results by (None: fresh names)."""
        if name is None:
            return None
        if isinstance(name, (list, tuple)):
            return [self._dest(n) for n in name]
        self._check_new(name)
        self._eval.reserved.add(name)
        return name

    def _fresh_or(self, name: str | None, hint: str) -> str:
        if name is None:
            self._eval.hint = hint
            return self._eval.fresh()
        self._check_new(name)
        return name

    def _check_new(self, name: Any) -> None:
        _check_name(name, "tensor name")
        if name in self._eval.types or name in self._eval.reserved:
            raise CvmcError(f"tensor name {name!r} is already used in this graph")


def _check_name(name: Any, what: str) -> None:
    """Names must be NNEF identifiers (the printed text must parse)."""
    if not isinstance(name, str) or not _IDENT.match(name) or name in KEYWORDS:
        raise CvmcError(f"{what} {name!r} is not an NNEF identifier ([A-Za-z_][A-Za-z0-9_]* "
                        f"and not a keyword)")


def _int_list(values: Any, what: str) -> list[int]:
    if not isinstance(values, (list, tuple)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise CvmcError(f"{what} must be a list of integers, got {values!r}")
    return [int(v) for v in values]


def _plain(v: Any) -> Any:
    """Attribute values as Python values: NumPy scalars and 1-D arrays, tuples as lists."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray) and v.ndim == 1:
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


_SPEC_KINDS = {"kEq": "eq", "kNe": "ne", "kGe": "ge", "kGt": "gt", "kLe": "le", "kLt": "lt",
               "kSum": "sum", "kProd": "prod", "kMax": "max", "kMin": "min"}


def _spec_kind(kind: Any) -> Any:
    """The spec's enumerator spellings (kEq, kSum, ...) as the op's kind names."""
    return _SPEC_KINDS.get(kind, kind)


# ---- methods generated from the registry and the standard library -------------------------
_INTRODUCERS = ("external", "variable", "constant", "update")  # update: variables only


@functools.cache
def _text_methods() -> dict[str, str]:
    """{method name: text name} for every text-callable operation that is not a CINN
    primitive: registry ops (without `nnef.`) and the stdlib's compound fragments."""
    names = {d.name.removeprefix("nnef.") for d in all_ops() if not d.name.startswith("cinn.")}
    names |= {n for n, f in stdlib().items() if f.body is not None}
    own = {n for n in dir(GraphBuilder) if not n.startswith("_")}
    methods = {}
    for text in sorted(names - set(_INTRODUCERS)):
        # a namespaced op (`onednn.convolution`) becomes `onednn_convolution`
        method = f"nnef_{text}" if text in own else text.replace(".", "_")
        assert method not in methods and method not in own, method
        methods[method] = text
    return methods


@functools.cache
def _text_call(text_name: str):
    """The method calling `text_name`: tensors positional or by their input names,
    attributes as keywords."""
    doc, signature = _describe(text_name)
    by_name = {p.name for p in signature.parameters.values()
               if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}

    def method(self: GraphBuilder, *tensors: Any, name: Any = None, **attrs: Any) -> Any:
        while tensors and tensors[-1] is None:  # an optional input left out (bias=None)
            tensors = tensors[:-1]
        named = {k: attrs.pop(k) for k in by_name & set(attrs)}
        return self._call(text_name, list(tensors), {_attr_name(k): v for k, v in
                                                     attrs.items()}, name,
                          {k: v for k, v in named.items() if v is not None})
    method.__name__ = text_name
    method.__doc__, method.__signature__ = doc, signature
    return method


def _attr_name(keyword: str) -> str:
    """An attribute's name from its keyword: `lambda_` for NNEF's `lambda` (selu), which
    Python cannot take as a keyword."""
    bare = keyword.removesuffix("_")
    return bare if keyword != bare and iskeyword(bare) else keyword


def _keyword(attr: str) -> str:
    return attr + "_" if iskeyword(attr) else attr


def _describe(text_name: str) -> tuple[str, inspect.Signature]:
    """Docstring and signature of a generated method: the registry entries the text name
    resolves to, then the stdlib's compound fragment of that name."""
    P = inspect.Parameter
    entries = [d for d in (lookup(text_name), lookup("nnef." + text_name)) if d is not None]
    frag = stdlib().get(text_name)
    head = f"`{text_name}(...)` as cvmc's NNEF text resolves it (the first reading that " \
        f"accepts the call):"
    lines = [head]
    lines += [f"  {e.name} ({', '.join(e.seeds)}): inputs {', '.join(e.inputs)}"
              + (f"; {'; '.join(a.describe() for a in e.attrs)}" if e.attrs else "")
              + (f"; precision {e.precision_rule}" if e.precision_rule else "")
              for e in entries]
    params = [P("self", P.POSITIONAL_ONLY)]
    if entries:
        # Tensor inputs are named as the text names them (a variadic one only positionally,
        # as in text); an optional one left out is None.
        kind = P.POSITIONAL_ONLY if entries[0].variadic else P.POSITIONAL_OR_KEYWORD
        params += [P(i.strip("?*"), kind, default=None if i.endswith("?") else P.empty)
                   for i in entries[0].inputs]
        params += [P(_keyword(a.name), P.KEYWORD_ONLY,
                     default=P.empty if a.default is REQUIRED else a.default)
                   for a in entries[0].attrs]
    if frag is not None and frag.body is not None:
        lines.append("  the NNEF standard library fragment, expanded into the ops it calls")
    if not entries:
        params += [P(p.name, P.POSITIONAL_OR_KEYWORD,
                     default=P.empty if p.default is NO_DEFAULT else None)
                   for p in frag.params if p.type[0] == "tensor"]
        params += [P(_keyword(p.name), P.KEYWORD_ONLY,
                     default=P.empty if p.default is NO_DEFAULT else p.default)
                   for p in frag.params if p.type[0] != "tensor"]
    params.append(P("name", P.KEYWORD_ONLY, default=None))
    return "\n".join(lines), inspect.Signature(params)
