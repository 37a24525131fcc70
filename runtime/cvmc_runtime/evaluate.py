"""Top-1 predictions of an artifact over a dataset: in this process, in local worker
processes, or on a Ray cluster through Ray Data (`cvmc eval`).

The artifact has one input whose first dimension is its compiled batch size B; the
dataset holds N samples of that input without the batch dimension, [N, *input shape[1:]],
or N whole inputs, [N, *input shape] (N * B samples: the form `cvmc quantize --calib`
reads). It is cut into batches of B, the last one padded with zeros and its padding
dropped; a sample's prediction is the argmax of its row of the first output (its first
occurrence, as NumPy's). Float data for an input with a scale is quantized by
`cvmc_runtime.quantize` (as `Model.run` does), and what the quantized model clipped over
the whole dataset is one SaturationWarning. Each worker loads the artifact once and runs one kernel thread, so
that W workers use W cores; the predictions do not depend on W.
"""
from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from cvmc_runtime.model import Model, load
from cvmc_runtime.pool import set_num_threads
from cvmc_runtime.quant import Saturation
from cvmc_runtime.signature import ModelError, precision_bound

RAY_MISSING = "--ray needs Ray Data, which is not installed: pip install 'cvmc[ray]'"


def batch_size(model: Model, samples: tuple[int, ...] | None = None) -> int:
    """The compiled batch size B of a model with one input whose first output starts with
    B; with `samples` (a dataset's shape), also checks that it holds inputs for it."""
    if len(model.inputs) != 1:
        raise ModelError(f"evaluation needs a model with one input, this one has "
                         f"{len(model.inputs)}: {', '.join(s.name for s in model.inputs)}")
    spec, first = model.inputs[0], model.outputs[0]
    if not spec.shape or first.shape[:1] != spec.shape[:1]:
        raise ModelError(f"evaluation needs the first output's first dimension to be the "
                         f"batch size: input '{spec.name}' is {list(spec.shape)}, output "
                         f"'{first.name}' is {list(first.shape)}")
    if samples is not None and (not samples or tuple(samples[1:]) != spec.shape[1:]):
        raise ModelError(f"data of shape {list(samples)} does not hold samples of input "
                         f"'{spec.name}' {list(spec.shape)}: expected [N, "
                         f"{', '.join(str(d) for d in spec.shape[1:])}] (N samples, without "
                         f"the batch dimension {spec.shape[0]}) or [N, "
                         f"{', '.join(str(d) for d in spec.shape)}] (N whole inputs)")
    return spec.shape[0]


def dataset_rows(model: Model, data: object) -> object:
    """`data` as samples without the batch dimension: N whole inputs [N, *input shape]
    become their N * B samples; any other array is returned as it is (check_dataset
    checks it)."""
    if not isinstance(data, np.ndarray) or len(model.inputs) != 1:
        return data
    shape = model.inputs[0].shape
    if data.ndim == len(shape) + 1 and tuple(data.shape[1:]) == shape:
        return data.reshape(-1, *shape[1:])
    return data


CHECK_CHUNK_BYTES = 64 << 20  # data checked this much at a time (bounded temporaries)


def check_dataset(model: Model, data: object) -> int:
    """The model's batch size, after checking that `data` holds samples of its input ([N,
    *input shape[1:]]) with values the input takes: no NaN in float data for an input with
    a scale (it cannot be quantized), integers inside the input's precision. A bad value
    is named by its index in the dataset (a batch's own index would point elsewhere)."""
    if not isinstance(data, np.ndarray):
        raise ModelError(f"data must be a NumPy array of samples, got {type(data).__name__}")
    size = batch_size(model, data.shape)
    spec = model.inputs[0]
    floats = data.dtype.kind == "f" and spec.scale is not None
    integers = data.dtype.kind in "iu" and spec.precision is not None
    if not (floats or integers) or not data.size:
        return size  # Model.run refuses a dtype the input does not take
    bound = precision_bound(spec.precision)
    step = max(1, CHECK_CHUNK_BYTES // data[0].nbytes)
    for start in range(0, len(data), step):
        chunk = data[start:start + step]
        bad = np.isnan(chunk) if floats else (chunk > bound) | (chunk < -bound)
        if bad.any():
            index = [int(i) for i in np.argwhere(bad)[0]]
            index[0] += start
            value = "NaN" if floats else int(data[tuple(index)])
            why = "cannot be quantized" if floats else \
                f"is outside the precision {spec.precision} of input '{spec.name}' " \
                f"(|v| <= {bound})"
            raise ModelError(f"data: {value} at index {index} (sample {index[0]}) {why}")
    return size


def predict_batches(model: Model, data: np.ndarray) -> tuple[np.ndarray, Saturation]:
    """int64 top-1 class of every sample in `data` ([n, *sample shape], any n), and what
    the runs clipped (a last batch's zero padding included: zeros clip nothing, and an
    output row of it at the ends of its range is counted)."""
    size = batch_size(model, data.shape)
    name, first = model.inputs[0].name, model.outputs[0].name
    predictions, saturation = [], Saturation()
    for start in range(0, len(data), size):
        batch = data[start:start + size]
        count = len(batch)
        if count < size:
            batch = np.concatenate([batch, np.zeros((size - count, *batch.shape[1:]),
                                                    batch.dtype)])
        out = model.run({name: batch}, warn_saturation=False)[first]
        saturation.merge(model.saturation)
        predictions.append(np.argmax(out.reshape(size, -1), axis=1)[:count])
    return (np.concatenate(predictions) if predictions else np.zeros(0, np.int64)), saturation


_worker_model: Model | None = None  # the model a local worker process loaded


def _start_worker(path: str) -> None:
    global _worker_model
    set_num_threads(1)
    _worker_model = load(path)


def _worker_predict(data: np.ndarray) -> tuple[np.ndarray, Saturation]:
    assert _worker_model is not None, "worker not started"
    return predict_batches(_worker_model, data)


def predict(path: str | os.PathLike, data: np.ndarray, workers: int = 1) -> np.ndarray:
    """Top-1 class of every sample in `data`, computed by `workers` local processes (one
    loaded model and one kernel thread each; workers=1: in this process, all threads).
    What a quantized model clipped over the whole dataset is one SaturationWarning."""
    if type(workers) is not int or workers < 1:
        raise ModelError(f"workers must be a positive integer, got {workers!r:.40}")
    model = load(path)
    data = dataset_rows(model, data)
    size = check_dataset(model, data)
    batches = -(-len(data) // size)
    workers = min(workers, batches)
    if workers <= 1:
        predictions, saturation = predict_batches(model, data)
        saturation.warn()
        return predictions
    del model
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context

    # Spawn, not fork: a forked child of a process running OpenMP kernels may deadlock.
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"),
                               initializer=_start_worker, initargs=(os.fspath(path),))
    try:
        with _workers_ignore_interrupts():
            results = list(pool.map(_worker_predict, _pieces(data, size, workers)))
        saturation = Saturation()
        for _, part in results:
            saturation.merge(part)
        saturation.warn()
        return np.concatenate([p for p, _ in results])
    except BrokenProcessPool as e:  # a worker killed (out of memory) or failing to start
        raise ModelError(f"{path}: a worker process died ({e})") from None
    finally:
        # On an error or an interrupt, pieces not yet started are dropped, not computed.
        pool.shutdown(cancel_futures=True)


@contextmanager
def _workers_ignore_interrupts():
    """SIGINT ignored while worker processes start, which inherit that through exec:
    Ctrl-C reaches the whole process group, and the parent alone must handle it (stop the
    pool, exit 130), not every worker with a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers, and only it gets SIGINT
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _pieces(data: np.ndarray, size: int, workers: int) -> list[np.ndarray]:
    """`data` cut into pieces of whole batches of `size`, about four per worker (so that
    the load balances), in order."""
    batches = max(1, -(-len(data) // size))
    step = -(-batches // (4 * workers)) * size
    return [data[start:start + step] for start in range(0, max(len(data), 1), step)]


class RayPredictor:
    """Ray Data's callable class: one loaded model per actor, one kernel thread."""

    def __init__(self, artifact: bytes):
        set_num_threads(1)
        # The artifact travels as bytes (a cluster's nodes need not share files); the
        # model holds everything it needs once loaded, so its temporary file goes at once.
        with tempfile.TemporaryDirectory(prefix="cvmc-eval-") as tmp:
            path = Path(tmp) / "model.cvmx"
            path.write_bytes(artifact)
            self.model = load(path)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Predictions of one batch of the dataset's `data` column, and what it clipped:
        a column of Saturation objects (the batch's in its first row, empty ones after)."""
        predictions, saturation = predict_batches(self.model, batch["data"])
        column = np.empty(len(predictions), object)
        column[:] = [saturation, *(Saturation() for _ in predictions[1:])]
        return {"prediction": predictions, "saturation": column}


def predict_ray(path: str | os.PathLike, data: np.ndarray, workers: int | None = None,
                address: str | None = None) -> np.ndarray:
    """Top-1 class of every sample in `data` on Ray Data: `map_batches` over batches of the
    compiled batch size, `workers` actors (default: one per CPU of the cluster), on the
    cluster at `address` (None: the one this process has joined, or a new local one)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise ModelError(RAY_MISSING) from None
    if workers is not None and (type(workers) is not int or workers < 1):
        raise ModelError(f"workers must be a positive integer, got {workers!r:.40}")
    if address is not None and not isinstance(address, str):
        raise ModelError(f"address must be a Ray cluster address (a str), got {address!r:.40}")
    model = load(path)
    data = dataset_rows(model, data)
    size = check_dataset(model, data)
    del model
    if not len(data):
        return np.zeros(0, np.int64)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False,
                 logging_level=logging.ERROR)
    for logger in ("ray", "ray.data"):  # Ray Data's progress lines
        logging.getLogger(logger).setLevel(logging.ERROR)
    if workers is None:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
    workers = min(workers, -(-len(data) // size))  # an actor without a batch only costs
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # predictions in the data's order
    context.enable_progress_bars = False
    # One block per piece (whole batches, a few per actor, so that every actor gets work).
    dataset = ray.data.from_numpy(_pieces(data, size, workers)).map_batches(
        RayPredictor, fn_constructor_kwargs={"artifact": Path(path).read_bytes()},
        batch_size=size, batch_format="numpy", num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=workers))
    parts, saturation = [], Saturation()
    for b in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        parts.append(b["prediction"])
        for part in b["saturation"]:
            saturation.merge(part)
    saturation.warn()
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
