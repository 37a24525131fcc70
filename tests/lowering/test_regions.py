"""One parallel region per packed conv kernel: the byte stage of an int8 `conv2d_packed`
(`conv2d_packed_data`) and the padded copy of a float `conv_packed` (`conv_packed_pad`)
are computed under the conv's own parallel loop (`cvmc/lowering/x86.py`, `data_under`),
so each kernel makes one `TVMBackendParallelLaunch`, one fork and join, not two.

Counted in the scheduled TIR (`T.parallel` loops) of every conv kernel of the benchmark
networks and the float conv op cases, on each CPU row (forced with --mcpu: znver4 VNNI,
znver3 AVX2 and FMA, x86-64 the generic rows), and in the LLVM IR of one kernel (calls
through the launch pointer). Bit-exactness stays with the op-case, packed-conv and
benchmark-network tests, which run these same schedules.
"""
from __future__ import annotations

import re

import pytest

from cvmc.codegen.build import _emit_llvm
from cvmc.codegen.targets import backend
from cvmc.lowering.lower import lower_graph
from cvmc.passes.target import Target
from tests.codegen.op_cases import CONV_PACKED_CASES
from tests.lowering.test_blocked_activations import benchmark_network
from tests.oputil import compile_passes, one_op_graph

# int8 rows by --mcpu; the float rows: znver4 avx512, znver3 avx2, x86-64 generic
INT8_ROWS = {"znver4": "x86-avx512-vnni", "znver3": "x86-avx2", "x86-64": "cpu-packed-vector"}
FLOAT_ROWS = {"znver4": "x86-avx512-float-conv", "znver3": "x86-avx2-float-conv",
              "x86-64": "cpu-float-conv"}
ANCHORS = {"conv2d_packed": INT8_ROWS, "conv_packed": FLOAT_ROWS}


def conv_kernels(graph, mcpu: str) -> dict[str, tuple[str, str]]:
    """{kernel symbol: (its schedule rule, its scheduled TIR)} of every packed conv kernel
    of `graph` compiled for llvm on `mcpu`, its rule checked."""
    target = Target.make("llvm", mcpu)
    mod, _, plan = lower_graph(compile_passes(graph, target=target), target)
    scheduled, rules = backend(target).schedule(mod, target)
    kernels = {}
    for kernel in plan["kernels"]:
        rows = ANCHORS.get(kernel["ops"][0])
        if rows is not None:
            symbol = kernel["symbol"]
            assert rules[symbol] == rows[mcpu], symbol
            kernels[symbol] = scheduled[symbol].script()
    return kernels


def parallel_loops(script: str) -> int:
    """How many parallel loops a scheduled TIR function holds."""
    return script.count("T.parallel(")


@pytest.mark.parametrize("mcpu", list(INT8_ROWS))
@pytest.mark.parametrize("network", ["resnet18", "mobilenet_v1"])
def test_each_int8_packed_conv_of_the_networks_opens_one_region(network, mcpu, tmp_path):
    kernels = conv_kernels(benchmark_network(network, tmp_path), mcpu)
    assert len(kernels) == {"resnet18": 19, "mobilenet_v1": 11}[network]  # distinct kernels
    assert {symbol: parallel_loops(tir) for symbol, tir in kernels.items()} == \
        dict.fromkeys(kernels, 1)
    # the byte stage is inside the parallel loop, not a loop nest of its own
    assert all(0 < tir.index("T.parallel(") < tir.index('sblock("conv2d_packed_data')
               for tir in kernels.values())


@pytest.mark.parametrize("mcpu", list(FLOAT_ROWS))
def test_each_float_packed_conv_opens_one_region(mcpu):
    padded = 0
    for case in CONV_PACKED_CASES:
        graph = one_op_graph(case.op, case.inputs, case.attrs, case.weights, case.out_dtype)
        for tir in conv_kernels(graph, mcpu).values():
            assert parallel_loops(tir) == 1
            padded += "conv_packed_pad" in tir
    assert padded == 6  # every case but the 1x1 conv has a padded copy


def test_one_parallel_launch_in_the_kernel_code(tmp_path):
    """The built code of a 3x3 conv calls the launch pointer once (and its byte stage
    lives in the task, on its stack or arena, not in a buffer shared by the tasks)."""
    graph = benchmark_network("resnet18", tmp_path)
    target = Target.make("llvm", "znver3")
    mod, _, plan = lower_graph(compile_passes(graph, target=target), target)
    symbol = next(k["symbol"] for k in plan["kernels"] if k["ops"][0] == "conv2d_packed")
    import tvm

    one = tvm.IRModule({mod.get_global_var(symbol): mod[symbol]})
    _, source = _emit_llvm(one, target, backend(target).schedules, {symbol: "x86-avx2"})
    assert len(re.findall(r"load ptr, ptr @__TVMBackendParallelLaunch", source)) == 1
