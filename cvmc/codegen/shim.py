"""The native piece parallel CPU kernels need when only apache-tvm-ffi is loaded.

TVM-generated kernels call four runtime services through function pointers
(`__TVMBackendParallelLaunch`, `__TVMBackendParallelBarrier`, `__TVMBackendAllocWorkspace`,
`__TVMBackendFreeWorkspace`) that libtvm_runtime normally fills. This C file is linked
into every CPU kernel library: its constructor registers OpenMP / aligned-malloc versions
with tvm-ffi, which writes them into the library's pointers when it loads it.
"""

SHIM_C = r"""
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);
/* TVM links addons with g++: keep C linkage for the tvm-ffi entry point. */
#ifdef __cplusplus
extern "C"
#endif
int TVMFFIEnvModRegisterContextSymbol(const char* name, void* symbol);

static int cvmc_num_threads(void) {
  const char* s = getenv("TVM_NUM_THREADS");
  int n = s ? atoi(s) : 0;
  return n > 0 ? n : omp_get_num_procs();
}

static int cvmc_parallel_launch(FTVMParallelLambda f, void* cdata, int num_task) {
  int err = 0;
  int n = num_task > 0 ? num_task : cvmc_num_threads();
  /* Tasks are numbered by the threads OpenMP actually gives, so none is skipped. */
  #pragma omp parallel num_threads(n)
  {
    TVMParallelGroupEnv env = {0, omp_get_num_threads()};
    int r = f(omp_get_thread_num(), &env, cdata);
    if (r != 0) {
      #pragma omp atomic write
      err = r;
    }
  }
  return err;
}

static int cvmc_parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id; (void)penv;
  #pragma omp barrier
  return 0;
}

static void* cvmc_alloc_workspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits) {
  (void)dev_type; (void)dev_id; (void)code; (void)bits;
  return aligned_alloc(64, (size_t)((nbytes + 63) / 64 * 64 + 64));
}

static int cvmc_free_workspace(int dev_type, int dev_id, void* ptr) {
  (void)dev_type; (void)dev_id;
  free(ptr);
  return 0;
}

__attribute__((constructor)) static void cvmc_register_backend(void) {
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendParallelLaunch", (void*)cvmc_parallel_launch);
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendParallelBarrier", (void*)cvmc_parallel_barrier);
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendAllocWorkspace", (void*)cvmc_alloc_workspace);
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendFreeWorkspace", (void*)cvmc_free_workspace);
}
"""

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
