/* Host emulation of the CUDA runtime / cuFFT subset used by gpu/dm_cuda.cu
 * (verification only; blocks run one thread each, sequentially). */
#pragma once
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <functional>
#include <fftw3.h>
struct float2 { float x, y; };
struct double2 { double x, y; };
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint3_ { unsigned x, y, z; };
extern uint3_ blockIdx, threadIdx;
extern dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
inline void __syncthreads() {}
template <typename T> inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
extern long emu_launches;
inline void emu_launch(dim3 g, const std::function<void()> &f) {
  emu_launches++;
  gridDim = g; blockDim = dim3(1, 1, 1); threadIdx = {0, 0, 0};
  for (unsigned y = 0; y < g.y; y++)
    for (unsigned x = 0; x < g.x; x++) { blockIdx = {x, y, 0}; f(); }
}
#define EMU_GRID(g, b, s, st) dim3(g)
typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
#define cudaStreamNonBlocking 1
#define cudaHostAllocDefault 0
#define cudaHostAllocPortable 1
inline const char *cudaGetErrorName(cudaError_t) { return "cudaErrorEmu"; }
inline const char *cudaGetErrorString(cudaError_t) { return "emu"; }
inline cudaError_t cudaGetLastError() { return 0; }
inline cudaError_t cudaSetDevice(int) { return 0; }
inline cudaError_t cudaGetDevice(int *d) { *d = 0; return 0; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, int) { *s = (void *)1; return 0; }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return 0; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 0; }
extern size_t emu_live;
inline cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n); if (!*p) return 2; memset(*p, 0xff, n); emu_live++; return 0; }
template <typename T> inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
inline cudaError_t cudaFree(void *p) { if (p) emu_live--; free(p); return 0; }
inline cudaError_t cudaHostAlloc(void **p, size_t n, int) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) { memmove(d, s, n); return 0; }
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { memset(d, v, n); return 0; }
inline cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = *t = (size_t)64 << 30; return 0; }
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (void *)1; return 0; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return 0; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return 0; }
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 1; return 0; }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return 0; }
/* cuFFT */
typedef int cufftHandle;
typedef int cufftResult;
enum { CUFFT_SUCCESS = 0 };
typedef enum { CUFFT_C2C = 0x29, CUFFT_Z2Z = 0x69 } cufftType;
#define CUFFT_FORWARD -1
#define CUFFT_INVERSE 1
typedef float2 cufftComplex;
typedef double2 cufftDoubleComplex;
struct emu_plan { int used, n, batch, autoalloc; void *work; cufftType type; };
extern emu_plan emu_plans[64];
extern int emu_plan_count;
inline cufftResult cufftCreate(cufftHandle *h) { for (int i = 1; i < 64; i++) if (!emu_plans[i].used) { emu_plans[i] = {1, 0, 0, 1, NULL, CUFFT_C2C}; *h = i; emu_plan_count++; return 0; } return 1; }
inline cufftResult cufftDestroy(cufftHandle h) { if (h <= 0 || !emu_plans[h].used) return 1; emu_plans[h].used = 0; emu_plan_count--; return 0; }
inline cufftResult cufftSetAutoAllocation(cufftHandle h, int a) { emu_plans[h].autoalloc = a; return 0; }
inline cufftResult cufftMakePlanMany(cufftHandle h, int rank, int *dims, int *, int, int, int *, int, int, cufftType t, int batch, size_t *ws) {
  if (rank != 2 || dims[0] != dims[1] || emu_plans[h].autoalloc) return 1;
  emu_plans[h].n = dims[0]; emu_plans[h].batch = batch; emu_plans[h].type = t; *ws = (size_t)batch * 64; return 0; }
inline cufftResult cufftSetStream(cufftHandle, cudaStream_t) { return 0; }
inline cufftResult cufftSetWorkArea(cufftHandle h, void *w) { emu_plans[h].work = w; return 0; }
inline cufftResult cufftExecC2C(cufftHandle h, float2 *i, float2 *o, int dir) {
  emu_plan &p = emu_plans[h];
  if (!p.used || p.type != CUFFT_C2C || !p.work || i != o) return 1;
  int dims[2] = {p.n, p.n};
  fftwf_plan f = fftwf_plan_many_dft(2, dims, p.batch, (fftwf_complex *)i, NULL, 1, p.n * p.n, (fftwf_complex *)o, NULL, 1, p.n * p.n, dir, FFTW_ESTIMATE);
  fftwf_execute(f); fftwf_destroy_plan(f); return 0; }
inline cufftResult cufftExecZ2Z(cufftHandle h, double2 *i, double2 *o, int dir) {
  emu_plan &p = emu_plans[h];
  if (!p.used || p.type != CUFFT_Z2Z || !p.work || i != o) return 1;
  int dims[2] = {p.n, p.n};
  fftw_plan f = fftw_plan_many_dft(2, dims, p.batch, (fftw_complex *)i, NULL, 1, p.n * p.n, (fftw_complex *)o, NULL, 1, p.n * p.n, dir, FFTW_ESTIMATE);
  fftw_execute(f); fftw_destroy_plan(f); return 0; }
/* cuBLAS names used by the macros (never expanded here) */
typedef int cublasStatus_t;
typedef void *cublasHandle_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
inline const char *cublasGetStatusName(int) { return ""; }
inline const char *cublasGetStatusString(int) { return ""; }
