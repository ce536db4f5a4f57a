/* Host emulation stand-in for <cublas_v2.h>: see tests/emu/emulate.py. */
#include "emu_cuda.h"
