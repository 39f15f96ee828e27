/* docgen.h - seeded documents for calibration and measurement: filler sentences built from small
 * word lists ("The captain repaired the stone tower after lunch.") with one planted fact, the pass
 * key. The same seed gives the same text on every machine (a 64-bit LCG, no libc rand). */
#ifndef KVCHAT_DOCGEN_H
#define KVCHAT_DOCGEN_H

#include <stddef.h>
#include <stdint.h>

typedef struct docgen_opts {
    uint64_t seed;
    int n_sentences;        /* filler sentences (about 11 tokens each) */
    int key_at;             /* the pass key sentence goes before filler sentence key_at (-1: none) */
    int key;                /* the pass key (five digits) */
} docgen_opts;

/* The document, malloc'd and NUL-terminated, or NULL when out of memory. */
char *docgen_passkey(const docgen_opts *o, size_t *len);

/* The calibration set: sample i (0-based) of a seeded set, a document of 100 to 160 sentences with a
 * random pass key at a random place, and one of a fixed list of questions (retrieval, summary,
 * listing, who-did-what) in turn. */
char *docgen_calibration_sample(uint64_t seed, int i, const char **question, size_t *len);

#endif
