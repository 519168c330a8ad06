// Flash attention over a KV pool shared by many sequences (patch 0004), through ggml's public API.
// Each case builds one FLASH_ATTN_EXT over a pool whose cells belong to interleaved sequences
// (many sequences decoding together), to one contiguous band (a prompt chunk), or both in one batch
// (a mixed step: decode rows of many sequences first, then one prompt's chunk), and prints
//   <case> <fnv1a-64 of the output bytes> <largest error against a double-precision reference>
// test_fa_shared_pool.py runs it with and without SKIPPY_FA_SCAN_ALL=1 and compares the lines.
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_KV      1024
#define N_SEQ     16
#define N_HEAD    4
#define N_HEAD_KV 2

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {  // xorshift64: the same data on every run and machine
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

enum { INTERLEAVED, BANDED, MIXED };
#define MIXED_DECODES 32  // a mixed step's decode rows; its prompt chunk sits at cells [256, 256 + n_q - 32)

// which sequence holds a cell (-1: a hole) and at what position
static void cell_owner(int banded, int c, int * seq, int * pos) {
    if (banded == MIXED) {  // sequence 0's new prompt at [256, 352); 15 decoding sequences round-robin elsewhere
        *seq = (c >= 256 && c < 352) ? 0 : 1 + c % (N_SEQ - 1);
        *pos = (c >= 256 && c < 352) ? c - 256 : c / (N_SEQ - 1);
        return;
    }
    if (banded) {  // sequence 0 holds cells [256, 768) in order; the rest belongs to others
        *seq = (c >= 256 && c < 768) ? 0 : 1 + c % 3;
        *pos = (c >= 256 && c < 768) ? c - 256 : c;
        return;
    }
    *seq = (c % 37 == 5) ? -1 : c % N_SEQ;  // round-robin, as decode steps allocate, with holes
    *pos = c / N_SEQ;
}

// query row r: its sequence and position (its own cells up to that position are open)
static void row_owner(int banded, int n_q, int r, int * seq, int * pos) {
    if (banded == MIXED) {
        *seq = r < MIXED_DECODES ? 1 + r % (N_SEQ - 1) : 0;
        *pos = r < MIXED_DECODES ? N_KV : r - MIXED_DECODES;  // a decode row sees all its cells
        return;
    }
    if (banded) {
        *seq = 0;
        *pos = 512 - n_q + r;
        return;
    }
    *seq = r % N_SEQ;
    *pos = N_KV / N_SEQ - 1 - (r / N_SEQ) % 4;
}

static uint64_t fnv1a(const void * data, size_t n) {
    const unsigned char * p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 1099511628211ull;
    }
    return h;
}

static void run_case(int D, int n_q, int banded, int invariant, float max_bias, float softcap) {
    struct ggml_init_params ip = { (size_t) 64 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, n_q, N_HEAD, 1);
    struct ggml_tensor * k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, N_KV, N_HEAD_KV, 1);
    struct ggml_tensor * v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, N_KV, N_HEAD_KV, 1);
    struct ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, N_KV, n_q, 1, 1);
    struct ggml_tensor * order = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, N_KV, 1);

    float * qd = q->data;
    for (int64_t i = 0; i < ggml_nelements(q); i++) qd[i] = frand();
    ggml_fp16_t * kd = k->data;
    ggml_fp16_t * vd = v->data;
    for (int64_t i = 0; i < ggml_nelements(k); i++) kd[i] = ggml_fp32_to_fp16(frand());
    for (int64_t i = 0; i < ggml_nelements(v); i++) vd[i] = ggml_fp32_to_fp16(frand());

    ggml_fp16_t * md = m->data;
    for (int r = 0; r < n_q; r++) {
        int rs, rp;
        row_owner(banded, n_q, r, &rs, &rp);
        for (int c = 0; c < N_KV; c++) {
            int cs, cp;
            cell_owner(banded, c, &cs, &cp);
            const int open = cs == rs && cp <= rp;
            // ALiBi needs a distance in the mask; otherwise 0 or -inf as llama.cpp writes it
            md[(size_t) r * N_KV + c] = ggml_fp32_to_fp16(open ? (max_bias > 0 ? -(float) (rp - cp) : 0.0f) : -INFINITY);
        }
    }
    // cells by position, then index: the order llama.cpp builds in batch-invariant mode
    int32_t * od = order->data;
    int n = 0;
    for (int p = 0; p < N_KV; p++) {
        for (int c = 0; c < N_KV; c++) {
            int cs, cp;
            cell_owner(banded, c, &cs, &cp);
            if (cp == p) od[n++] = c;
        }
    }

    const float scale = 1.0f / sqrtf((float) D);
    struct ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, m, scale, max_bias, softcap);
    if (invariant) {
        ggml_flash_attn_ext_set_kv_order(out, order);
    }
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, 2);
    ggml_backend_cpu_set_batch_invariant(backend, invariant);
    ggml_backend_graph_compute(backend, gf);

    // reference in double: out is [D, N_HEAD, n_q]
    const float * od_out = out->data;
    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(N_HEAD));
    const double m0 = pow(2.0, -(max_bias) / n_head_log2);
    const double m1 = pow(2.0, -(max_bias / 2.0) / n_head_log2);
    double worst = 0.0;
    double * w = malloc(sizeof(double) * N_KV);
    for (int r = 0; r < n_q; r++) {
        for (int h = 0; h < N_HEAD; h++) {
            const double slope = max_bias > 0 ? (h < (int) n_head_log2 ? pow(m0, h + 1) : pow(m1, 2 * (h - n_head_log2) + 1)) : 1.0;
            const int hk = h / (N_HEAD / N_HEAD_KV);
            double mx = -INFINITY;
            for (int c = 0; c < N_KV; c++) {
                const float mv = ggml_fp16_to_fp32(md[(size_t) r * N_KV + c]);
                if (mv == -INFINITY) { w[c] = -INFINITY; continue; }
                double s = 0;
                for (int d = 0; d < D; d++) {
                    s += (double) qd[((size_t) h * n_q + r) * D + d] * ggml_fp16_to_fp32(kd[((size_t) hk * N_KV + c) * D + d]);
                }
                s *= scale;
                if (softcap != 0.0f) s = softcap * tanh(s / softcap);
                w[c] = s + slope * mv;
                if (w[c] > mx) mx = w[c];
            }
            double sum = 0;
            for (int c = 0; c < N_KV; c++) {
                w[c] = w[c] == -INFINITY ? 0.0 : exp(w[c] - mx);
                sum += w[c];
            }
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int c = 0; c < N_KV; c++) {
                    if (w[c] != 0.0) acc += w[c] * ggml_fp16_to_fp32(vd[((size_t) hk * N_KV + c) * D + d]);
                }
                const double err = fabs(acc / sum - od_out[((size_t) r * N_HEAD + h) * D + d]);
                if (err > worst) worst = err;
            }
        }
    }
    free(w);
    printf("D%d_q%d_%s_%s_bias%g_cap%g %016llx %.6g\n", D, n_q,
           banded == MIXED ? "mixed" : banded ? "band" : "interleaved",
           invariant ? "invariant" : "default", max_bias, softcap,
           (unsigned long long) fnv1a(out->data, ggml_nbytes(out)), worst);
    ggml_backend_free(backend);
    ggml_free(ctx);
}

int main(void) {
    const int DS[] = { 64, 80, 128, 256 };
    const int QS[] = { 1, 16, 96 };
    for (size_t i = 0; i < sizeof(DS) / sizeof(DS[0]); i++) {
        for (size_t j = 0; j < sizeof(QS) / sizeof(QS[0]); j++) {
            for (int banded = 0; banded < 2; banded++) {
                for (int invariant = 0; invariant < 2; invariant++) {
                    run_case(DS[i], QS[j], banded, invariant, 0.0f, 0.0f);
                }
            }
        }
    }
    // a mixed step of 128 rows: its middle query tile holds only the prompt's rows, its first the decodes
    for (int invariant = 0; invariant < 2; invariant++) {
        run_case(64, 128, MIXED, invariant, 0.0f, 0.0f);
        run_case(128, 128, MIXED, invariant, 0.0f, 0.0f);
    }
    // ALiBi slopes and a logit softcap, on the interleaved pool
    run_case(64, 16, 0, 0, 8.0f, 0.0f);
    run_case(64, 96, 0, 1, 8.0f, 0.0f);
    run_case(256, 16, 0, 1, 0.0f, 30.0f);
    run_case(256, 96, 0, 0, 0.0f, 30.0f);
    return 0;
}
