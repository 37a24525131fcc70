"""Tensors that enter a graph from text: external, variable, constant and literal numbers.

Also the CVM-Runtime size limits (every dim 1..2^24, volume <= 2^30), checked on every
declared or inferred shape before anything is allocated.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
from collections.abc import Iterator
from typing import Any

import numpy as np

from cvmc.errors import CvmcError, SourceSpan
from cvmc.frontend.container import check_label
from cvmc.frontend.fragments import (
    DTYPE_OF,
    NO_DEFAULT,
    Fragment,
    Param,
    Tensor,
    check_value,
    is_tensor_type,
    show_value,
    stdlib,
)
from cvmc.frontend.syntax import Source, span_of
from cvmc.frontend.tensorfile import HEADER_SIZE
from cvmc.ir import TensorType
from cvmc.ops.common import integer_data_error, prec_max

MAX_CONSTANT_VOLUME = 2**24  # elements of one literal `constant` tensor

MAX_DIM = 1 << 24
MAX_VOLUME = 1 << 30
NP_DTYPE = {"int32": np.int32, "float32": np.float32, "bool": np.bool_}
FLOAT32_MAX = float(np.finfo(np.float32).max)


def float32_rounding(value: int) -> str | None:
    """Why float32 cannot hold the Python int `value` exactly ('V is not a float32 value: it
    rounds to F'), or None when it can. Values beyond float32's range are the range checks'
    to refuse."""
    if not abs(value) <= FLOAT32_MAX:
        return None
    nearest = np.float32(value)
    if int(nearest) == value:
        return None
    return f"{value!r} is not a float32 value: it rounds to {float(nearest)!r}"


class TensorFactory:
    """Value names, types and weights of the graph being built."""

    def __init__(self, source: Source, weights: Any):
        self.source = source
        self.weights = weights  # a container.ModelSource, or None: no .dat files are read
        # (name, shape, dtype, precision, where) of each variable, read after the graph
        self.variables: list[tuple[str, tuple[int, ...], str, int | None, Any]] = []
        self.types: dict[str, TensorType] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.labels: dict[str, str] = {}
        self.spans: dict[str, SourceSpan] = {}  # weight -> where it is declared
        self.reserved: set[str] = set()  # every name the document assigns
        self.hint = "t"  # the current graph statement's first name
        self.counter = 0

    def err(self, message: str, where: Any) -> CvmcError:
        """A CvmcError at a tree node / token of the user's document."""
        return self.source.error(message, where)

    def span(self, where: Any) -> SourceSpan | None:
        """The span of a tree node / token, if any."""
        return span_of(self.source.filename, where) if getattr(where, "line", None) else None

    def fresh(self) -> str:
        """A new value name `<hint>__<n>` that no user name and no value uses."""
        while True:
            self.counter += 1
            name = f"{self.hint}__{self.counter}"
            if name not in self.reserved and name not in self.types:
                return name

    def check_shape(self, name: str, shape: Any, where: Any) -> tuple[int, ...]:
        """Validate a shape against CVM-Runtime's limits; returns it as a tuple."""
        if not isinstance(shape, (list, tuple)) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise self.err(f"tensor '{name}': shape must be a list of integers, got {shape}",
                           where)
        for d in shape:
            if not 1 <= d <= MAX_DIM:
                raise self.err(f"tensor '{name}': dimension {d} in shape {list(shape)} is "
                               f"outside 1..{MAX_DIM} (CVM-Runtime limit)", where)
        volume = int(np.prod(shape, dtype=object)) if shape else 1
        if volume > MAX_VOLUME:
            raise self.err(f"tensor '{name}': shape {list(shape)} has {volume} elements, "
                           f"more than {MAX_VOLUME} (CVM-Runtime limit)", where)
        return tuple(shape)

    def literal_tensor(self, value: Any, where: Any) -> Tensor:
        """A number/logical literal used as a tensor: a shape-[] constant."""
        dtype = "bool" if isinstance(value, bool) else \
            "int32" if isinstance(value, int) else "float32"
        name = self.fresh()
        if dtype == "int32" and abs(value) > prec_max(32):  # a Python int: exact
            raise self.err(f"integer literal {value} does not fit int32 (precision 32): "
                           f"|v| <= {prec_max(32)}", where)
        if dtype == "float32" and not abs(value) <= FLOAT32_MAX:
            raise self.err(f"scalar literal {value} does not fit float32 (|v| <= "
                           f"{FLOAT32_MAX:.8g})", where)
        self.constants[name] = np.array(value, dtype=NP_DTYPE[dtype])
        self.types[name] = TensorType((), dtype)
        return Tensor(name, dtype)

    # ---- external / variable / constant --------------------------------------------------
    def introduce(self, op: str, generic: str | None, pos: list, named: dict, where: Any,
                  name: str) -> Tensor:
        """Declare a graph input or weight named `name`."""
        args = self.introducer_args(op, generic, pos, named, where)
        dtype = DTYPE_OF.get(args["__type"])
        if dtype is None:
            raise self.err(f"{op}: element type must be integer, scalar or logical, "
                           f"got {args['__type']}", where)
        shape = self.check_shape(name, args["shape"], where)
        precision = args.get("precision")
        if precision is not None and (dtype != "int32" or not 1 <= precision <= 32):
            raise self.err(f"{op} '{name}': precision must be in 1..32 and applies to "
                           f"{op}<integer> only, got {precision} for {op}<{args['__type']}>",
                           where)
        if op == "variable":
            self.labels[name] = args["label"]
            self.spans[name] = self.span(where)
            with self.located_at(where):  # a bad label: point at the variable
                check_label(args["label"])  # also when no files are read (NNEF 4.1.3)
            self.variables.append((name, shape, dtype, precision, where))
        elif op == "constant":
            self.constants[name] = self.constant_data(name, args["value"], shape, dtype, where)
            problem = dtype == "int32" and integer_data_error(self.constants[name], precision)
            if problem:
                raise self.err(f"constant '{name}': {problem}", where)
        self.types[name] = TensorType(shape, dtype, precision)
        return Tensor(name, dtype)

    def load_weights(self) -> None:
        """Read and check every variable's .dat file, in the order the model stores them:
        an archive is read in one forward pass, and only the members the graph names."""
        if self.weights is None:
            return
        labels = {self.labels[v[0]] for v in self.variables}
        rank = {label: i for i, label in enumerate(self.weights.storage_order(labels))}
        read: dict[str, np.ndarray | None] = {}  # one read per label, however many use it
        for name, shape, dtype, precision, where in sorted(
                self.variables, key=lambda v: rank[self.labels[v[0]]]):
            label = self.labels[name]
            if label not in read:
                # The graph bounds the file: at most 64 bits per declared element.
                limit = HEADER_SIZE + 8 * int(np.prod(shape, dtype=object))
                with self.located_at(where):  # a bad .dat file: point at the variable
                    read[label] = self.weights.read_tensor(label, limit)
            if read[label] is not None:
                self.constants[name] = self.checked_data(name, read[label], shape, dtype,
                                                         precision, where)

    @contextlib.contextmanager
    def located_at(self, where: Any) -> Iterator[None]:
        """Give a CvmcError raised inside (about a file) the document location `where`."""
        try:
            yield
        except CvmcError as e:
            raise e.located(self.span(where), self.source.line(where.line)) from None

    def introducer_args(self, op: str, generic: str | None, pos: list, named: dict,
                        where: Any) -> dict[str, Any]:
        """Bind external/variable/constant arguments: the stdlib signature plus the cvmc
        dialect's optional `precision`."""
        decl = stdlib()[op]
        with_precision = dataclasses.replace(
            decl, params=[*decl.params, Param("precision", ("prim", "integer"), None)])
        values = self.bind_fragment(with_precision, generic, pos, named, where)
        values["__type"] = generic or decl.generic_default
        return values

    def bind_fragment(self, frag: Fragment, generic: str | None, pos: list[Any],
                      named: dict[str, Any], where: Any) -> dict[str, Any]:
        """Bind call arguments to a fragment's parameters and type-check them."""
        if len(pos) > len(frag.params):
            raise self.err(f"{frag.name}: takes {len(frag.params)} arguments, "
                           f"{len(pos)} given", where)
        for p, a in zip(frag.params, pos):
            if not is_tensor_type(p.type):  # NNEF 3.2: attribute values must be named
                raise self.err(f"{frag.name}: attribute '{p.name}' given as a positional "
                               f"argument; only tensor arguments may be positional, write "
                               f"'{p.name} = ...'", where)
        values = {p.name: a.value for p, a in zip(frag.params, pos)}
        for key, a in named.items():
            if frag.param(key) is None:
                close = difflib.get_close_matches(key, [p.name for p in frag.params], n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise self.err(f"{frag.name}: unknown argument '{key}'{hint}", where)
            if key in values:
                raise self.err(f"{frag.name}: argument '{key}' given twice", where)
            values[key] = a.value
        gen = generic or frag.generic_default
        for p in frag.params:
            if p.name not in values:
                if p.default is None:  # an optional parameter, absent
                    continue
                if p.default is NO_DEFAULT:
                    raise self.err(f"{frag.name}: missing required argument '{p.name}'", where)
                values[p.name] = p.default
            bad = check_value(values[p.name], p.type, gen)
            if bad:
                raise self.err(f"{frag.name}: argument '{p.name}' must be {bad}, got "
                               f"{show_value(values[p.name])}", where)
        return values

    def checked_data(self, name: str, data: np.ndarray, shape: tuple[int, ...], dtype: str,
                     precision: int | None, where: Any) -> np.ndarray:
        """A variable's .dat contents, checked against its declaration."""
        if tuple(data.shape) != shape:
            raise self.err(f"variable '{name}': data file '{self.labels[name]}.dat' has shape "
                           f"{list(data.shape)}, but the variable declares {list(shape)}",
                           where)
        if dtype == "int32":
            problem = integer_data_error(data, precision)
            if problem:
                raise self.err(f"variable '{name}': data file '{self.labels[name]}.dat': "
                               f"{problem}", where)
            # Checked: every value fits int32, so the narrowing below changes none.
            return data.astype(np.int32)
        return data

    def constant_data(self, name: str, value: list, shape: tuple[int, ...], dtype: str,
                      where: Any) -> np.ndarray:
        """A constant's values: one value broadcast, or one per element."""
        volume = int(np.prod(shape, dtype=np.int64))
        if volume > MAX_CONSTANT_VOLUME:
            # A literal constant is written out in the graph text; anything this large
            # belongs in a variable's .dat file, and must not cost gigabytes to check.
            raise self.err(f"constant '{name}': {volume} elements is more than a literal "
                           f"constant may hold ({MAX_CONSTANT_VOLUME}); use a variable with "
                           f"a .dat file", where)
        if len(value) not in (1, volume):
            raise self.err(f"constant '{name}': value has {len(value)} items; expected 1 or "
                           f"{volume} (the volume of shape {list(shape)})", where)
        # Checked as Python ints before the int32 array exists (which would overflow).
        problem = dtype == "int32" and integer_data_error(np.array(value, dtype=object), None)
        if problem:
            raise self.err(f"constant '{name}': {problem}", where)
        arr = np.array(value, dtype=NP_DTYPE[dtype])
        return np.full(shape, arr[0]) if len(value) == 1 else arr.reshape(shape)


