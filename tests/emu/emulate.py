#!/usr/bin/env python3
"""Rewrites the CUDA sources in gpu/ so a host C++ compiler can build them
against tests/emu/include (the emulated CUDA runtime, cuBLAS and cuFFT; see
tests/emu/include/emu_cuda.h for what is modelled and what is not). Used by
`make CUDA=0 check-gpu-emu`, which runs the CPU-vs-CUDA cross-checks on the
result.

Each launch  kernel<T><<<grid, block, shmem, stream>>>(args);  becomes
    emu_launch(emu_cfg_of(grid, block, shmem, stream), "kernel<T>", B, kernel<T>,
               emu_args_t<decltype(kernel<T>)>(args));
where B says whether the kernel can reach a barrier (__syncthreads or a warp
shuffle, directly or through the __device__ functions it calls): such
kernels run each block's threads as fibers, the others thread after thread.
The runtime aborts if a kernel launched with B = 0 reaches a barrier, so a
wrong guess here cannot pass silently.

    emulate.py SRC_ROOT OUT_ROOT   writes OUT_ROOT/gpu/* for every gpu/*.cu, *.cuh
"""
import glob
import os
import re
import sys

BARRIER = re.compile(r"\b(__syncthreads|__shfl_\w+)\s*\(")
FUNC = re.compile(r"\b(?:__global__|__device__)\b[^;{}()]*?\b([A-Za-z_]\w*)\s*\(")
LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*(<[^<>;()]*>)?\s*<<<(.*?)>>>\s*\((.*?)\)\s*;", re.S)


def body_at(text, i):
    """The brace-matched body of the function whose parameter list opens at
    text[i] == '(' (None for a declaration)."""
    depth, j = 0, i
    while j < len(text):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                break
        j += 1
    k = j + 1
    while k < len(text) and text[k] not in "{;":
        k += 1
    if k >= len(text) or text[k] == ";":
        return None
    depth = 0
    for e in range(k, len(text)):
        if text[e] == "{":
            depth += 1
        elif text[e] == "}":
            depth -= 1
            if depth == 0:
                return text[k:e + 1]
    sys.exit("emulate.py: unbalanced braces after %r" % text[i - 40:i])


def barrier_functions(texts):
    bodies = {}
    for t in texts:
        for m in FUNC.finditer(t):
            b = body_at(t, m.end() - 1)
            if b is not None:
                bodies[m.group(1)] = bodies.get(m.group(1), "") + b
    bar = {f for f, b in bodies.items() if BARRIER.search(b)}
    while True:  # callers of barrier functions reach barriers too
        more = {f for f, b in bodies.items() if f not in bar and any(re.search(r"\b%s\s*[<(]" % g, b) for g in bar)}
        if not more:
            return bar
        bar |= more


def top_level_split(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def main():
    src, out = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(src, "gpu", "*.cu")) + glob.glob(os.path.join(src, "gpu", "*.cuh")))
    texts = {f: open(f).read() for f in files}
    bar = barrier_functions(texts.values())
    os.makedirs(os.path.join(out, "gpu"), exist_ok=True)
    total = 0
    for f, t in texts.items():
        def launch(m):
            name, targs, cfg, args = m.group(1), m.group(2) or "", m.group(3), m.group(4)
            if len(top_level_split(cfg)) > 4:
                sys.exit("emulate.py: %s: launch of %s: more than 4 configuration values" % (f, name))
            args = args.strip()
            # The launch may sit in a macro: keep its line continuations.
            k = name + targs
            return 'emu_launch(emu_cfg_of(%s), "%s", %d, %s, emu_args_t<decltype(%s)>(%s));' % (
                cfg, re.sub(r"\s+", " ", k), name in bar, k, k, args)
        want = t.count("<<<")
        t, n = LAUNCH.subn(launch, t)
        if n != want:
            sys.exit("emulate.py: rewrote %d of %d kernel launches in %s" % (n, want, f))
        total += n
        with open(os.path.join(out, "gpu", os.path.basename(f)), "w") as o:
            o.write(t)
    print("emulate.py: %d kernel launches rewritten in %d files; with barriers: %s"
          % (total, len(files), " ".join(sorted(bar))))


if __name__ == "__main__":
    main()
