/* Host emulation stand-in for <cufft.h>: see tests/emu/emulate.py. */
#include "emu_cuda.h"
