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
   rows; the float epilogue per block, not the tile products, bounds it.

   This file: the products' entry points; each thread's work is products.c's (rounding, VNNI and
   AVX2 tiles) and amx_tiles.c's. */

#include "pagoda_kernels.h"

#if defined(PG_NATIVE)
static void run(int bits, const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
                const float *bias, void *y, int64_t ldy, int y_bf16, uint8_t *scratch,
                int num_threads) {
    if (num_threads < 1) num_threads = 1;
#pragma omp parallel num_threads(num_threads)
    pg_matmul_team(bits, x, M, K, ldx, x_bf16, w, d, mn, N, bias, y, ldy, y_bf16, scratch);
}

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
int pagoda_q4_rows_per_group(void) { return 0; }
int64_t pagoda_q4_scratch_bytes(int64_t M, int64_t K) { return 0 * M * K; }
void pagoda_q4_matmul(const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                      const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t N,
                      const float *bias, void *y, int64_t ldy, int y_bf16,
                      uint8_t *scratch, int num_threads) {}
void pagoda_q8_matmul(const void *x, int64_t M, int64_t K, int64_t ldx, int x_bf16,
                      const uint8_t *w, const uint16_t *d, int64_t N,
                      const float *bias, void *y, int64_t ldy, int y_bf16,
                      uint8_t *scratch, int num_threads) {}
#endif
