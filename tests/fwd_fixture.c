/* fwd_fixture.c - what the forward-pass tests share (see fwd_fixture.h). */
#include "tests/fwd_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "engine/snapshot.h"
#include "engine/tokenizer.h"

pol_set *fwd_fixture_policy_make(fwd_ctx *f, const char *spec)
{
    char err[512];
    pol_spec s;
    cr_assert(pol_parse(&s, spec, NULL, err, sizeof err) == 0, "%s", err);
    pol_env env;
    fwd_policy_env(f, &env);
    pol_set *ps = pol_set_create(&s, &env, err, sizeof err);
    cr_assert(ps, "%s", err);
    return ps;
}

pol_set *fwd_fixture_policy(fwd_ctx *f, const char *spec)
{
    if (!spec) return NULL;
    pol_set *ps = fwd_fixture_policy_make(f, spec);
    fwd_set_policy(f, ps);
    return ps;
}

int32_t *fwd_fixture_prompt(const model *m, const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "%s", path);
    static char buf[65536];
    size_t len = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    int32_t *ids = NULL;
    char err[256];
    cr_assert(tok_encode(m->vocab, buf, len, tok_add_bos(m->vocab), 0, &ids, n, err, sizeof err) == 0, "%s", err);
    return ids;
}

fwd_ctx *fwd_fixture_start(const model *m, be_backend *b, const fwd_opts *fo, const char *spec, pol_set **ps,
                           const int32_t *ids, size_t n, float *logits)
{
    char err[512];
    fwd_ctx *f = fwd_create(m, b, fo, err, sizeof err);
    cr_assert(f, "%s", err);
    *ps = fwd_fixture_policy(f, spec);
    cr_assert(fwd_eval(f, ids, (int64_t)n, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    return f;
}

void fwd_fixture_pair_open(fwd_pair *p, const model *m, be_backend *b, const char *spec)
{
    char err[512];
    memset(p, 0, sizeof *p);
    fwd_opts fo = { 2048, 40, 16 };
    p->f1 = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(p->f1, "%s", err);
    p->f2 = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(p->f2, "%s", err);
    p->ps1 = fwd_fixture_policy(p->f1, spec);
    p->ps2 = fwd_fixture_policy(p->f2, spec);
    p->n_vocab = m->hp.n_vocab;
    p->l1 = malloc(sizeof(float) * (size_t)p->n_vocab);
    cr_assert(p->l1);
}

void fwd_fixture_pair_restore(fwd_pair *p, const int32_t *ids, size_t n, int steps)
{
    static const char sha[] = "5555555555555555555555555555555555555555555555555555555555555555";
    char err[512];
    int32_t *seq = malloc(sizeof(int32_t) * (n + (size_t)steps + 1));
    cr_assert(seq);
    memcpy(seq, ids, sizeof(int32_t) * n);
    cr_assert(fwd_eval(p->f1, ids, (int64_t)n, p->l1, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    size_t len = n;
    for (int s = 0; s < steps; s++) {
        seq[len++] = samp_argmax(p->l1, p->n_vocab);
        cr_assert(fwd_decode(p->f1, seq[len - 1], p->l1, NULL, err, sizeof err) == 0, "%s", err);
    }
    samp_params sp = samp_params_default();
    samp *s1 = samp_create(&sp, p->n_vocab), *s2 = samp_create(&sp, p->n_vocab);
    snap_identity id;
    cr_assert(s1 && s2 && snap_identity_of(p->f1, sha, &id) == 0);
    void *data = NULL;
    size_t dlen = 0;
    cr_assert(snap_save(p->f1, s1, &id, seq, (int64_t)len, &data, &dlen, err, sizeof err) == 0, "%s", err);
    int32_t *back = NULL;
    int64_t nb = 0;
    cr_assert(snap_restore(p->f2, s2, data, dlen, &id, &back, &nb, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(nb, (int64_t)len);
    free(back);
    free(data);
    free(seq);
    samp_free(s1);
    samp_free(s2);
}

void fwd_fixture_pair_free(fwd_pair *p)
{
    fwd_set_policy(p->f1, NULL);
    fwd_set_policy(p->f2, NULL);
    pol_set_free(p->ps1);
    pol_set_free(p->ps2);
    fwd_free(p->f1);
    fwd_free(p->f2);
    free(p->l1);
    memset(p, 0, sizeof *p);
}

static void rec_token(void *ud, int32_t id)
{
    fx_answer *o = ud;
    if (o->n < 256) o->tok[o->n++] = id;
}

static void rec_page(void *ud, int64_t page, const unc_stats *st)
{
    fx_answer *o = ud;
    if (o->n_page < 32) o->page[o->n_page++] = *st;
}

static void rec_event(void *ud, const unc_event *e)
{
    fx_answer *o = ud;
    if (o->n_ev < 8) o->ev[o->n_ev++] = *e;
}

gen_callbacks fwd_fixture_recorder(fx_answer *out)
{
    gen_callbacks cb = { out, rec_token, rec_page, rec_event };
    return cb;
}

void fwd_fixture_random_keys(kv_cache *kv, int n_layer, int64_t n, uint64_t *r)
{
    int64_t row = (int64_t)kv_n_head_kv(kv) * kv_head_dim(kv), pos = kv_len(kv);
    float *k = malloc(sizeof(float) * (size_t)(64 * row)), *v = calloc((size_t)(64 * row), sizeof(float));
    cr_assert(k && v);
    for (int64_t done = 0; done < n; done += 64) {
        int64_t c = n - done < 64 ? n - done : 64;
        for (int64_t i = 0; i < c * row; i++) {
            *r = *r * 6364136223846793005ull + 1442695040888963407ull;
            k[i] = (float)((*r >> 40) & 0xFFFF) / 32768.0f - 1.0f;
        }
        for (int il = 0; il < n_layer; il++) cr_assert(kv_append(kv, il, k, v, c, pos + done) == 0);
        kv_commit(kv, pos + done + c);
    }
    free(k);
    free(v);
}

void fwd_fixture_wide_keys(kv_cache *kv, int n_layer, int64_t n, uint64_t *r)
{
    int64_t row = (int64_t)kv_n_head_kv(kv) * kv_head_dim(kv), pos = kv_len(kv);
    float *k = malloc(sizeof(float) * (size_t)row), *v = calloc((size_t)row, sizeof(float));
    cr_assert(k && v);
    for (int64_t t = 0; t < n; t++) {
        for (int il = 0; il < n_layer; il++) {
            for (int64_t i = 0; i < row; i++) {
                *r = *r * 6364136223846793005ull + 1442695040888963407ull;
                float m = (float)((*r >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
                k[i] = ldexpf(m * 1.37f, (int)((*r >> 20) % 13) - 6);
            }
            cr_assert(kv_append(kv, il, k, v, 1, pos + t) == 0);
        }
        kv_commit(kv, pos + t + 1);
    }
    free(k);
    free(v);
}

void fwd_fixture_choice(pol_set *ps, int64_t pos, char *out, size_t len)
{
    int32_t tok = 0;   /* the step's token (the selection policies do not look at it) */
    pol_set_begin(ps, &tok, 1, pos, 1);
    const pol_sel *sel = pol_set_select(ps, 0, NULL);
    size_t o = 0;
    snprintf(out, len, "%s", sel ? "" : "all");
    for (int64_t i = 0; sel && i < sel->n && o + 12 < len; i++)
        o += (size_t)snprintf(out + o, len - o, "%s%d", i ? " " : "", sel->idx[i]);
}
