"""Pattern rewriting: rules as data, one driver, and an editor that types as it inserts.

A rule is `Rule(pattern, rewrite)`. A pattern describes a node by its op and, recursively,
by the nodes that compute its inputs:

    # select(x > y, x, y): the stdlib's max
    Rule(P("select", P("gt", V("x"), V("y")), V("x"), V("y")), to_select_max)

- `P(ops, *inputs, name=, where=, commute=, shared=)` matches a node whose op is `ops` (a
  name, or a set of names) and, where `inputs` are given, whose inputs match them in order
  (either order of two with `commute`); `where(editor, node)` is any further test (its
  attributes, its types); `name` binds the node.
- `V(name, where=)` matches any value (an input, a weight, a node's result); `name` binds
  the value's name and `where(editor, value)` tests it.
- A name bound twice binds one node, or one value, both times.
- Every node of a match but its root is private to it: no node outside the match reads it
  and it is no graph output (`shared=True` lifts that for one pattern). The rewrite
  replaces the match, so its private nodes are dropped.

`rewrite(match, editor)` returns the node that computes the root's outputs in its stead,
having inserted any nodes it reads first (`Editor.add`), or None to leave the root as it
is (inserting nothing). The driver, `apply_rules`, visits the nodes in order, tries the
rules on each (a replacement is tried again: select -> select_max -> select_clamp) and
hands back a new Graph (a Graph is frozen); `match` finds one pattern's match alone.

The editor types each node as it is inserted, by the op rules it is given (`infer`:
`cvmc.ops.infer.infer_node`, which lies above this layer); where a replacement gives a
value another type, the nodes that read it are typed again, node by node.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cvmc.ir.graph import Graph, Node, TensorType

# (node, types, producers) -> None: adds the types of node's outputs to `types`
Infer = Callable[[Node, dict[str, TensorType], dict[str, Node]], None]


@dataclass(frozen=True)
class Pattern:
    """A node pattern (`ops` set) or a value pattern (`ops` None); see the module doc."""

    ops: frozenset[str] | None
    inputs: tuple[Pattern, ...] | None = None
    name: str | None = None
    where: Callable[[Editor, Any], bool] | None = None
    commute: bool = False
    shared: bool = False


def P(ops: str | Iterable[str], *inputs: Pattern, name: str | None = None,
      where: Callable[[Editor, Node], bool] | None = None, commute: bool = False,
      shared: bool = False) -> Pattern:
    """A node of op `ops` (a name or names) whose inputs match `inputs` (none: any)."""
    return Pattern(frozenset([ops] if isinstance(ops, str) else ops), inputs or None, name,
                   where, commute, shared)


def V(name: str | None = None, where: Callable[[Editor, str], bool] | None = None) -> Pattern:
    """Any value, bound to `name`, for which `where(editor, value)` holds."""
    return Pattern(None, None, name, where)


@dataclass(frozen=True)
class Rule:
    """Where `pattern` matches, `rewrite(match, editor)` gives the root's replacement."""

    pattern: Pattern
    rewrite: Callable[[Match, Editor], Node | None]


class Match:
    """A match: the bound names (`m["x"]`: a Node or a value name), its root and its
    nodes."""

    def __init__(self, root: Node):
        self.root = root
        self.bound: dict[str, Node | str] = {}
        self.nodes: dict[int, tuple[Node, bool]] = {}  # id -> (node, shared)

    def __getitem__(self, name: str) -> Any:
        return self.bound[name]

    def copy(self) -> Match:
        """A match to extend on trial (dropped if the trial fails)."""
        m = Match(self.root)
        m.bound, m.nodes = dict(self.bound), dict(self.nodes)
        return m

    def bind(self, name: str | None, thing: Node | str) -> bool:
        """Bind `name` (if any) to `thing`; False if it is bound to another."""
        if name is None:
            return True
        old = self.bound.setdefault(name, thing)
        return old is thing or isinstance(thing, str) and old == thing


class Editor:
    """A graph under edit: nodes appended in order, each typed as it is inserted. `graph`
    is the graph being rewritten (its weights), `types` every value's type so far and
    `producers` the node that now computes each value."""

    def __init__(self, graph: Graph, infer: Infer):
        self.graph, self.infer = graph, infer
        self.types = dict(graph.types)
        self.nodes: list[Node] = []
        self.producers = graph.producers()  # each replacement takes its values over
        self.readers: dict[str, list[Node]] = {}
        for node in graph.nodes:
            self._read(node, +1)
        self.changed: set[str] = set()  # values whose type differs from `graph`'s
        self.dropped: set[int] = set()
        self.taken = set(graph.values())
        self.outputs = set(graph.outputs)

    def fresh(self, stem: str) -> str:
        """A value name not yet taken (and now taken)."""
        name, k = stem, 0
        while name in self.taken:
            k += 1
            name = f"{stem}_{k}"
        self.taken.add(name)
        return name

    def add(self, node: Node, declared: Sequence[TensorType | None] = (),
            at: int | None = None) -> Node:
        """Type `node` and append it (or insert it at index `at`, before the nodes that
        read it); `declared` gives its outputs' element types (a new name of a value that
        stands for another: that one's type)."""
        self._type(node, declared)
        self.nodes.insert(len(self.nodes) if at is None else at, node)
        return node

    def match(self, pattern: Pattern, node: Node) -> Match | None:
        """The match of `pattern` rooted at `node`, or None."""
        m = Match(node)
        if not self._node(pattern, node, m):
            return None
        inside = {id(n) for n, _ in m.nodes.values()}
        for n, shared in m.nodes.values():
            if n is not node and not shared and any(
                    o in self.outputs or any(id(r) not in inside for r in self.readers.get(o, ()))
                    for o in n.outputs):
                return None
        return m

    def value(self, pattern: Pattern, value: str, m: Match) -> bool:
        """Whether `value` matches `pattern`, extending `m` (left as it was if not)."""
        if pattern.ops is None:
            return (pattern.where is None or pattern.where(self, value)) and \
                m.bind(pattern.name, value)
        node = self.producers.get(value)
        return node is not None and self._node(pattern, node, m)

    def _node(self, p: Pattern, node: Node, m: Match) -> bool:
        """Whether `node` matches node pattern `p`, extending `m` (as it was if not)."""
        if node.op not in p.ops or p.where is not None and not p.where(self, node):
            return False
        if p.inputs is not None and len(p.inputs) != len(node.inputs):
            return False
        orders = [p.inputs or ()]
        if p.commute and len(orders[0]) == 2:
            orders.append(orders[0][::-1])
        for order in orders:
            trial = m.copy()
            if trial.bind(p.name, node) and all(
                    self.value(q, v, trial) for q, v in zip(order, node.inputs)):
                trial.nodes[id(node)] = (node, p.shared)
                m.bound, m.nodes = trial.bound, trial.nodes
                return True
        return False

    def visit(self, node: Node, rules: Sequence[Rule]) -> None:
        """Append `node`, or what the first rule that matches it makes of it (tried again)."""
        if self.changed.intersection(node.inputs):
            self._type(node, ())
        while True:
            for rule in rules:
                m = self.match(rule.pattern, node)
                count = len(self.nodes)
                new = None if m is None else rule.rewrite(m, self)
                if new is not None:
                    if new.outputs != node.outputs:
                        raise ValueError(f"a rule replaced node '{node.name}' by one that "
                                         f"computes {new.outputs}, not {node.outputs}")
                    break
                if len(self.nodes) != count:
                    raise ValueError(f"a rule declined node '{node.name}' after inserting")
            else:
                break
            for n, shared in m.nodes.values():
                if n is not node and not shared:
                    self.dropped.add(id(n))
                    self._read(n, -1)
            self._read(node, -1)
            self._read(new, +1)
            self._type(new, ())
            node = new
        self.nodes.append(node)

    def _read(self, node: Node, sign: int) -> None:
        """Count `node` among the readers of its inputs (+1), or no longer (-1)."""
        for i in dict.fromkeys(node.inputs):
            if sign > 0:
                self.readers.setdefault(i, []).append(node)
            else:
                self.readers[i] = [r for r in self.readers[i] if r is not node]

    def _type(self, node: Node, declared: Sequence[TensorType | None]) -> None:
        """Type `node`'s outputs by the op rules; note those whose type changed."""
        for o, t in zip(node.outputs, declared):
            if t is not None:
                self.types[o] = t
        self.infer(node, self.types, self.producers)
        self.producers.update((o, node) for o in node.outputs)
        self.taken.update(node.outputs)
        for o in node.outputs:
            if self.graph.types.get(o, self.types[o]) != self.types[o]:
                self.changed.add(o)

    def result(self, **changes: Any) -> Graph:
        """The edited graph (frozen), with `changes` to its other fields."""
        graph = self.graph.replace(
            nodes=[n for n in self.nodes if id(n) not in self.dropped], **changes)
        return graph.replace(types={v: self.types[v] for v in graph.values()})


def match(graph: Graph, pattern: Pattern, node: Node) -> Match | None:
    """The match of `pattern` rooted at `node` of `graph`, or None (no rewrite)."""
    def untyped(node: Node, types: dict, producers: dict) -> None:
        raise TypeError("match() inserts nothing")
    return Editor(graph, untyped).match(pattern, node)


def apply_rules(graph: Graph, rules: Sequence[Rule], infer: Infer) -> Graph:
    """`graph` with every match of `rules` rewritten, in one walk over its nodes."""
    editor = Editor(graph, infer)
    for node in graph.nodes:
        editor.visit(node, rules)
    return editor.result()
