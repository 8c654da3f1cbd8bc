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
#define PFD 32768 /* the first tile of a panel prefetches this many bytes ahead in the weight stream (16-64 KB stream
                    a Zen 4 core's panels faster than 8 KB, with 1 and 8 rows, 4-bit and 8-bit: docs/LOG.md) */
#endif
#ifndef PFL
/* the prefetches' locality: 2 (prefetcht1) fetches into the core's L2. A non-temporal one (0, prefetchnta) left a
   Zen 4 core streaming its panels well below what the plain loads of the same bytes reach (docs/LOG.md) */
#define PFL 2
#endif
#ifndef CHUNKS
#define CHUNKS 32 /* chunks of panels in a thread's share (see quant_mm) */
#endif
#define INLINE static inline __attribute__((always_inline))

/* A panel's format (`fmt`): 8, 5, 4 are Q8_0, Q5_0, Q4_0 blocks (one fp16 scale a block); 41 Q4_1 (fp16 d and m a
   block: w = d q + m); 42, 52 Q4_K, Q5_K (256-weight superblocks: fp16 d and dmin, and per block of 32 a 6-bit
   scale sc and min mn: w = (d sc) q - (dmin mn)); 62 Q6_K (fp16 d a superblock, an int8 scale per 16 weights:
   w = (d sc) (q - 32)). Each stores its quants as bytes u = q + OFFSET of WIDTH bits: 8, the bytes themselves; 4,
   nibbles, two groups a 64-byte vector; 5, those nibbles, then a 64-byte plane of the fifth bits (byte i, bit g: group
   g's byte i); 6, the nibbles, then two 64-byte vectors of the top 2 bits (vector j, byte i: group 4 j + c's byte i at
   bits 2 c). The integer sum of a block is sum((u - OFFSET) x) (`SPLIT`: two, one per half of 16 weights), the offset
   taken back out as OFFSET x (the row block's or half's sum of quants); then the float steps, one fused
   multiply-add each: acc += float(sum) (f0 dx); for SPLIT formats acc += float(sum1) (f1 dx), the second half's
   sum (f1 = d sc1); for MINS formats acc += f1 c, c = float(B) dx rounded to fp32 once a row block (`mins_terms`),
   B the row block's sum of quants (f1 = m, or -(dmin mn)). d sc and dmin mn are exact in
   fp32 (11 x 8 bits at most), so every level computes the same f0 and f1. */
#define LEGACY(f) ((f) == 8 || (f) == 5 || (f) == 4)
#define KNOWN(f) (LEGACY(f) || (f) == 41 || (f) == 42 || (f) == 52 || (f) == 62)
#define WIDTH(f) ((f) == 8 ? 8 : (f) == 5 || (f) == 52 ? 5 : (f) == 62 ? 6 : 4)
#define OFFSET(f) ((f) == 8 ? 128 : (f) == 5 ? 16 : (f) == 4 ? 8 : (f) == 62 ? 32 : 0)
#define BYTES(f) (WIDTH(f) == 8 ? 512 : 256 + 64 * (WIDTH(f) - 4))
#define SUPER(f) ((f) == 42 || (f) == 52 || (f) == 62)  /* scales per superblock of 8 blocks */
#define MINS(f) ((f) == 41 || (f) == 42 || (f) == 52)
#define SPLIT(f) ((f) == 62)
#define TWO(f) (MINS(f) || SPLIT(f))
/* the bytes after a panel's quants: fp16 [nb][16] d (LEGACY); fp16 d, m [nb][16] each (41); fp16 d, dmin [ns][16]
   each then int8 sc, mn [nb][16] each (42, 52); fp16 d [ns][16] then int8 sc [nb][2][16] (62); ns = nb / 8 */
static long long tail_bytes(long long nb, int f) {
    long long ns = nb / 8;
    return LEGACY(f) ? nb * 32 : f == 41 ? nb * 64 : f == 62 ? ns * 32 + nb * 32 : ns * 64 + nb * 32;
}
/* a panel's bytes: its quants, then its tail rounded up to a whole line */
static idx panel_bytes(idx nb, int fmt) { return nb * BYTES(fmt) + (tail_bytes(nb, fmt) + 63) / 64 * 64; }

/* A two-term or superblock format reads its scales and mins from up to four places of the panel's tail, block by
   block, beside the quants' stream: the first tile of a panel fetches the whole tail ahead (without it, panels
   streamed from memory wait on those reads at every few blocks). */
#define PREFETCH_TAIL(p, nb, F, pf)                                                                           \
    if ((pf) && !LEGACY(F))                                                                                   \
        for (long long l = 0; l < tail_bytes(nb, F); l += 64) __builtin_prefetch((p) + (nb) * BYTES(F) + l, 0, PFL);

/* the first tile of a panel fetches the weight stream PFD bytes ahead as it takes the panel's blocks: at block b of
   nb, its b-th share of the panel's bytes (quants and tail), so that every line of the stream is fetched once
   (a block's quants alone left a tail's lines of every panel, about a tenth of a 4- or 5-bit one, to wait on) */
#define PREFETCH_BLOCK(p, nb, b, F, pf)                                                                       \
    if (pf) {                                                                                                 \
        idx stride_ = panel_bytes(nb, F);                                                                     \
        idx from_ = (b) * stride_ / (nb) / 64 * 64;                                                           \
        idx to_ = (b) + 1 == (nb) ? stride_ : ((b) + 1) * stride_ / (nb) / 64 * 64;                           \
        for (idx l = from_; l < to_; l += 64) __builtin_prefetch((p) + PFD + l, 0, PFL);                     \
    }

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

/* the most rows a tile takes: a call of more rows runs tiles of MT rows, each passing over the panels again */
#if QM_PATH == 3
#define MT 12
#elif QM_PATH == 2 || QM_PATH == 1
#define MT 16
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

/* the rows quantized per block: xq [m][nb*32], xd [m][nb] (scales), xs [m][nb] (sums of the quants), xh [m][nb]
   (sums of the first 16 quants; may be NULL) */
static void quantize_rows(const float *x, idx m, idx k, idx nb, int8_t *xq, float *xd, int32_t *xs, int32_t *xh) {
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
            if (xh) xh[r * nb + b] = _mm512_reduce_add_epi32(q0);
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
            int32_t s = 0, h = 0;
            for (int i = 0; i < QK; i++) {
                int q = (int)nearbyintf(v[i] * id);
                xq[r * nb * QK + b * QK + i] = (int8_t)q;
                s += q;
                if (i == QK / 2 - 1) h = s;
            }
            xd[r * nb + b] = d;
            xs[r * nb + b] = s;
            if (xh) xh[r * nb + b] = h;
        }
    }
}

/* MINS formats' second term per row block: c = float(sum) x dx, one fp32 rounding (the sum, at most 32 x 127, is
   exact in fp32); the tiles add f1 c, one fused multiply-add a row block and 16 columns */
static void mins_terms(const int32_t *xs, const float *xd, idx count, float *xc) {
    for (idx i = 0; i < count; i++) xc[i] = (float)xs[i] * xd[i];
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

/* rows [R] of the quantized input times one panel of `fmt` blocks; out [R][NB]. A block's weights are first
   unpacked to the unsigned bytes u = q + OFFSET(fmt), then dotted with the rows' quants as 8-bit ones are; the
   offset comes back out as OFFSET x (the row block's, or half's, sum of quants): the same exact int32 sums for
   every width. Then the block's float steps (see BYTES), in the same order on every path. */
#if QM_PATH == 3
INLINE void unpack(const uint8_t *wb, int width, __m512i w[8]) {
    if (width == 8) {
        for (int g = 0; g < 8; g++) w[g] = _mm512_loadu_si512((const void *)(wb + 64 * g));
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void *)(wb + 64 * j));
        w[2 * j] = _mm512_and_si512(v, low);
        w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if (width == 5) {
        const __m512i fifth = _mm512_set1_epi8(0x10), plane = _mm512_loadu_si512((const void *)(wb + 256));
        for (int g = 0; g < 8; g++)
            w[g] = _mm512_mask_add_epi8(w[g], _mm512_test_epi8_mask(plane, _mm512_set1_epi8((char)(1 << g))), w[g],
                                        fifth);
    }
    if (width == 6) {
        const __m512i top = _mm512_set1_epi8(0x30);
        for (int j = 0; j < 2; j++) {
            __m512i c = _mm512_loadu_si512((const void *)(wb + 256 + 64 * j));
            w[4 * j] = _mm512_or_si512(w[4 * j], _mm512_and_si512(_mm512_slli_epi16(c, 4), top));
            w[4 * j + 1] = _mm512_or_si512(w[4 * j + 1], _mm512_and_si512(_mm512_slli_epi16(c, 2), top));
            w[4 * j + 2] = _mm512_or_si512(w[4 * j + 2], _mm512_and_si512(c, top));
            w[4 * j + 3] = _mm512_or_si512(w[4 * j + 3], _mm512_and_si512(_mm512_srli_epi16(c, 2), top));
        }
    }
}
INLINE __m512 half16(const uint16_t *h) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)); }
INLINE __m512 int8x16(const int8_t *c) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)c)));
}
/* block b's float factors f0 (and f1 for TWO formats) of a panel's 16 columns */
INLINE void factors(const uint8_t *p, idx nb, idx b, int fmt, __m512 *f0, __m512 *f1) {
    const uint8_t *t = p + nb * BYTES(fmt);
    const uint16_t *h = (const uint16_t *)t;
    idx ns = nb / 8, s = b / 8;
    if (LEGACY(fmt)) {
        *f0 = half16(h + b * NB);
    } else if (fmt == 41) {
        *f0 = half16(h + b * NB);
        *f1 = half16(h + (nb + b) * NB);
    } else if (fmt == 62) {
        const int8_t *sc = (const int8_t *)(t + ns * 32) + b * 32;
        __m512 d = half16(h + s * NB);
        *f0 = _mm512_mul_ps(d, int8x16(sc));
        *f1 = _mm512_mul_ps(d, int8x16(sc + NB));
    } else {
        const int8_t *sc = (const int8_t *)(t + ns * 64) + b * NB;
        *f0 = _mm512_mul_ps(half16(h + s * NB), int8x16(sc));
        __m512 mn = _mm512_mul_ps(half16(h + (ns + s) * NB), int8x16(sc + nb * NB));
        *f1 = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(mn), _mm512_set1_epi32((int)0x80000000u)));
    }
}
#define TILE(R, F)                                                                                            \
static void tile##R##_##F(const int8_t *xq, const float *xd, const int32_t *xs, const int32_t *xh,          \
                          const float *xc, idx nb, const uint8_t *p, int pf, float *out) {                    \
    __m512 acc[R];                                                                                            \
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                                                 \
    PREFETCH_TAIL(p, nb, F, pf)                                                                               \
    for (idx b = 0; b < nb; b++) {                                                                            \
        const uint8_t *wb = p + b * BYTES(F);                                                                 \
        PREFETCH_BLOCK(p, nb, b, F, pf)                                                                       \
        __m512i w[8];                                                                                         \
        unpack(wb, WIDTH(F), w);                                                                              \
        __m512 f0, f1 = _mm512_setzero_ps();                                                                  \
        factors(p, nb, b, F, &f0, &f1);                                                                       \
        _Pragma("GCC unroll 12")                                                                              \
        for (int r = 0; r < R; r++) {                                                                         \
            const int8_t *xr = xq + (r * nb + b) * QK;                                                        \
            int32_t sum = xs[r * nb + b], half = SPLIT(F) ? xh[r * nb + b] : sum;                             \
            __m512i s = _mm512_set1_epi32(-OFFSET(F) * half), s1 = _mm512_set1_epi32(-OFFSET(F) * (sum - half)); \
            __m512i t = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();                                  \
            for (int g = 0; g < 8; g++) {                                                                     \
                int32_t four;                                                                                 \
                memcpy(&four, xr + 4 * g, 4);                                                                 \
                __m512i x4 = _mm512_set1_epi32(four);                                                         \
                if (SPLIT(F) && g >= 4) {                                                                     \
                    if (g & 1) t1 = _mm512_dpbusd_epi32(t1, w[g], x4);                                        \
                    else s1 = _mm512_dpbusd_epi32(s1, w[g], x4);                                              \
                } else if (g & 1) t = _mm512_dpbusd_epi32(t, w[g], x4);                                       \
                else s = _mm512_dpbusd_epi32(s, w[g], x4);                                                    \
            }                                                                                                 \
            s = _mm512_add_epi32(s, t); /* two chains of dependent dpbusd, not one: exact int32 sums either way */ \
            s1 = _mm512_add_epi32(s1, t1);                                                                    \
            __m512 dx = _mm512_set1_ps(xd[r * nb + b]);                                                       \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(f0, dx), acc[r]);                   \
            if (SPLIT(F))                                                                                     \
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(f1, dx), acc[r]);              \
            else if (MINS(F))                                                                                 \
                acc[r] = _mm512_fmadd_ps(f1, _mm512_set1_ps(xc[r * nb + b]), acc[r]);                         \
        }                                                                                                     \
    }                                                                                                         \
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * NB, acc[r]);                                       \
}
#elif QM_PATH == 2 || QM_PATH == 1
/* Paths 2 and 1 run tiles of up to MT = 16 rows: per block, its weights are made ready once (`ready`: unpacked, and
   on AVX2 also made signed and absolute) into a buffer in L1, and every row of the tile then takes them from there:
   a panel is streamed once a call for up to 16 rows, a block unpacked once for all of them. */
/* group g's fifth bits from 32 bytes of a block's plane (byte i, bit g), as 0x10 or 0 a byte: bit g moved to bit 4
   by a 16-bit shift, which carries no bit of a lane's other byte into bit 4 of either byte (left by 4 - g, right by
   g - 4) */
INLINE __m256i fifth_bits(__m256i plane, int g) {
    __m256i e = g <= 4 ? _mm256_slli_epi16(plane, 4 - g) : _mm256_srli_epi16(plane, g - 4);
    return _mm256_and_si256(e, _mm256_set1_epi8(0x10));
}
/* a 4-, 5- or 6-bit block unpacked to its 512 bytes q + OFFSET in `ub` (an 8-bit block is read where it is) */
INLINE const uint8_t *unpack(const uint8_t *wb, int width, uint8_t *ub) {
    if (width == 8) return wb;
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int j = 0; j < 4; j++)
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wb + 64 * j + 32 * h));
            _mm256_store_si256((__m256i *)(ub + 128 * j + 32 * h), _mm256_and_si256(v, low));
            _mm256_store_si256((__m256i *)(ub + 128 * j + 64 + 32 * h),
                               _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
        }
    if (width == 5)
        for (int h = 0; h < 2; h++) {
            __m256i plane = _mm256_loadu_si256((const __m256i *)(wb + 256 + 32 * h));
            for (int g = 0; g < 8; g++) {
                __m256i *u = (__m256i *)(ub + 64 * g + 32 * h);
                _mm256_store_si256(u, _mm256_or_si256(_mm256_load_si256(u), fifth_bits(plane, g)));
            }
        }
    if (width == 6) {
        /* the top 2 bits: group 4 j + c's at bits 2 c of vector j, moved to bits 4-5 */
        const __m256i top = _mm256_set1_epi8(0x30);
        for (int j = 0; j < 2; j++)
            for (int h = 0; h < 2; h++) {
                __m256i c = _mm256_loadu_si256((const __m256i *)(wb + 256 + 64 * j + 32 * h));
                __m256i e[4] = {_mm256_slli_epi16(c, 4), _mm256_slli_epi16(c, 2), c, _mm256_srli_epi16(c, 2)};
                for (int i = 0; i < 4; i++) {
                    __m256i *u = (__m256i *)(ub + 64 * (4 * j + i) + 32 * h);
                    _mm256_store_si256(u, _mm256_or_si256(_mm256_load_si256(u), _mm256_and_si256(e[i], top)));
                }
            }
    }
    return ub;
}
/* one vector of `unpack`'s output, group g's half h (its columns 8 h .. 8 h + 7), made from the packed block in
   registers: the same bytes, for a single row, which takes each of them once (a 4-, 5- or 6-bit block) */
INLINE __m256i unpacked(const uint8_t *wb, int width, int g, int h) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i v = _mm256_loadu_si256((const __m256i *)(wb + 64 * (g / 2) + 32 * h));
    __m256i u = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(v, 4) : v, low);
    if (width == 5)
        u = _mm256_or_si256(u, fifth_bits(_mm256_loadu_si256((const __m256i *)(wb + 256 + 32 * h)), g));
    if (width == 6) {
        __m256i c = _mm256_loadu_si256((const __m256i *)(wb + 256 + 64 * (g / 4) + 32 * h));
        int i = g % 4;
        __m256i e = i == 0 ? _mm256_slli_epi16(c, 4) : i == 1 ? _mm256_slli_epi16(c, 2) : i == 2 ? c
                  : _mm256_srli_epi16(c, 2);
        u = _mm256_or_si256(u, _mm256_and_si256(e, _mm256_set1_epi8(0x30)));
    }
    return u;
}
INLINE __m256 half8(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }
INLINE __m256 int8x8(const int8_t *c) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)c)));
}
/* block b's float factors f0 (and f1 for TWO formats) of a panel's columns 0-7 ([0]) and 8-15 ([1]) */
INLINE void factors(const uint8_t *p, idx nb, idx b, int fmt, __m256 f0[2], __m256 f1[2]) {
    const uint8_t *t = p + nb * BYTES(fmt);
    const uint16_t *h = (const uint16_t *)t;
    idx ns = nb / 8, s = b / 8;
    for (int k = 0; k < 2; k++) {
        if (LEGACY(fmt)) {
            f0[k] = half8(h + b * NB + 8 * k);
        } else if (fmt == 41) {
            f0[k] = half8(h + b * NB + 8 * k);
            f1[k] = half8(h + (nb + b) * NB + 8 * k);
        } else if (fmt == 62) {
            const int8_t *sc = (const int8_t *)(t + ns * 32) + b * 32 + 8 * k;
            __m256 d = half8(h + s * NB + 8 * k);
            f0[k] = _mm256_mul_ps(d, int8x8(sc));
            f1[k] = _mm256_mul_ps(d, int8x8(sc + NB));
        } else {
            const int8_t *sc = (const int8_t *)(t + ns * 64) + b * NB + 8 * k;
            f0[k] = _mm256_mul_ps(half8(h + s * NB + 8 * k), int8x8(sc));
            f1[k] = _mm256_xor_ps(_mm256_mul_ps(half8(h + (ns + s) * NB + 8 * k), int8x8(sc + nb * NB)),
                                  _mm256_set1_ps(-0.0f));
        }
    }
}
/* NR rows' 4-byte groups g of a block (a group's 4 quants in every 32-bit lane), rows xr[0..NR) */
#define GROUPS(x, xr, NR, g)                                                                                  \
    for (int r = 0; r < NR; r++) {                                                                            \
        int32_t four;                                                                                         \
        memcpy(&four, xr[r] + 4 * (g), 4);                                                                    \
        x[r] = _mm256_set1_epi32(four);                                                                       \
    }
#define WEIGHTS(u, g, h) _mm256_loadu_si256((const __m256i *)((u) + 64 * (g) + 32 * (h)))
/* a row's sums before its products: the offset taken out (s[0], s[1]: columns 0-7, 8-15; SPLIT: s[2], s[3] the
   second half's) */
INLINE void start(__m256i s[4], int fmt, int32_t sum, int32_t half) {
    if (SPLIT(fmt)) {
        s[0] = s[1] = _mm256_set1_epi32(-OFFSET(fmt) * half);
        s[2] = s[3] = _mm256_set1_epi32(-OFFSET(fmt) * (sum - half));
    } else {
        s[0] = s[1] = _mm256_set1_epi32(-OFFSET(fmt) * sum);
    }
}
#define SLOT(fmt, g) (SPLIT(fmt) && (g) >= 4 ? 2 : 0)
/* the running sum x as it stands, in its register: integer adds may be regrouped, and gcc, given a block's 16 or 32
   products to add, makes them all first and adds them as a tree, spilling most of them to the stack (AVX2 has 16
   vector registers); each product added as it is made keeps the loop in registers. The sums are the same integers. */
#define KEEP(x) __asm__("" : "+x"(x))
#if QM_PATH == 2
/* a block made ready: its bytes q + OFFSET (the unsigned operand of `vpdpbusd`) */
INLINE const uint8_t *ready(const uint8_t *wb, int fmt, int R, uint8_t *ub) {
    (void)R;
    return unpack(wb, WIDTH(fmt), ub);
}
/* NR rows' exact int32 sums of the block's 16 columns (`start`'s slots): the 4-byte groups of 8 columns dotted with
   the row's 4 quants, the offset taken out by the start value */
INLINE void block_sums(const uint8_t *u, int fmt, int R, const int8_t *const *xr, const int32_t *xs,
                       const int32_t *xh, int NR, __m256i s[][4]) {
    (void)R;
    for (int r = 0; r < NR; r++) start(s[r], fmt, xs[r], xh[r]);
    for (int g = 0; g < 8; g++) {
        __m256i x[4];
        GROUPS(x, xr, NR, g)
        for (int h = 0; h < 2; h++) {
            __m256i w = WEIGHTS(u, g, h);
            for (int r = 0; r < NR; r++)
                s[r][SLOT(fmt, g) + h] = _mm256_dpbusd_avx_epi32(s[r][SLOT(fmt, g) + h], w, x[r]);
        }
    }
}
#else
/* a block made ready for a tile of R rows. 8 bits: the signed quants w = byte ^ 0x80 at ub [512..1023] and their
   magnitudes |w| at ub [0..511] (`vpmaddubsw` multiplies |w|, unsigned, with x signed as w: pairs of products in
   int16, |.| <= 2 x 128 x 127, no saturation); for one row the block as it is (`block_sums` makes w and |w| on the
   fly). 4, 5 and 6 bits: the bytes q + OFFSET (at most 63) at ub [0..511]; for one row the block as it is
   (`block_sums` unpacks each vector in registers as it takes it: no store and load back) */
INLINE const uint8_t *ready(const uint8_t *wb, int fmt, int R, uint8_t *ub) {
    if (R == 1) return wb;
    if (WIDTH(fmt) != 8) return unpack(wb, WIDTH(fmt), ub);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int v = 0; v < 16; v++) {
        __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 32 * v)), flip);
        _mm256_store_si256((__m256i *)(ub + BQ + 32 * v), w);
        _mm256_store_si256((__m256i *)(ub + 32 * v), _mm256_abs_epi8(w));
    }
    return ub;
}
/* NR rows' exact int32 sums of the block's 16 columns (`start`'s slots). 8 bits: per group the pairs of
   |w| x (x signed as w) in int16, widened to int32 (`vpmaddwd` by ones) and added. 4, 5 and 6 bits: q + OFFSET
   (<= 15, <= 31, <= 63) times x in int16 pairs, 8, 4 or 2 groups (|.| <= 8 x 2 x 15 x 127, 4 x 2 x 31 x 127,
   2 x 2 x 63 x 127) added in int16 without overflow, then widened; the offset taken out by the start value. Every
   sum is the exact integer, in any order. */
INLINE void block_sums(const uint8_t *u, int fmt, int R, const int8_t *const *xr, const int32_t *xs,
                       const int32_t *xh, int NR, __m256i s[][4]) {
    const __m256i one = _mm256_set1_epi16(1);
    if (WIDTH(fmt) == 8) {
        for (int r = 0; r < NR; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            __m256i x[4];
            GROUPS(x, xr, NR, g)
            for (int h = 0; h < 2; h++) {
                __m256i a, w;
                if (R == 1) {
                    w = _mm256_xor_si256(WEIGHTS(u, g, h), _mm256_set1_epi8((char)0x80));
                    a = _mm256_abs_epi8(w);
                } else {
                    a = WEIGHTS(u, g, h);
                    w = WEIGHTS(u + BQ, g, h);
                }
                for (int r = 0; r < NR; r++) {
                    s[r][h] = _mm256_add_epi32(s[r][h], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(a, _mm256_sign_epi8(x[r], w)), one));
                    KEEP(s[r][h]);
                }
            }
        }
        return;
    }
    const int run = WIDTH(fmt) == 4 ? 8 : WIDTH(fmt) == 5 ? 4 : 2; /* groups whose int16 sums cannot overflow */
    for (int r = 0; r < NR; r++) start(s[r], fmt, xs[r], xh[r]);
    for (int g0 = 0; g0 < 8; g0 += run) {
        __m256i p[4][2];
        for (int g = g0; g < g0 + run; g++) {
            __m256i x[4];
            GROUPS(x, xr, NR, g)
            for (int h = 0; h < 2; h++) {
                __m256i w = R == 1 ? unpacked(u, WIDTH(fmt), g, h) : WEIGHTS(u, g, h);
                for (int r = 0; r < NR; r++) {
                    __m256i pr = _mm256_maddubs_epi16(w, x[r]);
                    p[r][h] = g == g0 ? pr : _mm256_add_epi16(p[r][h], pr);
                    KEEP(p[r][h]);
                }
            }
        }
        for (int r = 0; r < NR; r++)
            for (int h = 0; h < 2; h++)
                s[r][SLOT(fmt, g0) + h] = _mm256_add_epi32(s[r][SLOT(fmt, g0) + h], _mm256_madd_epi16(p[r][h], one));
    }
}
#endif
/* rows taken together by `block_sums` (each weight vector loaded once for them; more would spill registers) */
#if QM_PATH == 2
#define NR_OF(fmt) (SPLIT(fmt) ? 2 : 4)
#else
#define NR_OF(fmt) (WIDTH(fmt) == 8 ? 4 : 2)
#endif
/* NR rows from row r of a block: their sums, then per row the block's float operations as on every path: cvt,
   scale = f0 x dx, one fused multiply-add; for SPLIT formats the second half's sum the same way; for MINS formats
   f1 x c (`mins_terms`), one fused multiply-add */
INLINE void rows_block(const uint8_t *u, int fmt, int R, const int8_t *xq, const float *xd, const int32_t *xs,
                       const int32_t *xh, const float *xc, idx nb, idx b, int r, int NR, const __m256 f0[2],
                       const __m256 f1[2], __m256 acc[][2]) {
    const int8_t *xr[4];
    int32_t xsum[4], xhalf[4];
    __m256i s[4][4];
    for (int i = 0; i < NR; i++) {
        xr[i] = xq + ((r + i) * nb + b) * QK;
        xsum[i] = xs[(r + i) * nb + b];
        xhalf[i] = SPLIT(fmt) ? xh[(r + i) * nb + b] : 0;
    }
#if QM_PATH == 1
    /* a tile's last pass over fewer rows than NR_OF (3 rows of 4-bit blocks: 2 + 1; 6 rows of 8-bit ones: 4 + 2)
       reads the block's ready weights through a pointer gcc cannot see through: where it could, it loaded each
       weight vector once for the passes before and this one, kept them all live across both and spilled them with
       the rows' sums; the loads stay in L1 */
    if (R > 1 && NR != NR_OF(fmt)) __asm__("" : "+r"(u));
#endif
    block_sums(u, fmt, R, xr, xsum, xhalf, NR, s);
    for (int i = 0; i < NR; i++) {
        __m256 dx = _mm256_set1_ps(xd[(r + i) * nb + b]);
        for (int h = 0; h < 2; h++) {
            acc[r + i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i][h]), _mm256_mul_ps(f0[h], dx), acc[r + i][h]);
            if (SPLIT(fmt))
                acc[r + i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i][2 + h]), _mm256_mul_ps(f1[h], dx),
                                                acc[r + i][h]);
            else if (MINS(fmt))
                acc[r + i][h] = _mm256_fmadd_ps(f1[h], _mm256_set1_ps(xc[(r + i) * nb + b]), acc[r + i][h]);
        }
    }
}
#define TILE(R, F)                                                                                            \
static void tile##R##_##F(const int8_t *xq, const float *xd, const int32_t *xs, const int32_t *xh,          \
                          const float *xc, idx nb, const uint8_t *p, int pf, float *out) {                    \
    __m256 acc[R][2];                                                                                         \
    uint8_t ub[2 * BQ] __attribute__((aligned(32)));                                                          \
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();                                  \
    PREFETCH_TAIL(p, nb, F, pf)                                                                               \
    for (idx b = 0; b < nb; b++) {                                                                            \
        const uint8_t *wb = p + b * BYTES(F);                                                                 \
        PREFETCH_BLOCK(p, nb, b, F, pf)                                                                       \
        const uint8_t *u = ready(wb, F, R, ub);                                                               \
        __m256 f0[2], f1[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                                     \
        factors(p, nb, b, F, f0, f1);                                                                         \
        int r = 0;                                                                                            \
        for (; r + NR_OF(F) <= R; r += NR_OF(F))                                                              \
            rows_block(u, F, R, xq, xd, xs, xh, xc, nb, b, r, NR_OF(F), f0, f1, acc);                         \
        if (r < R) rows_block(u, F, R, xq, xd, xs, xh, xc, nb, b, r, R % NR_OF(F), f0, f1, acc);              \
    }                                                                                                         \
    for (int r = 0; r < R; r++) { _mm256_storeu_ps(out + r * NB, acc[r][0]); _mm256_storeu_ps(out + r * NB + 8, acc[r][1]); } \
}
#else
INLINE const uint8_t *unpack(const uint8_t *wb, int width, uint8_t *ub) {
    if (width == 8) return wb;
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 64; i++) {
            ub[128 * j + i] = wb[64 * j + i] & 15;
            ub[128 * j + 64 + i] = wb[64 * j + i] >> 4;
        }
    if (width == 5)
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 64; i++)
                ub[64 * g + i] |= ((wb[256 + i] >> g) & 1) << 4;
    if (width == 6)
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 64; i++)
                ub[64 * g + i] |= ((wb[256 + 64 * (g / 4) + i] >> (2 * (g % 4))) & 3) << 4;
    return ub;
}
/* block b's float factors f0 (and f1 for TWO formats) of a panel's 16 columns */
INLINE void factors(const uint8_t *p, idx nb, idx b, int fmt, float f0[NB], float f1[NB]) {
    const uint8_t *t = p + nb * BYTES(fmt);
    const uint16_t *h = (const uint16_t *)t;
    idx ns = nb / 8, s = b / 8;
    const int8_t *sc = (const int8_t *)(t + ns * (fmt == 62 ? 32 : 64));
    for (int c = 0; c < NB; c++) {
        if (LEGACY(fmt)) {
            f0[c] = half_to_float(h[b * NB + c]);
        } else if (fmt == 41) {
            f0[c] = half_to_float(h[b * NB + c]);
            f1[c] = half_to_float(h[(nb + b) * NB + c]);
        } else if (fmt == 62) {
            float d = half_to_float(h[s * NB + c]);
            f0[c] = d * (float)sc[b * 32 + c];
            f1[c] = d * (float)sc[b * 32 + NB + c];
        } else {
            f0[c] = half_to_float(h[s * NB + c]) * (float)sc[b * NB + c];
            f1[c] = -(half_to_float(h[(ns + s) * NB + c]) * (float)sc[nb * NB + b * NB + c]);
        }
    }
}
#define TILE(R, F)                                                                                            \
static void tile##R##_##F(const int8_t *xq, const float *xd, const int32_t *xs, const int32_t *xh,          \
                          const float *xc, idx nb, const uint8_t *p, int pf, float *out) {                    \
    (void)xh; (void)pf;                                                                                       \
    float acc[R][NB], f0[NB], f1[NB];                                                                         \
    uint8_t ub[BQ];                                                                                           \
    memset(acc, 0, sizeof acc);                                                                               \
    for (idx b = 0; b < nb; b++) {                                                                            \
        const uint8_t *u = unpack(p + b * BYTES(F), WIDTH(F), ub);                                            \
        factors(p, nb, b, F, f0, f1);                                                                         \
        for (int r = 0; r < R; r++) {                                                                         \
            const int8_t *xr = xq + (r * nb + b) * QK;                                                        \
            float dx = xd[r * nb + b];                                                                        \
            for (int c = 0; c < NB; c++) {                                                                    \
                int32_t s0 = 0, s1 = 0;                                                                       \
                for (int g = 0; g < 8; g++)                                                                   \
                    for (int j = 0; j < 4; j++) {                                                             \
                        int32_t v = ((int)u[64 * g + 4 * c + j] - OFFSET(F)) * xr[4 * g + j];                 \
                        if (SPLIT(F) && g >= 4) s1 += v; else s0 += v;                                        \
                    }                                                                                         \
                float scale = f0[c] * dx;                                                                     \
                acc[r][c] = fmaf((float)s0, scale, acc[r][c]);                                                \
                if (SPLIT(F)) acc[r][c] = fmaf((float)s1, f1[c] * dx, acc[r][c]);                             \
                else if (MINS(F)) acc[r][c] = fmaf(f1[c], xc[r * nb + b], acc[r][c]);                         \
            }                                                                                                 \
        }                                                                                                     \
    }                                                                                                         \
    memcpy(out, acc, sizeof acc);                                                                             \
}
#endif

#define TILES(BITS) TILE(1, BITS) TILE(2, BITS) TILE(3, BITS) TILE(4, BITS)
#define MORE_TILES(BITS) TILE(5, BITS) TILE(6, BITS) TILE(7, BITS) TILE(8, BITS) TILE(9, BITS) TILE(10, BITS) \
    TILE(11, BITS) TILE(12, BITS)
#define MOST_TILES(BITS) TILE(13, BITS) TILE(14, BITS) TILE(15, BITS) TILE(16, BITS)
#define ALL_FORMATS(T) T(8) T(5) T(4) T(41) T(42) T(52) T(62)
ALL_FORMATS(TILES)
#if MT > 4
ALL_FORMATS(MORE_TILES)
#endif
#if MT > 12
ALL_FORMATS(MOST_TILES)
#endif
#define ROW4(BITS) 0, tile1_##BITS, tile2_##BITS, tile3_##BITS, tile4_##BITS
#define ROW12(BITS) ROW4(BITS), tile5_##BITS, tile6_##BITS, tile7_##BITS, tile8_##BITS, tile9_##BITS, tile10_##BITS, \
    tile11_##BITS, tile12_##BITS
#if MT == 16
#define ROW(BITS) {ROW12(BITS), tile13_##BITS, tile14_##BITS, tile15_##BITS, tile16_##BITS}
#elif MT == 12
#define ROW(BITS) {ROW12(BITS)}
#else
#define ROW(BITS) {ROW4(BITS)}
#endif

typedef void (*tile_fn)(const int8_t *, const float *, const int32_t *, const int32_t *, const float *, idx,
                        const uint8_t *, int, float *);
static const tile_fn tiles8[MT + 1] = ROW(8), tiles5[MT + 1] = ROW(5), tiles4[MT + 1] = ROW(4),
                     tiles41[MT + 1] = ROW(41), tiles42[MT + 1] = ROW(42), tiles52[MT + 1] = ROW(52),
                     tiles62[MT + 1] = ROW(62);

static const tile_fn *tiles_of(int fmt) {
    switch (fmt) {
    case 8: return tiles8;
    case 5: return tiles5;
    case 4: return tiles4;
    case 41: return tiles41;
    case 42: return tiles42;
    case 52: return tiles52;
    default: return tiles62;
    }
}

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
static void panels(const int8_t *xq, const float *xd, const int32_t *xs, const int32_t *xh, const float *xc, idx m,
                   idx nb, const uint8_t *w, idx n, int bits, const float *bias, float *y, idx first, idx last,
                   const int8_t *xa, const float *xda) {
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
    const tile_fn *tiles = tiles_of(bits);
    for (idx q = first; q < last; q++) {
        const uint8_t *p = w + q * stride;
        idx c0 = q * NB, cols = n - c0 < NB ? n - c0 : NB;
        for (idx m0 = 0; m0 < m; m0 += MT) {
            idx r = m - m0 < MT ? m - m0 : MT;
            tiles[r](xq + m0 * nb * QK, xd + m0 * nb, xs + m0 * nb, xh + m0 * nb, xc ? xc + m0 * nb : NULL, nb, p,
                     m0 == 0, out);
            emit(out, r, y, m0, n, c0, cols, bias);
        }
    }
}

/* a x b <= have, without overflow (a, b >= 0) */
static int fits(idx a, idx b, idx have) {
    idx ab;
    return !__builtin_mul_overflow(a, b, &ab) && ab <= have;
}

/* y [m, n] = x [m, k] quantized per block of 32 times the weight given as panels of format `bits` (8, 5, 4, 41, 42,
   52, 62: see BYTES; `pack`), + bias (may be NULL); on `threads` threads. xn, wn, bn, yn: the floats (bytes for w)
   each buffer holds from its pointer on, checked before anything is read. 0, or 1 where the rows ran on AMX tiles
   (Q8_0, Q5_0 and Q4_0 panels only); -1 when the scratch memory could not be had, -2 for another format (or a
   superblock format whose k is not a multiple of 256), -3 for sizes that do not fit the buffers */
int quant_mm(const float *x, idx xn, idx m, idx k, const uint8_t *w, idx wn, idx n, int bits, const float *bias,
             idx bn, float *y, idx yn, int threads) {
    if (!KNOWN(bits)) return -2;
    /* the scratch holds m x nb x 32 quants: m, k, n each below 2^31 keep every product in range */
    if (m < 0 || k < 0 || n < 0 || m > INT32_MAX || k > INT32_MAX - QK || n > INT32_MAX) return -3;
    idx nb = (k + QK - 1) / QK, count = (n + NB - 1) / NB;
    if (SUPER(bits) && k % (8 * QK)) return -2;
    if ((m && (!x || !y)) || !fits(m, k, xn) || !fits(m, n, yn) || !fits(count, panel_bytes(nb, bits), wn)
        || (count && !w) || (bias && bn < n)) return -3;
    if (m == 0 || n == 0) return 0;
#if QM_AMX
    int amx = LEGACY(bits) && m >= AMX_ROWS && __atomic_load_n(&amx_wanted, __ATOMIC_RELAXED) && amx_usable();
#else
    int amx = 0;
#endif
    idx mp = amx ? (m + 15) / 16 * 16 : 0; /* the AMX tiles read rows in 16s: the rows past m are zeros */
    int8_t *xq = malloc((size_t)(m * nb * QK) + 1), *xa = amx ? aligned_alloc(64, (size_t)(mp * nb * QK)) : NULL;
    float *xda = amx ? malloc(sizeof(float) * (size_t)(mp * nb)) : NULL;
    float *xd = malloc(sizeof(float) * (size_t)(m * nb) + 1);
    int32_t *xs = malloc(sizeof(int32_t) * (size_t)(m * nb) + 1), *xh = malloc(sizeof(int32_t) * (size_t)(m * nb) + 1);
    float *xc = MINS(bits) ? malloc(sizeof(float) * (size_t)(m * nb) + 1) : NULL; /* read by MINS tiles alone */
    if (!xq || !xd || !xs || !xh || (MINS(bits) && !xc) || (amx && (!xa || !xda))) {
        free(xq); free(xd); free(xs); free(xh); free(xc); free(xa); free(xda);
        return -1;
    }
    quantize_rows(x, m, k, nb, xq, xd, xs, xh);
    if (xc) mins_terms(xs, xd, m * nb, xc);
#if QM_AMX
    if (amx) amx_layout(xq, xd, m, nb, xa, xda);
#endif
#ifdef _OPENMP
    int wide = (double)m * (double)k * (double)n >= 65536.0; /* in doubles: the product may pass 2^63 */
    /* thread t's share is panels [count t / T, count (t + 1) / T): it takes its share's chunks in order, then
       those another thread has not reached (`taken` counts each share's chunks handed out). Where another process
       holds a core, the thread on it falls behind and the others take over its chunks; each panel's result is the
       same on any thread. AMX calls keep one chunk a share (`amx_rows`' row chunks pass over a share's panels). */
    int teams = threads > 1 ? threads : 1;
    idx chunks = amx ? 1 : CHUNKS, *taken = calloc((size_t)teams * 8, sizeof(idx)); /* one cache line a share */
    if (!taken)
        panels(xq, xd, xs, xh, xc, m, nb, w, n, bits, bias, y, 0, count, xa, xda);
    else
    #pragma omp parallel num_threads(teams) if (teams > 1 && count > 1 && wide)
    {
        idx t = omp_get_thread_num(), T = omp_get_num_threads();
        for (idx u = 0; u < T; u++) {
            idx s = (t + u) % T, lo = count * s / T, hi = count * (s + 1) / T, size = (hi - lo + chunks - 1) / chunks;
            for (idx c; size > 0 && (c = lo + size * __atomic_fetch_add(&taken[s * 8], 1, __ATOMIC_RELAXED)) < hi;)
                panels(xq, xd, xs, xh, xc, m, nb, w, n, bits, bias, y, c, c + size < hi ? c + size : hi, xa, xda);
        }
    }
    free(taken);
#else
    (void)threads;
    panels(xq, xd, xs, xh, xc, m, nb, w, n, bits, bias, y, 0, count, xa, xda);
#endif
    free(xq); free(xd); free(xs); free(xh); free(xc); free(xa); free(xda);
    return amx;
}

/* the rows' quantization alone (for the tests' reference): x [m, k] (xn floats) -> xq [m][nb * 32], xd [m][nb],
   xs [m][nb] (xqn, xdn, xsn elements). 0; -3 for sizes that do not fit the buffers */
int quant_rows(const float *x, idx xn, idx m, idx k, int8_t *xq, idx xqn, float *xd, idx xdn, int32_t *xs,
               idx xsn) {
    if (m < 0 || k < 0 || m > INT32_MAX || k > INT32_MAX - QK) return -3;
    idx nb = (k + QK - 1) / QK;
    if (!fits(m, k, xn) || !fits(m, nb * QK, xqn) || !fits(m, nb, xdn) || !fits(m, nb, xsn)) return -3;
    if (m && (!x || !xq || !xd || !xs)) return -3;
    quantize_rows(x, m, k, nb, xq, xd, xs, NULL);
    return 0;
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
