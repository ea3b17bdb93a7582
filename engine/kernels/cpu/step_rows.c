/* The two ends of a decode step that are one row each and were a handful of torch calls each
   (~10 us apiece, every step): a token's embedding read from the LM head's int8 table (a tied
   model's: engine/layers/int8_embedding.py), and the argmax of a greedy row's logits
   (engine/sampling/sampler.py). Both give exactly the bits of the torch code they replace. */

#include "pagoda_kernels.h"

#if defined(PG_NATIVE)
/* RNE to bf16, as torch rounds a finite float32. */
static inline uint16_t to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Rows ids[0..T) of the int8 table in qmatmul.c's layout (codes q + 128 as
   [V / rows, H / 32, 8, rows, 4], column 32 b + 4 s + t of a row at [b, s, lane, t]; fp16 scales
   [V / rows, H / 32, rows]) -> out [T, H]: (q - 128) * d in float32, then bf16 where asked
   (Int8Embedding.forward's arithmetic). Returns how many ids lay outside 0..V - 1 (their rows
   are zeros): the caller refuses the step. */
int64_t pagoda_embed_int8(const uint8_t *codes, const uint16_t *scales, int64_t rows, int64_t V,
                          int64_t H, const int64_t *ids, int64_t T, void *out, int64_t out_bf16) {
    const int64_t nb = H / 32;
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        float row[32];
        const int64_t id = ids[t];
        const int ok = id >= 0 && id < V;
        bad += !ok;
        const int64_t g = ok ? id / rows : 0, lane = ok ? id % rows : 0;
        const uint8_t *q = codes + g * nb * 8 * rows * 4;
        const uint16_t *d = scales + g * nb * rows;
        for (int64_t b = 0; b < nb; b++) {
            const float scale = ok ? _cvtsh_ss(d[b * rows + lane]) : 0.0f;
            for (int s = 0; s < 8; s++)
                for (int k = 0; k < 4; k++)
                    row[4 * s + k] = ((float)q[((b * 8 + s) * rows + lane) * 4 + k] - 128.0f) * scale;
            if (out_bf16) {
                uint16_t *o = (uint16_t *)out + t * H + b * 32;
                for (int c = 0; c < 32; c++) o[c] = to_bf16(row[c]);
            } else {
                memcpy((float *)out + t * H + b * 32, row, sizeof row);
            }
        }
    }
    return bad;
}

/* The first index of one row's maximum, a NaN above every number: torch.argmax's answer. One
   vectorised pass for the maximum (and whether any NaN), then the first block of 64 that holds
   it, then the index inside that block. */
static int64_t argmax_row(const float *x, int64_t n) {
    float m = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t i = 0; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    int64_t i = 0;
    if (nan) {
        while (x[i] == x[i]) i++;
        return i;
    }
    for (; i + 64 <= n; i += 64) {
        int hit = 0;
#pragma omp simd reduction(| : hit)
        for (int j = 0; j < 64; j++) hit |= x[i + j] == m;
        if (hit) break;
    }
    while (x[i] != m) i++;
    return i;
}

/* out[r] = argmax of row r of x [rows, n] (row stride ld floats); rows spread over num_threads. */
void pagoda_argmax_rows(const float *x, int64_t rows, int64_t n, int64_t ld, int64_t *out,
                        int64_t num_threads) {
    if (rows < 2 || num_threads < 2) {
        for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * ld, n);
        return;
    }
#pragma omp parallel for schedule(static) num_threads((int)num_threads)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * ld, n);
}

#else
int64_t pagoda_embed_int8(const uint8_t *codes, const uint16_t *scales, int64_t rows, int64_t V,
                          int64_t H, const int64_t *ids, int64_t T, void *out, int64_t out_bf16) {
    return T;
}
void pagoda_argmax_rows(const float *x, int64_t rows, int64_t n, int64_t ld, int64_t *out,
                        int64_t num_threads) {}
#endif
