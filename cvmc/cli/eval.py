"""`cvmc eval`: top-1 accuracy of an artifact over a dataset, and its agreement with a
second artifact (such as the float model a quantized one came from)."""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from cvmc_runtime import read_npy

from cvmc.cli.common import console
from cvmc.errors import CvmcError


def _labels(file: str, count: int) -> np.ndarray:
    """The --labels array: N integer class indices, one per sample of --data."""
    labels = read_npy(file, "--labels")
    if labels.dtype.kind not in "iu" or labels.shape != (count,):
        raise CvmcError(f"--labels: expected {count} integer class indices (shape [{count}], "
                        f"one per sample of --data), got {labels.dtype} {list(labels.shape)}")
    return labels


def _check_classes(labels: np.ndarray, path: str) -> None:
    """Every label is a class of the artifact at `path`: an index into a sample's row of
    its first output."""
    import cvmc_runtime

    first = cvmc_runtime.load(path).outputs[0]
    classes = int(np.prod(first.shape[1:], dtype=np.int64))
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        raise CvmcError(f"--labels: label {int(labels[bad[0]])} at index {int(bad[0])} is not "
                        f"a class of {path}, whose output '{first.name}' has {classes} "
                        f"classes (0..{classes - 1})")


def _share(hits: int, total: int) -> str:
    return f"{100 * hits / total:.2f}% ({hits}/{total})" if total else "n/a (no samples)"


def cmd_eval(args: argparse.Namespace) -> int:
    """Predict every sample with each artifact; print top-1 and agreement."""
    import cvmc_runtime

    if args.labels is None and args.compare is None:
        raise CvmcError("nothing to measure: give --labels (top-1 accuracy), --compare "
                        "(agreement with another artifact), or both")
    data = read_npy(args.data, "--data")
    if data.ndim == 0:
        raise CvmcError("--data: a 0-d array holds no samples; expected [N, *input shape[1:]] "
                        "or [N, *input shape]")
    data = cvmc_runtime.dataset_rows(cvmc_runtime.load(args.model), data)
    labels = None if args.labels is None else _labels(args.labels, len(data))
    paths = list(dict.fromkeys(a for a in (args.model, args.compare) if a))
    for path in paths if labels is not None else ():
        _check_classes(labels, path)
    predictions = {}
    for path in paths:
        start = time.perf_counter()
        if args.ray is not None:
            predictions[path] = cvmc_runtime.predict_ray(path, data, args.workers,
                                                         args.ray or None)
        else:
            predictions[path] = cvmc_runtime.predict(path, data,
                                                     args.workers or os.cpu_count() or 1)
        seconds = time.perf_counter() - start
        top1 = "" if labels is None else \
            f"top-1 {_share(int((predictions[path] == labels).sum()), len(data))}, "
        console.print(f"{path}: {top1}{len(data)} samples in {seconds:.2f} s")
    if args.compare:
        same = int((predictions[args.model] == predictions[args.compare]).sum())
        console.print(f"agreement (same top-1): {_share(same, len(data))}")
    return 0
