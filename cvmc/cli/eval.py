"""`cvmc eval`: top-1 accuracy of an artifact over a dataset, and its agreement with a
second artifact (such as the float model a quantized one came from)."""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from cvmc.cli.common import console, load_npy
from cvmc.errors import CvmcError


def _labels(file: str, count: int) -> np.ndarray:
    """The --labels array: N integer class indices, one per sample of --data."""
    labels = load_npy("--labels", file)
    if labels.dtype.kind not in "iu" or labels.shape != (count,):
        raise CvmcError(f"--labels: expected {count} integer class indices (shape [{count}], "
                        f"one per sample of --data), got {labels.dtype} {list(labels.shape)}")
    return labels


def _share(hits: int, total: int) -> str:
    return f"{100 * hits / total:.2f}% ({hits}/{total})" if total else "n/a (no samples)"


def cmd_eval(args: argparse.Namespace) -> int:
    """Predict every sample with each artifact; print top-1 and agreement."""
    import cvmc_runtime

    if args.labels is None and args.compare is None:
        raise CvmcError("nothing to measure: give --labels (top-1 accuracy), --compare "
                        "(agreement with another artifact), or both")
    data = load_npy("--data", args.data)
    labels = None if args.labels is None else _labels(args.labels, len(data))
    predictions = {}
    for path in dict.fromkeys(a for a in (args.model, args.compare) if a):
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
