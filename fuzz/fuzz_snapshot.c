/* fuzz_snapshot.c - libFuzzer harness for the snapshot parser (engine/snapshot.c, with the cache,
 * policy and sampler sections it reads), the parser of untrusted bytes from the session database.
 *
 * Each input is tried twice: as it is (the header, length and checksum checks), and with its
 * length field and trailing sha256 fixed up, so mutations reach the section parsers behind the
 * checksum. Each is restored into a live sequence (tiny Gemma model) under every policy set with
 * state (H2O + CHESS, LASER-KV + SentKV, Chelsea); whatever is accepted then samples and decodes a
 * few tokens, where a bad sampler ring, page list or policy state would bite. At start-up the harness
 * writes a valid snapshot of each set into $FUZZ_SNAPSHOT_SEED_DIR when set (the seed corpus). */
#include <nettle/sha2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/sampler.h"
#include "engine/snapshot.h"

#define MODEL "../shared/testdata/tiny/tiny-gemma3-f16.gguf"
static const char *const SPECS[] = { "h2o:budget=0.5+chess:every=1", "laser:budget=0.5+sentkv:budget=0.5",
                                     "chelsea:budget=0.5,sinks=4,recent=8,gap=8" };
#define N_SPECS (int)(sizeof SPECS / sizeof SPECS[0])

static model *m;
static be_backend *b;
static snap_identity id;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fwd_ctx *fresh(const char *spec_text, pol_set **ps, samp **s)
{
    char err[512];
    fwd_opts fo = { 4096, 64, 8 };
    fwd_ctx *f = fwd_create(m, b, &fo, err, sizeof err);
    pol_spec spec;
    pol_env env;
    if (!f || pol_parse(&spec, spec_text, NULL, err, sizeof err)) abort();
    fwd_policy_env(f, &env);
    *ps = pol_set_create(&spec, &env, err, sizeof err);
    if (!*ps) abort();
    fwd_set_policy(f, *ps);
    samp_params sp = samp_params_default();
    sp.repeat_penalty = 1.1f;   /* the penalty reads the restored ring of recent tokens */
    *s = samp_create(&sp, m->hp.n_vocab);
    return f;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char err[512];
    if (model_load(&m, MODEL, NULL, err, sizeof err) || !(b = be_cpu_create(1, err, sizeof err))) {
        fprintf(stderr, "fuzz_snapshot: %s (run from the repository root)\n", err);
        abort();
    }
    for (int k = 0; k < N_SPECS; k++) {
        pol_set *ps;
        samp *s;
        fwd_ctx *f = fresh(SPECS[k], &ps, &s);
        snap_identity_of(f, "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a", &id);
        const char *dir = getenv("FUZZ_SNAPSHOT_SEED_DIR");
        if (dir) {
            int32_t toks[100];
            for (int i = 0; i < 100; i++) toks[i] = 100 + (i * 37) % 3000;
            float *l = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
            if (fwd_eval(f, toks, 90, l, NULL, NULL, NULL, NULL, NULL, err, sizeof err)) abort();
            for (int i = 90; i < 99; i++) {
                samp_accept(s, toks[i]);
                if (fwd_decode(f, toks[i], l, NULL, err, sizeof err)) abort();
            }
            void *d;
            size_t n;
            if (snap_save(f, s, &id, toks, 100, &d, &n, err, sizeof err)) abort();
            char path[1024];
            snprintf(path, sizeof path, "%s/valid-%d.snap", dir, k);
            FILE *o = fopen(path, "wb");
            if (o) {
                fwrite(d, 1, n, o);
                fclose(o);
            }
            free(d);
            free(l);
        }
        fwd_free(f);
        pol_set_free(ps);
        samp_free(s);
    }
    return 0;
}

static void try_one(const char *spec, const uint8_t *data, size_t size)
{
    pol_set *ps;
    samp *s;
    fwd_ctx *f = fresh(spec, &ps, &s);
    char err[1024];
    int32_t *ids = NULL;
    int64_t n;
    if (snap_restore(f, s, data, size, &id, &ids, &n, err, sizeof err) == 0) {
        float *l = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
        /* the restored sequence must work: a few sampled steps from its last id */
        int32_t tok = n > 0 ? ids[n - 1] : 1;
        for (int step = 0; step < 4 && fwd_pos(f) < 4096; step++) {
            if (fwd_decode(f, tok, l, NULL, err, sizeof err) != 0) {
                if (!memchr(err, 0, sizeof err)) __builtin_trap();
                break;
            }
            tok = samp_sample(s, l);
            if (tok < 0 || tok >= m->hp.n_vocab) __builtin_trap();
            samp_accept(s, tok);
        }
        free(l);
        free(ids);
    } else if (!memchr(err, 0, sizeof err) || fwd_pos(f) != 0) {
        __builtin_trap();   /* a refusal is a C string and leaves the sequence untouched */
    }
    fwd_free(f);
    pol_set_free(ps);
    samp_free(s);
}

static void try_all(const uint8_t *data, size_t size)
{
    for (int k = 0; k < N_SPECS; k++) try_one(SPECS[k], data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    try_all(data, size);
    if (size < 24 + SHA256_DIGEST_SIZE) return 0;
    uint8_t *fx = malloc(size);
    memcpy(fx, data, size);
    int64_t plen = (int64_t)(size - 24 - SHA256_DIGEST_SIZE);
    memcpy(fx + 16, &plen, sizeof plen);
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, size - SHA256_DIGEST_SIZE, fx);
    sha256_digest(&c, SHA256_DIGEST_SIZE, fx + size - SHA256_DIGEST_SIZE);
    try_all(fx, size);
    free(fx);
    return 0;
}
