/* The decode step's attention (decode_step.c's header): a work item's query heads over their
   sequence's cached tokens in the paged K/V pool, softmax(q K^T) V a block of the table at a time
   (online softmax), each head in one thread with its own arithmetic in a fixed order: float32
   products, or with a bf16 model and pool on an AVX512-BF16 CPU bf16 products (PG_BF16_DOTS). */

#include "pagoda_kernels.h"

#include <stdlib.h>

#if defined(PG_NATIVE)
#if !defined(__AVX512F__)
/* pg_exp on 8 lanes, the same operations in the same order per lane (the same bits). */
static inline __m256 pg_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.3f);
    x = _mm256_blendv_ps(x, lo, _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    x = _mm256_blendv_ps(x, hi, _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    f = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), f);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, f), f, f), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}
#endif

/* One K or V row [D] of the pool as float32: the row itself (float32 pool) or widened into buf. */
static inline __attribute__((always_inline)) const float *kv_row(const char *p, int bf16, float *buf,
                                                                  const int64_t D) {
    if (!bf16) return (const float *)p;
    const uint16_t *b = (const uint16_t *)p;
#pragma omp simd
    for (int64_t i = 0; i < D; i++) buf[i] = bf16_to_f32(b[i]);
    return buf;
}

/* q . k over D (a multiple of PG_LANES, or not) in PG_LANES partial sums, added pairwise at the
   end: a simd reduction's lanes were added one after another, a chain of 16 dependent adds per
   token that bound attention. */
#define PG_LANES 16
static inline __attribute__((always_inline)) float dot(const float *q, const float *k, const int64_t D) {
    float part[PG_LANES] = {0.0f};
    int64_t i = 0;
    for (; i + PG_LANES <= D; i += PG_LANES) {
#pragma omp simd
        for (int64_t l = 0; l < PG_LANES; l++) part[l] = fmaf(q[i + l], k[i + l], part[l]);
    }
    for (int64_t l = 0; i < D; i++, l++) part[l] = fmaf(q[i], k[i], part[l]);
    for (int64_t w = PG_LANES / 2; w > 0; w /= 2) {
#pragma omp simd
        for (int64_t l = 0; l < w; l++) part[l] += part[l + w];
    }
    return part[0];
}

#if defined(__AVX512F__)
/* The 16 tokens' dots from their part vectors, slot sigma(j) holding token j's (see scores16): each
   token's lanes added in dot()'s own pairs (lane l with l + 8, l + 4, l + 2, l + 1), lanes
   exchanged between the vectors so that every addition serves 16 tokens. */
static inline __attribute__((always_inline)) __m512 lane_sums16(const __m512 *p) {
    __m512 a[8], b[4], c[2];
    for (int t = 0; t < 8; t++) /* [lanes 0-7 of slot t + lanes 8-15 | the same of slot t + 8] */
        a[t] = _mm512_add_ps(_mm512_shuffle_f32x4(p[t], p[t + 8], 0x44),
                             _mm512_shuffle_f32x4(p[t], p[t + 8], 0xee));
    for (int t = 0; t < 4; t++) /* quarters: lanes 0-3 + 4-7 of slots t, t + 8, t + 4, t + 12 */
        b[t] = _mm512_add_ps(_mm512_shuffle_f32x4(a[t], a[t + 4], 0x88),
                             _mm512_shuffle_f32x4(a[t], a[t + 4], 0xdd));
    for (int t = 0; t < 2; t++) /* within each quarter: lanes 0-1 + 2-3 */
        c[t] = _mm512_add_ps(_mm512_shuffle_ps(b[t], b[t + 2], 0x44),
                             _mm512_shuffle_ps(b[t], b[t + 2], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xdd));
}

/* scores[g * bs + j] = dot(q_g, k_j) for the n (at most 16) K rows from kb (row stride rstride
   bytes), each dot's 16 partial sums formed as dot() forms them and then added in dot()'s own
   pairs (lane l with l + 8, l + 4, l + 2, l + 1) for 16 tokens at once: lanes of 16 part vectors
   are exchanged so every addition serves 16 lanes, instead of a horizontal sum per token (most of
   attention's instructions, measured). The same bits as dot(); D a multiple of 16. */
static inline __attribute__((always_inline)) void scores16(const float *q, int64_t nh, const char *kb,
                                                           int64_t rstride, int bf16, int64_t n,
                                                           float *scores, int64_t bs, const int64_t D) {
    /* token j's part vector goes to slot sigma(j): the exchanges below put slot sigma(l) at lane l */
    static const int sigma[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
    __m512 part[PG_MAX_GROUP][16];
    for (int64_t j = 0; j < 16; j++) {
        __m512 k[512 / 16];
        if (j < n) {
            for (int64_t c = 0; c < D / 16; c++) {
                const char *src = kb + j * rstride + c * 16 * (bf16 ? 2 : 4);
                k[c] = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                  _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src)), 16))
                            : _mm512_loadu_ps((const float *)src);
            }
        }
        for (int64_t g = 0; g < nh; g++) {
            __m512 acc = _mm512_setzero_ps();
            if (j < n)
                for (int64_t c = 0; c < D / 16; c++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + c * 16), k[c], acc);
            part[g][sigma[j]] = acc;
        }
    }
    const __mmask16 keep = (__mmask16)((1u << n) - 1u);
    for (int64_t g = 0; g < nh; g++) _mm512_mask_storeu_ps(scores + g * bs, keep, lane_sums16(part[g]));
}
#else
/* AVX2: scores[g * bs + j] = dot(q_g, k_j) for the n (at most 8) K rows from kb, 8 tokens at
   once: each dot's 16 partial sums formed as dot() forms them (two 8-lane FMA chains, chunks of 8
   alternating between them), then added in dot()'s own pairs (lane l with l + 8, l + 4, l + 2,
   l + 1) by exchanging lanes between the 8 tokens' vectors, so each addition serves 8 tokens
   instead of a horizontal sum per token and head. The same bits as dot(); D a multiple of 16. */
static inline __attribute__((always_inline)) void scores8(const float *q, int64_t nh, const char *kb,
                                                          int64_t rstride, int bf16, int64_t n,
                                                          float *scores, int64_t bs, const int64_t D) {
    __m256 a[PG_MAX_GROUP][8]; /* [head][token]: part[l] + part[l + 8] */
    for (int64_t j = 0; j < 8; j++) {
        if (j >= n) {
            for (int64_t g = 0; g < nh; g++) a[g][j] = _mm256_setzero_ps();
            continue;
        }
        const char *src = kb + j * rstride;
        __m256 k[512 / 8];
        for (int64_t c = 0; c < D / 8; c++) k[c] = load8(src + c * 8 * (bf16 ? 2 : 4), bf16);
        for (int64_t g = 0; g < nh; g++) {
            __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
            for (int64_t c = 0; c < D / 8; c += 2) {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + c * 8), k[c], s0);
                s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + c * 8 + 8), k[c + 1], s1);
            }
            a[g][j] = _mm256_add_ps(s0, s1);
        }
    }
    for (int64_t g = 0; g < nh; g++) {
        const __m256 *p = a[g];
        __m256 x[4], y[2];
        for (int t = 0; t < 4; t++) /* [l + (l + 4) of token t | the same of token t + 4] */
            x[t] = _mm256_add_ps(_mm256_permute2f128_ps(p[t], p[t + 4], 0x20),
                                 _mm256_permute2f128_ps(p[t], p[t + 4], 0x31));
        for (int t = 0; t < 2; t++) /* within each half: lanes 0-1 + 2-3 of tokens 2t, 2t + 1 */
            y[t] = _mm256_add_ps(_mm256_shuffle_ps(x[2 * t], x[2 * t + 1], 0x44),
                                 _mm256_shuffle_ps(x[2 * t], x[2 * t + 1], 0xee));
        /* lanes 0 + 1: tokens 0-3 in the low half, 4-7 in the high */
        const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], 0x88),
                                         _mm256_shuffle_ps(y[0], y[1], 0xdd));
        if (n == 8) _mm256_storeu_ps(scores + g * bs, sum);
        else {
            float tmp[8];
            _mm256_storeu_ps(tmp, sum);
            for (int64_t j = 0; j < n; j++) scores[g * bs + j] = tmp[j];
        }
    }
}
#endif

#if !defined(__AVX512F__)
/* acc [nh, D] += p [nh, bs] times the block's n V rows from vb (row stride rbytes), 16 columns at a
   time held in registers over the block (through memory, the accumulators were a load and a store
   per 8 columns, token and head). Each element's sum runs over the tokens in order, as before. */
static inline __attribute__((always_inline)) void accumulate_v(float *acc, const float *p, int64_t bs,
                                                               const int nh, const char *vb, int64_t rbytes,
                                                               int bf16, int64_t n, const int64_t D) {
    for (int64_t c = 0; c < D; c += 16) {
        __m256 a0[PG_MAX_GROUP], a1[PG_MAX_GROUP];
        for (int g = 0; g < nh; g++) {
            a0[g] = _mm256_loadu_ps(acc + g * D + c);
            a1[g] = _mm256_loadu_ps(acc + g * D + c + 8);
        }
        const char *vc = vb + c * (bf16 ? 2 : 4);
        for (int64_t j = 0; j < n; j++) {
            const __m256 v0 = load8(vc + j * rbytes, bf16), v1 = load8(vc + j * rbytes + 8 * (bf16 ? 2 : 4), bf16);
            for (int g = 0; g < nh; g++) {
                const __m256 pj = _mm256_broadcast_ss(p + g * bs + j);
                a0[g] = _mm256_fmadd_ps(pj, v0, a0[g]);
                a1[g] = _mm256_fmadd_ps(pj, v1, a1[g]);
            }
        }
        for (int g = 0; g < nh; g++) {
            _mm256_storeu_ps(acc + g * D + c, a0[g]);
            _mm256_storeu_ps(acc + g * D + c + 8, a1[g]);
        }
    }
}
#endif
#if defined(__AVX512F__)
/* acc [nh, D] += p [nh, bs] times the block's n V rows from vb (row stride rbytes), 64 columns (four
   vectors) a pass held in registers over the block, as accumulate_v does with AVX2 (through memory
   the accumulators were a load and a store per 16 columns, token and head: a long prefill's rows
   spent most of attention there). Each element's sum runs over the tokens in order, one fused
   multiply-add each, as before: the same bits. D a multiple of 16. */
static inline __attribute__((always_inline)) void accumulate_v16(float *acc, const float *p, int64_t bs,
                                                                 const int nh, const char *vb, int64_t rbytes,
                                                                 int bf16, int64_t n, const int64_t D) {
    const int64_t esize = bf16 ? 2 : 4;
    for (int64_t c = 0; c < D; c += 64) {
        const int64_t w = D - c < 64 ? (D - c) / 16 : 4; /* vectors in this pass */
        __m512 a[4][4];
        for (int g = 0; g < nh; g++)
            for (int64_t u = 0; u < w; u++) a[g][u] = _mm512_loadu_ps(acc + g * D + c + 16 * u);
        const char *vc = vb + c * esize;
        for (int64_t j = 0; j < n; j++) {
            __m512 v[4];
            for (int64_t u = 0; u < w; u++) {
                const char *src = vc + j * rbytes + 16 * u * esize;
                v[u] = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                  _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src)), 16))
                            : _mm512_loadu_ps((const float *)src);
            }
            for (int g = 0; g < nh; g++) {
                const __m512 pj = _mm512_set1_ps(p[g * bs + j]);
                for (int64_t u = 0; u < w; u++) a[g][u] = _mm512_fmadd_ps(pj, v[u], a[g][u]);
            }
        }
        for (int g = 0; g < nh; g++)
            for (int64_t u = 0; u < w; u++) _mm512_storeu_ps(acc + g * D + c + 16 * u, a[g][u]);
    }
}
#endif

/* The online softmax's step over one block for each of heads heads: the block's maximum (what came
   before rescaled when it is higher), scores turned into exp(score - max) in place, and their sum
   added to total. The block's first skip tokens are masked (before a sliding window): p 0. */
static inline __attribute__((always_inline)) void softmax_block(float *scores, int64_t heads, int64_t n,
                                                                int64_t skip, int64_t bs, float *acc,
                                                                float *mx, float *total, const int64_t D) {
    for (int64_t g = 0; g < heads; g++) {
        float *sg = scores + g * bs, bmax = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < skip; j++) sg[j] = 0.0f; /* masked: p 0; the maximum and the sum start after them */
#pragma omp simd reduction(max : bmax)
        for (int64_t j = skip; j < n; j++) bmax = sg[j] > bmax ? sg[j] : bmax;
        if (bmax > mx[g]) { /* rescale what came before to the new maximum */
            const float r = pg_exp(mx[g] - bmax);
            total[g] *= r;
#pragma omp simd
            for (int64_t i = 0; i < D; i++) acc[g * D + i] *= r;
            mx[g] = bmax;
        }
        const float m = mx[g];
        int64_t j = skip;
#if !defined(__AVX512F__) /* 8 lanes, then the lanes' sum in a fixed order */
        __m256 lanes = _mm256_setzero_ps();
        for (; j + 8 <= n; j += 8) {
            const __m256 e = pg_exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + j), _mm256_set1_ps(m)));
            _mm256_storeu_ps(sg + j, e);
            lanes = _mm256_add_ps(lanes, e);
        }
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        sum = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#endif
#pragma omp simd reduction(+ : sum) /* the block's sum in vector lanes, not one long chain */
        for (int64_t t = j; t < n; t++) {
            sg[t] = pg_exp(sg[t] - m);
            sum += sg[t];
        }
        total[g] += sum;
    }
}

/* bf16 products (AVX512-BF16): PG_BF16_DOTS and attend_block_bf16, over lane_sums16 and
   softmax_block's conventions above. */
#include "attention_bf16.h"

/* A work item's query heads: nh (at most PG_MAX_GROUP) of each of the nkv KV heads from kvh0,
   q [nkv * nh, D] (already scaled; KV head kvh0 + i's heads are rows i * nh ...), over their
   sequence's ctx cached tokens: softmax(q K^T) V into out [nkv * nh, D], a block of the table at a
   time (online softmax). Each K and V row is read and widened once for a KV head's nh heads (one
   head a time measured compute-bound: a per-token dot's reduction, and the accumulator through
   memory, per head), and an item holding every KV head of its row reads each token's K and V
   rows whole, a block's rows one contiguous run instead of a KV head's strided slices of them
   (64 rows at 300 tokens: 0.95x the step's time with AVX2). Each head's arithmetic is its own,
   in the same order whatever heads share its item. D is a constant in the callers below, so the
   inner loops unroll into registers. */
/* One block of n tokens (K and V rows from kb and vb, row stride rbytes, bf16 or float32) for a
   work item's heads: their scores, the online softmax's update of mx and total, and acc += p V.
   attend_heads runs it block after block for one row; pg_attend_rows for several rows of one
   sequence over K/V rows it widened once: a row's arithmetic is the same in both. */
static inline __attribute__((always_inline)) void
attend_block(const float *q, int64_t nkv, int64_t nh, const char *kb, const char *vb, int64_t rbytes,
             int bf16, int64_t n, int64_t skip, int64_t bs, float *scores, float *kbuf, float *acc,
             float *mx, float *total, const int64_t D) {
    const int64_t esize = bf16 ? 2 : 4, heads = nkv * nh;
    for (int64_t i = 0; i < nkv; i++) {
        const float *qi = q + i * nh * D;
        const char *ki = kb + i * D * esize;
        float *si = scores + i * nh * bs;
#if defined(__AVX512F__)
        if (D % 16 == 0) {
            for (int64_t j0 = 0; j0 < n; j0 += 16)
                scores16(qi, nh, ki + j0 * rbytes, rbytes, bf16, n - j0 < 16 ? n - j0 : 16,
                         si + j0, bs, D);
            continue;
        }
#else
        if (D % 16 == 0) {
            for (int64_t j0 = 0; j0 < n; j0 += 8)
                scores8(qi, nh, ki + j0 * rbytes, rbytes, bf16, n - j0 < 8 ? n - j0 : 8, si + j0,
                        bs, D);
            continue;
        }
#endif
        for (int64_t j = 0; j < n; j++) {
            const float *k = kv_row(ki + j * rbytes, bf16, kbuf, D);
            for (int64_t g = 0; g < nh; g++) si[g * bs + j] = dot(qi + g * D, k, D);
        }
    }
    softmax_block(scores, heads, n, skip, bs, acc, mx, total, D);
#if defined(__AVX512F__)
#define PG_ACCUMULATE_V accumulate_v16
#else
#define PG_ACCUMULATE_V accumulate_v
#endif
    if (D % 16 == 0 && nh <= 4) { /* a switch: the heads a constant, their sums in registers */
        for (int64_t i = 0; i < nkv; i++) {
            float *ai = acc + i * nh * D;
            const float *pi = scores + i * nh * bs;
            const char *vi = vb + i * D * esize;
            switch (nh) {
                case 1: PG_ACCUMULATE_V(ai, pi, bs, 1, vi, rbytes, bf16, n, D); break;
                case 2: PG_ACCUMULATE_V(ai, pi, bs, 2, vi, rbytes, bf16, n, D); break;
                case 3: PG_ACCUMULATE_V(ai, pi, bs, 3, vi, rbytes, bf16, n, D); break;
                default: PG_ACCUMULATE_V(ai, pi, bs, 4, vi, rbytes, bf16, n, D); break;
            }
        }
        return;
    }
#undef PG_ACCUMULATE_V
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < nkv; i++) {
            const float *v = kv_row(vb + j * rbytes + i * D * esize, bf16, kbuf, D);
            for (int64_t g = i * nh; g < (i + 1) * nh; g++) {
                const float p = scores[g * bs + j];
                float *ag = acc + g * D;
#pragma omp simd
                for (int64_t e = 0; e < D; e++) ag[e] = fmaf(p, v[e], ag[e]);
            }
        }
    }
}

/* The first of a row's ctx cached tokens that a layer attends to: past a sliding window, the
   window's first (the blocks before it are not read; the tokens before it in its block are masked). */
static inline int64_t window_start(const pg_layer *L, int64_t ctx) {
    return L->window > 0 && ctx > L->window ? ctx - L->window : 0;
}
static inline __attribute__((always_inline)) void
attend_heads(const float *q, int64_t kvh0, int64_t nkv, int64_t nh, const pg_layer *L,
             const pg_shape *s, const int32_t *table, int64_t ctx, float *out, const int64_t D) {
    const int64_t bs = s->block_size, row = s->kv_heads * D, heads = nkv * nh;
    const int64_t lo = window_start(L, ctx), first = lo / bs * bs;
    const int bf16 = (int)s->kv_bf16;
    const int64_t esize = bf16 ? 2 : 4, rbytes = row * esize;
    float acc[PG_ITEM_FLOATS], scores[PG_MAX_ITEM_HEADS * 256], kbuf[512];
    float mx[PG_MAX_ITEM_HEADS], total[PG_MAX_ITEM_HEADS];
    for (int64_t g = 0; g < heads; g++) {
        mx[g] = -INFINITY, total[g] = 0.0f;
        for (int64_t i = 0; i < D; i++) acc[g * D + i] = 0.0f;
    }
#if defined(PG_BF16_DOTS)
    if (bf16_dots(s)) {
        uint16_t qb[PG_ITEM_FLOATS], pb[PG_MAX_ITEM_HEADS * (256 + 16)];
        float tv[PG_MAX_ITEM_HEADS * 16] = {0.0f};
        const int64_t pbs = (bs + 15) / 16 * 16;
        round_bf16(q, heads * D, qb);
        for (int64_t t0 = first; t0 < ctx; t0 += bs) {
            const int64_t n = ctx - t0 < bs ? ctx - t0 : bs;
            const int64_t base = (int64_t)table[t0 / bs] * bs;
            const char *kb = (const char *)L->k_cache + (base * row + kvh0 * D) * 2;
            const char *vb = (const char *)L->v_cache + (base * row + kvh0 * D) * 2;
            attend_block_bf16(qb, nkv, nh, kb, NULL, 0, vb, NULL, 0, rbytes, n, t0 == first ? lo - first : 0,
                              bs, scores, pb, pbs, acc, mx, tv, D);
        }
        for (int64_t g = 0; g < heads; g++) total[g] = total_of(tv + g * 16);
        ctx = 0; /* done: the loop below has nothing left */
    }
#endif
    for (int64_t t0 = first; t0 < ctx; t0 += bs) {
        const int64_t n = ctx - t0 < bs ? ctx - t0 : bs;
        const int64_t base = (int64_t)table[t0 / bs] * bs;
        const char *kb = (const char *)L->k_cache + (base * row + kvh0 * D) * esize;
        const char *vb = (const char *)L->v_cache + (base * row + kvh0 * D) * esize;
        attend_block(q, nkv, nh, kb, vb, rbytes, bf16, n, t0 == first ? lo - first : 0, bs, scores, kbuf,
                     acc, mx, total, D);
    }
    for (int64_t g = 0; g < heads; g++) {
        const float inv = 1.0f / total[g];
        for (int64_t i = 0; i < D; i++) out[g * D + i] = acc[g * D + i] * inv;
    }
}

static void attend(const float *q, int64_t kvh0, int64_t nkv, int64_t nh, const pg_layer *L,
                   const pg_shape *s, const int32_t *table, int64_t ctx, float *out) {
    /* D a constant where it is a common one */
    if (s->head_dim == 64) attend_heads(q, kvh0, nkv, nh, L, s, table, ctx, out, 64);
    else if (s->head_dim == 128) attend_heads(q, kvh0, nkv, nh, L, s, table, ctx, out, 128);
    else attend_heads(q, kvh0, nkv, nh, L, s, table, ctx, out, s->head_dim);
}

/* Rows b0 .. b0 + count - 1 of one sequence (one block table; a prompt chunk's consecutive tokens,
   each row's ctx its own), every head of each, into att: for each block, its K and V rows widened to
   float32 once (exactly: a bf16 value is a float32 one) and then each row's attend_block over them
   as attend_heads would run it, so a row's bits are those it gets alone. Widening once for the rows
   instead of once per row is what a long prompt's attention was spent on. With bf16 products
   (bf16_dots) a block's K rows are transposed and its V rows paired once for the rows instead, the
   same bits as a row's attend_heads reading them in place. Work memory from malloc (the rows'
   accumulators); on failure each row goes alone. */
void pg_attend_rows(int64_t b0, int64_t count, const float *qkv, int64_t qkv_n, const pg_layer *L,
                    const pg_shape *s, const int32_t *tables, const int32_t *ctx, float *att) {
    const int64_t H = s->heads, KVH = s->kv_heads, D = s->head_dim, group = H / KVH;
    const int64_t bs = s->block_size, row = KVH * D, esize = s->kv_bf16 ? 2 : 4;
    const int32_t *table = tables + b0 * s->table_width;
    int64_t last = 0, first = INT64_MAX; /* the rows' blocks: from the first any row reads */
    for (int64_t r = 0; r < count; r++) {
        last = ctx[b0 + r] > last ? ctx[b0 + r] : last;
        const int64_t f = window_start(L, ctx[b0 + r]) / bs * bs;
        first = f < first ? f : first;
    }
    const int64_t per_row = 2 * H * D + 2 * H; /* q, acc, mx, total */
    float *mem = malloc(sizeof(float) * (count * per_row + 2 * bs * row));
    if (mem == NULL) {
        const pg_items alone = {.kv_items = 1, .chunks = 1, .chunk_heads = group};
        for (int64_t r = 0; r < count; r++) pg_attend_item(b0 + r, &alone, qkv, qkv_n, L, s, tables, ctx, att);
        return;
    }
    float *kst = mem + count * per_row, *vst = kst + bs * row;
    float scores[PG_MAX_ITEM_HEADS * 256], kbuf[512];
    for (int64_t r = 0; r < count; r++) {
        float *q = mem + r * per_row, *acc = q + H * D, *mx = acc + H * D, *total = mx + H;
        const float *src = qkv + (b0 + r) * qkv_n;
        for (int64_t i = 0; i < H * D; i++) q[i] = src[i] * s->scale, acc[i] = 0.0f;
        for (int64_t g = 0; g < H; g++) mx[g] = -INFINITY, total[g] = 0.0f;
    }
#if defined(PG_BF16_DOTS)
    /* bf16 products: each block's K transposed and V paired once for the rows (K and V stay bf16) */
    const int64_t kts = (bs + 15) / 16 * 16 * D / 2, vts = (bs + 1) / 2 * D * 2, pbs = (bs + 15) / 16 * 16;
    void *bmem = bf16_dots(s)
                     ? calloc(1, sizeof(float) * count * H * 16 + sizeof(uint32_t) * KVH * kts +
                                    sizeof(uint16_t) * (KVH * vts + count * H * D + H * pbs))
                     : NULL;
    if (bmem != NULL) {
        float *tvs = bmem; /* each row's heads' 16 lanes of softmax sums */
        uint32_t *kt = (uint32_t *)(tvs + count * H * 16);
        uint16_t *vt = (uint16_t *)(kt + KVH * kts), *qb = vt + KVH * vts, *pb = qb + count * H * D;
        for (int64_t r = 0; r < count; r++) round_bf16(mem + r * per_row, H * D, qb + r * H * D);
        for (int64_t t0 = first; t0 < last; t0 += bs) {
            const int64_t n_all = last - t0 < bs ? last - t0 : bs;
            const int64_t base = (int64_t)table[t0 / bs] * bs;
            const char *kb = (const char *)L->k_cache + base * row * 2;
            const char *vb = (const char *)L->v_cache + base * row * 2;
            for (int64_t i = 0; i < KVH; i++) {
                for (int64_t j0 = 0; j0 < n_all; j0 += 16)
                    transpose_k16(kb + i * D * 2 + j0 * row * 2, row * 2, n_all - j0 < 16 ? n_all - j0 : 16,
                                  kt + i * kts + j0 * D / 2, D);
                pair_v(vb + i * D * 2, row * 2, n_all, vt + i * vts, D);
            }
            for (int64_t r = 0; r < count; r++) {
                const int64_t c = ctx[b0 + r], lo = window_start(L, c);
                if (t0 >= c || t0 + bs <= lo) continue;
                float *acc = mem + r * per_row + H * D, *mx = acc + H * D, *tv = tvs + r * H * 16;
                const int64_t n = c - t0 < bs ? c - t0 : bs, skip = lo > t0 ? lo - t0 : 0;
                if (D == 64)
                    attend_block_bf16(qb + r * H * D, KVH, group, kb, kt, kts, vb, vt, vts, row * 2, n, skip, bs,
                                      scores, pb, pbs, acc, mx, tv, 64);
                else if (D == 128)
                    attend_block_bf16(qb + r * H * D, KVH, group, kb, kt, kts, vb, vt, vts, row * 2, n, skip, bs,
                                      scores, pb, pbs, acc, mx, tv, 128);
                else
                    attend_block_bf16(qb + r * H * D, KVH, group, kb, kt, kts, vb, vt, vts, row * 2, n, skip, bs,
                                      scores, pb, pbs, acc, mx, tv, D);
            }
        }
        for (int64_t r = 0; r < count; r++) {
            float *total = mem + r * per_row + 2 * H * D + H;
            for (int64_t g = 0; g < H; g++) total[g] = total_of(tvs + (r * H + g) * 16);
        }
        free(bmem);
        last = 0; /* done: the loop below has nothing left */
    } else if (bf16_dots(s)) { /* no memory: each row alone, as a decode */
        free(mem);
        const pg_items alone = {.kv_items = 1, .chunks = 1, .chunk_heads = group};
        for (int64_t r = 0; r < count; r++) pg_attend_item(b0 + r, &alone, qkv, qkv_n, L, s, tables, ctx, att);
        return;
    }
#endif
    for (int64_t t0 = first; t0 < last; t0 += bs) {
        const int64_t n_all = last - t0 < bs ? last - t0 : bs;
        const int64_t base = (int64_t)table[t0 / bs] * bs;
        const char *kb = (const char *)L->k_cache + base * row * esize;
        const char *vb = (const char *)L->v_cache + base * row * esize;
        if (s->kv_bf16) {
            for (int64_t i = 0; i < n_all * row; i++) {
                kst[i] = bf16_to_f32(((const uint16_t *)kb)[i]);
                vst[i] = bf16_to_f32(((const uint16_t *)vb)[i]);
            }
            kb = (const char *)kst, vb = (const char *)vst;
        }
        for (int64_t r = 0; r < count; r++) {
            const int64_t c = ctx[b0 + r], lo = window_start(L, c);
            if (t0 >= c || t0 + bs <= lo) continue;
            float *q = mem + r * per_row, *acc = q + H * D, *mx = acc + H * D, *total = mx + H;
            const int64_t n = c - t0 < bs ? c - t0 : bs, skip = lo > t0 ? lo - t0 : 0;
            if (D == 64) attend_block(q, KVH, group, kb, vb, row * 4, 0, n, skip, bs, scores, kbuf, acc, mx, total, 64);
            else if (D == 128)
                attend_block(q, KVH, group, kb, vb, row * 4, 0, n, skip, bs, scores, kbuf, acc, mx, total, 128);
            else attend_block(q, KVH, group, kb, vb, row * 4, 0, n, skip, bs, scores, kbuf, acc, mx, total, D);
        }
    }
    for (int64_t r = 0; r < count; r++) {
        const float *acc = mem + r * per_row + H * D, *total = acc + H * D + H;
        float *out = att + (b0 + r) * H * D;
        for (int64_t g = 0; g < H; g++) {
            const float inv = 1.0f / total[g];
            for (int64_t i = 0; i < D; i++) out[g * D + i] = acc[g * D + i] * inv;
        }
    }
    free(mem);
}

/* Attention's work item ``item``: (row, part of its KV heads, chunk of their query heads), into att. */
void pg_attend_item(int64_t item, const pg_items *it, const float *qkv, int64_t qkv_n,
                    const pg_layer *L, const pg_shape *s, const int32_t *tables, const int32_t *ctx,
                    float *att) {
    const int64_t KVH = s->kv_heads, D = s->head_dim, group = s->heads / KVH, chunks = it->chunks;
    const int64_t nkv = KVH / it->kv_items, b = item / (it->kv_items * chunks);
    const int64_t kvh0 = item / chunks % it->kv_items * nkv, c = item % chunks;
    const int64_t h0 = kvh0 * group + c * it->chunk_heads;
    const int64_t nh = group - c * it->chunk_heads < it->chunk_heads ? group - c * it->chunk_heads
                                                                       : it->chunk_heads;
    float q[PG_ITEM_FLOATS];
    const float *src = qkv + b * qkv_n + h0 * D;
    for (int64_t i = 0; i < nkv * nh * D; i++) q[i] = src[i] * s->scale;
    attend(q, kvh0, nkv, nh, L, s, tables + b * s->table_width, ctx[b],
           att + b * s->heads * D + h0 * D);
}
#endif

/* 1 where a step given pg_shape.bf16_products (a bf16 pool, D a multiple of 32) takes attention's bf16
   products: built for a CPU with AVX512-BF16. */
int pagoda_attention_bf16_products(void) {
#if defined(PG_BF16_DOTS)
    return 1;
#else
    return 0;
#endif
}
