/* Calls one of rows.c's functions on lnn's benchmark shape (32x65x768 float32 values, one thread), for counting
 * its instructions with valgrind, which runs this in seconds where it needs many minutes for Python and torch.
 * Why: on a shared VM without hardware counters a call's time scatters with the load, its instruction count
 * does not (docs/performance.md, "Issue 40 on the AVX2 machine: fewer instructions per value in rows.c"). Build with rows.py's flags:
 *
 *   gcc -O3 -march=native -ffp-contract=fast -fno-math-errno -fno-trapping-math -fopenmp \
 *       benchmarks/rows_kernel_calls.c plugins/normkit-normalnorm/src/normkit_normalnorm/rows.c -o rows_calls -lm
 *   valgrind --tool=callgrind --toggle-collect='nn_rows_backward' ./rows_calls backward
 *
 * (function: infer, forward (noise 1), backward or channels_eval, one call; backward's inputs come from a
 * forward called first, outside the toggled function). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nn_rows_infer(const float *x, const float *weight, const float *bias, float *out, float *scratch, int64_t numel,
                   int64_t n, float eps, float alpha, float lambda_min, float lambda_max, int threads, int64_t chunks);
void nn_rows_forward(const float *x, const float *weight, const float *bias, float *out, float *y, float *L, float *P,
                     float *stats, float *scratch, int64_t numel, int64_t n, float eps, float alpha, float noise,
                     float lambda_min, float lambda_max, int32_t seed, int threads, int64_t chunks);
void nn_rows_backward(const float *dy, const float *x, const float *weight, const float *y, const float *L,
                      const float *P, const float *stats, float *dx, float *dweight, float *dbias, float *scratch,
                      int64_t numel, int64_t n, float alpha, int lam_grads, int threads, int64_t chunks);
void nn_channels_eval(const float *x, const float *weight, const float *bias, const float *mean, const float *scale,
                      const float *lam, float *out, int64_t batch, int64_t channels, int64_t s, int threads);

/* a fixed pseudo-normal value (sum of uniforms: no libm calls to count) */
static float value(uint32_t *state) {
    float sum = 0;
    for (int k = 0; k < 4; k++) {
        *state = *state * 1664525u + 1013904223u;
        sum += (float)(*state >> 8) * (1.0f / 16777216.0f);
    }
    return (sum - 2.0f) * 1.7320508f;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    const int64_t n = 768, rows = 32 * 65, numel = n * rows, chunks = 64;
    float *buffers[7];
    for (int k = 0; k < 7; k++) buffers[k] = calloc((size_t)numel, 4);
    float *x = buffers[0], *dy = buffers[1], *out = buffers[2], *y = buffers[3], *L = buffers[4], *P = buffers[5];
    float *dx = buffers[6];
    float *weight = malloc(4 * n), *bias = malloc(4 * n), *stats = malloc(4 * 9 * rows), *scratch = malloc(4 * 8 * n);
    float *dweight = calloc((size_t)(chunks * n), 4), *dbias = calloc((size_t)(chunks * n), 4);
    float mean[256], scale[256], lam[256];
    uint32_t state = 1;
    for (int64_t i = 0; i < numel; i++) { x[i] = value(&state); dy[i] = value(&state); }
    for (int64_t j = 0; j < n; j++) { weight[j] = 1.0f + 0.2f * value(&state); bias[j] = value(&state); }
    for (int c = 0; c < 256; c++) { mean[c] = 0.01f * c / 256; scale[c] = 1.0f; lam[c] = 0.8f + 0.4f * c / 256; }
    if (!strcmp(what, "backward"))  /* its inputs */
        nn_rows_forward(x, weight, bias, out, y, L, P, stats, scratch, numel, n, 1e-5f, 1.0f, 1.0f, -INFINITY,
                        INFINITY, 7, 1, chunks);
    if (!strcmp(what, "infer"))
        nn_rows_infer(x, weight, bias, out, scratch, numel, n, 1e-5f, 1.0f, -INFINITY, INFINITY, 1, chunks);
    else if (!strcmp(what, "forward"))
        nn_rows_forward(x, weight, bias, out, y, L, P, stats, scratch, numel, n, 1e-5f, 1.0f, 1.0f, -INFINITY,
                        INFINITY, 7, 1, chunks);
    else if (!strcmp(what, "backward"))
        nn_rows_backward(dy, x, weight, y, L, P, stats, dx, dweight, dbias, scratch, numel, n, 1.0f, 1, 1, chunks);
    else if (!strcmp(what, "channels_eval"))
        nn_channels_eval(x, weight, bias, mean, scale, lam, out, numel / (256 * 64), 256, 64, 1);
    else {
        fprintf(stderr, "error: name the function to call: infer, forward, backward or channels_eval\n");
        return 2;
    }
    double check = 0;
    for (int64_t i = 0; i < numel; i += 97) check += out[i] + dx[i];
    printf("%s: done (checksum %.6g)\n", what, check);
    return 0;
}
