/* A full check of an LZ4 block that costs a walk over its sequences, not
 * a decompression: what a store-as-received path (record's pass-through)
 * needs to know, that the block will decode, without writing the pixels. */
#ifndef BEAM_PROTO_LZ4_CHECK_H
#define BEAM_PROTO_LZ4_CHECK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the bare LZ4 block src[0..src_len) decodes (LZ4_decompress_safe,
 * no dictionary) to exactly out_len bytes, 0 otherwise. Never reads outside
 * src; stricter than the decoder only where the LZ4 block format forbids
 * what the decoder would tolerate (see lz4_check.c). */
int beam_lz4_block_check(const void *src, size_t src_len, size_t out_len);

#ifdef __cplusplus
}
#endif
#endif
