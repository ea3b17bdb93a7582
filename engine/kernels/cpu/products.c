/* A product's work on each thread of a team (the layouts and the arithmetic: qmatmul.c's header):
   the activation rows rounded to int8 per block of 32, then the thread's share of the weight
   groups, R activation rows times one group of G weight rows a tile, with VNNI's u8 x s8 dot
   products where the CPU has them (AVX512-VNNI, AVX-VNNI) and AVX2's maddubs otherwise; whole
   tiles of 16 rows go to amx_tiles.c where AMX is on. The rounding, the group loops and the
   tiles stay in one function (pg_matmul_team): split over two, the int8 LM head's one-row
   product ran 1.03-1.1x slower (the same loop, measured on the Xeon AVX-512). */

#include "pagoda_kernels.h"

#if defined(PG_NATIVE)
static inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void quantize_row(const char *x, int bf16, int64_t K, uint8_t *dst) {
    int8_t *q = (int8_t *)dst;
    float *sa = (float *)(dst + K), *asum = sa + K / 32;
    const int esize = bf16 ? 2 : 4;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < K / 32; b++) {
        const char *xb = x + b * 32 * esize;
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = load8(xb + i * 8 * esize, bf16);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float mx = _mm_cvtss_f32(m);
        const __m256 inv = _mm256_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], inv)); /* nearest, ties to even */
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inv));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], inv));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inv));
        const int32_t total = hsum8i(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(q + b * 32), _mm256_permutevar8x32_epi32(packed, order));
        sa[b] = mx / 127.0f;
        asum[b] = sa[b] * (float)total;
    }
}

/* acc += a block's exact integer products s (one row, G lanes) in float, in the one order every
   path keeps: s * (d * sa) + m * (sa * sum(qa)). */
static inline __attribute__((always_inline)) void block_epilogue(
        vf *acc, vi s, vf dv, vf mv, const uint8_t *ar, int64_t b, int64_t nb, int64_t K) {
    const float *sa = (const float *)(ar + K);
    *acc = vf_fma(vf_cvt(s), vf_mul(dv, vf_set1(sa[b])), *acc);
    *acc = vf_fma(mv, vf_set1(sa[nb + b]), *acc);
}

/* R activation rows (scratch rows at a, stride rb) times one group of G weight rows of
   ``bits`` 4 or 8: acc[r] for row r. */
static inline __attribute__((always_inline)) void tile(
        int bits, int R, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
        const uint8_t *a, int64_t rb, int64_t K, vf *acc) {
    const vi m4 = vi_set1_8(0x0f);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 4 * bits * G;
        if (bits == 4) { /* see PREFETCH_BYTES */
            for (int l = 0; l < 16 * G; l += 64) _mm_prefetch((const char *)wb + PREFETCH_BYTES + l, _MM_HINT_T0);
            _mm_prefetch((const char *)(d + b * G) + PREFETCH_BYTES / 8, _MM_HINT_T0);
            _mm_prefetch((const char *)(mn + b * G) + PREFETCH_BYTES / 8, _MM_HINT_T0);
        }
        const vf dv = vf_ph(d + b * G);
        const vf mv = bits == 4 ? vf_ph(mn + b * G) : vf_mul(dv, vf_set1(-128.0f));
#if defined(HAS_VNNI) /* u8 x s8 products summed in 32 bits: int8 codes + 128 (up to 255) too */
        vi wq[8];
        if (bits == 4) {
            for (int t = 0; t < 4; t++) {
                const vi x = vi_load(wb + t * 4 * G);
                wq[t] = vi_and(x, m4);
                wq[t + 4] = vi_and(vi_srl4(x), m4);
            }
        } else {
            for (int t = 0; t < 8; t++) wq[t] = vi_load(wb + t * 4 * G);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const int32_t *qa = (const int32_t *)(a + r * rb + b * 32);
            /* two chains of 4 dot products, not one of 8: a chain waits on each product's
               latency (integer sums: the same exact result) */
            vi s0 = vi_zero(), s1 = vi_zero();
            for (int g = 0; g < 4; g++) {
                s0 = vdot(s0, wq[g], vi_set1(qa[g]));
                s1 = vdot(s1, wq[g + 4], vi_set1(qa[g + 4]));
            }
            block_epilogue(&acc[r], vi_add(s0, s1), dv, mv, a + r * rb, b, nb, K);
        }
#else
        /* maddubs' 16-bit pair sums (each at most 2 x 15 x 128 = 3,840 in magnitude) added in 16
           bits over the block's 8 slices (at most 30,720: no overflow), widened once: the same
           exact integer as 8 widening dot products. Slices outer, rows inner: a slice is unpacked
           once for the R rows, whose sums stay in registers (holding the 8 unpacked slices
           instead, as the VNNI path does, spilled AVX2's 16 registers: 1.3x slower at 32 rows). */
        vi s[8], hs[8]; /* R <= 8 */
        for (int r = 0; r < R; r++) s[r] = hs[r] = vi_zero();
        if (bits == 4) {
            for (int t = 0; t < 4; t++) {
                const vi x = vi_load(wb + t * 4 * G);
                const vi lo = vi_and(x, m4), hi = vi_and(vi_srl4(x), m4);
                for (int r = 0; r < R; r++) {
                    const int32_t *qa = (const int32_t *)(a + r * rb + b * 32);
                    s[r] = vadd16(s[r], vadd16(vmul16(lo, vi_set1(qa[t])), vmul16(hi, vi_set1(qa[t + 4]))));
                    PIN(s[r]);
                }
            }
            for (int r = 0; r < R; r++) s[r] = vwiden(s[r]);
        } else { /* codes up to 255 would saturate maddubs: their two nibbles multiply apart */
            for (int t = 0; t < 8; t++) {
                const vi x = vi_load(wb + t * 4 * G);
                const vi lo = vi_and(x, m4), hi = vi_and(vi_srl4(x), m4);
                for (int r = 0; r < R; r++) {
                    const vi q = vi_set1(((const int32_t *)(a + r * rb + b * 32))[t]);
                    s[r] = vadd16(s[r], vmul16(lo, q));
                    hs[r] = vadd16(hs[r], vmul16(hi, q));
                    PIN(s[r]);
                    PIN(hs[r]);
                }
            }
            for (int r = 0; r < R; r++) s[r] = vi_add(vwiden(s[r]), vi_sll4(vwiden(hs[r])));
        }
        for (int r = 0; r < R; r++) block_epilogue(&acc[r], s[r], dv, mv, a + r * rb, b, nb, K);
#endif
    }
}

#if !defined(HAS_VNNI) && G == 8
#define ROW_TILE2 4
/* int4, AVX2 without VNNI: R activation rows times two weight groups (16 output rows) at once, so
   each activation broadcast serves two groups' products: the one-group tile issues a broadcast
   load per two maddubs, and loads, the maddubs' two ports and the adds' two bound it about
   equally. The same integers and the same float epilogue per lane as tile(): the same bits.
   SmolLM2's 120 projections, one thread, in-process A/B (AMD EPYC, AVX2): 64 rows 0.85x the
   time of 8-row one-group tiles; not below DYNAMIC_ROWS rows (1 row 1.25x, 8 rows 1.09x slower:
   few rows read the weights from memory, and two groups are two streams). */
static inline __attribute__((always_inline)) void tile2(
        int R, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
        const uint8_t *a, int64_t rb, int64_t K, vf *acc0, vf *acc1) {
    const vi m4 = vi_set1_8(0x0f);
    const int64_t wstride = nb * 4 * 4 * G, sstride = nb * G; /* group gi + 1's codes and scales */
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 4 * 4 * G;
        vi s0[ROW_TILE2], s1[ROW_TILE2];
        for (int r = 0; r < R; r++) s0[r] = s1[r] = vi_zero();
        for (int t = 0; t < 4; t++) {
            const vi x0 = vi_load(wb + t * 4 * G), x1 = vi_load(wb + wstride + t * 4 * G);
            const vi lo0 = vi_and(x0, m4), hi0 = vi_and(vi_srl4(x0), m4);
            const vi lo1 = vi_and(x1, m4), hi1 = vi_and(vi_srl4(x1), m4);
            for (int r = 0; r < R; r++) {
                const int32_t *qa = (const int32_t *)(a + r * rb + b * 32);
                const vi qlo = vi_set1(qa[t]), qhi = vi_set1(qa[t + 4]);
                s0[r] = vadd16(s0[r], vadd16(vmul16(lo0, qlo), vmul16(hi0, qhi)));
                s1[r] = vadd16(s1[r], vadd16(vmul16(lo1, qlo), vmul16(hi1, qhi)));
                PIN(s0[r]);
                PIN(s1[r]);
            }
        }
        const vf dv0 = vf_ph(d + b * G), mv0 = vf_ph(mn + b * G);
        const vf dv1 = vf_ph(d + sstride + b * G), mv1 = vf_ph(mn + sstride + b * G);
        for (int r = 0; r < R; r++) {
            block_epilogue(&acc0[r], vwiden(s0[r]), dv0, mv0, a + r * rb, b, nb, K);
            block_epilogue(&acc1[r], vwiden(s1[r]), dv1, mv1, a + r * rb, b, nb, K);
        }
    }
}
#define TILE2 1
#endif

/* Rows r0..r1 of the scratch times weight group gi, ROW_TILE (int8: ROW_TILE_8) rows at a time,
   into y. */
static inline __attribute__((always_inline)) void vnni_rows(
        int bits, const uint8_t *wg, const uint16_t *dg, const uint16_t *mg, int64_t nb,
        const uint8_t *scratch, int64_t rb, int64_t K, int64_t r0, int64_t r1, int64_t gi, vf bv,
        void *y, int64_t ldy, int y_bf16) {
    vf acc[8]; /* the switch's largest tile */
    const int64_t rt = bits == 4 ? ROW_TILE : ROW_TILE_8;
    for (int64_t r = r0; r < r1; r += rt) {
        const uint8_t *a = scratch + r * rb;
        const int R = r1 - r < rt ? (int)(r1 - r) : (int)rt;
        switch (R) {
            case 8: tile(bits, 8, wg, dg, mg, nb, a, rb, K, acc); break;
            case 7: tile(bits, 7, wg, dg, mg, nb, a, rb, K, acc); break;
            case 6: tile(bits, 6, wg, dg, mg, nb, a, rb, K, acc); break;
            case 5: tile(bits, 5, wg, dg, mg, nb, a, rb, K, acc); break;
            case 4: tile(bits, 4, wg, dg, mg, nb, a, rb, K, acc); break;
            case 3: tile(bits, 3, wg, dg, mg, nb, a, rb, K, acc); break;
            case 2: tile(bits, 2, wg, dg, mg, nb, a, rb, K, acc); break;
            default: tile(bits, 1, wg, dg, mg, nb, a, rb, K, acc); break;
        }
        store_rows(acc, R, bv, y, ldy, y_bf16, r, gi);
    }
}

#if defined(TILE2)
/* Rows r0..r1 times int4 weight groups gi and gi + 1, ROW_TILE2 rows at a time. */
static inline __attribute__((always_inline)) void pair_rows(
        const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb, const float *bias,
        const uint8_t *scratch, int64_t rb, int64_t K, int64_t r0, int64_t r1, int64_t gi,
        void *y, int64_t ldy, int y_bf16) {
    const uint8_t *wg = w + gi * nb * 4 * 4 * G;
    const uint16_t *dg = d + gi * nb * G, *mg = mn + gi * nb * G;
    const vf bv0 = bias ? vf_loadu(bias + gi * G) : vf_zero();
    const vf bv1 = bias ? vf_loadu(bias + gi * G + G) : vf_zero();
    vf acc0[ROW_TILE2], acc1[ROW_TILE2];
    for (int64_t r = r0; r < r1; r += ROW_TILE2) {
        const uint8_t *a = scratch + r * rb;
        const int R = r1 - r < ROW_TILE2 ? (int)(r1 - r) : ROW_TILE2;
        switch (R) {
            case 4: tile2(4, wg, dg, mg, nb, a, rb, K, acc0, acc1); break;
            case 3: tile2(3, wg, dg, mg, nb, a, rb, K, acc0, acc1); break;
            case 2: tile2(2, wg, dg, mg, nb, a, rb, K, acc0, acc1); break;
            default: tile2(1, wg, dg, mg, nb, a, rb, K, acc0, acc1); break;
        }
        store_rows(acc0, R, bv0, y, ldy, y_bf16, r, gi);
        store_rows(acc1, R, bv1, y, ldy, y_bf16, r, gi + 1);
    }
}
#endif

/* Rows m0..m1 times weight group gi. */
static inline __attribute__((always_inline)) void group_rows(
        int bits, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
        const float *bias, const uint8_t *scratch, int64_t rb, int64_t K, int64_t m0, int64_t m1,
        int64_t gi, void *y, int64_t ldy, int y_bf16) {
    const uint8_t *wg = w + gi * nb * 4 * bits * G;
    const uint16_t *dg = d + gi * nb * G, *mg = bits == 4 ? mn + gi * nb * G : NULL;
    const vf bv = bias ? vf_loadu(bias + gi * G) : vf_zero();
    vnni_rows(bits, wg, dg, mg, nb, scratch, rb, K, m0, m1, gi, bv, y, ldy, y_bf16);
}

/* Rows 0..M of the scratch times the weight groups, on the VNNI / AVX2 tiles: this thread's share. */
static inline __attribute__((always_inline)) void vnni_products(
        int bits, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
        const float *bias, const uint8_t *scratch, int64_t rb, int64_t K, int64_t M,
        int64_t groups, void *y, int64_t ldy, int y_bf16) {
    const int T = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t g0 = groups * t / T, g1 = groups * (t + 1) / T;
    for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int64_t m1 = m0 + M_BLOCK < M ? m0 + M_BLOCK : M;
#if defined(TILE2)
        if (M >= DYNAMIC_ROWS && bits == 4) { /* pairs of groups (see tile2) */
#pragma omp for schedule(dynamic, GROUP_CHUNK / 2) nowait
            for (int64_t gi = 0; gi < groups; gi += 2) {
                if (gi + 1 < groups)
                    pair_rows(w, d, mn, nb, bias, scratch, rb, K, m0, m1, gi, y, ldy, y_bf16);
                else /* an odd group count's last */
                    group_rows(bits, w, d, mn, nb, bias, scratch, rb, K, m0, m1, gi, y, ldy, y_bf16);
            }
            continue;
        }
#endif
        if (M >= DYNAMIC_ROWS) { /* every thread takes this branch: M is the team's */
#pragma omp for schedule(dynamic, GROUP_CHUNK) nowait
            for (int64_t gi = 0; gi < groups; gi++)
                group_rows(bits, w, d, mn, nb, bias, scratch, rb, K, m0, m1, gi, y, ldy, y_bf16);
        } else {
            for (int64_t gi = g0; gi < g1; gi++)
                group_rows(bits, w, d, mn, nb, bias, scratch, rb, K, m0, m1, gi, y, ldy, y_bf16);
        }
    }
}

#if defined(HAS_AMX)
/* group_rows for amx_tiles.c (passed to pg_amx_products): a call's rows beyond its whole AMX tiles. */
static void amx_rest_rows(int bits, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
                          const float *bias, const uint8_t *scratch, int64_t rb, int64_t K, int64_t m0,
                          int64_t m1, int64_t gi, void *y, int64_t ldy, int y_bf16) {
    group_rows(bits, w, d, mn, nb, bias, scratch, rb, K, m0, m1, gi, y, ldy, y_bf16);
}
#endif

/* The product run by every thread of an enclosing parallel region (one call each): the rows are
   quantized (with the barrier ending that loop), then each thread takes its share of the weight
   groups. No barrier at the end: a caller that reads y inside the region puts one. */
void pg_matmul_team(int bits, const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                    const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
                    const float *bias, void *y, int64_t ldy, int y_bf16, uint8_t *scratch) {
    const int64_t nb = K / 32, rb = row_bytes(K), groups = N / G;
    const int esize = x_bf16 ? 2 : 4;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; r++)
        quantize_row((const char *)x + r * ldx * esize, x_bf16, K, scratch + r * rb);
#if defined(HAS_AMX)
    if (pg_amx_on && M >= AMX_ROWS) {
        const int T = omp_get_num_threads(), t = omp_get_thread_num();
        pg_amx_products(bits, w, d, mn, nb, bias, scratch, rb, K, M, groups * t / T,
                        groups * (t + 1) / T, y, ldy, y_bf16, amx_rest_rows);
        return;
    }
#endif
    vnni_products(bits, w, d, mn, nb, bias, scratch, rb, K, M, groups, y, ldy, y_bf16);
}

#endif
