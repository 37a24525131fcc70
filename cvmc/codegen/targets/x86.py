"""The x86-64 backend (`--target llvm` on an x86-64 host): the CPU pass list, its own
schedule rows (AVX-512 VNNI and AVX2 int8 convs, AVX-512 and AVX2 float matmuls and convs)
before the rows for any CPU, built by LLVM into a library the Python runtime loads."""
from __future__ import annotations

import functools

from cvmc.codegen.targets.cpu import CPU_PASSES, CPU_ROWS, CpuBackend
from cvmc.lowering.rules import ScheduleRule
from cvmc.lowering.x86 import (
    maddubs_facts,
    schedule_conv_avx2,
    schedule_conv_maddubs,
    schedule_conv_packed,
)
from cvmc.lowering.x86_float import schedule_conv_float
from cvmc.lowering.x86_matmul import schedule_matmul, schedule_matmul_packed
from cvmc.passes.target import X86_TRIPLES

ROWS = (
    ScheduleRule("x86-avx512-vnni", "conv2d_packed", ("avx512vnni",),
                 functools.partial(schedule_conv_packed, vnni=True)),
    # AVX2 without VNNI (haswell, znver3; AVX-512 CPUs without VNNI too, on 256-bit
    # vectors): `vpmaddubsw` where the value intervals prove its int16 pair sums exact,
    # else `vpmaddwd` on int16, 2 partial sums per channel.
    ScheduleRule("x86-avx2-maddubs", "conv2d_packed", ("avx2",), schedule_conv_maddubs,
                 maddubs_facts),
    ScheduleRule("x86-avx2", "conv2d_packed", ("avx2",), schedule_conv_avx2),
    ScheduleRule("x86-avx512-matmul", "matmul", ("avx512f",),
                 functools.partial(schedule_matmul, lanes=16, registers=32)),
    ScheduleRule("x86-avx2-matmul", "matmul", ("avx2", "fma"),
                 functools.partial(schedule_matmul, lanes=8, registers=16)),
    ScheduleRule("x86-avx512-matmul-packed", "matmul_packed", ("avx512f",),
                 functools.partial(schedule_matmul_packed, lanes=16, registers=32)),
    ScheduleRule("x86-avx2-matmul-packed", "matmul_packed", ("avx2", "fma"),
                 functools.partial(schedule_matmul_packed, lanes=8, registers=16)),
    ScheduleRule("x86-avx512-float-conv", "conv_packed", ("avx512f",),
                 functools.partial(schedule_conv_float, avx512=True)),
    ScheduleRule("x86-avx2-float-conv", "conv_packed", ("avx2", "fma"), schedule_conv_float),
    ScheduleRule("x86-avx512-float-conv-blocked", "conv_packed_blocked", ("avx512f",),
                 functools.partial(schedule_conv_float, avx512=True)),
    ScheduleRule("x86-avx2-float-conv-blocked", "conv_packed_blocked", ("avx2", "fma"),
                 schedule_conv_float),
)

BACKEND = CpuBackend("x86", "llvm", X86_TRIPLES, CPU_PASSES, (*ROWS, *CPU_ROWS))
