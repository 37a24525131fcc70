"""How much memory a loaded model costs a runtime, measured in a fresh process.

    python benchmarks/memory.py {cvmc,onnxruntime,openvino} MODEL THREADS INPUT.npy

Prints JSON {"first": bytes, "further": bytes}: the growth of the process's resident set
size (VmRSS) from after the runtime's imports to after loading the model and running it
once ("first": what deploying the model costs, including the runtime's lazy set-up and
its code pages first touched), then the growth from a second instance of the same model,
loaded and run once ("further": the model's own memory: weights, prepacked weights,
arenas, its kernel library). The first run is included because ONNX Runtime and
OpenVINO allocate their activation memory there, not at load. The input is fed as
`data`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rss_bytes() -> int:
    """The resident set size of this process (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


def loader(kind: str, model: str, threads: int):
    """A zero-argument call that loads `model` with runtime `kind`, runs it once on the
    input and returns the loaded instance (kept alive by the caller)."""
    import numpy as np

    x = np.load(sys.argv[4])
    if kind == "cvmc":
        import cvmc_runtime
        import tvm_ffi  # noqa: F401  (loaded by the first model otherwise: not model memory)

        cvmc_runtime.set_num_threads(threads)

        def load():
            m = cvmc_runtime.load(model)
            m.run({"data": x})
            return m
    elif kind == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1

        def load():
            s = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
            s.run(None, {"data": x})
            return s
    elif kind == "openvino":
        import openvino as ov

        core = ov.Core()

        def load():
            c = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                  "PERFORMANCE_HINT": "LATENCY"})
            r = c.create_infer_request()
            r.infer({"data": x})
            return c, r
    else:
        raise SystemExit(f"unknown runtime '{kind}'")
    return load


def main() -> int:
    """Measure and print the two growths as JSON."""
    kind, model, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    load = loader(kind, model, threads)
    start = rss_bytes()
    first = load()
    middle = rss_bytes()
    second = load()
    print(json.dumps({"first": middle - start, "further": rss_bytes() - middle}))
    del first, second
    return 0


if __name__ == "__main__":
    sys.exit(main())
