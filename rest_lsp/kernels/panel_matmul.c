#include <stddef.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef long long idx; /* 64 bits everywhere (a head is 49152 x 576 x rows) */

#define NB 16 /* columns per panel */
#define MT 6  /* rows per tile: 6 x 2 vectors of sums, with the 2 weight vectors and a broadcast, fill 16 registers */

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 r; memcpy(&r, p, sizeof r); return r; }

/* rows x[0..R) (stride ldx) times one panel p [k][NB]; out [R][NB] gets the sums. `next`: the panel that comes
   after this one, of which this tile prefetches lines [first, first + k / tiles) (one 64-byte line per k), one
   every `tiles` steps: over the panel's tiles the whole next panel arrives, evenly, while this one is computed */
#define TILE(R)                                                                                              \
static void tile##R(const float *restrict x, idx ldx, const float *restrict p, idx k,                     \
                    const float *restrict next, idx first, idx tiles, float *restrict out) {              \
    v8 lo[R], hi[R];                                                                                         \
    for (int i = 0; i < R; i++) { lo[i] = (v8){0}; hi[i] = (v8){0}; }                                        \
    idx wait = tiles, line = first;                                                                         \
    for (idx j = 0; j < k; j++) {                                                                           \
        v8 w0 = load8(p + j * NB), w1 = load8(p + j * NB + 8);                                               \
        if (next && --wait == 0) { wait = tiles; __builtin_prefetch(next + line++ * NB, 0, 3); }             \
        _Pragma("GCC unroll 8")                                                                              \
        for (int i = 0; i < R; i++) {                                                                        \
            float s = x[i * ldx + j];                                                                        \
            v8 b = {s, s, s, s, s, s, s, s};                                                                 \
            lo[i] += b * w0;                                                                                 \
            hi[i] += b * w1;                                                                                 \
        }                                                                                                    \
    }                                                                                                        \
    for (int i = 0; i < R; i++) { memcpy(out + i * NB, &lo[i], 32); memcpy(out + i * NB + 8, &hi[i], 32); }   \
}
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

typedef void (*tile_fn)(const float *, idx, const float *, idx, const float *, idx, idx, float *);
static const tile_fn tiles[MT + 1] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

static void panels(const float *x, idx m, idx k, const float *p, idx n, const float *bias, float *y,
                   idx first, idx last) {
    float out[MT * NB];
    for (idx q = first; q < last; q++) {
        const float *pq = p + q * k * NB;
        const float *next = q + 1 < last ? pq + k * NB : NULL;
        idx c0 = q * NB, cols = n - c0 < NB ? n - c0 : NB;
        idx count = (m + MT - 1) / MT;
        for (idx t = 0, m0 = 0; m0 < m; m0 += MT, t++) {
            idx r = m - m0 < MT ? m - m0 : MT;
            tiles[r](x + m0 * k, k, pq, k, next, t * k / count, count, out);
            for (idx i = 0; i < r; i++) {
                float *row = y + (m0 + i) * n + c0;
                for (idx c = 0; c < cols; c++) row[c] = bias ? out[i * NB + c] + bias[c0 + c] : out[i * NB + c];
            }
        }
    }
}

/* a x b <= have, without overflow (a, b >= 0) */
static int fits(idx a, idx b, idx have) {
    idx ab;
    return !__builtin_mul_overflow(a, b, &ab) && ab <= have;
}

/* y [m, n] = x [m, k] @ w.T + bias, w given as panels [ceil(n / NB)][k][NB]; bias may be NULL; on `threads`
   threads (torch's setting: an OpenMP thread's own default may differ). xn, pn, bn, yn: the floats each buffer
   holds from its pointer on, checked before anything is read. 0; -3 for sizes that do not fit the buffers */
int panel_mm(const float *x, idx xn, idx m, idx k, const float *p, idx pn, idx n, const float *bias, idx bn,
             float *y, idx yn, int threads) {
    if (m < 0 || k < 0 || n < 0 || m > 0x7fffffff || k > 0x7fffffff || n > 0x7fffffff) return -3;
    idx count = (n + NB - 1) / NB;
    if ((m && (!x || !y)) || !fits(m, k, xn) || !fits(m, n, yn) || !fits(count * NB, k, pn) || (count && k && !p)
        || (bias && bn < n)) return -3;
    if (m == 0 || n == 0) return 0;
#ifdef _OPENMP
    int wide = (double)m * (double)k * (double)n >= 65536.0; /* in doubles: the product may pass 2^63 */
    #pragma omp parallel num_threads(threads > 1 ? threads : 1) if (threads > 1 && count > 1 && wide)
    {
        idx t = omp_get_thread_num(), T = omp_get_num_threads();
        panels(x, m, k, p, n, bias, y, count * t / T, count * (t + 1) / T);
    }
#else
    (void)threads;
    panels(x, m, k, p, n, bias, y, 0, count);
#endif
    return 0;
}

/* 1 where the panels are split across OpenMP threads, 0 where this build has one thread */
int panel_threaded(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

