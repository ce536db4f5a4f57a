/* Host emulation of the CUDA runtime, cuBLAS and cuFFT subset that the gpu/ sources
 * use, for verification where no GPU is (tests/emu/emulate.py rewrites the
 * kernel launches into emu_launch calls; tests/emu/emu_rt.cc implements the
 * rest). What it models, and why each part is there:
 *  - Streams are queues: every async call (copy, memset, launch, cuBLAS,
 *    cuFFT) runs only when its stream is synchronised (stream or event
 *    sync, stream destroy, cudaFree), in order. A host read before the
 *    sync, or a host buffer rewritten before its async copy ran, shows up
 *    as a wrong result, as it could on a GPU (pinned memory).
 *  - Launches check the limits of an sm_80/sm_90 device (block <= 1024
 *    threads, y/z grid <= 65535) and report them through cudaGetLastError.
 *    Arguments are evaluated and copied at the launch, as CUDA does; a
 *    pointer argument into pageable host memory aborts (it would fault).
 *  - Blocks run one after another (in reverse with EMU_REVERSE=1, threads
 *    too, so that a race within a phase shows in one of the two orders).
 *    A kernel without barriers runs its threads one after another; one
 *    that reaches __syncthreads or a warp shuffle (emulate.py decides
 *    statically, the runtime checks) runs each thread of a block as a
 *    fiber, switched at every barrier: shared memory (static storage, one
 *    block at a time) sees the phases CUDA guarantees. A barrier that some
 *    thread of the block (or lane of the warp, for a shuffle) exits
 *    without reaching aborts: that is undefined behaviour on a GPU.
 *  - Atomics are plain read-modify-writes (no other thread runs meanwhile).
 *  - Device memory is malloc'd (ASan sees overruns), filled with 0xff
 *    (NaN as float) so unwritten reads show; every copy, memset and
 *    cuBLAS operand is checked to lie inside a device allocation (or
 *    outside one, for the host side). cuBLAS is CBLAS with cuBLAS's
 *    argument checks and beta = 0 semantics; cuFFT is FFTW.
 * Not modelled: concurrency between streams or threads (races, atomics
 * racing), warp divergence beyond shuffles, uninitialised shared memory
 * (static storage starts at zero and keeps the last block's values), the
 * device's float rounding (FMA contraction, fast-math intrinsics), speed. */
#pragma once
#include <cblas.h>
#include <fftw3.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

struct float2 { float x, y; };
struct double2 { double x, y; };
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3_ { unsigned x, y, z; };
extern uint3_ blockIdx, threadIdx;
extern dim3 blockDim, gridDim;
#define warpSize 32
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)

/* ---- runtime ---------------------------------------------------------------- */
typedef int cudaError_t;
enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidResourceHandle = 400,
};
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2 };
struct cudaPointerAttributes { cudaMemoryType type; int device; void *devicePointer, *hostPointer; };
struct cudaDeviceProp { char name[256]; int major, minor; size_t totalGlobalMem; int multiProcessorCount; };
#define cudaStreamNonBlocking 1
#define cudaHostAllocDefault 0
#define cudaHostAllocPortable 1
#define cudaEventDisableTiming 2

const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t n);
template <typename T> inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p);
cudaError_t cudaMemGetInfo(size_t *f, size_t *t);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st = 0);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t w, size_t h,
                              cudaMemcpyKind k, cudaStream_t st = 0);
cudaError_t cudaMemset(void *d, int v, size_t n);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st = 0);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventDestroy(cudaEvent_t e);

/* ---- kernels ---------------------------------------------------------------- */
struct emu_cfg { dim3 g, b; size_t shmem; cudaStream_t st; };
inline emu_cfg emu_cfg_of(dim3 g, dim3 b, size_t shmem = 0, cudaStream_t st = 0) { return {g, b, shmem, st}; }
/* Checks the launch configuration; false (and the error kept for
 * cudaGetLastError) when a GPU would refuse it. */
bool emu_launch_ok(const emu_cfg &c, const char *name);
void emu_enqueue(cudaStream_t s, std::function<void()> op);
/* Runs every block; fn is one thread's body (threadIdx already set). */
void emu_run(const emu_cfg &c, const char *name, int barriers, const std::function<void()> &fn);
extern long emu_launches;

/* kernel<<<c>>>(a...) becomes emu_launch(c, ..., kernel, emu_args_t<decltype(kernel)>(a...)):
 * the arguments are converted to the parameter types (a NULL argument
 * included) and copied at the launch; the kernel runs when its stream is
 * synchronised. */
template <typename F> struct emu_args;
template <typename... P> struct emu_args<void(P...)> { using type = std::tuple<std::decay_t<P>...>; };
template <typename F> using emu_args_t = typename emu_args<F>::type;
/* A pointer argument a kernel could dereference: NULL, device or pinned
 * host memory (a pageable host pointer faults on a GPU); false, with a
 * message, otherwise. Pointers inside struct arguments are not seen. */
bool emu_arg_ok(const char *name, size_t i, const void *p);
template <typename T> inline bool emu_arg_check(const char *name, size_t i, const T &a) {
  if constexpr (std::is_pointer_v<T>)
    return emu_arg_ok(name, i, (const void *)a);
  return true;
}
template <typename... P>
void emu_launch(emu_cfg c, const char *name, int barriers, void (*k)(P...), std::tuple<std::decay_t<P>...> args) {
  if (!emu_launch_ok(c, name))
    return;
  bool ok = true;
  size_t i = 0;
  std::apply([&](const auto &...a) { ((ok &= emu_arg_check(name, i++, a)), ...); }, args);
  if (!ok)
    abort();
  emu_enqueue(c.st, [c, name, barriers, k, args]() { emu_run(c, name, barriers, [&]() { std::apply(k, args); }); });
}

/* CUDA's integer and float min / max (mixed types as the usual conversions). */
template <typename A, typename B> inline std::common_type_t<A, B> min(A a, B b) {
  return b < a ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}
template <typename A, typename B> inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}

void __syncthreads();
/* v of lane + delta in this warp (own v past the warp's end), as a 64-bit
 * pattern: every lane of the warp must take part. */
uint64_t emu_shfl_down(uint64_t v, unsigned delta);
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned delta) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 64 bits");
  uint64_t b = 0;
  memcpy(&b, &v, sizeof v);
  b = emu_shfl_down(b, delta);
  memcpy(&v, &b, sizeof v);
  return v;
}
/* v of lane ^ mask in this warp (own v past the block's end), as above. */
uint64_t emu_shfl_xor(uint64_t v, unsigned mask);
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 64 bits");
  uint64_t b = 0;
  memcpy(&b, &v, sizeof v);
  b = emu_shfl_xor(b, (unsigned)mask);
  memcpy(&v, &b, sizeof v);
  return v;
}
/* Fast-math intrinsics as libm: the device's SFU rounding is not modelled
 * (a cross-check's tolerance must cover it, docs/fit.md). */
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x), *c = cosf(x); }
/* Round-to-nearest intrinsics: host IEEE arithmetic is round to nearest
 * (and the emulation is built without FMA contraction). */
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __double2float_rn(double a) { return (float)a; }
template <typename T> inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicMin(T *p, T v) { T o = *p; *p = v < o ? v : o; return o; }
template <typename T> inline T atomicMax(T *p, T v) { T o = *p; *p = v > o ? v : o; return o; }

/* ---- cuFFT (C2C / Z2Z, 2-D square batches: what dm_cuda plans) ------------- */
typedef int cufftHandle;
typedef enum {
  CUFFT_SUCCESS = 0, CUFFT_INVALID_PLAN, CUFFT_ALLOC_FAILED, CUFFT_INVALID_TYPE, CUFFT_INVALID_VALUE,
  CUFFT_INTERNAL_ERROR, CUFFT_EXEC_FAILED, CUFFT_SETUP_FAILED, CUFFT_INVALID_SIZE, CUFFT_UNALIGNED_DATA,
  CUFFT_INCOMPLETE_PARAMETER_LIST, CUFFT_INVALID_DEVICE, CUFFT_PARSE_ERROR, CUFFT_NO_WORKSPACE,
  CUFFT_NOT_IMPLEMENTED, CUFFT_LICENSE_ERROR, CUFFT_NOT_SUPPORTED, CUFFT_MISSING_DEPENDENCY,
  CUFFT_NVRTC_FAILURE, CUFFT_NVJITLINK_FAILURE, CUFFT_NVSHMEM_FAILURE
} cufftResult;
typedef enum { CUFFT_C2C = 0x29, CUFFT_Z2Z = 0x69 } cufftType;
#define CUFFT_FORWARD -1
#define CUFFT_INVERSE 1
typedef float2 cufftComplex;
typedef double2 cufftDoubleComplex;
extern int emu_plan_count;
cufftResult cufftCreate(cufftHandle *h);
cufftResult cufftDestroy(cufftHandle h);
cufftResult cufftSetAutoAllocation(cufftHandle h, int a);
cufftResult cufftMakePlanMany(cufftHandle h, int rank, int *dims, int *inembed, int istride, int idist,
                              int *onembed, int ostride, int odist, cufftType t, int batch, size_t *ws);
cufftResult cufftSetStream(cufftHandle h, cudaStream_t s);
cufftResult cufftSetWorkArea(cufftHandle h, void *w);
cufftResult cufftExecC2C(cufftHandle h, cufftComplex *i, cufftComplex *o, int dir);
cufftResult cufftExecZ2Z(cufftHandle h, cufftDoubleComplex *i, cufftDoubleComplex *o, int dir);

/* ---- cuBLAS (pointer mode host: scalars are read at the call) --------------- */
typedef enum {
  CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_EXECUTION_FAILED = 13
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_FILL_MODE_LOWER = 0, CUBLAS_FILL_MODE_UPPER = 1 } cublasFillMode_t;
typedef struct emu_blas *cublasHandle_t;
extern int emu_blas_count;
const char *cublasGetStatusName(cublasStatus_t s);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc);
cublasStatus_t cublasDgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const double *alpha, const double *A, int lda, const double *B, int ldb,
                           const double *beta, double *C, int ldc);
cublasStatus_t cublasSsyrk(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t t, int n, int k,
                           const float *alpha, const float *A, int lda, const float *beta, float *C, int ldc);
cublasStatus_t cublasDsyrk(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t t, int n, int k,
                           const double *alpha, const double *A, int lda, const double *beta, double *C, int ldc);
