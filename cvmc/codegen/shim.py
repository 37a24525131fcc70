"""The native piece CPU kernels need when only apache-tvm-ffi is loaded, and CUDA helpers.

TVM-generated kernels call four runtime services through function pointers
(`__TVMBackendParallelLaunch`, `__TVMBackendParallelBarrier`, `__TVMBackendAllocWorkspace`,
`__TVMBackendFreeWorkspace`) that libtvm_runtime normally fills. cvmc's native runtime
(`runtime/cvmc_runtime/native/`: a thread pool and per-thread workspace arenas,
`cvmc_pool.c`, and its registration with tvm-ffi, `cvmc_tvm_ffi.c`) is linked into every
CPU kernel library as one translation unit, `SHIM_C`: its constructor registers the pool
with tvm-ffi, which writes it into the library's pointers when it loads it.
"""
from __future__ import annotations

import re
from pathlib import Path

from cvmc_runtime import NATIVE_FOLDER as NATIVE

POOL_HEADER = NATIVE / "cvmc_pool.h"
POOL_C = NATIVE / "cvmc_pool.c"


def one_unit(*files: Path) -> str:
    """The C `files` as one translation unit: each `#include "cvmc_pool.h"` replaced by the
    header's text (which its include guard keeps to one copy)."""
    header = POOL_HEADER.read_text()
    return "".join(re.sub(r'^#include "cvmc_pool\.h"\n', lambda _: header, f.read_text(),
                          flags=re.MULTILINE) for f in files)


# The pool's functions hidden: each artifact's library keeps its own (cvmc_pool.h).
SHIM_C = '#define CVMC_API __attribute__((visibility("hidden")))\n' + \
    one_unit(POOL_C, NATIVE / "cvmc_tvm_ffi.c")

# Put before the CUDA kernels: device functions they call. `cvmc_dp4a_u8s8` is PTX
# `dp4a.u32.s32` (u8 x s8 dot product of 4 bytes, added to c), which CUDA's `__dp4a`
# overloads do not offer (TVM's header declares one for the device pass only, so the host
# pass of the same file finds the call ambiguous).
CUDA_DEVICE_HELPERS_CU = r"""
static __device__ __forceinline__ int cvmc_dp4a_u8s8(unsigned int a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
"""

# Appended to the CUDA translation unit: device memory for the runtime, which has only
# tvm-ffi (no allocator of its own) and must not need any CUDA Python package.
CUDA_HELPERS_CU = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/function.h>

namespace cvmc_cuda {
struct CudaAlloc {
  void AllocData(DLTensor* t) {
    size_t n = tvm::ffi::GetDataSize(*t);
    if (cudaMalloc(&t->data, n ? n : 1) != cudaSuccess) {
      TVM_FFI_THROW(RuntimeError) << "cudaMalloc of " << n << " bytes failed";
    }
  }
  void FreeData(DLTensor* t) { cudaFree(t->data); }
};

tvm::ffi::Tensor Empty(tvm::ffi::Array<int64_t> shape, tvm::ffi::String dtype) {
  return tvm::ffi::Tensor::FromNDAlloc(CudaAlloc(), tvm::ffi::Shape(shape),
                                       tvm::ffi::StringToDLDataType(dtype), DLDevice{kDLCUDA, 0});
}

void Copy(tvm::ffi::Tensor src, tvm::ffi::Tensor dst) {
  size_t n = tvm::ffi::GetDataSize(src);
  cudaError_t err = cudaMemcpy(dst.data_ptr(), src.data_ptr(), n, cudaMemcpyDefault);
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << cudaGetErrorString(err);
}

void Sync() {
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << cudaGetErrorString(err);
}
}  // namespace cvmc_cuda

TVM_FFI_DLL_EXPORT_TYPED_FUNC(cvmc_empty, cvmc_cuda::Empty);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cvmc_copy, cvmc_cuda::Copy);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cvmc_sync, cvmc_cuda::Sync);
"""


def signature_source(text: str) -> str:
    """C (and CUDA C++) source of the library function that returns the signature `text`
    (cvmc_runtime.library), its bytes spelled as numbers so no text needs escaping."""
    from cvmc_runtime import SIGNATURE_FUNCTION

    data = text.encode()
    rows = ",\n".join(",".join(str(b) for b in data[i:i + 40]) for i in range(0, len(data), 40))
    return f"""
#include <tvm/ffi/c_api.h>
static const char cvmc_signature_text[] = {{
{rows}, 0}};
#ifdef __cplusplus
extern "C"
#endif
TVM_FFI_DLL_EXPORT int __tvm_ffi_{SIGNATURE_FUNCTION}(void* self, const TVMFFIAny* args,
                                                  int32_t num_args, TVMFFIAny* result) {{
  TVMFFIByteArray text = {{cvmc_signature_text, sizeof(cvmc_signature_text) - 1}};
  (void)self; (void)args; (void)num_args;
  return TVMFFIStringFromByteArray(&text, result);
}}
"""
