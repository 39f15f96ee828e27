/* docgen.c - seeded filler documents with a planted pass key. */
#include "app/eval/docgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const subj[] = { "The old farmer", "A young girl", "The captain", "My neighbour", "The baker",
                                    "A tired student", "The mayor", "Our teacher" };
static const char *const verb[] = { "walked to", "looked at", "painted", "talked about", "cleaned", "visited",
                                    "repaired", "forgot" };
static const char *const obj[] = { "the red barn", "the small boat", "a quiet library", "the long bridge",
                                   "a broken clock", "the village market", "an empty field", "the stone tower" };
static const char *const tail[] = { "in the morning.", "after lunch.", "during the storm.", "before the festival.",
                                    "with a smile.", "on a cold day.", "for an hour.", "without a word." };

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

char *docgen_passkey(const docgen_opts *o, size_t *len)
{
    size_t cap = (size_t)(o->n_sentences + 1) * 96 + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    uint64_t x = o->seed;
    buf[0] = 0;
    for (int i = 0; i < o->n_sentences; i++) {
        if (i == o->key_at) n += (size_t)snprintf(buf + n, cap - n, "The pass key is %d. ", o->key);
        int r[4];
        for (int k = 0; k < 4; k++) r[k] = (int)(lcg(&x) & 7);
        n += (size_t)snprintf(buf + n, cap - n, "%s %s %s %s ", subj[r[0]], verb[r[1]], obj[r[2]], tail[r[3]]);
    }
    if (len) *len = n;
    return buf;
}

static const char *const calib_questions[] = {
    "What is the pass key?",
    "Summarize the document in a few sentences.",
    "Who repaired the stone tower, and when?",
    "List everything the baker did.",
    "Which places are mentioned in the document?",
    "What happened during the storm?",
};

char *docgen_calibration_sample(uint64_t seed, int i, const char **question, size_t *len)
{
    uint64_t x = seed * 1000003ull + (uint64_t)i * 7919ull + 17;
    docgen_opts o;
    o.seed = lcg(&x);
    o.n_sentences = 100 + (int)(lcg(&x) % 61);
    o.key_at = (int)(lcg(&x) % (uint64_t)o.n_sentences);
    o.key = 10000 + (int)(lcg(&x) % 90000);
    *question = calib_questions[i % (int)(sizeof calib_questions / sizeof *calib_questions)];
    return docgen_passkey(&o, len);
}
