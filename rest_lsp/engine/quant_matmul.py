"""The CPU matmul of a quantized model's step: Q8_0 weights (32 int8 and one fp16 scale a block, llama.cpp's format)
multiplied with the CPU's integer dot products, never widened to 16 or 32 bits in memory.

A step of a quantized model is a pass over every weight for a handful of rows. Kept as Q8_0 a weight is 8.5 bits,
a quarter of fp32's bytes and about half of fp16's, so the pass streams that much less. The arithmetic is
llama.cpp's for Q8_0 x Q8_0:

  - each input row is quantized per block of 32 (d = max|x| / 127, q = x / d rounded to the nearest, ties to
    even), once per call;
  - a block's 32 products are summed exactly in int32 (integer dot products), then the block's term
    float(sum) * (d_w * d_x) is added to the output with one fused multiply-add, block after block in k order.

Each output is that same chain of operations whatever the rows beside it and whatever the instruction set, so a
row's result is bit for bit the same alone or in a tree of 16 (REST = plain decoding in this mode), and the
AVX-512, AVX-VNNI, AVX2 and portable builds agree bit for bit (tests/engine/test_quant_matmul.py).

Layout (`pack`): the weight [N, K] becomes panels of 16 output columns; a panel is its K/32 blocks of quants, each
block 8 groups x 16 columns x 4 consecutive k as bytes q + 128 (one 64-byte vector a group: the unsigned operand
of `vpdpbusd`, whose 16 int32 lanes are the 16 columns), followed by the blocks' fp16 scales [K/32][16], padded to
64 bytes. The weight's +128 comes back out exactly as 128 x (the row block's sum of q), known from the
quantization. A GGUF's Q5_0 and Q4_0 blocks are Q8_0 blocks of small quants (q - 16 in [-16, 15], q - 8 in
[-8, 7]) with the same per-32 fp16 scale, so they keep fewer bits in their panels (`pack_blocks(..., bits)`): a
4-bit block is 4 vectors of nibbles q + 8 (groups 2j in the low nibbles, 2j + 1 in the high ones), a 5-bit block
the nibbles of q + 16 the same way and then one 64-bit mask a group holding the fifth bits. The kernel unpacks a
block to the bytes q + offset and runs the 8-bit arithmetic on them, the offset (16, 8) taken out as 128 is: the
integer sums, and so every float operation after them, are those of the same values as 8-bit blocks, bit for
bit. Paths, by what the compiler targets (`-march`): AVX-512 VNNI (zmm, up to 12 rows a tile with the
block's weights in registers), AVX-VNNI (ymm), AVX2 (`vpmaddubsw` over |w| and x signed as w, no saturation
since |x| <= 127), portable C. The panels are split between torch's OpenMP threads as in panel_matmul.py.

A prefill's many rows run on AMX-INT8 tiles where the CPU has them (compiled for a target with AMX-INT8, the tile
state granted to the process by Linux; from `amx_rows()` rows a call): a panel's blocks unpacked once to their
signed quants (a block is one B tile, 8 x 64 bytes), then per 16 rows and block one TDPBSSD of the rows' 32 quants
(an A tile) makes the block's exact int32 sums, the very integers the VNNI tiles make, and each row then takes the
VNNI tiles' float operations on them in their order. Same integers, same float operations: the same results bit
for bit, whichever tiles a row ran on and whatever rows were beside it (`without_amx` turns them off to compare).

Built, kept and loaded by panel_matmul's one path (`panel_matmul.build_and_load`: its compiler, a cache folder of
this user's alone, a key over every flag, -march and OpenMP's included, the sha256 recorded at build time checked
before the library is loaded), then checked against a reference product before use; where it cannot be built or
the cache folder is not this user's alone, `available()` is False.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from pathlib import Path

import torch

from rest_lsp.engine import panel_matmul  # its compiler, cache folder and build-and-load path; the op namespace
from rest_lsp.engine.panel_matmul import UntrustedCache, _compiler, build_and_load, kernel_folder

log = logging.getLogger(__name__)

PANEL = 16  # output columns per panel
BLOCK = 32  # weights per Q8_0 block (one scale)
BITS = (8, 5, 4)  # the widths a panel's blocks are stored in
BLOCK_BYTES = {8: 512, 5: 320, 4: 256}  # a panel's bytes of quants per block, by width
OFFSETS = {8: 128, 5: 16, 4: 8}  # what a quant is stored as plus (an unsigned byte, or 5 and 4 bits)

SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

typedef long long idx;

#define NB 16   /* columns per panel */
#define QK 32   /* weights per block */
#define BQ 512  /* bytes of a block's quants as 8-bit bytes: 8 groups x 16 columns x 4 k */
#ifndef PFD
#define PFD 4096 /* the first tile of a panel prefetches this many bytes ahead in the weight stream */
#endif
#define INLINE static inline __attribute__((always_inline))

/* a block's stored bytes (8: the bytes q + 128; 4: nibbles q + 8, two groups a 64-byte vector; 5: the nibbles of
   q + 16, then one 64-bit mask a group holding the fifth bits) and the offset taken back out */
#define BYTES(bits) ((bits) == 8 ? 512 : (bits) == 5 ? 320 : 256)
#define OFFSET(bits) ((bits) == 8 ? 128 : (bits) == 5 ? 16 : 8)

/* 3: AVX-512 VNNI, 2: AVX-VNNI, 1: AVX2, 0: portable C */
#ifndef QM_PATH
#  if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#    define QM_PATH 3
#  elif defined(__AVXVNNI__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#    define QM_PATH 2
#  elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#    define QM_PATH 1
#  else
#    define QM_PATH 0
#  endif
#endif

#if QM_PATH == 3
#define MT 12
#else
#define MT 4
#endif

/* AMX-INT8 tiles for many rows: compiled where the target has them (Linux, which grants their state per process) */
#if QM_PATH == 3 && defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__linux__)
#define QM_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define QM_AMX 0
#endif
#ifndef AMX_ROWS
/* calls of at least this many rows run on the tiles: one more than a VNNI tile takes. Up to that one VNNI tile
   streams each panel once, and the tiles' unpacking of every block a call does not pay (a Qwen2.5-0.5B step of 8
   rows was slower on the tiles, one of 16 faster) */
#define AMX_ROWS 13
#endif
#ifndef AMX_CHUNK
#define AMX_CHUNK (1024 * 1024) /* at most these bytes of the rows' quants a thread's panels pass over at a time */
#endif
#ifndef AMX_OUT
#define AMX_OUT (1536 * 1024) /* and at most these bytes of their output rows */
#endif

static idx panel_bytes(idx nb, int bits) { return nb * BYTES(bits) + (nb * NB * 2 + 63) / 64 * 64; }

/* the rows quantized per block: xq [m][nb*32], xd [m][nb] (scales), xs [m][nb] (sums of the quants) */
static void quantize_rows(const float *x, idx m, idx k, idx nb, int8_t *xq, float *xd, int32_t *xs) {
    for (idx r = 0; r < m; r++) {
#if QM_PATH == 3
        /* the same operations 16 lanes at a time: max (a > amax ? a : amax, lane by lane, then over the lanes: the
           same maximum), d and 1 / d as below, v * id rounded to the nearest (ties to even, as nearbyintf), the
           int32 summed and cut to int8 as below */
        for (idx b = 0; b < nb; b++) {
            idx j = b * QK, left = k - j;
            __mmask16 m0 = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __mmask16 m1 = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            __m512 v0 = _mm512_maskz_loadu_ps(m0, x + r * k + j), v1 = _mm512_maskz_loadu_ps(m1, x + r * k + j + 16);
            __m512 amax = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps());
            amax = _mm512_max_ps(_mm512_abs_ps(v1), amax);
            float d = _mm512_reduce_max_ps(amax) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
            _mm_storeu_si128((__m128i *)(xq + r * nb * QK + j), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(xq + r * nb * QK + j + 16), _mm512_cvtepi32_epi8(q1));
            xd[r * nb + b] = d;
            xs[r * nb + b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
        continue;
#endif
        for (idx b = 0; b < nb; b++) {
            float v[QK], amax = 0.0f;
            for (int i = 0; i < QK; i++) {
                idx j = b * QK + i;
                v[i] = j < k ? x[r * k + j] : 0.0f;
                float a = fabsf(v[i]);
                amax = a > amax ? a : amax;
            }
            float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            int32_t s = 0;
            for (int i = 0; i < QK; i++) {
                int q = (int)nearbyintf(v[i] * id);
                xq[r * nb * QK + b * QK + i] = (int8_t)q;
                s += q;
            }
            xd[r * nb + b] = d;
            xs[r * nb + b] = s;
        }
    }
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 0) {
        float f = ldexpf((float)man, -24);  /* zero or subnormal: exact */
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* rows [R] of the quantized input times one panel of `bits`-bit blocks; out [R][NB]. A block's weights are first
   unpacked to the unsigned bytes q + OFFSET(bits), then dotted with the rows' quants as 8-bit ones are; the
   offset comes back out as OFFSET x (the row block's sum of quants): the same exact int32 sum for every width */
#if QM_PATH == 3
INLINE void unpack(const uint8_t *wb, int bits, __m512i w[8]) {
    if (bits == 8) {
        for (int g = 0; g < 8; g++) w[g] = _mm512_loadu_si512((const void *)(wb + 64 * g));
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void *)(wb + 64 * j));
        w[2 * j] = _mm512_and_si512(v, low);
        w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if (bits == 5) {
        const __m512i fifth = _mm512_set1_epi8(0x10);
        for (int g = 0; g < 8; g++) {
            uint64_t mask;
            memcpy(&mask, wb + 256 + 8 * g, 8);
            w[g] = _mm512_mask_add_epi8(w[g], (__mmask64)mask, w[g], fifth);
        }
    }
}
#define TILE(R, BITS)                                                                                         \
static void tile##R##_##BITS(const int8_t *xq, const float *xd, const int32_t *xs, idx nb, const uint8_t *p,  \
                             int pf, float *out) {                                                             \
    __m512 acc[R];                                                                                            \
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                                                 \
    const uint16_t *sc = (const uint16_t *)(p + nb * BYTES(BITS));                                            \
    for (idx b = 0; b < nb; b++) {                                                                            \
        const uint8_t *wb = p + b * BYTES(BITS);                                                              \
        if (pf) for (int l = 0; l < BYTES(BITS); l += 64) __builtin_prefetch(wb + PFD + l, 0, 0);             \
        __m512i w[8];                                                                                         \
        unpack(wb, BITS, w);                                                                                  \
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + b * NB)));                     \
        _Pragma("GCC unroll 12")                                                                              \
        for (int r = 0; r < R; r++) {                                                                         \
            const int8_t *xr = xq + (r * nb + b) * QK;                                                        \
            __m512i s = _mm512_set1_epi32(-OFFSET(BITS) * xs[r * nb + b]);                                    \
            for (int g = 0; g < 8; g++) {                                                                     \
                int32_t four;                                                                                 \
                memcpy(&four, xr + 4 * g, 4);                                                                 \
                s = _mm512_dpbusd_epi32(s, w[g], _mm512_set1_epi32(four));                                    \
            }                                                                                                 \
            __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xd[r * nb + b]));                                 \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);                                   \
        }                                                                                                     \
    }                                                                                                         \
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * NB, acc[r]);                                       \
}
#elif QM_PATH == 2 || QM_PATH == 1
/* a 4- or 5-bit block unpacked to its 512 bytes q + OFFSET in `ub` (an 8-bit block is read where it is) */
INLINE const uint8_t *unpack(const uint8_t *wb, int bits, uint8_t *ub) {
    if (bits == 8) return wb;
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int j = 0; j < 4; j++)
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wb + 64 * j + 32 * h));
            _mm256_storeu_si256((__m256i *)(ub + 128 * j + 32 * h), _mm256_and_si256(v, low));
            _mm256_storeu_si256((__m256i *)(ub + 128 * j + 64 + 32 * h),
                                _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
        }
    if (bits == 5) {
        /* 32 mask bits -> 32 bytes: byte i takes mask byte i / 8, keeps bit i % 8, and becomes 0x10 or 0 */
        const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i fifth = _mm256_set1_epi8(0x10);
        for (int g = 0; g < 8; g++)
            for (int h = 0; h < 2; h++) {
                int32_t mask;
                memcpy(&mask, wb + 256 + 8 * g + 4 * h, 4);
                __m256i e = _mm256_shuffle_epi8(_mm256_set1_epi32(mask), pick);
                e = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(e, bit), bit), fifth);
                __m256i *u = (__m256i *)(ub + 64 * g + 32 * h);
                _mm256_storeu_si256(u, _mm256_or_si256(_mm256_loadu_si256(u), e));
            }
    }
    return ub;
}
#if QM_PATH == 2
/* the 4-byte groups of 8 columns (unsigned, q + offset) dotted with the row's 4 bytes; the offset is taken out by
   the start value */
#define DOT(s, w, x) s = _mm256_dpbusd_avx_epi32(s, w, x)
#define START(xs, off) _mm256_set1_epi32(-(off) * (xs))
#else
/* w = byte ^ 0x80 signed (q + offset - 128); |w| (unsigned) times x signed as w: pairs of products in int16
   (|.| <= 2 x 128 x 127, no saturation), summed into int32; the start value takes out offset - 128 */
#define DOT(s, w, x) do {                                                                                     \
        __m256i sw = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));                                       \
        __m256i pr = _mm256_maddubs_epi16(_mm256_abs_epi8(sw), _mm256_sign_epi8(x, sw));                      \
        s = _mm256_add_epi32(s, _mm256_madd_epi16(pr, _mm256_set1_epi16(1)));                                 \
    } while (0)
#define START(xs, off) _mm256_set1_epi32((128 - (off)) * (xs))
#endif
#define TILE(R, BITS)                                                                                         \
static void tile##R##_##BITS(const int8_t *xq, const float *xd, const int32_t *xs, idx nb, const uint8_t *p,  \
                             int pf, float *out) {                                                             \
    __m256 lo[R], hi[R];                                                                                      \
    uint8_t ub[BQ] __attribute__((aligned(32)));                                                              \
    for (int r = 0; r < R; r++) { lo[r] = _mm256_setzero_ps(); hi[r] = _mm256_setzero_ps(); }                 \
    const uint16_t *sc = (const uint16_t *)(p + nb * BYTES(BITS));                                            \
    for (idx b = 0; b < nb; b++) {                                                                            \
        const uint8_t *wb = p + b * BYTES(BITS);                                                              \
        if (pf) for (int l = 0; l < BYTES(BITS); l += 64) __builtin_prefetch(wb + PFD + l, 0, 0);             \
        const uint8_t *u = unpack(wb, BITS, ub);                                                              \
        __m256 dlo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + b * NB)));                        \
        __m256 dhi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + b * NB + 8)));                    \
        for (int r = 0; r < R; r++) {                                                                         \
            const int8_t *xr = xq + (r * nb + b) * QK;                                                        \
            __m256i s0 = START(xs[r * nb + b], OFFSET(BITS)), s1 = s0;                                        \
            for (int g = 0; g < 8; g++) {                                                                     \
                int32_t four;                                                                                 \
                memcpy(&four, xr + 4 * g, 4);                                                                 \
                __m256i xb = _mm256_set1_epi32(four);                                                         \
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(u + 64 * g));                               \
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(u + 64 * g + 32));                          \
                DOT(s0, w0, xb);                                                                              \
                DOT(s1, w1, xb);                                                                              \
            }                                                                                                 \
            __m256 dx = _mm256_set1_ps(xd[r * nb + b]);                                                       \
            lo[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(dlo, dx), lo[r]);                   \
            hi[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(dhi, dx), hi[r]);                   \
        }                                                                                                     \
    }                                                                                                         \
    for (int r = 0; r < R; r++) { _mm256_storeu_ps(out + r * NB, lo[r]); _mm256_storeu_ps(out + r * NB + 8, hi[r]); } \
}
#else
INLINE const uint8_t *unpack(const uint8_t *wb, int bits, uint8_t *ub) {
    if (bits == 8) return wb;
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 64; i++) {
            ub[128 * j + i] = wb[64 * j + i] & 15;
            ub[128 * j + 64 + i] = wb[64 * j + i] >> 4;
        }
    if (bits == 5)
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 64; i++)
                ub[64 * g + i] |= ((wb[256 + 8 * g + i / 8] >> (i % 8)) & 1) << 4;
    return ub;
}
#define TILE(R, BITS)                                                                                         \
static void tile##R##_##BITS(const int8_t *xq, const float *xd, const int32_t *xs, idx nb, const uint8_t *p,  \
                             int pf, float *out) {                                                             \
    (void)xs; (void)pf;                                                                                       \
    float acc[R][NB];                                                                                         \
    uint8_t ub[BQ];                                                                                           \
    memset(acc, 0, sizeof acc);                                                                               \
    const uint16_t *sc = (const uint16_t *)(p + nb * BYTES(BITS));                                            \
    for (idx b = 0; b < nb; b++) {                                                                            \
        const uint8_t *u = unpack(p + b * BYTES(BITS), BITS, ub);                                             \
        for (int r = 0; r < R; r++) {                                                                         \
            const int8_t *xr = xq + (r * nb + b) * QK;                                                        \
            float dx = xd[r * nb + b];                                                                        \
            for (int c = 0; c < NB; c++) {                                                                    \
                int32_t s = 0;                                                                                \
                for (int g = 0; g < 8; g++)                                                                   \
                    for (int j = 0; j < 4; j++)                                                               \
                        s += ((int)u[64 * g + 4 * c + j] - OFFSET(BITS)) * xr[4 * g + j];                     \
                float scale = half_to_float(sc[b * NB + c]) * dx;                                             \
                acc[r][c] = fmaf((float)s, scale, acc[r][c]);                                                 \
            }                                                                                                 \
        }                                                                                                     \
    }                                                                                                         \
    memcpy(out, acc, sizeof acc);                                                                             \
}
#endif

#define TILES(BITS) TILE(1, BITS) TILE(2, BITS) TILE(3, BITS) TILE(4, BITS)
#define MORE_TILES(BITS) TILE(5, BITS) TILE(6, BITS) TILE(7, BITS) TILE(8, BITS) TILE(9, BITS) TILE(10, BITS) \
    TILE(11, BITS) TILE(12, BITS)
TILES(8) TILES(5) TILES(4)
#if MT > 4
MORE_TILES(8) MORE_TILES(5) MORE_TILES(4)
#define ROW(BITS) {0, tile1_##BITS, tile2_##BITS, tile3_##BITS, tile4_##BITS, tile5_##BITS, tile6_##BITS,       \
    tile7_##BITS, tile8_##BITS, tile9_##BITS, tile10_##BITS, tile11_##BITS, tile12_##BITS}
#else
#define ROW(BITS) {0, tile1_##BITS, tile2_##BITS, tile3_##BITS, tile4_##BITS}
#endif

typedef void (*tile_fn)(const int8_t *, const float *, const int32_t *, idx, const uint8_t *, int, float *);
static const tile_fn tiles8[MT + 1] = ROW(8), tiles5[MT + 1] = ROW(5), tiles4[MT + 1] = ROW(4);

static int amx_wanted = 1; /* quant_set_amx */

#if QM_AMX
/* AMX: per panel, its blocks unpacked once to the signed quants q, 8 groups x 16 columns x 4 k a block: a B tile of
   8 rows x 64 bytes. Per 16 rows and block, C [16][16] int32 = A (the rows' 32 quants of the block, 16 rows x 32
   bytes, `amx_layout`) x B by TDPBSSD: each the exact sum of the block's 32 products, the very integer the VNNI
   tiles make (q + offset dotted, the offset taken back out). Then per row the VNNI tiles' float operations in their
   order: cvt, scale = dw x dx, one fused multiply-add, blocks in k order: the same bits. */
static int amx_granted = -1; /* -1: not asked yet; 0: refused; 1: this process may use the tile data */

static int amx_usable(void) {
    int ok = __atomic_load_n(&amx_granted, __ATOMIC_ACQUIRE);
    if (ok < 0) {
        ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
        __atomic_store_n(&amx_granted, ok, __ATOMIC_RELEASE);
    }
    return ok;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* palette 1; tiles 0-3: C, 16 rows x 16 int32 (4 blocks in flight); 4, 6: A, 16 rows x 32 bytes; 5, 7: B, 8 rows x
   64 bytes. Per thread. */
static void amx_start(void) {
    tile_config cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t < 4 || t % 2 == 0 ? 16 : 8;
        cfg.colsb[t] = t < 4 ? 64 : t % 2 == 0 ? QK : 64;
    }
    _tile_loadconfig(&cfg);
}

/* a panel's nb blocks of `bits` as signed quants: sq [nb][512], each block a B tile */
static void amx_unpack(const uint8_t *p, idx nb, int bits, int8_t *sq) {
    const __m512i off = _mm512_set1_epi8((char)OFFSET(bits));
    for (idx b = 0; b < nb; b++) {
        __m512i w[8];
        if (bits == 8) unpack(p + b * BYTES(8), 8, w);
        else if (bits == 5) unpack(p + b * BYTES(5), 5, w);
        else unpack(p + b * BYTES(4), 4, w);
        for (int g = 0; g < 8; g++) _mm512_store_si512((void *)(sq + b * BQ + 64 * g), _mm512_sub_epi8(w[g], off));
    }
}

/* 16 rows' quants xa [nb][16][32] and scales xda [nb][16] (`amx_layout`; only the first R <= 16 rows are the
   call's) times one panel's signed blocks sq with scales sc [nb][16]; out [R][NB]. Block b's sums are made (C tile
   b % 4; A and B tiles 4, 5 or 6, 7) and stored into c [b % 8] around the float steps of block b - 4. */
#define AMX_SUMS(C, A, B, b)                                                                                  \
    if ((b) < nb) {                                                                                           \
        _tile_zero(C);                                                                                        \
        _tile_loadd(A, xa + (b) * BQ, QK);                                                                    \
        _tile_loadd(B, sq + (b) * BQ, 64);                                                                    \
        _tile_dpbssd(C, A, B);                                                                                \
    }
#define AMX_STORE(C, b) if ((b) < nb) _tile_stored(C, c[(b) % 8], NB * 4);
#define AMX_FLOAT(b)                                                                                          \
    if ((b) < nb) {                                                                                           \
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + (b) * NB)));                    \
        _Pragma("GCC unroll 16")                                                                              \
        for (int r = 0; r < R; r++) {                                                                         \
            __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xda[(b) * 16 + r]));                              \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)c[(b) % 8][r])),     \
                                     scale, acc[r]);                                                          \
        }                                                                                                     \
    }
INLINE void amx_rows(const int8_t *xa, const float *xda, idx nb, const int8_t *sq, const uint16_t *sc, int R,
                     float *out) {
    __m512 acc[16];
    int32_t c[8][16][NB] __attribute__((aligned(64)));
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    AMX_SUMS(0, 4, 5, 0) AMX_SUMS(1, 6, 7, 1) AMX_SUMS(2, 4, 5, 2) AMX_SUMS(3, 6, 7, 3)
    AMX_STORE(0, 0) AMX_STORE(1, 1) AMX_STORE(2, 2) AMX_STORE(3, 3)
    for (idx b = 0; b < nb; b += 4) {
        AMX_SUMS(0, 4, 5, b + 4) AMX_FLOAT(b) AMX_STORE(0, b + 4)
        AMX_SUMS(1, 6, 7, b + 5) AMX_FLOAT(b + 1) AMX_STORE(1, b + 5)
        AMX_SUMS(2, 4, 5, b + 6) AMX_FLOAT(b + 2) AMX_STORE(2, b + 6)
        AMX_SUMS(3, 6, 7, b + 7) AMX_FLOAT(b + 3) AMX_STORE(3, b + 7)
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * NB, acc[r]);
}
#undef AMX_SUMS
#undef AMX_STORE
#undef AMX_FLOAT

/* the rows' quants and scales by 16 rows: xa [G][nb][16][32] (an A tile a block), xda [G][nb][16], G = ceil(m / 16),
   the rows past m zeros */
static void amx_layout(const int8_t *xq, const float *xd, idx m, idx nb, int8_t *xa, float *xda) {
    idx G = (m + 15) / 16;
    for (idx g = 0; g < G; g++)
        for (idx b = 0; b < nb; b++)
            for (idx r = 0; r < 16; r++) {
                idx row = g * 16 + r, at = (g * nb + b) * 16 + r;
                if (row < m) {
                    memcpy(xa + at * QK, xq + (row * nb + b) * QK, QK);
                    xda[at] = xd[row * nb + b];
                } else {
                    memset(xa + at * QK, 0, QK);
                    xda[at] = 0.0f;
                }
            }
}
#endif

/* out [r][NB] (+ bias) -> y's rows m0.. at columns c0.. (cols of them) */
static void emit(const float *out, idx r, float *y, idx m0, idx n, idx c0, idx cols, const float *bias) {
    for (idx i = 0; i < r; i++) {
        float *row = y + (m0 + i) * n + c0;
        for (idx c = 0; c < cols; c++) row[c] = bias ? out[i * NB + c] + bias[c0 + c] : out[i * NB + c];
    }
}

/* panels [first, last) for all m rows: on AMX tiles where xa (`amx_layout`) is given, else the tiles of MT rows */
static void panels(const int8_t *xq, const float *xd, const int32_t *xs, idx m, idx nb, const uint8_t *w, idx n,
                   int bits, const float *bias, float *y, idx first, idx last, const int8_t *xa, const float *xda) {
    float out[16 * NB];
    idx stride = panel_bytes(nb, bits);
#if QM_AMX
    int8_t *sq = xa && first < last ? aligned_alloc(64, (size_t)(nb * BQ)) : NULL;
    if (sq) {
        /* the rows in chunks whose quants and outputs stay in the core's cache while the panels pass; each panel
           unpacked once a chunk */
        idx G = (m + 15) / 16, chunk = AMX_CHUNK / (nb * BQ), outs = AMX_OUT / (16 * n * (idx)sizeof(float));
        chunk = outs < chunk ? outs : chunk;
        if (chunk < 1) chunk = 1;
        amx_start();
        for (idx g0 = 0; g0 < G; g0 += chunk) {
            idx g1 = G - g0 < chunk ? G : g0 + chunk;
            for (idx q = first; q < last; q++) {
                const uint8_t *p = w + q * stride;
                idx c0 = q * NB, cols = n - c0 < NB ? n - c0 : NB;
                amx_unpack(p, nb, bits, sq);
                const uint16_t *sc = (const uint16_t *)(p + nb * BYTES(bits));
                for (idx g = g0; g < g1; g++) {
                    idx r = m - g * 16 < 16 ? m - g * 16 : 16;
                    if (r == 16) amx_rows(xa + g * nb * BQ, xda + g * nb * 16, nb, sq, sc, 16, out);
                    else amx_rows(xa + g * nb * BQ, xda + g * nb * 16, nb, sq, sc, (int)r, out);
                    emit(out, r, y, g * 16, n, c0, cols, bias);
                }
            }
        }
        _tile_release();
        free(sq);
        return;
    }
#else
    (void)xa; (void)xda;
#endif
    const tile_fn *tiles = bits == 8 ? tiles8 : bits == 5 ? tiles5 : tiles4;
    for (idx q = first; q < last; q++) {
        const uint8_t *p = w + q * stride;
        idx c0 = q * NB, cols = n - c0 < NB ? n - c0 : NB;
        for (idx m0 = 0; m0 < m; m0 += MT) {
            idx r = m - m0 < MT ? m - m0 : MT;
            tiles[r](xq + m0 * nb * QK, xd + m0 * nb, xs + m0 * nb, nb, p, m0 == 0, out);
            emit(out, r, y, m0, n, c0, cols, bias);
        }
    }
}

/* y [m, n] = x [m, k] quantized per block of 32 times the weight given as panels of `bits`-bit blocks (8, 5 or 4:
   `pack`), + bias (may be NULL); on `threads` threads. 0, or 1 where the rows ran on AMX tiles; -1 when the scratch
   memory could not be had, -2 for another width */
int quant_mm(const float *x, idx m, idx k, const uint8_t *w, idx n, int bits, const float *bias, float *y,
             int threads) {
    if (bits != 8 && bits != 5 && bits != 4) return -2;
    idx nb = (k + QK - 1) / QK, count = (n + NB - 1) / NB;
#if QM_AMX
    int amx = m >= AMX_ROWS && __atomic_load_n(&amx_wanted, __ATOMIC_RELAXED) && amx_usable();
#else
    int amx = 0;
#endif
    idx mp = amx ? (m + 15) / 16 * 16 : 0; /* the AMX tiles read rows in 16s: the rows past m are zeros */
    int8_t *xq = malloc((size_t)(m * nb * QK) + 1), *xa = amx ? aligned_alloc(64, (size_t)(mp * nb * QK)) : NULL;
    float *xda = amx ? malloc(sizeof(float) * (size_t)(mp * nb)) : NULL;
    float *xd = malloc(sizeof(float) * (size_t)(m * nb) + 1);
    int32_t *xs = malloc(sizeof(int32_t) * (size_t)(m * nb) + 1);
    if (!xq || !xd || !xs || (amx && (!xa || !xda))) { free(xq); free(xd); free(xs); free(xa); free(xda); return -1; }
    quantize_rows(x, m, k, nb, xq, xd, xs);
#if QM_AMX
    if (amx) amx_layout(xq, xd, m, nb, xa, xda);
#endif
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads) if (threads > 1 && count > 1 && m * k * n >= 65536)
    {
        idx t = omp_get_thread_num(), T = omp_get_num_threads();
        panels(xq, xd, xs, m, nb, w, n, bits, bias, y, count * t / T, count * (t + 1) / T, xa, xda);
    }
#else
    (void)threads;
    panels(xq, xd, xs, m, nb, w, n, bits, bias, y, 0, count, xa, xda);
#endif
    free(xq); free(xd); free(xs); free(xa); free(xda);
    return amx;
}

/* the rows' quantization alone (for the tests' reference) */
void quant_rows(const float *x, idx m, idx k, int8_t *xq, float *xd, int32_t *xs) {
    quantize_rows(x, m, k, (k + QK - 1) / QK, xq, xd, xs);
}

int quant_path(void) { return QM_PATH; }

/* 1 where the AMX tiles are compiled in and this process may use them (asked of the kernel once) */
int quant_amx(void) {
#if QM_AMX
    return amx_usable();
#else
    return 0;
#endif
}

/* calls of at least quant_amx_rows() rows run on the AMX tiles while on (the default) and quant_amx(); the bits
   are the same either way. Returns the setting before. */
int quant_set_amx(int on) { return __atomic_exchange_n(&amx_wanted, on != 0, __ATOMIC_RELAXED); }

int quant_amx_rows(void) { return AMX_ROWS; }

int quant_threaded(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
"""

PATHS = {3: "AVX-512 VNNI", 2: "AVX-VNNI", 1: "AVX2", 0: "portable C"}
AMX = "AMX-INT8"  # what path_name adds where the library's many-row calls run on AMX tiles
# -ffp-contract=off: every multiply and add rounds where the source says (the fused ones are written as such)
FLAGS = ("-O3", "-ffp-contract=off", "-shared", "-fPIC")
NATIVE = "-march=native"
OPENMP = panel_matmul.OPENMP  # tried first; the key covers it, so a library built without it is another library
LIBS = ("-lm",)

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL | None] = {}  # march -> the library once tried (None: not built, or it failed)


def variants(march: str) -> tuple[tuple[str, ...], ...]:
    """The flags the library for `march` is built with, in the order tried: OpenMP, then one thread."""
    return (FLAGS + (march,) + OPENMP, FLAGS + (march,))


def _build(cc: str, folder: Path, march: str) -> ctypes.CDLL:
    """The library for `march`, loaded through panel_matmul's one hardened path (`build_and_load`); OSError when
    it cannot be built, UntrustedCache when the folder is not this user's alone."""
    return build_and_load(cc, folder, "quant_matmul", SOURCE, variants(march), LIBS)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    lib.quant_mm.argtypes = [vp, ll, ll, vp, ll, ctypes.c_int, vp, vp, ctypes.c_int]
    lib.quant_mm.restype = ctypes.c_int
    lib.quant_rows.argtypes = [vp, ll, ll, vp, vp, vp]
    lib.quant_rows.restype = None
    lib.quant_path.restype = ctypes.c_int
    lib.quant_threaded.restype = ctypes.c_int
    lib.quant_amx.restype = ctypes.c_int
    lib.quant_set_amx.argtypes = [ctypes.c_int]
    lib.quant_set_amx.restype = ctypes.c_int
    lib.quant_amx_rows.restype = ctypes.c_int
    return lib


def _checked(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` once it computes a small product with partial panels, blocks and tiles as the reference does, at
    every width (ValueError if not): a compiler that miscompiles it must not reach a step. Where it has AMX tiles,
    a product of enough rows for them (full and partial 16-row tiles) too, and bit for bit as without them."""
    gen = torch.Generator().manual_seed(0)
    rows = 13 if not lib.quant_amx() else lib.quant_amx_rows() + 37  # 16-row tiles: full ones and a partial one
    weight, bias, x = (torch.randn(*shape, generator=gen) for shape in ((50, 200), (50,), (rows, 200)))

    def product(bits: int, panels: torch.Tensor, m: int, amx: bool) -> torch.Tensor:
        got = torch.empty(m, 50)
        before = lib.quant_set_amx(int(amx))
        try:
            ran = lib.quant_mm(x.data_ptr(), m, 200, panels.data_ptr(), 50, bits, bias.data_ptr(), got.data_ptr(), 1)
        finally:
            lib.quant_set_amx(before)
        if ran < 0:
            raise ValueError("it could not allocate its scratch memory")
        if ran != amx:
            raise ValueError(f"its {m} rows ran {'without' if amx else 'on'} AMX tiles")
        return got

    for bits in BITS:
        q, d = quantize_q8_0(weight)
        if bits != 8:
            q = q.clamp(-OFFSETS[bits], OFFSETS[bits] - 1)
        panels, want = pack_blocks(q, d, bits), reference_blocks(x, q, d, bias)
        got = product(bits, panels, 13, False)
        if not torch.allclose(got, want[:13], rtol=1e-5, atol=1e-4):
            raise ValueError(f"its results differ from the reference's ({bits}-bit blocks)")
        if lib.quant_amx():
            tiles = product(bits, panels, rows, True)
            if not torch.allclose(tiles, want, rtol=1e-5, atol=1e-4):
                raise ValueError(f"its AMX results differ from the reference's ({bits}-bit blocks)")
            if not torch.equal(tiles, product(bits, panels, rows, False)):
                raise ValueError(f"its AMX results are not its VNNI results bit for bit ({bits}-bit blocks)")
    if not lib.quant_threaded():
        log.warning("The quantized kernel was built without OpenMP: its matmuls run on one thread.")
    return lib


def library(march: str = NATIVE, folder: Path | None = None) -> ctypes.CDLL | None:
    """The compiled kernel for `march` (the machine's own by default; another, e.g. -march=haswell, builds a
    fallback path for the tests), built and checked on first use; None where it cannot be (said once)."""
    if march in _libraries:
        return _libraries[march]
    with _lock:
        if march in _libraries:
            return _libraries[march]
        lib = None
        cc = _compiler()
        if cc is None:
            log.info("No C compiler here (CC, cc, gcc): the quantized mode cannot run.")
        else:
            try:
                lib = _checked(_bind(_build(cc, folder or kernel_folder(), march)))
            except UntrustedCache as err:
                log.warning("The kernel cache folder is not this user's alone (%s): the quantized mode cannot run.",
                            err)
            except Exception as err:  # noqa: BLE001 - whatever went wrong, the other modes still run
                log.warning("The quantized kernel could not be built with %s %s (%s): the quantized mode cannot run.",
                            cc, march, err)
                lib = None
        _libraries[march] = lib
        return lib


def available() -> bool:
    return library() is not None


def path_name(lib: ctypes.CDLL | None = None) -> str:
    """The instruction set a library's dot products run on ("AVX-512 VNNI", "AVX-VNNI", "AVX2", "portable C"),
    with " + AMX-INT8" where its calls of many rows run on AMX tiles (`amx_available`)."""
    lib = lib or library()
    if lib is None:
        return "none"
    return PATHS[lib.quant_path()] + (f" + {AMX}" if lib.quant_amx() else "")


def amx_available(lib: ctypes.CDLL | None = None) -> bool:
    """Whether `lib` (the machine's own by default) has AMX-INT8 tiles compiled in and this process may use them:
    then its calls of `amx_rows(lib)` rows or more run on them, with the same results bit for bit."""
    lib = lib or library()
    return lib is not None and bool(lib.quant_amx())


def amx_rows(lib: ctypes.CDLL | None = None) -> int:
    """The fewest rows a call runs on AMX tiles where it can."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the quantized kernel is not available on this machine")
    return lib.quant_amx_rows()


@contextlib.contextmanager
def without_amx(lib: ctypes.CDLL | None = None):
    """Within it, `lib`'s calls (from any thread: the setting is the library's) run on the VNNI tiles alone: the
    tests compare the two."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the quantized kernel is not available on this machine")
    before = lib.quant_set_amx(0)
    try:
        yield lib
    finally:
        lib.quant_set_amx(before)


# -- Q8_0 blocks ---------------------------------------------------------------------------------------------------

def quantize_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (quants int8 [N, K/32, 32], scales fp16 [N, K/32]) as llama.cpp's quantize_row_q8_0 makes
    them (d = max|w| / 127; q = w / d rounded half away from zero), K padded with zeros to a multiple of 32.
    Weights that were Q8_0 blocks (dequantized: q x d) come back as those blocks exactly."""
    w = weight.detach().float()
    n, k = w.shape
    nb = -(-k // BLOCK)
    if nb * BLOCK != k:
        w = torch.nn.functional.pad(w, (0, nb * BLOCK - k))
    w = w.reshape(n, nb, BLOCK)
    d = w.abs().amax(-1) / 127.0  # [N, nb]
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    v = w * inv[..., None]
    q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).to(torch.int8)
    return q, d.half()


def from_gguf_q8_0(raw: torch.Tensor | "object", k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF Q8_0 tensor's raw bytes [N, K/32 * 34] (gguf.GGUFReader's `data`: per block an fp16 scale, then 32
    int8) -> (quants int8 [N, K/32, 32], scales fp16 [N, K/32])."""
    raw = torch.as_tensor(raw).view(torch.uint8)
    n = raw.shape[0]
    blocks = raw.reshape(n, k // BLOCK, 2 + BLOCK)
    return blocks[..., 2:].contiguous().view(torch.int8), blocks[..., :2].contiguous().view(torch.float16)[..., 0]


def panel_bytes(k: int, bits: int = 8) -> int:
    nb = -(-k // BLOCK)
    return nb * BLOCK_BYTES[bits] + -(-nb * PANEL * 2 // 64) * 64


def pack_blocks(quants: torch.Tensor, scales: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Blocks (int8 [N, nb, 32], fp16 [N, nb]; w = q x d) -> panels uint8 [ceil(N / 16), panel_bytes(K, bits)] (see
    the module's docstring), the columns past N zero. 5 and 4 bits hold quants in [-16, 15] and [-8, 7] (a Q5_0
    or Q4_0 block's q - 16 or q - 8): ValueError for one outside."""
    if bits not in BITS:
        raise ValueError(f"no {bits}-bit panels: use one of {BITS}")
    n, nb, _ = quants.shape
    off = OFFSETS[bits]
    if bits != 8 and n and (int(quants.min()) < -off or int(quants.max()) >= off):
        raise ValueError(f"{bits}-bit panels hold quants in [{-off}, {off - 1}]")
    count = -(-n // PANEL)
    q = torch.zeros(count * PANEL, nb, BLOCK, dtype=torch.int8)
    q[:n] = quants
    d = torch.zeros(count * PANEL, nb, dtype=torch.float16)
    d[:n] = scales
    # [P, 16 cols, nb, 8 groups, 4] -> [P, nb, 8, 16 x 4]: the bytes q + offset, as the kernel unpacks them
    u = (q.view(count, PANEL, nb, 8, 4).permute(0, 2, 3, 1, 4).reshape(count, nb, 8, 64).short() + off).to(torch.uint8)
    if bits == 8:
        body = u.reshape(count, nb * 512)
    else:
        low = u & 15
        nibbles = low[:, :, 0::2] | (low[:, :, 1::2] << 4)  # [P, nb, 4, 64]: groups 2j low, 2j + 1 high
        parts = [nibbles.reshape(count, nb, 256)]
        if bits == 5:  # bit i of group g's mask (a little-endian uint64) is byte i's fifth bit
            fifth = ((u >> 4) & 1).view(count, nb, 8, 8, 8).long()
            masks = (fifth << torch.arange(8)).sum(-1).to(torch.uint8)  # [P, nb, 8 groups, 8 bytes]
            parts.append(masks.reshape(count, nb, 64))
        body = torch.cat(parts, -1).reshape(count, nb * BLOCK_BYTES[bits])
    tail = d.view(count, PANEL, nb).transpose(1, 2).reshape(count, nb * PANEL).view(torch.uint8)  # [P, nb 16 2]
    out = torch.zeros(count, panel_bytes(nb * BLOCK, bits), dtype=torch.uint8)
    out[:, : body.shape[1]] = body
    out[:, body.shape[1] : body.shape[1] + tail.shape[1]] = tail
    return out


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (float) -> Q8_0 panels (`quantize_q8_0`, `pack_blocks`)."""
    return pack_blocks(*quantize_q8_0(weight))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's quantization of input rows x [m, K] in torch: (quants int8 [m, nb, 32], scales fp32 [m, nb]),
    d = max|x| / 127, x / d ... as x * (1 / d) rounded half to even."""
    x = x.float()
    m, k = x.shape
    nb = -(-k // BLOCK)
    x = torch.nn.functional.pad(x, (0, nb * BLOCK - k)).reshape(m, nb, BLOCK)
    d = x.abs().amax(-1) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return torch.round(x * inv[..., None]).to(torch.int8), d


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernel computes, in float64 after the exact integer sums: sum over blocks of
    sum(qw qx) * float32(d_w d_x), + bias (the kernel adds the terms in fp32, one fused multiply-add each)."""
    return reference_blocks(x, *quantize_q8_0(weight), bias)


def reference_blocks(x: torch.Tensor, qw: torch.Tensor, dw: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """`reference` for a weight given as blocks (int8 [N, nb, 32], fp16 [N, nb])."""
    qx, dx = quantize_rows(x)
    sums = torch.einsum("nbi,mbi->mnb", qw.long(), qx.long())  # [m, N, nb] exact
    scale = dw.float()[None] * dx[:, None]  # fp32 products, as the kernel's
    out = (sums.double() * scale.double()).sum(-1)
    if bias is not None:
        out = out + bias.double()
    return out.float()


def quant_mm(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None,
             lib: ctypes.CDLL | None = None, bits: int = 8) -> torch.Tensor:
    """x [m, K] (fp32) times the weight in `panels` of `bits`-bit blocks (`pack`, `pack_blocks`) + bias -> [m, n]."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the quantized kernel is not available on this machine")
    x = x.contiguous()
    m, k = x.shape
    if (x.dtype != torch.float32 or panels.dtype != torch.uint8 or panels.dim() != 2 or bits not in BITS
            or panels.shape[1] != panel_bytes(k, bits) or panels.shape[0] * PANEL < n or not panels.is_contiguous()
            or not (x.is_cpu and panels.is_cpu)
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous() or bias.numel() < n
                                      or not bias.is_cpu))):
        raise ValueError(f"quant_mm: input [{m}, {k}] {x.dtype} does not fit {bits}-bit panels {list(panels.shape)} "
                         f"{panels.dtype} for {n} outputs" + ("" if bias is None else f", bias [{bias.numel()}]"))
    y = torch.empty(m, n, dtype=torch.float32)
    if m and lib.quant_mm(x.data_ptr(), m, k, panels.data_ptr(), n, bits, None if bias is None else bias.data_ptr(),
                          y.data_ptr(), torch.get_num_threads()) < 0:
        raise MemoryError("quant_mm: no scratch memory for the quantized rows")
    return y


def _op(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None, bits: int = 8) -> torch.Tensor:
    return quant_mm(x, panels, n, bias, bits=bits)


# The op TorchScript calls (torch.ops.rest_lsp.quant_mm), in the namespace panel_matmul defines.
assert panel_matmul._ops is not None
_ops = torch.library.Library("rest_lsp", "FRAGMENT")
_ops.define("quant_mm(Tensor x, Tensor panels, int n, Tensor? bias, int bits=8) -> Tensor")
_ops.impl("quant_mm", _op, "CPU")
