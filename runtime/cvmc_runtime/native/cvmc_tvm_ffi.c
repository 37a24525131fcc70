/* The native runtime's registration with tvm-ffi, built with cvmc_pool.c into the Python
   runtime's one native library (cvmc_runtime.pool). TVMFFIEnvModRegisterContextSymbol
   resolves against libtvm_ffi.so, which `import tvm_ffi` has loaded with RTLD_GLOBAL. */
#include "cvmc_pool.h"

int TVMFFIEnvModRegisterContextSymbol(const char* name, void* symbol);

/* Register the pool's functions with tvm-ffi, which writes them into the __TVMBackend*
   pointers of every kernel library it loads afterwards. Called before each load: TVM's
   own runtime, when the process imports it, registers its thread pool in their place.
   Returns 0, or the first failing registration's nonzero result. */
int cvmc_tvm_ffi_register(void) {
  int r = TVMFFIEnvModRegisterContextSymbol("__TVMBackendParallelLaunch",
                                            (void*)cvmc_parallel_launch);
  if (!r) r = TVMFFIEnvModRegisterContextSymbol("__TVMBackendParallelBarrier",
                                                (void*)cvmc_parallel_barrier);
  if (!r) r = TVMFFIEnvModRegisterContextSymbol("__TVMBackendAllocWorkspace",
                                                (void*)cvmc_alloc_workspace);
  if (!r) r = TVMFFIEnvModRegisterContextSymbol("__TVMBackendFreeWorkspace",
                                                (void*)cvmc_free_workspace);
  return r;
}
