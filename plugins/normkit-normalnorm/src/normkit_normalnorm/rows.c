/* The normality norm over contiguous float32 rows (per-token layer statistics), forward and backward.
 *
 * Built at first use by rows.py (the system C compiler, -O3 -march=native, per process) and called
 * through ctypes on a range of rows. It is compiled.py's forward_math/backward_math for the
 * partition "layer" with channels-last tokens, written as one pass per step over a row that stays
 * in L1: Inductor splits the same work into about ten loops over all rows (docs/performance.md).
 * Same formulas and constants as compiled.py and fastmath.py (the polynomials evaluated in another order:
 * Estrin's scheme, see log_of_parts), and the same noise (the hash of (seed, pair index), Box-Muller), so
 * results agree to float32 rounding.
 * Every loop is `omp simd` (vectorized with -fopenmp-simd; no OpenMP runtime is linked).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define NSTATS 9 /* mean, var, rstd, lam, in_range, g1, den, dvar, mean_d: compiled.py's STATS */

static inline int32_t bits_of(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
static inline float float_of(int32_t i) { float f; memcpy(&f, &i, 4); return f; }

/* fastmath.py: Cephes logf on (1 + f) 2^e. Its polynomial by Estrin's scheme (powers f^2, f^4, f^8 and
 * independent pairs) instead of Horner's: the same coefficients, but a chain of 4 dependent multiply-adds instead of 9,
 * so the loops that call it are not bound by the multiply-add latency (docs/performance.md, issue 40). */
static inline float log_of_parts(float f, float e) {
    float z = f * f, f4 = z * z;
    float p01 = 3.3333331174e-1f + f * -2.4999993993e-1f, p23 = 2.0000714765e-1f + f * -1.6668057665e-1f;
    float p45 = 1.4249322787e-1f + f * -1.2420140846e-1f, p67 = 1.1676998740e-1f + f * -1.1514610310e-1f;
    float p = (p01 + z * p23) + f4 * ((p45 + z * p67) + f4 * 7.0376836292e-2f);
    float y = p * f * z + e * -2.12194440e-4f - 0.5f * z;
    return f + y + e * 0.693359375f;
}

/* u == (1 + f) 2^e with f in [sqrt(1/2) - 1, sqrt 2 - 1), for positive normal u (fastmath._log_parts): the bits
 * shifted by 1 - sqrt(1/2) before the exponent is read, so the exponent field itself steps at sqrt(1/2) (two
 * integer adds instead of a compare and two selects; the same f and e). */
static inline float log_split(float u, float *e) {
    const int32_t shifted = bits_of(u) + (0x3F800000 - 0x3F3504F3);
    *e = (float)((shifted >> 23) - 127);
    return float_of((shifted & 0x7FFFFF) + 0x3F3504F3) - 1.0f;
}

static inline float fast_log(float u) {
    float e, f = log_split(u, &e);
    return log_of_parts(f, e);
}

static inline float fast_log1p(float a) {
    float u = a + 1.0f, e, f = log_split(u, &e);  /* both computed, then selected: no branch */
    int small = a < (float)(1.41421356237309505 - 1.0);
    float r = log_of_parts(small ? a : f, small ? 0.0f : e);
    return u < INFINITY ? r : u;
}

/* fastmath.py's expm1, written so that GCC keeps one copy of the polynomial per value (a clamp of k made its
 * jump threading compute a second copy for k = 127): the clamps of t as single selects (vector min/max; NaN
 * passes through), and 2^k as 2 * 2^(k - 1), which is a float32 for every k that occurs (-126 to 128, where
 * 2^-127 flushes to 0: expm1 is -1 there either way). The polynomial by Estrin's scheme: a chain of 3
 * dependent multiply-adds instead of 7. */
static inline float fast_expm1(float t) {
    const float exp_max = 88.72283935546875f;
    float c = t < -87.0f ? -87.0f : t;
    c = c > exp_max ? exp_max : c;
    float k = rintf(c * (float)(1.0 / 0.6931471805599453));
    float r = (c - k * 0.693359375f) - k * -2.12194440e-4f;
    float r2 = r * r, r4 = r2 * r2;
    float p = (0.5f + r * (float)(1.0 / 6.0)) + r2 * ((float)(1.0 / 24.0) + r * (float)(1.0 / 120.0))
              + r4 * (((float)(1.0 / 720.0) + r * (float)(1.0 / 5040.0)) + r2 * (1.0f / 40320.0f));
    p = r + r2 * p;
    float half_scale = float_of(((int32_t)k + 126) << 23);
    float result = 2.0f * (half_scale * p + (half_scale - 0.5f));
    return t > exp_max ? INFINITY : result;
}

/* fastmath.py's cos_2pi, its odd polynomial in w by Estrin's scheme (a chain of 3 multiply-adds, not 5) */
static inline float cos_2pi(float u) {
    float w = (fabsf(u - 0.5f) - 0.25f) * (float)(2 * 3.14159265358979323846);
    float w2 = w * w, w4 = w2 * w2;
    float p = ((float)(-1.0 / 6.0) + w2 * (float)(1.0 / 120.0))
              + w4 * (((float)(-1.0 / 5040.0) + w2 * (float)(1.0 / 362880.0)) + w4 * (float)(-1.0 / 39916800.0));
    return (p * w2 + 1.0f) * w;
}

static inline uint32_t hash32(uint32_t v) {
    v ^= v >> 16; v *= 0x7FEB352Du; v ^= v >> 15; v *= 0x846CA68Bu; return v ^ (v >> 16);
}

/* compiled.standard_normal's two values of one pair: z[pair] and z[pair + half] */
static inline void hash_normal_pair(uint32_t pair, int32_t seed, float *first_value, float *second_value) {
    uint32_t first = hash32(pair ^ (uint32_t)seed);
    uint32_t second = hash32(first ^ 0x632BE5ABu);
    float u1 = ((float)((first >> 8) & 0xFFFFFF) + 0.5f) * (1.0f / 16777216.0f);
    float u2 = (float)((second >> 8) & 0xFFFFFF) * (1.0f / 16777216.0f);
    float radius = sqrtf(-2.0f * fast_log(u1));
    float v = u2 + 0.75f;
    v = v >= 1.0f ? v - 1.0f : v;
    *first_value = radius * cos_2pi(u2);
    *second_value = radius * cos_2pi(v);
}

/* compiled.standard_normal at logical index i (half = ceil(numel / 2) pairs) */
static inline float hash_normal(uint32_t i, uint32_t half, int32_t seed) {
    float a, b;
    hash_normal_pair(i >= half ? i - half : i, seed, &a, &b);
    return i >= half ? b : a;
}

/* One row's standardization, lambda and transform (forward_math up to the noise): L, P and the
 * noise-free y of the row, its stats; returns noise * mean|y - mean y| (0 without noise). Without noise and
 * with `outr`, also the row's output y * weight + bias (neither NULL: affine_defaults), in the same pass; then
 * Pr and yr may be NULL (inference: only out is written). Without noise, `outr` and Pr (inference of a
 * grouped layout, whose affine is applied when scattering): y only. */
static float transform_row(const float *xr, float *Lr, float *Pr, float *yr, float *st, float *h, int64_t n,
                           float eps, float alpha, float noise, float lambda_min, float lambda_max,
                           const float *weight, const float *bias, float *outr) {
    const float inv_n = 1.0f / (float)n;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += xr[j];
    const float rough = s * inv_n;
    float sd = 0, sdd = 0;
#pragma omp simd reduction(+ : sd, sdd)
    for (int64_t j = 0; j < n; j++) { float d = xr[j] - rough; sd += d; sdd += d * d; }
    const float mean = rough + sd * inv_n;
    /* sdd = inf (an outlier whose square overflows): var = inf, so rstd = 0 and h = 0, as torch's own
     * layer norm gives; sd * sd could overflow too and make inf - inf = NaN */
    float var = sdd == INFINITY ? INFINITY : (sdd - sd * sd * inv_n) * inv_n;
    var = var < 0 ? 0 : var;
    const float rstd = 1.0f / sqrtf(var + eps);
    /* log1p|h| and the sums for lambda in one loop: with -fno-trapping-math GCC vectorizes a loop that both
     * selects (inside log1p) and sums (before, two loops with h and L read back) */
    float s_d = 0, s_hd = 0, s_dd = 0, s_aq = 0, s_1 = 0;
#pragma omp simd reduction(+ : s_d, s_hd, s_dd, s_aq, s_1)
    for (int64_t j = 0; j < n; j++) {
        float hv = (xr[j] - mean) * rstd, a = fabsf(hv), l = fast_log1p(a);
        h[j] = hv;
        Lr[j] = l;
        float p = l + a * l, d = p - a, q = p * l - 2 * d;
        s_d += d; s_hd += hv * d; s_dd += d * d; s_aq += a * q; s_1 += copysignf(l, hv);
    }
    const float mean_d = s_d * inv_n, dvar = 2 * (s_hd * inv_n);
    const float d2var = 2 * (s_aq * inv_n + s_dd * inv_n - mean_d * mean_d);
    const float g1 = 0.5f * dvar - s_1 * inv_n, den = 0.5f * (d2var - dvar * dvar) + sqrtf(eps);
    const float raw = 1 - alpha * g1 / den;
    const float lam = raw < lambda_min ? lambda_min : (raw > lambda_max ? lambda_max : raw);
    const float inv_pos = 1 / (lam == 0 ? 1e-20f : lam), inv_neg = -1 / (lam == 2 ? 1e-20f : 2 - lam);
    /* 1/mu by the sign of h as one select on h >= 0 (the one mu takes): at h = 0, L = P = 0, so y is 0 with
     * either factor (before, a second select gave 0 there) */
    if (outr && noise == 0 && !Pr) { /* inference: out only (P and y are not kept) */
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float hv = h[j], mu = hv >= 0 ? lam : 2 - lam, pw = fast_expm1(mu * Lr[j]);
            outr[j] = pw * (hv >= 0 ? inv_pos : inv_neg) * weight[j] + bias[j];
        }
    } else if (outr && noise == 0) { /* the affine in the same pass: out written while the row is in registers */
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float hv = h[j], mu = hv >= 0 ? lam : 2 - lam, pw = fast_expm1(mu * Lr[j]);
            float yv = pw * (hv >= 0 ? inv_pos : inv_neg);
            Pr[j] = pw;
            yr[j] = yv;
            outr[j] = yv * weight[j] + bias[j];
        }
    } else if (!Pr && noise == 0) { /* inference, y only */
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float hv = h[j], mu = hv >= 0 ? lam : 2 - lam, pw = fast_expm1(mu * Lr[j]);
            yr[j] = pw * (hv >= 0 ? inv_pos : inv_neg);
        }
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float hv = h[j], mu = hv >= 0 ? lam : 2 - lam, pw = fast_expm1(mu * Lr[j]);
            Pr[j] = pw;
            yr[j] = pw * (hv >= 0 ? inv_pos : inv_neg);
        }
    }
    st[0] = mean; st[1] = var; st[2] = rstd; st[3] = lam; st[4] = lam == raw ? 1.0f : 0.0f;
    st[5] = g1; st[6] = den; st[7] = dvar; st[8] = mean_d;
    if (noise == 0) return 0;
    float sx = 0;
#pragma omp simd reduction(+ : sx)
    for (int64_t j = 0; j < n; j++) sx += yr[j];
    const float x_mean = sx * inv_n;
    float s_abs = 0;
#pragma omp simd reduction(+ : s_abs)
    for (int64_t j = 0; j < n; j++) s_abs += fabsf(yr[j] - x_mean);
    return noise * (s_abs * inv_n);
}

/* weight/bias for the fused loops, which read both: NULL ones replaced by 1s and 0s written into `defaults`
 * (2 n floats), so y * 1 + 0 gives y (a -0 becomes +0, which compares equal). */
static void affine_defaults(const float **weight, const float **bias, float *defaults, int64_t n) {
    if (!*weight) {
        for (int64_t j = 0; j < n; j++) defaults[j] = 1.0f;
        *weight = defaults;
    }
    if (!*bias) {
        for (int64_t j = 0; j < n; j++) defaults[n + j] = 0.0f;
        *bias = defaults + n;
    }
}

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* forward_math over all rows = numel / n rows of length n, on `threads` OpenMP threads (torch's
 * own pool: the process has torch's libgomp loaded, and this library links libgomp by soname):
 * out, y (noisy pre-affine values), L = log1p|h|, P = expm1(mu L), stats[row * NSTATS + k].
 * weight/bias may be NULL; noise 0 draws nothing; lambda_min/max: -inf/inf when unclamped.
 * scratch: (2 + threads) * n floats. Work is handed out in `chunks` chunks of rows, dynamically (a
 * thread that a busy core delays leaves its next chunks to the others). With an even number of rows, the pair (i, i + numel / 2) of the
 * hash normal falls on rows r and r + rows / 2 at the same column, so they are done together and
 * each pair's hash, log and sqrt serve two values. */
void nn_rows_forward(const float *x, const float *weight, const float *bias, float *out, float *y, float *L,
                     float *P, float *stats, float *scratch, int64_t numel, int64_t n, float eps, float alpha,
                     float noise, float lambda_min, float lambda_max, int32_t seed, int threads, int64_t chunks) {
    const int64_t rows = numel / n, half_rows = rows / 2;
    const int paired = noise != 0 && rows % 2 == 0;
    const int64_t tasks = paired ? half_rows : rows;
    const uint32_t half = (uint32_t)((numel + 1) / 2);
    if (chunks > tasks) chunks = tasks;
    affine_defaults(&weight, &bias, scratch, n);
    scratch += 2 * n;
#pragma omp parallel num_threads(threads)
    {
        float *h = scratch + (int64_t)thread_id() * n;
#pragma omp for schedule(dynamic, 1)
        for (int64_t chunk = 0; chunk < chunks; chunk++)
        for (int64_t task = tasks * chunk / chunks; task < tasks * (chunk + 1) / chunks; task++) {
            const int64_t row = task, off = row * n;
            const float amount = transform_row(x + off, L + off, P + off, y + off, stats + row * NSTATS, h, n, eps,
                                               alpha, noise, lambda_min, lambda_max, weight, bias, out + off);
            float *y1 = y + off, *out1 = out + off;
            const uint32_t base = (uint32_t)off;
            if (paired) {
                const int64_t off2 = (row + half_rows) * n;
                const float amount2 = transform_row(x + off2, L + off2, P + off2, y + off2,
                                                    stats + (row + half_rows) * NSTATS, h, n, eps, alpha, noise,
                                                    lambda_min, lambda_max, weight, bias, out + off2);
                float *y2 = y + off2, *out2 = out + off2;
#pragma omp simd
                for (int32_t j = 0; j < (int32_t)n; j++) {  /* noise and affine in one pass */
                    float z1, z2;
                    hash_normal_pair(base + (uint32_t)j, seed, &z1, &z2);
                    const float v1 = y1[j] + amount * z1, v2 = y2[j] + amount2 * z2;
                    y1[j] = v1;
                    y2[j] = v2;
                    out1[j] = v1 * weight[j] + bias[j];
                    out2[j] = v2 * weight[j] + bias[j];
                }
            } else if (noise != 0) {
#pragma omp simd
                for (int32_t j = 0; j < (int32_t)n; j++) {
                    const float v = y1[j] + amount * hash_normal(base + (uint32_t)j, half, seed);
                    y1[j] = v;
                    out1[j] = v * weight[j] + bias[j];
                }
            }  /* without noise, transform_row wrote out */
        }
    }
}

/* One row's backward_math: dx of the row from dy, x, L, P and its stats (weight: per position, or NULL);
 * scratch h, grad_a, jac: n floats each. The row's five sums are made in the loop that computes their
 * terms (GCC vectorizes a loop that both selects and sums with -fno-trapping-math), so the lambda terms
 * are never stored and h, grad_a and jac are read back once, by the dx loop. */
static void backward_row(const float *dyr, const float *xr, const float *weight, const float *Lr, const float *Pr,
                         const float *st, float *dxr, float *h, float *grad_a, float *jac, int64_t n,
                         float alpha, int lam_grads) {
    const float inv_n = 1.0f / (float)n;
    const float mean = st[0], rstd = st[2], lam = st[3], in_range = st[4], g1 = st[5], den = st[6];
    const float dvar = st[7], mean_d = st[8];
    const float inv_pos = 1 / (lam == 0 ? 1e-20f : lam), inv_neg = -1 / (lam == 2 ? 1e-20f : 2 - lam);
    const float k1 = (2 * inv_n) * (-0.5f * alpha / den - dvar * alpha * g1 / (den * den));
    const float k2 = alpha * g1 / ((float)n * den * den), k3 = alpha / ((float)n * den);
    float s_a = 0, s_ah = 0, s_lam = 0, s_j = 0, s_jh = 0;
    if (lam_grads) {  /* two loops, not a test inside one: GCC would vectorize that with masked stores */
#pragma omp simd reduction(+ : s_a, s_ah, s_lam, s_j, s_jh)
        for (int64_t j = 0; j < n; j++) {
            float hv = (xr[j] - mean) * rstd, a = fabsf(hv), l = Lr[j], pw = Pr[j];
            float inverse_u = 1 / (1 + a);
            float gx = weight ? dyr[j] * weight[j] : dyr[j];
            float ga = gx * ((pw + 1) * inverse_u);
            float sl = copysignf(l, hv), inverse_mu = hv >= 0 ? inv_pos : inv_neg;
            float sign = copysignf(1.0f, hv);  /* at h = 0 (L = P = 0) q and P are 0: any sign and 1/mu do */
            float p = l + a * l, d = p - a, q = p * l - 2 * d, w = d + a * l;
            float jv = k1 * w + k2 * (sign * q + sl * (w + d - 2 * mean_d)) + k3 * inverse_u;
            h[j] = hv;
            grad_a[j] = ga;
            jac[j] = jv;
            s_a += ga;
            s_ah += ga * hv;
            s_lam += gx * ((sl + sl * pw - pw * inverse_mu) * inverse_mu);
            s_j += jv;
            s_jh += jv * hv;
        }
    } else {
#pragma omp simd reduction(+ : s_a, s_ah)
        for (int64_t j = 0; j < n; j++) {
            float hv = (xr[j] - mean) * rstd, pw = Pr[j];
            float gx = weight ? dyr[j] * weight[j] : dyr[j];
            float ga = gx * ((pw + 1) * (1 / (1 + fabsf(hv))));
            h[j] = hv;
            grad_a[j] = ga;
            s_a += ga;
            s_ah += ga * hv;
        }
    }
    float gh_mean = s_a * inv_n, ghh_mean = s_ah * inv_n;
    if (lam_grads) {
        const float grad_lam = s_lam * in_range;
        gh_mean = gh_mean + grad_lam * (s_j * inv_n);
        ghh_mean = ghh_mean + grad_lam * (s_jh * inv_n);
#pragma omp simd
        for (int64_t j = 0; j < n; j++)
            dxr[j] = rstd * ((grad_a[j] + grad_lam * jac[j]) - gh_mean - h[j] * ghh_mean);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dxr[j] = rstd * (grad_a[j] - gh_mean - h[j] * ghh_mean);
    }
}

/* backward_math over all rows on `threads` threads, in `chunks` chunks of rows handed out
 * dynamically: dx, and per-chunk dweight/dbias partial sums (chunks * n each, zeroed by the caller;
 * NULL when not wanted), which the caller adds in chunk order: the same sums whichever thread did a
 * chunk. dy, x, y, L, P and stats as written by nn_rows_forward; scratch: threads * 3 n floats. */
void nn_rows_backward(const float *dy, const float *x, const float *weight, const float *y, const float *L,
                      const float *P, const float *stats, float *dx, float *dweight, float *dbias, float *scratch,
                      int64_t numel, int64_t n, float alpha, int lam_grads, int threads, int64_t chunks) {
    const int64_t rows = numel / n;
#pragma omp parallel num_threads(threads)
    {
        float *h = scratch + (int64_t)thread_id() * 3 * n, *grad_a = h + n, *jac = h + 2 * n;
#pragma omp for schedule(dynamic, 1)
        for (int64_t chunk = 0; chunk < chunks; chunk++)
        for (int64_t row = rows * chunk / chunks; row < rows * (chunk + 1) / chunks; row++) {
            float *dweight_part = dweight ? dweight + chunk * n : NULL;
            float *dbias_part = dbias ? dbias + chunk * n : NULL;
            const float *dyr = dy + row * n;
            backward_row(dyr, x + row * n, weight, L + row * n, P + row * n, stats + row * NSTATS, dx + row * n,
                         h, grad_a, jac, n, alpha, lam_grads);
            if (dweight_part) {
                const float *yr = y + row * n;
#pragma omp simd
                for (int64_t j = 0; j < n; j++) dweight_part[j] += dyr[j] * yr[j];
            }
            if (dbias_part) {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) dbias_part[j] += dyr[j];
            }
        }
    }
}

/* Groups of any partition on a contiguous tensor: group g is `segments` runs of `length` values, run k
 * starting at g * step + k * stride (batch: C groups of N runs of S at stride C S; group/instance/layer
 * rows: one run each; per-token rows: one run of C). Each group is gathered into the thread's scratch,
 * runs the row functions above, and its results are scattered back, so every partition gets the row
 * kernel's arithmetic; for the small steps (under the compiled paths' thresholds) where the eager path
 * costs ~180 torch ops per step. */
static void gather(const float *src, float *dst, int64_t g, int64_t segments, int64_t length, int64_t step,
                   int64_t stride) {
    for (int64_t k = 0; k < segments; k++) memcpy(dst + k * length, src + g * step + k * stride, (size_t)length * 4);
}

static void scatter(const float *src, float *dst, int64_t g, int64_t segments, int64_t length, int64_t step,
                    int64_t stride) {
    for (int64_t k = 0; k < segments; k++) memcpy(dst + g * step + k * stride, src + k * length, (size_t)length * 4);
}

/* torch's lerp with a scalar weight (its vectorized CPU kernel): start + w (end - start) for |w| < 0.5, else
 * end + (w - 1)(end - start), each one fused multiply-add */
static inline float lerp(float start, float end, float w) {
    return fabsf(w) < 0.5f ? fmaf(w, end - start, start) : fmaf(w - 1.0f, end - start, end);
}

/* a * b rounded on its own (as torch's mul): not inlined, so -ffp-contract=fast cannot fuse it into the lerp */
__attribute__((noinline)) static float product(float a, float b) { return a * b; }

/* The channel of each value, for the per-channel affine and weight: memory offset o holds channel
 * (o / s_inner) % channels, or o % channels for channels-last tokens (s_inner 0). */
static inline int64_t channel_at(int64_t o, int64_t s_inner, int64_t channels) {
    return s_inner ? (o / s_inner) % channels : o % channels;
}

/* y and out = y * weight + bias (the layer's affine, as torch.addcmul(bias, y, weight), or y * weight, y + bias,
 * a copy of y) of one group's runs, from its gathered values yg. weight/bias may be NULL; y NULL: out only. */
static void scatter_affine(const float *yg, float *y, float *out, const float *weight, const float *bias, int64_t g,
                           int64_t segments, int64_t length, int64_t step, int64_t stride, int64_t s_inner,
                           int64_t channels) {
    for (int64_t k = 0; k < segments; k++) {
        const int64_t o = g * step + k * stride;
        const float *src = yg + k * length;
        if (y) memcpy(y + o, src, (size_t)length * 4);
        float *dst = out + o;
        for (int64_t j0 = 0; j0 < length;) {  /* pieces of one channel each (a token row: the whole row) */
            const int64_t j1 = s_inner ? j0 + s_inner - (o + j0) % s_inner : length;
            const int64_t end = j1 < length ? j1 : length;
            if (!s_inner) {
                const float *w = weight ? weight + (o + j0) % channels : NULL, *b = bias ? bias + (o + j0) % channels : NULL;
                if (w && b) {
#pragma omp simd
                    for (int64_t j = j0; j < end; j++) dst[j] = b[j - j0] + src[j] * w[j - j0];
                } else if (w) {
#pragma omp simd
                    for (int64_t j = j0; j < end; j++) dst[j] = src[j] * w[j - j0];
                } else if (b) {
#pragma omp simd
                    for (int64_t j = j0; j < end; j++) dst[j] = src[j] + b[j - j0];
                } else {
                    memcpy(dst + j0, src + j0, (size_t)(end - j0) * 4);
                }
            } else {
                const int64_t c = channel_at(o + j0, s_inner, channels);
                const float w = weight ? weight[c] : 1.0f, b = bias ? bias[c] : 0.0f;
                if (weight && bias) {
#pragma omp simd
                    for (int64_t j = j0; j < end; j++) dst[j] = b + src[j] * w;
                } else if (weight) {
#pragma omp simd
                    for (int64_t j = j0; j < end; j++) dst[j] = src[j] * w;
                } else if (bias) {
#pragma omp simd
                    for (int64_t j = j0; j < end; j++) dst[j] = src[j] + b;
                } else {
                    memcpy(dst + j0, src + j0, (size_t)(end - j0) * 4);
                }
            }
            j0 = end;
        }
    }
}

/* compiled.standard_normal's values of group g's runs, gathered (run k at zg + k * length): the value at memory
 * offset i of the contiguous tensor (its logical index in memory order) pairs with i + half. Where the partner
 * lies in the same group (a batch partition with an even N: run k pairs with run k + N / 2) one pair's hash, log
 * and square root serve both values; otherwise each value computes its pair and keeps its half. */
static void hash_noise_group(float *zg, int64_t g, int64_t segments, int64_t length, int64_t step, int64_t stride,
                             uint32_t half, int32_t seed) {
    const int64_t pair_runs = segments / 2;
    if (segments % 2 == 0 && pair_runs * stride == (int64_t)half) {
        for (int64_t k = 0; k < pair_runs; k++) {
            const uint32_t base = (uint32_t)(g * step + k * stride);
            float *first = zg + k * length, *second = zg + (k + pair_runs) * length;
#pragma omp simd
            for (int32_t j = 0; j < (int32_t)length; j++) {
                float a, b;
                hash_normal_pair(base + (uint32_t)j, seed, &a, &b);
                first[j] = a;
                second[j] = b;
            }
        }
        return;
    }
    for (int64_t k = 0; k < segments; k++) {
        const uint32_t base = (uint32_t)(g * step + k * stride);
        float *dst = zg + k * length;
#pragma omp simd
        for (int32_t j = 0; j < (int32_t)length; j++) dst[j] = hash_normal(base + (uint32_t)j, half, seed);
    }
}

/* forward_math per group: y (noisy pre-affine values, x's layout), out (y with the affine, x's layout), L and P
 * (group-major: group g at g * n), stats[g * NSTATS + k]. The noise: z (torch.randn's values, x's layout), or
 * with z NULL and seed >= 0 the hash normal of that seed (hash_noise_group); neither: none.
 * weight/bias: per channel (channel_at), or NULL. running_mean/var/lambda: a batch partition's running buffers
 * (one per group), moved towards the group's mean, variance times `unbiased` and lambda by `factor` as torch's
 * lerp_ does; NULL: none. L NULL (inference: nothing saved for a backward, no noise): P and y NULL too, L kept
 * per group in the scratch. scratch: threads * 5 n floats. */
static void nn_groups_forward(const float *x, const float *z, const float *weight, const float *bias, float *y,
                              float *out, float *L, float *P, float *stats, float *running_mean, float *running_var,
                              float *running_lambda, float unbiased, float factor, float *scratch, int64_t groups,
                              int64_t segments, int64_t length, int64_t step, int64_t stride, int64_t s_inner,
                              int64_t channels, float eps, float alpha, float noise, float lambda_min,
                              float lambda_max, int64_t seed, int threads) {
    const int64_t n = segments * length;
    const uint32_t half = (uint32_t)((groups * n + 1) / 2);
    const int noisy = L && (z || seed >= 0);  /* inference (L NULL) draws nothing */
#pragma omp parallel num_threads(threads)
    {
        float *xg = scratch + (int64_t)thread_id() * 5 * n, *zg = xg + n, *yg = xg + 2 * n, *h = xg + 3 * n;
#pragma omp for schedule(dynamic, 1)
        for (int64_t g = 0; g < groups; g++) {
            gather(x, xg, g, segments, length, step, stride);
            float *st = stats + g * NSTATS;
            const float amount = transform_row(xg, L ? L + g * n : xg + 4 * n, L ? P + g * n : NULL, yg, st, h, n, eps,
                                               alpha, noisy ? noise : 0.0f, lambda_min, lambda_max, NULL, NULL, NULL);
            if (noisy) {
                if (z)
                    gather(z, zg, g, segments, length, step, stride);
                else
                    hash_noise_group(zg, g, segments, length, step, stride, half, (int32_t)seed);
#pragma omp simd
                for (int64_t j = 0; j < n; j++) yg[j] = yg[j] + amount * zg[j];
            }
            scatter_affine(yg, y, out, weight, bias, g, segments, length, step, stride, s_inner, channels);
            if (running_mean) {
                running_mean[g] = lerp(running_mean[g], st[0], factor);
                running_var[g] = lerp(running_var[g], product(st[1], unbiased), factor);
                running_lambda[g] = lerp(running_lambda[g], st[3], factor);
            }
        }
    }
}

/* A group's runs of dy times the weight of each value's channel (channel_at; a copy without weight). */
static void gather_weighted(const float *dy, float *dst, const float *weight, int64_t g, int64_t segments,
                            int64_t length, int64_t step, int64_t stride, int64_t s_inner, int64_t channels) {
    if (!weight) {
        gather(dy, dst, g, segments, length, step, stride);
        return;
    }
    for (int64_t k = 0; k < segments; k++) {
        const int64_t o = g * step + k * stride;
        const float *src = dy + o;
        float *d = dst + k * length;
        for (int64_t j0 = 0; j0 < length;) {
            const int64_t j1 = s_inner ? j0 + s_inner - (o + j0) % s_inner : length;
            const int64_t end = j1 < length ? j1 : length;
            if (!s_inner) {
                const float *w = weight + (o + j0) % channels;
#pragma omp simd
                for (int64_t j = j0; j < end; j++) d[j] = src[j] * w[j - j0];
            } else {
                const float w = weight[channel_at(o + j0, s_inner, channels)];
#pragma omp simd
                for (int64_t j = j0; j < end; j++) d[j] = src[j] * w;
            }
            j0 = end;
        }
    }
}

/* A group's sums of dy * y and of dy over its runs (x's layout): run by run in float, the runs added in double,
 * in one order whatever the thread count. For a batch partition, whose group g is channel g: the weight and bias
 * gradients (dweight or dbias NULL: not wanted). */
static void group_affine_sums(const float *dy, const float *y, float *dweight, float *dbias, int64_t g,
                              int64_t segments, int64_t length, int64_t step, int64_t stride) {
    double total_w = 0, total_b = 0;
    for (int64_t k = 0; k < segments; k++) {
        const float *dyr = dy + g * step + k * stride, *yr = y + g * step + k * stride;
        float sw = 0, sb = 0;
#pragma omp simd reduction(+ : sw, sb)
        for (int64_t j = 0; j < length; j++) { sw += dyr[j] * yr[j]; sb += dyr[j]; }
        total_w += sw;
        total_b += sb;
    }
    if (dweight) dweight[g] = (float)total_w;
    if (dbias) dbias[g] = (float)total_b;
}

/* backward_math per group: dx (x's layout) from dy (x's layout) times the per-channel weight (NULL: none), x,
 * and L, P, stats as nn_groups_forward wrote them; with y (x's layout) and dweight/dbias (either may be NULL),
 * a batch partition's weight/bias gradients (group_affine_sums). scratch: threads * 6 n floats. */
static void nn_groups_backward(const float *dy, const float *weight, const float *x, const float *L, const float *P,
                               const float *stats, float *dx, const float *y, float *dweight, float *dbias,
                               float *scratch, int64_t groups, int64_t segments,
                               int64_t length, int64_t step, int64_t stride, int64_t s_inner, int64_t channels,
                               float alpha, int lam_grads, int threads) {
    const int64_t n = segments * length;
#pragma omp parallel num_threads(threads)
    {
        float *gg = scratch + (int64_t)thread_id() * 6 * n, *xg = gg + n, *dxg = gg + 2 * n, *h = gg + 3 * n;
#pragma omp for schedule(dynamic, 1)
        for (int64_t g = 0; g < groups; g++) {
            gather_weighted(dy, gg, weight, g, segments, length, step, stride, s_inner, channels);
            gather(x, xg, g, segments, length, step, stride);
            backward_row(gg, xg, NULL, L + g * n, P + g * n, stats + g * NSTATS, dxg, h, h + n, h + 2 * n, n, alpha,
                         lam_grads);
            scatter(dxg, dx, g, segments, length, step, stride);
            if (dweight || dbias) group_affine_sums(dy, y, dweight, dbias, g, segments, length, step, stride);
        }
    }
}

/* The grouped functions with their arguments packed by rows.py (`_GROUPS_FORWARD`, `_GROUPS_BACKWARD`,
 * `packed_configs`): ctypes converts every argument of a call from Python, about a thousand machine instructions
 * each, which for the small steps these functions serve cost more than their arithmetic; two byte strings cost
 * two. `pointers`: int64 values (addresses, 0 for NULL, the forward's hash-noise seed or -1, then the thread count;
 * the backward's `product`: y, to be multiplied by dy in place, or 0; its `y`, `dweight`, `dbias`: for a batch
 * partition's weight/bias gradients made here, or 0); `config`: the integers as int64 and the floats as doubles,
 * rounded to float here as ctypes' c_float would round them. Read with memcpy (no alignment assumed). */
typedef struct {
    int64_t x, z, weight, bias, y, out, L, P, stats, running_mean, running_var, running_lambda, scratch, seed, threads;
} groups_forward_pointers;
typedef struct {
    int64_t dy, weight, x, L, P, stats, dx, scratch, product, y, dweight, dbias, threads;
} groups_backward_pointers;
typedef struct {
    int64_t groups, segments, length, step, stride, s_inner, channels, lam_grads;
    double unbiased, factor, eps, alpha, noise, lambda_min, lambda_max;
} groups_config;

#define ADDRESS(type, value) ((type *)(intptr_t)(value))

void nn_groups_forward_packed(const char *pointers, const char *config) {
    groups_forward_pointers p;
    groups_config c;
    memcpy(&p, pointers, sizeof p);
    memcpy(&c, config, sizeof c);
    nn_groups_forward(ADDRESS(const float, p.x), ADDRESS(const float, p.z), ADDRESS(const float, p.weight),
                      ADDRESS(const float, p.bias), ADDRESS(float, p.y), ADDRESS(float, p.out), ADDRESS(float, p.L),
                      ADDRESS(float, p.P), ADDRESS(float, p.stats), ADDRESS(float, p.running_mean),
                      ADDRESS(float, p.running_var), ADDRESS(float, p.running_lambda), (float)c.unbiased,
                      (float)c.factor, ADDRESS(float, p.scratch), c.groups, c.segments, c.length, c.step, c.stride,
                      c.s_inner, c.channels, (float)c.eps, (float)c.alpha, (float)c.noise, (float)c.lambda_min,
                      (float)c.lambda_max, p.seed, (int)p.threads);
}

void nn_groups_backward_packed(const char *pointers, const char *config) {
    groups_backward_pointers p;
    groups_config c;
    memcpy(&p, pointers, sizeof p);
    memcpy(&c, config, sizeof c);
    nn_groups_backward(ADDRESS(const float, p.dy), ADDRESS(const float, p.weight), ADDRESS(const float, p.x),
                       ADDRESS(const float, p.L), ADDRESS(const float, p.P), ADDRESS(const float, p.stats),
                       ADDRESS(float, p.dx), ADDRESS(const float, p.y), ADDRESS(float, p.dweight),
                       ADDRESS(float, p.dbias), ADDRESS(float, p.scratch), c.groups, c.segments, c.length, c.step,
                       c.stride, c.s_inner, c.channels, (float)c.alpha, (int)c.lam_grads, (int)p.threads);
    if (p.product) { /* y (x's layout) times dy in place, the weight gradient's product: one torch op fewer */
        float *y = ADDRESS(float, p.product);
        const float *dy = ADDRESS(const float, p.dy);
        const int64_t numel = c.groups * c.segments * c.length;
#pragma omp simd
        for (int64_t i = 0; i < numel; i++) y[i] = dy[i] * y[i];
    }
}

/* Inference (no noise, nothing saved for backward) of per-token layer statistics: out only, each row's
 * h and L in the thread's scratch ((2 + 4 threads) n floats: the first 2 n for affine_defaults, then 4 n per
 * thread, of which this uses 2 n; P and y are not stored).
 * lnn under torch.no_grad() or in eval:
 * the same values as nn_rows_forward with noise 0. */
void nn_rows_infer(const float *x, const float *weight, const float *bias, float *out, float *scratch,
                   int64_t numel, int64_t n, float eps, float alpha, float lambda_min, float lambda_max,
                   int threads, int64_t chunks) {
    const int64_t rows = numel / n;
    if (chunks > rows) chunks = rows;
    affine_defaults(&weight, &bias, scratch, n);
    scratch += 2 * n;
#pragma omp parallel num_threads(threads)
    {
        float *h = scratch + (int64_t)thread_id() * 4 * n, *Lr = h + n;
        float st[NSTATS];
#pragma omp for schedule(dynamic, 1)
        for (int64_t chunk = 0; chunk < chunks; chunk++)
        for (int64_t row = rows * chunk / chunks; row < rows * (chunk + 1) / chunks; row++)
            transform_row(x + row * n, Lr, NULL, NULL, st, h, n, eps, alpha, 0.0f, lambda_min, lambda_max, weight, bias,
                          out + row * n);
    }
}

/* Eval with running statistics of a batch partition (bnn.eval()) on a contiguous (N, C, S) tensor:
 * h = (x - mean_c) scale_c, the Yeo-Johnson transform with lam_c, then the per-channel affine; one
 * pass over memory per (n, c) row of S values. mean, scale (rsqrt(running_var + eps)) and lam
 * (running_lambda, clamped) are per channel; weight/bias may be NULL. */
void nn_channels_eval(const float *x, const float *weight, const float *bias, const float *mean, const float *scale,
                      const float *lam, float *out, int64_t batch, int64_t channels, int64_t s, int threads) {
    const int64_t rows = batch * channels;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        const int64_t c = row % channels;
        const float m = mean[c], k = scale[c], l = lam[c];
        const float w = weight ? weight[c] : 1.0f, b = bias ? bias[c] : 0.0f;
        const float inv_pos = 1 / (l == 0 ? 1e-20f : l), inv_neg = -1 / (l == 2 ? 1e-20f : 2 - l);
        const float *xr = x + row * s;
        float *outr = out + row * s;
#pragma omp simd
        for (int64_t j = 0; j < s; j++) {
            float hv = (xr[j] - m) * k, mu = hv >= 0 ? l : 2 - l;
            float pw = fast_expm1(mu * fast_log1p(fabsf(hv)));
            float yv = pw * (hv >= 0 ? inv_pos : inv_neg);
            outr[j] = yv * w + b;
        }
    }
}
