/* test_snapshot.c - snapshots on the tiny models: after a restore into a fresh sequence the next
 * tokens and logits are identical to the uninterrupted run's (cache, policy state and sampler RNG
 * all restored), and a corrupt, truncated, foreign or mismatched snapshot is refused with a clear
 * message before anything changes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/sampler.h"
#include "engine/snapshot.h"
#include "engine/tokenizer.h"

#define TD "../shared/testdata/"
#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

typedef struct seq {
    fwd_ctx *f;
    pol_set *ps;
    samp *s;
} seq;

static void seq_open(seq *q, const model *m, be_backend *b, const char *spec, int page)
{
    char err[512];
    fwd_opts fo = { 2048, 64, page };
    q->f = fwd_create(m, b, &fo, err, sizeof err);
    cr_assert(q->f, "%s", err);
    q->ps = NULL;
    if (spec) {
        pol_spec s;
        cr_assert(pol_parse(&s, spec, NULL, err, sizeof err) == 0, "%s", err);
        pol_env env;
        fwd_policy_env(q->f, &env);
        q->ps = pol_set_create(&s, &env, err, sizeof err);
        cr_assert(q->ps, "%s", err);
        fwd_set_policy(q->f, q->ps);
    }
    samp_params sp = samp_params_default();
    sp.temperature = 0.9f;   /* sampling, so the RNG state matters */
    sp.seed = 42;
    sp.repeat_penalty = 1.1f;
    q->s = samp_create(&sp, m->hp.n_vocab);
}

static void seq_close(seq *q)
{
    fwd_free(q->f);
    pol_set_free(q->ps);
    samp_free(q->s);
}

/* Sample and decode n tokens after *last (already sampled, not decoded); logits of every step. */
static void run_steps(seq *q, const model *m, int32_t *last, int n, int32_t *out_tok, float *out_logits)
{
    char err[512];
    int nv = m->hp.n_vocab;
    float *l = malloc(sizeof(float) * (size_t)nv);
    for (int i = 0; i < n; i++) {
        cr_assert(fwd_decode(q->f, *last, l, NULL, err, sizeof err) == 0, "%s", err);
        memcpy(out_logits + (size_t)i * nv, l, sizeof(float) * (size_t)nv);
        *last = samp_sample(q->s, l);
        samp_accept(q->s, *last);
        out_tok[i] = *last;
    }
    free(l);
}

static void check_resume(const char *file, const char *spec)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, file, NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = be_cpu_create(2, err, sizeof err);
    FILE *pf = fopen(TD "prompts/p2.txt", "rb");
    char buf[65536];
    size_t len = fread(buf, 1, sizeof buf - 1, pf);
    fclose(pf);
    int32_t *ids = NULL;
    size_t n_ids;
    cr_assert(tok_encode(m->vocab, buf, len, tok_add_bos(m->vocab), 0, &ids, &n_ids, err, sizeof err) == 0);
    int nv = m->hp.n_vocab;
    enum { N1 = 12, N2 = 10 };
    float *logits = malloc(sizeof(float) * (size_t)nv);
    float *la = malloc(sizeof(float) * (size_t)nv * N2), *lb = malloc(sizeof(float) * (size_t)nv * N2);
    int32_t ta[N2], tb[N2], tmp[N1];
    float *scratch = malloc(sizeof(float) * (size_t)nv * N1);

    /* the uninterrupted run: prefill, N1 steps, snapshot, N2 more steps */
    seq a;
    seq_open(&a, m, b, spec, 8);
    for (size_t i = 0; i < n_ids; i++) samp_accept(a.s, ids[i]);
    cr_assert(fwd_eval(a.f, ids, (int64_t)n_ids, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    int32_t last = samp_sample(a.s, logits);
    samp_accept(a.s, last);
    run_steps(&a, m, &last, N1, tmp, scratch);
    snap_identity id;
    snap_identity_of(a.f, SHA, &id);
    int64_t pos = fwd_pos(a.f);
    int32_t *seqids = malloc(sizeof(int32_t) * (size_t)(pos + 1));
    for (int64_t i = 0; i < pos + 1; i++) seqids[i] = (int32_t)i;   /* ids are opaque to the cache: any in range */
    seqids[pos] = last;
    void *snap;
    size_t snap_len;
    cr_assert(snap_save(a.f, a.s, &id, seqids, pos + 1, &snap, &snap_len, err, sizeof err) == 0, "%s", err);
    int32_t last_a = last;
    run_steps(&a, m, &last_a, N2, ta, la);

    /* a fresh sequence restored from the snapshot */
    seq q;
    seq_open(&q, m, b, spec, 8);
    int32_t *back;
    int64_t nb;
    cr_assert(snap_restore(q.f, q.s, snap, snap_len, &id, &back, &nb, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(nb, pos + 1);
    cr_assert_eq(fwd_pos(q.f), pos, "the restored cache holds the same positions");
    int32_t last_b = back[nb - 1];
    run_steps(&q, m, &last_b, N2, tb, lb);
    cr_expect(!memcmp(ta, tb, sizeof ta), "%s / %s: the tokens after the restore differ", file, spec ? spec : "none");
    cr_expect(!memcmp(la, lb, sizeof(float) * (size_t)nv * N2), "%s / %s: the logits after the restore differ", file,
              spec ? spec : "none");
    free(back);

    /* refusals, each leaving the target untouched */
    seq z;
    seq_open(&z, m, b, spec, 8);
    unsigned char *bad = malloc(snap_len);
    memcpy(bad, snap, snap_len);
    bad[snap_len / 2] ^= 0x40;
    cr_expect(snap_restore(z.f, z.s, bad, snap_len, &id, &back, &nb, err, sizeof err) != 0 && strstr(err, "corrupt"),
              "%s", err);
    cr_expect(snap_restore(z.f, z.s, snap, snap_len - 7, &id, &back, &nb, err, sizeof err) != 0 &&
                  strstr(err, "truncated"),
              "%s", err);
    memcpy(bad, snap, snap_len);
    bad[8] = 99;   /* another format version */
    cr_expect(snap_restore(z.f, z.s, bad, snap_len, &id, &back, &nb, err, sizeof err) != 0 && strstr(err, "version"),
              "%s", err);
    snap_identity other = id;
    other.model_sha256[0] = other.model_sha256[0] == 'f' ? 'e' : 'f';
    cr_expect(snap_restore(z.f, z.s, snap, snap_len, &other, &back, &nb, err, sizeof err) != 0 &&
                  strstr(err, "another model"),
              "%s", err);
    cr_expect(snap_restore(z.f, z.s, "not a snapshot at all, just some text bytes here", 48, &id, &back, &nb, err,
                           sizeof err) != 0 &&
                  strstr(err, "not a kvchat snapshot"),
              "%s", err);
    cr_expect_eq(fwd_pos(z.f), 0, "a refused snapshot changed the cache");
    seq w;
    seq_open(&w, m, b, spec, 16);   /* another page size */
    cr_expect(snap_restore(w.f, w.s, snap, snap_len, &id, &back, &nb, err, sizeof err) != 0 && strstr(err, "shape"),
              "%s", err);
    seq_close(&w);
    seq_close(&z);
    seq_close(&q);
    seq_close(&a);
    free(bad);
    free(snap);
    free(seqids);
    free(scratch);
    free(la);
    free(lb);
    free(logits);
    free(ids);
    be_free(b);
    model_free(m);
}

Test(snapshot, restore_continues_exactly_on_tiny_llama, .timeout = 120)
{
    check_resume(TD "tiny/tiny-llama-f16.gguf", NULL);
    check_resume(TD "tiny/tiny-llama-f16.gguf", "h2o:budget=0.5+chess:rebuild=page,budget=0.3");
}

Test(snapshot, restore_continues_exactly_on_tiny_gemma, .timeout = 120)
{
    /* sliding-window layers, a merged (log-degree) cache, and SentKV's segments */
    check_resume(TD "tiny/tiny-gemma3-f16.gguf", "chelsea:budget=0.4,sinks=4,recent=8,gap=8+sentkv:budget=0.5");
    check_resume(TD "tiny/tiny-gemma3-f16.gguf", "snapkv:budget=0.5+quest:budget=0.3");
}

/* sha256 of everything before the trailing digest, written there: a tampered snapshot that passes
 * the checksum, so only the section checks stand between it and the engine. */
static void fix_checksum(unsigned char *p, size_t len)
{
    char hex[65];
    snap_sha256_bytes(p, len - 32, hex);
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        p[len - 32 + i] = (unsigned char)v;
    }
}

static void put32(unsigned char *p, int32_t v) { memcpy(p, &v, sizeof v); }
static void put64(unsigned char *p, int64_t v) { memcpy(p, &v, sizeof v); }

Test(snapshot, a_checksummed_snapshot_with_out_of_range_state_is_refused, .timeout = 120)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-gemma3-f16.gguf", NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = be_cpu_create(1, err, sizeof err);
    const char *spec = "h2o:budget=0.5+chess";
    seq a;
    seq_open(&a, m, b, spec, 8);
    int32_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = 100 + (i * 37) % 3000;
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    for (int i = 0; i < 120; i++) samp_accept(a.s, ids[i]);
    cr_assert(fwd_eval(a.f, ids, 120, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    snap_identity id;
    snap_identity_of(a.f, SHA, &id);
    void *snap;
    size_t len;
    cr_assert(snap_save(a.f, a.s, &id, ids, 121, &snap, &len, err, sizeof err) == 0, "%s", err);
    size_t ss = samp_state_size(), samp_at = len - 32 - ss;
    size_t kv_at = 24 + 84 + 8 + 4 * 121;   /* header, identity, token count, token ids */
    size_t page0 = kv_at + 36 + 12 + 4;     /* cache header, layer 0's window and peak, head 0's page count */
    uint32_t n0;
    memcpy(&n0, (unsigned char *)snap + page0, sizeof n0);
    cr_assert(n0 >= 1 && n0 <= 8, "the first page holds %u tokens", n0);
    struct {
        const char *what, *needle;
        size_t off;
        int wide;
        int64_t v;
    } cases[] = {
        { "sampler ring position -1", "ring position", samp_at + 32 + 4, 0, -1 },
        { "sampler ring position -100000000", "ring position", samp_at + 32 + 4, 0, -100000000 },
        { "sampler recent count 5000", "recent-token count", samp_at + 32, 0, 5000 },
        { "a recent token past the vocabulary", "outside the vocabulary", samp_at + 40 + 4 * 7, 0, 1 << 30 },
        { "the cache's rewind floor past its end", "rewind floor", kv_at + 28, 1, 100000 },
        { "a key that is infinite", "not a finite number", page0 + 4 + 8 * n0, 2, 0x7c00 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned char *bad = malloc(len);
        memcpy(bad, snap, len);
        if (cases[c].wide == 1)
            put64(bad + cases[c].off, cases[c].v);
        else if (cases[c].wide == 2)
            memcpy(bad + cases[c].off, &(uint16_t){ (uint16_t)cases[c].v }, 2);
        else
            put32(bad + cases[c].off, (int32_t)cases[c].v);
        fix_checksum(bad, len);
        seq z;
        seq_open(&z, m, b, spec, 8);
        int32_t *back = NULL;
        int64_t nb;
        cr_expect(snap_restore(z.f, z.s, bad, len, &id, &back, &nb, err, sizeof err) != 0, "%s was restored",
                  cases[c].what);
        cr_expect(strstr(err, cases[c].needle), "%s: the refusal says '%s'", cases[c].what, err);
        cr_expect_eq(fwd_pos(z.f), 0, "%s: a refused snapshot changed the cache", cases[c].what);
        free(back);
        seq_close(&z);
        free(bad);
    }
    free(snap);
    free(logits);
    seq_close(&a);
    be_free(b);
    model_free(m);
}

/* A sampler that has seen fewer tokens than its repetition window saves and restores (the ring's
 * unwritten entries are neither saved nor checked). */
Test(snapshot, a_short_sequence_restores)
{
    char err[512];
    model *m;
    cr_assert(model_load(&m, TD "tiny/tiny-gemma3-f16.gguf", NULL, err, sizeof err) == 0, "%s", err);
    be_backend *b = be_cpu_create(1, err, sizeof err);
    seq a, q;
    seq_open(&a, m, b, NULL, 8);
    seq_open(&q, m, b, NULL, 8);
    int32_t ids[3] = { 2, 100, 200 };
    float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
    for (int i = 0; i < 3; i++) samp_accept(a.s, ids[i]);
    cr_assert(fwd_eval(a.f, ids, 3, logits, NULL, NULL, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    snap_identity id;
    snap_identity_of(a.f, SHA, &id);
    void *snap;
    size_t len;
    cr_assert(snap_save(a.f, a.s, &id, ids, 3, &snap, &len, err, sizeof err) == 0, "%s", err);
    int32_t *back = NULL;
    int64_t nb;
    cr_expect(snap_restore(q.f, q.s, snap, len, &id, &back, &nb, err, sizeof err) == 0, "%s", err);
    free(back);
    free(snap);
    free(logits);
    seq_close(&a);
    seq_close(&q);
    be_free(b);
    model_free(m);
}
