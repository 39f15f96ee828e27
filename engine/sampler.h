/* sampler.h - choose the next token from logits: greedy, temperature, top-k, top-p, min-p and a
 * repetition penalty, with a seeded RNG owned by the sampler (no global state).
 *
 * The RNG state can be saved and restored byte-exactly (snapshots resume with the same draws). Also
 * computes the entropy and varentropy of a distribution for the uncertainty monitor. */
#ifndef KVCHAT_SAMPLER_H
#define KVCHAT_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct samp_params {
    float temperature;      /* <= 0: greedy */
    int32_t top_k;          /* 0: off */
    float top_p;            /* 1: off */
    float min_p;            /* 0: off */
    float repeat_penalty;   /* 1: off */
    int32_t repeat_last_n;  /* window of recent tokens the penalty looks at (at most 4096) */
    uint64_t seed;          /* any value, 0 included, is a valid, reproducible seed */
} samp_params;

typedef struct samp samp;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0, repeat_last_n 64, seed 0 */
samp_params samp_params_default(void);
samp *samp_create(const samp_params *p, int32_t n_vocab);
void samp_free(samp *s);
/* Record a token (prompt or generated) for the repetition penalty. */
void samp_accept(samp *s, int32_t id);
/* Forget recorded tokens and reseed the RNG from the parameters. */
void samp_reset(samp *s);
/* Change the sampling settings between answers (the interface edits them live). The recorded
 * tokens stay; the repetition window keeps its length; a new seed reseeds the RNG. */
void samp_set_params(samp *s, const samp_params *p);
const samp_params *samp_get_params(const samp *s);
/* Next token. Modifies logits in place (penalty, scaling). NaN counts as -inf. */
int32_t samp_sample(samp *s, float *logits);
/* Choosing from a backend's best candidates (kernels/backend.h, be_pick) instead of every logit:
 * the ids the repetition penalty applies to (each once, at most 4096, into pen_ids; the count is
 * returned), the penalty, and how many candidates to ask for (*k, at most k_max). */
int32_t samp_pick_request(const samp *s, int32_t k_max, int32_t *pen_ids, float *penalty, int32_t *k);
/* The next token from the n best of the k asked for (values after the penalty, in lp_key's order:
 * larger first, lower id first among equal ones): exactly samp_sample's choice over the whole row,
 * or -1 without drawing when the candidates may not hold every token samp_sample would weigh (then
 * samp_sample the row). */
int32_t samp_sample_top(samp *s, const float *val, const int32_t *id, int32_t n, int32_t k);
/* Index of the largest logit, the lowest id on ties. */
int32_t samp_argmax(const float *logits, int32_t n);
/* Uniform double in [0, 1) from the sampler's RNG. */
double samp_uniform(samp *s);
/* The temperature the sampler draws at (0: greedy). */
float samp_temperature(const samp *s);

size_t samp_state_size(void);
void samp_save_state(const samp *s, void *buf);
/* Load a state samp_check_state accepted (the ring is cut to this sampler's repeat_last_n). */
void samp_load_state(samp *s, const void *buf);
/* 0 when buf (samp_state_size() bytes from an untrusted source) is a state this sampler can load:
 * the recent-token count and ring head in range and every ring entry a token id below n_vocab;
 * else -1 with a message naming the field. */
int samp_check_state(const void *buf, int32_t n_vocab, char *err, size_t errlen);

/* Entropy H = -sum p ln p and varentropy sum p (ln p + H)^2 of softmax(logits / temp) (temp <= 0: 1). */
void samp_entropy(const float *logits, int32_t n, float temp, double *entropy, double *varentropy);

#endif
