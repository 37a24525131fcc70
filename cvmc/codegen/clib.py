"""`cvmc compile --emit c-library -o DIR`: a compiled model as a C library without Python.

DIR gets `libNAME.a` and `libNAME.so` (NAME: DIR's name as a C identifier), `NAME.h` and an
example `main.c`. The library is one relocatable object made of
- the kernels' objects as `build_llvm` compiled them (the same code a .cvmx holds),
- the native runtime (`cvmc_runtime`'s `native/cvmc_pool.c`: thread pool and workspace
  arenas), which the generated code stores in the kernels' `__TVMBackend*` pointers,
- the plan as generated C (`model.c`): a table of tensors (DLTensors: inputs and outputs in
  per-handle buffers, intermediate tensors in a per-handle arena at the plan's offsets,
  weights in the library) and the kernel calls in order, each through TVM's packed-function
  calling convention with DLTensor arguments; a check of the CPU's features (cpuid on
  x86, HWCAP flags on AArch64, `--mtriple aarch64-linux-gnu`: Debian's cross toolchain),
- the weights, one read-only blob (`.incbin`), each at a 64-byte aligned offset.
Only the API (`NAME_*`) and the pool's functions (`cvmc_*`, weak: several models linked
into one program share one pool) stay global. It needs libc, libm and pthreads only.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from cvmc_runtime import ARENA_ALIGNMENT, NATIVE_FOLDER

from cvmc.codegen.cpu_features import AARCH64_HWCAPS
from cvmc.errors import CvmcError

ALIGN = ARENA_ALIGNMENT
# The pool's functions kept global (and weak) in the library: see the module docstring.
POOL_SYMBOLS = ("cvmc_parallel_launch", "cvmc_parallel_barrier", "cvmc_alloc_workspace",
                "cvmc_free_workspace", "cvmc_set_num_threads", "cvmc_get_num_threads",
                "cvmc_pool_stats")
API = ("create", "run", "destroy", "set_num_threads", "input_info", "output_info",
       "strerror", "last_error")
# dtype -> (the header's enum name, DLPack type code, bits)
DTYPES = {"int8": ("INT8", 0, 8), "int32": ("INT32", 0, 32), "float32": ("FLOAT32", 2, 32),
          "bool": ("BOOL", 6, 8)}
ERRORS = (("OK", "no error"),
          ("ERR_NULL", "a required pointer argument is NULL"),
          ("ERR_INDEX", "an input or output index is out of range"),
          ("ERR_SIZE", "a buffer's size is not its tensor's size in bytes"),
          ("ERR_INPUT_RANGE", "an input value lies outside the input's precision"),
          ("ERR_CPU", "this CPU lacks a feature the model's kernels need"),
          ("ERR_MEMORY", "out of memory"),
          ("ERR_KERNEL", "a kernel failed"),
          ("ERR_ARGUMENT", "an argument is out of range"))
# LLVM x86 feature -> (cpuid leaf, subleaf, register, bit, register state the OS must save:
# "" none, "ymm" AVX, "zmm" AVX-512), for each feature cvmc_runtime.CPUINFO_FLAGS knows.
CPUID = {
    "64bit": (0x80000001, 0, "edx", 29, ""), "x87": (1, 0, "edx", 0, ""),
    "cmov": (1, 0, "edx", 15, ""), "cx8": (1, 0, "edx", 8, ""), "cx16": (1, 0, "ecx", 13, ""),
    "mmx": (1, 0, "edx", 23, ""), "fxsr": (1, 0, "edx", 24, ""),
    "sahf": (0x80000001, 0, "ecx", 0, ""), "sse": (1, 0, "edx", 25, ""),
    "sse2": (1, 0, "edx", 26, ""), "sse3": (1, 0, "ecx", 0, ""), "ssse3": (1, 0, "ecx", 9, ""),
    "sse4.1": (1, 0, "ecx", 19, ""), "sse4.2": (1, 0, "ecx", 20, ""),
    "crc32": (1, 0, "ecx", 20, ""), "sse4a": (0x80000001, 0, "ecx", 6, ""),
    "popcnt": (1, 0, "ecx", 23, ""), "lzcnt": (0x80000001, 0, "ecx", 5, ""),
    "bmi": (7, 0, "ebx", 3, ""), "bmi2": (7, 0, "ebx", 8, ""), "movbe": (1, 0, "ecx", 22, ""),
    "tbm": (0x80000001, 0, "ecx", 21, ""), "adx": (7, 0, "ebx", 19, ""),
    "prfchw": (0x80000001, 0, "ecx", 8, ""), "pclmul": (1, 0, "ecx", 1, ""),
    "vpclmulqdq": (7, 0, "ecx", 10, "ymm"), "aes": (1, 0, "ecx", 25, ""),
    "vaes": (7, 0, "ecx", 9, "ymm"), "sha": (7, 0, "ebx", 29, ""), "gfni": (7, 0, "ecx", 8, ""),
    "f16c": (1, 0, "ecx", 29, "ymm"), "fma": (1, 0, "ecx", 12, "ymm"),
    "fma4": (0x80000001, 0, "ecx", 16, "ymm"), "xop": (0x80000001, 0, "ecx", 11, "ymm"),
    "avx": (1, 0, "ecx", 28, "ymm"), "avx2": (7, 0, "ebx", 5, "ymm"),
    "avxvnni": (7, 1, "eax", 4, "ymm"), "avxifma": (7, 1, "eax", 23, "ymm"),
    "avx512f": (7, 0, "ebx", 16, "zmm"), "avx512cd": (7, 0, "ebx", 28, "zmm"),
    "avx512dq": (7, 0, "ebx", 17, "zmm"), "avx512bw": (7, 0, "ebx", 30, "zmm"),
    "avx512vl": (7, 0, "ebx", 31, "zmm"), "avx512ifma": (7, 0, "ebx", 21, "zmm"),
    "avx512vbmi": (7, 0, "ecx", 1, "zmm"), "avx512vbmi2": (7, 0, "ecx", 6, "zmm"),
    "avx512vnni": (7, 0, "ecx", 11, "zmm"), "avx512bitalg": (7, 0, "ecx", 12, "zmm"),
    "avx512vpopcntdq": (7, 0, "ecx", 14, "zmm"), "avx512bf16": (7, 1, "eax", 5, "zmm"),
    "avx512fp16": (7, 0, "edx", 23, "zmm"), "avx512vp2intersect": (7, 0, "edx", 8, "zmm"),
}
XCR0 = {"": 0, "ymm": 0x6, "zmm": 0xE6}  # SSE and AVX state; and opmask, ZMM0-15, ZMM16-31


def library_name(out_dir: Path) -> str:
    """The C name of the library written to `out_dir`: its folder name as an identifier."""
    name = re.sub(r"\W", "_", out_dir.resolve().name, flags=re.ASCII) or "model"
    return f"m_{name}" if name[0].isdigit() else name


def check_destination(out_dir: Path) -> None:
    """`out_dir` is new, an empty folder, or a C library this command wrote (its files
    and nothing else), which is replaced; checked before any work."""
    if not out_dir.exists() and not out_dir.is_symlink():
        if not out_dir.parent.is_dir():
            raise CvmcError(f"-o {out_dir}: folder '{out_dir.parent}' does not exist")
        return
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise CvmcError(f"-o {out_dir}: exists and is not a folder")
    name = library_name(out_dir)
    ours = {f"lib{name}.a", f"lib{name}.so", f"{name}.h", "main.c"}
    others = sorted(p.name for p in out_dir.iterdir() if p.name not in ours)
    if others:
        raise CvmcError(f"-o {out_dir}: holds {others[0]!r}, which is not part of a C "
                        f"library; only an empty folder or a C library is replaced")


def write_c_library(plan: dict, objects: dict[str, bytes], weights: dict[str, np.ndarray],
                    out_dir: str | Path, cflags: tuple[str, ...] = ()) -> Path:
    """Write the C library of a compiled CPU model (`plan`, its kernels' `objects` by
    symbol, `weights` by name) into `out_dir`, through a temporary folder
    beside it renamed into place; `cflags`: extra gcc flags for the C parts (tests build
    with sanitizers). Returns the path of the static library."""
    if plan["device"] != "cpu":
        raise CvmcError("--emit c-library: only --target llvm builds a C library")
    out_dir = Path(out_dir)
    check_destination(out_dir)
    name = library_name(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp",
                                dir=out_dir.parent)).absolute()  # the tools run in tmp
    try:
        build, folder = tmp / "build", tmp / "lib"
        build.mkdir()
        folder.mkdir()
        model = _Model(plan, weights, name)
        (folder / f"{name}.h").write_text(model.header())
        (folder / "main.c").write_text(model.example())
        _build(model, objects, build, folder, cflags)
        if out_dir.exists() and any(out_dir.iterdir()):
            out_dir.rename(tmp / "previous")
        elif out_dir.exists():
            out_dir.rmdir()
        folder.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / f"lib{name}.a"


def _run(command: list[str], what: str, cwd: Path | None = None) -> None:
    """Run a toolchain command; a CvmcError with its message if it fails or is missing."""
    try:
        proc = subprocess.run(command, check=False, capture_output=True, text=True, cwd=cwd)
    except FileNotFoundError:
        raise CvmcError(f"cannot build {what}: {command[0]} is not installed (a cross "
                        f"toolchain: apt-get install gcc-aarch64-linux-gnu)") from None
    if proc.returncode != 0:
        raise CvmcError(f"cannot build {what} ({command[0]}):\n{proc.stderr[-4000:]}")


def _build(model: _Model, objects: dict[str, bytes], build: Path, folder: Path,
           cflags: tuple[str, ...]) -> None:
    """Compile the C parts and link everything into lib{name}.a and lib{name}.so."""
    import tvm_ffi

    name = model.name
    triple = model.plan["target"].get("mtriple")
    tool = f"{triple}-" if triple else ""  # Debian's cross toolchains: aarch64-linux-gnu-gcc
    (build / "model.c").write_text(model.source())
    (build / "weights.bin").write_bytes(model.blob)
    (build / "weights.S").write_text(
        '  .section .rodata.cvmc_weights,"a"\n  .balign 64\n  .globl cvmc_weights\n'
        'cvmc_weights:\n  .incbin "weights.bin"\n'
        '  .section .note.GNU-stack,"",@progbits\n')
    gcc = [f"{tool}gcc", "-O2", "-fPIC", "-pthread", *cflags, f"-I{NATIVE_FOLDER}",
           f"-I{folder}", f"-I{tvm_ffi.libinfo.find_include_path()}", "-c"]
    parts = []
    for source in ("model.c", "weights.S", NATIVE_FOLDER / "cvmc_pool.c"):
        obj = build / f"{Path(source).stem}.o"
        # in `build`: the assembler finds weights.bin there
        _run([*gcc, str(build / source), "-o", str(obj)], f"the C library's {source}", build)
        parts.append(obj)
    for index, data in enumerate(objects.values()):
        parts.append(build / f"k{index}.o")
        parts[-1].write_bytes(data)
    whole = build / f"{name}.o"
    _run([f"{tool}ld", "-r", "-o", str(whole), *map(str, parts)], "the C library")
    keep = [f"{name}_{f}" for f in API] + list(POOL_SYMBOLS)
    _run([f"{tool}objcopy", *[f"--keep-global-symbol={s}" for s in keep],
          *[f"--weaken-symbol={s}" for s in POOL_SYMBOLS], str(whole)], "the C library")
    _run([f"{tool}ar", "rcs", str(folder / f"lib{name}.a"), str(whole)],
         "the static library")
    _run([f"{tool}gcc", "-shared", "-pthread", *cflags, f"-Wl,-soname,lib{name}.so", "-o",
          str(folder / f"lib{name}.so"), str(whole), "-lm"], "the shared library")


def _has(target: dict, feature: str) -> str:
    """The C condition that this CPU has `feature` of `target`: cpuid on x86, HWCAP flags
    on AArch64."""
    if target.get("mtriple"):
        entry, bit = AARCH64_HWCAPS[feature]
        return f"hwcap_has({entry}, {bit})"
    leaf, sub, reg, bit, state = CPUID[feature]
    return f"cpu_has(0x{leaf:x}, {sub}, {'abcd'.index(reg[1])}, {bit}, 0x{XCR0[state]:x})"


def _c_string(text: str) -> str:
    """`text` as a C string literal: printable ASCII as it is, every other byte of its
    UTF-8 (and quotes, backslashes, question marks: no trigraphs) as an octal escape."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else f"\\{b:03o}"
                         for b in text.encode()) + '"'


def _comment(text: str) -> str:
    """`text` safe inside a C comment."""
    return text.replace("*/", "* /").replace("\n", " ")


class _Model:
    """The plan laid out for C: every tensor with its place (input or output buffer in the
    handle's allocation of its own, weight blob, arena), and the generated sources."""

    def __init__(self, plan: dict, weights: dict[str, np.ndarray], name: str):
        self.plan, self.name = plan, name
        self.tensors: dict[str, dict] = {}
        blob = bytearray()
        for key in ("inputs", "weights", "buffers", "outputs"):
            for spec in plan[key]:
                if spec["name"] in self.tensors:
                    continue  # an output that is an input or a weight: the same memory
                size = int(np.prod(spec["shape"], dtype=np.int64)) * \
                    np.dtype(spec["dtype"]).itemsize
                if key == "weights":
                    blob += bytes(-len(blob) % ALIGN)
                    place = ("WEIGHT", len(blob))
                    blob += np.require(weights[spec["name"]], spec["dtype"], "C").tobytes()
                elif key == "buffers":
                    place = ("ARENA", plan["arena"]["offsets"][spec["name"]])
                else:  # an input or an output: an allocation of its own in each handle
                    place = ("OWN", 0)
                self.tensors[spec["name"]] = {**spec, "index": len(self.tensors),
                                              "bytes": size, "place": place}
        self.blob = bytes(blob)
        table = AARCH64_HWCAPS if plan["target"].get("mtriple") else CPUID
        unknown = [f for f in plan["target"]["features"] if f not in table]
        if unknown:
            raise CvmcError(f"--emit c-library: cannot check CPU feature {unknown[0]!r}")

    def header(self) -> str:
        n, up = self.name, self.name.upper()
        errors = "\n".join(f"  {up}_{code} = {i},  /* {text} */"
                           for i, (code, text) in enumerate(ERRORS))
        dtypes = ", ".join(f"{up}_{d[0]} = {i}" for i, d in enumerate(DTYPES.values()))
        lines = []
        for key in ("inputs", "outputs"):
            for i, spec in enumerate(self.plan[key]):
                scale = f", scale {spec['scale']!r}" if "scale" in spec else ""
                if "axis" in spec:
                    scale += f" per slice along axis {spec['axis']}, sizes {spec['sizes']}"
                precision = f" precision {spec['precision']}" if spec["precision"] else ""
                lines.append(f"   {key[:-1]} {i}: '{_comment(spec['name'])}' {spec['dtype']}"
                             f"{precision} {spec['shape']}{scale}")
        tensors = "\n".join(lines)
        return f"""/* {n}: a model compiled by cvmc (`cvmc compile --emit c-library`).

{tensors}

   Link: gcc app.c lib{n}.a -lm -pthread
   (or -L. -l{n} for lib{n}.so). The library needs libc, libm and pthreads only.
   Every function returning int returns {up}_OK or an error code;
   {n}_last_error() then names what was wrong. */
#ifndef {up}_H
#define {up}_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

enum {{
{errors}
}};

typedef enum {{ {dtypes} }} {n}_dtype;

typedef struct {{
  const char* name;
  int ndim;
  const int64_t* shape;
  {n}_dtype dtype;
  int precision;  /* an integer tensor holds |v| <= 2^(precision-1) - 1; 0 for others */
  double scale;   /* a quantized model's scale: real ~= integer / scale; 0 when none; an
                     output with a scale per slice: the first slice's (the comment at the
                     top lists them all) */
  size_t bytes;   /* the size of its buffer */
}} {n}_tensor_info;

#define {up}_NUM_INPUTS {len(self.plan["inputs"])}
#define {up}_NUM_OUTPUTS {len(self.plan["outputs"])}

/* The description of input or output `index` in *info. */
int {n}_input_info(int index, const {n}_tensor_info** info);
int {n}_output_info(int index, const {n}_tensor_info** info);

typedef struct {n}_model {n}_model;

/* A new handle in *model: its own buffers and arena. Fails with {up}_ERR_CPU on a CPU
   without a feature the kernels need. */
int {n}_create({n}_model** model);

/* Run the model: inputs[i] holds input i ({up}_NUM_INPUTS of them, input_bytes[i] bytes,
   its tensor_info's size; any alignment), outputs[i] receives output i. Integer inputs
   must lie inside their precision. A handle runs one call at a time: calls from several
   threads on one handle wait for each other; separate handles run at once. */
int {n}_run({n}_model* model, const void* const* inputs, const size_t* input_bytes,
            void* const* outputs, const size_t* output_bytes);

/* Free a handle (NULL is ignored); no call may be running on it. */
void {n}_destroy({n}_model* model);

/* Threads the kernels use, for every model of the process (one thread pool): threads >= 1,
   or 0 for the default (TVM_NUM_THREADS when set, else the CPUs this process may run on). */
int {n}_set_num_threads(int threads);

/* The message of an error code, and the last error of this thread in detail. */
const char* {n}_strerror(int code);
const char* {n}_last_error(void);

#ifdef __cplusplus
}}
#endif
#endif
"""

    def source(self) -> str:
        n, up, plan = self.name, self.name.upper(), self.plan
        rows, shapes = [], []
        for t in self.tensors.values():
            # (a rank-0 tensor's array holds one unused 0: C has no empty arrays)
            shapes.append(f"static int64_t shape_{t['index']}[] = "
                          f"{{{', '.join(map(str, t['shape'])) or '0'}}};")
            _, code, bits = DTYPES[t["dtype"]]
            kind, offset = t["place"]
            rows.append(f"  {{{len(t['shape'])}, shape_{t['index']}, {{{code}, {bits}, 1}}, "
                        f"PLACE_{kind}, {offset}, {t['bytes']}}},  /* {_comment(t['name'])} */")
        infos = {}
        for key in ("inputs", "outputs"):
            infos[key] = "\n".join(
                f"  {{{_c_string(s['name'])}, {len(s['shape'])}, "
                f"shape_{self.tensors[s['name']]['index']}, {up}_{DTYPES[s['dtype']][0]}, "
                f"{s['precision'] or 0}, {float(np.atleast_1d(s.get('scale', 0))[0])!r}, "
                f"{self.tensors[s['name']]['bytes']}}}," for s in plan[key])
        symbols = list(dict.fromkeys(k["symbol"] for k in plan["kernels"]))
        declared = "\n".join(f"int __tvm_ffi_{s}(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);"
                             for s in symbols)
        args, calls = [], []
        for kernel in plan["kernels"]:
            calls.append(f"  {{__tvm_ffi_{kernel['symbol']}, {_c_string(kernel['symbol'])}, "
                         f"{len(args)}, {len(kernel['args'])}}},")
            args.extend(self.tensors[a]["index"] for a in kernel["args"])
        checks = "\n".join(f"  if (!{_has(plan['target'], f)}) missing = append(missing, "
                           f"{_c_string(f)}, text, sizeof(text));"
                           for f in plan["target"]["features"])
        io = [[self.tensors[s["name"]]["index"] for s in plan[key]]
              for key in ("inputs", "outputs")]
        return MODEL_C.format(
            n=n, up=up, shapes="\n".join(shapes), tensors="\n".join(rows),
            num_tensors=len(self.tensors), inputs=infos["inputs"], outputs=infos["outputs"],
            input_index=", ".join(map(str, io[0])) or "0",
            output_index=", ".join(map(str, io[1])), declared=declared,
            calls="\n".join(calls), args=", ".join(map(str, args)) or "0",
            max_args=max((len(k["args"]) for k in plan["kernels"]), default=1),
            arena=plan["arena"]["bytes"], mcpu=_c_string(plan["target"]["mcpu"]), checks=checks,
            num_calls=len(plan["kernels"]),
            messages="\n".join(f"  {_c_string(text)}," for _, text in ERRORS))

    def example(self) -> str:
        return MAIN_C.replace("MODEL_NUM_", f"{self.name.upper()}_NUM_") \
            .replace("MODEL", self.name)


MODEL_C = r"""/* The plan of {n} as code (generated by cvmc). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "cvmc_pool.h"
#include "{n}.h"

/* The kernels call the runtime through these pointers (weak in each kernel's object). */
void* __TVMBackendParallelLaunch = (void*)cvmc_parallel_launch;
void* __TVMBackendParallelBarrier = (void*)cvmc_parallel_barrier;
void* __TVMBackendAllocWorkspace = (void*)cvmc_alloc_workspace;
void* __TVMBackendFreeWorkspace = (void*)cvmc_free_workspace;

static __thread char last_error[1024];

static int fail(int code, const char* format, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char* format, ...) {{
  va_list args;
  va_start(args, format);
  vsnprintf(last_error, sizeof(last_error), format, args);
  va_end(args);
  return code;
}}

/* A kernel reports a bad argument (or any error) here before it returns nonzero. */
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t count) {{
  size_t used = (size_t)snprintf(last_error, sizeof(last_error), "%s: ", kind);
  for (int32_t i = 0; i < count && used < sizeof(last_error); i++)
    used += (size_t)snprintf(last_error + used, sizeof(last_error) - used, "%s", parts[i]);
}}

extern const unsigned char cvmc_weights[];

enum {{ PLACE_WEIGHT, PLACE_ARENA, PLACE_OWN }};

/* Where a tensor lives: in cvmc_weights or the handle's arena at `offset`, or (an input or
   an output) in an allocation of its own in each handle. */
typedef struct {{
  int32_t ndim;
  int64_t* shape;
  DLDataType dtype;
  int place;
  size_t offset, bytes;
}} tensor_place;

{shapes}

static const tensor_place tensors[{num_tensors}] = {{
{tensors}
}};

static const {n}_tensor_info input_info[{up}_NUM_INPUTS + 1] = {{
{inputs}
}};
static const {n}_tensor_info output_info[{up}_NUM_OUTPUTS] = {{
{outputs}
}};
static const int input_tensor[{up}_NUM_INPUTS + 1] = {{{input_index}}};
static const int output_tensor[{up}_NUM_OUTPUTS] = {{{output_index}}};

{declared}

static const struct {{
  TVMFFISafeCallType f;
  const char* symbol;
  int first_arg, num_args;
}} calls[{num_calls}] = {{
{calls}
}};
static const int call_args[] = {{{args}}};

struct {n}_model {{
  pthread_mutex_t lock;
  unsigned char* arena;
  DLTensor tensors[{num_tensors}];
}};

#define ARENA_BYTES ((size_t){arena})

/* ------------------------------------------------------------------ the CPU */

#if defined(__x86_64__) || defined(__i386__)
/* Whether cpuid leaf/subleaf sets `bit` of register `reg` (eax..edx) and the OS saves the
   register state `xcr0` names (AVX, AVX-512), as Linux's /proc/cpuinfo flags say. */
static int cpu_has(unsigned leaf, unsigned sub, int reg, int bit, unsigned xcr0) {{
  unsigned r[4] = {{0, 0, 0, 0}};
  if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3]) || !(r[reg] >> bit & 1))
    return 0;
  if (xcr0) {{
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return 0;  /* OSXSAVE */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & xcr0) == xcr0;
  }}
  return 1;
}}
#elif defined(__aarch64__)
/* Whether Linux's HWCAP flags of `entry` (AT_HWCAP, AT_HWCAP2) set `bit`. */
static int hwcap_has(unsigned long entry, int bit) {{
  return (int)(getauxval(entry) >> bit & 1);
}}
#endif

static int append(int missing, const char* feature, char* text, size_t size) {{
  size_t used = strlen(text);
  snprintf(text + used, size - used, "%s%s", missing ? ", " : "", feature);
  return missing + 1;
}}

static int check_cpu(void) {{
  char text[800] = "";
  int missing = 0;
{checks}
  (void)append;
  if (missing)
    return fail({up}_ERR_CPU, "built for %s: needs %s, which this CPU lacks; rebuild with "
                "--mcpu naming this CPU, or omit --mcpu when compiling on it", {mcpu}, text);
  return {up}_OK;
}}

/* ------------------------------------------------------------------ the API */

static const char* const messages[] = {{
{messages}
}};

const char* {n}_strerror(int code) {{
  if (code < 0 || code >= (int)(sizeof(messages) / sizeof(messages[0])))
    return "unknown error code";
  return messages[code];
}}

const char* {n}_last_error(void) {{ return last_error; }}

static int info(const char* what, int index, int count, const {n}_tensor_info* table,
                const {n}_tensor_info** out) {{
  if (!out) return fail({up}_ERR_NULL, "%s_info: info is NULL", what);
  if (index < 0 || index >= count)
    return fail({up}_ERR_INDEX, "%s_info: index %d is out of range: the model has %d %ss",
                what, index, count, what);
  *out = &table[index];
  return {up}_OK;
}}

int {n}_input_info(int index, const {n}_tensor_info** out) {{
  return info("input", index, {up}_NUM_INPUTS, input_info, out);
}}

int {n}_output_info(int index, const {n}_tensor_info** out) {{
  return info("output", index, {up}_NUM_OUTPUTS, output_info, out);
}}

int {n}_set_num_threads(int threads) {{
  if (threads < 0)
    return fail({up}_ERR_ARGUMENT, "set_num_threads: %d threads; give 1 or more, or 0 for "
                "the default", threads);
  cvmc_set_num_threads(threads);
  return {up}_OK;
}}

int {n}_create({n}_model** out) {{
  if (!out) return fail({up}_ERR_NULL, "create: model is NULL");
  *out = NULL;
  int err = check_cpu();
  if (err) return err;
  {n}_model* m = ({n}_model*)calloc(1, sizeof({n}_model));
  if (!m) return fail({up}_ERR_MEMORY, "create: no memory for a handle");
  pthread_mutex_init(&m->lock, NULL);
  /* 64-byte aligned, each size rounded up to 64 bytes (aligned_alloc's rule) */
  m->arena = (unsigned char*)aligned_alloc(64, ARENA_BYTES ? (ARENA_BYTES + 63) / 64 * 64 : 64);
  int ok = m->arena != NULL;
  for (int i = 0; i < {num_tensors}; i++) {{
    const tensor_place* t = &tensors[i];
    DLTensor* d = &m->tensors[i];
    if (t->place == PLACE_OWN) {{
      d->data = aligned_alloc(64, (t->bytes + 63) / 64 * 64);
      ok = ok && d->data;
    }} else {{
      d->data = t->place == PLACE_WEIGHT ? (void*)(cvmc_weights + t->offset) :
                m->arena ? (void*)(m->arena + t->offset) : NULL;
    }}
    d->device.device_type = kDLCPU;
    d->device.device_id = 0;
    d->ndim = t->ndim;
    d->dtype = t->dtype;
    d->shape = t->shape;
    d->strides = NULL;
    d->byte_offset = 0;
  }}
  if (!ok) {{
    {n}_destroy(m);
    return fail({up}_ERR_MEMORY, "create: no memory for the model's tensors");
  }}
  *out = m;
  return {up}_OK;
}}

void {n}_destroy({n}_model* m) {{
  if (!m) return;
  pthread_mutex_destroy(&m->lock);
  for (int i = 0; i < {num_tensors}; i++)
    if (tensors[i].place == PLACE_OWN) free(m->tensors[i].data);
  free(m->arena);
  free(m);
}}

/* Input `i`'s values inside its precision (an integer tensor), or 0 and 1 (bool). */
static int check_values(int i, const void* data) {{
  const {n}_tensor_info* t = &input_info[i];
  if (t->dtype == {up}_FLOAT32) return {up}_OK;
  size_t count = t->bytes / (t->dtype == {up}_INT32 ? 4 : 1);
  long long bound = t->dtype == {up}_BOOL ? 1 : (1LL << (t->precision - 1)) - 1;
  long long low = t->dtype == {up}_BOOL ? 0 : -bound;
  for (size_t k = 0; k < count; k++) {{
    long long v = t->dtype == {up}_INT32 ? ((const int32_t*)data)[k] :
                  t->dtype == {up}_INT8 ? ((const int8_t*)data)[k] : ((const uint8_t*)data)[k];
    if (v < low || v > bound) {{
      if (t->dtype == {up}_BOOL)
        return fail({up}_ERR_INPUT_RANGE, "input '%s': byte %lld at index %zu is not a bool "
                    "(0 or 1)", t->name, v, k);
      return fail({up}_ERR_INPUT_RANGE, "input '%s': value %lld at index %zu is outside "
                  "precision %d (|v| <= %lld)", t->name, v, k, t->precision, bound);
    }}
  }}
  return {up}_OK;
}}

static int check_buffers(const char* what, int count, const void* const* data,
                         const size_t* bytes, const {n}_tensor_info* table) {{
  if (!data || !bytes) return fail({up}_ERR_NULL, "run: %ss or %s_bytes is NULL", what, what);
  for (int i = 0; i < count; i++) {{
    if (!data[i]) return fail({up}_ERR_NULL, "run: %s %d ('%s') is NULL", what, i,
                              table[i].name);
    if (bytes[i] != table[i].bytes)
      return fail({up}_ERR_SIZE, "run: %s %d ('%s') has %zu bytes, expected %zu", what, i,
                  table[i].name, bytes[i], table[i].bytes);
  }}
  return {up}_OK;
}}

static int run_locked({n}_model* m, const void* const* inputs, void* const* outputs) {{
  for (int i = 0; i < {up}_NUM_INPUTS; i++) {{
    int err = check_values(i, inputs[i]);
    if (err) return err;
    memcpy(m->tensors[input_tensor[i]].data, inputs[i], input_info[i].bytes);
  }}
  TVMFFIAny args[{max_args}];
  for (int k = 0; k < {num_calls}; k++) {{
    for (int a = 0; a < calls[k].num_args; a++) {{
      args[a].type_index = kTVMFFIDLTensorPtr;
      args[a].zero_padding = 0;
      args[a].v_ptr = &m->tensors[call_args[calls[k].first_arg + a]];
    }}
    TVMFFIAny result;
    result.type_index = kTVMFFINone;
    result.zero_padding = 0;
    result.v_int64 = 0;
    last_error[0] = 0;
    int r = calls[k].f(NULL, args, calls[k].num_args, &result);
    if (r != 0) {{
      char reason[sizeof(last_error)];
      snprintf(reason, sizeof(reason), "%s", last_error[0] ? last_error : "no message");
      return fail({up}_ERR_KERNEL, "kernel %d '%s' failed (%d): %s", k, calls[k].symbol, r,
                  reason);
    }}
  }}
  for (int i = 0; i < {up}_NUM_OUTPUTS; i++)
    memcpy(outputs[i], m->tensors[output_tensor[i]].data, output_info[i].bytes);
  return {up}_OK;
}}

int {n}_run({n}_model* m, const void* const* inputs, const size_t* input_bytes,
            void* const* outputs, const size_t* output_bytes) {{
  if (!m) return fail({up}_ERR_NULL, "run: model is NULL");
  int err = check_buffers("input", {up}_NUM_INPUTS, inputs, input_bytes, input_info);
  if (!err)
    err = check_buffers("output", {up}_NUM_OUTPUTS, (const void* const*)outputs, output_bytes,
                        output_info);
  if (err) return err;
  pthread_mutex_lock(&m->lock);
  err = run_locked(m, inputs, outputs);
  pthread_mutex_unlock(&m->lock);
  return err;
}}
"""


MAIN_C = r"""/* An example: run the model on raw input files, write raw output files.

   Build: gcc -O2 main.c libMODEL.a -lm -pthread -o MODEL_main
   Run:   ./MODEL_main [-t THREADS] [-r REPEAT] INPUT.bin... OUT_DIR
   Each INPUT.bin holds one input's values as the machine stores them (NumPy:
   array.astype(dtype).tofile(path)), in MODEL.h's order; OUT_DIR/<output>.bin gets each
   output (OUT_DIR/output<index>.bin if its name is no plain file name). -r times REPEAT
   more runs and prints their median. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "MODEL.h"

static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = malloc(n > 0 ? (size_t)n : 1);
  *size = n > 0 && data && fread(data, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
  fclose(f);
  return data;
}

static int compare(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char** argv) {
  int threads = 0, repeat = 0, first = 1;
  for (; first + 1 < argc && argv[first][0] == '-'; first += 2) {
    if (!strcmp(argv[first], "-t")) threads = atoi(argv[first + 1]);
    else if (!strcmp(argv[first], "-r")) repeat = atoi(argv[first + 1]);
    else break;
  }
  if (argc - first != MODEL_NUM_INPUTS + 1) {
    fprintf(stderr, "usage: %s [-t THREADS] [-r REPEAT] INPUT.bin... OUT_DIR\n", argv[0]);
    for (int i = 0; i < MODEL_NUM_INPUTS; i++) {
      const MODEL_tensor_info* t;
      MODEL_input_info(i, &t);
      fprintf(stderr, "  input %d: %s, %zu bytes\n", i, t->name, t->bytes);
    }
    return 2;
  }
  const void* inputs[MODEL_NUM_INPUTS + 1];
  size_t input_bytes[MODEL_NUM_INPUTS + 1];
  void* outputs[MODEL_NUM_OUTPUTS];
  size_t output_bytes[MODEL_NUM_OUTPUTS];
  for (int i = 0; i < MODEL_NUM_INPUTS; i++) {
    inputs[i] = read_file(argv[first + i], &input_bytes[i]);
    if (!inputs[i]) {
      fprintf(stderr, "cannot read %s\n", argv[first + i]);
      return 1;
    }
  }
  for (int i = 0; i < MODEL_NUM_OUTPUTS; i++) {
    const MODEL_tensor_info* t;
    MODEL_output_info(i, &t);
    output_bytes[i] = t->bytes;
    outputs[i] = malloc(t->bytes);
  }
  MODEL_model* model;
  int err = MODEL_set_num_threads(threads);
  if (!err) err = MODEL_create(&model);
  if (!err) err = MODEL_run(model, inputs, input_bytes, outputs, output_bytes);
  if (err) {
    fprintf(stderr, "error %d (%s): %s\n", err, MODEL_strerror(err), MODEL_last_error());
    return 1;
  }
  if (repeat > 0) {
    double* ms = malloc(sizeof(double) * (size_t)repeat);
    for (int r = 0; r < repeat && !err; r++) {
      double start = now_ms();
      err = MODEL_run(model, inputs, input_bytes, outputs, output_bytes);
      ms[r] = now_ms() - start;
    }
    if (err) {
      fprintf(stderr, "error %d (%s): %s\n", err, MODEL_strerror(err), MODEL_last_error());
      return 1;
    }
    qsort(ms, (size_t)repeat, sizeof(double), compare);
    printf("median of %d runs: %.3f ms\n", repeat, ms[repeat / 2]);
    free(ms);
  }
  for (int i = 0; i < MODEL_NUM_OUTPUTS; i++) {
    const MODEL_tensor_info* t;
    MODEL_output_info(i, &t);
    char path[4096];
    /* a name that is no plain file name (a '/', a leading '.') is written by its index */
    if (strchr(t->name, '/') || t->name[0] == '.' || !t->name[0])
      snprintf(path, sizeof(path), "%s/output%d.bin", argv[argc - 1], i);
    else
      snprintf(path, sizeof(path), "%s/%s.bin", argv[argc - 1], t->name);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(outputs[i], 1, t->bytes, f) != t->bytes || fclose(f) != 0) {
      fprintf(stderr, "cannot write %s\n", path);
      return 1;
    }
    printf("wrote %s (%zu bytes)\n", path, t->bytes);
  }
  MODEL_destroy(model);
  for (int i = 0; i < MODEL_NUM_INPUTS; i++) free((void*)inputs[i]);
  for (int i = 0; i < MODEL_NUM_OUTPUTS; i++) free(outputs[i]);
  return 0;
}
"""
