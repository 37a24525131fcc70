"""The AArch64 backend (`--target llvm --mtriple aarch64-linux-gnu`, a C library): the CPU
pass list, its own int8 conv rows (cvmc/lowering/aarch64.py) before the rows for any CPU,
its kernels built by LLVM into objects that `cvmc.codegen.clib` links."""
from __future__ import annotations

import functools

from cvmc.codegen.targets.cpu import CPU_PASSES, CPU_ROWS, CpuBackend
from cvmc.lowering.aarch64 import schedule_conv_dot
from cvmc.lowering.rules import ScheduleRule

ROWS = (
    # with i8mm: `usdot`, VNNI's u8 x s8 on 128-bit vectors; with dotprod: `sdot` (s8 x s8)
    # on the bytes - 128, the 128 x weights added back.
    ScheduleRule("aarch64-i8mm", "conv2d_packed", ("i8mm",),
                 functools.partial(schedule_conv_dot, i8mm=True)),
    ScheduleRule("aarch64-dotprod", "conv2d_packed", ("dotprod",),
                 functools.partial(schedule_conv_dot, i8mm=False)),
)

BACKEND = CpuBackend("aarch64", "llvm", ("aarch64",), CPU_PASSES, (*ROWS, *CPU_ROWS))
