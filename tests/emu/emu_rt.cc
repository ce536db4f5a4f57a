/* State of the host CUDA emulation (include/emu_cuda.h) and the few
 * beamd GPU entry points the emulated backend needs. Linked ahead of the
 * CPU-only library so these win over gpu/stubs.c. */
#include "emu_cuda.h"
#include <cstdio>
uint3_ blockIdx, threadIdx;
dim3 blockDim, gridDim;
long emu_launches;
size_t emu_live;
emu_plan emu_plans[64];
int emu_plan_count;
extern "C" int beam_gpu_count(char *, size_t) { return 1; }
extern "C" void beam_gpu_describe(char *b, size_t n) { snprintf(b, n, "host emulation (tests/emu)"); }
extern "C" int beam_gpu_mem_info(int, size_t *f, size_t *t) {
  *f = *t = (size_t)64 << 30;
  return 0;
}
const char *beam__cufft_name(int) { return "CUFFT_EMU"; }
/* Leaks of device buffers or plans show here. */
__attribute__((destructor)) static void emu_report(void) {
  fprintf(stderr, "# emu: %ld launches, %zu live buffers, %d live plans\n", emu_launches, emu_live,
          emu_plan_count);
}
