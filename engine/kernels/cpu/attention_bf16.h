/* attention.c's bf16 products, included by it once (it defines lane_sums16 first): with AVX512-BF16
   (vdpbf16ps), for a bf16 model and pool and head_dim a multiple of 32, q is rounded to bf16 once
   per row, each exp(score - max) to bf16 for p V, and every sum is float32 (as llama.cpp rounds q
   to the K type, and the torch path's flash kernel multiplies in bf16). Half the instructions of
   the float32 products per token and head, no widening of the pool: a long prompt's attention
   was most of its time. Each head's arithmetic is fixed, and the same whether its row runs alone
   (attend_heads, K and V read in place) or in a group of rows (pg_attend_rows, each block's K
   transposed and V paired once for the group): a dot's 16 float32 lanes of pairs (lane l: pairs
   l, l + 16, ... in order), then lane_sums16's pairs of lanes; each output column's sum over the
   pairs of tokens (0, 1), (2, 3) ... of a block in order, an odd block's last pair with a zero. */

#ifndef PAGODA_ATTENTION_BF16_H
#define PAGODA_ATTENTION_BF16_H

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define PG_BF16_DOTS 1
static inline int bf16_dots(const pg_shape *s) { return s->bf16_products && s->kv_bf16 && s->head_dim % 32 == 0; }

/* qb [n] = q [n] rounded to bf16 (to nearest even). */
static inline void round_bf16(const float *q, int64_t n, uint16_t *qb) {
    for (int64_t i = 0; i < n; i++) qb[i] = f32_to_bf16(q[i]);
}

/* pg_exp on 16 lanes (pg_exp8's operations). */
static inline __m512 pg_exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    f = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), f);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, f), f, f), _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
}

/* The lanes of the 16 tokens from j0 that a block of n tokens, its first skip masked, attends to. */
static inline __mmask16 block_lanes(int64_t j0, int64_t n, int64_t skip) {
    __mmask16 keep = n - j0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j0)) - 1u);
    if (skip > j0) keep &= skip - j0 >= 16 ? (__mmask16)0 : (__mmask16)(0xffffu << (skip - j0));
    return keep;
}

/* softmax_block for the bf16 products, 16 tokens a vector: the maximum one vector's reduction, the
   sum kept in 16 lanes per head (tv [heads, 16]; lane l sums tokens l, l + 16 ... of every block,
   added up once at the row's end: total_of), p = exp(score - max) only as bf16, into pb [heads,
   pbs] (zero before skip and from n on, to the next 16). softmax_block's sum came out a chain of 16 dependent
   scalar additions per head and block, measured a quarter of a long prompt's attention, and a
   reduction per block was still a tenth of it. */
static inline __attribute__((always_inline)) void softmax_block16(const float *scores, int64_t heads, int64_t n,
                                                                  int64_t skip, int64_t bs, float *acc, float *mx,
                                                                  float *tv, uint16_t *pb, int64_t pbs,
                                                                  const int64_t D) {
    for (int64_t g = 0; g < heads; g++) {
        const float *sg = scores + g * bs;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const __mmask16 keep = block_lanes(j0, n, skip);
            vmax = _mm512_mask_max_ps(vmax, keep, vmax, _mm512_maskz_loadu_ps(keep, sg + j0));
        }
        const float bmax = _mm512_reduce_max_ps(vmax);
        if (bmax > mx[g]) { /* rescale what came before to the new maximum */
            const float r = pg_exp(mx[g] - bmax);
            _mm512_storeu_ps(tv + g * 16, _mm512_mul_ps(_mm512_loadu_ps(tv + g * 16), _mm512_set1_ps(r)));
            for (int64_t i = 0; i < D; i += 16)
                _mm512_storeu_ps(acc + g * D + i, _mm512_mul_ps(_mm512_loadu_ps(acc + g * D + i), _mm512_set1_ps(r)));
            mx[g] = bmax;
        }
        const __m512 m = _mm512_set1_ps(mx[g]);
        __m512 vsum = _mm512_loadu_ps(tv + g * 16);
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const __mmask16 keep = block_lanes(j0, n, skip);
            const __m512 e = _mm512_maskz_mov_ps(keep, pg_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(keep, sg + j0), m)));
            vsum = _mm512_add_ps(vsum, e);
            _mm256_storeu_si256((__m256i *)(pb + g * pbs + j0), (__m256i)_mm512_cvtneps_pbh(e));
        }
        _mm512_storeu_ps(tv + g * 16, vsum);
    }
}

/* A head's softmax denominator from its 16 lanes of sums (softmax_block16). */
static inline float total_of(const float *tv) { return _mm512_reduce_add_ps(_mm512_loadu_ps(tv)); }

/* scores16 with bf16 products: the n (at most 16) K rows from kb (bf16, row stride rstride
   bytes) against the nh bf16 query heads qb [nh, D]. A token's part vector: D / 32 vdpbf16ps in a
   chain (lane l: pairs l, l + 16, ...); then lane_sums16. */
static inline __attribute__((always_inline)) void scores16_bf16(const uint16_t *qb, int64_t nh, const char *kb,
                                                                int64_t rstride, int64_t n, float *scores,
                                                                int64_t bs, const int64_t D) {
    static const int sigma[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
    __m512 part[PG_MAX_GROUP][16];
    for (int64_t j = 0; j < 16; j++) {
        __m512i k[512 / 32];
        if (j < n)
            for (int64_t c = 0; c < D / 32; c++) k[c] = _mm512_loadu_si512(kb + j * rstride + c * 64);
        for (int64_t g = 0; g < nh; g++) {
            __m512 acc = _mm512_setzero_ps();
            if (j < n)
                for (int64_t c = 0; c < D / 32; c++)
                    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(qb + g * D + c * 32),
                                           (__m512bh)k[c]);
            part[g][sigma[j]] = acc;
        }
    }
    const __mmask16 keep = (__mmask16)((1u << n) - 1u);
    for (int64_t g = 0; g < nh; g++) _mm512_mask_storeu_ps(scores + g * bs, keep, lane_sums16(part[g]));
}

/* kt [D / 2][16] = the pairs of 16 K rows (bf16, from kb, row stride rstride bytes; rows from n
   on zero) as 32-bit words, transposed: word p of row j at kt[p * 16 + j]. Lets a group of rows
   form 16 tokens' dots with one broadcast pair of q a vdpbf16ps and no lane exchanges
   (scores16_kt), the same bits as scores16_bf16. */
static inline void transpose_k16(const char *kb, int64_t rstride, int64_t n, uint32_t *kt, const int64_t D) {
    for (int64_t c = 0; c < D / 32; c++) {
        __m512i r[16], t[16];
        for (int64_t j = 0; j < 16; j++)
            r[j] = j < n ? _mm512_loadu_si512(kb + j * rstride + c * 64) : _mm512_setzero_si512();
        for (int i = 0; i < 8; i++) { /* rows 2i, 2i + 1 interleaved in 32-bit words */
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; i++) { /* u[4i + m]: lane k holds words 4k + m of rows 4i .. 4i + 3 */
            r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        uint32_t *out = kt + c * 16 * 16;
        for (int m = 0; m < 4; m++) { /* word w = 4k + m of the 16 rows: lane k of r[m], r[4 + m] ... */
            const __m512i x0 = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x88), y0 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x88);
            const __m512i x1 = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xdd), y1 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xdd);
            _mm512_storeu_si512(out + (m) * 16, _mm512_shuffle_i32x4(x0, y0, 0x88));
            _mm512_storeu_si512(out + (8 + m) * 16, _mm512_shuffle_i32x4(x0, y0, 0xdd));
            _mm512_storeu_si512(out + (4 + m) * 16, _mm512_shuffle_i32x4(x1, y1, 0x88));
            _mm512_storeu_si512(out + (12 + m) * 16, _mm512_shuffle_i32x4(x1, y1, 0xdd));
        }
    }
}

/* scores16_bf16 over transposed K (transpose_k16): lane j of part l is token j's lane l. */
static inline __attribute__((always_inline)) void scores16_kt(const uint16_t *qb, int64_t nh, const uint32_t *kt,
                                                              int64_t n, float *scores, int64_t bs,
                                                              const int64_t D) {
    const __mmask16 keep = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
    for (int64_t g = 0; g < nh; g++) {
        const uint32_t *q = (const uint32_t *)(qb + g * D);
        __m512 p[16];
        for (int l = 0; l < 16; l++) p[l] = _mm512_setzero_ps();
        for (int64_t c = 0; c < D / 32; c++)
            for (int l = 0; l < 16; l++)
                p[l] = _mm512_dpbf16_ps(p[l], (__m512bh)_mm512_set1_epi32((int)q[c * 16 + l]),
                                        (__m512bh)_mm512_loadu_si512(kt + (c * 16 + l) * 16));
        for (int w = 8; w > 0; w /= 2) /* lane_sums16's pairs of lanes, here whole vectors */
            for (int l = 0; l < w; l++) p[l] = _mm512_add_ps(p[l], p[l + w]);
        _mm512_mask_storeu_ps(scores + g * bs, keep, p[0]);
    }
}

/* Column pairs of V rows j and j + 1 (bf16 from vb, row stride rbytes; row j + 1 zero when it is
   not below n): out[u] = (v_j[c + 16u + e], v_{j+1}[c + 16u + e]) for e < 16, u < w (w <= 4). */
static inline __attribute__((always_inline)) void v_pairs(const char *vb, int64_t rbytes, int64_t j, int64_t n,
                                                          int64_t c, int64_t w, __m512i *out) {
    static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                        24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i lo = _mm512_loadu_si512(lo_idx), hi = _mm512_loadu_si512(hi_idx);
    for (int64_t h = 0; h < w; h += 2) {
        const char *a = vb + j * rbytes + (c + 16 * h) * 2;
        const __m512i x = _mm512_loadu_si512(a);
        const __m512i y = j + 1 < n ? _mm512_loadu_si512(a + rbytes) : _mm512_setzero_si512();
        out[h] = _mm512_permutex2var_epi16(x, lo, y);
        out[h + 1] = _mm512_permutex2var_epi16(x, hi, y);
    }
}

/* vt = the block's n V rows (from vb) in column pairs, [(n + 1) / 2][D][2]: what v_pairs forms,
   once for a group of rows. */
static inline void pair_v(const char *vb, int64_t rbytes, int64_t n, uint16_t *vt, const int64_t D) {
    for (int64_t j = 0; j < n; j += 2)
        for (int64_t c = 0; c < D; c += 64) {
            __m512i u[4];
            const int64_t w = D - c < 64 ? (D - c) / 16 : 4;
            v_pairs(vb, rbytes, j, n, c, w, u);
            for (int64_t i = 0; i < w; i++) _mm512_storeu_si512(vt + (j / 2 * D + c + 16 * i) * 2, u[i]);
        }
}

/* acc [nh, D] += pb [nh, pbs] (bf16 p) times the block's n V rows, from vb (v_pairs) or, when vt is
   not NULL, already paired (pair_v): per column pass of up to 64, each pair of tokens one
   vdpbf16ps a vector and head, the last pair of an odd n with its second token zeroed. */
static inline __attribute__((always_inline)) void accumulate_v_bf16(float *acc, const uint16_t *pb, int64_t pbs,
                                                                    const int nh, const char *vb, int64_t rbytes,
                                                                    const uint16_t *vt, int64_t n, const int64_t D) {
    for (int64_t c = 0; c < D; c += 64) {
        const int64_t w = D - c < 64 ? (D - c) / 16 : 4;
        __m512 a[4][4];
        for (int g = 0; g < nh; g++)
            for (int64_t u = 0; u < w; u++) a[g][u] = _mm512_loadu_ps(acc + g * D + c + 16 * u);
        for (int64_t j = 0; j < n; j += 2) {
            __m512i v[4];
            if (vt != NULL)
                for (int64_t u = 0; u < w; u++) v[u] = _mm512_loadu_si512(vt + (j / 2 * D + c + 16 * u) * 2);
            else
                v_pairs(vb, rbytes, j, n, c, w, v);
            if (j + 1 == n)
                for (int64_t u = 0; u < w; u++) v[u] = _mm512_maskz_mov_epi16(0x55555555u, v[u]);
            for (int g = 0; g < nh; g++) {
                uint32_t pp;
                memcpy(&pp, pb + g * pbs + j, 4);
                const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pp);
                for (int64_t u = 0; u < w; u++) a[g][u] = _mm512_dpbf16_ps(a[g][u], (__m512bh)v[u], p);
            }
        }
        for (int g = 0; g < nh; g++)
            for (int64_t u = 0; u < w; u++) _mm512_storeu_ps(acc + g * D + c + 16 * u, a[g][u]);
    }
}

/* attend_block with bf16 products: qb [nkv * nh, D] bf16 q; K rows from kb (or, where kt is not
   NULL, transposed per KV head: kt + i * kts, 16 tokens a D / 2 x 16 tile), V rows from vb (or
   paired per KV head: vt + i * vts); pb [nkv * nh, pbs] the bf16 p's work space. */
static inline __attribute__((always_inline)) void
attend_block_bf16(const uint16_t *qb, int64_t nkv, int64_t nh, const char *kb, const uint32_t *kt, int64_t kts,
                  const char *vb, const uint16_t *vt, int64_t vts, int64_t rbytes, int64_t n, int64_t skip,
                  int64_t bs, float *scores, uint16_t *pb, int64_t pbs, float *acc, float *mx, float *tv,
                  const int64_t D) {
    const int64_t heads = nkv * nh;
    for (int64_t i = 0; i < nkv; i++) {
        const uint16_t *qi = qb + i * nh * D;
        float *si = scores + i * nh * bs;
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const int64_t m = n - j0 < 16 ? n - j0 : 16;
            if (kt != NULL) scores16_kt(qi, nh, kt + i * kts + j0 * D / 2, m, si + j0, bs, D);
            else scores16_bf16(qi, nh, kb + i * D * 2 + j0 * rbytes, rbytes, m, si + j0, bs, D);
        }
    }
    softmax_block16(scores, heads, n, skip, bs, acc, mx, tv, pb, pbs, D);
    for (int64_t i = 0; i < nkv; i++) {
        float *ai = acc + i * nh * D;
        const uint16_t *pi = pb + i * nh * pbs, *vi = vt != NULL ? vt + i * vts : NULL;
        const char *vbi = vb + i * D * 2;
        switch (nh) { /* the heads a constant: their sums in registers */
            case 1: accumulate_v_bf16(ai, pi, pbs, 1, vbi, rbytes, vi, n, D); break;
            case 2: accumulate_v_bf16(ai, pi, pbs, 2, vbi, rbytes, vi, n, D); break;
            case 3: accumulate_v_bf16(ai, pi, pbs, 3, vbi, rbytes, vi, n, D); break;
            case 4: accumulate_v_bf16(ai, pi, pbs, 4, vbi, rbytes, vi, n, D); break;
            default:
                for (int64_t g0 = 0; g0 < nh; g0 += 4) {
                    const int64_t k = nh - g0 < 4 ? nh - g0 : 4;
                    if (k == 4) accumulate_v_bf16(ai + g0 * D, pi + g0 * pbs, pbs, 4, vbi, rbytes, vi, n, D);
                    else if (k == 3) accumulate_v_bf16(ai + g0 * D, pi + g0 * pbs, pbs, 3, vbi, rbytes, vi, n, D);
                    else if (k == 2) accumulate_v_bf16(ai + g0 * D, pi + g0 * pbs, pbs, 2, vbi, rbytes, vi, n, D);
                    else accumulate_v_bf16(ai + g0 * D, pi + g0 * pbs, pbs, 1, vbi, rbytes, vi, n, D);
                }
        }
    }
}
#endif

#endif /* PAGODA_ATTENTION_BF16_H */
