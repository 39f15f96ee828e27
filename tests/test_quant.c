/* test_quant.c - weight formats (engine/quant.c) and fused dot products (kernels/cpu/vec_dot*.c).
 *
 * Oracles: gguf-py's numpy dequantizers, frozen into tests/fixtures/quant/ by
 * tests/fixtures/gen_quant_fixtures.py (rows, dequantized values, float64 dot products); the F16C
 * hardware conversion for fp16 rounding; plain double loops; and the portable kernels, whose bits
 * every SIMD kernel must give. Random inputs print their seed (set QUANT_SEED=<n> to replay). Run
 * with cwd = repo root. */
#include <criterion/criterion.h>

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/quant.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/cpu/vec_dot_impl.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
__attribute__((target("f16c"))) static uint16_t hw_f32_to_fp16(float f)
{
    return (uint16_t)_cvtss_sh(f, 0);   /* 0 = round to nearest even */
}
__attribute__((target("f16c"))) static float hw_fp16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static int have_f16c(void)   /* CPUID.1:ECX bit 29 (clang 14 lacks __builtin_cpu_supports("f16c")) */
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#else
#define HAVE_X86 0
#endif

#define FIX_DIR "tests/fixtures/quant/"
#define FIX_ROWS 4

/* ------------------------------------------------------------------ small helpers */

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static double h2d(const uint8_t *p) { return (double)quant_fp16_to_f32(rd16(p)); }

static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s (tests must run from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(len > 0 ? (size_t)len : 1);
    cr_assert(buf);
    cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *size = (size_t)len;
    return buf;
}

static void fill_nan(float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
}

/* xorshift64* with a printed seed */
static uint64_t g_rng;
static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1DULL;
}
static double rnd_unit(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static double rnd_normal(void)
{
    double u1 = rnd_unit(), u2 = rnd_unit();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static void seed_rng(const char *test)
{
    const char *env = getenv("QUANT_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)getpid();
    if (seed == 0) seed = 1;
    g_rng = seed;
    fprintf(stderr, "[quant] %s: seed %" PRIu64 " (QUANT_SEED=%" PRIu64 " to replay)\n", test, seed, seed);
}

/* ------------------------------------------------------------------ type facts used by the tests */

typedef struct tinfo {
    const char *name;
    uint32_t type;
    int64_t blck, size;
    int scale_off[2];   /* byte offsets of fp16 scale/min fields in a block (-1 = none) */
} tinfo;

static const tinfo SUPPORTED[] = {
    { "F32", GGML_TYPE_F32, 1, 4, { -1, -1 } },
    { "F16", GGML_TYPE_F16, 1, 2, { -1, -1 } },
    { "BF16", GGML_TYPE_BF16, 1, 2, { -1, -1 } },
    { "Q4_0", GGML_TYPE_Q4_0, 32, 18, { 0, -1 } },
    { "Q4_1", GGML_TYPE_Q4_1, 32, 20, { 0, 2 } },
    { "Q5_0", GGML_TYPE_Q5_0, 32, 22, { 0, -1 } },
    { "Q5_1", GGML_TYPE_Q5_1, 32, 24, { 0, 2 } },
    { "Q8_0", GGML_TYPE_Q8_0, 32, 34, { 0, -1 } },
    { "Q4_K", GGML_TYPE_Q4_K, 256, 144, { 0, 2 } },
    { "Q5_K", GGML_TYPE_Q5_K, 256, 176, { 0, 2 } },
    { "Q6_K", GGML_TYPE_Q6_K, 256, 210, { 208, -1 } },
};
#define N_SUPPORTED ((int)(sizeof SUPPORTED / sizeof SUPPORTED[0]))

static const tinfo *tinfo_of(uint32_t type)
{
    for (int i = 0; i < N_SUPPORTED; i++)
        if (SUPPORTED[i].type == type) return &SUPPORTED[i];
    cr_assert_fail("no test info for type %u", type);
    return NULL;
}

/* Magnitude of the offset each element's value carries inside the kernels (m of Q4_1/Q5_1,
 * dmin*mn of Q4_K/Q5_K, 32*d*S of Q6_K), decoded from the model-facts.md layouts. The kernels sum
 * (value + offset) and offset parts separately, so their f32 rounding scales with |w| + 2|offset|. */
static void elem_offsets(uint32_t type, const uint8_t *row, int64_t n, double *off)
{
    const tinfo *t = tinfo_of(type);
    for (int64_t b = 0; b < n / t->blck; b++) {
        const uint8_t *p = row + b * t->size;
        double *o = off + b * t->blck;
        switch (type) {
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1:
            for (int j = 0; j < 32; j++) o[j] = fabs(h2d(p + 2));
            break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: {
            const uint8_t *q = p + 4;
            for (int s = 0; s < 8; s++) {
                int mn = s < 4 ? (q[s + 4] & 63) : ((q[s + 4] >> 4) | ((q[s] >> 6) << 4));
                for (int j = 0; j < 32; j++) o[32 * s + j] = fabs(h2d(p + 2) * mn);
            }
            break;
        }
        case GGML_TYPE_Q6_K:
            for (int k = 0; k < 16; k++)
                for (int j = 0; j < 16; j++) o[16 * k + j] = 32.0 * fabs(h2d(p + 208) * (int8_t)p[192 + k]);
            break;
        default:
            for (int64_t j = 0; j < t->blck; j++) o[j] = 0.0;
        }
    }
}

/* Random valid row: uniform bytes, then every fp16 scale field set to +-[1e-3, 1e-1]. Float types
 * get normal values with a spread of exponents. */
static void random_row(uint32_t type, uint8_t *row, int64_t n)
{
    const tinfo *t = tinfo_of(type);
    if (type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = (float)(rnd_normal() * ldexp(1.0, (int)(rnd() % 16) - 8));
            if (type == GGML_TYPE_F32) memcpy(row + 4 * i, &v, 4);
            else {
                uint16_t h = type == GGML_TYPE_F16 ? quant_f32_to_fp16(v) : quant_f32_to_bf16(v);
                memcpy(row + 2 * i, &h, 2);
            }
        }
        return;
    }
    size_t bytes = quant_row_size(type, n);
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < n / t->blck; b++)
        for (int k = 0; k < 2; k++) {
            if (t->scale_off[k] < 0) continue;
            double mag = 1e-3 + (1e-1 - 1e-3) * rnd_unit();
            uint16_t h = quant_f32_to_fp16((float)((rnd() & 1) ? -mag : mag));
            memcpy(row + b * t->size + t->scale_off[k], &h, 2);
        }
}

/* Decode an activation row (formats of vec_dot.h, as the brief defines them) into doubles. */
static void decode_act(uint32_t wtype, const uint8_t *a, int64_t n, double *x)
{
    switch (vd_act_type(wtype)) {
    case GGML_TYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++)
            for (int j = 0; j < 32; j++) x[32 * b + j] = h2d(a + 34 * b) * (int8_t)a[34 * b + 2 + j];
        break;
    case GGML_TYPE_Q8_1:
        for (int64_t b = 0; b < n / 32; b++)
            for (int j = 0; j < 32; j++) x[32 * b + j] = h2d(a + 36 * b) * (int8_t)a[36 * b + 4 + j];
        break;
    case GGML_TYPE_Q8_K:
        for (int64_t b = 0; b < n / 256; b++) {
            float d;
            memcpy(&d, a + 292 * b, 4);
            for (int j = 0; j < 256; j++) x[256 * b + j] = (double)d * (int8_t)a[292 * b + 4 + j];
        }
        break;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) x[i] = h2d(a + 2 * i);
        break;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) x[i] = quant_bf16_to_f32(rd16(a + 2 * i));
        break;
    default:
        for (int64_t i = 0; i < n; i++) { float f; memcpy(&f, a + 4 * i, 4); x[i] = f; }
    }
}

/* Largest error the activation format allows for element i of x (the "half a step" bound):
 * Q8_0/Q8_1: d = amax/127 of the block, |x - d*q| <= d/2 (+ the f32 rounding of x*(1/d): 127*3u of a
 * step, we allow 4e-5 steps), and the stored d16 = fp16(d) adds |q| * |d - d16| <= 127 * |d - d16|.
 * Q8_K: d kept in f32, so d/2 (+4e-5 d). F16: round to nearest, 2^-11 |x| or 2^-25 when subnormal.
 * BF16: 2^-8 |x|. F32: exact. */
static double act_elem_bound(uint32_t wtype, const float *x, int64_t i)
{
    uint32_t at = vd_act_type(wtype);
    if (at == GGML_TYPE_F32) return 0.0;
    if (at == GGML_TYPE_F16) return fmax(0x1p-11 * fabs((double)x[i]), 0x1p-25);
    if (at == GGML_TYPE_BF16) return 0x1p-8 * fabs((double)x[i]);
    int64_t bs = at == GGML_TYPE_Q8_K ? 256 : 32, b0 = i / bs * bs;
    float amax = 0;
    for (int64_t j = b0; j < b0 + bs; j++) amax = fmaxf(amax, fabsf(x[j]));
    double d = (double)(amax / 127.0f);
    double e = (0.5 + 4e-5) * d;
    if (at != GGML_TYPE_Q8_K) e += 127.0 * fabs(d - (double)quant_fp16_to_f32(quant_f32_to_fp16((float)d)));
    return e;
}

/* Q4_1/Q5_1 against Q8_1: the kernel adds m * s with s = fp16(d * sum q), while the decoded
 * activation implies m * fp16(d) * sum q. This is their exact difference, summed over blocks. */
static double q8_1_s_discrepancy(uint32_t wtype, const uint8_t *w, const uint8_t *a, int64_t n)
{
    if (vd_act_type(wtype) != GGML_TYPE_Q8_1) return 0.0;
    const tinfo *t = tinfo_of(wtype);
    double e = 0.0;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *ab = a + 36 * b;
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (int8_t)ab[4 + j];
        e += fabs(h2d(w + b * t->size + 2)) * fabs(h2d(ab + 2) - h2d(ab) * sum);
    }
    return e;
}

/* Rounding error of the kernel's f32 arithmetic. Each kernel forms per-block (or per-element)
 * terms whose magnitudes are bounded by M = sum_i |xh_i| * (|w_i| + 2|off_i|) and adds them with
 * at most k = terms + 8 roundings along any path (product of the two scales, int->float, the
 * accumulation chain, the final horizontal sum and the m/min term), so by the standard bound
 * |err| <= gamma_k * M with gamma_k = k*u/(1-k*u), u = 2^-24. We use 1.01 * (k + 2) * u * M. */
static double float_slack(uint32_t wtype, int64_t n, double M)
{
    int64_t blck = tinfo_of(wtype)->blck;
    double k = (double)(n / blck) + 8.0;
    return 1.01 * (k + 2.0) * 0x1p-24 * M;
}

/* ------------------------------------------------------------------ 5. type table */

Test(quant, type_table_for_every_id)
{
    static const struct { uint32_t id; const char *name; int64_t blck, size; int sup; } known[] = {
        { 0, "F32", 1, 4, 1 }, { 1, "F16", 1, 2, 1 }, { 2, "Q4_0", 32, 18, 1 }, { 3, "Q4_1", 32, 20, 1 },
        { 6, "Q5_0", 32, 22, 1 }, { 7, "Q5_1", 32, 24, 1 }, { 8, "Q8_0", 32, 34, 1 },
        { 9, "Q8_1", 32, 36, 0 }, { 10, "Q2_K", 256, 84, 0 }, { 11, "Q3_K", 256, 110, 0 },
        { 12, "Q4_K", 256, 144, 1 }, { 13, "Q5_K", 256, 176, 1 }, { 14, "Q6_K", 256, 210, 1 },
        { 15, "Q8_K", 256, 292, 0 }, { 30, "BF16", 1, 2, 1 },
    };
    static const uint32_t retired[] = { 4, 5, 31, 32, 33, 36, 37, 38 };
    for (uint32_t id = 0; id < 200; id++) {
        int64_t blck = -7, size = -7;
        int rc = quant_block_geometry(id, &blck, &size);
        const char *name = quant_type_name(id);
        int k = -1;
        for (int i = 0; i < (int)(sizeof known / sizeof known[0]); i++)
            if (known[i].id == id) k = i;
        int is_retired = 0;
        for (int i = 0; i < (int)(sizeof retired / sizeof retired[0]); i++)
            if (retired[i] == id) is_retired = 1;
        if (k >= 0) {
            cr_expect_eq(rc, 0, "geometry of %u", id);
            cr_expect_eq(blck, known[k].blck, "block of %s", known[k].name);
            cr_expect_eq(size, known[k].size, "size of %s", known[k].name);
            cr_expect_str_eq(name, known[k].name);
            cr_expect_eq(quant_supported(id), known[k].sup, "supported(%s)", name);
            cr_expect_eq(quant_row_size(id, 512), (size_t)(512 / blck * size), "row size of %s", name);
            cr_expect_eq(quant_row_size(id, 0), 0u);
            if (blck > 1) cr_expect_eq(quant_row_size(id, blck + 1), 0u, "non-multiple for %s", name);
            cr_expect_eq(vd_get_dot(id) != NULL, known[k].sup, "vd_get_dot(%s)", name);
            cr_expect_eq(vd_get_dot_scalar(id) != NULL, known[k].sup, "vd_get_dot_scalar(%s)", name);
        } else {
            cr_expect_eq(quant_supported(id), 0, "id %u must not be supported", id);
            cr_expect_null(vd_get_dot(id), "id %u", id);
            if (is_retired || id >= GGML_TYPE_MAX_ID) {
                cr_expect_eq(rc, -1, "id %u is retired/unknown", id);
                cr_expect_str_eq(name, "unknown");
                cr_expect_eq(quant_row_size(id, 256), 0u);
            } else if (rc == 0) {   /* other ggml types (IQ*, I8...): sizes known, names set */
                cr_expect(blck >= 1 && size >= 1 && strcmp(name, "unknown") != 0, "id %u", id);
                cr_expect_eq(quant_row_size(id, blck * 3), (size_t)(3 * size));
            } else {
                cr_expect_str_eq(name, "unknown");
            }
        }
    }
    /* NULL out-pointers are allowed */
    cr_expect_eq(quant_block_geometry(GGML_TYPE_Q4_K, NULL, NULL), 0);
    /* activation formats */
    cr_expect_eq(vd_act_type(GGML_TYPE_Q4_0), GGML_TYPE_Q8_0);
    cr_expect_eq(vd_act_type(GGML_TYPE_Q5_0), GGML_TYPE_Q8_0);
    cr_expect_eq(vd_act_type(GGML_TYPE_Q8_0), GGML_TYPE_Q8_0);
    cr_expect_eq(vd_act_type(GGML_TYPE_Q4_1), GGML_TYPE_Q8_1);
    cr_expect_eq(vd_act_type(GGML_TYPE_Q5_1), GGML_TYPE_Q8_1);
    cr_expect_eq(vd_act_type(GGML_TYPE_Q4_K), GGML_TYPE_Q8_K);
    cr_expect_eq(vd_act_type(GGML_TYPE_Q5_K), GGML_TYPE_Q8_K);
    cr_expect_eq(vd_act_type(GGML_TYPE_Q6_K), GGML_TYPE_Q8_K);
    cr_expect_eq(vd_act_type(GGML_TYPE_F16), GGML_TYPE_F16);
    cr_expect_eq(vd_act_type(GGML_TYPE_BF16), GGML_TYPE_BF16);
    cr_expect_eq(vd_act_type(GGML_TYPE_F32), GGML_TYPE_F32);
    cr_expect_eq(vd_act_row_size(GGML_TYPE_Q4_K, 512), 2u * 292u);
    cr_expect_eq(vd_act_row_size(GGML_TYPE_Q5_1, 64), 2u * 36u);
    cr_expect_eq(vd_act_row_size(GGML_TYPE_Q8_0, 64), 2u * 34u);
    cr_expect_eq(vd_act_row_size(GGML_TYPE_F16, 7), 14u);
}

Test(quant, force_scalar_switches_dispatch)
{
    cr_assert_null(vd_isa_env_error(), "%s", vd_isa_env_error());
    int before = vd_simd_active();
    vd_isa isa = vd_isa_active();
    vd_force_scalar(1);
    cr_expect_eq(vd_simd_active(), 0);
    cr_expect_eq(vd_isa_active(), VD_ISA_SCALAR);
    for (int i = 0; i < N_SUPPORTED; i++) {
        cr_expect(vd_get_dot(SUPPORTED[i].type) == vd_get_dot_scalar(SUPPORTED[i].type), "%s", SUPPORTED[i].name);
        cr_expect_null(vd_get_gemm(SUPPORTED[i].type), "%s: no panel kernel when scalar", SUPPORTED[i].name);
    }
    vd_force_scalar(0);
    cr_expect_eq(vd_simd_active(), before);
    cr_expect_eq(vd_isa_active(), isa, "forcing scalar off returns to the chosen level");
#if HAVE_X86
    __builtin_cpu_init();
    int hw = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && have_f16c();
    cr_expect_eq(vd_isa_supported(VD_ISA_AVX2), hw, "AVX2 level exactly when the CPU has AVX2+FMA+F16C");
    const char *env = getenv("KVCHAT_ISA");
    if (!env || !*env) cr_expect_eq(vd_isa_active(), vd_isa_best(), "the best level by default");
    if (vd_isa_supported(VD_ISA_AVX512))
        cr_expect(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"),
                  "AVX-512 level only with F, BW, VL and VNNI");
#endif
    if (!vd_simd_active()) fprintf(stderr, "[quant] SKIP AVX2 kernels: CPU lacks AVX2/FMA/F16C\n");
}

Test(quant, isa_choice_by_name_and_its_errors)
{
    char err[256];
    vd_isa was = vd_isa_active();
    for (int i = 0; i < VD_ISA_COUNT; i++) {
        vd_isa isa = (vd_isa)i;
        err[0] = 0;
        int rc = vd_set_isa_name(vd_isa_name(isa), err, sizeof err);
        if (vd_isa_supported(isa)) {
            cr_expect_eq(rc, 0, "%s: %s", vd_isa_name(isa), err);
            cr_expect_eq(vd_isa_active(), isa);
            cr_expect_eq(vd_simd_active(), isa != VD_ISA_SCALAR);
        } else {
            cr_expect_eq(rc, -1);
            cr_expect(strstr(err, "does not support") && strstr(err, vd_isa_name(isa)), "message: %s", err);
            fprintf(stderr, "[quant] SKIP %s: this CPU lacks %s\n", vd_isa_name(isa), vd_isa_describe(isa));
        }
    }
    cr_expect_eq(vd_isa_supported(VD_ISA_SCALAR), 1);
    cr_expect_eq(vd_set_isa_name("sse9", err, sizeof err), -1);
    cr_expect(strstr(err, "unknown instruction set 'sse9'"), "message: %s", err);
    cr_expect_eq(vd_set_isa(was, err, sizeof err), 0, "%s", err);
    cr_expect_eq(vd_isa_active(), was, "a failed choice leaves the level as it was");
}

Test(quant, dequant_of_unsupported_type_writes_nan)
{
    uint8_t blk[84] = { 0 };
    float out[256];
    for (int i = 0; i < 256; i++) out[i] = 1.0f;
    quant_dequant_row(GGML_TYPE_Q2_K, blk, out, 256);
    for (int i = 0; i < 256; i++) cr_assert(isnan(out[i]));
}

/* ------------------------------------------------------------------ 1. dequantization vs gguf-py */

typedef struct fixture {
    const tinfo *t;
    int64_t n;
    uint8_t *raw;      /* FIX_ROWS rows */
    size_t row_bytes;
    float *expect;     /* FIX_ROWS * n */
    double *dot;       /* FIX_ROWS */
    float *act;        /* n */
} fixture;

static void load_fixture(fixture *fx, uint32_t type)
{
    char path[256];
    size_t sz;
    fx->t = tinfo_of(type);
    fx->n = fx->t->blck == 1 ? 521 : 512;
    fx->row_bytes = quant_row_size(type, fx->n);
    cr_assert(fx->row_bytes > 0);
    snprintf(path, sizeof path, FIX_DIR "%s.bin", fx->t->name);
    fx->raw = read_file(path, &sz);
    cr_assert_eq(sz, FIX_ROWS * fx->row_bytes, "%s: %zu bytes", path, sz);
    snprintf(path, sizeof path, FIX_DIR "%s.f32", fx->t->name);
    fx->expect = read_file(path, &sz);
    cr_assert_eq(sz, FIX_ROWS * (size_t)fx->n * 4, "%s", path);
    snprintf(path, sizeof path, FIX_DIR "%s.dot", fx->t->name);
    fx->dot = read_file(path, &sz);
    cr_assert_eq(sz, FIX_ROWS * 8u, "%s", path);
    fx->act = read_file(FIX_DIR "act.f32", &sz);
    cr_assert(sz >= (size_t)fx->n * 4, "act.f32 too short");
}

static void free_fixture(fixture *fx)
{
    free(fx->raw);
    free(fx->expect);
    free(fx->dot);
    free(fx->act);
}

/* Bit-exact: quant.c evaluates each value with the same f32 operations, in the same order, as
 * gguf-py (and ggml's reference): q*d, q*d + m, (d*sc)*q - dmin*mn, (d*S)*q; the fp16 -> f32 and
 * int -> f32 conversions are exact, so there is no legitimate source of a 1-ulp difference. */
static void check_dequant(uint32_t type)
{
    fixture fx;
    load_fixture(&fx, type);
    float *out = malloc(sizeof(float) * (size_t)(fx.n + 1));
    for (int r = 0; r < FIX_ROWS; r++) {
        fill_nan(out, fx.n + 1);
        quant_dequant_row(type, fx.raw + r * fx.row_bytes, out, fx.n);
        cr_assert(isnan(out[fx.n]), "%s: wrote past the row", fx.t->name);
        for (int64_t i = 0; i < fx.n; i++) {
            float e = fx.expect[r * fx.n + i];
            cr_assert_eq(f2u(out[i]), f2u(e), "%s row %d elem %" PRId64 ": got %.9g (0x%08x), gguf-py %.9g (0x%08x)",
                         fx.t->name, r, i, out[i], f2u(out[i]), e, f2u(e));
        }
    }
    free(out);
    free_fixture(&fx);
}

Test(quant, dequant_F32_matches_gguf_py) { check_dequant(GGML_TYPE_F32); }
Test(quant, dequant_F16_matches_gguf_py) { check_dequant(GGML_TYPE_F16); }
Test(quant, dequant_BF16_matches_gguf_py) { check_dequant(GGML_TYPE_BF16); }
Test(quant, dequant_Q4_0_matches_gguf_py) { check_dequant(GGML_TYPE_Q4_0); }
Test(quant, dequant_Q4_1_matches_gguf_py) { check_dequant(GGML_TYPE_Q4_1); }
Test(quant, dequant_Q5_0_matches_gguf_py) { check_dequant(GGML_TYPE_Q5_0); }
Test(quant, dequant_Q5_1_matches_gguf_py) { check_dequant(GGML_TYPE_Q5_1); }
Test(quant, dequant_Q8_0_matches_gguf_py) { check_dequant(GGML_TYPE_Q8_0); }
Test(quant, dequant_Q4_K_matches_gguf_py) { check_dequant(GGML_TYPE_Q4_K); }
Test(quant, dequant_Q5_K_matches_gguf_py) { check_dequant(GGML_TYPE_Q5_K); }
Test(quant, dequant_Q6_K_matches_gguf_py) { check_dequant(GGML_TYPE_Q6_K); }

/* ------------------------------------------------------------------ 2. dot products */

/* Quantize x for wtype in the current dispatch mode, run `dot`, and compare with `exact`
 * (= sum w_i x_i in double, w the exactly dequantized row). The allowed error is
 *   sum_i |w_i| |x_i - xh_i|          activation quantization (xh = decoded activation row; each
 *                                     |x_i - xh_i| is first checked against act_elem_bound, i.e.
 *                                     half a step d/2 per Q8 block, 2^-11|x| for F16, 2^-8|x| BF16,
 *                                     so this term is <= sum_i |w_i| * max_step_i / 2)
 * + Q8_1 s-field discrepancy          (q8_1_s_discrepancy)
 * + float_slack(M)                    the kernel's own f32 rounding
 * + n * 2^-52 * sum|w_i x_i|           rounding of the double reference itself. */
static void check_dot(const char *what, vd_dot_fn dot, uint32_t wtype, const uint8_t *wrow, const float *wf,
                      const float *x, int64_t n, double exact)
{
    size_t abytes = vd_act_row_size(wtype, n);
    uint8_t *act = malloc(abytes + 64);
    double *xh = malloc(sizeof(double) * (size_t)n);
    double *off = malloc(sizeof(double) * (size_t)n);
    vd_quantize_act(wtype, x, act, n);
    decode_act(wtype, act, n, xh);
    elem_offsets(wtype, wrow, n, off);
    double e_act = 0, M = 0, absref = 0;
    for (int64_t i = 0; i < n; i++) {
        double ei = fabs((double)x[i] - xh[i]);
        cr_assert(ei <= act_elem_bound(wtype, x, i), "%s %s: activation %" PRId64 " off by %.3g > bound %.3g", what,
                  quant_type_name(wtype), i, ei, act_elem_bound(wtype, x, i));
        e_act += fabs((double)wf[i]) * ei;
        M += fabs(xh[i]) * (fabs((double)wf[i]) + 2.0 * off[i]);
        absref += fabs((double)wf[i] * (double)x[i]);
    }
    double tol = e_act + q8_1_s_discrepancy(wtype, wrow, act, n) + float_slack(wtype, n, M) +
                 (double)n * 0x1p-52 * absref;
    float s = NAN;
    dot(n, &s, wrow, act);
    cr_assert(isfinite(s), "%s %s n=%" PRId64 ": result %g", what, quant_type_name(wtype), n, s);
    cr_assert(fabs((double)s - exact) <= tol, "%s %s n=%" PRId64 ": got %.9g, exact %.9g, |err| %.3g > bound %.3g",
              what, quant_type_name(wtype), n, s, exact, fabs((double)s - exact), tol);
    free(act);
    free(xh);
    free(off);
}

static void check_fixture_dots(uint32_t type)
{
    fixture fx;
    load_fixture(&fx, type);
    for (int r = 0; r < FIX_ROWS; r++) {
        const uint8_t *w = fx.raw + r * fx.row_bytes;
        const float *wf = fx.expect + r * fx.n;
        vd_force_scalar(1);
        check_dot("scalar", vd_get_dot_scalar(type), type, w, wf, fx.act, fx.n, fx.dot[r]);
        vd_force_scalar(0);
        if (vd_simd_active()) check_dot("simd", vd_get_dot(type), type, w, wf, fx.act, fx.n, fx.dot[r]);
    }
    free_fixture(&fx);
}

Test(quant, dot_F32_matches_fixture) { check_fixture_dots(GGML_TYPE_F32); }
Test(quant, dot_F16_matches_fixture) { check_fixture_dots(GGML_TYPE_F16); }
Test(quant, dot_BF16_matches_fixture) { check_fixture_dots(GGML_TYPE_BF16); }
Test(quant, dot_Q4_0_matches_fixture) { check_fixture_dots(GGML_TYPE_Q4_0); }
Test(quant, dot_Q4_1_matches_fixture) { check_fixture_dots(GGML_TYPE_Q4_1); }
Test(quant, dot_Q5_0_matches_fixture) { check_fixture_dots(GGML_TYPE_Q5_0); }
Test(quant, dot_Q5_1_matches_fixture) { check_fixture_dots(GGML_TYPE_Q5_1); }
Test(quant, dot_Q8_0_matches_fixture) { check_fixture_dots(GGML_TYPE_Q8_0); }
Test(quant, dot_Q4_K_matches_fixture) { check_fixture_dots(GGML_TYPE_Q4_K); }
Test(quant, dot_Q5_K_matches_fixture) { check_fixture_dots(GGML_TYPE_Q5_K); }
Test(quant, dot_Q6_K_matches_fixture) { check_fixture_dots(GGML_TYPE_Q6_K); }

/* Random rows of awkward lengths: both kernels against sum(w_i * xh_i) over the decoded
 * activation (so the activation error drops out and only f32 rounding + the Q8_1 s-field remain),
 * and the SIMD kernel against the scalar one bit for bit: the same integer block sums, and the
 * scalar kernel keeps the vector kernel's lanes and order of f32 operations. */
Test(quant, simd_and_scalar_kernels_agree_on_awkward_lengths)
{
    seed_rng("simd_and_scalar_kernels_agree_on_awkward_lengths");
    static const int64_t len32[] = { 32, 64, 96, 160, 384, 640, 736, 1024, 2048 };
    static const int64_t len256[] = { 256, 512, 768, 1280, 2048, 2816 };
    static const int64_t len1[] = { 1, 2, 7, 8, 31, 33, 100, 255, 640, 1000, 2048, 2049 };
    for (int ti = 0; ti < N_SUPPORTED; ti++) {
        const tinfo *t = &SUPPORTED[ti];
        const int64_t *lens = t->blck == 1 ? len1 : t->blck == 32 ? len32 : len256;
        int nl = t->blck == 1 ? 12 : t->blck == 32 ? 9 : 6;
        for (int li = 0; li < nl; li++) {
            int64_t n = lens[li];
            for (int rep = 0; rep < 3; rep++) {
                uint8_t *w = malloc(quant_row_size(t->type, n));
                float *wf = malloc(sizeof(float) * (size_t)n);
                float *x = malloc(sizeof(float) * (size_t)n);
                double *xh = malloc(sizeof(double) * (size_t)n);
                double *off = malloc(sizeof(double) * (size_t)n);
                size_t abytes = vd_act_row_size(t->type, n);
                uint8_t *a_s = malloc(abytes), *a_v = malloc(abytes);
                random_row(t->type, w, n);
                quant_dequant_row(t->type, w, wf, n);
                double xscale = ldexp(1.0, (int)(rnd() % 12) - 6);
                for (int64_t i = 0; i < n; i++) x[i] = (float)(rnd_normal() * xscale);
                vd_force_scalar(1);
                vd_quantize_act(t->type, x, a_s, n);
                vd_force_scalar(0);
                vd_quantize_act(t->type, x, a_v, n);
                cr_assert(memcmp(a_s, a_v, abytes) == 0, "%s n=%" PRId64 ": AVX2 and scalar activation quantizers differ",
                          t->name, n);
                decode_act(t->type, a_s, n, xh);
                elem_offsets(t->type, w, n, off);
                double exact = 0, M = 0;
                for (int64_t i = 0; i < n; i++) {
                    exact += (double)wf[i] * xh[i];
                    M += fabs(xh[i]) * (fabs((double)wf[i]) + 2.0 * off[i]);
                }
                double slack = float_slack(t->type, n, M) + (double)n * 0x1p-52 * M;
                double tol = slack + q8_1_s_discrepancy(t->type, w, a_s, n);
                float ss = NAN, sv = NAN;
                vd_get_dot_scalar(t->type)(n, &ss, w, a_s);
                cr_assert(fabs((double)ss - exact) <= tol, "scalar %s n=%" PRId64 ": %.9g vs %.9g (bound %.3g)",
                          t->name, n, ss, exact, tol);
                if (vd_simd_active()) {
                    vd_get_dot(t->type)(n, &sv, w, a_v);
                    cr_assert(fabs((double)sv - exact) <= tol, "simd %s n=%" PRId64 ": %.9g vs %.9g (bound %.3g)",
                              t->name, n, sv, exact, tol);
                    cr_assert(f2u(sv) == f2u(ss), "simd vs scalar %s n=%" PRId64 ": %.9g vs %.9g (not the same bits)",
                              t->name, n, sv, ss);
                }
                free(w); free(wf); free(x); free(xh); free(off); free(a_s); free(a_v);
            }
        }
    }
}

/* Extreme blocks the random rows rarely hit: Q8_0 weights of -128 (the sign trick must not
 * overflow), all-max nibbles, zero activations (d = 0), and rows where offsets cancel. */
Test(quant, kernels_handle_extreme_blocks)
{
    for (int ti = 0; ti < N_SUPPORTED; ti++) {
        const tinfo *t = &SUPPORTED[ti];
        if (t->blck == 1) continue;
        int64_t n = 512;
        size_t wb = quant_row_size(t->type, n);
        for (int pattern = 0; pattern < 4; pattern++) {
            uint8_t *w = malloc(wb);
            float *wf = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
            double *xh = malloc(sizeof(double) * (size_t)n);
            memset(w, pattern == 0 ? 0x80 : pattern == 1 ? 0xFF : pattern == 2 ? 0x00 : 0x7F, wb);
            for (int64_t b = 0; b < n / t->blck; b++)
                for (int k = 0; k < 2; k++)
                    if (t->scale_off[k] >= 0) {
                        uint16_t h = quant_f32_to_fp16(k ? -0.03f : 0.05f);
                        memcpy(w + b * t->size + t->scale_off[k], &h, 2);
                    }
            quant_dequant_row(t->type, w, wf, n);
            for (int64_t i = 0; i < n; i++)
                x[i] = (i / 32) % 3 == 0 ? 0.0f : (float)((i % 2 ? -1.0 : 1.0) * (1.0 + (double)(i % 7)));
            size_t ab = vd_act_row_size(t->type, n);
            uint8_t *a = malloc(ab);
            for (int mode = 0; mode < 2; mode++) {
                vd_force_scalar(mode == 0);
                if (mode == 1 && !vd_simd_active()) break;
                vd_quantize_act(t->type, x, a, n);
                decode_act(t->type, a, n, xh);
                double exact = 0, M = 0;
                double *off = malloc(sizeof(double) * (size_t)n);
                elem_offsets(t->type, w, n, off);
                for (int64_t i = 0; i < n; i++) {
                    exact += (double)wf[i] * xh[i];
                    M += fabs(xh[i]) * (fabs((double)wf[i]) + 2.0 * off[i]);
                }
                free(off);
                double tol = float_slack(t->type, n, M) + q8_1_s_discrepancy(t->type, w, a, n) + 1e-30;
                float s = NAN;
                vd_get_dot(t->type)(n, &s, w, a);
                cr_assert(fabs((double)s - exact) <= tol, "%s %s pattern %d: %.9g vs %.9g (bound %.3g)",
                          mode ? "simd" : "scalar", t->name, pattern, s, exact, tol);
            }
            vd_force_scalar(0);
            free(w); free(wf); free(x); free(xh); free(a);
        }
    }
}

/* The quantizers follow the formats of vec_dot.h exactly (both dispatch modes), which is what
 * bounds the activation error used above: |x - d*q| <= d/2 per element up to the f32 rounding of
 * x*(1/d) (at most 127 * 3u relative of a step: we allow 0.5 + 4e-5 steps). */
Test(quant, act_quantizers_follow_spec)
{
    seed_rng("act_quantizers_follow_spec");
    const int64_t n = 1024;
    float *x = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rnd_normal() * ldexp(1.0, (int)(rnd() % 20) - 10));
    for (int64_t i = 256; i < 288; i++) x[i] = 0.0f;                     /* an all-zero block */
    for (int64_t i = 512; i < 544; i++) x[i] = (float)(i - 528) * 0.5f;   /* exact .5 steps */
    x[600] = 1e-30f;                                                       /* tiny values */
    static const uint32_t wtypes[] = { GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K };
    for (int mode = 0; mode < 2; mode++) {
        vd_force_scalar(mode == 0);
        if (mode == 1 && !vd_simd_active()) break;
        for (int wi = 0; wi < 3; wi++) {
            uint32_t wt = wtypes[wi];
            uint32_t at = vd_act_type(wt);
            int64_t bs = at == GGML_TYPE_Q8_K ? 256 : 32;
            size_t ab = vd_act_row_size(wt, n);
            uint8_t *a = malloc(ab);
            memset(a, 0xAB, ab);
            vd_quantize_act(wt, x, a, n);
            size_t bb = ab / (size_t)(n / bs);
            for (int64_t b = 0; b < n / bs; b++) {
                const uint8_t *p = a + b * bb;
                const float *xb = x + b * bs;
                float amax = 0;
                for (int j = 0; j < bs; j++) amax = fmaxf(amax, fabsf(xb[j]));
                float d = amax / 127.0f;
                const int8_t *q;
                if (at == GGML_TYPE_Q8_K) {
                    float dd;
                    memcpy(&dd, p, 4);
                    cr_assert_eq(f2u(dd), f2u(d), "Q8_K d");
                    q = (const int8_t *)(p + 4);
                    for (int g = 0; g < 16; g++) {
                        int sum = 0;
                        for (int j = 0; j < 16; j++) sum += q[16 * g + j];
                        cr_assert_eq((int)(int16_t)rd16(p + 260 + 2 * g), sum, "Q8_K bsums[%d]", g);
                    }
                } else {
                    cr_assert_eq(rd16(p), quant_f32_to_fp16(d), "%s d field", quant_type_name(at));
                    q = (const int8_t *)(p + (at == GGML_TYPE_Q8_1 ? 4 : 2));
                    if (at == GGML_TYPE_Q8_1) {
                        int sum = 0;
                        for (int j = 0; j < 32; j++) sum += q[j];
                        cr_assert_eq(rd16(p + 2), quant_f32_to_fp16(d * (float)sum), "Q8_1 s field");
                    }
                }
                for (int j = 0; j < bs; j++) {
                    cr_assert(q[j] >= -127 && q[j] <= 127);
                    double err = fabs((double)xb[j] - (double)d * q[j]);
                    cr_assert(err <= (0.5 + 4e-5) * d, "%s %s block %" PRId64 " elem %d: x %.9g, q %d, d %.9g",
                              mode ? "simd" : "scalar", quant_type_name(at), b, j, xb[j], q[j], d);
                }
            }
            free(a);
        }
    }
    vd_force_scalar(0);
    free(x);
}

/* Garbage in (inf, NaN, huge values) must still give q in [-127, 127]: the Q8_0 kernels move the
 * sign of the weight onto the activation, which would overflow for -128. */
Test(quant, act_quantizers_never_emit_minus_128)
{
    const int64_t n = 512;
    float x[512];
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i % 5) - 2) * 1e37f;
    x[3] = INFINITY;
    x[40] = -INFINITY;
    x[77] = NAN;
    x[300] = -NAN;
    x[301] = -FLT_MAX;
    static const uint32_t wtypes[] = { GGML_TYPE_Q8_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K };
    for (int mode = 0; mode < 2; mode++) {
        vd_force_scalar(mode == 0);
        if (mode == 1 && !vd_simd_active()) break;
        for (int wi = 0; wi < 3; wi++) {
            uint32_t at = vd_act_type(wtypes[wi]);
            size_t ab = vd_act_row_size(wtypes[wi], n);
            uint8_t a[2 * 292 + 16 * 36];
            vd_quantize_act(wtypes[wi], x, a, n);
            int64_t bs = at == GGML_TYPE_Q8_K ? 256 : 32;
            size_t bb = ab / (size_t)(n / bs), qoff = at == GGML_TYPE_Q8_K ? 4 : at == GGML_TYPE_Q8_1 ? 4 : 2;
            for (int64_t b = 0; b < n / bs; b++)
                for (int64_t j = 0; j < bs; j++)
                    cr_assert((int8_t)a[b * bb + qoff + j] != -128, "%s %s: q = -128 at %" PRId64,
                              mode ? "simd" : "scalar", quant_type_name(at), b * bs + j);
        }
    }
    vd_force_scalar(0);
}

/* F16/BF16 activation conversion: AVX2 (hardware vcvtps2ph / integer rounding) and scalar agree bit
 * for bit, on normal values and on the corner cases (NaN payloads, inf, subnormals, ties). */
Test(quant, f16_bf16_act_conversion_simd_equals_scalar)
{
    seed_rng("f16_bf16_act_conversion_simd_equals_scalar");
    const int64_t n = 4099;
    float *x = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        switch (rnd() % 4) {
        case 0: x[i] = u2f((uint32_t)rnd()); break;                                  /* any bits */
        case 1: x[i] = (float)rnd_normal(); break;
        case 2: x[i] = u2f(((uint32_t)rnd() & 0x80000fffu) | ((uint32_t)(100 + rnd() % 20) << 23)); break;
        default: x[i] = u2f(((uint32_t)rnd() & 0x8000ffffu) | 0x7f800000u | ((uint32_t)rnd() & 0x10000u)); break;
        }
    }
    static const uint32_t wt[] = { GGML_TYPE_F16, GGML_TYPE_BF16 };
    for (int k = 0; k < 2; k++) {
        size_t ab = vd_act_row_size(wt[k], n);
        uint8_t *a = malloc(ab), *b = malloc(ab);
        vd_force_scalar(1);
        vd_quantize_act(wt[k], x, a, n);
        vd_force_scalar(0);
        vd_quantize_act(wt[k], x, b, n);
        for (int64_t i = 0; i < n; i++) {
            uint16_t ref = wt[k] == GGML_TYPE_F16 ? quant_f32_to_fp16(x[i]) : quant_f32_to_bf16(x[i]);
            cr_assert_eq(rd16(a + 2 * i), ref, "scalar %s elem %" PRId64, quant_type_name(wt[k]), i);
            cr_assert_eq(rd16(b + 2 * i), ref, "simd %s elem %" PRId64 " x=0x%08x", quant_type_name(wt[k]), i, f2u(x[i]));
        }
        free(a);
        free(b);
    }
    free(x);
}

/* ------------------------------------------------------------------ 3. fp16 / bf16 conversion */

Test(quant, fp16_round_trips_all_65536_values)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_fp16_to_f32((uint16_t)h);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        if (is_nan) {
            cr_assert(isnan(f), "0x%04x must decode to NaN", h);
            cr_assert(isnan(quant_fp16_to_f32(quant_f32_to_fp16(f))), "0x%04x NaN must stay NaN", h);
            cr_assert_eq(f2u(f) >> 31, h >> 15, "NaN sign");
        } else {
            cr_assert_eq(quant_f32_to_fp16(f), h, "0x%04x -> %.9g -> 0x%04x", h, f, quant_f32_to_fp16(f));
        }
        /* value check independent of the bit tricks: ldexp of the fields */
        if (!is_nan) {
            int e = (int)((h >> 10) & 0x1f), m = (int)(h & 0x3ff);
            double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
            if (h & 0x8000) v = -v;
            cr_assert_eq((double)f, v, "0x%04x", h);
            cr_assert_eq(signbit(f) != 0, (h & 0x8000) != 0);
        }
#if HAVE_X86
        if (have_f16c()) cr_assert_eq(f2u(f), f2u(hw_fp16_to_f32((uint16_t)h)), "0x%04x vs F16C", h);
#endif
    }
}

/* Rounding f32 -> fp16 by construction: the midpoint between two neighbouring halves (exact in
 * f32) rounds to the even one, one f32 ulp either side rounds to the nearer one; at the top,
 * 65520 (the midpoint above 65504) and beyond go to inf. Works without any hardware. */
Test(quant, fp16_rounding_ties_to_even_overflow_subnormals)
{
    for (uint32_t h = 0; h < 0x7bff; h++) {   /* positive finite pairs (h, h+1) */
        for (int sgn = 0; sgn < 2; sgn++) {
            uint16_t lo = (uint16_t)(h | (sgn << 15)), hi = (uint16_t)((h + 1) | (sgn << 15));
            float a = quant_fp16_to_f32(lo), b = quant_fp16_to_f32(hi);
            float mid = (float)(((double)a + (double)b) / 2.0);
            cr_assert_eq((double)mid, ((double)a + (double)b) / 2.0, "midpoint exact");
            uint16_t even = (lo & 1) ? hi : lo;
            cr_assert_eq(quant_f32_to_fp16(mid), even, "tie between 0x%04x and 0x%04x", lo, hi);
            cr_assert_eq(quant_f32_to_fp16(nextafterf(mid, a)), lo, "just below midpoint of 0x%04x", lo);
            cr_assert_eq(quant_f32_to_fp16(nextafterf(mid, b)), hi, "just above midpoint of 0x%04x", lo);
        }
    }
    cr_assert_eq(quant_f32_to_fp16(65504.0f), 0x7bff);
    cr_assert_eq(quant_f32_to_fp16(nextafterf(65520.0f, 0.0f)), 0x7bff);
    cr_assert_eq(quant_f32_to_fp16(65520.0f), 0x7c00, "65520 ties to even = inf");
    cr_assert_eq(quant_f32_to_fp16(-1e6f), 0xfc00);
    cr_assert_eq(quant_f32_to_fp16(FLT_MAX), 0x7c00);
    cr_assert_eq(quant_f32_to_fp16(INFINITY), 0x7c00);
    cr_assert_eq(quant_f32_to_fp16(-INFINITY), 0xfc00);
    cr_assert_eq(quant_f32_to_fp16(-0.0f), 0x8000);
    cr_assert_eq(quant_f32_to_fp16(0x1p-24f), 0x0001, "smallest subnormal");
    cr_assert_eq(quant_f32_to_fp16(0x1p-25f), 0x0000, "half of it ties to even zero");
    cr_assert_eq(quant_f32_to_fp16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    cr_assert_eq(quant_f32_to_fp16(0x1.8p-24f), 0x0002, "1.5 ulp ties to even 2");
    cr_assert_eq(quant_f32_to_fp16(FLT_MIN / 4), 0x0000, "f32 subnormal -> 0");
    cr_assert_eq(quant_f32_to_fp16(nextafterf(0x1p-14f, 0.0f)), 0x0400, "rounds up into the normals");
    uint16_t qn = quant_f32_to_fp16(u2f(0x7f800001u));   /* signalling NaN with only a low payload bit */
    cr_assert(((qn & 0x7c00) == 0x7c00) && (qn & 0x3ff), "NaN must stay NaN, got 0x%04x", qn);
}

Test(quant, fp16_rounding_matches_f16c_hardware)
{
#if HAVE_X86
    if (!have_f16c()) {
        cr_skip_test("SKIP: no F16C on this CPU (rounding is still checked by construction)");
        return;
    }
    seed_rng("fp16_rounding_matches_f16c_hardware");
    /* every f32 exponent x a spread of mantissas around the rounding points, plus random bits */
    for (uint32_t e = 0; e < 256; e++)
        for (uint32_t k = 0; k < 4096; k++) {
            uint32_t m = (k < 2048) ? ((k << 12) | (k & 1 ? 0x1000u : 0u)) + (k % 3) - 1 : (uint32_t)rnd();
            uint32_t u = (e << 23) | (m & 0x7fffffu) | ((k & 2) ? 0x80000000u : 0u);
            float f = u2f(u);
            cr_assert_eq(quant_f32_to_fp16(f), hw_f32_to_fp16(f), "f32 0x%08x: 0x%04x vs F16C 0x%04x", u,
                         quant_f32_to_fp16(f), hw_f32_to_fp16(f));
        }
    for (int i = 0; i < 1 << 20; i++) {
        float f = u2f((uint32_t)rnd());
        cr_assert_eq(quant_f32_to_fp16(f), hw_f32_to_fp16(f), "f32 0x%08x", f2u(f));
    }
#else
    cr_skip_test("SKIP: not x86 (rounding is still checked by construction)");
#endif
}

Test(quant, bf16_round_trip_and_rounding)
{
    for (uint32_t b = 0; b < 65536; b++) {
        float f = quant_bf16_to_f32((uint16_t)b);
        cr_assert_eq(f2u(f), b << 16);
        if (isnan(f)) cr_assert(isnan(quant_bf16_to_f32(quant_f32_to_bf16(f))), "NaN 0x%04x stays NaN", b);
        else cr_assert_eq(quant_f32_to_bf16(f), b, "0x%04x round trip", b);
        /* ties to even between b and b+1 (finite, same sign, not crossing into inf/NaN) */
        if ((b & 0x7fff) < 0x7f7f) {
            uint32_t mid = (b << 16) | 0x8000u;
            uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
            cr_assert_eq(quant_f32_to_bf16(u2f(mid)), even, "tie above 0x%04x", b);
            cr_assert_eq(quant_f32_to_bf16(u2f(mid - 1)), b, "below tie above 0x%04x", b);
            cr_assert_eq(quant_f32_to_bf16(u2f(mid + 1)), b + 1, "above tie above 0x%04x", b);
        }
    }
    cr_assert(isnan(quant_bf16_to_f32(quant_f32_to_bf16(u2f(0x7f800001u)))), "low-payload NaN stays NaN");
    cr_assert(isnan(quant_bf16_to_f32(quant_f32_to_bf16(u2f(0xffffffffu)))));
    cr_assert_eq(quant_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(quant_f32_to_bf16(FLT_MAX), 0x7f80, "max float rounds to inf");
}

/* ------------------------------------------------------------------ 4. f32 helpers */

Test(quant, dot_f32_and_axpy_f32_match_double_loops)
{
    seed_rng("dot_f32_and_axpy_f32_match_double_loops");
    static const int64_t lens[] = { 0, 1, 7, 8, 15, 16, 31, 33, 64, 100, 257, 1000 };
    for (int mode = 0; mode < 2; mode++) {
        vd_force_scalar(mode == 0);
        if (mode == 1 && !vd_simd_active()) break;
        for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
            int64_t n = lens[li];
            /* +8 sentinels after each array: nothing past n may be read into the result or written */
            float *a = malloc(sizeof(float) * (size_t)(n + 8)), *b = malloc(sizeof(float) * (size_t)(n + 8));
            float *y = malloc(sizeof(float) * (size_t)(n + 8)), *y0 = malloc(sizeof(float) * (size_t)(n + 8));
            for (int64_t i = 0; i < n + 8; i++) {
                a[i] = i < n ? (float)rnd_normal() : NAN;
                b[i] = i < n ? (float)rnd_normal() : NAN;
                y[i] = y0[i] = i < n ? (float)rnd_normal() : 12345.0f;
            }
            double ref = 0, absref = 0;
            for (int64_t i = 0; i < n; i++) {
                ref += (double)a[i] * b[i];
                absref += fabs((double)a[i] * b[i]);
            }
            /* any summation order: |err| <= gamma_(n+1) * sum|a_i b_i| (n adds + the products) */
            float got = vd_dot_f32(n, a, b);
            double tol = 1.01 * (double)(n + 2) * 0x1p-24 * absref + (double)n * 0x1p-52 * absref;
            cr_assert(fabs((double)got - ref) <= tol, "%s dot n=%" PRId64 ": %.9g vs %.9g (bound %.3g)",
                      mode ? "simd" : "scalar", n, got, ref, tol);
            float alpha = (float)rnd_normal();
            vd_axpy_f32(n, alpha, a, y);
            for (int64_t i = 0; i < n; i++) {
                double exact = (double)y0[i] + (double)alpha * a[i];
                /* fma: one rounding; a*x + y: two. Both within 2u(|a x| + |y|). */
                double bound = 0x1p-23 * (fabs((double)alpha * a[i]) + fabs((double)y0[i])) * 1.01;
                cr_assert(fabs((double)y[i] - exact) <= bound, "%s axpy n=%" PRId64 " i=%" PRId64, mode ? "simd" : "scalar", n, i);
            }
            for (int64_t i = n; i < n + 8; i++) cr_assert_eq(y[i], 12345.0f, "axpy wrote past n=%" PRId64, n);
            free(a); free(b); free(y); free(y0);
        }
    }
    vd_force_scalar(0);
}

/* ------------------------------------------------------------------ 7. panel kernels (prefill products) */

static const uint32_t GEMM_TYPES[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0,
                                       GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };
#define N_GEMM_TYPES ((int)(sizeof GEMM_TYPES / sizeof GEMM_TYPES[0]))

/* The panel kernels to test: those of each SIMD level this CPU has (one SKIP line for each it lacks),
 * and where AVX-512 is there, the AVX-VNNI kernels' algorithm in its EVEX build (so a CPU without
 * AVX-VNNI still checks their layout and sums; vec_vnni8_avx512.c). */
typedef struct gemm_level {
    const char *name;
    vd_isa isa;          /* the level to set while it runs */
    int evex8;           /* 1: vd_gemm_avx512_8 instead of vd_get_gemm */
} gemm_level;

static int simd_levels(gemm_level out[VD_ISA_COUNT + 1], const char *test)
{
    int k = 0;
    for (int i = VD_ISA_AVX2; i < VD_ISA_COUNT; i++) {
        if (vd_isa_supported((vd_isa)i))
            out[k++] = (gemm_level){ vd_isa_name((vd_isa)i), (vd_isa)i, 0 };
        else
            fprintf(stderr, "[quant] %s: SKIP %s kernels: this CPU lacks %s\n", test, vd_isa_name((vd_isa)i),
                    vd_isa_describe((vd_isa)i));
    }
    if (vd_isa_supported(VD_ISA_AVX512)) out[k++] = (gemm_level){ "avxvnni (EVEX build)", VD_ISA_AVX512, 1 };
    return k;
}

static const vd_gemm *level_gemm(const gemm_level *lv, uint32_t type)
{
    char err[256];
    cr_assert_eq(vd_set_isa(lv->isa, err, sizeof err), 0, "%s", err);
    return lv->evex8 ? vd_gemm_avx512_8(type) : vd_get_gemm(type);
}

static void set_level(vd_isa isa)
{
    char err[256];
    cr_assert_eq(vd_set_isa(isa, err, sizeof err), 0, "%s", err);
}

/* Pack the rows into panels and multiply: y[t * ldy + r] for all rows and tokens. */
static void run_panels(const vd_gemm *g, uint32_t type, int64_t n, const uint8_t *w, int rows, const uint8_t *act,
                       size_t astride, int64_t ntok, float *y, size_t ldy)
{
    size_t wrow = quant_row_size(type, n);
    void *panel = malloc(g->panel_bytes(n));
    cr_assert(panel);
    for (int r0 = 0; r0 < rows; r0 += g->rows) {
        int nr = rows - r0 < g->rows ? rows - r0 : g->rows;
        memset(panel, 0xA5, g->panel_bytes(n));   /* pack must write every byte it reads back */
        g->pack(n, w + (size_t)r0 * wrow, wrow, nr, panel);
        g->mul(n, panel, nr, act, astride, ntok, y + r0, ldy);
    }
    free(panel);
}

/* Random rows and activations of awkward shapes (row lengths, rows not a multiple of a panel, token
 * counts around the tile size): every result against the scalar kernel on the vd_quantize_act row,
 * within the two kernels' f32 rounding slack of the exact sum and with the same bits (the same
 * integer block sums, scaled and added in the same order), and nothing written outside the
 * nrows x ntok results. */
Test(quant, panel_kernels_agree_with_scalar_on_awkward_shapes)
{
    seed_rng("panel_kernels_agree_with_scalar_on_awkward_shapes");
    vd_isa was = vd_isa_active();
    gemm_level lv[VD_ISA_COUNT + 1];
    int nlv = simd_levels(lv, "panel_kernels_agree_with_scalar_on_awkward_shapes");
    static const int64_t len32[] = { 32, 96, 640, 1056 };
    static const int64_t len256[] = { 256, 768, 2048 };
    static const int row_counts[] = { 1, 7, 16, 21, 40 };
    static const int64_t tok_counts[] = { 1, 3, 8, 13, 37 };
    for (int li = 0; li < nlv; li++) {
        for (int ti = 0; ti < N_GEMM_TYPES; ti++) {
            uint32_t type = GEMM_TYPES[ti];
            const vd_gemm *g = level_gemm(&lv[li], type);
            if (!g) {
                fprintf(stderr, "[quant] %s has no panel kernel for %s\n", lv[li].name, quant_type_name(type));
                continue;
            }
            const tinfo *t = tinfo_of(type);
            const int64_t *lens = t->blck == 32 ? len32 : len256;
            int nl = t->blck == 32 ? 4 : 3;
            for (int lj = 0; lj < nl; lj++) {
                int64_t n = lens[lj];
                int rows = row_counts[(lj + ti) % 5];
                int64_t ntok = tok_counts[(lj * 2 + ti + li) % 5];
                if (lj == 0) rows = 40, ntok = 37;   /* every length sees a multi-panel, multi-tile case */
                size_t wrow = quant_row_size(type, n), arow = vd_act_row_size(type, n);
                size_t grow = vd_gemm_act_row_size(type, n);
                cr_assert(grow % 64 == 0 && grow > 0);
                uint8_t *w = malloc(wrow * (size_t)rows), *a = malloc(arow * (size_t)ntok);
                uint8_t *ga = malloc(grow * (size_t)ntok), *ga2 = malloc(grow);
                float *x = malloc(sizeof(float) * (size_t)n), *wf = malloc(sizeof(float) * (size_t)n * rows);
                double *xh = malloc(sizeof(double) * (size_t)n * ntok), *off = malloc(sizeof(double) * (size_t)n);
                for (int r = 0; r < rows; r++) {
                    random_row(type, w + (size_t)r * wrow, n);
                    quant_dequant_row(type, w + (size_t)r * wrow, wf + (size_t)r * n, n);
                }
                for (int64_t tk = 0; tk < ntok; tk++) {
                    double xscale = ldexp(1.0, (int)(rnd() % 12) - 6);
                    for (int64_t i = 0; i < n; i++) x[i] = (float)(rnd_normal() * xscale);
                    vd_quantize_act(type, x, a + (size_t)tk * arow, n);
                    vd_gemm_quantize_act(type, x, ga + (size_t)tk * grow, n);
                    vd_gemm_act_from_dot_act(type, a + (size_t)tk * arow, ga2, n);
                    cr_assert(memcmp(ga + (size_t)tk * grow, ga2, grow) == 0,
                              "%s n=%" PRId64 ": panel activations differ from the repacked dot activations",
                              quant_type_name(type), n);
                    decode_act(type, a + (size_t)tk * arow, n, xh + (size_t)tk * n);
                }
                size_t ldy = (size_t)rows + 3;
                float *y = malloc(sizeof(float) * ldy * (size_t)(ntok + 1));
                fill_nan(y, (int64_t)(ldy * (size_t)(ntok + 1)));
                run_panels(g, type, n, w, rows, ga, grow, ntok, y, ldy);
                for (int64_t tk = 0; tk < ntok; tk++)
                    for (int r = 0; r < rows; r++) {
                        float ref = NAN;
                        vd_get_dot_scalar(type)(n, &ref, w + (size_t)r * wrow, a + (size_t)tk * arow);
                        elem_offsets(type, w + (size_t)r * wrow, n, off);
                        double M = 0;
                        for (int64_t i = 0; i < n; i++)
                            M += fabs(xh[(size_t)tk * n + i]) * (fabs((double)wf[(size_t)r * n + i]) + 2.0 * off[i]);
                        double slack = float_slack(type, n, M) + (double)n * 0x1p-52 * M;
                        float got = y[(size_t)tk * ldy + r];
                        cr_assert(fabs((double)got - (double)ref) <= 2.0 * slack,
                                  "%s %s n=%" PRId64 " row %d/%d token %" PRId64 "/%" PRId64 ": %.9g vs scalar %.9g (bound %.3g)",
                                  lv[li].name, quant_type_name(type), n, r, rows, tk, ntok, got, ref, 2.0 * slack);
                        cr_assert_eq(f2u(got), f2u(ref), "%s %s n=%" PRId64 " row %d token %" PRId64 ": %.9g, scalar %.9g (not the same bits)",
                                     lv[li].name, quant_type_name(type), n, r, tk, got, ref);
                    }
                for (int64_t tk = 0; tk <= ntok; tk++)
                    for (size_t r = tk < ntok ? (size_t)rows : 0; r < ldy; r++)
                        cr_assert(isnan(y[(size_t)tk * ldy + r]), "%s %s: wrote outside the results (token %" PRId64 ", col %zu)",
                                  lv[li].name, quant_type_name(type), tk, r);
                free(w); free(a); free(ga); free(ga2); free(x); free(wf); free(xh); free(off); free(y);
            }
        }
    }
    set_level(was);
}

/* Exactness of the integer block sums, which unsigned-by-signed byte products make delicate (codes
 * carry offsets; the AVX2 kernels sum int16 pairs): with every scale 1, one block per row, each
 * result is the integer sum itself (or its f32 rounding, the same in both kernels), so the panel
 * kernels must equal the scalar kernel bit for bit, and the exact sum up to the scalar kernel's own
 * rounding of sums past 2^24. Extreme codes (all
 * 0x00, 0xFF, 0x80, 0x7F bytes: Q8_0 weights of -128, all-max nibbles and high bits) against
 * activations of all +127, all -127, alternating, and random. Rows of 20 blocks (Q4_0/Q5_0/Q8_0) also
 * sum exactly in f32 (every partial sum < 2^24). */
Test(quant, panel_integer_sums_are_exact_at_extremes)
{
    seed_rng("panel_integer_sums_are_exact_at_extremes");
    vd_isa was = vd_isa_active();
    gemm_level lv[VD_ISA_COUNT + 1];
    int nlv = simd_levels(lv, "panel_integer_sums_are_exact_at_extremes");
    const uint16_t one = quant_f32_to_fp16(1.0f);
    for (int li = 0; li < nlv; li++) {
        for (int ti = 0; ti < N_GEMM_TYPES; ti++) {
            uint32_t type = GEMM_TYPES[ti];
            const vd_gemm *g = level_gemm(&lv[li], type);
            if (!g) continue;
            const tinfo *t = tinfo_of(type);
            for (int64_t n = t->blck; n <= (t->blck == 32 ? 640 : 256); n += t->blck == 32 ? 608 : 256) {
                const int rows = 6 * 4, ntok = 5;   /* 4 weight patterns + 2 random, 4 rows each */
                size_t wrow = quant_row_size(type, n), arow = vd_act_row_size(type, n), grow = vd_gemm_act_row_size(type, n);
                uint8_t *w = malloc(wrow * rows), *a = malloc(arow * ntok), *ga = malloc(grow * ntok);
                float *wf = malloc(sizeof(float) * (size_t)n);
                for (int r = 0; r < rows; r++) {
                    uint8_t *row = w + (size_t)r * wrow;
                    int pat = r / 4;
                    static const uint8_t fill[4] = { 0x00, 0xFF, 0x80, 0x7F };
                    if (pat < 4)
                        memset(row, fill[pat], wrow);
                    else
                        for (size_t i = 0; i < wrow; i++) row[i] = (uint8_t)rnd();
                    for (int64_t b = 0; b < n / t->blck; b++)
                        for (int k = 0; k < 2; k++)
                            if (t->scale_off[k] >= 0) memcpy(row + b * t->size + t->scale_off[k], &one, 2);
                }
                for (int tk = 0; tk < ntok; tk++) {
                    int8_t q[256];
                    uint8_t *ar = a + (size_t)tk * arow;
                    for (int64_t b = 0; b < n / t->blck; b++) {
                        for (int j = 0; j < t->blck; j++)
                            q[j] = (int8_t)(tk == 0 ? 127 : tk == 1 ? -127 : tk == 2 ? (j % 2 ? 127 : -127)
                                                                                   : (int)(rnd() % 255) - 127);
                        if (t->blck == 32) {   /* Q8_0 activation block, d = 1 */
                            memcpy(ar + 34 * b, &one, 2);
                            memcpy(ar + 34 * b + 2, q, 32);
                        } else {               /* Q8_K block, d = 1, with its 16-element sums */
                            float d1 = 1.0f;
                            memcpy(ar + 292 * b, &d1, 4);
                            memcpy(ar + 292 * b + 4, q, 256);
                            for (int gi = 0; gi < 16; gi++) {
                                int16_t sum = 0;
                                for (int j = 0; j < 16; j++) sum = (int16_t)(sum + q[16 * gi + j]);
                                memcpy(ar + 292 * b + 260 + 2 * gi, &sum, 2);
                            }
                        }
                    }
                    vd_gemm_act_from_dot_act(type, ar, ga + (size_t)tk * grow, n);
                }
                float y[24 * 5];
                fill_nan(y, 24 * 5);
                run_panels(g, type, n, w, rows, ga, grow, ntok, y, rows);
                for (int r = 0; r < rows; r++) {
                    quant_dequant_row(type, w + (size_t)r * wrow, wf, n);
                    double off[640];
                    elem_offsets(type, w + (size_t)r * wrow, n, off);
                    for (int tk = 0; tk < ntok; tk++) {
                        double xh[640];
                        decode_act(type, a + (size_t)tk * arow, n, xh);
                        double exact = 0, M = 0;   /* integers times exactly representable values */
                        for (int64_t i = 0; i < n; i++) {
                            exact += (double)wf[i] * xh[i];
                            M += fabs(xh[i]) * (fabs((double)wf[i]) + 2.0 * off[i]);
                        }
                        float ref = NAN;
                        vd_get_dot_scalar(type)(n, &ref, w + (size_t)r * wrow, a + (size_t)tk * arow);
                        float got = y[tk * rows + r];
                        cr_assert_eq(f2u(got), f2u(ref), "%s %s n=%" PRId64 " row %d (pattern %d) token %d: %.9g vs scalar %.9g",
                                     lv[li].name, quant_type_name(type), n, r, r / 4, tk, got, ref);
                        /* the scalar kernel's own roundings: the f32 conversion of its integer sums
                         * (sumi, summ: exact below 2^24, a K-quant super-block can exceed it) and of
                         * the result, each at most half an ulp of numbers bounded by M */
                        cr_assert(fabs((double)got - exact) <= 1.5 * 0x1p-24 * M,
                                  "%s %s row %d token %d: %.9g vs exact %.17g", lv[li].name, quant_type_name(type),
                                  r, tk, got, exact);
                    }
                }
                free(w); free(a); free(ga); free(wf);
            }
        }
    }
    set_level(was);
}

/* Decode (one token) must give the bits of prefill (a batch): the rows kernel against every level's
 * panel kernels, bit for bit, on random rows of awkward lengths, row counts that leave a partial
 * group of 8, and extreme codes; and nothing stored past nrows. */
Test(quant, decode_rows_kernels_give_the_panel_bits)
{
    seed_rng("decode_rows_kernels_give_the_panel_bits");
    vd_isa was = vd_isa_active();
    gemm_level lv[VD_ISA_COUNT + 1];
    int nlv = simd_levels(lv, "decode_rows_kernels_give_the_panel_bits");
    static const int64_t len32[] = { 32, 96, 640, 1056 };
    static const int64_t len256[] = { 256, 768, 2048 };
    for (int li = 0; li < nlv; li++) {
        for (int ti = 0; ti < N_GEMM_TYPES; ti++) {
            uint32_t type = GEMM_TYPES[ti];
            const vd_gemm *g = level_gemm(&lv[li], type);
            vd_dot_rows_fn rows = vd_get_dot_rows(type);
            if (!g) continue;
            cr_assert(rows, "%s: a panel kernel but no decode rows kernel for %s", lv[li].name, quant_type_name(type));
            const tinfo *t = tinfo_of(type);
            const int64_t *lens = t->blck == 32 ? len32 : len256;
            int nl = t->blck == 32 ? 4 : 3;
            for (int lj = 0; lj < nl; lj++) {
                int64_t n = lens[lj];
                const int nrow = 21, ntok = 3;
                size_t wrow = quant_row_size(type, n), arow = vd_act_row_size(type, n), grow = vd_gemm_act_row_size(type, n);
                uint8_t *w = malloc(wrow * nrow), *a = malloc(arow * ntok), *ga = malloc(grow * ntok);
                for (int r = 0; r < nrow; r++) {
                    random_row(type, w + (size_t)r * wrow, n);
                    if (r == 3) memset(w + (size_t)r * wrow + 4, 0xFF, wrow - 8);   /* extreme codes, scales kept */
                }
                float *x = malloc(sizeof(float) * (size_t)n);
                for (int tk = 0; tk < ntok; tk++) {
                    double xscale = ldexp(1.0, (int)(rnd() % 12) - 6);
                    for (int64_t i = 0; i < n; i++) x[i] = (float)(rnd_normal() * xscale);
                    vd_quantize_act(type, x, a + (size_t)tk * arow, n);
                    vd_gemm_act_from_dot_act(type, a + (size_t)tk * arow, ga + (size_t)tk * grow, n);
                }
                float yp[21 * 3], yr[24];
                run_panels(g, type, n, w, nrow, ga, grow, ntok, yp, nrow);
                for (int tk = 0; tk < ntok; tk++)
                    for (int r0 = 0; r0 < nrow; r0 += 8) {
                        int nr = nrow - r0 < 8 ? nrow - r0 : 8;
                        fill_nan(yr, 24);
                        rows(n, yr, w + (size_t)r0 * wrow, wrow, nr, a + (size_t)tk * arow);
                        for (int r = 0; r < 8; r++) {
                            if (r >= nr) {
                                cr_assert(isnan(yr[r]), "rows kernel stored row %d of %d", r, nr);
                                continue;
                            }
                            float want = yp[tk * nrow + r0 + r];
                            if (isnan(want)) {   /* row 3's 0xFF bytes reach later blocks' fp16 scales: NaN, whose
                                                  * sign the compiler's operand order decides (clang) */
                                cr_assert(isnan(yr[r]), "%s %s n=%" PRId64 " row %d token %d: decode %.9g, panel NaN",
                                          lv[li].name, quant_type_name(type), n, r0 + r, tk, yr[r]);
                                continue;
                            }
                            cr_assert_eq(f2u(yr[r]), f2u(want), "%s %s n=%" PRId64 " row %d token %d: decode %.9g, panel %.9g",
                                         lv[li].name, quant_type_name(type), n, r0 + r, tk, yr[r], want);
                        }
                    }
                free(w); free(a); free(ga); free(x);
            }
        }
    }
    set_level(was);
}
