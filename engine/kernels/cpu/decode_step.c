/* One decode step of a Llama-family model on the CPU, every layer in one call: B sequences, one
   new token each, over the paged K/V pool, with the projections in qmatmul.c's int4/int8 layouts.

   Per layer: h = rmsnorm(res) * w_in; qkv = h Wqkv (+ b); rotary on the Q and K heads; K and V
   written to the pool at the token's slot; attention of each query head over its sequence's
   cached tokens (read through the block table); res += o Wo; h = rmsnorm(res) * w_post;
   res += (silu(g) * u) Wdown with [g | u] = h Wgu. Then rmsnorm(res) * w_final is the output.
   What other families add, each where its layer has it (pg_layer): Q/K heads normalised before
   rotary (Qwen3, Gemma 3); attention's and the MLP's outputs normalised before they join the
   residual, GeGLU, a RoPE table per layer and sliding-window layers over a pool of their own
   (Gemma 3; its norms' (1 + w) and scaled embeddings are the caller's).

   The residual stream, norms, rotary, softmax and activations are float32 (the torch path rounds
   several of them to bf16); K/V are stored in the pool's dtype and read back from it, as the
   torch path reads them, so a token's K/V are the same bits whichever path wrote them only when
   both computed them alike (they do not: a decode and a prefill are different arithmetic, in
   either implementation).

   Every output element's operations depend only on its own row: norms and activations per row,
   attention per (row, query head) in one thread (a KV head's query heads together, each with
   its own arithmetic), the products through qmatmul.c's row-invariant
   tiles. So a sequence's tokens do not depend on the batch, the thread count or where its blocks
   lie in the pool. All threads run the whole step in one parallel region, with a barrier
   between phases (an OpenMP fork per product cost more than the work of a small layer).

   This file: the step's driver, norms and rotary; attention is attention.c's, the products
   qmatmul.c's. */

#include "pagoda_kernels.h"

#include <stdlib.h>

#if defined(PG_NATIVE)
static void rms_norm(const float *x, const float *w, int64_t n, float eps, float *out) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* r += o (when o is not NULL: the residual add of the sublayer before), then out = rmsnorm(r) * w. */
static void add_norm(float *r, const float *o, const float *w, int64_t n, float eps, float *out) {
    if (o != NULL) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) r[i] += o[i];
    }
    rms_norm(r, w, n, eps, out);
}

/* x [D] rotated in place by the table row [D]: cos of the D / 2 frequencies, then their sin
   (engine/layers/rotary.py's layout): x * cos + rotate_half(x) * sin, as the torch path. */
static void rotate(float *x, const float *cs, int64_t D) {
    float tmp[512];
    const int64_t half = D / 2;
    const float *sn = cs + half;
    for (int64_t i = 0; i < D; i++) tmp[i] = x[i];
#pragma omp simd
    for (int64_t i = 0; i < half; i++) x[i] = tmp[i] * cs[i] + tmp[i + half] * -sn[i];
#pragma omp simd
    for (int64_t i = half; i < D; i++) x[i] = tmp[i] * cs[i - half] + tmp[i - half] * sn[i - half];
}

static inline void product(const pg_proj *p, const float *x, int64_t B, int64_t K, float *y,
                           uint8_t *scratch) {
    pg_matmul_team((int)p->bits, x, B, K, K, 0, p->w, p->d, p->m, p->n, p->bias, y, p->n, 0, scratch);
}

/* Largest head_dim and block_size attend() takes (its stack buffers). */
int64_t pagoda_decode_max_head_dim(void) { return 512; }
int64_t pagoda_decode_max_block_size(void) { return 256; }

/* Float32 work area the step needs for B rows, in floats. */
int64_t pagoda_decode_work_floats(const pg_shape *s, int64_t B) {
    const int64_t qkv = (s->heads + 2 * s->kv_heads) * s->head_dim;
    return B * (3 * s->hidden + qkv + s->heads * s->head_dim + 3 * s->inter);
}

/* The activation scratch the products need for B rows, in bytes. */
int64_t pagoda_decode_scratch_bytes(const pg_shape *s, int64_t B) {
    int64_t k = s->hidden;
    if (s->heads * s->head_dim > k) k = s->heads * s->head_dim;
    if (s->inter > k) k = s->inter;
    return B * row_bytes(k);
}

/* tanh-approximated GELU (transformers' gelu_pytorch_tanh), tanh(u) as 1 - 2 / (exp(2u) + 1). */
static inline float gelu_tanh(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + (1.0f - 2.0f / (pg_exp(2.0f * u) + 1.0f)));
}

/* The output of the previous layer's MLP (in tmp) readied to join the residual: normalised where
   the layer has a norm for it (Gemma). */
static inline void mlp_out(const pg_layer *prev, float *t, int64_t n, float eps) {
    if (prev != NULL && prev->mlp_out_norm != NULL) rms_norm(t, prev->mlp_out_norm, n, eps, t);
}

/* x [B, hidden] (bf16 or fp32, the embeddings) -> out [B, hidden] (bf16 or fp32) after the final
   norm; positions, slots [B]; tables [B, table_width] block ids; window_slots and window_tables
   the same in the sliding-window layers' pool (the full ones where the model keeps one pool);
   ctx [B] tokens cached after this step's write. */
void pagoda_decode_step(const pg_layer *layers, int64_t num_layers, const float *final_norm,
                        const pg_shape *s, int64_t B, const void *x, int64_t x_bf16,
                        const int64_t *positions, const int64_t *slots, const int32_t *tables,
                        const int64_t *window_slots, const int32_t *window_tables,
                        const int32_t *ctx, void *out, int64_t out_bf16,
                        float *work, uint8_t *scratch) {
    pagoda_decode_layers(layers, num_layers, final_norm, s, B, x, x_bf16, positions, slots, tables,
                         window_slots, window_tables, ctx, out, out_bf16, work, scratch, 0, num_layers);
}

/* The same step, layers first..last-1 only: a step run in parts, so that the caller can run
   something else between them (the engine: a newcomer's short step, engine/models/fused_decode.py).
   What carries from one part to the next is in ``work``: the residual stream and the last layer's
   MLP output (res and tmp below), so the parts must share it, unchanged in between, and the same
   B and rows; x is read when first is 0, out written when last is num_layers. The arithmetic is
   the whole step's, so the parts give its bits. */
void pagoda_decode_layers(const pg_layer *layers, int64_t num_layers, const float *final_norm,
                          const pg_shape *s, int64_t B, const void *x, int64_t x_bf16,
                          const int64_t *positions, const int64_t *slots, const int32_t *tables,
                          const int64_t *window_slots, const int32_t *window_tables,
                          const int32_t *ctx, void *out, int64_t out_bf16,
                          float *work, uint8_t *scratch, int64_t first, int64_t last) {
    if (first < 0) first = 0;
    if (last > num_layers) last = num_layers;
    const int64_t hid = s->hidden, H = s->heads, KVH = s->kv_heads, D = s->head_dim, I = s->inter;
    const int64_t qkv_n = (H + 2 * KVH) * D, group = H / KVH, esize = s->kv_bf16 ? 2 : 4;
    float *res = work, *h = res + B * hid, *tmp = h + B * hid, *qkv = tmp + B * hid;
    float *att = qkv + B * qkv_n, *gu = att + B * H * D, *act = gu + B * 2 * I;
    /* Attention's work items: with rows enough to keep the threads busy, a row's heads together
       (its K/V rows read whole); else a KV head's query heads together (they share its K/V rows),
       split into chunks when there are still too few items (one long stream, say) or more heads
       than attend() takes. A head's result does not depend on its item. */
    const int64_t threads = s->num_threads > 0 ? s->num_threads : 1;
    pg_items it = {.kv_items = KVH, .chunks = (group + PG_MAX_GROUP - 1) / PG_MAX_GROUP};
    if (B >= 4 * threads && group <= PG_MAX_GROUP && H <= PG_MAX_ITEM_HEADS && H * D <= PG_ITEM_FLOATS)
        it.kv_items = 1;
    while (it.chunks < group && B * it.kv_items * it.chunks < 4 * threads) it.chunks++;
    it.chunk_heads = (group + it.chunks - 1) / it.chunks;
    it.chunks = (group + it.chunk_heads - 1) / it.chunk_heads;
    /* A prompt chunk's rows (consecutive, one block table, each the next position) attend in
       groups of up to PG_ROW_GROUP, their K/V widened once (pg_attend_rows): the same bits as
       each row alone, so a token does not depend on how its prompt was cut. */
    int64_t *groups = NULL, ngroups = 0;
    const int64_t w = s->table_width;
    if (it.kv_items == 1 && it.chunks == 1 && (groups = malloc(sizeof(int64_t) * (B + 1))) != NULL) {
        for (int64_t b = 0; b < B; b++)
            if (b == 0 || b - groups[ngroups - 1] >= PG_ROW_GROUP || ctx[b] != ctx[b - 1] + 1 ||
                memcmp(tables + b * w, tables + (b - 1) * w, sizeof(int32_t) * w) != 0)
                groups[ngroups++] = b;
        groups[ngroups] = B;
        if (ngroups == B) free(groups), groups = NULL; /* decodes only: the items below */
    }
    if (first == 0)
        for (int64_t i = 0; i < B * hid; i++)
            res[i] = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
#pragma omp parallel num_threads(s->num_threads > 0 ? (int)s->num_threads : 1)
    {
        for (int64_t l = first; l < last; l++) {
            const pg_layer *L = &layers[l], *prev = l > 0 ? &layers[l - 1] : NULL;
            const int64_t *sl = L->window > 0 ? window_slots : slots;
            const int32_t *tb = L->window > 0 ? window_tables : tables;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) { /* the previous layer's MLP output joins the residual here */
                mlp_out(prev, tmp + b * hid, hid, s->eps);
                add_norm(res + b * hid, l > 0 ? tmp + b * hid : NULL, L->in_norm, hid, s->eps, h + b * hid);
            }
            product(&L->qkv, h, B, hid, qkv, scratch);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) { /* Q/K norms, rotary, then this token's K/V into the pool */
                float *row = qkv + b * qkv_n;
                if (L->q_norm != NULL) {
                    for (int64_t hh = 0; hh < H; hh++) rms_norm(row + hh * D, L->q_norm, D, s->eps, row + hh * D);
                    for (int64_t hh = H; hh < H + KVH; hh++) rms_norm(row + hh * D, L->k_norm, D, s->eps, row + hh * D);
                }
                const float *cs = L->cos_sin + positions[b] * D;
                for (int64_t hh = 0; hh < H + KVH; hh++) rotate(row + hh * D, cs, D);
                char *kd = (char *)L->k_cache + sl[b] * KVH * D * esize;
                char *vd = (char *)L->v_cache + sl[b] * KVH * D * esize;
                const float *k = row + H * D, *v = k + KVH * D;
                for (int64_t i = 0; i < KVH * D; i++) {
                    if (s->kv_bf16) {
                        ((uint16_t *)kd)[i] = f32_to_bf16(k[i]);
                        ((uint16_t *)vd)[i] = f32_to_bf16(v[i]);
                    } else {
                        ((float *)kd)[i] = k[i];
                        ((float *)vd)[i] = v[i];
                    }
                }
            }
            /* from DYNAMIC_ROWS rows dealt out one at a time: an item's cost is its row's context,
               and a step's rows differ (fixed halves of 32 rows of mixed lengths took 1.07x as
               long); below, fixed shares (a shared counter cost 1 row ~3%) */
            const int64_t items = B * it.kv_items * it.chunks;
            if (groups != NULL) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t g = 0; g < ngroups; g++) {
                    if (groups[g + 1] - groups[g] == 1) /* one item a row here */
                        pg_attend_item(groups[g], &it, qkv, qkv_n, L, s, tb, ctx, att);
                    else
                        pg_attend_rows(groups[g], groups[g + 1] - groups[g], qkv, qkv_n, L, s, tb, ctx, att);
                }
            } else if (B >= DYNAMIC_ROWS) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t item = 0; item < items; item++)
                    pg_attend_item(item, &it, qkv, qkv_n, L, s, tb, ctx, att);
            } else {
#pragma omp for schedule(static)
                for (int64_t item = 0; item < items; item++)
                    pg_attend_item(item, &it, qkv, qkv_n, L, s, tb, ctx, att);
            }
            product(&L->o, att, B, H * D, tmp, scratch);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                if (L->attn_out_norm != NULL)
                    rms_norm(tmp + b * hid, L->attn_out_norm, hid, s->eps, tmp + b * hid);
                add_norm(res + b * hid, tmp + b * hid, L->post_norm, hid, s->eps, h + b * hid);
            }
            product(&L->gate_up, h, B, hid, gu, scratch);
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                const float *g = gu + b * 2 * I, *u = g + I;
                float *a = act + b * I;
                if (s->gelu) {
#pragma omp simd
                    for (int64_t i = 0; i < I; i++) a[i] = gelu_tanh(g[i]) * u[i];
                } else {
#pragma omp simd
                    for (int64_t i = 0; i < I; i++) a[i] = g[i] / (1.0f + pg_exp(-g[i])) * u[i];
                }
            }
            product(&L->down, act, B, I, tmp, scratch);
#pragma omp barrier
        }
        if (last == num_layers) {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++) {
                float *y = h + b * hid;
                mlp_out(num_layers > 0 ? &layers[num_layers - 1] : NULL, tmp + b * hid, hid, s->eps);
                add_norm(res + b * hid, num_layers > 0 ? tmp + b * hid : NULL, final_norm, hid, s->eps, y);
                for (int64_t i = 0; i < hid; i++) {
                    if (out_bf16) ((uint16_t *)out)[b * hid + i] = f32_to_bf16(y[i]);
                    else ((float *)out)[b * hid + i] = y[i];
                }
            }
        }
    }
    free(groups);
}

#else /* no AVX2/FMA/F16C: pagoda_decode_max_head_dim() 0 says so */
int64_t pagoda_decode_max_head_dim(void) { return 0; }
int64_t pagoda_decode_max_block_size(void) { return 0; }
int64_t pagoda_decode_work_floats(const pg_shape *s, int64_t B) { return 0 * B; }
int64_t pagoda_decode_scratch_bytes(const pg_shape *s, int64_t B) { return 0 * B; }
void pagoda_decode_step(const pg_layer *layers, int64_t num_layers, const float *final_norm,
                        const pg_shape *s, int64_t B, const void *x, int64_t x_bf16,
                        const int64_t *positions, const int64_t *slots, const int32_t *tables,
                        const int64_t *window_slots, const int32_t *window_tables,
                        const int32_t *ctx, void *out, int64_t out_bf16,
                        float *work, uint8_t *scratch) {}
void pagoda_decode_layers(const pg_layer *layers, int64_t num_layers, const float *final_norm,
                          const pg_shape *s, int64_t B, const void *x, int64_t x_bf16,
                          const int64_t *positions, const int64_t *slots, const int32_t *tables,
                          const int64_t *window_slots, const int32_t *window_tables,
                          const int32_t *ctx, void *out, int64_t out_bf16,
                          float *work, uint8_t *scratch, int64_t first, int64_t last) {}
#endif
