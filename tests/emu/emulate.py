#!/usr/bin/env python3
"""Rewrites the DM engine's CUDA backend so a host C++ compiler can build it
against tests/emu/include (a small emulation of the CUDA runtime and cuFFT:
every launch runs its blocks one after another with one thread each, cuFFT
is FFTW). Used by `make CUDA=0 check-gpu-emu`, which runs
tests/gpu/test_dm_xcheck.c on the result: the backend's host logic (buffers,
batches, plans, the reducer's copies, each kernel's arithmetic) is checked
against the CPU engine where no GPU is. Not checked: real atomics racing,
launch limits, cuFFT itself, speed.

    emulate.py SRC_ROOT OUT_ROOT   writes OUT_ROOT/gpu/dm_cuda.cu and dm_kernels.cuh
"""
import os
import re
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(out, "gpu"), exist_ok=True)
    cu = open(os.path.join(src, "gpu", "dm_cuda.cu")).read()
    launches = cu.count(">>>(")
    # kernel<<<grid, block, shmem, stream>>>(args);  ->  emu_launch(grid, lambda)
    cu, n = re.subn(r"([A-Za-z_0-9]+(?:<T>)?)<<<(.*?)>>>\((.*?)\);",
                    lambda m: "emu_launch(EMU_GRID(%s), [&]() { %s(%s); });"
                    % (m.group(2), m.group(1), m.group(3)), cu, flags=re.S)
    if n != launches:
        sys.exit("emulate.py: rewrote %d of %d kernel launches in dm_cuda.cu" % (n, launches))
    k = open(os.path.join(src, "gpu", "dm_kernels.cuh")).read()
    # One thread per block: a block reduction is the thread's own value.
    for fn in ("dm_block_sum", "dm_block_max"):
        head = "__device__ __forceinline__ double %s(double v) {" % fn
        i = k.find(head)
        if i < 0:
            sys.exit("emulate.py: %s not found in dm_kernels.cuh" % fn)
        j = k.index("\n}\n", i)
        k = k[:i] + head + "\n  return v; /* emulation: one thread per block */\n}\n" + k[j + 3:]
    k = k.replace("#include <cuda_runtime.h>",
                  "#include <cuda_runtime.h>\n#include <cmath>\nusing std::fmax;\nusing std::sqrt;")
    open(os.path.join(out, "gpu", "dm_cuda.cu"), "w").write(cu)
    open(os.path.join(out, "gpu", "dm_kernels.cuh"), "w").write(k)
    print("emulate.py: %d kernel launches rewritten" % n)


if __name__ == "__main__":
    main()
