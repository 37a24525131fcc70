"""Write a quantized model: an NNEF folder (graph.nnef, one .dat per weight),
quantization.json and, for an ONNX model, onnx_nodes.json, into place atomically as
`cvmc convert` writes its folder (`cvmc.frontend.folder.model_folder`)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cvmc.frontend.folder import model_folder
from cvmc.frontend.printer import print_graph
from cvmc.frontend.tensorfile import tensor_bytes
from cvmc.quantize import Quantized

_INLINE = 16  # weights with at most this many elements stay inline constants in the text


ONNX_NODES = "onnx_nodes.json"


def write_model(q: Quantized, out_dir: str | Path, source: str | Path, force: bool,
                origins: dict[str, str] | None = None) -> Path:
    """Write `q` as the model folder `out_dir` (new, empty, or with `force` a previous
    model folder; never the folder of `source`). With `origins` (an ONNX model's: NNEF
    value -> ONNX node), `onnx_nodes.json` maps each value of the integer graph that has
    one to its ONNX node."""
    out_dir = Path(out_dir)
    graph = q.graph.replace(labels={w: w for w in q.graph.constants
                                    if np.size(q.graph.constants[w]) > _INLINE})
    with model_folder(out_dir, force, Path(source)) as folder:
        (folder / "graph.nnef").write_text(print_graph(graph))
        for name, label in graph.labels.items():
            data = graph.constants[name].astype(graph.types[name].dtype)
            (folder / f"{label}.dat").write_bytes(tensor_bytes(data))
        (folder / "quantization.json").write_text(
            json.dumps(q.manifest(), indent=1, allow_nan=False) + "\n")
        if origins:
            nodes = {n: origins[n] for n in q.graph.types if n in origins}
            (folder / ONNX_NODES).write_text(json.dumps(nodes, indent=1) + "\n")
    return out_dir
