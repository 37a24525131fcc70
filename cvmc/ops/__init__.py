"""All operators. Importing this package registers every op and runs the self-check."""
from cvmc.ops import (  # noqa: F401  (imported for their registrations)
    broadcast,
    cinn,
    cinn_array,
    cinn_conv,
    elemwise,
    layout,
    nn,
    nn_pool,
    nnef_math,
    nnef_nn,
    nnef_pool,
    nnef_resample,
    nnef_std,
    nnef_std_nn,
    nnef_tensor,
    onednn,
    packed,
    packed_llvm,
    reduce,
    transform,
    transform_gather,
    transformer,
    vision,
)
from cvmc.ops.registry import Attrs, OpDef, all_ops, check_registry, lookup

check_registry()

__all__ = ["Attrs", "OpDef", "all_ops", "lookup"]
