"""C pieces the compiler adds to kernel libraries: the signature function every library
carries (`signature_source`) and the CUDA helpers. CPU kernels' backend functions (thread
pool, workspaces) are not here: they are the process's native runtime (cvmc_runtime.pool).
"""
from __future__ import annotations

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
