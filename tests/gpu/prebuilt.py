"""The GPU tests' CUDA builds, made ahead of time for a GPU machine that has no TVM.

    python -m tests.gpu.prebuilt DIR [--arch sm_90] [--size 224]

writes into DIR:
- `all_ops.so` and `all_ops.json`: every op case's kernels in one library (one nvcc run)
  and each case's execution plan;
- `<network>/` (graph.nnef + .dat weights) and `<network>.cvmx` for ResNet-18 and
  MobileNet-v1 of benchmarks/models.py, built for CUDA;
- `packed_conv/<i>.cvmx`: the packed conv cases (`packed_conv_graphs`), through the
  pipeline (the layout pass, then the `dp4a` rule).

On the GPU machine, `CVMC_GPU_PREBUILT=DIR pytest tests/gpu -m gpu -s` runs them. That
needs cvmc_runtime, NumPy, lark and apache-tvm-ffi only: the reference interpreter, the
oracle, is NumPy and needs no TVM.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ENV = "CVMC_GPU_PREBUILT"
NETWORKS = ("resnet18", "mobilenet_v1")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def prebuilt_dir() -> Path | None:
    """The folder named by CVMC_GPU_PREBUILT, or None when the tests build for themselves."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def build_op_cases(folder: Path, arch: str) -> None:
    """all_ops.so (every op case's CUDA kernels) and all_ops.json (their plans)."""
    from cvmc.codegen.build import cuda_translation_unit, nvcc_shared
    from tests.codegen.test_op_cases import cuda_module_of_cases

    mod, plans = cuda_module_of_cases()
    _, source, _ = cuda_translation_unit(mod, arch)
    nvcc_shared(source, arch, folder / "all_ops.so")
    (folder / "all_ops.cu").unlink()
    (folder / "all_ops.json").write_text(json.dumps({str(k): v for k, v in plans.items()}))


def packed_conv_graphs() -> dict:
    """{name: graph} of the packed conv cases: every geometry of
    tests/lowering/test_packed_conv.py and the longest reduction the packed form takes."""
    from cvmc.ops.layout import MAX_PACKED_REDUCTION
    from tests.lowering.test_packed_conv import GEOMETRIES, conv_graph

    graphs = {name: conv_graph(*geometry) for name, geometry in GEOMETRIES.items()}
    k = MAX_PACKED_REDUCTION
    graphs["longest reduction"] = conv_graph((1, k, 1, 1), (1, k, 1, 1), {}, False, False, p=2)
    return graphs


def packed_conv_artifact(folder: Path, index: int) -> Path:
    return folder / "packed_conv" / f"{index}.cvmx"


def build_packed_conv(folder: Path, index: int, arch: str) -> Path:
    """The CUDA artifact of packed conv case `index`."""
    from cvmc.codegen import compile_model

    artifact = packed_conv_artifact(folder, index)
    artifact.parent.mkdir(parents=True, exist_ok=True)
    compile_model(list(packed_conv_graphs().values())[index], artifact, "cuda", arch=arch)
    return artifact


def write_network(folder: Path, name: str, size: int) -> Path:
    """The NNEF folder of benchmarks/models.py's network `name` at size x size."""
    sys.path.insert(0, str(BENCHMARKS))
    from models import MODELS

    return MODELS[name](size).write(folder / name)


def build_network(folder: Path, name: str, size: int, arch: str) -> Path:
    """`<name>/` and `<name>.cvmx` (CUDA) in `folder`."""
    from cvmc.codegen import compile_model
    from cvmc.frontend import load_graph

    artifact = folder / f"{name}.cvmx"
    compile_model(load_graph(write_network(folder, name, size)), artifact, "cuda", arch=arch)
    return artifact


def main(argv: list[str] | None = None) -> int:
    """Build everything the GPU tests run into one folder."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--arch", default="sm_90", help="CUDA compute capability (default sm_90)")
    p.add_argument("--size", type=int, default=224, help="networks' input height and width")
    args = p.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    build_op_cases(args.folder, args.arch)
    for index in range(len(packed_conv_graphs())):
        build_packed_conv(args.folder, index, args.arch)
    for name in NETWORKS:
        print(f"built {build_network(args.folder, name, args.size, args.arch)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
