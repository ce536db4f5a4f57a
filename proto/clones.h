/* Function multiversioning (gcc/clang target_clones: one body compiled per
 * ISA, picked at load time by an ifunc resolver) behind one macro, because
 * ThreadSanitizer cannot run it: the resolvers are instrumented and run
 * during relocation, before the TSan runtime exists, and the process dies
 * at start. A TSan build (make SANITIZER=thread) compiles the portable
 * body alone, which is what a race check needs. */
#ifndef BEAM_CLONES_H
#define BEAM_CLONES_H

#if defined(__SANITIZE_THREAD__)
#define BEAM_TARGET_CLONES(...)
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BEAM_TARGET_CLONES(...)
#endif
#endif
#ifndef BEAM_TARGET_CLONES
#define BEAM_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#endif

#endif
