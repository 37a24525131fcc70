"""The GPU tests' CUDA builds, made ahead of time for a GPU machine that has no TVM.

    python -m tests.gpu.prebuilt DIR [--arch sm_90] [--size 224]

writes into DIR:
- `all_ops.so` and `all_ops.json`: every op case's kernels in one library (one nvcc run)
  and each case's execution plan;
- `<network>/` (graph.nnef + .dat weights) and `<network>.cvmx` for ResNet-18 and
  MobileNet-v1 of benchmarks/models.py, built for CUDA;
- `dp4a/<i>.cvmx`: the convs and dense layers of `dp4a_cases`, through the pipeline
  (the layout pass, then the `dp4a` rules).

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
    from cvmc.codegen.targets.cuda import cuda_translation_unit, nvcc_shared
    from cvmc.passes.target import Target
    from tests.codegen.test_op_cases import cuda_module_of_cases

    mod, plans = cuda_module_of_cases()
    target = Target.make("cuda", arch=arch)
    _, source, _ = cuda_translation_unit(mod, target)
    nvcc_shared(source, target, folder / "all_ops.so")
    (folder / "all_ops.cu").unlink()
    (folder / "all_ops.json").write_text(json.dumps({str(k): v for k, v in plans.items()}))


def dp4a_cases() -> dict:
    """{name: (graph, the CUDA rule its kernel takes)}: every geometry of
    tests/lowering/test_packed_conv.py and the longest reduction the packed form takes
    (`cuda-conv-dp4a`), and dense shapes (`cuda-dense-dp4a`; K not a multiple of 4 is
    left to dlight)."""
    import numpy as np

    from cvmc.ops.packed import MAX_PACKED_REDUCTION
    from tests.lowering.test_packed_conv import GEOMETRIES, conv_graph
    from tests.oputil import one_op_graph, rand_in_precision

    cases = {name: (conv_graph(*geometry), "cuda-conv-dp4a")
             for name, geometry in GEOMETRIES.items()}
    k = MAX_PACKED_REDUCTION
    cases["longest reduction"] = (conv_graph((1, k, 1, 1), (1, k, 1, 1), {}, False, False,
                                             p=2), "cuda-conv-dp4a")
    rng = np.random.default_rng(3)
    # 512 -> 1000: 32 lanes of 4 words; 576 -> 10: 24 lanes; 16 -> 5: 4 lanes of one word;
    # K 6 and 8: dlight (not a multiple of 4; fewer than 4 lanes)
    for m, k, n, rule in ((1, 512, 1000, "cuda-dense-dp4a"), (2, 576, 10, "cuda-dense-dp4a"),
                          (2, 16, 5, "cuda-dense-dp4a"), (3, 6, 7, "cuda-dlight"),
                          (1, 8, 3, "cuda-dlight")):
        inputs = [(rand_in_precision(rng, shape, p), p)
                  for shape, p in (((m, k), 8), ((n, k), 8), ((n,), 12))]
        cases[f"dense {m}x{k} -> {n}"] = (one_op_graph("dense", inputs, weights=(1, 2)), rule)
    return cases


def dp4a_artifact(folder: Path, index: int) -> Path:
    return folder / "dp4a" / f"{index}.cvmx"


def build_dp4a_case(folder: Path, index: int, arch: str) -> Path:
    """The CUDA artifact of `dp4a_cases()` case `index`."""
    from cvmc.codegen import compile_model

    artifact = dp4a_artifact(folder, index)
    artifact.parent.mkdir(parents=True, exist_ok=True)
    compile_model(list(dp4a_cases().values())[index][0], artifact, "cuda", arch=arch)
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
    for index in range(len(dp4a_cases())):
        build_dp4a_case(args.folder, index, args.arch)
    for name in NETWORKS:
        print(f"built {build_network(args.folder, name, args.size, args.arch)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
