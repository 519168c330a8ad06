// Kernel-level batch invariance of ggml's CPU matmul: column j of W x X must be the same
// bytes whether X has 1 column or n (the other columns are different data). Prints one line
// per (mode, type): the largest difference over n in NS. Built and run by test_matmul_kernels.py.
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void last_column(enum ggml_type type, int K, int M, int n, const float * wf, const float * x,
                        float * out, int invariant, int threads) {
    struct ggml_init_params ip = { (size_t) 256 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * W = ggml_new_tensor_2d(ctx, type, K, M);
    ggml_quantize_chunk(type, wf, W->data, 0, M, K, NULL);
    struct ggml_tensor * X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < K; i++) {
            ((float *) X->data)[(size_t) j * K + i] = j == n - 1 ? x[i] : x[(i * 7 + j) % K] * 0.5f;
        }
    }
    struct ggml_tensor * Y = ggml_mul_mat(ctx, W, X);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, Y);
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, threads);
    ggml_backend_cpu_set_batch_invariant(backend, invariant);
    ggml_backend_graph_compute(backend, gf);
    memcpy(out, (float *) Y->data + (size_t) (n - 1) * M, sizeof(float) * M);
    ggml_backend_free(backend);
    ggml_free(ctx);
}

int main(void) {
    const int K = 1024, M = 96;
    const int NS[] = { 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64 };
    const enum ggml_type TYPES[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
        GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
    };
    float * wf = malloc(sizeof(float) * K * M);
    float * x = malloc(sizeof(float) * K);
    float * one = malloc(sizeof(float) * M);
    float * many = malloc(sizeof(float) * M);
    srand(1);
    for (int i = 0; i < K * M; i++) wf[i] = rand() / (float) RAND_MAX - 0.5f;
    for (int i = 0; i < K; i++) x[i] = rand() / (float) RAND_MAX - 0.5f;
    for (int invariant = 0; invariant < 2; invariant++) {
        for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++) {
            float worst = 0.0f;
            for (int threads = 1; threads <= 2; threads++) {
                last_column(TYPES[t], K, M, 1, wf, x, one, invariant, threads);
                for (size_t k = 0; k < sizeof(NS) / sizeof(NS[0]); k++) {
                    last_column(TYPES[t], K, M, NS[k], wf, x, many, invariant, threads);
                    for (int i = 0; i < M; i++) worst = fmaxf(worst, fabsf(one[i] - many[i]));
                }
            }
            printf("%s %s %g\n", invariant ? "on" : "off", ggml_type_name(TYPES[t]), worst);
        }
    }
    return 0;
}
