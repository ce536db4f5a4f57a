/* Host emulation stand-in for <cuda_runtime.h>: see tests/emu/emulate.py. */
#include "emu_cuda.h"
