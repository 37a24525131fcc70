"""Fixtures of the NNEF corpus tests."""
from __future__ import annotations

import pytest

from cvmc.ops import registry
from cvmc.ops.common import require
from cvmc.ops.registry import Attr, check_registry, op


@pytest.fixture
def shuffle_op():
    """`shuffle` (the Khronos sample's body-less custom fragment) as a complete registry
    entry: channel shuffle over axis 1 in `groups` groups (ShuffleNet's, which the sample
    names); removed afterwards."""
    d = op("shuffle", family="custom", inputs=("input",), attrs=(Attr("groups", "int", lo=1),),
           types="? -> ?", seeds=("test",))

    @d.shape
    def _(ins, a):
        require(ins[0].shape[1] % a.groups == 0, f"shuffle: groups {a.groups} must divide "
                                                 f"the channels {ins[0].shape[1]}")
        return ins[0].shape

    @d.reference
    def _(xs, a):
        x = xs[0]
        return x.reshape(x.shape[0], a.groups, -1, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)

    @d.lower
    def _(xs, a):
        from cvmc.ops.te import shape_of, te
        x = xs[0]
        per_group = shape_of(x)[1] // a.groups
        return te.compute(shape_of(x), lambda n, c, *rest: x(
            n, c % a.groups * per_group + c // a.groups, *rest), name="shuffle")

    check_registry()
    yield d
    del registry._REGISTRY["shuffle"]
