/* The engine's CPU kernels, one shared library built from every .c beside this header (build.py):
   the entry points Python calls (PAGODA_API, declared once in native.py's table and checked
   against the prototypes here by tests/engine/kernels/test_cpu_native_library.py), the structs
   they take, the vector types and helpers the files share, and the one copy of their state.

   Files: qmatmul.c (the products' layouts and entry points), products.c (a product's work on
   each thread of a team: activation rounding, the VNNI / AVX2 tiles, the split of the weight
   groups), amx_tiles.c (AMX tiles and the AMX switch), attention.c (the decode step's
   attention; attention_bf16.h, included by it, its bf16 products), decode_step.c (the step
   driver), step_rows.c (the step's one-row ends: the tied embedding's rows, the greedy argmax).
   Built with -fvisibility=hidden: only PAGODA_API names leave the library. */

#ifndef PAGODA_KERNELS_H
#define PAGODA_KERNELS_H

#define _DEFAULT_SOURCE /* syscall() under -std=c11 */
#include <stdint.h>
#include <string.h>

#define PAGODA_API __attribute__((visibility("default")))

/* The decode step's model, described once by engine/models/fused_decode.py (native.py's
   Proj, Layer, Shape). One projection in the products' layouts (qmatmul.c's header). */
typedef struct {
    int64_t bits; /* 4 or 8 */
    const uint8_t *w;
    const uint16_t *d, *m; /* m: NULL for int8 */
    const float *bias;     /* NULL or float32 [n] */
    int64_t n;
} pg_proj;

typedef struct {
    const float *in_norm, *post_norm; /* float32 [hidden]: before attention, before the MLP */
    pg_proj qkv, o, gate_up, down;
    void *k_cache, *v_cache; /* [slots, KVH, D] in the pool dtype */
    const float *q_norm, *k_norm; /* NULL, or float32 [head_dim]: each Q and K head's norm before RoPE */
    /* NULL, or float32 [hidden]: Gemma's norms of attention's and of the MLP's output, before each
       joins the residual */
    const float *attn_out_norm, *mlp_out_norm;
    const float *cos_sin; /* float32 [max_position, head_dim]: this layer's RoPE table, cos then sin
                             of the head_dim / 2 frequencies */
    int64_t window; /* 0, or the last tokens a sliding-window layer attends to (its own included);
                       such a layer's K/V are at the step's window slots and tables */
} pg_layer;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, inter, block_size, table_width;
    float eps, scale;
    int64_t kv_bf16, num_threads;
    int64_t bf16_products; /* attention in bf16 products where the build has them (attention.c) */
    int64_t gelu; /* the MLP's activation: 0 SiLU, 1 tanh-approximated GELU (GeGLU) */
} pg_shape;

/* Entry points (the same in every build: without AVX2/FMA/F16C they do nothing and
   pagoda_q4_isa() and pagoda_decode_max_head_dim() return 0). */
PAGODA_API int pagoda_q4_isa(void);
PAGODA_API int pagoda_q4_set_amx(int on);
PAGODA_API int pagoda_q4_amx(void);
PAGODA_API int pagoda_q4_rows_per_group(void);
PAGODA_API int64_t pagoda_q4_scratch_bytes(int64_t M, int64_t K);
PAGODA_API void pagoda_q4_matmul(const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                                 const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
                                 const float *bias, void *y, int64_t ldy, int y_bf16,
                                 uint8_t *scratch, int num_threads);
PAGODA_API void pagoda_q8_matmul(const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                                 const uint8_t *w, const uint16_t *d, int64_t N,
                                 const float *bias, void *y, int64_t ldy, int y_bf16,
                                 uint8_t *scratch, int num_threads);
PAGODA_API int64_t pagoda_decode_max_head_dim(void);
PAGODA_API int pagoda_attention_bf16_products(void);
PAGODA_API int64_t pagoda_decode_max_block_size(void);
PAGODA_API int64_t pagoda_decode_work_floats(const pg_shape *s, int64_t B);
PAGODA_API int64_t pagoda_decode_scratch_bytes(const pg_shape *s, int64_t B);
PAGODA_API void pagoda_decode_step(const pg_layer *layers, int64_t num_layers, const float *final_norm,
                                   const pg_shape *s, int64_t B, const void *x, int64_t x_bf16,
                                   const int64_t *positions, const int64_t *slots, const int32_t *tables,
                                   const int64_t *window_slots, const int32_t *window_tables,
                                   const int32_t *ctx, void *out, int64_t out_bf16,
                                   float *work, uint8_t *scratch);
PAGODA_API void pagoda_decode_layers(const pg_layer *layers, int64_t num_layers, const float *final_norm,
                                     const pg_shape *s, int64_t B, const void *x, int64_t x_bf16,
                                     const int64_t *positions, const int64_t *slots, const int32_t *tables,
                                     const int64_t *window_slots, const int32_t *window_tables,
                                     const int32_t *ctx, void *out, int64_t out_bf16,
                                     float *work, uint8_t *scratch, int64_t first, int64_t last);
/* step_rows.c: a token's row of the int8 table (the tied embedding), each row's argmax. */
PAGODA_API int64_t pagoda_embed_int8(const uint8_t *codes, const uint16_t *scales, int64_t rows, int64_t V,
                                     int64_t H, const int64_t *ids, int64_t T, void *out, int64_t out_bf16);
PAGODA_API void pagoda_argmax_rows(const float *x, int64_t rows, int64_t n, int64_t ld, int64_t *out,
                                   int64_t num_threads);

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PG_NATIVE 1
#include <immintrin.h>
#include <math.h>
#include <omp.h>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define HAS_AMX 1
#define AMX_ROWS 16
#endif

#define M_BLOCK 64 /* activation rows whose codes stay in cache while the weights stream by */
/* An int4 tile asks for the weight codes and scales this many bytes ahead of the block it works
   on (software prefetch into L1: a block's 4 code lines, then its scale and offset lines). With
   one to a few rows a tile reads ~13 GB/s a core, half of what a plain read of the same bytes
   does, and the hardware's stream prefetch alone does not keep up with three streams a group.
   Measured (bench/kernel_ab.py, SmolLM2, AMD EPYC AVX-512 + VNNI, 2 cores; fused call against
   the build without it): 1 row 0.90-0.92x at 4,096 bytes (0.93x at 1,024 and 2,048, 0.98x at
   512 and 8,192), 2 rows 0.92x, 4 rows 0.91x, 8 rows 0.91x, 32 rows 0.96x. Not for int8 weights:
   the LM head's one-row product was 1.27x slower with its 8 lines a block asked for. */
#define PREFETCH_BYTES 4096
/* The compiler may regroup integer additions, and it turned each row's chain of sums into one
   tree over the block's products: all of them live at once, each spilled to the stack and read
   back (AVX2's 16 registers). An empty asm that "changes" a sum keeps the chain as written. */
#define PIN(v) __asm__("" : "+v"(v))
/* From this many rows the weight groups are dealt out GROUP_CHUNK at a time to whichever thread
   is free, not split in fixed halves: a thread the OS runs something else on for a few ms (the
   web process and its clients share these cores) no longer holds the others at the next barrier.
   Measured (Xeon AVX-512, 2 cores; the fused step, 8-step alternation in one process): 64 rows
   0.90x the time, 32 rows of mixed lengths 0.89x, with a background load 0.92x. Below it a group
   is too little work (1 row: ~0.1 us) for a shared counter: 1 row was 1.09x slower dynamic. The
   decode step's attention deals out its items from this many rows too. */
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
   (the nibbles apart): 4 rows, 1.4x the 6 it had (with PIN; 3 the same, 5 1.07x slower) */
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

/* Scratch of one activation row: codes int8 [K], then sa [K / 32] and asum [K / 32] floats. */
static inline int64_t row_bytes(int64_t K) { return (K + K / 32 * 8 + 63) / 64 * 64; }

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

static inline float bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* exp(x) to about 2 ulp (Cephes' expf polynomial), written so the compiler vectorises a loop of it
   (the clamp as comparisons: fminf/fmaxf stayed library calls, and SiLU's loop scalar, 8 ms of a
   32-row step). A NaN stays NaN. attention.c's pg_exp8 is the same on 8 lanes. */
static inline float pg_exp(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    const float n = rintf(x * 1.44269504088896341f);
    float f = fmaf(n, -0.693359375f, x);
    f = fmaf(n, 2.12194440e-4f, f);
    float p = 1.9875691500e-4f;
    p = fmaf(p, f, 1.3981999507e-3f);
    p = fmaf(p, f, 8.3334519073e-3f);
    p = fmaf(p, f, 4.1665795894e-2f);
    p = fmaf(p, f, 1.6666665459e-1f);
    p = fmaf(p, f, 5.0000001201e-1f);
    const float e = fmaf(p * f, f, f) + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return e * scale;
}

/* The one switch the files share: whether products of AMX_ROWS rows or more take the AMX tiles
   (amx_tiles.c; set at load where the kernel grants the tile state, pagoda_q4_set_amx). */
#if defined(HAS_AMX)
extern int pg_amx_on;
#endif

/* How the decode step's attention is cut into work items: a row's KV heads in kv_items parts
   (1: every KV head of the row in one item), each KV head's query heads in chunks of chunk_heads. */
typedef struct {
    int64_t kv_items, chunks, chunk_heads;
} pg_items;

/* Most query heads of one KV head an item's attention takes at once (a larger group is split
   into chunks of this many); an item holds at most PG_MAX_ITEM_HEADS heads of PG_ITEM_FLOATS
   floats together. */
#define PG_MAX_GROUP 8
#define PG_MAX_ITEM_HEADS 32
#define PG_ITEM_FLOATS 4096

/* Internal, between the files (hidden). */
void pg_matmul_team(int bits, const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                    const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
                    const float *bias, void *y, int64_t ldy, int y_bf16, uint8_t *scratch);
/* Rows m0..m1 of the scratch times weight group gi on the VNNI tiles (products.c). */
typedef void pg_rows_fn(int bits, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
                        const float *bias, const uint8_t *scratch, int64_t rb, int64_t K, int64_t m0,
                        int64_t m1, int64_t gi, void *y, int64_t ldy, int y_bf16);
#if defined(HAS_AMX)
/* The AMX tiles take whole tiles of rows and hand the rest of each block of rows to rest_rows,
   which the caller passes in (products.c's VNNI rows): amx_tiles.c calls nothing of products.c. */
void pg_amx_products(int bits, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
                     const float *bias, const uint8_t *scratch, int64_t rb, int64_t K, int64_t M,
                     int64_t g0, int64_t g1, void *y, int64_t ldy, int y_bf16, pg_rows_fn *rest_rows);
#endif
void pg_attend_item(int64_t item, const pg_items *it, const float *qkv, int64_t qkv_n,
                    const pg_layer *L, const pg_shape *s, const int32_t *tables, const int32_t *ctx,
                    float *att);
/* Rows b0 .. b0 + count - 1 of one sequence, each head of each, K/V widened once for them (attention.c). */
void pg_attend_rows(int64_t b0, int64_t count, const float *qkv, int64_t qkv_n, const pg_layer *L,
                    const pg_shape *s, const int32_t *tables, const int32_t *ctx, float *att);
/* Most rows pg_attend_rows takes at once. */
#define PG_ROW_GROUP 16
#endif /* AVX2, FMA, F16C */

#endif /* PAGODA_KERNELS_H */
