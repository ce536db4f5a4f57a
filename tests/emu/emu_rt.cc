/* The host emulation of the CUDA runtime, cuBLAS and cuFFT declared in
 * include/emu_cuda.h (what it models and what not is written there).
 * Single-threaded by design: the cross-check tests drive one stage at a
 * time from one thread. Errors that a GPU would report come back as status
 * codes; misuse a GPU would not report reliably (a copy outside an
 * allocation, a divergent barrier) is printed and aborts or fails the call. */
#include "emu_cuda.h"

#include <cstdarg>

#include <deque>
#include <map>
#include <set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

uint3_ blockIdx, threadIdx;
dim3 blockDim, gridDim;
long emu_launches;
int emu_plan_count, emu_blas_count;
static long fiber_blocks;
static cudaError_t last_error;

[[noreturn]] static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "emu: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

static cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudaError_t fail(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "emu: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return e;
}

/* ---- memory: which ranges are device (or pinned host) allocations ---------------- */

enum { MEM_HOST = 0, MEM_DEV = 1, MEM_PINNED = 2, MEM_BAD = -1 };
struct alloc_t { size_t n; int kind; };
static std::map<uintptr_t, alloc_t> allocs;
static size_t live[3];

/* Kind of [p, p + n): inside one allocation (its kind), outside all (host),
 * or straddling an allocation's end (bad). */
static int mem_kind(const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin())
    return MEM_HOST;
  --it;
  if (a >= it->first + it->second.n)
    return MEM_HOST;
  return a + n <= it->first + it->second.n ? it->second.kind : MEM_BAD;
}

static const char *kind_name(int k) {
  return k == MEM_DEV ? "device" : k == MEM_PINNED ? "pinned host" : k == MEM_HOST ? "host" : "past an allocation's end";
}

/* Fault injection for the CUDA init paths (tests/gpu/test_cuda_alloc_fail.c):
 * the n-th device or pinned allocation from the arm fails, as a full
 * device would answer. */
static long fail_at, n_allocs;
static int fail_hit;
extern "C" void emu_alloc_fail_arm(long n) {
  fail_at = n;
  n_allocs = 0;
  fail_hit = 0;
}
extern "C" int emu_alloc_fail_hit(void) { return fail_hit; }

static cudaError_t alloc(void **p, size_t n, int kind) {
  *p = nullptr;
  if (++n_allocs == fail_at) {
    fail_hit = 1;
    return cudaErrorMemoryAllocation;
  }
  *p = malloc(n ? n : 1);
  if (!*p)
    return cudaErrorMemoryAllocation;
  /* 0xff: NaN as float and double, so a read of memory never written shows. */
  memset(*p, 0xff, n);
  allocs[(uintptr_t)*p] = {n ? n : 1, kind};
  live[kind]++;
  return cudaSuccess;
}

static cudaError_t release(void *p, int kind, const char *what) {
  if (!p)
    return cudaSuccess;
  auto it = allocs.find((uintptr_t)p);
  if (it == allocs.end() || it->second.kind != kind)
    return fail(cudaErrorInvalidDevicePointer, "%s(%p): not a live %s allocation", what, p, kind_name(kind));
  allocs.erase(it);
  live[kind]--;
  free(p);
  return cudaSuccess;
}

/* ---- streams: queues run at synchronisation ---------------------------------------- */

struct emu_stream {
  std::deque<std::function<void()>> q;
  long enq = 0, done = 0;
};
struct emu_event {
  emu_stream *s = nullptr;
  long seq = 0;
};
static emu_stream default_stream;
static std::set<emu_stream *> streams = {&default_stream};
static emu_stream *str(cudaStream_t s) {
  if (s && !streams.count(s))
    die("stream %p used after destroy or never created", (void *)s);
  return s ? s : &default_stream;
}

static bool draining;
static void drain_to(emu_stream *s, long seq) {
  if (draining)
    die("a synchronising call inside a stream operation");
  draining = true;
  while (s->done < seq) {
    std::function<void()> op = std::move(s->q.front());
    s->q.pop_front();
    op();
    s->done++;
  }
  draining = false;
}
static void drain(emu_stream *s) { drain_to(s, s->enq); }
static void drain_all() {
  for (emu_stream *s : streams)
    drain(s);
}

void emu_enqueue(cudaStream_t s, std::function<void()> op) {
  emu_stream *q = str(s);
  q->q.push_back(std::move(op));
  q->enq++;
}

/* ---- runtime API ------------------------------------------------------------------- */

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
  case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  default: return "cudaErrorUnknown";
  }
}
const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated error (see the emu: line above)" : "no error"; }
cudaError_t cudaGetLastError() {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
  if (dev != 0)
    return cudaErrorInvalidValue;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "host emulation (tests/emu)");
  p->major = 9;
  p->totalGlobalMem = (size_t)64 << 30;
  p->multiProcessorCount = 132;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGetDevice(int *dev) { *dev = 0; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { drain_all(); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
  *s = new emu_stream;
  streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s || !streams.count(s))
    return cudaErrorInvalidResourceHandle;
  drain(s); /* the work already queued still completes */
  streams.erase(s);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { drain(str(s)); return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) { return alloc(p, n, MEM_DEV); }
/* cudaFree waits for the device to be idle. */
cudaError_t cudaFree(void *p) { drain_all(); return release(p, MEM_DEV, "cudaFree"); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { return alloc(p, n, MEM_PINNED); }
cudaError_t cudaFreeHost(void *p) { drain_all(); return release(p, MEM_PINNED, "cudaFreeHost"); }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
  int k = mem_kind(p, 1);
  a->type = k == MEM_DEV ? cudaMemoryTypeDevice : k == MEM_PINNED ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
  a->device = 0;
  a->devicePointer = k == MEM_DEV ? (void *)p : nullptr;
  a->hostPointer = k == MEM_DEV ? nullptr : (void *)p;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = *t = (size_t)64 << 30; return cudaSuccess; }

/* Both ends of a copy on the side its kind says, whole. */
static cudaError_t check_copy(const char *what, void *d, size_t dn, const void *s, size_t sn, cudaMemcpyKind k) {
  if (dn == 0 || sn == 0)
    return cudaSuccess;
  bool ddev = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
  bool sdev = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
  int dk = mem_kind(d, dn), sk = mem_kind(s, sn);
  if (!d || !s || dk == MEM_BAD || sk == MEM_BAD || (dk == MEM_DEV) != ddev || (sk == MEM_DEV) != sdev)
    return fail(cudaErrorInvalidValue, "%s kind %d: destination %p (%zu bytes) is %s, source %p (%zu bytes) is %s",
                what, (int)k, d, dn, kind_name(dk), s, sn, kind_name(sk));
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st) {
  cudaError_t e = check_copy("cudaMemcpyAsync", d, n, s, n, k);
  if (e)
    return e;
  emu_enqueue(st, [=]() { memmove(d, s, n); });
  return cudaSuccess;
}
/* Synchronous: on the legacy default stream, which the beamd streams
 * (non-blocking) do not wait for. */
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k) {
  cudaError_t e = cudaMemcpyAsync(d, s, n, k, 0);
  if (!e)
    drain(&default_stream);
  return e;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t w, size_t h,
                              cudaMemcpyKind k, cudaStream_t st) {
  if (w > dpitch || w > spitch)
    return fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync: width %zu above a pitch (%zu, %zu)", w, dpitch, spitch);
  if (h == 0 || w == 0)
    return cudaSuccess;
  cudaError_t e = check_copy("cudaMemcpy2DAsync", d, (h - 1) * dpitch + w, s, (h - 1) * spitch + w, k);
  if (e)
    return e;
  emu_enqueue(st, [=]() {
    for (size_t r = 0; r < h; r++)
      memmove((char *)d + r * dpitch, (const char *)s + r * spitch, w);
  });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
  if (n && mem_kind(d, n) != MEM_DEV)
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync(%p, %zu bytes): %s memory", d, n, kind_name(mem_kind(d, n)));
  emu_enqueue(st, [=]() { memset(d, v, n); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
  cudaError_t e = cudaMemsetAsync(d, v, n, 0);
  if (!e)
    drain(&default_stream);
  return e;
}

static std::set<emu_event *> events;
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new emu_event; events.insert(*e); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!events.count(e))
    return cudaErrorInvalidResourceHandle;
  e->s = str(s);
  e->seq = e->s->enq;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!events.count(e))
    return cudaErrorInvalidResourceHandle;
  if (e->s) {
    if (!streams.count(e->s))
      die("cudaEventSynchronize: the event's stream was destroyed");
    drain_to(e->s, e->seq);
  }
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 1; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!events.erase(e))
    return cudaErrorInvalidResourceHandle;
  delete e;
  return cudaSuccess;
}

/* ---- kernels -------------------------------------------------------------------------- */

bool emu_launch_ok(const emu_cfg &c, const char *name) {
  const dim3 &g = c.g, &b = c.b;
  unsigned long long nt = (unsigned long long)b.x * b.y * b.z;
  if (!g.x || !g.y || !g.z || !nt || nt > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x > 0x7fffffffu ||
      g.y > 65535 || g.z > 65535 || c.shmem > 48 * 1024) {
    last_error = fail(cudaErrorInvalidConfiguration, "launch of %s: grid (%u,%u,%u) block (%u,%u,%u) shmem %zu",
                      name, g.x, g.y, g.z, b.x, b.y, b.z, c.shmem);
    return false;
  }
  str(c.st);
  return true;
}

bool emu_arg_ok(const char *name, size_t i, const void *p) {
  int k = p ? mem_kind(p, 1) : MEM_DEV;
  if (k == MEM_DEV || k == MEM_PINNED)
    return true;
  fail(0, "launch of %s: argument %zu (%p) is %s memory", name, i, p, kind_name(k));
  return false;
}

/* Fibers: one per thread of the block being run (only for kernels with
 * barriers). States: runnable, waiting at __syncthreads, waiting at a warp
 * shuffle, finished. A shuffle-reduced block switches about 25 times per
 * thread, so the switch is a few instructions (callee-saved registers, the
 * stack pointer, MXCSR and the x87 control word: what the SysV ABI keeps
 * across a call) rather than swapcontext's two system calls (measured:
 * the DM cross-check 7.5 min -> see the Makefile note). */
#if !defined(__x86_64__)
#error "tests/emu: the fiber switch is written for x86-64"
#endif
extern "C" void emu_switch(void **save_sp, void *load_sp);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

enum { F_RUN, F_BAR, F_WARP, F_DONE };
struct fiber_t {
  void *sp;
  char *stack;
  int state;
  uint64_t shfl;
  void *fake;
};
static const size_t STACK = 256 << 10;
static std::vector<fiber_t> fib;
static void *sched_sp;
static unsigned cur, nthreads;
static const std::function<void()> *cur_fn;
static const char *cur_name;
static bool in_fibers, in_kernel;
static const void *main_bottom;
static size_t main_size;

/* EMU_REVERSE=1: blocks, and threads between barriers, run in the reverse
 * order. A kernel whose result depends on that order (threads racing on
 * the same word within a phase; float atomics excepted, which only round
 * differently) then fails its cross-check in one of the two runs. */
static const bool reverse = getenv("EMU_REVERSE") && atoi(getenv("EMU_REVERSE"));

static void set_tid(unsigned t) {
  threadIdx = {t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
}

/* ASan must know which stack is current (else it reports the fiber
 * stacks as overflows); no-ops without it. */
static void asan_start(void **fake, const void *bottom, size_t size) {
#if EMU_ASAN
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
static void asan_finish(void *fake, const void **bottom, size_t *size) {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}

[[noreturn]] static void fiber_main() {
  asan_finish(nullptr, &main_bottom, &main_size);
  (*cur_fn)();
  fib[cur].state = F_DONE;
  asan_start(nullptr, main_bottom, main_size); /* this fiber's stack is done */
  void *dead;
  emu_switch(&dead, sched_sp);
  abort(); /* never resumed */
}

/* A fresh fiber's stack, as emu_switch leaves one: its pops restore zeroed
 * registers and the current MXCSR / x87 control word, and its ret enters
 * fiber_main with the stack aligned as after a call. */
static void *fiber_stack(char *stack) {
#if EMU_ASAN
  /* The last block's frames (fiber_main's never returns) left poison. */
  ASAN_UNPOISON_MEMORY_REGION(stack, STACK);
#endif
  uint64_t *top = (uint64_t *)(((uintptr_t)(stack + STACK)) & ~(uintptr_t)15);
  uint64_t *sp = top - 9;
  memset(sp, 0, 9 * sizeof *sp);
  top[-1] = 0;                         /* fiber_main's (never used) return address */
  top[-2] = (uint64_t)(uintptr_t)&fiber_main;
  uint32_t csr;
  uint16_t cw;
  asm volatile("stmxcsr %0; fnstcw %1" : "=m"(csr), "=m"(cw));
  memcpy(sp, &csr, 4);
  memcpy((char *)sp + 4, &cw, 2);
  return sp;
}

static void wait_here(int state) {
  fiber_t &f = fib[cur];
  f.state = state;
  asan_start(&f.fake, main_bottom, main_size);
  emu_switch(&f.sp, sched_sp);
  asan_finish(f.fake, &main_bottom, &main_size);
}

static void run_block_fibers(const std::function<void()> &fn) {
  unsigned nt = nthreads;
  while (fib.size() < nt) {
    fiber_t f = {};
    f.stack = (char *)malloc(STACK);
    if (!f.stack)
      die("out of memory for fiber stacks");
    fib.push_back(f);
  }
  cur_fn = &fn;
  for (unsigned t = 0; t < nt; t++) {
    fiber_t &f = fib[t];
    f.sp = fiber_stack(f.stack);
    f.state = F_RUN;
  }
  in_fibers = true;
  for (;;) {
    /* Run every runnable thread to its next barrier or its end. */
    for (unsigned i = 0; i < nt; i++) {
      unsigned t = reverse ? nt - 1 - i : i;
      if (fib[t].state != F_RUN)
        continue;
      cur = t;
      set_tid(t);
      void *fake = nullptr;
      asan_start(&fake, fib[t].stack, STACK);
      emu_switch(&sched_sp, fib[t].sp);
      asan_finish(fake, nullptr, nullptr);
    }
    unsigned done = 0, bar = 0;
    for (unsigned t = 0; t < nt; t++)
      done += fib[t].state == F_DONE, bar += fib[t].state == F_BAR;
    if (done == nt)
      break;
    /* A warp whose lanes all wait at a shuffle goes on first. */
    bool released = false;
    for (unsigned w = 0; w < nt; w += 32) {
      unsigned e = w + 32 < nt ? w + 32 : nt, at = 0;
      for (unsigned t = w; t < e; t++)
        at += fib[t].state == F_WARP;
      if (at == e - w) {
        for (unsigned t = w; t < e; t++)
          fib[t].state = F_RUN;
        released = true;
      } else if (at) {
        for (unsigned t = w; t < e; t++)
          if (fib[t].state == F_DONE)
            die("kernel %s block (%u,%u): warp shuffle with lane %u of its warp already exited", cur_name,
                blockIdx.x, blockIdx.y, t - w);
      }
    }
    if (released)
      continue;
    if (bar == nt) {
      for (unsigned t = 0; t < nt; t++)
        fib[t].state = F_RUN;
      continue;
    }
    die("kernel %s block (%u,%u,%u): __syncthreads reached by %u of %u threads (%u exited): divergent barrier",
        cur_name, blockIdx.x, blockIdx.y, blockIdx.z, bar, nt, done);
  }
  in_fibers = false;
  fiber_blocks++;
}

void __syncthreads() {
  if (!in_fibers)
    die("kernel %s reached __syncthreads but emulate.py launched it without barriers", cur_name);
  wait_here(F_BAR);
}

uint64_t emu_shfl_down(uint64_t v, unsigned delta) {
  if (!in_fibers)
    die("kernel %s reached a warp shuffle but emulate.py launched it without barriers", cur_name);
  unsigned lane = cur % 32, base = cur - lane, src = lane + delta;
  fib[cur].shfl = v;
  wait_here(F_WARP); /* every lane has published */
  uint64_t r = src < 32 && base + src < nthreads ? fib[base + src].shfl : v;
  wait_here(F_WARP); /* every lane has read before any publishes again */
  return r;
}

uint64_t emu_shfl_xor(uint64_t v, unsigned mask) {
  if (!in_fibers)
    die("kernel %s reached a warp shuffle but emulate.py launched it without barriers", cur_name);
  unsigned lane = cur % 32, base = cur - lane, src = lane ^ (mask & 31);
  fib[cur].shfl = v;
  wait_here(F_WARP);
  uint64_t r = base + src < nthreads ? fib[base + src].shfl : v;
  wait_here(F_WARP);
  return r;
}

void emu_run(const emu_cfg &c, const char *name, int barriers, const std::function<void()> &fn) {
  if (in_kernel)
    die("kernel %s launched from inside a kernel", name);
  in_kernel = true;
  emu_launches++;
  gridDim = c.g;
  blockDim = c.b;
  nthreads = c.b.x * c.b.y * c.b.z;
  cur_name = name;
  size_t nb = (size_t)c.g.x * c.g.y * c.g.z;
  for (size_t i = 0; i < nb; i++) {
    size_t b = reverse ? nb - 1 - i : i;
    blockIdx = {(unsigned)(b % c.g.x), (unsigned)(b / c.g.x % c.g.y), (unsigned)(b / ((size_t)c.g.x * c.g.y))};
    if (barriers) {
      run_block_fibers(fn);
    } else {
      for (unsigned j = 0; j < nthreads; j++) {
        set_tid(reverse ? nthreads - 1 - j : j);
        fn();
      }
    }
  }
  in_kernel = false;
}

/* ---- cuFFT ------------------------------------------------------------------------------ */

struct plan_t {
  int used, n, batch, autoalloc;
  void *work;
  size_t ws;
  cufftType type;
  cudaStream_t st;
};
static plan_t plans[64];
cufftResult cufftCreate(cufftHandle *h) {
  for (int i = 1; i < 64; i++)
    if (!plans[i].used) {
      plans[i] = {1, 0, 0, 1, nullptr, 0, CUFFT_C2C, nullptr};
      *h = i;
      emu_plan_count++;
      return CUFFT_SUCCESS;
    }
  return CUFFT_ALLOC_FAILED;
}
static plan_t *plan(cufftHandle h) { return h > 0 && h < 64 && plans[h].used ? &plans[h] : nullptr; }
cufftResult cufftDestroy(cufftHandle h) {
  if (!plan(h))
    return CUFFT_INVALID_PLAN;
  plans[h].used = 0;
  emu_plan_count--;
  return CUFFT_SUCCESS;
}
cufftResult cufftSetAutoAllocation(cufftHandle h, int a) {
  if (!plan(h))
    return CUFFT_INVALID_PLAN;
  plans[h].autoalloc = a;
  return CUFFT_SUCCESS;
}
cufftResult cufftMakePlanMany(cufftHandle h, int rank, int *dims, int *, int, int, int *, int, int, cufftType t,
                              int batch, size_t *ws) {
  plan_t *p = plan(h);
  if (!p)
    return CUFFT_INVALID_PLAN;
  if (rank != 2 || dims[0] != dims[1] || p->autoalloc)
    return CUFFT_NOT_SUPPORTED; /* what dm_cuda asks for, nothing else */
  p->n = dims[0];
  p->batch = batch;
  p->type = t;
  p->ws = *ws = (size_t)batch * 64;
  return CUFFT_SUCCESS;
}
cufftResult cufftSetStream(cufftHandle h, cudaStream_t s) {
  if (!plan(h))
    return CUFFT_INVALID_PLAN;
  plans[h].st = s;
  return CUFFT_SUCCESS;
}
cufftResult cufftSetWorkArea(cufftHandle h, void *w) {
  if (!plan(h))
    return CUFFT_INVALID_PLAN;
  plans[h].work = w;
  return CUFFT_SUCCESS;
}
template <typename C>
static cufftResult exec(cufftHandle h, C *i, C *o, int dir, cufftType t) {
  plan_t *p = plan(h);
  if (!p || p->type != t || !p->work || i != o)
    return CUFFT_EXEC_FAILED;
  size_t bytes = (size_t)p->n * p->n * p->batch * sizeof(C);
  if (mem_kind(i, bytes) != MEM_DEV || mem_kind(p->work, p->ws) != MEM_DEV) {
    fail(0, "cufftExec: data (%zu bytes) or work area not inside device allocations", bytes);
    return CUFFT_INVALID_VALUE;
  }
  int n = p->n, b = p->batch;
  emu_enqueue(p->st, [=]() {
    int dims[2] = {n, n};
    if constexpr (sizeof(C) == sizeof(float2)) {
      fftwf_plan f = fftwf_plan_many_dft(2, dims, b, (fftwf_complex *)i, nullptr, 1, n * n, (fftwf_complex *)o,
                                         nullptr, 1, n * n, dir, FFTW_ESTIMATE);
      fftwf_execute(f);
      fftwf_destroy_plan(f);
    } else {
      fftw_plan f = fftw_plan_many_dft(2, dims, b, (fftw_complex *)i, nullptr, 1, n * n, (fftw_complex *)o, nullptr,
                                       1, n * n, dir, FFTW_ESTIMATE);
      fftw_execute(f);
      fftw_destroy_plan(f);
    }
  });
  return CUFFT_SUCCESS;
}
cufftResult cufftExecC2C(cufftHandle h, cufftComplex *i, cufftComplex *o, int dir) {
  return exec(h, i, o, dir, CUFFT_C2C);
}
cufftResult cufftExecZ2Z(cufftHandle h, cufftDoubleComplex *i, cufftDoubleComplex *o, int dir) {
  return exec(h, i, o, dir, CUFFT_Z2Z);
}

/* ---- cuBLAS ------------------------------------------------------------------------------ */

struct emu_blas {
  cudaStream_t st = nullptr;
};
static std::set<emu_blas *> handles;
const char *cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  default: return "CUBLAS_STATUS_EXECUTION_FAILED";
  }
}
const char *cublasGetStatusString(cublasStatus_t s) { return s ? "emulated error (see the emu: line above)" : "success"; }
cublasStatus_t cublasCreate(cublasHandle_t *h) {
  *h = new emu_blas;
  handles.insert(*h);
  emu_blas_count++;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  if (!handles.erase(h))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  emu_blas_count--;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!handles.count(h))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  h->st = s;
  return CUBLAS_STATUS_SUCCESS;
}

/* A column-major rows x cols operand with leading dimension ld lies in one
 * device allocation (rows, cols > 0). */
template <typename T> static bool dev_matrix(const char *fn, const char *nm, const T *p, int rows, int cols, int ld) {
  size_t n = ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * sizeof(T);
  if (mem_kind(p, n) == MEM_DEV)
    return true;
  fail(0, "%s: %s (%p, %dx%d, ld %d: %zu bytes) is %s memory", fn, nm, (const void *)p, rows, cols, ld, n,
       kind_name(mem_kind(p, n)));
  return false;
}

static CBLAS_TRANSPOSE cb(cublasOperation_t t) { return t == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }
static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float al, const float *A, int lda,
                 const float *B, int ldb, float be, float *C, int ldc) {
  cblas_sgemm(CblasColMajor, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
}
static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double al, const double *A, int lda,
                 const double *B, int ldb, double be, double *C, int ldc) {
  cblas_dgemm(CblasColMajor, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
}
static void syrk(CBLAS_UPLO u, CBLAS_TRANSPOSE t, int n, int k, float al, const float *A, int lda, float be, float *C,
                 int ldc) {
  cblas_ssyrk(CblasColMajor, u, t, n, k, al, A, lda, be, C, ldc);
}
static void syrk(CBLAS_UPLO u, CBLAS_TRANSPOSE t, int n, int k, double al, const double *A, int lda, double be,
                 double *C, int ldc) {
  cblas_dsyrk(CblasColMajor, u, t, n, k, al, A, lda, be, C, ldc);
}

/* C = alpha op(A) op(B) + beta C, C m x n; with beta == 0 C is not read
 * (cuBLAS: "C does not have to be a valid input"), so NaN there must not
 * survive: it is zeroed first. */
template <typename T>
static cublasStatus_t gemm_(const char *fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const T *alpha, const T *A, int lda, const T *B, int ldb, const T *beta,
                            T *C, int ldc) {
  if (!handles.count(h))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
  int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
  if (m < 0 || n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1)) {
    fail(0, "%s: m %d n %d k %d lda %d ldb %d ldc %d: invalid (cuBLAS rejects it)", fn, m, n, k, lda, ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0)
    return CUBLAS_STATUS_SUCCESS;
  T al = *alpha, be = *beta;
  bool use_ab = k > 0 && al != 0;
  if ((use_ab && (!dev_matrix(fn, "A", A, ar, ac, lda) || !dev_matrix(fn, "B", B, br, bc, ldb))) ||
      !dev_matrix(fn, "C", C, m, n, ldc))
    return CUBLAS_STATUS_INVALID_VALUE;
  CBLAS_TRANSPOSE cta = cb(ta), ctb = cb(tb);
  emu_enqueue(h->st, [=]() {
    if (be == 0)
      for (int j = 0; j < n; j++)
        memset(C + (size_t)j * ldc, 0, (size_t)m * sizeof(T));
    if (use_ab)
      gemm(cta, ctb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
    else if (be != 0 && be != 1)
      for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
          C[(size_t)j * ldc + i] *= be;
  });
  return CUBLAS_STATUS_SUCCESS;
}

/* C = alpha op(A) op(A)^T + beta C on the uplo triangle of the n x n C
 * only (the other triangle is neither read nor written). */
template <typename T>
static cublasStatus_t syrk_(const char *fn, cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t t, int n,
                            int k, const T *alpha, const T *A, int lda, const T *beta, T *C, int ldc) {
  if (!handles.count(h))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  int ar = t == CUBLAS_OP_N ? n : k, ac = t == CUBLAS_OP_N ? k : n;
  if (n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) || ldc < (n > 1 ? n : 1) ||
      (uplo != CUBLAS_FILL_MODE_LOWER && uplo != CUBLAS_FILL_MODE_UPPER)) {
    fail(0, "%s: n %d k %d lda %d ldc %d: invalid (cuBLAS rejects it)", fn, n, k, lda, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (n == 0)
    return CUBLAS_STATUS_SUCCESS;
  T al = *alpha, be = *beta;
  bool use_a = k > 0 && al != 0;
  if ((use_a && !dev_matrix(fn, "A", A, ar, ac, lda)) || !dev_matrix(fn, "C", C, n, n, ldc))
    return CUBLAS_STATUS_INVALID_VALUE;
  bool lower = uplo == CUBLAS_FILL_MODE_LOWER;
  CBLAS_TRANSPOSE ct = cb(t);
  emu_enqueue(h->st, [=]() {
    for (int j = 0; j < n; j++)
      for (int i = lower ? j : 0; i < (lower ? n : j + 1); i++) {
        T &c = C[(size_t)j * ldc + i];
        c = be == 0 ? 0 : (use_a ? c : c * be);
      }
    if (use_a)
      syrk(lower ? CblasLower : CblasUpper, ct, n, k, al, A, lda, be == 0 ? 0 : be, C, ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
  return gemm_("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
cublasStatus_t cublasDgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const double *alpha, const double *A, int lda, const double *B, int ldb,
                           const double *beta, double *C, int ldc) {
  return gemm_("cublasDgemm", h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
cublasStatus_t cublasSsyrk(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t t, int n, int k,
                           const float *alpha, const float *A, int lda, const float *beta, float *C, int ldc) {
  return syrk_("cublasSsyrk", h, uplo, t, n, k, alpha, A, lda, beta, C, ldc);
}
cublasStatus_t cublasDsyrk(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t t, int n, int k,
                           const double *alpha, const double *A, int lda, const double *beta, double *C, int ldc) {
  return syrk_("cublasDsyrk", h, uplo, t, n, k, alpha, A, lda, beta, C, ldc);
}

/* Device and pinned buffers, plans, cuBLAS handles and streams alive now
 * (the fault-injection sweep checks a failed init leaves none). */
extern "C" long emu_live_objects(void) {
  return (long)(live[MEM_DEV] + live[MEM_PINNED]) + emu_plan_count + emu_blas_count +
         (long)streams.size() - 1;
}

/* Leaks of device buffers, pinned buffers, plans or handles show here;
 * queued work never run means a missing synchronisation. */
static void emu_report(void) {
  long pending = 0;
  for (emu_stream *s : streams)
    pending += s->enq - s->done;
  fprintf(stderr,
          "# emu: %ld launches (%ld blocks as fibers), %zu live device buffers, %zu live pinned, %d live plans, "
          "%d live cuBLAS handles, %zu live streams, %ld queued ops never run%s\n",
          emu_launches, fiber_blocks, live[MEM_DEV], live[MEM_PINNED], emu_plan_count, emu_blas_count,
          streams.size() - 1, pending, reverse ? " (EMU_REVERSE: blocks and threads in reverse order)" : "");
}
/* Destroyed before the containers above (reverse order of definition). */
static struct reporter_t {
  ~reporter_t() {
    emu_report();
    for (fiber_t &f : fib)
      free(f.stack);
  }
} reporter;
