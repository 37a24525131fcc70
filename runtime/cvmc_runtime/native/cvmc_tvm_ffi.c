/* The native runtime (cvmc_pool.c) for kernels loaded by tvm-ffi, as cvmc_runtime loads an
   artifact's kernels.so, which links this file: its constructor registers the pool's
   functions with tvm-ffi, which writes them into the library's __TVMBackend* pointers when
   it loads the library. */
#include <tvm/ffi/c_api.h>

#include "cvmc_pool.h"

#ifdef __cplusplus
extern "C"
#endif
int TVMFFIEnvModRegisterContextSymbol(const char* name, void* symbol);

__attribute__((constructor)) static void cvmc_register_backend(void) {
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendParallelLaunch", (void*)cvmc_parallel_launch);
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendParallelBarrier", (void*)cvmc_parallel_barrier);
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendAllocWorkspace", (void*)cvmc_alloc_workspace);
  TVMFFIEnvModRegisterContextSymbol("__TVMBackendFreeWorkspace", (void*)cvmc_free_workspace);
}

/* The pool's counters as JSON, for tests and benchmarks: module["cvmc_shim_stats"](). */
#ifdef __cplusplus
extern "C"
#endif
TVM_FFI_DLL_EXPORT int __tvm_ffi_cvmc_shim_stats(void* self, const TVMFFIAny* args,
                                                 int32_t num_args, TVMFFIAny* result) {
  char text[512];
  int len = cvmc_pool_stats(text, sizeof(text));
  TVMFFIByteArray bytes = {text, (size_t)len};
  (void)self; (void)args; (void)num_args;
  return TVMFFIStringFromByteArray(&bytes, result);
}
