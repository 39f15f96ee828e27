/* sampler.c - token sampling (see sampler.h).
 *
 * Order of operations: repetition penalty, then greedy if temperature <= 0, else top-k, top-p, min-p,
 * temperature, softmax, one draw. The full vocabulary (262144 for Gemma) is never sorted: candidates
 * are cut to top-k by partial selection (or, with top-k off, to the tokens that can survive min-p)
 * before anything is sorted. RNG: xoshiro256** seeded through splitmix64. */
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/logit_pick.h"

typedef struct cand_pair {
    float logit;
    int32_t id;
} cand_pair;

struct samp {
    samp_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    int32_t *recent;        /* ring of the last repeat_last_n accepted ids */
    int32_t n_recent, head;
    int32_t *cand;          /* candidate ids, n_vocab */
    float *prob;            /* candidate probabilities */
    cand_pair *pairs;       /* sort buffer */
};

samp_params samp_params_default(void)
{
    samp_params p = { 0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 0 };
    return p;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(samp *s)
{
    uint64_t *r = s->rng;
    uint64_t out = rotl(r[1] * 5, 7) * 9;
    uint64_t t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return out;
}

double samp_uniform(samp *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

void samp_reset(samp *s)
{
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->n_recent = 0;
    s->head = 0;
}

void samp_set_params(samp *s, const samp_params *p)
{
    uint64_t old_seed = s->p.seed;
    int32_t window = s->p.repeat_last_n;
    s->p = *p;
    s->p.repeat_last_n = window;   /* the ring was sized for it */
    if (p->seed != old_seed) {
        uint64_t x = p->seed;
        for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    }
}

const samp_params *samp_get_params(const samp *s) { return &s->p; }

samp *samp_create(const samp_params *p, int32_t n_vocab)
{
    if (n_vocab <= 0) return NULL;
    samp *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    if (s->p.repeat_last_n < 0) s->p.repeat_last_n = 0;
    if (s->p.repeat_last_n > 4096) s->p.repeat_last_n = 4096;  /* the saved state holds at most 4096 ids */
    s->n_vocab = n_vocab;
    s->recent = malloc(sizeof(int32_t) * (size_t)(s->p.repeat_last_n > 0 ? s->p.repeat_last_n : 1));
    s->cand = malloc(sizeof(int32_t) * (size_t)n_vocab);
    s->prob = malloc(sizeof(float) * (size_t)n_vocab);
    s->pairs = malloc(sizeof *s->pairs * (size_t)n_vocab);
    if (!s->recent || !s->cand || !s->prob || !s->pairs) {
        samp_free(s);
        return NULL;
    }
    samp_reset(s);
    return s;
}

void samp_free(samp *s)
{
    if (!s) return;
    free(s->recent);
    free(s->cand);
    free(s->prob);
    free(s->pairs);
    free(s);
}

void samp_accept(samp *s, int32_t id)
{
    int32_t n = s->p.repeat_last_n;
    if (n <= 0) return;
    s->recent[s->head] = id;
    s->head = (s->head + 1) % n;
    if (s->n_recent < n) s->n_recent++;
}

int32_t samp_argmax(const float *l, int32_t n)
{
    int32_t b = 0;
    float bv = isnan(l[0]) ? -INFINITY : l[0];
    for (int32_t i = 1; i < n; i++)
        if (l[i] > bv) {
            bv = l[i];
            b = i;
        }
    return b;
}

/* The ids the repetition penalty applies to into out (at most 4096): each id of the window once,
 * however often it occurs in it; none when the penalty is off. Returns their count. */
static int32_t penalized_ids(const samp *s, int32_t *out)
{
    int32_t n = 0;
    if (s->p.repeat_penalty == 1.0f) return 0;
    for (int32_t i = 0; i < s->n_recent; i++) {
        int32_t id = s->recent[i];
        if (id < 0 || id >= s->n_vocab) continue;
        int seen = 0;
        for (int32_t j = 0; j < i && !seen; j++) seen = s->recent[j] == id;
        if (!seen) out[n++] = id;
    }
    return n;
}

static void apply_penalty(samp *s, float *l)
{
    int32_t n = penalized_ids(s, s->cand);   /* cand is free until the candidates are gathered */
    for (int32_t i = 0; i < n; i++) l[s->cand[i]] = lp_penalize(l[s->cand[i]], s->p.repeat_penalty);
}

/* min-p keeps p >= min_p * p_max, i.e. logit >= max + T ln(min_p); anything below can never be
 * chosen (-inf: min-p off). */
static float min_p_floor(const samp *s, float mx)
{
    return s->p.min_p > 0.0f && s->p.min_p <= 1.0f ? mx + s->p.temperature * logf(s->p.min_p) : -INFINITY;
}

/* Candidates sorted by logit, descending (ties: lower id first). */
static int cmp_desc(const void *a, const void *b)
{
    const cand_pair *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Order for top-k: larger logit first, and among equal logits the lower id, so that top-k = 1 is
 * exactly greedy (argmax picks the lowest id on ties). */
static int before(const float *l, int32_t a, int32_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

/* Move the k first (in the order above) of cand[0..n) to the front, unordered: quickselect. */
static void select_top(int32_t *cand, int32_t n, int32_t k, const float *l)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t pivot = cand[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (before(l, cand[i], pivot)) i++;
            while (before(l, pivot, cand[j])) j--;
            if (i <= j) {
                int32_t t = cand[i];
                cand[i] = cand[j];
                cand[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* The draw from the candidates s->pairs[0 .. nc) (nc >= 1), sorted as cmp_desc orders them, the first
 * the largest logit: softmax at the temperature, top-p, one draw. */
static int32_t choose(samp *s, int32_t nc)
{
    float mx = s->pairs[0].logit, temp = s->p.temperature;
    double sum = 0;
    for (int32_t i = 0; i < nc; i++) {
        double p = exp((double)(s->pairs[i].logit - mx) / temp);
        s->prob[i] = (float)p;
        sum += p;
    }
    if (s->p.top_p < 1.0f) {
        double acc = 0;
        int32_t keep = nc;
        for (int32_t i = 0; i < nc; i++) {
            acc += s->prob[i] / sum;
            if (acc >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        nc = keep;
        sum = 0;
        for (int32_t i = 0; i < nc; i++) sum += s->prob[i];
    }
    double u = samp_uniform(s) * sum, acc = 0;
    for (int32_t i = 0; i < nc; i++) {
        acc += s->prob[i];
        if (u < acc) return s->pairs[i].id;
    }
    return s->pairs[nc - 1].id;
}

int32_t samp_sample(samp *s, float *l)
{
    int32_t n = s->n_vocab;
    for (int32_t i = 0; i < n; i++)
        if (isnan(l[i])) l[i] = -INFINITY;
    apply_penalty(s, l);
    if (s->p.temperature <= 0.0f) return samp_argmax(l, n);
    float mx = l[samp_argmax(l, n)];
    if (mx == -INFINITY) return samp_argmax(l, n);
    float floor_l = min_p_floor(s, mx);   /* dropped before sorting */
    int32_t nc = 0;
    for (int32_t i = 0; i < n; i++)
        if (l[i] > -INFINITY && l[i] >= floor_l) s->cand[nc++] = i;
    if (s->p.top_k > 0 && s->p.top_k < nc) {
        select_top(s->cand, nc, s->p.top_k, l);
        nc = s->p.top_k;
    }
    for (int32_t i = 0; i < nc; i++) s->pairs[i] = (cand_pair){ l[s->cand[i]], s->cand[i] };
    qsort(s->pairs, (size_t)nc, sizeof *s->pairs, cmp_desc);
    return choose(s, nc);
}

int32_t samp_pick_request(const samp *s, int32_t k_max, int32_t *pen_ids, float *penalty, int32_t *k)
{
    *penalty = s->p.repeat_penalty;
    *k = s->p.temperature <= 0.0f ? 1 : s->p.top_k > 0 && s->p.top_k < k_max ? s->p.top_k : k_max;
    return penalized_ids(s, pen_ids);
}

int32_t samp_sample_top(samp *s, const float *val, const int32_t *id, int32_t n, int32_t k)
{
    if (n == 0) return 0;   /* every value -inf: samp_sample's argmax answers 0 */
    if (s->p.temperature <= 0.0f) return id[0];
    float floor_l = min_p_floor(s, val[0]);
    int32_t nc = 0;
    while (nc < n && val[nc] >= floor_l) nc++;
    int top_k = s->p.top_k > 0;
    /* Every token samp_sample would keep is here when one of these failed min-p (the rest are
     * smaller), when fewer than asked for came back (there were no more), or when top-k's best are. */
    if (nc == n && n >= k && !(top_k && s->p.top_k <= n)) return -1;
    if (top_k && s->p.top_k < nc) nc = s->p.top_k;
    for (int32_t i = 0; i < nc; i++) s->pairs[i] = (cand_pair){ val[i], id[i] };
    return choose(s, nc);
}

float samp_temperature(const samp *s) { return s->p.temperature; }

size_t samp_state_size(void) { return sizeof(uint64_t) * 4 + sizeof(int32_t) * 2 + sizeof(int32_t) * 4096; }

void samp_save_state(const samp *s, void *buf)
{
    memset(buf, 0, samp_state_size());
    char *p = buf;
    memcpy(p, s->rng, sizeof s->rng);
    p += sizeof s->rng;
    memcpy(p, &s->n_recent, sizeof s->n_recent);
    p += sizeof s->n_recent;
    memcpy(p, &s->head, sizeof s->head);
    p += sizeof s->head;
    /* the ring fills from 0: only its first n_recent entries were ever written */
    int32_t n = s->n_recent < 4096 ? s->n_recent : 4096;
    if (n > 0) memcpy(p, s->recent, sizeof(int32_t) * (size_t)n);
}

int samp_check_state(const void *buf, int32_t n_vocab, char *err, size_t errlen)
{
    const char *p = buf;
    int32_t n_recent, head;
    p += sizeof(uint64_t) * 4;
    memcpy(&n_recent, p, sizeof n_recent);
    memcpy(&head, p + sizeof n_recent, sizeof head);
    p += sizeof n_recent + sizeof head;
    if (n_recent < 0 || n_recent > 4096) {
        snprintf(err, errlen, "the sampler's recent-token count is %d (0 to 4096)", n_recent);
        return -1;
    }
    if (head < 0 || head >= 4096) {
        snprintf(err, errlen, "the sampler's ring position is %d (0 to 4095)", head);
        return -1;
    }
    for (int i = 0; i < n_recent; i++) {   /* the entries past them are never read */
        int32_t id;
        memcpy(&id, p + sizeof id * (size_t)i, sizeof id);
        if (id < 0 || id >= n_vocab) {
            snprintf(err, errlen, "the sampler's recent token %d is %d, outside the vocabulary", i, id);
            return -1;
        }
    }
    return 0;
}

void samp_load_state(samp *s, const void *buf)
{
    const char *p = buf;
    memcpy(s->rng, p, sizeof s->rng);
    p += sizeof s->rng;
    memcpy(&s->n_recent, p, sizeof s->n_recent);
    p += sizeof s->n_recent;
    memcpy(&s->head, p, sizeof s->head);
    p += sizeof s->head;
    int32_t n = s->p.repeat_last_n < 4096 ? s->p.repeat_last_n : 4096;
    if (s->n_recent > n) s->n_recent = n;
    if (s->n_recent < 0) s->n_recent = 0;
    if (s->head >= (n > 0 ? n : 1)) s->head = 0;
    if (n > 0) memcpy(s->recent, p, sizeof(int32_t) * (size_t)n);
}

void samp_entropy(const float *l, int32_t n, float temp, double *entropy, double *varentropy)
{
    /* One pass: with a_i = (l_i - max) / temp, w_i = e^a_i and Z = sum w, ln p_i = a_i - ln Z, so
     * H = ln Z - S1/Z and the variance of ln p is S2/Z - (S1/Z)^2 (S1 = sum w a, S2 = sum w a^2). */
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (l[i] > mx) mx = l[i];
    lp_row_entropy(l, n, mx, temp, entropy, varentropy);
}
