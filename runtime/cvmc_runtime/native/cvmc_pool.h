/* cvmc's native runtime: the thread pool and workspace arena that TVM-generated CPU kernels
   call through their backend function pointers (__TVMBackendParallelLaunch,
   __TVMBackendParallelBarrier, __TVMBackendAllocWorkspace, __TVMBackendFreeWorkspace).

   One pool per process. The Python runtime builds this file and cvmc_tvm_ffi.c once into a
   shared library of its own (cvmc_runtime.pool), which registers the pool with tvm-ffi for
   every artifact's kernels.so it loads (artifacts carry kernels only); a C library built
   by `cvmc compile --emit c-library` links this file and stores the pool in the kernels'
   pointers itself. It needs libc and pthreads only. */
#ifndef CVMC_POOL_H
#define CVMC_POOL_H

#include <stddef.h>
#include <stdint.h>

/* The version of the interface between compiled kernels and this runtime: the backend
   functions below and how kernels are called (TVM's packed-function calling convention
   with DLTensor arguments). An artifact records it in cvmx.json; the Python runtime
   refuses one built for another (cvmc_runtime.artifact.NATIVE_ABI, which must equal it). */
#define CVMC_ABI_VERSION 2

#ifdef __cplusplus
extern "C" {
#endif

/* TVM's types for parallel loops (TVM's c_backend_api.h). */
typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

/* The backend functions, as TVM's kernels call them. */
int cvmc_parallel_launch(FTVMParallelLambda f, void* cdata, int num_task);
int cvmc_parallel_barrier(int task_id, TVMParallelGroupEnv* penv);
void* cvmc_alloc_workspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits);
int cvmc_free_workspace(int dev_type, int dev_id, void* ptr);

/* Threads a parallel loop uses from the next launch on: `threads` >= 1, or 0 for the
   default (TVM_NUM_THREADS when set in the environment at the launch, else the CPUs this
   process may run on). At most 256. Workers start on the first launch that wants them. */
void cvmc_set_num_threads(int threads);
/* The threads the next launch uses. */
int cvmc_get_num_threads(void);

/* The pool's counters as JSON ({"launches": ..., "tasks": ..., "mallocs": ..., "workers":
   ..., "threads": ...}) in `text` (`size` bytes, NUL-terminated); returns the length
   snprintf reports. */
int cvmc_pool_stats(char* text, size_t size);

#ifdef __cplusplus
}
#endif
#endif
