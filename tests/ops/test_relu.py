import numpy as np

from tests.oputil import check_op


def test_relu_hand_computed():
    x = np.array([[-3, 0, 5], [127, -127, 1]], dtype=np.int64)
    (y,) = check_op("relu", [(x, 8)])
    assert np.array_equal(y, [[0, 0, 5], [127, 0, 1]])
    assert y.dtype == np.int8
