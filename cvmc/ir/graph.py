"""Graph IR: a flat, topologically ordered list of op nodes over named tensor values.

Graph inputs (NNEF `external`) and weights (`variable` / `constant`) are not nodes:
inputs are listed in `Graph.inputs`, weights carry their data in `Graph.constants`.
A `variable` is also listed in `Graph.labels` (its .dat label); one whose data file is
absent (a graph shipped without weights) is in `labels` but not in `constants`: it can be
shape-checked, and anything that needs its values reports the missing file.
Every value name (input, weight, node output) has a `TensorType` in `Graph.types`, and
every loader returns the graph typed (`Graph.typed`): each integer tensor has its
precision. The op rules type it, in one place: `cvmc.ops.infer.retype`.
A Graph is frozen: its fields are never assigned and its containers never changed in
place; a pass builds a new one (`Graph.replace`, or the typed editor of `cvmc.ir.rewrite`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cvmc.errors import CvmcError, SourceSpan

INT_DTYPES = ("int8", "int32")
DTYPES = (*INT_DTYPES, "float32", "bool")


def storage_dtype(precision: int) -> str:
    """The storage dtype of an integer tensor: int8 when it fits (precision <= 8), else int32."""
    return "int8" if precision <= 8 else "int32"


@dataclass(frozen=True)
class TensorType:
    """Shape, element type and (for integer tensors) CVM precision in bits, 1..32.

    dtype is one of int8, int32 (CVM integer tensors), float32 (NNEF `scalar`) or
    bool (NNEF `logical`). precision is None for non-integer types, and for integer ones
    until the graph is typed (`cvmc.ops.infer.retype`).
    """

    shape: tuple[int, ...]
    dtype: str = "int32"
    precision: int | None = None

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        """Rank."""
        return len(self.shape)

    @property
    def is_integer(self) -> bool:
        """True for CVM integer tensors."""
        return self.dtype in INT_DTYPES

    def with_precision(self, precision: int) -> TensorType:
        """This type with a precision and the storage dtype that goes with it."""
        return TensorType(self.shape, storage_dtype(precision), precision)


@dataclass(frozen=True, eq=False)
class Node:
    """One op application: `outputs = op(inputs, attrs)`.

    `inputs` holds value names; an absent optional (trailing) input is simply left out.
    `attrs` holds every attribute of the op, defaults filled in, canonical spellings.
    `origin` is the compound fragment of the NNEF stdlib (`softmax`, `linear`, ...) whose
    call in the document expanded into this node (the call is at `span`); None for an op
    the document calls itself, and for nodes a pass or a Python builder makes.
    """

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    span: SourceSpan | None = None
    origin: str | None = None

    @property
    def name(self) -> str:
        """The node's instance name: its first output."""
        return self.outputs[0]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Node) and self.op == other.op and self.inputs == other.inputs
                and self.outputs == other.outputs and dict(self.attrs) == dict(other.attrs))

    def __hash__(self) -> int:
        return hash((self.op, self.inputs, self.outputs))


class InvalidGraph(CvmcError):
    """A graph that breaks the IR's invariants (`Graph.verify`): a cvmc bug, or a graph
    built by hand that is not well formed."""


@dataclass(frozen=True)
class Graph:
    """A whole model: its signature, nodes, value types and weight data."""

    name: str
    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    types: dict[str, TensorType]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # weight name -> NNEF .dat label
    quant: dict[str, dict[str, Any]] = field(default_factory=dict)  # graph.quant entries
    # Where each weight is declared in the source text, for errors found after parsing.
    spans: dict[str, SourceSpan] = field(default_factory=dict)
    # The kernel partition the fusion pass chose: node names (first outputs) per kernel, in
    # execution order; empty until the pass has run.
    kernels: list[list[str]] = field(default_factory=list)
    # True once `cvmc.ops.infer.retype` has typed the graph: every integer tensor has its
    # precision. It stays False where precisions may be unknown (None), so that the graph
    # can be checked but neither compiled nor run: it was loaded without the data of an
    # integer weight that declares no precision (CVM takes a weight's precision from its
    # values, so none can be known downstream of it); such a graph keeps the types its
    # frontend declared.
    typed: bool = False

    def replace(self, **changes: Any) -> Graph:
        """A shallow copy with some fields replaced (containers are copied)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.update(changes)
        if "nodes" in changes and "kernels" not in changes:
            fields["kernels"] = []  # new nodes: the old partition no longer applies
        for k in ("inputs", "outputs", "nodes"):
            fields[k] = list(fields[k])
        fields["kernels"] = [list(k) for k in fields["kernels"]]
        for k in ("types", "constants", "labels", "quant", "spans"):
            fields[k] = dict(fields[k])
        return Graph(**fields)

    def producers(self) -> dict[str, Node]:
        """Map from value name to the node that produces it."""
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        """Map from value name to the nodes that read it (in order)."""
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                users.setdefault(i, []).append(n)
        return users

    def weights(self) -> list[str]:
        """Weight names: variables (with or without data) and constants."""
        return list(dict.fromkeys([*self.labels, *self.constants]))

    def values(self) -> Iterator[str]:
        """Every value name: inputs, weights, then node outputs in order."""
        yield from self.inputs
        yield from self.weights()
        for n in self.nodes:
            yield from n.outputs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (self.inputs == other.inputs and self.outputs == other.outputs
                and self.nodes == other.nodes and self.types == other.types
                and self.typed == other.typed
                and self.constants.keys() == other.constants.keys()
                and all(np.array_equal(v, other.constants[k]) for k, v in self.constants.items()))

    def verify(self) -> None:
        """Check structural invariants and that every value is typed; an `InvalidGraph`
        names the node or value that breaks one. That the types agree with the op rules
        is `cvmc.ops.infer.verify` (the registry lies above this layer)."""
        defined = set(self.inputs) | set(self.weights())
        for n in self.nodes:
            for i in n.inputs:
                _check(i in defined, f"node '{n.name}': input {i!r} used before definition")
            for o in n.outputs:
                _check(o not in defined, f"value {o!r} assigned twice")
                defined.add(o)
        for name in self.outputs:
            _check(name in defined, f"output {name!r} is not defined")
        _check(set(self.types) == defined,
               f"types of values the graph does not define: {sorted(set(self.types) - defined)}, "
               f"values without a type: {sorted(defined - set(self.types))}")
        for name, t in self.types.items():
            _verify_type(name, t, self.typed)
        if self.kernels:
            order = [n.name for n in self.nodes]
            _check([name for k in self.kernels for name in k] == order,
                   "the kernels must hold every node once, in order")


def _check(holds: bool, problem: str) -> None:
    """Raise `InvalidGraph(problem)` unless `holds`."""
    if not holds:
        raise InvalidGraph(f"invalid graph: {problem}")


def _verify_type(name: str, t: TensorType, typed: bool) -> None:
    """A whole type: a shape of dims, a known dtype; an integer one's precision in 1..32
    with its storage dtype (None only in a graph that is not `typed`), no other's."""
    _check(isinstance(t.shape, tuple) and all(isinstance(d, int) and d >= 0 for d in t.shape),
           f"value {name!r}: shape {t.shape!r} is not a tuple of dims")
    _check(t.dtype in DTYPES, f"value {name!r}: unknown dtype {t.dtype!r}")
    if not t.is_integer:
        _check(t.precision is None, f"value {name!r}: a {t.dtype} tensor has a precision")
    elif typed or t.precision is not None:
        _check(t.precision is not None, f"value {name!r}: integer tensor without a precision")
        _check(1 <= t.precision <= 32, f"value {name!r}: precision {t.precision} not in 1..32")
        _check(not typed or t.dtype == storage_dtype(t.precision),
               f"value {name!r}: precision {t.precision} is stored as "
               f"{storage_dtype(t.precision)}, not {t.dtype}")
