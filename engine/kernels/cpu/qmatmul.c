/* int4 and int8 weights times int8-quantized activations on the CPU (llama.cpp's Q4_1 and Q8_0
   times Q8_0).

   int4 weights: w = d * q + m per block of 32 input columns, q in 0..15, d and m fp16. Output rows
   are taken G at a time (G = 16 with AVX-512, 8 with AVX2: one vector lane per row), and a
   group's block is 16 G bytes: 4 slices of G x 4 bytes, where byte t of row j in slice s holds
   the code of column 4 s + t in its low nibble and of column 16 + 4 s + t in its high nibble.
   One load and a mask give 4 columns of G rows; d and m of a group's block are G fp16 in a row.
   int8 weights: w = d * q per block of 32, q in -127..127 stored as q + 128 (VNNI multiplies
   unsigned by signed bytes), 8 slices of G x 4 bytes a block, so m = -128 d.

   Activations are quantized per row and block of 32 to int8, a = sa * qa (sa = max |a| / 127).
   Each VNNI dot product multiplies 4 columns of G rows by 4 activation codes broadcast to every
   lane, so a block of one output lane costs 8 integer dot products (exact) and then
       acc += float(q . qa) * (d * sa) + m * (sa * sum(qa))
   in float. A lane's operations and their order do not depend on the number of rows M, the
   row tile or the threads, so a row's result does not depend on what it is batched with, and the
   AVX512-VNNI, AVX-VNNI and AVX2 paths agree bit for bit. Needs AVX2, FMA and F16C;
   pagoda_q4_isa() says which path was compiled (0: none).

   AMX (built with AMX-INT8 and AVX-512, and the kernel grants the process the tile state): each
   whole tile of 16 rows takes one tile product per block of 16 rows x 16 output lanes (TDPBSUD:
   signed activation codes times unsigned weight codes, the same exact int32 as the 8 VNNI dot
   products), then the same float epilogue in the same order per lane; the rest of a call's rows
   (fewer than 16) keep the VNNI tiles. So AMX changes no bit of any result, whatever the rows.
   An int4 block is unpacked to one 8 x 64-byte B tile (the layout's 4 low-nibble then 4
   high-nibble slices are its K rows in order); an int8 block is one as stored. Measured on a
   2-core Xeon with AMX (SmolLM2's 30 layers of int4 products): 1.13-1.32x the VNNI path at 16-128
   rows; the float epilogue per block, not the tile products, bounds it. */

#define _DEFAULT_SOURCE /* syscall() under -std=c11 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <omp.h>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define HAS_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define M_BLOCK 64 /* activation rows whose codes stay in cache while the weights stream by */
/* The compiler may regroup integer additions, and it turned each row's chain of sums into one
   tree over the block's products: all of them live at once, each spilled to the stack and read
   back (AVX2's 16 registers). An empty asm that "changes" a sum keeps the chain as written. */
#define PIN(v) __asm__("" : "+v"(v))
/* From this many rows the weight groups are dealt out GROUP_CHUNK at a time to whichever thread
   is free, not split in fixed halves: a thread the OS runs something else on for a few ms (the
   web process and its clients share these cores) no longer holds the others at the next barrier.
   Measured (Xeon AVX-512, 2 cores; the fused step, 8-step alternation in one process): 64 rows
   0.90x the time, 32 rows of mixed lengths 0.89x, with a background load 0.92x. Below it a group
   is too little work (1 row: ~0.1 us) for a shared counter: 1 row was 1.09x slower dynamic. */
#define DYNAMIC_ROWS 16
#define GROUP_CHUNK 4

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define G 16
#define ROW_TILE 8 /* activation rows a tile of int4 weights takes */
#define ROW_TILE_8 8 /* of int8 weights */
typedef __m512i vi;
typedef __m512 vf;
#define vi_load(p) _mm512_loadu_si512((const void *)(p))
#define vi_and _mm512_and_si512
#define vi_srl4(x) _mm512_srli_epi16((x), 4)
#define vi_set1 _mm512_set1_epi32
#define vi_set1_8 _mm512_set1_epi8
#define vi_zero _mm512_setzero_si512
#define vf_zero _mm512_setzero_ps
#define vf_set1 _mm512_set1_ps
#define vf_cvt _mm512_cvtepi32_ps
#define vf_fma _mm512_fmadd_ps
#define vf_mul _mm512_mul_ps
#define vf_add _mm512_add_ps
#define vf_loadu _mm512_loadu_ps
#define vf_storeu _mm512_storeu_ps
#define vf_ph(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define vi_add _mm512_add_epi32
#define vi_sll4(x) _mm512_slli_epi32((x), 4)
#if defined(__AVX512VNNI__)
#define HAS_VNNI 1
#define vdot(acc, w, a) _mm512_dpbusd_epi32((acc), (w), (a))
#else
#define vdot(acc, w, a) _mm512_add_epi32((acc), _mm512_madd_epi16(_mm512_maddubs_epi16((w), (a)), _mm512_set1_epi16(1)))
#define vmul16 _mm512_maddubs_epi16
#define vadd16 _mm512_add_epi16
#define vwiden(x) _mm512_madd_epi16((x), _mm512_set1_epi16(1))
#endif
static inline void store_bf16(uint16_t *dst, vf v) {
    __m512i u = _mm512_castps_si512(v);
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                             _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}
#else
#define G 8
typedef __m256i vi;
typedef __m256 vf;
#define vi_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define vi_and _mm256_and_si256
#define vi_srl4(x) _mm256_srli_epi16((x), 4)
#define vi_set1 _mm256_set1_epi32
#define vi_set1_8 _mm256_set1_epi8
#define vi_zero _mm256_setzero_si256
#define vf_zero _mm256_setzero_ps
#define vf_set1 _mm256_set1_ps
#define vf_cvt _mm256_cvtepi32_ps
#define vf_fma _mm256_fmadd_ps
#define vf_mul _mm256_mul_ps
#define vf_add _mm256_add_ps
#define vf_loadu _mm256_loadu_ps
#define vf_storeu _mm256_storeu_ps
#define vf_ph(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define vi_add _mm256_add_epi32
#define vi_sll4(x) _mm256_slli_epi32((x), 4)
#if defined(__AVXVNNI__)
#define HAS_VNNI 1
#define ROW_TILE 4 /* 16 vector registers: the 8 unpacked slices and 4 rows' sums */
#define ROW_TILE_8 4
#define vdot(acc, w, a) _mm256_dpbusd_avx_epi32((acc), (w), (a))
#else /* 2 products of at most 15 * 128 per 16-bit lane: maddubs never saturates */
/* 16 vector registers, measured (AMD EPYC, AVX2): int4 8 rows 1.1x 6 rows; int8's two sums a row
   (the nibbles apart): 4 rows, 1.4x the 6 it had (with PIN below; 3 the same, 5 1.07x slower) */
#define ROW_TILE 8
#define ROW_TILE_8 4
#define vdot(acc, w, a) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((w), (a)), _mm256_set1_epi16(1)))
#define vmul16 _mm256_maddubs_epi16
#define vadd16 _mm256_add_epi16
#define vwiden(x) _mm256_madd_epi16((x), _mm256_set1_epi16(1))
#endif
static inline void store_bf16(uint16_t *dst, vf v) {
    __m256i u = _mm256_castps_si256(v);
    u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                             _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    u = _mm256_srli_epi32(u, 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    _mm_storeu_si128((__m128i *)dst, packed);
}
#endif

static inline __m256 load8(const void *x, int bf16) {
    if (bf16) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    return _mm256_loadu_ps((const float *)x);
}

static inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Scratch of one activation row: codes int8 [K], then sa [K / 32] and asum [K / 32] floats. */
static inline int64_t row_bytes(int64_t K) { return (K + K / 32 * 8 + 63) / 64 * 64; }

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

#if defined(HAS_AMX)
#define AMX_ROWS 16

/* The tile state is off until the process asks (Linux 5.16+): asked once, at load;
   pagoda_q4_set_amx switches the tiles off and on (PAGODA_AMX=0, read by qmatmul.py; tests). */
static int amx_on;
__attribute__((constructor)) static void amx_init(void) {
    amx_on = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

/* Tiles 0 and 1: C, 16 rows x 16 int32; 2 and 3: A, 16 rows x 32 activation codes (one block);
   4 and 5: B, 8 rows x 64 bytes (one block of 16 output lanes, 4 codes a lane per row). Two
   blocks are in flight at a time: a tile product waits for its operands and a tile store for
   its product, so one block's store and epilogue overlap the other's product. */
static void amx_configure(void) {
    _Alignas(64) uint8_t cfg[64] = {0};
    cfg[0] = 1; /* palette */
    uint16_t *colsb = (uint16_t *)(cfg + 16);
    uint8_t *rows = cfg + 48;
    for (int t = 0; t < 2; t++) {
        colsb[t] = 64; rows[t] = AMX_ROWS;
        colsb[2 + t] = 32; rows[2 + t] = AMX_ROWS;
        colsb[4 + t] = 64; rows[4 + t] = 8;
    }
    _tile_loadconfig(cfg);
}

/* One block's B tile: an int4 block unpacked into bt (low-nibble slices, then high), an int8
   block as stored. */
static inline __attribute__((always_inline)) const uint8_t *amx_b(int bits, const uint8_t *wb,
                                                                  uint8_t *bt) {
    if (bits != 4) return wb;
    const vi m4 = vi_set1_8(0x0f);
    for (int s = 0; s < 4; s++) {
        const vi x = vi_load(wb + s * 4 * G);
        _mm512_store_si512((void *)(bt + s * 64), vi_and(x, m4));
        _mm512_store_si512((void *)(bt + (s + 4) * 64), vi_and(vi_srl4(x), m4));
    }
    return bt;
}

/* acc[i] += the block's int32 products c (row i, 16 lanes) in the VNNI path's float order. */
static inline __attribute__((always_inline)) void amx_epilogue(
        int bits, const int32_t *c, const uint16_t *d, const uint16_t *mn, int64_t b, int64_t nb,
        const uint8_t *a, int64_t rb, int64_t K, vf *acc) {
    const vf dv = vf_ph(d + b * G);
    const vf mv = bits == 4 ? vf_ph(mn + b * G) : vf_mul(dv, vf_set1(-128.0f));
    for (int i = 0; i < AMX_ROWS; i++) {
        const float *sa = (const float *)(a + i * rb + K);
        const vi s = _mm512_load_si512((const void *)(c + i * 16));
        acc[i] = vf_fma(vf_cvt(s), vf_mul(dv, vf_set1(sa[b])), acc[i]);
        acc[i] = vf_fma(mv, vf_set1(sa[nb + b]), acc[i]);
    }
}

/* AMX_ROWS activation rows (scratch rows at a, stride rb) times one group of 16 weight rows:
   acc[i] for row i. */
static inline __attribute__((always_inline)) void amx_tile(
        int bits, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
        const uint8_t *a, int64_t rb, int64_t K, vf *acc) {
    _Alignas(64) int32_t c[2][2][AMX_ROWS * 16]; /* [pair parity][block of the pair] */
    _Alignas(64) uint8_t bt[2][8 * 64];
    const int64_t wblock = 4 * bits * G;
    for (int i = 0; i < AMX_ROWS; i++) acc[i] = vf_zero();
    /* Pairs of blocks; a pair's results are read one pair later, once its tile stores are done
       (reading them at once waited on every store). */
    int64_t b = 0, pending = -1;
    for (; b + 1 < nb; b += 2) {
        int32_t *cp = c[(b >> 1) & 1][0], *cq = c[(b >> 1) & 1][1];
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(2, a + b * 32, rb);
        _tile_loadd(4, amx_b(bits, w + b * wblock, bt[0]), 64);
        _tile_loadd(3, a + (b + 1) * 32, rb);
        _tile_loadd(5, amx_b(bits, w + (b + 1) * wblock, bt[1]), 64);
        _tile_dpbsud(0, 2, 4);
        _tile_dpbsud(1, 3, 5);
        _tile_stored(0, cp, 64);
        _tile_stored(1, cq, 64);
        if (pending >= 0) {
            amx_epilogue(bits, c[(pending >> 1) & 1][0], d, mn, pending, nb, a, rb, K, acc);
            amx_epilogue(bits, c[(pending >> 1) & 1][1], d, mn, pending + 1, nb, a, rb, K, acc);
        }
        pending = b;
    }
    if (pending >= 0) {
        amx_epilogue(bits, c[(pending >> 1) & 1][0], d, mn, pending, nb, a, rb, K, acc);
        amx_epilogue(bits, c[(pending >> 1) & 1][1], d, mn, pending + 1, nb, a, rb, K, acc);
    }
    if (b < nb) {
        _tile_zero(0);
        _tile_loadd(2, a + b * 32, rb);
        _tile_loadd(4, amx_b(bits, w + b * wblock, bt[0]), 64);
        _tile_dpbsud(0, 2, 4);
        _tile_stored(0, c[0][0], 64);
        amx_epilogue(bits, c[0][0], d, mn, b, nb, a, rb, K, acc);
    }
}
#endif

/* R activation rows (scratch rows at a, stride rb) times one group of G weight rows of
   ``bits`` 4 or 8. */
static inline __attribute__((always_inline)) void block_epilogue(
        vf *acc, vi s, vf dv, vf mv, const uint8_t *ar, int64_t b, int64_t nb, int64_t K) {
    const float *sa = (const float *)(ar + K);
    *acc = vf_fma(vf_cvt(s), vf_mul(dv, vf_set1(sa[b])), *acc);
    *acc = vf_fma(mv, vf_set1(sa[nb + b]), *acc);
}

static inline __attribute__((always_inline)) void tile(
        int bits, int R, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
        const uint8_t *a, int64_t rb, int64_t K, vf *acc) {
    const vi m4 = vi_set1_8(0x0f);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 4 * bits * G;
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

int pagoda_q4_isa(void) {
#if defined(__AVX512VNNI__) && G == 16
    return 4; /* avx512-vnni */
#elif G == 16
    return 3; /* avx512 */
#elif defined(__AVXVNNI__)
    return 2; /* avx-vnni */
#else
    return 1; /* avx2 */
#endif
}

int pagoda_q4_rows_per_group(void) { return G; }

int64_t pagoda_q4_scratch_bytes(int64_t M, int64_t K) { return M * row_bytes(K); }

/* Whether calls of 16 rows or more take the AMX tiles (1), after asking for ``on``
   (0: never); always 0 where the build or the kernel has no AMX. */
int pagoda_q4_set_amx(int on) {
#if defined(HAS_AMX)
    static int granted = -1;
    if (granted < 0) granted = amx_on;
    amx_on = on && granted;
    return amx_on;
#else
    return 0 * on;
#endif
}

int pagoda_q4_amx(void) {
#if defined(HAS_AMX)
    return amx_on;
#else
    return 0;
#endif
}

/* acc[i] (+ bias bv) into output rows r + i, 0 <= i < R, lanes of weight group gi. */
static inline __attribute__((always_inline)) void store_rows(const vf *acc, int R, vf bv, void *y,
                                                             int64_t ldy, int y_bf16, int64_t r,
                                                             int64_t gi) {
    for (int i = 0; i < R; i++) {
        const vf v = vf_add(acc[i], bv);
        if (y_bf16) store_bf16((uint16_t *)y + (r + i) * ldy + gi * G, v);
        else vf_storeu((float *)y + (r + i) * ldy + gi * G, v);
    }
}

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

/* The product run by every thread of an enclosing parallel region (one call each): the rows are
   quantized (with the barrier ending that loop), then each thread takes its share of the weight
   groups. No barrier at the end: a caller that reads y inside the region puts one. */
static inline __attribute__((always_inline)) void matmul_team(
        int bits, const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
        const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
        const float *bias, void *y, int64_t ldy, int y_bf16, uint8_t *scratch) {
    const int64_t nb = K / 32, rb = row_bytes(K), groups = N / G;
    const int esize = x_bf16 ? 2 : 4;
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; r++)
            quantize_row((const char *)x + r * ldx * esize, x_bf16, K, scratch + r * rb);
        const int T = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t g0 = groups * t / T, g1 = groups * (t + 1) / T;
#if defined(HAS_AMX)
        if (amx_on && M >= AMX_ROWS) {
            vf acc[AMX_ROWS];
            amx_configure();
            for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) {
                const int64_t m1 = m0 + M_BLOCK < M ? m0 + M_BLOCK : M;
                const int64_t full = m0 + (m1 - m0) / AMX_ROWS * AMX_ROWS;
                for (int64_t gi = g0; gi < g1; gi++) {
                    const uint8_t *wg = w + gi * nb * 4 * bits * G;
                    const uint16_t *dg = d + gi * nb * G, *mg = bits == 4 ? mn + gi * nb * G : NULL;
                    const vf bv = bias ? vf_loadu(bias + gi * G) : vf_zero();
                    for (int64_t r = m0; r < full; r += AMX_ROWS) {
                        amx_tile(bits, wg, dg, mg, nb, scratch + r * rb, rb, K, acc);
                        store_rows(acc, AMX_ROWS, bv, y, ldy, y_bf16, r, gi);
                    }
                    /* a partial tile would leave lanes of the tile product idle: the rest of the
                       rows (fewer than 16) take the VNNI tiles, the same bits */
                    vnni_rows(bits, wg, dg, mg, nb, scratch, rb, K, full, m1, gi, bv, y, ldy, y_bf16);
                }
            }
            _tile_release();
            return;
        }
#endif
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
}

static inline __attribute__((always_inline)) void run(
        int bits, const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
        const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
        const float *bias, void *y, int64_t ldy, int y_bf16, uint8_t *scratch, int num_threads) {
    if (num_threads < 1) num_threads = 1;
#pragma omp parallel num_threads(num_threads)
    matmul_team(bits, x, M, K, ldx, x_bf16, w, d, mn, N, bias, y, ldy, y_bf16, scratch);
}

/* y[M, N] = x[M, K] W^T (+ bias[N]) for int4 weights (nibbles, d, m) or int8 ones (q + 128, d);
   x and y fp32 or bf16 with row strides ldx, ldy in elements; K a multiple of 32, N of G;
   scratch of pagoda_q4_scratch_bytes(M, K). */
void pagoda_q4_matmul(const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                      const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
                      const float *bias, void *y, int64_t ldy, int y_bf16,
                      uint8_t *scratch, int num_threads) {
    run(4, x, M, K, ldx, x_bf16, w, d, mn, N, bias, y, ldy, y_bf16, scratch, num_threads);
}

void pagoda_q8_matmul(const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                      const uint8_t *w, const uint16_t *d, int64_t N,
                      const float *bias, void *y, int64_t ldy, int y_bf16,
                      uint8_t *scratch, int num_threads) {
    run(8, x, M, K, ldx, x_bf16, w, d, NULL, N, bias, y, ldy, y_bf16, scratch, num_threads);
}

#else /* no AVX2/FMA/F16C: the engine keeps torch's kernel */
int pagoda_q4_isa(void) { return 0; }
int pagoda_q4_set_amx(int on) { return 0 * on; }
int pagoda_q4_amx(void) { return 0; }
int pagoda_q4_rows_per_group(void) { return 0; }
int64_t pagoda_q4_scratch_bytes(int64_t M, int64_t K) { return 0 * M * K; }
void pagoda_q4_matmul(void) {}
void pagoda_q8_matmul(void) {}
#endif
