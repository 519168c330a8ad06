// Kernel-level batch invariance of ggml's CPU matmul: column j of W x X must be the same
// bytes whether X has 1 column or n (the other columns are different data), and likewise a
// token's rows of MUL_MAT_ID (MoE experts) whether 1 or n tokens are routed to the same experts.
// Prints one line per (mode, op, type): the largest difference over n in NS; then, per type, a
// line "agree mul_mat <type> <worst>": the largest difference of a batch-invariant column (any n)
// from the default kernels' one-column result (upstream's vec_dot), relative to the largest
// |output|, so an invariant kernel that is invariant but wrong fails too. Built and run by
// test_matmul_kernels.py.
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ggml_context * new_context(void) {
    struct ggml_init_params ip = { (size_t) 256 * 1024 * 1024, NULL, false };
    return ggml_init(ip);
}

// Y computed on a CPU backend with the given threads and batch-invariant mode
static void compute(struct ggml_context * ctx, struct ggml_tensor * Y, int invariant, int threads) {
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, Y);
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, threads);
    ggml_backend_cpu_set_batch_invariant(backend, invariant);
    ggml_backend_graph_compute(backend, gf);
    ggml_backend_free(backend);
}

static void last_column(enum ggml_type type, int K, int M, int n, const float * wf, const float * x,
                        float * out, int invariant, int threads) {
    struct ggml_context * ctx = new_context();
    struct ggml_tensor * W = ggml_new_tensor_2d(ctx, type, K, M);
    ggml_quantize_chunk(type, wf, W->data, 0, M, K, NULL);
    struct ggml_tensor * X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < K; i++) {
            ((float *) X->data)[(size_t) j * K + i] = j == n - 1 ? x[i] : x[(i * 7 + j) % K] * 0.5f;
        }
    }
    struct ggml_tensor * Y = ggml_mul_mat(ctx, W, X);
    compute(ctx, Y, invariant, threads);
    memcpy(out, (float *) Y->data + (size_t) (n - 1) * M, sizeof(float) * M);
    ggml_free(ctx);
}

// Batched MUL_MAT as attention-side weights use it (MLA's per-head matrices): W holds 2 matrices
// broadcast over 4 src1 batches, each batch n columns. Out: every batch's last column (4 x M).
static void last_column_batched(enum ggml_type type, int K, int M, int n, const float * wf, const float * x,
                                float * out, int invariant, int threads) {
    struct ggml_context * ctx = new_context();
    struct ggml_tensor * W = ggml_new_tensor_3d(ctx, type, K, M, 2);
    for (int e = 0; e < 2; e++) {
        ggml_quantize_chunk(type, wf + (size_t) (e + 1) * K, (char *) W->data + e * W->nb[2], 0, M, K, NULL);
    }
    struct ggml_tensor * X = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, n, 4);
    for (int h = 0; h < 4; h++) {
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < K; i++) {
                ((float *) X->data)[((size_t) h * n + j) * K + i] =
                    j == n - 1 ? x[(i + 3 * h) % K] : x[(i * 7 + j + h) % K] * 0.5f;
            }
        }
    }
    struct ggml_tensor * Y = ggml_mul_mat(ctx, W, X);
    compute(ctx, Y, invariant, threads);
    for (int h = 0; h < 4; h++) {
        memcpy(out + (size_t) h * M, (float *) Y->data + ((size_t) h * n + n - 1) * M, sizeof(float) * M);
    }
    ggml_free(ctx);
}

// MUL_MAT_ID: n tokens, each routed to 2 of 4 experts; every token uses expert 0, so expert 0
// sees n rows (the tiled kernel from 8 on, one row alone). Out: the last token's 2 x M results.
static void last_token_experts(enum ggml_type type, int K, int M, int n, const float * wf, const float * x,
                               float * out, int invariant, int threads) {
    const int n_exp = 4, n_used = 2;
    struct ggml_context * ctx = new_context();
    struct ggml_tensor * W = ggml_new_tensor_3d(ctx, type, K, M, n_exp);
    for (int e = 0; e < n_exp; e++) {
        // expert e: rows e .. e+M-1 of wf (it holds M + 4 rows), so the experts differ
        ggml_quantize_chunk(type, wf + (size_t) e * K, (char *) W->data + e * W->nb[2], 0, M, K, NULL);
    }
    struct ggml_tensor * X = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, n_used, n);
    struct ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, n);
    for (int t = 0; t < n; t++) {
        for (int u = 0; u < n_used; u++) {
            for (int i = 0; i < K; i++) {
                ((float *) X->data)[((size_t) t * n_used + u) * K + i] =
                    t == n - 1 ? x[(i + u) % K] : x[(i * 7 + t + u) % K] * 0.5f;
            }
        }
        ((int32_t *) ids->data)[t * n_used + 0] = 0;
        ((int32_t *) ids->data)[t * n_used + 1] = t == n - 1 ? 2 : 1 + t % 3;
    }
    struct ggml_tensor * Y = ggml_mul_mat_id(ctx, W, X, ids);
    compute(ctx, Y, invariant, threads);
    memcpy(out, (float *) Y->data + (size_t) (n - 1) * n_used * M, sizeof(float) * n_used * M);
    ggml_free(ctx);
}

typedef void (*case_fn)(enum ggml_type, int, int, int, const float *, const float *, float *, int, int);

static const struct { const char * op; case_fn run; int outputs; } CASES[] = {
    { "mul_mat", last_column, 1 },                  // outputs: the case's result size in units of M
    { "mul_mat_id", last_token_experts, 2 },
    { "mul_mat_batched", last_column_batched, 4 },
};

int main(void) {
    const int K = 1024, M = 96;
    const int NS[] = { 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 33, 64 };  // each side of every kernel switch
    const enum ggml_type TYPES[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
        GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_BF16,
    };
    float * wf = malloc(sizeof(float) * K * (M + 4));
    float * x = malloc(sizeof(float) * K);
    float * one = malloc(sizeof(float) * 4 * M);
    float * many = malloc(sizeof(float) * 4 * M);
    srand(1);
    for (int i = 0; i < K * (M + 4); i++) wf[i] = rand() / (float) RAND_MAX - 0.5f;
    for (int i = 0; i < K; i++) x[i] = rand() / (float) RAND_MAX - 0.5f;
    for (int invariant = 0; invariant < 2; invariant++) {
        for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++) {
            for (size_t c = 0; c < sizeof(CASES) / sizeof(CASES[0]); c++) {
                float worst = 0.0f;
                for (int threads = 1; threads <= 2; threads++) {
                    CASES[c].run(TYPES[t], K, M, 1, wf, x, one, invariant, threads);
                    for (size_t k = 0; k < sizeof(NS) / sizeof(NS[0]); k++) {
                        CASES[c].run(TYPES[t], K, M, NS[k], wf, x, many, invariant, threads);
                        for (int i = 0; i < CASES[c].outputs * M; i++) worst = fmaxf(worst, fabsf(one[i] - many[i]));
                    }
                }
                printf("%s %s %s %g\n", invariant ? "on" : "off", CASES[c].op, ggml_type_name(TYPES[t]), worst);
            }
        }
    }
    for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++) {
        float scale = 0.0f, worst = 0.0f;
        last_column(TYPES[t], K, M, 1, wf, x, one, 0, 1);
        for (int i = 0; i < M; i++) scale = fmaxf(scale, fabsf(one[i]));
        for (int k = -1; k < (int) (sizeof(NS) / sizeof(NS[0])); k++) {
            last_column(TYPES[t], K, M, k < 0 ? 1 : NS[k], wf, x, many, 1, 2);
            for (int i = 0; i < M; i++) worst = fmaxf(worst, fabsf(one[i] - many[i]));
        }
        printf("agree mul_mat %s %g\n", ggml_type_name(TYPES[t]), worst / scale);
    }
    return 0;
}
