"""ONNX -> NNEF with the Khronos NNEF-Tools converter (`pip install 'cvmc[convert]'`).

NNEF-Tools 1.0.11 is used as a library: its ONNX reader, ONNX -> NNEF converter and NNEF
writer, composed as its `nnef_tools.convert.main` composes them for
`--input-format onnx --output-format nnef --keep-io-names` (that function takes its
argparse namespace and prints its errors instead of raising them, so cvmc calls the
same three steps itself and gets the converter's exceptions). Not `--optimize`: its NNEF
optimizer crashes under NumPy >= 2.4 (`np.reshape(newshape=)`) when it merges a batch
normalization into a convolution, and cvmc's own passes do such rewrites. Not
`--fold-constants`: that needs onnx-simplifier, another native package; cvmc folds the
shape computations itself (`onnx_rewrite`).

Before anything else, cvmc reads the model without its external data and checks what it
declares: the opset (OPSETS), every tensor's size against its dims and type, external data
files inside the model's folder, and the whole model against MAX_ONNX_BYTES. Only then is
the external data loaded and the model given to the converter's reader.

`--input-shape` gives symbolic input dimensions, or a new batch (dimension 0) to a model
exported with a fixed one, which `onnx_rewrite.check_batch` refuses, naming the node,
where the graph does not carry it. Before the converter's reader types the graph,
`onnx_rewrite.rewrite` rewrites the ModelProto (its module docstring lists each rewrite, with the reason): shape computations
(Shape, Size and what computes from them, ConstantOfShape, Range) are folded into
initializers; LayerNormalization, HardSigmoid, HardSwish, GRU, and the LSTMs the
converter's `lstm_loop` cannot express (Y used, reverse or bidirectional, no initial
state, sequence_lens, other activations) are decomposed into ops it converts; Reshape's
`allowzero = 1` is dropped where the shape holds no 0.

NNEF-Tools reads the ONNX graph without its opset, and some of its rules are those of one
opset only. Before converting, cvmc therefore adjusts the converter's input graph where
the converter would refuse a valid model or, worse, give it another meaning (README,
"ONNX models (cvmc convert)", lists each case):
- reductions whose `axes` come as an input (ReduceSum from opset 13, every reduction
  from opset 18) or are absent (reduce everything) get an explicit `axes` attribute, made
  non-negative (with `keepdims = 0` the converter would write `squeeze(axes = [-1])`);
- `Softmax` without `axis` gets the default of the model's opset (-1 from opset 13, 1
  before); before opset 13, `Softmax` over a non-last axis of a tensor with more
  dimensions (a flattened softmax) is refused;
- attributes the converter ignores (Elu and Selu `alpha`, `gamma`; LpPool `p`;
  BatchNormalization `spatial` (opsets 7, 8), `training_mode` (14); Reshape `allowzero`
  (14); Resize `antialias`, `axes`, `keep_aspect_ratio_policy` (18)) must hold the default
  it assumes; Pad's `axes` input (18) is refused; variadic Min and Max must have two inputs;
- `Resize` of opset 10, which has no coordinate mode, gets ONNX Runtime's asymmetric
  coordinates and floor rounding (the converter assumes opset 11's half_pixel);
- `Clip` before opset 11 and `Slice` before 10 take as attributes what the converter reads
  as inputs (it would fail): they become constant inputs;
- a constant `Clip` bound of -inf (min) or +inf (max) is dropped (the converter would
  write a bare `inf`, which NNEF has no literal for), a Clip left with no bound becomes an
  Identity (the converter would write `max(x)`); a bound infinite the other way is refused;
- `Split` into equal parts (no `split` sizes; opset 18's `num_outputs`) gets the sizes
  of its outputs (the converter would fail);
- `Flatten` with an axis other than 1 becomes the reshape to its 2-D shape (the converter
  writes `reshape(shape = [0] * axis + [-1])`, right for axis 1 only);
- nearest `Resize` must pick the same source pixels as NNEF's nearest up/down-sampling
  (the converter ignores `nearest_mode` and the coordinate mode): otherwise refused;
- `Round` converts with a warning: NNEF rounds halves up, ONNX to even;
- `LSTM` left to the converter: the gate blocks of W, R, B are reordered from ONNX's
  (i, o, f, c) to the (i, f, c, o) that the converter's `lstm_step` fragment splits (it
  copies them as they are: a silently wrong model); what that fragment does not model is
  refused;
- input and output names that are not NNEF identifiers after the converter's own
  renaming (a leading digit, a keyword, two names made equal) are renamed.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from math import ceil, floor, prod
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import numpy as np

from cvmc.errors import CvmcError
from cvmc.frontend.folder import model_folder
from cvmc.frontend.onnx_rewrite import internal_errors, rewrite
from cvmc.frontend.syntax import KEYWORDS

MISSING = "cvmc convert needs the Khronos NNEF-Tools: pip install 'cvmc[convert]'"
# protobuf's own limit on one message: the bound of the .onnx file and of the whole model
# with its external data (NNEF-Tools' reader serializes the loaded model for shape inference)
MAX_ONNX_BYTES = 2 << 30
MAX_DIM = 1 << 24         # cvmc's dimension limit (README, Limits)
# The ONNX-domain opsets cvmc converts. From 7: ONNX Runtime's oldest supported opset; before
# it, binary ops broadcast by `axis`/`broadcast` attributes the converter ignores. Up to 28:
# the newest that onnx 1.23.2 defines; every change up to it to an op the converter has a
# rule for is a new type, or is checked or adjusted before converting (module docstring).
OPSETS = range(7, 29)
_STANDARD_DOMAINS = ("", "ai.onnx")
# Ops whose older versions take as attributes what the converter's rule reads as inputs:
# the opset that made them inputs, the attributes in input order, their type.
_ATTRIBUTES_BECAME_INPUTS = {"Clip": (11, ("min", "max"), np.float32),
                             "Slice": (10, ("starts", "ends", "axes"), np.int64)}
_REDUCTIONS = ("ReduceMin", "ReduceMax", "ReduceMean", "ReduceSum", "ReduceL1", "ReduceL2")
# Attributes NNEF-Tools' rules never read, with the ONNX default they silently assume.
_ASSUMED = {"Elu": {"alpha": 1.0}, "LpPool": {"p": 2},
            "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
            "BatchNormalization": {"spatial": 1, "training_mode": 0},
            "Reshape": {"allowzero": 0},
            "Resize": {"antialias": 0, "axes": None, "keep_aspect_ratio_policy": "stretch"}}


def convert_onnx(onnx_path: str | Path, out_dir: str | Path, *,
                 input_shapes: dict[str, list[int]] | None = None, force: bool = False,
                 origins: dict[str, str] | None = None) -> Path:
    """Convert an ONNX model into the NNEF folder `out_dir` (graph.nnef + .dat files).

    `input_shapes` fixes inputs whose ONNX shape has symbolic dimensions. `out_dir` must
    not exist or be empty; with `force`, a previous model folder (one holding graph.nnef)
    is replaced, atomically (`cvmc.frontend.folder.model_folder`).
    `origins`, where given, is filled with each NNEF tensor's ONNX origin (`_origins`).
    """
    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    tools = _import_tools()
    model, opset = _read_onnx(onnx_path, input_shapes or {})
    with model_folder(out_dir, force, onnx_path) as folder:
        _run_converter(tools, model, onnx_path, folder, opset, input_shapes, origins)
    return out_dir


def _import_tools() -> SimpleNamespace:
    """The NNEF-Tools parts cvmc uses (imported on first use: an optional extra)."""
    try:
        from nnef_tools import convert
        from nnef_tools.conversion.converter import ConversionError
        from nnef_tools.io.onnx import reader  # imports onnx
    except ImportError:
        raise CvmcError(MISSING) from None
    return SimpleNamespace(convert=convert, ConversionError=ConversionError, reader=reader)


def _read_onnx(path: Path, input_shapes: dict[str, list[int]]):
    """Check that `path` is an ONNX model NNEF-Tools can be given (its external data is not
    read); return the ModelProto, its symbolic dimensions unnamed, and its opset."""
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise CvmcError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if path.stat().st_size > MAX_ONNX_BYTES:
        raise CvmcError(f"{path}: larger than {MAX_ONNX_BYTES} bytes, the most one ONNX "
                        f"protobuf can hold")
    try:
        model = onnx.load_model(path, load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:  # what onnx raises for non-models
        raise CvmcError(f"{path}: not an ONNX model ({e or type(e).__name__})") from None
    opsets = [o.version for o in model.opset_import if o.domain in _STANDARD_DOMAINS]
    if not model.HasField("graph") or not model.graph.node or not opsets:
        raise CvmcError(f"{path}: not an ONNX model (no graph with nodes and an opset)")
    for opset in opsets:
        if opset not in OPSETS:
            raise CvmcError(f"{path}: declares opset {opset} of the ONNX domain; cvmc "
                            f"converts opsets {OPSETS.start}..{OPSETS.stop - 1}")
    for node in model.graph.node:  # the reader drops domains: a custom op would pass as
        if node.domain not in _STANDARD_DOMAINS:  # a standard one of the same name
            raise CvmcError(f"{path}: node '{node.name or node.output[0]}' is the op "
                            f"'{node.op_type}' of domain '{node.domain}'; only standard "
                            f"ONNX ops (domain ai.onnx) can be converted")
    try:
        check_tensors(path, model)
    except CvmcError as e:
        raise CvmcError(f"{path}: {e.message}") from None
    _check_input_shapes(path, model.graph, input_shapes)
    _unname_symbolic_dims(model.graph)
    return model, max(opsets)


def _check_input_shapes(path: Path, graph, input_shapes: dict[str, list[int]]) -> None:
    """Every input gets a static shape: from the model or from `input_shapes`."""
    weights = {t.name for t in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in weights}
    for name, info in inputs.items():  # NNEF-Tools can fix dimensions, not a missing rank
        if not info.type.tensor_type.HasField("shape"):
            raise CvmcError(f"{path}: input '{name}' declares no shape (not even its rank), "
                            f"which NNEF-Tools needs")
    for name, shape in input_shapes.items():
        if name not in inputs:
            raise CvmcError(f"--input-shape {name}: the model has no input '{name}' "
                            f"(inputs: {', '.join(inputs)})")
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape) or any(_fixed(d) and d.dim_value != s
                                          for d, s in zip(dims[1:], shape[1:])):
            raise CvmcError(f"--input-shape {name}: {shape} does not fit the model's shape "
                            f"{_onnx_shape(dims)} (only the batch, dimension 0, may change)")
        if not all(1 <= s <= MAX_DIM for s in shape):
            raise CvmcError(f"--input-shape {name}: every dimension must be 1..{MAX_DIM}")
    for name, info in inputs.items():
        dims = info.type.tensor_type.shape.dim
        if name not in input_shapes and not all(_fixed(d) for d in dims):
            raise CvmcError(f"{path}: input '{name}' has the dynamic shape "
                            f"{_onnx_shape(dims)}: give it with --input-shape "
                            f"{name}=D1,D2,...")


def _fixed(dim) -> bool:
    """A dimension with a value; -1 and 0 (paddle2onnx's batch) are symbolic, as are named
    and unnamed ones."""
    return dim.HasField("dim_value") and dim.dim_value > 0


def _unname_symbolic_dims(graph) -> None:
    """Make -1 and 0 dimensions unnamed, which is what NNEF-Tools' reader takes as symbolic
    (it would keep them as sizes and refuse --input-shape's values for them)."""
    for info in (*graph.input, *graph.output, *graph.value_info):
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.ClearField("dim_value")


def _onnx_shape(dims) -> str:
    """An ONNX shape as the model writes it, `?` for an unnamed dimension."""
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?"
                           for d in dims) + "]"


def _run_converter(tools: SimpleNamespace, model, onnx_path: Path, folder: Path, opset: int,
                   input_shapes: dict[str, list[int]] | None,
                   origins: dict[str, str] | None = None) -> None:
    """Read, adjust, convert and write the checked `model` into `folder` (see the module
    docstring). NNEF-Tools' steps run under `_nnef_tools`, cvmc's own under
    `internal_errors`, so that a failure is told as what it is: the model's, the
    converter's, or a bug in cvmc naming the node it was at."""
    shapes = {k: tuple(v) for k, v in input_shapes.items()} if input_shapes else None
    try:
        with _nnef_tools(tools):
            converter = tools.convert.get_converter(
                "onnx", "nnef", io_transpose=False, custom_transforms=None,
                custom_functions=None, custom_shapes={}, mirror_unsupported=False,
                keep_io_names=True)
            writer = tools.convert.get_writer(
                "nnef", fragments=converter.defined_operations(),
                fragment_dependencies=converter.defined_operation_dependencies(),
                generate_fragments=False, annotate_shapes=False, compression=None)
        graph = _read_graph(tools, model, onnx_path.parent, shapes, opset)
        with _nnef_tools(tools):
            graph = tools.convert.get_optimizer("onnx")(graph, only_required=True)
        _adjust(graph, opset)
        with _nnef_tools(tools):
            graph.sort()
            graph = converter(graph)
        with internal_errors("renaming the converted tensors"):
            _nnef_names(graph)
            if origins is not None:
                origins.update(_origins(graph, converter.tensor_mapping()))
        with _nnef_tools(tools):
            writer(graph, str(folder))
    except CvmcError as e:
        raise CvmcError(f"{onnx_path}: {e.message}") from e.__cause__


@contextmanager
def _nnef_tools(tools: SimpleNamespace) -> Iterator[None]:
    """Run NNEF-Tools' code: what it raises is the model's failure or its own, and says so."""
    try:
        yield
    except tools.ConversionError as e:
        lines = [*str(e).strip().splitlines(), *(e.details or [])]
        if lines[0].startswith("Input graph contains tensors with dynamic shape"):
            # its advice names its own command-line options, which cvmc does not have
            lines = [lines[0] + " (their shapes depend on values known only when the model "
                     "runs; cvmc folds the shapes computed from the input shapes)"]
        raise CvmcError("NNEF-Tools cannot convert this model: " + "\n  ".join(lines)) \
            from None
    except Exception as e:  # noqa: BLE001 - third-party code: any failure is the model's
        raise CvmcError(f"NNEF-Tools failed on this model ({type(e).__name__}: {e})") from None


def _read_graph(tools: SimpleNamespace, model, model_folder: Path, shapes: dict | None,
                opset: int):
    """NNEF-Tools' ONNX reader (its `Reader.__call__`, without the simplifier) on the checked
    `model`, whose external data (bounded by `check_tensors`) is loaded first, rewritten by
    `onnx_rewrite.rewrite` (ops the converter lacks, shape computations)."""
    import onnx

    onnx.load_external_data_for_model(model, str(model_folder))
    batches = _release_batches(model.graph, shapes or {})
    if shapes:
        with _nnef_tools(tools):
            tools.reader._set_input_shapes(model.graph, shapes)
    with internal_errors("rewriting the ONNX graph"):  # each node's rewrite names it
        rewrite(model, opset, batches)  # after the input shapes: shapes fold from them
    with _nnef_tools(tools):
        tools.reader._add_value_info_for_constants(model)
        return tools.reader.onnx_model_to_graph(tools.reader.infer_shapes(model))


def _release_batches(graph, shapes: dict) -> dict[str, int]:
    """The inputs whose fixed batch (dimension 0) `shapes` changes, with that batch. Their
    dimension 0 is made free, and the shapes the model declares for other tensors, which
    the old batch may be part of, are dropped for shape inference to compute again."""
    batches = {}
    for info in graph.input:
        dims = info.type.tensor_type.shape.dim
        if info.name in shapes and dims and dims[0].HasField("dim_value") \
                and dims[0].dim_value != shapes[info.name][0]:
            batches[info.name] = dims[0].dim_value
            dims[0].ClearField("dim_value")
    if batches:
        del graph.value_info[:]
        for info in graph.output:
            info.type.tensor_type.ClearField("shape")
    return batches


# ---- the model's tensors: sizes checked before any data is read --------------------------
def check_tensors(path: Path, model) -> None:
    """Every tensor's data fits its dims and type, external data lies inside files of the
    model's folder, and the file with all its external data stays within MAX_ONNX_BYTES."""
    from onnx import TensorProto

    total = path.stat().st_size
    for where, tensor in _all_tensors(model):
        declared = _declared_bytes(where, tensor)
        if tensor.data_location == TensorProto.EXTERNAL:
            total += _external_bytes(path.parent, where, tensor, declared)
            if total > MAX_ONNX_BYTES:
                raise CvmcError(f"the model with its external data (up to {where}) holds "
                                f"more than the {MAX_ONNX_BYTES} bytes an ONNX model may hold")
        elif declared is not None:
            _check_inline(where, tensor, declared)


def _all_tensors(model) -> Iterator[tuple[str, object]]:
    """(how an error names it, TensorProto) for every tensor in the model: initializers,
    sparse ones, node attributes, in subgraphs and functions too."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def _graph_tensors(graph) -> Iterator[tuple[str, object]]:
    """The tensors of one graph (see `_all_tensors`)."""
    for tensor in graph.initializer:
        yield f"initializer '{tensor.name}'", tensor
    for sparse in graph.sparse_initializer:
        yield from _sparse(f"sparse initializer '{sparse.values.name}'", sparse)
    yield from _node_tensors(graph.node)


def _node_tensors(nodes) -> Iterator[tuple[str, object]]:
    """The tensors of the nodes' attributes, subgraphs included."""
    for node in nodes:
        label = node.name or (node.output[0] if node.output else node.op_type)
        for attr in node.attribute:
            where = f"attribute '{attr.name}' of node '{label}'"
            if attr.HasField("t"):
                yield where, attr.t
            for tensor in attr.tensors:
                yield where, tensor
            for sparse in [attr.sparse_tensor] if attr.HasField("sparse_tensor") else []:
                yield from _sparse(where, sparse)
            for sparse in attr.sparse_tensors:
                yield from _sparse(where, sparse)
            for graph in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from _graph_tensors(graph)


def _sparse(where: str, sparse) -> Iterator[tuple[str, object]]:
    """A sparse tensor's values and indices."""
    yield f"{where} (values)", sparse.values
    yield f"{where} (indices)", sparse.indices


def _dtype(tensor) -> np.dtype | None:
    """The NumPy type of a tensor of a type NNEF-Tools' reader reads (no string), else None."""
    from onnx import TensorProto, helper

    name = TensorProto.DataType.Name(tensor.data_type) \
        if tensor.data_type in TensorProto.DataType.values() else None
    if name not in _READ_TYPES:
        return None
    return np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))


# The element types NNEF-Tools' ONNX reader maps to NumPy, strings aside.
_READ_TYPES = ("FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "BOOL",
               "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128")


def _describe(tensor, dtype: np.dtype) -> str:
    """A tensor's dims and type, for messages."""
    return f"{list(tensor.dims)} {dtype.name}"


def _declared_bytes(where: str, tensor) -> int | None:
    """The bytes a tensor's dims and type declare (None for a type without a fixed size),
    refused over MAX_ONNX_BYTES: bounded while multiplying, before anything is read."""
    if any(d < 0 for d in tensor.dims):
        raise CvmcError(f"{where}: negative dimension in {list(tensor.dims)}")
    dtype = _dtype(tensor)
    if dtype is None:
        return None
    size = 0 if 0 in tensor.dims else dtype.itemsize
    for d in tensor.dims:
        size *= d
        if size > MAX_ONNX_BYTES:
            raise CvmcError(f"{where} declares more than the {MAX_ONNX_BYTES} bytes an "
                            f"ONNX model may hold ({_describe(tensor, dtype)})")
    return size


def _external_bytes(model_folder: Path, where: str, tensor, declared: int | None) -> int:
    """Check where a tensor's external data lies (stat only, nothing read); its size."""
    info = {e.key: e.value for e in tensor.external_data}  # the last entry wins, as in onnx
    location = info.get("location", "")
    if declared is None:
        raise CvmcError(f"{where}: external data of a type NNEF-Tools does not read "
                        f"(ONNX data type {tensor.data_type})")
    if not location or "\0" in location or PurePosixPath(location).is_absolute() \
            or ".." in PurePosixPath(location).parts:
        raise CvmcError(f"{where}: external data location '{location}' must be a relative "
                        f"path inside the model's folder")
    try:
        file = (model_folder / location).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a loop of links
        raise CvmcError(f"{where}: external data '{location}': no such file in "
                        f"{model_folder}") from None
    if not file.is_relative_to(model_folder.resolve()):
        raise CvmcError(f"{where}: external data '{location}' leads out of the model's "
                        f"folder (to {file})")
    if (model_folder / location).is_symlink():  # onnx refuses to read through one
        raise CvmcError(f"{where}: external data '{location}' is a symbolic link, which onnx "
                        f"does not read")
    if not file.is_file():
        raise CvmcError(f"{where}: external data '{location}' is not a file")
    size = file.stat().st_size
    offset = _external_int(where, info, "offset") or 0
    length = _external_int(where, info, "length")
    length = max(size - offset, 0) if length is None else length
    if offset + length > size:
        raise CvmcError(f"{where}: offset {offset} + length {length} lies beyond the end of "
                        f"'{location}' ({size} bytes)")
    if length != declared:
        dtype = _dtype(tensor)
        raise CvmcError(f"{where} declares {declared} bytes ({_describe(tensor, dtype)}), its "
                        f"external data {length} bytes")
    if "length" not in info:  # onnx would read to the end of the file, as it is by then
        tensor.external_data.add(key="length", value=str(length))
    return length


def _external_int(where: str, info: dict[str, str], key: str) -> int | None:
    """An external data offset or length: a decimal integer >= 0, if given."""
    if key not in info:
        return None
    if not re.fullmatch(r"[0-9]{1,19}", info[key]):
        raise CvmcError(f"{where}: external data {key} '{info[key]}' must be an integer >= 0")
    return int(info[key])


def _check_inline(where: str, tensor, declared: int) -> None:
    """A tensor's data in the model file fits its dims: raw bytes, or typed values."""
    from onnx import helper

    dtype = _dtype(tensor)
    if tensor.HasField("raw_data"):
        if len(tensor.raw_data) != declared:
            raise CvmcError(f"{where} declares {declared} bytes ({_describe(tensor, dtype)}), "
                            f"its raw data holds {len(tensor.raw_data)}")
        return
    per_value = 2 if dtype.kind == "c" else 1  # complex values are stored as two numbers
    held = len(getattr(tensor, helper.tensor_dtype_to_field(tensor.data_type))) // per_value
    if held * dtype.itemsize != declared:
        raise CvmcError(f"{where} declares {declared // dtype.itemsize} values "
                        f"({_describe(tensor, dtype)}), its data holds {held}")


# ---- adjustments of the converter's input graph ------------------------------------------
def _adjust(graph, opset: int) -> None:
    """Fix what NNEF-Tools would refuse or mistranslate (module docstring)."""
    for op in graph.operations:
        with internal_errors(f"{op.type} '{_label(op)}'"):
            _adjust_op(op, opset)


def _adjust_op(op, opset: int) -> None:
    """`_adjust` of one op."""
    for attr, default in _ASSUMED.get(op.type, {}).items():
        if op.attribs.get(attr, default) != default:
            raise CvmcError(f"{op.type} '{_label(op)}': {attr} = {op.attribs[attr]}, but "
                            f"NNEF-Tools ignores {attr} and assumes {default}")
    if op.type in ("Min", "Max") and len(op.inputs) != 2:
        raise CvmcError(f"{op.type} '{_label(op)}' has {len(op.inputs)} inputs; NNEF-Tools "
                        f"converts it with exactly two (a third one would be dropped)")
    if op.type in _ATTRIBUTES_BECAME_INPUTS and opset < _ATTRIBUTES_BECAME_INPUTS[op.type][0]:
        _attributes_as_inputs(op, *_ATTRIBUTES_BECAME_INPUTS[op.type][1:])
    if op.type == "Clip":
        _infinite_clip_bounds(op)
    if op.type in _REDUCTIONS:
        _reduction_axes(op)
    elif op.type == "Softmax":
        _softmax_axis(op, opset)
    elif op.type == "Flatten" and op.attribs.get("axis", 1) != 1 and _static(op.inputs[0]):
        _flatten_as_reshape(op)
    elif op.type == "Split" and "split" not in op.attribs and _static(op.inputs[0]) and \
            (len(op.inputs) < 2 or not op.inputs[1].name):
        # equal parts (opset 18: `num_outputs`): the converter reads the sizes only
        op.attribs["split"] = [out.shape[op.attribs.get("axis", 0)] for out in op.outputs]
        op.attribs.pop("num_outputs", None)
    elif op.type == "Pad" and len(op.inputs) > 3 and op.inputs[3].name:
        raise CvmcError(f"Pad '{_label(op)}': its input 'axes' (opset 18) is ignored by "
                        f"NNEF-Tools (it reads the pads as those of all dimensions)")
    elif op.type == "Resize":
        if opset < 11:  # what ONNX Runtime does for Resize-10 (no such attributes)
            op.attribs.update(coordinate_transformation_mode="asymmetric",
                              nearest_mode="floor")
        if op.attribs.get("mode", "nearest") == "nearest":
            _check_nearest_resize(op)
    elif op.type == "LSTM":
        _lstm_gates(op)
    elif op.type == "Round":  # exact ties are rare in float models: warn, not refuse
        warnings.warn(f"Round '{_label(op)}': ONNX rounds halves to even, NNEF's round "
                      f"(which NNEF-Tools converts it to) rounds them up: the results "
                      f"differ where a value lies exactly halfway", stacklevel=2)


def _static(tensor) -> bool:
    """Whether the reader knows the tensor's shape. An adjustment that needs the shape
    leaves an op whose input shape is unknown as it is: the converter refuses every tensor
    of dynamic shape, naming them."""
    return tensor.shape is not None and None not in tensor.shape


def _attributes_as_inputs(op, names: tuple[str, ...], dtype: type) -> None:
    """Give an op of an older opset (Clip-6, Slice-1) its attributes as the constant inputs
    the converter's rule reads; an absent one becomes the empty input, as in ONNX."""
    from nnef_tools.model import Tensor

    if op.type == "Slice":  # ONNX's default axes, spelled out: the rule counts inputs
        op.attribs.setdefault("axes", list(range(len(op.attribs.get("starts", [])))))
    empty = next(t for t in op.graph.tensors if t.name == "")  # the reader's empty input
    values = [op.attribs.pop(name, None) for name in names]
    op.inputs = (op.inputs[0], *(
        empty if v is None else Tensor(op.graph, name=f"{_label(op)}_{name}",
                                       shape=np.shape(v), dtype=dtype, data=np.array(v, dtype))
        for name, v in zip(names, values)))


def _infinite_clip_bounds(op) -> None:
    """Drop a constant Clip bound that bounds nothing (min -inf, max +inf): the converter
    would write it as a bare `inf`, which NNEF has no literal for; a Clip left with no bound
    is an Identity. A bound infinite the other way (min +inf, max -inf) is refused."""
    empty = next(t for t in op.graph.tensors if t.name == "")  # the reader's empty input
    inputs = list(op.inputs)
    for k, (bound, free) in enumerate((("min", -np.inf), ("max", np.inf)), start=1):
        if k >= len(inputs) or not inputs[k].name:
            continue
        values = _constant(inputs[k])
        if values is None or len(values) != 1 or np.isfinite(values[0]):
            continue
        if values[0] != free:
            raise CvmcError(f"Clip '{_label(op)}': its {bound} is {values[0]}, an "
                            f"infinite bound NNEF has no literal for")
        inputs[k] = empty
    if not any(t.name for t in inputs[1:]):  # no bound left: the converter writes `max(x)`
        op.type, inputs = "Identity", inputs[:1]
    op.inputs = tuple(inputs)


def _flatten_as_reshape(op) -> None:
    """Write a Flatten as the Reshape to its 2-D shape: the converter's reshape to
    `[0] * axis + [-1]` keeps `axis` dimensions, not one (right for axis 1 only)."""
    shape = op.inputs[0].shape
    axis = op.attribs["axis"] + (len(shape) if op.attribs["axis"] < 0 else 0)
    op.type = "Reshape"
    op.attribs = {"shape": [prod(shape[:axis]), prod(shape[axis:])]}


# ONNX stacks an LSTM's gate weights as (input, output, forget, cell); NNEF-Tools copies
# them unchanged into a fragment that splits them as (input, forget, cell, output): a
# silently wrong model. The blocks are reordered before converting.
_ONNX_TO_NNEF_GATES = [0, 2, 3, 1]
_LSTM_DEFAULTS = {"direction": "forward", "input_forget": 0, "layout": 0}


def _lstm_gates(op) -> None:
    """Reorder a constant LSTM's W, R, B gate blocks into the converter's order; refuse
    what its fragment does not model (other activations, clipping, coupled gates,
    reverse or bidirectional runs, peepholes, weights computed in the graph)."""
    for attr in ("activations", "activation_alpha", "activation_beta", "clip"):
        if op.attribs.get(attr) is not None:
            raise CvmcError(f"LSTM '{_label(op)}': attribute '{attr}' is not converted by "
                            f"NNEF-Tools (its fragment uses sigmoid / tanh, unclipped)")
    for attr, default in _LSTM_DEFAULTS.items():
        if op.attribs.get(attr, default) not in (default, None):
            raise CvmcError(f"LSTM '{_label(op)}': {attr} = {op.attribs[attr]} is not "
                            f"converted by NNEF-Tools (it assumes {default})")
    if len(op.inputs) > 7 and op.inputs[7] is not None and op.inputs[7].name:
        raise CvmcError(f"LSTM '{_label(op)}': peephole weights (input P) are not converted "
                        f"by NNEF-Tools")
    for k in (1, 2, 3):  # W, R, B
        if k >= len(op.inputs) or op.inputs[k] is None or not op.inputs[k].name:
            continue
        tensor = op.inputs[k]
        if tensor.producer is not None or tensor.data is None:
            raise CvmcError(f"LSTM '{_label(op)}': input {k} must be a constant (cvmc "
                            f"reorders its gate blocks for NNEF-Tools)")
        blocks = 8 if k == 3 else 4  # B holds the input and the recurrence biases
        parts = np.split(tensor.data, blocks, axis=1)
        order = _ONNX_TO_NNEF_GATES + ([g + 4 for g in _ONNX_TO_NNEF_GATES] if k == 3 else [])
        tensor.data = np.concatenate([parts[g] for g in order], axis=1)


def _label(op) -> str:
    """How an error names an ONNX node: its name, else its first output."""
    return op.name or op.outputs[0].name


def _constant(tensor) -> list | None:
    """The values of a constant tensor (an initializer or a Constant node's), else None."""
    if tensor.producer is None:
        data = tensor.data
    elif tensor.producer.type == "Constant":
        data = tensor.producer.attribs["value"]
    else:
        return None
    return None if data is None else data.reshape(-1).tolist()


def _reduction_axes(op) -> None:
    """Move `axes` from an input into the attribute; absent axes reduce every axis. Axes
    are made non-negative: the converter squeezes a dropped dimension by the raw axis, and
    NNEF's squeeze takes no negative one."""
    rank = op.inputs[0].rank
    if len(op.inputs) > 1 and op.inputs[1].name:
        axes = _constant(op.inputs[1])
        if axes is None:
            raise CvmcError(f"{op.type} '{_label(op)}': its axes must be a constant")
        op.attribs["axes"] = axes
        op.inputs = op.inputs[:1]
    if not op.attribs.get("axes"):
        if op.attribs.get("noop_with_empty_axes"):
            raise CvmcError(f"{op.type} '{_label(op)}': noop_with_empty_axes without axes "
                            f"(an identity) is not supported")
        op.attribs["axes"] = list(range(rank))
    op.attribs["axes"] = [int(a) % rank if -rank <= a < rank else int(a)
                          for a in op.attribs["axes"]]
    op.attribs.pop("noop_with_empty_axes", None)


def _softmax_axis(op, opset: int) -> None:
    """Spell out the opset's default axis; refuse the flattened softmax of opset < 13."""
    axis = op.attribs.setdefault("axis", -1 if opset >= 13 else 1)
    if opset >= 13 or not _static(op.inputs[0]):
        return
    shape = op.inputs[0].shape
    axis += len(shape) if axis < 0 else 0
    if any(s != 1 for s in shape[axis + 1:]):
        raise CvmcError(f"Softmax '{_label(op)}' (opset {opset}) normalizes the dimensions "
                        f"{axis}.. of its {list(shape)} input together, which NNEF-Tools "
                        f"converts as a softmax over dimension {axis} alone; export the "
                        f"model with opset >= 13")


def _onnx_nearest(out_len: int, in_len: int, scale: Fraction, mode: str, rounding: str) -> list:
    """ONNX Resize's nearest source index of every output index (operator spec)."""
    def source(i):
        x = {"half_pixel": (i + Fraction(1, 2)) / scale - Fraction(1, 2),
             "pytorch_half_pixel": (i + Fraction(1, 2)) / scale - Fraction(1, 2)
             if out_len > 1 else Fraction(0),
             "asymmetric": i / scale,
             "align_corners": Fraction(i * (in_len - 1), out_len - 1) if out_len > 1
             else Fraction(0)}[mode]
        j = {"round_prefer_floor": ceil(x - Fraction(1, 2)),
             "round_prefer_ceil": floor(x + Fraction(1, 2)),
             "floor": floor(x), "ceil": ceil(x)}[rounding]
        return min(max(j, 0), in_len - 1)
    return [source(i) for i in range(out_len)]


def _check_nearest_resize(op) -> None:
    """The converter turns a nearest Resize into NNEF's nearest up/down-sampling (source
    index i // f, resp. i * f) whatever its rounding and coordinate modes: refuse it where
    ONNX picks other pixels."""
    mode = op.attribs.get("coordinate_transformation_mode", "half_pixel")
    rounding = op.attribs.get("nearest_mode", "round_prefer_floor")
    x, y = op.inputs[0].shape, op.outputs[0].shape
    if not _static(op.inputs[0]) or not _static(op.outputs[0]) or mode not in ("half_pixel", "pytorch_half_pixel", "asymmetric",
                                              "align_corners"):
        return  # the converter refuses these itself
    for axis in range(2, len(x)):
        n, m = x[axis], y[axis]
        if m % n and n % m:
            return  # not an integer factor: the converter refuses it
        nnef = [i // (m // n) for i in range(m)] if m >= n else [i * (n // m) for i in range(m)]
        # the exact ratio: a float scale like 1/3 means it (ONNX Runtime computes in float32,
        # where 9 * float32(1/3) rounds to 3; the exact reals agree with it, not float64)
        if _onnx_nearest(m, n, Fraction(m, n), mode, rounding) != nnef:
            raise CvmcError(f"Resize '{_label(op)}': nearest resizing of dimension {axis} from "
                            f"{n} to {m} with coordinate_transformation_mode '{mode}' and "
                            f"nearest_mode '{rounding}' picks other pixels than NNEF's nearest "
                            f"{'up' if m >= n else 'down'}-sampling, which NNEF-Tools would "
                            f"convert it to")


# ---- the converter's output -------------------------------------------------------------
def _origins(graph, mapping: dict[str, str]) -> dict[str, str]:
    """{NNEF tensor: where it came from in the ONNX model}: the ONNX node that computes it
    (every op the converter makes of a node carries the node's name), else the ONNX tensor
    it holds (an initializer, or the output of a node without a name; `mapping` is the
    converter's ONNX -> NNEF tensor names)."""
    onnx_of = {nnef: name for name, nnef in mapping.items()}
    found = {}
    for op in graph.operations:
        for tensor in op.outputs:
            where = op.name or onnx_of.get(tensor.name)
            if tensor.name and where:
                found[tensor.name] = where
    return found


def _nnef_names(graph) -> None:
    """Make every tensor name an NNEF identifier that is no keyword, all distinct.

    The converter replaces characters outside [A-Za-z0-9_] by '_' but keeps a leading digit
    or a keyword (an ONNX input '0' or 'graph') and merges names ('a.b' and 'a_b')."""
    used = set()
    for tensor in graph.tensors:
        if tensor.name is None:
            continue
        name = tensor.name if tensor.name[:1].isalpha() or tensor.name[:1] == "_" \
            else "_" + tensor.name
        name = name + "_" if name in KEYWORDS else name
        base, k = name, 1
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        tensor.name = name
