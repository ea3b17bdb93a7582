/* The int4 and int8 products' AMX tiles (built with AMX-INT8 and AVX-512, and the kernel grants
   the process the tile state): each whole tile of 16 activation rows takes one tile product per
   block of 16 rows x 16 output lanes, then the VNNI path's float epilogue in its order per lane
   (qmatmul.c's header: the same bits); the rest of a call's rows keep the VNNI tiles. Here too
   the library's one AMX switch, pg_amx_on. */

#include "pagoda_kernels.h"

#if defined(HAS_AMX)
#include <sys/syscall.h>
#include <unistd.h>

/* The tile state is off until the process asks (Linux 5.16+): asked once, at load;
   pagoda_q4_set_amx switches the tiles off and on (PAGODA_AMX=0, read by native.py; tests). Every
   product of the library, the decode step's included, reads this one switch. */
int pg_amx_on;
__attribute__((constructor)) static void amx_init(void) {
    pg_amx_on = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
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

/* Rows 0..M of the scratch times weight groups g0..g1 (this thread's share): whole tiles of
   AMX_ROWS rows here, the rest of an M_BLOCK (fewer than AMX_ROWS rows) through rest_rows (the VNNI
   tiles, from products.c). */
void pg_amx_products(int bits, const uint8_t *w, const uint16_t *d, const uint16_t *mn, int64_t nb,
                     const float *bias, const uint8_t *scratch, int64_t rb, int64_t K, int64_t M,
                     int64_t g0, int64_t g1, void *y, int64_t ldy, int y_bf16, pg_rows_fn *rest_rows) {
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
            /* a partial tile would leave lanes of the tile product idle: the rest of the rows
               (fewer than 16) take the VNNI tiles, the same bits */
            if (full < m1)
                rest_rows(bits, w, d, mn, nb, bias, scratch, rb, K, full, m1, gi, y, ldy, y_bf16);
        }
    }
    _tile_release();
}

/* Whether calls of 16 rows or more take the AMX tiles (1), after asking for ``on``
   (0: never); always 0 where the build or the kernel has no AMX. */
int pagoda_q4_set_amx(int on) {
    static int granted = -1;
    if (granted < 0) granted = pg_amx_on;
    pg_amx_on = on && granted;
    return pg_amx_on;
}

int pagoda_q4_amx(void) { return pg_amx_on; }

#else /* no AMX in this build */
int pagoda_q4_set_amx(int on) { return 0 * on; }
int pagoda_q4_amx(void) { return 0; }
#endif
