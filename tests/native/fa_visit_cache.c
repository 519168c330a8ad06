// Patch 0010: the row kernel's visiting lists are built once per graph compute and reused by every
// flash-attention node after the first. Two "layers" read one mask; each must give the bytes it
// gives alone in a fresh graph. Then the mask (and kv_order) change in place, in the same buffers,
// and the same graph computes again: a list kept from the first compute would visit the old
// cells, so each layer must give the bytes a fresh graph gives with the new mask. Prints
//   <case> <layer> <same|DIFFERENT>
// for test_fa_visit_cache.py.
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_KV      512
#define N_SEQ     8
#define N_HEAD    4
#define N_HEAD_KV 2
#define D         64

static uint64_t rng_state = 2463534242ull;
static float frand(void) {  // xorshift64: the same data on every run
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

// epoch 0: cells round-robin over the sequences, as decode steps allocate them; epoch 1: the
// ownership rotated by 3 cells and every 5th cell a hole, so every row visits other cells
static void cell_owner(int epoch, int c, int * seq, int * pos) {
    const int cc = epoch ? c + 3 : c;
    *seq = (epoch && c % 5 == 0) ? -1 : cc % N_SEQ;
    *pos = cc / N_SEQ;
}

static void fill_mask(int epoch, int n_q, ggml_fp16_t * md, int32_t * od) {
    for (int r = 0; r < n_q; r++) {
        const int rs = r % N_SEQ, rp = N_KV / N_SEQ - 2 - (r / N_SEQ) % 3;
        for (int c = 0; c < N_KV; c++) {
            int cs, cp;
            cell_owner(epoch, c, &cs, &cp);
            md[(size_t) r * N_KV + c] = ggml_fp32_to_fp16(cs == rs && cp <= rp ? 0.0f : -INFINITY);
        }
    }
    int n = 0;  // cells by position, then index (batch-invariant mode's order)
    for (int p = 0; p <= N_KV; p++) {
        for (int c = 0; c < N_KV; c++) {
            int cs, cp;
            cell_owner(epoch, c, &cs, &cp);
            if (cp == p) od[n++] = c;
        }
    }
}

struct layer { struct ggml_tensor * q, * k, * v; };

static struct layer new_layer(struct ggml_context * ctx, int n_q) {
    struct layer l = {
        ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, n_q, N_HEAD, 1),
        ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, N_KV, N_HEAD_KV, 1),
        ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, N_KV, N_HEAD_KV, 1),
    };
    for (int64_t i = 0; i < ggml_nelements(l.q); i++) ((float *) l.q->data)[i] = frand();
    for (int64_t i = 0; i < ggml_nelements(l.k); i++) ((ggml_fp16_t *) l.k->data)[i] = ggml_fp32_to_fp16(frand());
    for (int64_t i = 0; i < ggml_nelements(l.v); i++) ((ggml_fp16_t *) l.v->data)[i] = ggml_fp32_to_fp16(frand());
    return l;
}

static struct ggml_tensor * attend(struct ggml_context * ctx, struct layer l, struct ggml_tensor * m,
                                   struct ggml_tensor * order, int invariant) {
    struct ggml_tensor * out = ggml_flash_attn_ext(ctx, l.q, l.k, l.v, m, 1.0f / sqrtf((float) D), 0.0f, 0.0f);
    if (invariant) {
        ggml_flash_attn_ext_set_kv_order(out, order);
    }
    return out;
}

static void compute(struct ggml_cgraph * gf, int invariant) {
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, 2);
    ggml_backend_cpu_set_batch_invariant(backend, invariant);
    ggml_backend_graph_compute(backend, gf);
    ggml_backend_free(backend);
}

// layer `l` alone, in a fresh context and graph, over a fresh copy of the mask of `epoch`
static int same_as_alone(struct layer l, int n_q, int epoch, int invariant, const struct ggml_tensor * got) {
    struct ggml_init_params ip = { (size_t) 16 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, N_KV, n_q, 1, 1);
    struct ggml_tensor * order = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, N_KV, 1);
    fill_mask(epoch, n_q, m->data, order->data);
    struct ggml_tensor * out = attend(ctx, l, m, order, invariant);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    compute(gf, invariant);
    const int same = memcmp(out->data, got->data, ggml_nbytes(out)) == 0;
    ggml_free(ctx);
    return same;
}

static void run_case(int n_q, int invariant) {
    struct ggml_init_params ip = { (size_t) 32 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct layer l0 = new_layer(ctx, n_q), l1 = new_layer(ctx, n_q);
    struct ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, N_KV, n_q, 1, 1);
    struct ggml_tensor * order = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, N_KV, 1);
    struct ggml_tensor * o0 = attend(ctx, l0, m, order, invariant);
    struct ggml_tensor * o1 = attend(ctx, l1, m, order, invariant);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, o0);
    ggml_build_forward_expand(gf, o1);
    for (int epoch = 0; epoch < 2; epoch++) {
        fill_mask(epoch, n_q, m->data, order->data);  // in place: the same tensors and buffers
        compute(gf, invariant);
        const char * mode = invariant ? "invariant" : "default";
        printf("q%d_%s_compute%d layer0 %s\n", n_q, mode, epoch, same_as_alone(l0, n_q, epoch, invariant, o0) ? "same" : "DIFFERENT");
        printf("q%d_%s_compute%d layer1 %s\n", n_q, mode, epoch, same_as_alone(l1, n_q, epoch, invariant, o1) ? "same" : "DIFFERENT");
    }
    ggml_free(ctx);
}

int main(void) {
    const int QS[] = { 1, 16, 96 };  // 96: the row kernel chosen over the tiled one (interleaved pool)
    for (size_t j = 0; j < sizeof(QS) / sizeof(QS[0]); j++) {
        for (int invariant = 0; invariant < 2; invariant++) {
            run_case(QS[j], invariant);
        }
    }
    return 0;
}
