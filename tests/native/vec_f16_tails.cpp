// Patch 0005's fp16 vector tails against the scalar loops they stand in for, built with the
// flags ggml-cpu itself was compiled with (test_vec_f16_tails.py reads them from the build), so
// the reference loops below get the same contraction into FMAs as the library's scalar loop.
// Prints one line per check: "<routine> <n> <mismatches or error>"; exits 0.
#include "vec.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(float lo, float hi) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float) ((rng_state >> 11) * (1.0 / 9007199254740992.0));
}

static void fill(std::vector<ggml_fp16_t> & a, float lo, float hi) {
    for (auto & e : a) e = GGML_CPU_FP32_TO_FP16(frand(lo, hi));
}

// the scalar loops of ggml_vec_mad_f16 / ggml_vec_scale_f16, word for word
static void mad_scalar(int n, ggml_fp16_t * y, const ggml_fp16_t * x, float v) {
    for (int i = 0; i < n; ++i) {
        y[i] = GGML_CPU_FP32_TO_FP16(GGML_CPU_FP16_TO_FP32(y[i]) + GGML_CPU_FP16_TO_FP32(x[i])*v);
    }
}

static void scale_scalar(int n, ggml_fp16_t * y, float v) {
    for (int i = 0; i < n; ++i) {
        y[i] = GGML_CPU_FP32_TO_FP16(GGML_CPU_FP16_TO_FP32(y[i])*v);
    }
}

static int mismatches(const std::vector<ggml_fp16_t> & a, const std::vector<ggml_fp16_t> & b) {
    int bad = 0;
    for (size_t i = 0; i < a.size(); i++) bad += a[i] != b[i];
    return bad;
}

#if defined(GGML_SIMD) && !defined(__ARM_FEATURE_SVE) && !defined(__riscv_v_intrinsic)
static const int F16_STEP = GGML_F16_STEP;
#else
static const int F16_STEP = 1;  // the routines end in their own predicated tails
#endif

int main() {
    ggml_cpu_init();
    const int sizes[] = { 1, 3, 4, 7, 8, 15, 16, 17, 24, 31, 33, 48, 64, 80, 96, 100, 112, 128, 144, 192, 256 };
    for (int n : sizes) {
        int bad_mad_tail = 0, bad_mad = 0, bad_scale_tail = 0, bad_scale = 0;
        double dot_err = 0.0;
        int dot_unstable = 0;
        for (int trial = 0; trial < 64; trial++) {
            std::vector<ggml_fp16_t> x(n), y(n);
            fill(x, -4.0f, 4.0f);
            fill(y, -4.0f, 4.0f);
            // softmax weights and rescales: (0, 1], sometimes tiny, sometimes with many digits
            const float v = trial % 8 == 0 ? 1.0f : trial % 8 == 1 ? 1e-6f * frand(0.0f, 1.0f) : frand(0.0f, 1.0f);

            // the tails alone, over the whole vector (where patch 0005 puts them: after the main loop)
            std::vector<ggml_fp16_t> ref(y), got(y);
            mad_scalar(n, ref.data(), x.data(), v);
            int done = ggml_vec_mad_f16_tail(0, n, got.data(), x.data(), v);
            mad_scalar(n - done, got.data() + done, x.data() + done, v);
            bad_mad_tail += mismatches(ref, got);

            // the public routine: the main loop covers n & ~(step-1) (upstream arithmetic, unchanged),
            // the rest must be the scalar loop's bytes
            const int np = F16_STEP > 1 ? (n & ~(F16_STEP - 1)) : n;
            std::vector<ggml_fp16_t> whole(y), parts(y);
            ggml_vec_mad_f16(n, whole.data(), x.data(), v);
            ggml_vec_mad_f16(np, parts.data(), x.data(), v);
            mad_scalar(n - np, parts.data() + np, x.data() + np, v);
            bad_mad += mismatches(whole, parts);

            std::vector<ggml_fp16_t> sref(y), sgot(y), swhole(y), sparts(y);
            scale_scalar(n, sref.data(), v);
            done = ggml_vec_scale_f16_tail(0, n, sgot.data(), v);
            scale_scalar(n - done, sgot.data() + done, v);
            bad_scale_tail += mismatches(sref, sgot);
            ggml_vec_scale_f16(n, swhole.data(), v);
            ggml_vec_scale_f16(np, sparts.data(), v);
            scale_scalar(n - np, sparts.data() + np, v);
            bad_scale += mismatches(swhole, sparts);

            // dot: accumulation order is the routine's own; against a double sum, and stable
            double exact = 0.0, magnitude = 0.0;
            for (int i = 0; i < n; i++) {
                const double p = (double) GGML_CPU_FP16_TO_FP32(x[i]) * GGML_CPU_FP16_TO_FP32(y[i]);
                exact += p;
                magnitude += std::fabs(p);
            }
            float s1 = 0.0f, s2 = 0.0f;
            ggml_vec_dot_f16(n, &s1, 0, x.data(), 0, y.data(), 0, 1);
            ggml_vec_dot_f16(n, &s2, 0, x.data(), 0, y.data(), 0, 1);
            dot_unstable += std::memcmp(&s1, &s2, sizeof(float)) != 0;
            const double err = std::fabs(s1 - exact) / (magnitude + 1e-30);
            if (err > dot_err) dot_err = err;
        }
        std::printf("mad_tail %d %d\n", n, bad_mad_tail);
        std::printf("mad %d %d\n", n, bad_mad);
        std::printf("scale_tail %d %d\n", n, bad_scale_tail);
        std::printf("scale %d %d\n", n, bad_scale);
        std::printf("dot_unstable %d %d\n", n, dot_unstable);
        std::printf("dot_error %d %.3g\n", n, dot_err);
    }
    return 0;
}
