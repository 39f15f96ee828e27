/* fwd_fixture.h - what the forward-pass and policy tests share (tests/test_residency.c, test_policy.c,
 * test_uncertainty.c, test_attn_lists.c, test_faults.c, gpu/test_cuda.c). */
#ifndef KVCHAT_TESTS_FWD_FIXTURE_H
#define KVCHAT_TESTS_FWD_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/policy/policy.h"

/* The policy set of spec made for f, asserted; fwd_fixture_policy also sets it on f (NULL spec:
 * none, NULL). */
pol_set *fwd_fixture_policy_make(fwd_ctx *f, const char *spec);
pol_set *fwd_fixture_policy(fwd_ctx *f, const char *spec);
/* The tokens of a prompt file (with m's BOS when it adds one), asserted; *n their count. */
int32_t *fwd_fixture_prompt(const model *m, const char *path, size_t *n);
/* A forward context of m on b made with fo, spec's policy set on it (*ps; NULL spec: none) and the
 * prompt `ids` (n tokens) evaluated, its last logits in logits; asserted. */
fwd_ctx *fwd_fixture_start(const model *m, be_backend *b, const fwd_opts *fo, const char *spec, pol_set **ps,
                           const int32_t *ids, size_t n, float *logits);

/* Two sequences of one model on one backend under one policy spec (NULL: none), the second
 * restored from a snapshot of the first: fwd_fixture_pair_open makes them (pages of 16, chunks of
 * 40), fwd_fixture_pair_restore feeds the first ids and `steps` greedy steps (l1: its last logits)
 * and restores its snapshot into the second. Everything asserted. */
typedef struct fwd_pair {
    fwd_ctx *f1, *f2;
    pol_set *ps1, *ps2;
    float *l1;
    int n_vocab;
} fwd_pair;
void fwd_fixture_pair_open(fwd_pair *p, const model *m, be_backend *b, const char *spec);
void fwd_fixture_pair_restore(fwd_pair *p, const int32_t *ids, size_t n, int steps);
void fwd_fixture_pair_free(fwd_pair *p);

/* n tokens of random keys in [-1, 1) (values 0) appended at kv_len to layers 0 .. n_layer - 1, the
 * same keys in each, and committed; *r is the generator's state (a 64-bit LCG), asserted. */
void fwd_fixture_random_keys(kv_cache *kv, int n_layer, int64_t n, uint64_t *r);
/* As fwd_fixture_random_keys, with keys of many magnitudes (full mantissas times 2^-6 .. 2^6, as
 * f16 holds them): sums of them round, so a change in the order of additions shows. */
void fwd_fixture_wide_keys(kv_cache *kv, int n_layer, int64_t n, uint64_t *r);
/* Begin the decode step at pos on ps, then layer 0's selection as text ("0 5 6 9"; "all" without
 * one). */
void fwd_fixture_choice(pol_set *ps, int64_t pos, char *out, size_t len);

/* What an answer handed out (gen_answer): its final tokens, its events and its checked pages' statistics,
 * the first of each that fit. */
typedef struct fx_answer {
    int32_t tok[256];
    int n;
    gen_result res;
    unc_event ev[8];
    int n_ev;
    unc_stats page[32];
    int n_page;
} fx_answer;
/* Callbacks that record an answer into out. */
gen_callbacks fwd_fixture_recorder(fx_answer *out);

#endif
