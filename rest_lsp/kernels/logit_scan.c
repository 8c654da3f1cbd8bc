#include <math.h>
#include <stdint.h>
#include <string.h>

typedef long long idx;
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#define LN 16   /* lanes */
#define KMAX 64 /* the most tokens a row's top takes */
#define SUMBLOCK 64 /* vectors a float partial sum of the normaliser takes before it is added in double */
#define INLINE static inline __attribute__((always_inline))

INLINE v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
INLINE v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
INLINE int any(v16i m) {
    int32_t t[LN];
    memcpy(t, &m, sizeof t);
    int32_t a = 0;
    for (int i = 0; i < LN; i++) a |= t[i];
    return a != 0;
}

/* exp(x) for x <= 0, to a few units in the last place (x below the clamp gives a tiny normal number): 2^k by the
   exponent bits times a degree-six polynomial of the remainder; a probability's drafting weight needs no more */
INLINE v16 vexp_neg(v16 x) {
    const v16 lo = splat(-87.0f);
    v16i below = x < lo;
    x = (v16)((below & (v16i)lo) | (~below & (v16i)x));
    v16 kf = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  /* round(x / ln 2) */
    v16 r = (x - kf * 0.693359375f) - kf * -2.12194440e-4f;    /* x - k ln 2, in two parts */
    v16 p = splat(1.3888889e-3f);
    p = p * r + 8.3333338e-3f;
    p = p * r + 4.1666668e-2f;
    p = p * r + 1.6666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    v16i k = __builtin_convertvector(kf, v16i);
    return p * (v16)((k + 127) << 23);
}

/* (value, index) into the top list val/ids of *count <= k entries, largest first and, among equal values, the
   smaller index first (indices arrive in increasing order, so an equal value goes after those already kept) */
INLINE void keep(float *val, int32_t *ids, int *count, int k, float x, int32_t i) {
    int at = *count < k ? *count : k - 1;
    if (*count == k && !(x > val[k - 1])) return;
    while (at > 0 && val[at - 1] < x) {
        val[at] = val[at - 1];
        ids[at] = ids[at - 1];
        at--;
    }
    val[at] = x;
    ids[at] = i;
    if (*count < k) (*count)++;
}

/* one row x[0..v): its k largest values and their indices (torch.argmax's index first: the first of the largest);
   with `lse`, log(sum exp(x)) by the largest. 1 where the row holds a NaN or its largest value is not finite (the
   caller computes such a row otherwise), else 0. */
static int scan_row(const float *x, idx v, int k, int lse, int32_t *ids, float *probs) {
    float val[KMAX];
    int count = 0;
    v16i nan = {0};
    idx j = 0;
    for (; j + 4 * LN <= v; j += 4 * LN) {  /* blocks of 4 vectors: a block with no value above the top's least
                                               is passed over at one test */
        v16 c0 = ld(x + j), c1 = ld(x + j + LN), c2 = ld(x + j + 2 * LN), c3 = ld(x + j + 3 * LN);
        nan |= (c0 != c0) | (c1 != c1) | (c2 != c2) | (c3 != c3);
        v16 least = splat(count < k ? -INFINITY : val[k - 1]);
        if (count < k || any((c0 > least) | (c1 > least) | (c2 > least) | (c3 > least)))
            for (int l = 0; l < 4 * LN; l++) keep(val, ids, &count, k, x[j + l], (int32_t)(j + l));
    }
    int tail_nan = 0;
    for (; j < v; j++) {
        tail_nan |= x[j] != x[j];
        keep(val, ids, &count, k, x[j], (int32_t)j);
    }
    if (any(nan) || tail_nan || count < k || !isfinite(val[0])) return 1;
    if (!lse) {
        for (int i = 0; i < k; i++) probs[i] = val[i];
        return 0;
    }
    const float m = val[0];
    double lanes[LN] = {0}, sum = 0.0;  /* a block's sums in float lanes, the blocks' in double */
    for (j = 0; j + LN <= v;) {
        v16 s = splat(0.0f);
        for (idx end = j + SUMBLOCK * LN; j + LN <= v && j < end; j += LN) s += vexp_neg(ld(x + j) - m);
        float t[LN];
        memcpy(t, &s, sizeof t);
        for (int l = 0; l < LN; l++) lanes[l] += t[l];
    }
    for (int l = 0; l < LN; l++) sum += lanes[l];
    for (; j < v; j++) sum += exp((double)x[j] - m);
    double log_sum = m + log(sum);
    for (int i = 0; i < k; i++) probs[i] = (float)exp((double)val[i] - log_sum);
    return 0;
}

/* rows x [n][v] at `stride` floats apart (xn: the floats x holds from its pointer on): per row its k largest
   logits' indices ids [n][k], largest first, the first of equal values first, and in probs [n][k] their softmax
   probabilities (`lse` 1) or the values themselves (`lse` 0). The number of rows that hold a NaN or whose largest
   value is not finite (their outputs undefined: the caller computes those rows otherwise); -2 for k outside
   1..KMAX or over v; -3 for sizes that do not fit the buffers (idsn, probsn: the elements each holds). */
int logit_scan(const float *x, idx n, idx v, idx stride, idx xn, int k, int lse, int32_t *ids, idx idsn,
               float *probs, idx probsn) {
    if (n < 0 || v <= 0 || v > INT32_MAX || stride < v || !x || !ids || !probs) return -3;
    if (k < 1 || k > KMAX || k > v) return -2;
    if (n && (xn < v || (n - 1) > (xn - v) / stride || n > idsn / k || n > probsn / k)) return -3;
    int odd = 0;
    for (idx i = 0; i < n; i++) odd += scan_row(x + i * stride, v, k, lse, ids + i * k, probs + i * k);
    return odd;
}
