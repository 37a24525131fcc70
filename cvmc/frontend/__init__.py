"""Frontends: NNEF text (+ .dat weights, graph.quant) and CVM-Runtime JSON + params.

`load_graph` detects the format from the file's content, so every command accepts both.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from cvmc.errors import CvmcError, check_argument
from cvmc.ir import Graph


def _is_cvm_json(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(64).removeprefix(b"\xef\xbb\xbf").lstrip()  # a UTF-8 BOM is fine
    return head.startswith(b"{")


def load_graph(path: str | Path, quant: str | Path | None = None,
               params: str | Path | None = None, need_data: bool = False) -> Graph:
    """Read a model: an NNEF document / folder / tar(.gz), or a CVM-Runtime graph JSON,
    typed (`cvmc.ops.infer.retype`; `need_data`: a weight without data is an error)."""
    for name, value in (("path", path), ("quant", quant), ("params", params)):
        check_argument("load_graph", name, value, value is None and name != "path" or
                       isinstance(value, (str, os.PathLike)), "a path")
    path = Path(path)
    if not path.exists():
        raise CvmcError(f"{path}: no such file or folder")
    if path.suffix.lower() == ".onnx":  # the NNEF parser would only say it is no NNEF text
        raise CvmcError(f"{path}: an ONNX model; convert it to NNEF first with `cvmc convert "
                        f"{path} -o DIR` (`cvmc compile` converts it itself)")
    if _is_cvm_json(path):
        from cvmc.frontend.cvm_json import read_cvm_model
        if quant is not None:
            raise CvmcError("--quant applies to NNEF documents, not CVM-Runtime JSON models")
        return read_cvm_model(path, params)
    if params is not None:
        raise CvmcError("--params applies to CVM-Runtime JSON models; NNEF weights are "
                        "variable() .dat files next to the graph")
    from cvmc.frontend.nnef import load_nnef
    return load_nnef(path, quant, need_data)


def load_checked(path: str | Path, quant: str | Path | None = None,
                 params: str | Path | None = None, need_data: bool = True) -> Graph:
    """Read a model, typed (which checks it): every command's one way in, so that none
    accepts a model another refuses. `need_data=False` (`cvmc check`: NNEF makes weight
    data optional, spec 5.1): absent weight data is one warning, and what can be checked
    without it is."""
    from cvmc.ops.infer import missing_data

    graph = load_graph(path, quant=quant, params=params, need_data=need_data)
    missing, inferable = missing_data(graph)
    if missing:
        files = ", ".join(f"'{graph.labels[w]}.dat'" for w in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        unknown = "" if inferable else "; integer weights without a declared precision " \
                                       "leave precisions uninferred"
        warnings.warn(f"{len(missing)} weight data file(s) not found beside the graph "
                      f"({files}{more}): checked structure, shapes and types only{unknown}; "
                      f"compile and run need the values", stacklevel=2)
    return graph
