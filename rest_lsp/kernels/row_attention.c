#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef long long idx;
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#define LN 16   /* lanes */
#define RB 8    /* rows a task */
#define DMAX 1024 /* the largest head size it takes */
#define INLINE static inline __attribute__((always_inline))

INLINE v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
INLINE void st(float *p, v16 v) { memcpy(p, &v, sizeof v); }
INLINE v16 ldn(const float *p, idx c) { v16 v = {0}; memcpy(&v, p, (size_t)c * sizeof(float)); return v; }
INLINE void stn(float *p, v16 v, idx c) { memcpy(p, &v, (size_t)c * sizeof(float)); }
/* c + a * b rounded once (a fused multiply-add): the instruction where the target has one, else libm's fmaf, which
   rounds the same way */
#if defined(__AVX512F__)
#include <immintrin.h>
INLINE v16 fma16(v16 a, v16 b, v16 c) { return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
INLINE v16 fma16(v16 a, v16 b, v16 c) {
    __m256 x[2], y[2], z[2];
    memcpy(x, &a, sizeof a); memcpy(y, &b, sizeof b); memcpy(z, &c, sizeof c);
    z[0] = _mm256_fmadd_ps(x[0], y[0], z[0]);
    z[1] = _mm256_fmadd_ps(x[1], y[1], z[1]);
    memcpy(&c, z, sizeof c);
    return c;
}
#else
#include <math.h>
INLINE v16 fma16(v16 a, v16 b, v16 c) {
    for (int i = 0; i < 16; i++) c[i] = fmaf(a[i], b[i], c[i]);
    return c;
}
#endif
INLINE v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

/* exp(x) for x <= 0 (x below the clamp gives a tiny normal number): Cody-Waite reduction and a degree-five
   polynomial, each multiply and add its own rounding, the same on every path (one text for every width) */
#define DEFINE_VEXP(name, vf, vi, sp)                                                                              \
    INLINE vf name(vf x) {                                                                                         \
        const vf lo = sp(-87.0f);                                                                                  \
        vi below = x < lo;                                                                                         \
        x = (vf)((below & (vi)lo) | (~below & (vi)x));                                                             \
        const float magic = 12582912.0f;                                                                           \
        vf kf = (x * 1.44269504088896341f + magic) - magic;                                                        \
        vf r = x - kf * 0.693359375f;                                                                              \
        r = r - kf * -2.12194440e-4f;                                                                              \
        vf p = sp(1.9875691500e-4f);                                                                               \
        p = p * r + 1.3981999507e-3f;                                                                              \
        p = p * r + 8.3334519073e-3f;                                                                              \
        p = p * r + 4.1665795894e-2f;                                                                              \
        p = p * r + 1.6666665459e-1f;                                                                              \
        p = p * r + 5.0000001201e-1f;                                                                              \
        vf y = p * (r * r) + r + 1.0f;                                                                             \
        vi k = __builtin_convertvector(kf, vi);                                                                    \
        vf two = (vf)((k + 127) << 23);                                                                            \
        return y * two;                                                                                            \
    }
DEFINE_VEXP(vexp, v16, v16i, splat)

INLINE float lanesum(v16 a) {
    float t[LN];
    st(t, a);
    for (int w = LN / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) t[i] = t[i] + t[i + w];
    return t[0];
}

/* the line of a key row `blocks` key blocks of 16 rows on (from `at`, the row's line being read), fetched into L1
   while this block is transposed: a guess for a tail's rows, and a prefetch never faults */
INLINE void fetch_ahead(const float *at, int blocks, idx d) {
    __builtin_prefetch((const char *)((uintptr_t)at + blocks * LN * d * sizeof(float)), 0, 3);
}

/* the lines of `floats` floats from p on, fetched into L1 (a prefetch never faults) */
INLINE void fetch_row(const float *p, idx floats) {
    for (idx e = 0; e < floats; e += 64 / (idx)sizeof(float)) __builtin_prefetch((const char *)(p + e), 0, 3);
}

#define VBYTES 16384  /* the value rows' bytes a j-block of `values` reads (kept in L1 for every query of the block) */

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* AVX2: the same per-lane operations on pairs of 8-float registers (a 16-lane vector does not fit one, and GCC
   lowers the 16-lane shuffles and wide register blocks to scalar code and spills). Only the data movement and the
   blocking differ: which queries, keys and lanes are computed together never changes a lane's chain. */
#define QS 6  /* queries a score block: 2 * QS accumulators + a key pair + a weight in 16 registers */
#define QV 4  /* queries a value block, each a 16-float chunk in two registers */
#define KAHEAD 2  /* key blocks of 16 rows a transpose prefetches ahead */

/* kt [d][16] = the rows rp[0..16) transposed (lanes past c: scores never read), in 8 x 8 tiles */
static void transpose(const float *const *rp, idx c, idx d, float *kt) {
    idx e0 = 0;
    for (; e0 + 8 <= d; e0 += 8)
        for (int h = 0; h < LN; h += 8) {  /* the rows past c repeat row 0 */
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(rp[h + i] + e0);
            if (!(e0 & 15))  /* once a line */
                for (int i = 0; i < 8; i++) fetch_ahead(rp[h + i] + e0, KAHEAD, d);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(kt + (e0 + i) * LN + h, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
                _mm256_storeu_ps(kt + (e0 + i + 4) * LN + h, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
            }
        }
    for (idx jj = 0; jj < LN; jj++)
        for (idx e = e0; e < d; e++) kt[e * LN + jj] = jj < c ? rp[jj][e] : 0.0f;
}

/* Q queries' scores of one transposed block: per key a chain over d, s = s + q[d] * k[d], then times the scale */
INLINE void scores_q(const float *const *qq, float *const *dd, const float *kt, idx d, float scale, const int Q) {
    __m256 a[2 * QS];
    for (int x = 0; x < 2 * Q; x++) a[x] = _mm256_setzero_ps();
    for (idx e = 0; e < d; e++) {
        __m256 k0 = _mm256_loadu_ps(kt + e * LN), k1 = _mm256_loadu_ps(kt + e * LN + 8);
        for (int x = 0; x < Q; x++) {
            __m256 w = _mm256_broadcast_ss(qq[x] + e);
            a[2 * x] = _mm256_fmadd_ps(w, k0, a[2 * x]);
            a[2 * x + 1] = _mm256_fmadd_ps(w, k1, a[2 * x + 1]);
        }
    }
    __m256 s = _mm256_set1_ps(scale);
    for (int x = 0; x < Q; x++) {
        _mm256_storeu_ps(dd[x], _mm256_mul_ps(a[2 * x], s));
        _mm256_storeu_ps(dd[x] + 8, _mm256_mul_ps(a[2 * x + 1], s));
    }
}

/* U queries in the fewest blocks of at most `most`, as even as they go: their number, their sizes in size[] */
static idx blocks_of(idx U, idx most, idx *size) {
    idx count = (U + most - 1) / most;
    for (idx b = 0; b < count; b++) size[b] = U / count + (b < U % count);
    return count;
}

/* the scores of one transposed block of 16 keys for U queries qs[u], into dst[u][0..16) */
static void scores(const float *const *qs, float *const *dst, idx U, const float *kt, idx d, float scale) {
    idx size[RB * 64], count = blocks_of(U, QS, size), u = 0;
    for (idx b = 0; b < count; u += size[b++]) {
        switch (size[b]) {  /* a constant block size: the accumulators stay in registers */
        case 1: scores_q(qs + u, dst + u, kt, d, scale, 1); break;
        case 2: scores_q(qs + u, dst + u, kt, d, scale, 2); break;
        case 3: scores_q(qs + u, dst + u, kt, d, scale, 3); break;
        case 4: scores_q(qs + u, dst + u, kt, d, scale, 4); break;
        case 5: scores_q(qs + u, dst + u, kt, d, scale, 5); break;
        default: scores_q(qs + u, dst + u, kt, d, scale, 6); break;
        }
    }
}

/* Q queries' accumulators for chunk c (16 lanes of d; `part`: fewer than 16 left, the rest loaded as zeros, never
   stored to the output): a = a + p[j] * v_j for j in j0..j1, in order; row j + ahead fetched meanwhile */
INLINE void values_q(const float *const *pp, v16 *const *aa, idx c, const float *const *vr, idx j0, idx j1,
                     idx J, idx ahead, __m256i m0, __m256i m1, const int Q, const int part) {
    __m256 a[2 * QV];
    for (int x = 0; x < Q; x++) {
        a[2 * x] = _mm256_loadu_ps((const float *)(aa[x] + c));
        a[2 * x + 1] = _mm256_loadu_ps((const float *)(aa[x] + c) + 8);
    }
    for (idx j = j0; j < j1; j++) {
        const float *v = vr[j] + c * LN;
        _mm_prefetch((const char *)(vr[j + ahead < J ? j + ahead : j] + c * LN), _MM_HINT_T0);
        __m256 v0 = part ? _mm256_maskload_ps(v, m0) : _mm256_loadu_ps(v);
        __m256 v1 = part ? _mm256_maskload_ps(v + 8, m1) : _mm256_loadu_ps(v + 8);
        for (int x = 0; x < Q; x++) {
            __m256 w = _mm256_broadcast_ss(pp[x] + j);
            a[2 * x] = _mm256_fmadd_ps(w, v0, a[2 * x]);
            a[2 * x + 1] = _mm256_fmadd_ps(w, v1, a[2 * x + 1]);
        }
    }
    for (int x = 0; x < Q; x++) {
        _mm256_storeu_ps((float *)(aa[x] + c), a[2 * x]);
        _mm256_storeu_ps((float *)(aa[x] + c) + 8, a[2 * x + 1]);
    }
}

#define VALUES_Q(Q, part) values_q(ps + u, acc + u, c, vr, j0, j1, J, JB, m0, m1, Q, part)
/* acc[u][c] = acc[u][c] + p[u][j] * v_j[c] for j in 0..J (value rows vr[j]), u in 0..U, the chunks c of d: per
   (u, lane) a chain over j in order. The value rows in j-blocks that stay in L1 while every query block reads
   them (the chains resume where the last block left them). */
static void values(const float *const *ps, v16 *const *acc, idx U, const float *const *vr, idx J, idx d,
                   const float *zeros) {
    idx dc = (d + LN - 1) / LN, JB = VBYTES / (d * (idx)sizeof(float)), size[RB * 64];
    idx count = blocks_of(U, QV, size);
    if (JB < 16) JB = 16;
    (void)zeros;
    for (idx j0 = 0; j0 < J; j0 += JB) {
        idx j1 = J - j0 < JB ? J : j0 + JB, u = 0;
        for (idx b = 0; b < count; u += size[b++])
            for (idx c = 0; c < dc; c++) {
                idx nn = d - c * LN < LN ? d - c * LN : LN;
                __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nn), lane);
                __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nn - 8), lane);
                if (nn == LN) {
                    switch (size[b]) {
                    case 1: VALUES_Q(1, 0); break;
                    case 2: VALUES_Q(2, 0); break;
                    case 3: VALUES_Q(3, 0); break;
                    default: VALUES_Q(4, 0); break;
                    }
                } else {
                    switch (size[b]) {
                    case 1: VALUES_Q(1, 1); break;
                    case 2: VALUES_Q(2, 1); break;
                    case 3: VALUES_Q(3, 1); break;
                    default: VALUES_Q(4, 1); break;
                    }
                }
            }
    }
}
#undef VALUES_Q

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
INLINE v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }
DEFINE_VEXP(vexp8, v8, v8i, splat8)

/* s[0..L) = exp(s_j - m), m their exact maximum (the lanes up to the next 16 zeros); their sum in 16 lanes by
   j mod 16 (lanes 0..8 and 8..16 a register each), then the lanes pairwise */
static float weights(float *s, idx L) {
    __m256 m0 = _mm256_set1_ps(s[0]), m1 = m0;  /* the maximum: exact in any order */
    idx j = 0;
    for (; j + LN <= L; j += LN) {  /* x > m ? x : m */
        m0 = _mm256_max_ps(_mm256_loadu_ps(s + j), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(s + j + 8), m1);
    }
    float m = s[0], t[LN];
    _mm256_storeu_ps(t, m0);
    _mm256_storeu_ps(t + 8, m1);
    for (int x = 0; x < LN; x++) if (t[x] > m) m = t[x];
    for (; j < L; j++) if (s[j] > m) m = s[j];
    idx Lr = (L + LN - 1) / LN * LN, j0 = 0;
    for (idx j = L; j < Lr; j++) s[j] = m;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (; j0 < Lr; j0 += LN) {  /* the weights of the lanes past L are zeros: stored and added as such */
        v8 x0, x1;
        memcpy(&x0, s + j0, sizeof x0);
        memcpy(&x1, s + j0 + 8, sizeof x1);
        x0 = vexp8(x0 - m);
        x1 = vexp8(x1 - m);
        if (j0 + LN > L) {
            __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            __m256i k0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(L - j0)), lane);
            __m256i k1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(L - j0 - 8)), lane);
            x0 = (v8)_mm256_and_ps((__m256)x0, _mm256_castsi256_ps(k0));
            x1 = (v8)_mm256_and_ps((__m256)x1, _mm256_castsi256_ps(k1));
        }
        memcpy(s + j0, &x0, sizeof x0);
        memcpy(s + j0 + 8, &x1, sizeof x1);
        a0 = _mm256_add_ps(a0, (__m256)x0);
        a1 = _mm256_add_ps(a1, (__m256)x1);
    }
    _mm256_storeu_ps(t, a0);
    _mm256_storeu_ps(t + 8, a1);
    return lanesum(ld(t));
}

/* o[0..d) = the accumulators' lanes a[0..) divided by the sum */
static void divided(float *o, const v16 *a, float sum, idx d) {
    const float *f = (const float *)a;
    __m256 s = _mm256_set1_ps(sum);
    idx e = 0;
    for (; e + 8 <= d; e += 8) _mm256_storeu_ps(o + e, _mm256_div_ps(_mm256_loadu_ps(f + e), s));
    for (; e < d; e++) o[e] = f[e] / sum;
}
#else
#define KAHEAD 4  /* key blocks of 16 rows a transpose prefetches ahead (the hardware's own prefetch alone left the
                     one-row call waiting on the keys: docs/LOG.md) */
/* kt [d][16] = the rows rp[0..16) transposed (lanes past c: scores never read); pure data movement, so no path
   changes a bit */
static const v16i LO = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
static const v16i HI = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
static void transpose(const float *const *rp, idx c, idx d, float *kt) {
    idx e0 = 0;
    if (d % LN == 0) {  /* the rows past c repeat row 0: their lanes' scores are never read */
        for (; e0 + LN <= d; e0 += LN) {  /* a 16 x 16 tile in four rounds of interleaving */
            v16 a[LN], b[LN];
            for (int i = 0; i < LN; i++) a[i] = ld(rp[i] + e0);
            for (int i = 0; i < LN; i++) fetch_ahead(rp[i] + e0, KAHEAD, d);
            for (int round = 0; round < 4; round++) {
                for (int i = 0; i < LN / 2; i++) {
                    b[2 * i] = __builtin_shuffle(a[i], a[i + LN / 2], LO);
                    b[2 * i + 1] = __builtin_shuffle(a[i], a[i + LN / 2], HI);
                }
                for (int i = 0; i < LN; i++) a[i] = b[i];
            }
            for (int i = 0; i < LN; i++) st(kt + (e0 + i) * LN, a[i]);
        }
    }
    for (idx jj = 0; jj < LN; jj++)
        for (idx e = e0; e < d; e++) kt[e * LN + jj] = jj < c ? rp[jj][e] : 0.0f;
    (void)c;
}

/* the scores of one transposed block of 16 keys for U queries qs[u], into dst[u][0..16): per key a chain over d,
   s = s + q[d] * k[d], then times the scale. Eight queries at a time (the missing ones a repeat whose result goes
   to a scratch row): independent chains, so the adds do not wait on each other. */
static void scores(const float *const *qs, float *const *dst, idx U, const float *kt, idx d, float scale) {
    float spare[LN];
    for (idx u = 0; u < U; u += 8) {
        const float *qq[8];
        float *dd[8];
        for (int x = 0; x < 8; x++) {
            qq[x] = u + x < U ? qs[u + x] : qs[u];
            dd[x] = u + x < U ? dst[u + x] : spare;
        }
        v16 a[8] = {{0}};
        for (idx e = 0; e < d; e++) {
            v16 kk = ld(kt + e * LN);
            for (int x = 0; x < 8; x++) a[x] = fma16(splat(qq[x][e]), kk, a[x]);
        }
        for (int x = 0; x < 8; x++) st(dd[x], a[x] * scale);
    }
}

/* acc[u][c] = acc[u][c] + p[u][j] * v_j[c] for j in 0..J (value rows vr[j]), u in 0..U, the chunks c of d: per
   (u, lane) a chain over j in order. Four queries by four chunks at a time (independent chains), the missing
   queries a zero weight row into a scratch accumulator. */
static void values(const float *const *ps, v16 *const *acc, idx U, const float *const *vr, idx J, idx d,
                   const float *zeros) {
    idx dc = (d + LN - 1) / LN, JB = VBYTES / (d * (idx)sizeof(float));
    v16 spare[DMAX / LN];
    if (JB < 16) JB = 16;
    /* the value rows in j-blocks that stay in L1 while every query reads them (each chain resumes where the last
       block left it: the same order); the first query block fetches the next j-block's rows meanwhile */
    for (idx j0 = 0; j0 < J; j0 += JB) {
        idx j1 = J - j0 < JB ? J : j0 + JB;
        for (idx u = 0; u < U; u += 4) {
            const float *pp[4];
            v16 *aa[4];
            for (int x = 0; x < 4; x++) {
                pp[x] = u + x < U ? ps[u + x] : zeros;
                aa[x] = u + x < U ? acc[u + x] : spare;
            }
            for (idx c = 0; c < dc; c += 4) {  /* four chunks (repeats of the last past d: computed, not kept) */
                idx cc[4], nn[4];
                for (int y = 0; y < 4; y++) {
                    cc[y] = c + y < dc ? c + y : dc - 1;
                    nn[y] = d - cc[y] * LN < LN ? d - cc[y] * LN : LN;
                }
                v16 a[16];
                for (int x = 0; x < 4; x++)
                    for (int y = 0; y < 4; y++) a[4 * x + y] = aa[x][cc[y]];
                if (nn[0] == LN && nn[1] == LN && nn[2] == LN && nn[3] == LN) {
                    for (idx j = j0; j < j1; j++) {
                        if (u == 0 && j + JB < J) fetch_row(vr[j + JB] + cc[0] * LN, 4 * LN);
                        v16 v0 = ld(vr[j] + cc[0] * LN), v1 = ld(vr[j] + cc[1] * LN), v2 = ld(vr[j] + cc[2] * LN),
                            v3 = ld(vr[j] + cc[3] * LN);
                        for (int x = 0; x < 4; x++) {
                            v16 w = splat(pp[x][j]);
                            a[4 * x] = fma16(w, v0, a[4 * x]);
                            a[4 * x + 1] = fma16(w, v1, a[4 * x + 1]);
                            a[4 * x + 2] = fma16(w, v2, a[4 * x + 2]);
                            a[4 * x + 3] = fma16(w, v3, a[4 * x + 3]);
                        }
                    }
                } else {
                    for (idx j = j0; j < j1; j++) {
                        v16 vv[4];
                        for (int y = 0; y < 4; y++) vv[y] = ldn(vr[j] + cc[y] * LN, nn[y]);
                        for (int x = 0; x < 4; x++) {
                            v16 w = splat(pp[x][j]);
                            for (int y = 0; y < 4; y++) a[4 * x + y] = fma16(w, vv[y], a[4 * x + y]);
                        }
                    }
                }
                for (int x = 0; x < 4; x++)
                    for (int y = 3; y >= 0; y--) aa[x][cc[y]] = a[4 * x + y];
            }
        }
    }
}

/* s[0..L) = exp(s_j - m), m their exact maximum (the lanes up to the next 16 zeros); their sum in 16 lanes by
   j mod 16, then the lanes pairwise */
static float weights(float *s, idx L) {
    v16 mv = splat(s[0]);  /* the maximum: exact in any order */
    idx j = 0;
    for (; j + LN <= L; j += LN) {
        v16 x = ld(s + j);
        v16i more = x > mv;
        mv = (v16)((more & (v16i)x) | (~more & (v16i)mv));
    }
    float m = s[0], t[LN];
    st(t, mv);
    for (int x = 0; x < LN; x++) if (t[x] > m) m = t[x];
    for (; j < L; j++) if (s[j] > m) m = s[j];
    idx Lr = (L + LN - 1) / LN * LN;
    for (idx j = L; j < Lr; j++) s[j] = m;
    v16 a = {0};
    for (idx j0 = 0; j0 < Lr; j0 += LN) st(s + j0, vexp(ld(s + j0) - m));
    for (idx j = L; j < Lr; j++) s[j] = 0.0f;
    for (idx j0 = 0; j0 < Lr; j0 += LN) a = a + ld(s + j0);
    return lanesum(a);
}

/* o[0..d) = the accumulators' chunks a[0..) divided by the sum */
static void divided(float *o, const v16 *a, float sum, idx d) {
    for (idx c = 0; c * LN < d; c++) {
        idx cnt = d - c * LN < LN ? d - c * LN : LN;
        stn(o + c * LN, a[c] / splat(sum), cnt);
    }
}
#endif

static void task(const float *q, idx n, idx hq, idx d, idx G, idx g, idx r0, idx rows,
                 const float *K, const float *V, idx P, const int32_t *tl, const int32_t *tlen, idx W,
                 float scale, float *out, float *sc, idx Ls, float *kt, v16 *A, const float **vr, const float *zeros) {
    idx U = rows * G, dc = (d + LN - 1) / LN;
    const float *qs[RB * 64], *rp[LN], *ps[RB * 64];
    float *dst[RB * 64];
    v16 *acc[RB * 64];
    for (idx u = 0; u < U; u++) qs[u] = q + ((g * G + u % G) * n + r0 + u / G) * d;
    /* shared keys: one transposed block for every query of the task */
    for (idx j0 = 0; j0 < P; j0 += LN) {
        idx c = P - j0 < LN ? P - j0 : LN;
        for (idx jj = 0; jj < LN; jj++) rp[jj] = K + (j0 + (jj < c ? jj : 0)) * d;
        transpose(rp, c, d, kt);
        for (idx u = 0; u < U; u++) dst[u] = sc + u * Ls + j0;
        scores(qs, dst, U, kt, d, scale);
    }
    /* each row's tail, after the shared part in its list */
    for (idx r = 0; r < rows; r++) {
        idx i = r0 + r, T = tlen[i];
        for (idx t0 = 0; t0 < T; t0 += LN) {
            idx c = T - t0 < LN ? T - t0 : LN;
            for (idx jj = 0; jj < LN; jj++) rp[jj] = K + (idx)tl[i * W + t0 + (jj < c ? jj : 0)] * d;
            transpose(rp, c, d, kt);
            for (idx x = 0; x < G; x++) dst[x] = sc + (r * G + x) * Ls + P + t0;
            scores(qs + r * G, dst, G, kt, d, scale);
        }
    }
    /* softmax weights (unnormalised) and their sums */
    float sums[RB * 64];
    for (idx u = 0; u < U; u++) sums[u] = weights(sc + u * Ls, P + tlen[r0 + u / G]);
    /* values: the shared rows for every query of the task, then each row's tail */
    for (idx x = 0; x < U * dc; x++) A[x] = (v16){0};
    for (idx u = 0; u < U; u++) { ps[u] = sc + u * Ls; acc[u] = A + u * dc; }
    for (idx j = 0; j < P; j++) vr[j] = V + j * d;
    values(ps, acc, U, vr, P, d, zeros);
    for (idx r = 0; r < rows; r++) {
        idx i = r0 + r, T = tlen[i];
        for (idx t = 0; t < T; t++) vr[t] = V + (idx)tl[i * W + t] * d;
        for (idx x = 0; x < G; x++) ps[x] = sc + (r * G + x) * Ls + P;
        values(ps, acc + r * G, G, vr, T, d, zeros);
    }
    for (idx u = 0; u < U; u++) {
        idx i = r0 + u / G, h = g * G + u % G;
        divided(out + (i * hq + h) * d, A + u * dc, sums[u], d);
    }
}

/* a x b x c <= have, without overflow (every factor >= 0) */
static int fits(idx a, idx b, idx c, idx have) {
    idx ab, abc;
    return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, &abc) && abc <= have;
}

/* out [n, hq, d] from q [hq, n, d] and the caches k, v [hkv][rows of d] (`hs` floats between heads): row i's keys
   are cache rows 0..P-1, then P + c for each column c of mask row i [W, row stride ms] that is 0 (mask NULL: no
   tail). qn, kvn (each of k and v), maskn, outn: the floats each buffer holds from its pointer on, checked before
   anything is read. 0; -1 when scratch memory could not be had; -2 for a shape it does not take (more than 64
   query heads a key head, heads over DMAX wide, a row with no keys); -3 for sizes that do not fit the buffers. */
int row_attn(const float *q, idx qn, idx n, idx hq, idx hkv, idx d, const float *k, const float *v, idx kvn,
             idx hs, idx P, const float *mask, idx maskn, idx W, idx ms, float scale, float *out, idx outn,
             int threads) {
    if (!mask) W = 0, ms = 0, maskn = 0;
    if (n <= 0 || hq <= 0 || P < 0 || W < 0 || ms < 0 || hs < 0 || P > INT32_MAX - W || n > INT32_MAX)
        return -3;
    if (hkv <= 0 || hq % hkv || hq / hkv > 64 || d <= 0 || d > DMAX) return -2;
    /* q and out: n x hq x d; each cache head g reads rows 0..P+W-1 from g x hs on; mask row i: W from i x ms on */
    if (!q || !k || !v || !out || !fits(n, hq, d, qn) || !fits(n, hq, d, outn) || !fits(P + W, d, 1, kvn)
        || !fits(hkv - 1, hs, 1, kvn - (P + W) * d) || (W && (maskn < W || !fits(n - 1, ms, 1, maskn - W))))
        return -3;
    int32_t *tl = malloc(sizeof(int32_t) * (size_t)(n * W) + 4), *tlen = malloc(sizeof(int32_t) * (size_t)n + 4);
    if (!tl || !tlen) { free(tl); free(tlen); return -1; }
    idx Tmax = 0;
    for (idx i = 0; i < n; i++) {
        idx T = 0;
        for (idx c = 0; c < W; c++) if (mask[i * ms + c] == 0.0f) tl[i * W + T++] = (int32_t)(P + c);
        tlen[i] = (int32_t)T;
        if (P + T == 0) { free(tl); free(tlen); return -2; }
        if (T > Tmax) Tmax = T;
    }
    idx G = hq / hkv, blocks = (n + RB - 1) / RB, tasks = hkv * blocks, dc = (d + LN - 1) / LN;
    /* every task's scratch fits the largest: a score row of Lmax >= Ls (a task's own row stride, P + its longest
       tail, rounded up, and one more vector), up to RB rows x G heads of them; vr and zeros take Lmax >= P, T */
    idx Lmax = (P + Tmax + LN - 1) / LN * LN + LN, U = (n < RB ? n : RB) * G;
    int failed = 0;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads > 1 ? threads : 1) if (threads > 1 && tasks > 1)
#endif
    {
        float *kt = malloc(sizeof(float) * (size_t)(d * LN) + 4);
        v16 *A = aligned_alloc(64, sizeof(v16) * (size_t)(RB * G * dc));
        float *sc = malloc(sizeof(float) * (size_t)(Lmax * U) + 4), *zeros = calloc((size_t)Lmax, sizeof(float));
        const float **vr = malloc(sizeof(float *) * (size_t)Lmax);
        if (!kt || !A || !sc || !zeros || !vr) failed = 1;
#ifdef _OPENMP
        #pragma omp for schedule(dynamic)
#endif
        for (idx x = 0; x < tasks; x++) {
            if (failed) continue;
            idx g = x / blocks, r0 = (x % blocks) * RB, rows = n - r0 < RB ? n - r0 : RB, T = 0;
            for (idx r = 0; r < rows; r++) if (tlen[r0 + r] > T) T = tlen[r0 + r];
            idx Ls = (P + T + LN - 1) / LN * LN + LN;
            task(q, n, hq, d, G, g, r0, rows, k + g * hs, v + g * hs, P, tl, tlen, W, scale, out, sc, Ls, kt, A,
                 vr, zeros);
        }
        free(sc); free(zeros); free(vr); free(kt); free(A);
    }
    free(tl); free(tlen);
    return failed ? -1 : 0;
}

int row_attn_threaded(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
