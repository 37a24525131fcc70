/* cvmc's native runtime (cvmc_pool.h): a thread pool and per-thread workspace arenas.

   Why not OpenMP: its static split gives each thread one fixed share of every parallel
   loop, so one descheduled thread stalls the whole region on a busy machine (ResNet-18 at
   2 threads: 205 ms median beside other work, ORT 20 ms), and its threads spin long after
   a region. Here the calling thread works too and every thread claims tasks from one
   atomic counter, so a descheduled worker delays at most the task it holds; idle workers
   spin a bounded, adaptive time, then sleep on a futex.

   Why an arena: TVM asks for a workspace (an accumulator tile, a scratch word) in every
   parallel task; aligned_alloc/free for each cost ~0.5 ms per network run. Each thread
   bumps a pointer in its own arena, which grows only while empty (so warm runs never
   allocate); TVM frees in reverse order within a task, and a free out of that order is
   only deferred. */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "cvmc_pool.h"

/* TVM's parallel lambda splits its loop into penv->num_task equal ranges and runs range
   task_id, so any number of tasks computes the same bits; more tasks than threads let a
   thread that is running take the share of one that is not. 8 per thread: a descheduled
   worker holds at most 1/16 of a region at 2 threads, and a claim costs ~100 ns. */
#define CVMC_TASKS_PER_THREAD 8
#define CVMC_MAX_TASKS 0xffff  /* num_task and the next task id share the claim word */
#define CVMC_MAX_THREADS 256
#define CVMC_SPIN_MIN_NS 2000
#define CVMC_SPIN_MAX_NS 100000
#define CVMC_CALLER_SPIN_NS 50000
#define CVMC_ALIGN 64

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
/* The sleep handshakes (a worker on wake, the caller on done) need a store then a load
   that cannot pass it: sequentially consistent on both sides. */
#define LOAD_SC(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE_SC(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

static void cvmc_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t cvmc_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void cvmc_futex_wait(uint32_t* word, uint32_t seen) {
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void cvmc_futex_wake(uint32_t* word, int count) {
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

/* Counters that cvmc_pool_stats reports (statistics, not synchronisation): the per-task
   ones live in each thread's arena, so counting shares no cache line between threads. */
static uint64_t cvmc_stat_launches, cvmc_stat_inline, cvmc_stat_sleeps;
#define COUNT(c) __atomic_add_fetch(&(c), 1, __ATOMIC_RELAXED)

/* Each thread's workspace arena (below) and its counters. */
typedef struct cvmc_arena {
  char* base;
  size_t cap, top, want;
  size_t last;   /* offset of the top block, SIZE_MAX when empty */
  size_t spill;  /* bytes in live blocks of their own (the arena was too small) */
  uint64_t tasks, workspaces, mallocs, deferred_frees;
  struct cvmc_arena* next;  /* every arena of this library, freed when it is unloaded */
} cvmc_arena;
static cvmc_arena* cvmc_arena_of_thread(void);

/* ------------------------------------------------------------------ the pool */

/* One job at a time. The claim word holds (job generation << 32 | num_task << 16 | next
   task id): a thread takes a task with one compare-and-swap that also checks the job is
   still the one it read f and cdata for, so a worker that wakes late can never run a task
   of a job that has finished (whose cdata lives on a returned caller's stack). */
static struct {
  FTVMParallelLambda f;
  void* cdata;
  uint64_t claim;
  uint32_t done;         /* tasks of the job finished; futex word of a sleeping caller */
  int32_t err;           /* last nonzero task result */
  uint32_t wake;         /* bumped per job; futex word of sleeping workers */
  int32_t sleepers;      /* workers in futex_wait on wake */
  int32_t caller_asleep; /* the caller is in futex_wait on done */
  int32_t wanted;        /* workers that take part in the job (threads - 1) */
  int32_t stop;
  int32_t busy;          /* a launch is running: a second caller thread runs inline */
  int started;
  pthread_t threads[CVMC_MAX_THREADS];
  pthread_mutex_t lock;  /* starting and stopping workers only */
  int cpus;              /* CPUs this process may run on, the default thread count */
  int32_t num_threads;   /* cvmc_set_num_threads, 0 for the default */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread int cvmc_in_task;  /* a task launching a loop runs it inline */

int cvmc_get_num_threads(void) {
  int n = __atomic_load_n(&pool.num_threads, __ATOMIC_RELAXED);
  if (n <= 0) {
    const char* s = getenv("TVM_NUM_THREADS");
    n = s ? atoi(s) : 0;
  }
  if (n <= 0) n = pool.cpus > 0 ? pool.cpus : 1;
  return n < CVMC_MAX_THREADS ? n : CVMC_MAX_THREADS;
}

void cvmc_set_num_threads(int threads) {
  __atomic_store_n(&pool.num_threads, threads > 0 ? threads : 0, __ATOMIC_RELAXED);
}

/* Claim and run tasks of the job of generation `gen` until none is left. */
static void cvmc_run_tasks(uint32_t gen) {
  uint64_t w = LOAD(&pool.claim);
  FTVMParallelLambda f = __atomic_load_n(&pool.f, __ATOMIC_RELAXED);
  void* cdata = __atomic_load_n(&pool.cdata, __ATOMIC_RELAXED);
  for (;;) {
    uint32_t n = (uint32_t)(w >> 16) & 0xffff, id = (uint32_t)w & 0xffff;
    if ((uint32_t)(w >> 32) != gen || id >= n) return;
    if (!__atomic_compare_exchange_n(&pool.claim, &w, w + 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
      continue;  /* w now holds the current word */
    TVMParallelGroupEnv env = {NULL, (int32_t)n};
    cvmc_in_task = 1;
    int r = f((int)id, &env, cdata);
    cvmc_in_task = 0;
    cvmc_arena* a = cvmc_arena_of_thread();
    if (a) a->tasks++;
    if (r != 0) __atomic_store_n(&pool.err, r, __ATOMIC_RELAXED);
    if (ADD(&pool.done, 1) == n && LOAD_SC(&pool.caller_asleep))
      cvmc_futex_wake(&pool.done, 1);
    w = LOAD(&pool.claim);
  }
}

/* Worker `index` (1-based; the caller is thread 0): wait for a job, take part if wanted. */
static void* cvmc_worker(void* arg) {
  int index = (int)(intptr_t)arg;
  int64_t spin_ns = CVMC_SPIN_MAX_NS;
  uint32_t seen = LOAD(&pool.wake);
  for (;;) {
    /* Spin while jobs come back to back (the kernels of one network run), sleep when they
       do not; the spin shortens each time it ran out and grows when a job came during it,
       so a worker on a busy machine gives its core back sooner. */
    int64_t until = cvmc_now_ns() + spin_ns;
    int spins = 0;
    while (LOAD(&pool.wake) == seen && !LOAD(&pool.stop)) {
      cvmc_pause();
      if (++spins % 64 == 0 && cvmc_now_ns() > until) break;
    }
    if (LOAD(&pool.wake) == seen && !LOAD(&pool.stop)) {
      spin_ns = spin_ns / 2 > CVMC_SPIN_MIN_NS ? spin_ns / 2 : CVMC_SPIN_MIN_NS;
      ADD(&pool.sleepers, 1);
      while (LOAD_SC(&pool.wake) == seen && !LOAD(&pool.stop)) {
        COUNT(cvmc_stat_sleeps);
        cvmc_futex_wait(&pool.wake, seen);
      }
      ADD(&pool.sleepers, -1);
    } else if (spin_ns < CVMC_SPIN_MAX_NS) {
      spin_ns *= 2;
    }
    if (LOAD(&pool.stop)) return NULL;
    seen = LOAD(&pool.wake);
    if (index <= LOAD(&pool.wanted)) cvmc_run_tasks((uint32_t)(LOAD(&pool.claim) >> 32));
  }
}

/* At least `workers` workers started (lazily, on the first launch that wants them). */
static void cvmc_start_workers(int workers) {
  pthread_mutex_lock(&pool.lock);
  if (pool.started < workers) {
    /* Workers block every signal: Python's SIGINT goes to its main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool.started < workers &&
           pthread_create(&pool.threads[pool.started], NULL, cvmc_worker,
                          (void*)(intptr_t)(pool.started + 1)) == 0)
      pool.started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
  }
  pthread_mutex_unlock(&pool.lock);
}

/* All tasks on the calling thread: one covering the whole loop unless the kernel asked for
   a number of tasks, then those, one after another. */
static int cvmc_run_serially(FTVMParallelLambda f, void* cdata, int num_task) {
  TVMParallelGroupEnv env = {NULL, num_task > 1 ? num_task : 1};
  int err = 0;
  COUNT(cvmc_stat_inline);
  for (int t = 0; t < env.num_task; t++) {
    int r = f(t, &env, cdata);
    if (r != 0) err = r;
  }
  return err;
}

int cvmc_parallel_launch(FTVMParallelLambda f, void* cdata, int num_task) {
  int threads = cvmc_get_num_threads();
  /* A launch from inside a task, or beside another caller's launch, runs on its thread. */
  if (threads <= 1 || cvmc_in_task || num_task > CVMC_MAX_TASKS ||
      __atomic_exchange_n(&pool.busy, 1, __ATOMIC_ACQUIRE))
    return cvmc_run_serially(f, cdata, num_task);
  if (pool.started < threads - 1) cvmc_start_workers(threads - 1);
  int workers = pool.started < threads - 1 ? pool.started : threads - 1;
  uint32_t n = num_task > 0 ? (uint32_t)num_task : (uint32_t)(threads * CVMC_TASKS_PER_THREAD);
  COUNT(cvmc_stat_launches);
  __atomic_store_n(&pool.f, f, __ATOMIC_RELAXED);
  __atomic_store_n(&pool.cdata, cdata, __ATOMIC_RELAXED);
  __atomic_store_n(&pool.err, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&pool.done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&pool.wanted, workers, __ATOMIC_RELAXED);
  uint32_t gen = (uint32_t)(LOAD(&pool.claim) >> 32) + 1;
  STORE(&pool.claim, (uint64_t)gen << 32 | (uint64_t)n << 16);
  ADD(&pool.wake, 1);
  /* The caller starts on the tasks at once; sleeping workers join when they wake. */
  if (LOAD_SC(&pool.sleepers) > 0) cvmc_futex_wake(&pool.wake, INT_MAX);
  cvmc_run_tasks(gen);
  /* Only tasks other threads hold are left: spin a little, then sleep until the last
     finishes (a worker descheduled inside a task gets the core back sooner). */
  int64_t until = cvmc_now_ns() + CVMC_CALLER_SPIN_NS;
  int spins = 0;
  uint32_t d;
  while ((d = LOAD(&pool.done)) != n) {
    cvmc_pause();
    if (++spins % 64 == 0 && cvmc_now_ns() > until) {
      STORE_SC(&pool.caller_asleep, 1);
      while ((d = LOAD_SC(&pool.done)) != n)
        cvmc_futex_wait(&pool.done, d);
      STORE(&pool.caller_asleep, 0);
      break;
    }
  }
  int err = __atomic_load_n(&pool.err, __ATOMIC_RELAXED);
  STORE(&pool.busy, 0);
  return err;
}

/* TVM emits this only inside loops it splits itself with barriers between phases; with
   tasks claimed by whichever thread is free, a task cannot wait for the others (one
   thread may run them all in turn). No cvmc kernel calls it (checked on the benchmark
   networks and every op case): refuse rather than return wrong results. */
int cvmc_parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id; (void)penv;
  fprintf(stderr, "cvmc: TVMBackendParallelBarrier is not supported by cvmc's thread pool\n");
  return -1;
}

/* ------------------------------------------------------------------ the workspace arena */

/* Each block: a 64-byte header, then the data. Blocks are stacked in the arena; each
   header holds the offset of the block under it. */
typedef struct {
  cvmc_arena* owner;  /* the arena of the thread that allocated it, NULL if it has none */
  size_t below;       /* offset of the block under this one, or SIZE_MAX */
  size_t size;        /* header included */
  int freed;
  int separate;       /* a block of its own from aligned_alloc, not in the arena */
} cvmc_block;

#define CVMC_HEADER CVMC_ALIGN
static __thread cvmc_arena* cvmc_my_arena;
static cvmc_arena* cvmc_arenas;

static cvmc_arena* cvmc_arena_of_thread(void) {
  cvmc_arena* a = cvmc_my_arena;
  if (a) return a;
  a = (cvmc_arena*)calloc(1, sizeof(cvmc_arena));
  if (!a) return NULL;
  a->last = SIZE_MAX;
  pthread_mutex_lock(&pool.lock);
  a->next = cvmc_arenas;
  cvmc_arenas = a;
  pthread_mutex_unlock(&pool.lock);
  return cvmc_my_arena = a;
}

void* cvmc_alloc_workspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits) {
  (void)dev_type; (void)dev_id; (void)code; (void)bits;
  /* 64 bytes spare after the data, as before: vector loads may read past the last element */
  size_t size = CVMC_HEADER + (size_t)(nbytes + CVMC_ALIGN - 1) / CVMC_ALIGN * CVMC_ALIGN
                + CVMC_ALIGN;
  cvmc_arena* a = cvmc_arena_of_thread();
  cvmc_block* b;
  if (a) {
    a->workspaces++;
    if (a->top == 0 && a->spill == 0 && a->want > a->cap) {
      /* Empty: grow to what the thread needed at once so far, so later runs fit. */
      char* bigger = (char*)aligned_alloc(CVMC_ALIGN, a->want);
      a->mallocs++;
      if (bigger) {
        free(a->base);
        a->base = bigger;
        a->cap = a->want;
      }
    }
    if (a->top + size <= a->cap) {
      b = (cvmc_block*)(a->base + a->top);
      b->owner = a;
      b->below = a->last;
      b->size = size;
      b->freed = 0;
      b->separate = 0;
      a->last = a->top;
      a->top += size;
      return (char*)b + CVMC_HEADER;
    }
    /* Too small now: a block of its own this time, an arena big enough next time. */
    if (a->top + a->spill + size > a->want)
      a->want = (a->top + a->spill + size + 4095) / 4096 * 4096;
    a->mallocs++;
  }
  b = (cvmc_block*)aligned_alloc(CVMC_ALIGN, size);
  if (!b) return NULL;
  b->owner = a;
  b->size = size;
  b->freed = 0;
  b->separate = 1;
  if (a) a->spill += size;
  return (char*)b + CVMC_HEADER;
}

int cvmc_free_workspace(int dev_type, int dev_id, void* ptr) {
  (void)dev_type; (void)dev_id;
  cvmc_block* b = (cvmc_block*)((char*)ptr - CVMC_HEADER);
  cvmc_arena* a = b->owner;
  /* TVM frees a workspace on the thread that allocated it: anything else is a bug. */
  if (a != cvmc_my_arena) return -1;
  if (b->separate) {
    if (a) a->spill -= b->size;
    free(b);
    return 0;
  }
  b->freed = 1;
  if ((char*)b != a->base + a->last) a->deferred_frees++;
  /* Pop the top block and every freed one under it (a free out of LIFO order waits). */
  while (a->last != SIZE_MAX && ((cvmc_block*)(a->base + a->last))->freed) {
    a->top = a->last;
    a->last = ((cvmc_block*)(a->base + a->last))->below;
  }
  return 0;
}

/* ------------------------------------------------------------------ life cycle */

/* Stop and join the workers: their code is this library's, about to be unmapped. */
static void cvmc_stop_workers(void) {
  pthread_mutex_lock(&pool.lock);
  STORE(&pool.stop, 1);
  ADD(&pool.wake, 1);
  cvmc_futex_wake(&pool.wake, INT_MAX);
  for (int i = 0; i < pool.started; i++) pthread_join(pool.threads[i], NULL);
  pool.started = 0;
  STORE(&pool.stop, 0);
  pthread_mutex_unlock(&pool.lock);
}

/* A forked child has only the thread that forked: it starts a pool of its own. */
static void cvmc_after_fork_in_child(void) {
  pthread_mutex_init(&pool.lock, NULL);
  pool.started = 0;
  pool.sleepers = 0;
  pool.caller_asleep = 0;
  pool.busy = 0;
  pool.stop = 0;
}

static int cvmc_count_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

__attribute__((constructor)) static void cvmc_start_pool(void) {
  pool.cpus = cvmc_count_cpus();
  pthread_atfork(NULL, NULL, cvmc_after_fork_in_child);
}

__attribute__((destructor)) static void cvmc_unload_backend(void) {
  cvmc_stop_workers();
  while (cvmc_arenas) {
    cvmc_arena* a = cvmc_arenas;
    cvmc_arenas = a->next;
    free(a->base);
    free(a);
  }
}

int cvmc_pool_stats(char* text, size_t size) {
  uint64_t tasks = 0, workspaces = 0, mallocs = 0, deferred = 0;
  pthread_mutex_lock(&pool.lock);
  for (cvmc_arena* a = cvmc_arenas; a; a = a->next) {
    tasks += a->tasks;
    workspaces += a->workspaces;
    mallocs += a->mallocs;
    deferred += a->deferred_frees;
  }
  pthread_mutex_unlock(&pool.lock);
  return snprintf(text, size,
      "{\"launches\": %llu, \"inline\": %llu, \"tasks\": %llu, \"workspaces\": %llu, "
      "\"mallocs\": %llu, \"deferred_frees\": %llu, \"sleeps\": %llu, \"workers\": %d, "
      "\"threads\": %d, \"cpus\": %d}",
      (unsigned long long)cvmc_stat_launches, (unsigned long long)cvmc_stat_inline,
      (unsigned long long)tasks, (unsigned long long)workspaces,
      (unsigned long long)mallocs, (unsigned long long)deferred,
      (unsigned long long)cvmc_stat_sleeps, pool.started, cvmc_get_num_threads(),
      pool.cpus);
}
