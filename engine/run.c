/* run.c - the runtime of one sequence (see run.h): loading, the sequence's ids beside its cache,
 * feeding, answering, policies, snapshots and the figures. */
#include "engine/run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "engine/snapshot.h"
#include "engine/tokenizer.h"

struct run {
    run_config cfg;
    model *m;
    be_backend *b;
    int owns;                    /* the model and backend are this run's (0: a sibling's borrowed) */
    int64_t question;            /* the next feed ends with a question of this many tokens (0: none) */
    fwd_ctx *f;
    pol_set *ps;                 /* NULL: full attention, nothing recorded */
    samp *s;
    unc_monitor *mon;
    float *logits;
    float *head_sim;             /* [n_layer * n_head_kv] calibrated key similarity, or NULL */
    int32_t *ids;                /* the sequence; [0, fwd_pos) are in the cache */
    int64_t n_ids, cap_ids;
    fwd_progress_fn progress;
    void *progress_ud;
    volatile sig_atomic_t *abort_flag;
    volatile sig_atomic_t never;   /* what abort_flag points at until a caller gives one */
    char load_note[256], warn[300];
    /* the last prefill and the decoding since it */
    int64_t prefill_tokens, decoded;
    int64_t replayed;            /* positions rewinds evaluated again (sliding-window layers) */
    double prefill_s, decode_s;
    double decode_first_s;   /* the first decode step's time since decode_s began (0: not timed step by step) */
    double warm_up_s;            /* loading's warm-up (0: none ran) */
};

double run_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cancelled(const run *r) { return *r->abort_flag != 0; }

/* A failed evaluation: cancelled when the abort flag was raised (the message says so), else a failure
 * whose message the forward pass left. */
static int eval_failed(const run *r, char *err, size_t errlen)
{
    if (!cancelled(r)) return RUN_EFAIL;
    snprintf(err, errlen, "cancelled");
    return RUN_ECANCELLED;
}

static int oom(char *err, size_t errlen)
{
    snprintf(err, errlen, "out of memory");
    return RUN_EFAIL;
}

static int ids_reserve(run *r, int64_t n)
{
    if (n <= r->cap_ids) return 0;
    int64_t nc = n * 2;
    int32_t *ni = realloc(r->ids, sizeof(int32_t) * (size_t)nc);
    if (!ni) return -1;
    r->ids = ni;
    r->cap_ids = nc;
    return 0;
}

/* ---- creating */

static void policy_env(run *r, pol_env *env)
{
    fwd_policy_env(r->f, env);
    env->head_sim = r->head_sim;
}

static fwd_ctx *new_fwd(run *r, int page_size, char *err, size_t errlen)
{
    fwd_opts fo = { r->cfg.n_ctx, r->cfg.n_batch, page_size };
    if (fo.n_ctx <= 0) fo.n_ctx = r->m->hp.n_ctx_train;   /* pages are allocated as tokens arrive */
    return fwd_create(r->m, r->b, &fo, err, errlen);
}

/* The calibrated key similarity of each layer's KV heads (NaN where not measured), for the policies
 * that spare the least similar heads. */
static int load_head_similarity(run *r)
{
    const unc_thresholds *t = &r->cfg.thr;
    if (!t->valid || t->n_heads == 0) return 0;
    int nl = r->m->hp.n_layer, nh = r->m->hp.n_head_kv;
    if (!(r->head_sim = malloc(sizeof(float) * (size_t)nl * (size_t)nh))) return -1;
    for (int i = 0; i < nl * nh; i++) r->head_sim[i] = (float)NAN;
    for (int i = 0; i < t->n_heads; i++) {
        const unc_head_sim *e = &t->head_sim[i];
        if (e->layer < nl && e->head < nh) r->head_sim[e->layer * nh + e->head] = e->sim;
    }
    return 0;
}

static int prepare_weights(run *r, char *err, size_t errlen)
{
    int n = model_matmul_weights(r->m, NULL, 0);
    const be_weight **w = malloc(sizeof *w * (size_t)(n > 0 ? n : 1));
    if (!w) return oom(err, errlen);
    model_matmul_weights(r->m, w, n);
    int rc = be_prepare_weights(r->b, w, n, r->load_note, sizeof r->load_note, err, errlen);
    free(w);
    if (rc) return RUN_EFAIL;
    /* the norms' weights: a device keeps them without comparing them at every call (copied now:
     * a device that could not is a failure at load, as the weights') */
    int nc = model_constants(r->m, NULL, 0);
    be_range *c = malloc(sizeof *c * (size_t)nc);
    if (!c) return oom(err, errlen);
    model_constants(r->m, c, nc);
    be_constants(r->b, c, nc);
    free(c);
    return be_failed(r->b, err, errlen) ? RUN_EFAIL : RUN_OK;
}

/* A device's first prompt would pay one-off costs: kernels load on first use (cuBLAS's first
 * product took 50-70 ms on an H200, docs/gpu.md), buffers are allocated. A throwaway sequence
 * pays them at load instead: a chunk of the run's size, a question, and a decode step through the
 * pick as the sampler uses it (candidates, a penalty, the entropy) where the backend picks,
 * without policies, in a cache of its own that is freed before the run's is made. */
enum { WARM_QUESTION = 48, WARM_PICK_K = 40 };

static int warm_up(run *r, char *err, size_t errlen)
{
    if (r->cfg.warm_up < 0 || (r->cfg.warm_up == 0 && !run_on_device(r))) return RUN_OK;
    double t0 = run_clock_s();
    /* the run's own chunk: fwd_create clamps it to the context, so a chunk past that is never run */
    int64_t ctx = r->cfg.n_ctx > 0 ? r->cfg.n_ctx : r->m->hp.n_ctx_train;
    int chunk = r->cfg.n_batch > 0 ? r->cfg.n_batch : 512;
    if (ctx > 0 && chunk > ctx) chunk = (int)ctx;
    int64_t n = chunk + WARM_QUESTION + 1;
    int32_t nv = r->m->hp.n_vocab;
    fwd_opts fo = { n, chunk, r->cfg.page_size };
    fwd_ctx *f = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)nv);
    if (!ids || !logits) {
        free(ids);
        free(logits);
        return oom(err, errlen);
    }
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((uint64_t)(i + 1) * 2654435761u % (uint64_t)nv);
    if (tok_bos(r->m->vocab) >= 0) ids[0] = tok_bos(r->m->vocab);
    int rc = RUN_OK;
    be_warming_up(r->b, 1);
    if (!(f = fwd_create(r->m, r->b, &fo, err, errlen)) ||
        fwd_eval(f, ids, chunk, logits, NULL, NULL, NULL, NULL, &r->never, err, errlen) ||
        fwd_eval(f, ids + chunk, WARM_QUESTION, logits, NULL, NULL, NULL, NULL, &r->never, err, errlen)) {
        rc = RUN_EFAIL;
    } else if (fwd_can_pick(f)) {
        float val[WARM_PICK_K];
        int32_t best[WARM_PICK_K];
        be_pick p = { .pen_ids = ids, .n_pen = 1, .penalty = 1.1f, .k = WARM_PICK_K, .entropy = 1, .temp = 1.0f,
                      .val = val, .id = best };
        rc = fwd_decode_pick(f, ids[n - 1], &p, &r->never, err, errlen) ? RUN_EFAIL : RUN_OK;
    } else {
        rc = fwd_decode(f, ids[n - 1], logits, &r->never, err, errlen) ? RUN_EFAIL : RUN_OK;
    }
    fwd_free(f);   /* before the end of the warm-up: its unbinding is loading's too */
    be_warming_up(r->b, 0);
    free(ids);
    free(logits);
    if (rc) {
        char why[1200];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "warming the %s backend up: %s", r->b->ops->name, why);
        return rc;
    }
    r->warm_up_s = run_clock_s() - t0;
    return RUN_OK;
}

static const char *base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* The monitor, the logits and the sampler of a sequence whose forward context exists. */
static int open_answering(run *r, char *err, size_t errlen)
{
    /* calibrated thresholds hold for windows of the size they were measured on */
    const unc_thresholds *t = &r->cfg.thr;
    r->mon = unc_create(t->valid && t->page > 0 ? t->page : kv_page_size(fwd_kv(r->f)), 0);
    r->logits = malloc(sizeof(float) * (size_t)r->m->hp.n_vocab);
    r->s = samp_create(&r->cfg.sp, r->m->hp.n_vocab);
    if (!r->mon || !r->logits || !r->s) return oom(err, errlen);
    return RUN_OK;
}

/* What a run and its siblings make for themselves: the cache, the policies, the sampler, the
 * monitor and the logits. */
static int open_sequence(run *r, char *err, size_t errlen)
{
    r->abort_flag = &r->never;
    if (!(r->f = new_fwd(r, r->cfg.page_size, err, errlen))) return RUN_EFAIL;
    pol_spec spec = r->cfg.policy;
    if (spec.n == 0 &&
        pol_parse(&spec, NULL, r->cfg.budget && *r->cfg.budget ? r->cfg.budget : NULL, err, errlen))
        return RUN_EFAIL;
    if (run_set_policy(r, &spec, err, errlen)) return RUN_EFAIL;
    return open_answering(r, err, errlen);
}

/* What open_sequence made, freed (each pointer NULL after), so a run can open it again. */
static void close_sequence(run *r)
{
    fwd_free(r->f);
    pol_set_free(r->ps);
    unc_free(r->mon);
    samp_free(r->s);
    free(r->logits);
    r->f = NULL;
    r->ps = NULL;
    r->mon = NULL;
    r->s = NULL;
    r->logits = NULL;
}

/* The backend on device, its weights prepared, warmed up, and the sequence opened on it. */
static int start_on(run *r, int device, char *err, size_t errlen)
{
    r->b = be_create(device, r->cfg.n_threads, err, errlen);
    if (!r->b) return RUN_EFAIL;
    if (prepare_weights(r, err, errlen) || warm_up(r, err, errlen) || open_sequence(r, err, errlen))
        return RUN_EFAIL;
    return RUN_OK;
}

/* The backend and the sequence. --device auto is the GPU when one that can run is present; a GPU
 * that is there but cannot be used (be_cuda_gpu), or that fails before the run is ready (it cannot
 * start, hold the weights, warm up or hold the first cache: out of device memory), leaves the run on
 * the CPU with the reason in the load note. --device cuda makes each of those an error. */
static int start_engine(run *r, char *err, size_t errlen)
{
    if (r->cfg.device != BE_DEVICE_AUTO) return start_on(r, r->cfg.device, err, errlen);
    be_gpu g;
    char why[400];
    int gpu = be_cuda_gpu(&g, why, sizeof why);
    if (gpu == 0) {
        if (start_on(r, BE_DEVICE_CUDA, err, errlen) == RUN_OK) return RUN_OK;
        snprintf(why, sizeof why, "%s", err);
        close_sequence(r);
        be_discard(r->b);   /* what it holds on the device goes back; its profile is not the run's */
        r->b = NULL;
        r->warm_up_s = 0;
    }
    if (start_on(r, BE_DEVICE_CPU, err, errlen) != RUN_OK) return RUN_EFAIL;
    if (gpu != -1) snprintf(r->load_note, sizeof r->load_note, "the GPU was not used (%.200s): running on the CPU", why);
    return RUN_OK;
}

run *run_create(const run_config *c, char *err, size_t errlen)
{
    run *r = calloc(1, sizeof *r);
    if (!r) {
        oom(err, errlen);
        return NULL;
    }
    r->cfg = *c;
    r->owns = 1;
    model_load_opts lo = { c->tokenizer_path };
    if (model_load(&r->m, c->model_path, &lo, err, errlen) != 0) goto fail;
    if (load_head_similarity(r)) {
        oom(err, errlen);
        goto fail;
    }
    if (start_engine(r, err, errlen)) goto fail;
    if (c->n_ctx > r->m->hp.n_ctx_train)
        snprintf(r->warn, sizeof r->warn, "--ctx %lld is above the %lld tokens %s was trained on: past that length "
                 "its answers degrade", (long long)c->n_ctx, (long long)r->m->hp.n_ctx_train, base_name(r->m->path));
    return r;
fail:
    run_free(r);
    return NULL;
}

run *run_sibling(run *o, char *err, size_t errlen)
{
    run *r = calloc(1, sizeof *r);
    if (!r) {
        oom(err, errlen);
        return NULL;
    }
    r->cfg = o->cfg;
    r->m = o->m;
    r->b = o->b;
    int bad = o->head_sim && load_head_similarity(r) ? oom(err, errlen) : open_sequence(r, err, errlen);
    if (bad) {
        run_free(r);
        return NULL;
    }
    return r;
}

/* A fork's prefill chunk: it decodes, and reads at most a follow-up question (kvchat eval --together);
 * its logits rows (as many) stay few. */
#define RUN_FORK_CHUNK 8

run *run_fork(run *o, const pol_spec *spec, char *err, size_t errlen)
{
    run *r = calloc(1, sizeof *r);
    void *st = malloc(samp_state_size());
    if (!r || !st) {
        free(r);
        free(st);
        oom(err, errlen);
        return NULL;
    }
    r->cfg = o->cfg;
    r->m = o->m;
    r->b = o->b;
    r->question = o->question;
    r->abort_flag = o->abort_flag == &o->never ? &r->never : o->abort_flag;
    int bad = (o->head_sim && load_head_similarity(r)) || ids_reserve(r, o->n_ids > 0 ? o->n_ids : 1) ? oom(err, errlen)
              : !(r->f = fwd_fork(o->f, RUN_FORK_CHUNK, err, errlen))                                            ? RUN_EFAIL
                                                                                                     : open_answering(r, err, errlen);
    if (!bad) {
        memcpy(r->ids, o->ids, sizeof(int32_t) * (size_t)o->n_ids);
        r->n_ids = o->n_ids;
        memcpy(r->logits, o->logits, sizeof(float) * (size_t)r->m->hp.n_vocab);
        samp_save_state(o->s, st);
        samp_load_state(r->s, st);
        bad = run_adopt_policy(r, spec, err, errlen);   /* as if attached for the sequence's prefill */
    }
    free(st);
    if (bad) {
        run_free(r);
        return NULL;
    }
    return r;
}

void run_free(run *r)
{
    if (!r) return;
    close_sequence(r);
    if (r->owns) {
        be_free(r->b);
        model_free(r->m);
    }
    free(r->head_sim);
    free(r->ids);
    free(r);
}

const char *run_load_note(const run *r) { return r->load_note; }
const char *run_warning(const run *r) { return r->warn; }

void run_set_progress(run *r, fwd_progress_fn fn, void *ud)
{
    r->progress = fn;
    r->progress_ud = ud;
}

void run_set_abort(run *r, volatile sig_atomic_t *abort_flag) { r->abort_flag = abort_flag ? abort_flag : &r->never; }

/* ---- the sequence */

int run_append(run *r, const int32_t *ids, int64_t n, char *err, size_t errlen)
{
    if (n <= 0) return RUN_OK;
    if (ids_reserve(r, r->n_ids + n)) return oom(err, errlen);
    memcpy(r->ids + r->n_ids, ids, sizeof(int32_t) * (size_t)n);
    r->n_ids += n;
    return RUN_OK;
}

/* Evaluate n of the sequence's ids from the cache's end on as a prefill (timed: they are the
 * figures' last prefill, and the decoding counts again from here). */
static int prefill_ids(run *r, int64_t n, int timed, fwd_logits_fn each, void *ud, char *err, size_t errlen)
{
    double t0 = run_clock_s();
    if (fwd_eval(r->f, r->ids + fwd_pos(r->f), n, r->logits, each, ud, r->progress, r->progress_ud, r->abort_flag, err,
                 errlen))
        return eval_failed(r, err, errlen);
    if (timed) {
        r->prefill_tokens = n;
        r->prefill_s = run_clock_s() - t0;
        r->decoded = 0;
        r->decode_s = 0;
        r->decode_first_s = 0;
    }
    return RUN_OK;
}

/* Evaluate the waiting ids, which must fit the context (accept: the sampler records them). */
static int eval_waiting(run *r, int accept, int timed, fwd_logits_fn each, void *ud, char *err, size_t errlen)
{
    int64_t from = fwd_pos(r->f), n = r->n_ids - from;
    if (n <= 0) {
        snprintf(err, errlen, "nothing to evaluate");
        return RUN_EFAIL;
    }
    if (from + n + 1 > fwd_n_ctx(r->f)) {
        snprintf(err, errlen, "%lld more tokens do not fit: %lld of the context's %lld are used", (long long)n,
                 (long long)from, (long long)fwd_n_ctx(r->f));
        return RUN_ENOFIT;
    }
    for (int64_t i = 0; accept && i < n; i++) samp_accept(r->s, r->ids[from + i]);
    return prefill_ids(r, n, timed, each, ud, err, errlen);
}

int run_feed(run *r, const int32_t *ids, int64_t n, fwd_logits_fn each, void *ud, char *err, size_t errlen)
{
    int64_t n0 = r->n_ids;
    if (run_append(r, ids, n, err, errlen)) return RUN_EFAIL;
    int rc = eval_waiting(r, 1, 1, each, ud, err, errlen);
    if (rc) r->n_ids = n0;
    return rc;
}

int run_redo_last(run *r, char *err, size_t errlen)
{
    if (r->n_ids < 1 || fwd_pos(r->f) < r->n_ids - 1) {
        snprintf(err, errlen, "no evaluated token to evaluate again");
        return RUN_EFAIL;
    }
    int rc = run_rewind(r, r->n_ids - 1, r->n_ids, err, errlen);
    return rc ? rc : eval_waiting(r, 1, 0, NULL, NULL, err, errlen);
}

int run_prefill_again(run *r, char *err, size_t errlen)
{
    int64_t P = fwd_pos(r->f);
    if (P == 0) return RUN_OK;
    fwd_rewind(r->f, 0);
    return prefill_ids(r, P, 1, NULL, NULL, err, errlen);
}

/* id appended to the sequence for a decode step, which every id before it must have had. RUN_OK, or
 * RUN_EFAIL with a message. */
static int append_step(run *r, int32_t id, char *err, size_t errlen)
{
    if (r->n_ids != fwd_pos(r->f)) {
        snprintf(err, errlen, "%lld tokens wait to be evaluated before a decode step",
                 (long long)(r->n_ids - fwd_pos(r->f)));
        return RUN_EFAIL;
    }
    return run_append(r, &id, 1, err, errlen) ? RUN_EFAIL : RUN_OK;
}

/* A greedy step's pick: the best candidate alone, into *val and *best. */
static be_pick greedy_pick(float *val, int32_t *best)
{
    return (be_pick){ .k = 1, .penalty = 1.0f, .val = val, .id = best };
}

/* The greedy step's next id: the pick's best (picked), else the logits' argmax; every logit -inf
 * gives samp_argmax's 0 either way. */
static int32_t greedy_next(const run *r, int picked, const be_pick *p, int32_t best)
{
    if (!picked) return samp_argmax(r->logits, r->m->hp.n_vocab);
    return p->n_out > 0 ? best : 0;
}

/* A decode step of id: its logits to run_logits, or with pick (and a backend that picks) its best
 * candidates there, the logits left with the backend. */
static int decode_one(run *r, int32_t id, be_pick *pick, char *err, size_t errlen)
{
    if (append_step(r, id, err, errlen)) return RUN_EFAIL;
    double t0 = run_clock_s();
    if (pick ? fwd_decode_pick(r->f, id, pick, r->abort_flag, err, errlen)
             : fwd_decode(r->f, id, r->logits, r->abort_flag, err, errlen)) {
        r->n_ids--;
        return eval_failed(r, err, errlen);
    }
    double secs = run_clock_s() - t0;
    if (r->decoded++ == 0) r->decode_first_s = secs;
    r->decode_s += secs;
    return RUN_OK;
}

int run_decode(run *r, int32_t id, char *err, size_t errlen) { return decode_one(r, id, NULL, err, errlen); }

int run_decode_greedy(run *r, int32_t id, int32_t *next, char *err, size_t errlen)
{
    float val;
    int32_t best;
    be_pick p = greedy_pick(&val, &best);
    int picked = fwd_can_pick(r->f);
    int rc = decode_one(r, id, picked ? &p : NULL, err, errlen);
    if (rc == RUN_OK) *next = greedy_next(r, picked, &p, best);
    return rc;
}

int run_decode_greedy_batch(run *lead, run *const *rs, int n, int32_t *ids, char *err, size_t errlen)
{
    if (n < 1 || n > FWD_BATCH_MAX) {
        snprintf(err, errlen, "a batch of %d sequences: 1 to %d", n, FWD_BATCH_MAX);
        return RUN_EFAIL;
    }
    fwd_ctx *fs[FWD_BATCH_MAX];
    float *logits[FWD_BATCH_MAX], val[FWD_BATCH_MAX];
    int32_t best[FWD_BATCH_MAX];
    be_pick picks[FWD_BATCH_MAX];
    int pick = fwd_can_pick(lead->f), s = 0;
    for (; s < n && !append_step(rs[s], ids[s], err, errlen); s++) {
        fs[s] = rs[s]->f;
        logits[s] = rs[s]->logits;
        picks[s] = greedy_pick(&val[s], &best[s]);
    }
    double t0 = run_clock_s();
    int rc = s < n ? RUN_EFAIL
                   : fwd_decode_batch(lead->f, fs, n, ids, logits, pick ? picks : NULL, lead->abort_flag, err, errlen)
                         ? eval_failed(lead, err, errlen)
                         : RUN_OK;
    double secs = run_clock_s() - t0;
    for (int j = 0; j < s; j++) {
        run *r = rs[j];
        if (rc) {
            r->n_ids--;
            continue;
        }
        if (r->decoded++ == 0) r->decode_first_s = secs;
        r->decode_s += secs;   /* the batch's time: its steps ran together */
        ids[j] = greedy_next(r, pick, &picks[j], best[j]);
    }
    return rc;
}

int run_rewind(run *r, int64_t pos, int64_t n_ids, char *err, size_t errlen)
{
    int64_t len = fwd_pos(r->f);
    if (pos > len) pos = len;
    if (pos < 0 || n_ids < pos || n_ids > r->n_ids) {
        snprintf(err, errlen, "cannot rewind to %lld", (long long)pos);
        return RUN_EFAIL;
    }
    int64_t got = fwd_rewind(r->f, pos);
    r->n_ids = n_ids;
    if (got < pos) r->replayed += pos - got;
    /* what sliding-window layers no longer held is evaluated again (not recorded by the sampler) */
    if (got < pos && fwd_eval(r->f, r->ids + got, pos - got, r->logits, NULL, NULL, NULL, NULL, r->abort_flag, err,
                              errlen))
        return eval_failed(r, err, errlen);
    return RUN_OK;
}

void run_set_floor(run *r, int64_t pos) { fwd_set_floor(r->f, pos); }
void run_reset_peak(run *r) { kv_reset_peak(fwd_cache(r->f)); }

/* ---- answering */

typedef struct answer_ctx {
    run *r;
    const gen_callbacks *cb;
    int keep, oom;
    int64_t start, n0;           /* the cache's length and the sequence's when the answer began */
} answer_ctx;

static void on_token(void *ud, int32_t id)
{
    answer_ctx *a = ud;
    if (a->keep && !a->oom) {
        char e[32];
        a->oom = run_append(a->r, &id, 1, e, sizeof e) != 0;
    }
    if (a->cb && a->cb->token) a->cb->token(a->cb->ud, id);
}

static void on_page(void *ud, int64_t page, const unc_stats *s)
{
    answer_ctx *a = ud;
    if (a->cb && a->cb->page) a->cb->page(a->cb->ud, page, s);
}

static void on_event(void *ud, const unc_event *e)
{
    answer_ctx *a = ud;
    if (a->cb && a->cb->event) a->cb->event(a->cb->ud, e);
}

/* An answer's loop set up for r (gen_answer's arguments, the callbacks wrapped in a). RUN_OK, or
 * RUN_EFAIL when nothing waits to be answered. */
static int answer_setup(run *r, const run_answer_opts *o, const gen_callbacks *cb, answer_ctx *a, gen_opts *go,
                        gen_callbacks *wrap, gen_ctx *g, char *err, size_t errlen)
{
    static const unc_thresholds none;
    int64_t n0 = r->n_ids;
    if (n0 < 1 || fwd_pos(r->f) != n0) {
        snprintf(err, errlen, n0 < 1 ? "nothing was fed to continue from" : "tokens wait to be evaluated");
        return RUN_EFAIL;
    }
    *go = (gen_opts){ o->n_predict, r->ids[n0 - 1], o->watch ? &r->cfg.thr : &none,
                      o->max_regen >= 0 ? o->max_regen : run_default_backtrack(r), samp_temperature(r->s), o->monitor,
                      o->stop, o->n_stop };
    *a = (answer_ctx){ r, cb, o->keep, 0, fwd_pos(r->f), n0 };
    *wrap = (gen_callbacks){ a, on_token, on_page, on_event };
    *g = (gen_ctx){ r->f, r->s, r->m->vocab, r->mon, r->logits, r->m->hp.n_vocab, r->abort_flag };
    return RUN_OK;
}

/* After the loop (it failed: bad): the cache back where the answer began, or at its kept tokens. */
static int answer_close(run *r, const answer_ctx *a, int bad, char *err, size_t errlen)
{
    if (bad) return RUN_EFAIL;
    if (a->oom) return oom(err, errlen);
    if (!a->keep) return run_rewind(r, a->start, a->n0, err, errlen);   /* a side answer leaves no trace */
    /* a stop sequence: the cache went past the kept tokens; back to them (the last one sampled, not
     * evaluated, as after any answer) */
    int64_t target = r->n_ids > a->n0 ? r->n_ids - 1 : r->n_ids;
    return fwd_pos(r->f) > target ? run_rewind(r, target, r->n_ids, err, errlen) : RUN_OK;
}

int run_answer(run *r, const run_answer_opts *o, const gen_callbacks *cb, gen_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    answer_ctx a;
    gen_opts go;
    gen_callbacks wrap;
    gen_ctx g;
    if (answer_setup(r, o, cb, &a, &go, &wrap, &g, err, errlen)) return RUN_EFAIL;
    double t0 = run_clock_s();
    int bad = gen_answer(&g, &go, &wrap, res, err, errlen);
    r->decoded = res->n_decoded;
    r->decode_s = run_clock_s() - t0;
    r->decode_first_s = 0;
    return answer_close(r, &a, bad, err, errlen);
}

int run_answer_batch(run *lead, run *const *rs, int n, const run_answer_opts *os, const gen_callbacks *cbs,
                     gen_result *res, char *err, size_t errlen)
{
    if (n < 1 || n > FWD_BATCH_MAX) {
        snprintf(err, errlen, "a batch of %d answers: 1 to %d", n, FWD_BATCH_MAX);
        return RUN_EFAIL;
    }
    answer_ctx a[FWD_BATCH_MAX];
    gen_opts go[FWD_BATCH_MAX];
    gen_callbacks wrap[FWD_BATCH_MAX];
    gen_ctx g[FWD_BATCH_MAX];
    for (int s = 0; s < n; s++) {
        memset(&res[s], 0, sizeof res[s]);
        if (rs[s] == lead || rs[s]->b != lead->b) {
            snprintf(err, errlen, "a batch's answers run beside its lead, over its backend");
            return RUN_EFAIL;
        }
        if (answer_setup(rs[s], &os[s], cbs ? &cbs[s] : NULL, &a[s], &go[s], &wrap[s], &g[s], err, errlen))
            return RUN_EFAIL;
    }
    double t0 = run_clock_s();
    int bad = gen_answer_batch(lead->f, g, n, go, wrap, res, lead->abort_flag, err, errlen);
    double secs = run_clock_s() - t0;
    int rc = bad ? RUN_EFAIL : RUN_OK;
    for (int s = 0; s < n; s++) {
        rs[s]->decoded = res[s].n_decoded;
        rs[s]->decode_s = secs;   /* the batch's time: its answers were decoded together */
        rs[s]->decode_first_s = 0;
        int cr = answer_close(rs[s], &a[s], bad, err, errlen);
        if (!rc) rc = cr;
    }
    return rc;
}

int run_default_backtrack(const run *r) { return r->ps && pol_set_can_reselect(r->ps) ? 2 : 0; }

void run_set_logits(run *r, const float *logits)
{
    memcpy(r->logits, logits, sizeof(float) * (size_t)r->m->hp.n_vocab);
}

size_t run_sampler_state_size(const run *r)
{
    (void)r;
    return samp_state_size();
}

void run_save_sampler(const run *r, void *state) { samp_save_state(r->s, state); }
void run_load_sampler(run *r, const void *state) { samp_load_state(r->s, state); }

void run_reset_sampler(run *r)
{
    samp_reset(r->s);
    for (int64_t i = 0; i < r->n_ids; i++) samp_accept(r->s, r->ids[i]);
}

void run_set_sampling(run *r, const samp_params *sp)
{
    samp_set_params(r->s, sp);
    r->cfg.sp = *sp;
}

/* ---- policies */

pol_set *run_new_policies(run *r, const pol_spec *spec, char *err, size_t errlen)
{
    pol_env env;
    policy_env(r, &env);
    return pol_set_create(spec, &env, err, errlen);
}

pol_set *run_swap_policies(run *r, pol_set *ps)
{
    pol_set *old = r->ps;
    fwd_set_policy(r->f, ps);
    r->ps = ps;
    if (ps) pol_set_question(ps, r->question);
    r->decoded = 0;   /* the decoding figures follow the policies attached */
    r->decode_s = 0;
    r->decode_first_s = 0;
    return old;
}

int run_set_policy(run *r, const pol_spec *spec, char *err, size_t errlen)
{
    pol_set *ps = NULL;
    if (spec && !(ps = run_new_policies(r, spec, err, errlen))) return RUN_EFAIL;
    pol_set_free(run_swap_policies(r, ps));
    return RUN_OK;
}

int run_adopt_policy(run *r, const pol_spec *spec, char *err, size_t errlen)
{
    pol_set *ps = run_new_policies(r, spec, err, errlen);
    if (!ps) return RUN_EFAIL;
    if (fwd_adopt_policy(r->f, ps, r->ids, fwd_pos(r->f), err, errlen)) {
        fwd_set_policy(r->f, r->ps);
        pol_set_free(ps);
        return RUN_EFAIL;
    }
    pol_set_free(run_swap_policies(r, ps));
    return RUN_OK;
}

int run_check_budget(run *r, int64_t len, char *err, size_t errlen)
{
    return r->ps && pol_set_check(r->ps, len, err, errlen) ? RUN_EFAIL : RUN_OK;
}

int run_check_policy(run *r, const pol_spec *spec, int64_t len, char *err, size_t errlen)
{
    pol_set *probe = run_new_policies(r, spec, err, errlen);
    int bad = !probe || pol_set_check(probe, len, err, errlen);
    pol_set_free(probe);
    return bad ? RUN_EFAIL : RUN_OK;
}

void run_set_question(run *r, int64_t n_tokens)
{
    r->question = n_tokens > 0 ? n_tokens : 0;
    if (r->ps) pol_set_question(r->ps, r->question);
}

int run_trace(run *r, int64_t lo, int64_t hi, char *err, size_t errlen)
{
    if (r->ps && pol_set_trace(r->ps, lo, hi)) return oom(err, errlen);
    return RUN_OK;
}

/* ---- snapshots */

int run_snapshot(const run *r, const char *model_sha, void **data, size_t *len, char *err, size_t errlen)
{
    snap_identity id;
    snap_identity_of(r->f, model_sha, &id);
    return snap_save(r->f, r->s, &id, r->ids, r->n_ids, data, len, err, errlen) ? RUN_EFAIL : RUN_OK;
}

int run_check_snapshot(const run *r, const void *data, size_t len, const char *model_sha, char *err, size_t errlen)
{
    snap_identity id;
    snap_identity_of(r->f, model_sha, &id);
    return snap_check(r->f, data, len, &id, NULL, err, errlen) ? RUN_EFAIL : RUN_OK;
}

/* The forward context again with another KV page size (a snapshot's), under the same policies; the
 * sequence is empty. */
static int reopen_fwd(run *r, int page_size, char *err, size_t errlen)
{
    fwd_ctx *f = new_fwd(r, page_size, err, errlen);
    if (!f) return RUN_EFAIL;
    pol_spec spec;
    if (r->ps) spec = *pol_set_spec(r->ps);
    fwd_free(r->f);
    r->f = f;
    r->n_ids = 0;
    return run_set_policy(r, r->ps ? &spec : NULL, err, errlen);
}

int run_restore(run *r, const void *data, size_t len, const char *model_sha, char *err, size_t errlen)
{
    int ps = snap_page_size(data, len);
    if (ps > 0 && ps != kv_page_size(fwd_kv(r->f)) && !r->cfg.page_size && reopen_fwd(r, ps, err, errlen)) {
        char e[1000];
        snprintf(e, sizeof e, "%.990s", err);
        snprintf(err, errlen, "cannot open a cache with the snapshot's page size: %s", e);
        return RUN_EFAIL;
    }
    snap_identity id;
    snap_identity_of(r->f, model_sha, &id);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (snap_restore(r->f, r->s, data, len, &id, &ids, &n, err, errlen)) return RUN_EFAIL;
    free(r->ids);
    r->ids = ids;
    r->n_ids = r->cap_ids = n;
    return RUN_OK;
}

void run_place(run *r) { fwd_place_pages(r->f); }

/* ---- reading */

const model *run_model(const run *r) { return r->m; }
const pol_set *run_policies(const run *r) { return r->ps; }
const unc_monitor *run_monitor(const run *r) { return r->mon; }
const samp *run_sampler(const run *r) { return r->s; }
const unc_thresholds *run_thresholds(const run *r) { return &r->cfg.thr; }
const float *run_logits(const run *r) { return r->logits; }
const int32_t *run_tokens(const run *r, int64_t *n)
{
    *n = r->n_ids;
    return r->ids;
}
int64_t run_pos(const run *r) { return fwd_pos(r->f); }
int64_t run_n_ctx(const run *r) { return fwd_n_ctx(r->f); }
int run_threads(const run *r) { return r->b->n_threads; }
void run_device(const run *r, char *buf, size_t cap) { be_describe(r->b, buf, cap); }
int run_on_device(const run *r) { return r->b->ops->memory != NULL; }   /* device memory: a device backend */

int run_head_similarity(const run *r, double *sim, int *layers, int cap)
{
    pol_env env;
    fwd_policy_env(r->f, &env);
    int n = 0;
    for (int gi = 0; gi < env.n_global; gi++) {
        if (layers) layers[gi] = env.global[gi];
        for (int g = 0; g < env.n_head_kv && n < cap; g++, n++)
            if (pol_head_similarity(env.b, fwd_kv(r->f), env.global[gi], g, &sim[n]) != 0) sim[n] = NAN;
    }
    return n;
}

int run_position_states(const run *r, uint8_t *state, int64_t n)
{
    pol_env env;
    fwd_policy_env(r->f, &env);
    if (env.n_global == 0) {
        memset(state, 1, (size_t)n);
        return 0;
    }
    memset(state, 0, (size_t)n);
    int il = env.global[0];
    const kv_cache *kv = fwd_kv(r->f);
    int np = kv_n_pages(kv, il, 0);
    for (int i = 0; i < np; i++) {
        const kv_page *p = kv_layer_page(kv, il, 0, i);
        for (int32_t t = 0; t < p->n; t++)
            if (p->pos[t] >= 0 && p->pos[t] < n) state[p->pos[t]] = 1;
    }
    int nl = 0;
    const int *last = r->ps ? pol_set_last_pages(r->ps, &nl) : NULL;
    for (int k = 0; k < nl; k++) {
        if (last[k] >= np) continue;
        const kv_page *p = kv_layer_page(kv, il, 0, last[k]);
        for (int32_t t = 0; t < p->n; t++)
            if (p->pos[t] >= 0 && p->pos[t] < n) state[p->pos[t]] = 2;
    }
    return 0;
}

void run_get_figures(const run *r, run_figures *o)
{
    memset(o, 0, sizeof *o);
    const kv_cache *kv = fwd_kv(r->f);
    kv_stats ks;
    kv_get_stats(kv, &ks);
    o->positions = ks.positions;
    o->n_ctx = fwd_n_ctx(r->f);
    o->page_size = kv_page_size(kv);
    o->tokens_kept = ks.tokens_kept;
    o->tokens_full = ks.tokens_full;
    o->kv_held = ks.bytes_resident;
    o->kv_full = ks.bytes_full;
    o->kv_peak = ks.bytes_peak;
    pol_env env;
    fwd_policy_env(r->f, &env);
    for (int i = 0; i < env.n_global; i++) {
        int64_t t = kv_peak_layer_tokens(kv, env.global[i]);
        if (t > o->peak_layer_tokens) o->peak_layer_tokens = t;
    }
    o->saves_memory = r->ps && pol_set_saves_memory(r->ps);
    if (r->b->ops->memory) r->b->ops->memory(r->b, &o->gpu_held, &o->gpu_total);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    o->rss_peak_mib = (double)ru.ru_maxrss / 1024.0;
    if (r->ps) {
        const pol_step_stats *st = pol_set_stats(r->ps);
        o->steps = st->steps;
        double steps = (double)st->steps, heads = (double)env.n_global * env.n_head_kv;
        if (steps > 0 && heads > 0) {
            o->pages_per_step = (double)st->pages_sum / steps / heads;
            o->pages_avail_per_step = (double)st->pages_total_sum / steps / heads;
        }
        if (steps > 0) {
            o->kv_read_per_step = (double)st->bytes_touched_total / steps;
            o->attn_ms_per_step = st->attn_ms_total / steps;
            o->select_ms_per_step = st->select_ms_total / steps;
            o->select_ms_first = st->select_ms_first;
            if (steps > 1) o->select_ms_rest = (st->select_ms_total - st->select_ms_first) / (steps - 1);
        }
    }
    o->prefill_tokens = r->prefill_tokens;
    o->replayed = r->replayed;
    o->prefill_s = r->prefill_s;
    o->prefill_tok_s = r->prefill_s > 0 ? (double)r->prefill_tokens / r->prefill_s : 0;
    o->decoded = r->decoded;
    o->decode_s = r->decode_s;
    o->decode_tok_s = r->decode_s > 0 ? (double)r->decoded / r->decode_s : 0;
    double rest = r->decode_s - r->decode_first_s;
    o->decode_rest_tok_s = r->decoded > 1 && r->decode_first_s > 0 && rest > 0 ? (double)(r->decoded - 1) / rest : 0;
    o->warm_up_s = r->warm_up_s;
    if (r->b->ops->counters) {
        o->has_counters = 1;
        r->b->ops->counters(r->b, &o->dev_waits, &o->dev_bytes_up, &o->dev_bytes_down);
    }
}
