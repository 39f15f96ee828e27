/* tasks.c - the generated tasks of `kvchat eval`: filler, needles at depths, questions, scoring.
 *
 * A document is a passage of filler cut at sentence ends, with needle sentences inserted at the
 * sentence boundaries nearest the asked depths. Values are random (seven-digit numbers, shuffled
 * names and places), so no model knows them beforehand; eval also asks every question without the
 * document to show that. docs/eval.md describes each task. */
#include "app/eval/tasks.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/eval/docgen.h"

static uint64_t rnd(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* ---- filler ---------------------------------------------------------------------------------- */

/* The Bible as `bible` prints it: "Genesis 1" headers, blank lines, "  N verse text" lines. Keep
 * the verse texts, joined by spaces. */
static int load_kjv(filler *f, char *err, size_t errlen)
{
    FILE *p = popen("bible -l 100000 Gen1:1-Rev22:21 2>/dev/null", "r");
    if (!p) {
        snprintf(err, errlen, "cannot run the bible program");
        return -1;
    }
    size_t cap = 1 << 22, n = 0;
    char *buf = malloc(cap), line[8192];
    int ok = buf != NULL;
    while (ok && fgets(line, sizeof line, p)) {
        const char *s = line;
        while (*s == ' ') s++;
        if (s == line || !isdigit((unsigned char)*s)) continue;   /* a header or a blank line */
        while (isdigit((unsigned char)*s)) s++;
        while (*s == ' ') s++;
        size_t l = strcspn(s, "\r\n");
        if (n + l + 2 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                ok = 0;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        memcpy(buf + n, s, l);
        n += l;
        buf[n++] = ' ';
    }
    pclose(p);
    if (!ok) {
        free(buf);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (n < 100000) {   /* the program or its data is missing */
        free(buf);
        snprintf(err, errlen, "the King James Bible is not installed (apt-get install bible-kjv)");
        return -1;
    }
    buf[n] = 0;
    f->text = buf;
    f->len = n;
    snprintf(f->source, sizeof f->source, "kjv");
    return 0;
}

int filler_generated(filler *f, size_t n_chars, uint64_t seed)
{
    docgen_opts o = { seed, (int)(n_chars / 40) + 1, -1, 0 };
    size_t len;
    f->text = docgen_passkey(&o, &len);
    if (!f->text) return -1;
    f->len = len;
    snprintf(f->source, sizeof f->source, "generated");
    return 0;
}

int filler_load(filler *f, const char *which, const char **note, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (note) *note = NULL;
    if (!strcmp(which, "kjv") || !strcmp(which, "auto")) {
        if (load_kjv(f, err, errlen) == 0) return 0;
        if (!strcmp(which, "kjv")) return -1;
        if (note) *note = "the King James Bible is not installed (Debian package bible-kjv): using the generated filler";
    } else if (strcmp(which, "generated")) {
        snprintf(err, errlen, "--filler: '%s' is not auto, kjv or generated", which);
        return -1;
    }
    /* 2 MB: a 16K-token document several times over, so samples start at different places */
    if (filler_generated(f, 2u << 20, 12345)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void filler_done(filler *f)
{
    free(f->text);
    memset(f, 0, sizeof *f);
}

/* ---- tasks ----------------------------------------------------------------------------------- */

static const char *const names[] = { "passkey", "passkey-std", "niah", "multikey", "multivalue", "babi1", "babi2",
                                     "ppl", "multiturn", NULL };

/* The standard pass-key test's filler (the Landmark-attention one the papers and their baselines use),
 * repeated; its needle names the key twice. */
static const char std_filler[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

const char *task_own_filler(const char *name)
{
    return !strcmp(name, "passkey-std") ? std_filler : NULL;
}

const char *const *task_names(void)
{
    return names;
}

int task_known(const char *name)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

int task_answer_tokens(const char *name)
{
    if (!strcmp(name, "multivalue")) return 48;   /* four seven-digit numbers and separators */
    if (!strcmp(name, "babi1") || !strcmp(name, "babi2")) return 12;
    return 16;
}

double task_sweep_depth(int sample, int n_depths)
{
    if (n_depths < 2) return 0.5;
    return (double)(sample % n_depths) / (n_depths - 1);
}

double task_inner_depth(int sample, int n_depths)
{
    if (n_depths < 1) n_depths = 1;
    return ((double)(sample % n_depths) + 0.5) / n_depths;
}

static const char *const keys[] = { "apple", "river", "candle", "mountain", "violin", "lantern", "harbor",
                                     "falcon", "meadow", "compass", "garnet", "thistle", "quarry", "saddle",
                                     "orchid", "beacon", "walnut", "glacier", "pepper", "anchor", "tulip",
                                     "marble", "cobalt", "juniper" };
static const char *const people[] = { "Mary", "John", "Sandra", "Daniel", "Julie", "Fred", "Bill", "Emily" };
static const char *const places[] = { "kitchen", "garden", "office", "bathroom", "hallway", "bedroom", "cellar",
                                      "garage" };
static const char *const objects[] = { "football", "apple", "milk", "key", "book", "umbrella" };
#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

/* A needle to insert: its sentence and the depth (0..1 of the passage) it should sit at. */
typedef struct needle {
    char text[160];
    double depth;
    int q;          /* the question it answers (-1: none) */
} needle;

static int is_sentence_end(const char *t, size_t i)
{
    return i > 0 && (t[i - 1] == '.' || t[i - 1] == '?' || t[i - 1] == '!') && t[i] == ' ';
}

/* Where a passage of n_chars may start in f. */
static size_t passage_span(const filler *f, size_t n_chars)
{
    return f->len > n_chars + 8192 ? f->len - n_chars - 8192 : 1;
}

/* A passage of about n_chars from f from the first sentence start at or after s; ends at a sentence
 * end. *next receives where the text after it starts. */
static char *passage_from(const filler *f, size_t s, size_t n_chars, size_t *plen, size_t *next)
{
    while (s < f->len && s > 0 && !is_sentence_end(f->text, s)) s++;
    while (s < f->len && f->text[s] == ' ') s++;
    size_t e = s + n_chars;
    if (e > f->len) e = f->len;
    while (e < f->len && !is_sentence_end(f->text, e)) e++;
    char *p = malloc(e - s + 1);
    if (!p) return NULL;
    memcpy(p, f->text + s, e - s);
    p[e - s] = 0;
    *plen = e - s;
    *next = e < f->len ? e + 1 : f->len;
    return p;
}

/* A passage at a seeded place. */
static char *passage(const filler *f, size_t n_chars, uint64_t *x, size_t *plen, size_t *next)
{
    size_t s = (size_t)(((uint64_t)rnd(x) << 20 ^ rnd(x)) % passage_span(f, n_chars));
    return passage_from(f, s, n_chars, plen, next);
}

/* A passage for ppl, whose sample is the passage itself, so no two samples may share text: sample
 * k starts at the fraction u + k / phi (mod 1) of the span, u from the seed and the length alone.
 * The first n such points are at least 0.45 / n of the span apart for every n up to 200 (the golden
 * ratio's three-gap spacing, checked numerically), so passages of 8K tokens with their continuation
 * (about 36,000 characters of the Bible's 4.1 million) stay apart for 50 samples.
 * Independent seeded starts had put two of 20 samples at 2K within 114 characters of each other. */
static char *passage_spread(const filler *f, size_t n_chars, int sample, uint64_t base, size_t *plen, size_t *next)
{
    /* u from the sample-free state: drawn after the sample's offset, u itself stepped by a fixed
     * 0.218 a sample and the points by 0.836, not 1/phi (62 samples then overlapped) */
    for (int i = 0; i < 4; i++) rnd(&base);
    double at = (double)rnd(&base) / 2147483648.0 + (double)sample * 0.6180339887498949;
    at -= floor(at);
    return passage_from(f, (size_t)(at * (double)passage_span(f, n_chars)), n_chars, plen, next);
}

static int cmp_depth(const void *a, const void *b)
{
    double da = ((const needle *)a)->depth, db = ((const needle *)b)->depth;
    return da < db ? -1 : da > db;
}

/* The passage with the needles inserted (in depth order) at the sentence boundaries nearest their
 * depths; each needle's actual depth (its first character over the document's length) goes to
 * it->depth[needle.q] (the first of several needles of one question). */
static char *insert_needles(const char *p, size_t plen, needle *nd, int n, task_item *it)
{
    qsort(nd, (size_t)n, sizeof *nd, cmp_depth);
    size_t extra = 0;
    for (int i = 0; i < n; i++) extra += strlen(nd[i].text) + 1;
    char *doc = malloc(plen + extra + 1);
    if (!doc) return NULL;
    size_t at[16], w = 0, r = 0;
    for (int i = 0; i < n; i++) {
        /* the boundary nearest the target: a sentence end, or either end of the passage */
        size_t want = (size_t)(nd[i].depth * (double)plen), lo = want, hi = want;
        if (want > plen) want = lo = hi = plen;
        while (lo > 0 && !is_sentence_end(p, lo)) lo--;
        while (hi < plen && !is_sentence_end(p, hi)) hi++;
        size_t best = want - lo <= hi - want ? lo : hi;
        if (best < r) best = r;   /* keep the needles in order */
        memcpy(doc + w, p + r, best - r);
        w += best - r;
        r = best;
        if (r < plen && p[r] == ' ') {   /* the needle goes after the space that ends a sentence */
            doc[w++] = ' ';
            r++;
        }
        if (w > 0 && doc[w - 1] != ' ') doc[w++] = ' ';
        at[i] = w;
        size_t l = strlen(nd[i].text);
        memcpy(doc + w, nd[i].text, l);
        w += l;
        if (r < plen) doc[w++] = ' ';
    }
    memcpy(doc + w, p + r, plen - r);
    w += plen - r;
    doc[w] = 0;
    for (int i = 0; i < n; i++)
        if (nd[i].q >= 0 && it->depth[nd[i].q] < 0) it->depth[nd[i].q] = w ? (double)at[i] / (double)w : 0;
    return doc;
}

static void number(uint64_t *x, char out[24])
{
    snprintf(out, 24, "%d", 1000000 + (int)(rnd(x) % 9000000));
}

/* k distinct indices below n (k <= n) */
static void pick(uint64_t *x, int n, int k, int *out)
{
    int perm[64];
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = 0; i < k; i++) {
        int j = i + (int)(rnd(x) % (uint64_t)(n - i));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        out[i] = perm[i];
    }
}

static double uniform(uint64_t *x)
{
    return (double)(rnd(x) % 1000001) / 1000000.0;
}

/* passkey: kvchat's first pass-key generator (docgen.c), seeded as it always was. 0, or -1 when out
 * of memory. */
static int make_passkey(int64_t ctx_tokens, uint64_t seed, int sample, task_item *it)
{
    /* the seeding and generator of the first kvchat eval, unchanged */
    uint64_t x = seed * 2654435761ull + (uint64_t)sample * 40503ull + 1;
    docgen_opts d;
    d.seed = x;
    d.n_sentences = (int)(ctx_tokens / 11);
    d.key_at = (int)(((x >> 7) % 1000) * (uint64_t)d.n_sentences / 1000);
    d.key = 10000 + (int)((x >> 17) % 90000);
    it->doc = docgen_passkey(&d, NULL);
    if (!it->doc) return -1;
    snprintf(it->question[0], sizeof it->question[0], "What is the pass key?");
    snprintf(it->expect[0][0], sizeof it->expect[0][0], "%d", d.key);
    it->n_expect[0] = 1;
    it->depth[0] = d.n_sentences ? (double)d.key_at / d.n_sentences : 0;
    return 0;
}

/* passkey-std: the standard filler repeated to about ctx_tokens (chars_per_token measured on it),
 * the needle between the two repetitions nearest the sweep's depth. 0, or -1 when out of memory. */
static int make_passkey_std(int64_t ctx_tokens, double chars_per_token, int sample, int n_depths, uint64_t *xp,
                            task_item *it)
{
    uint64_t x = *xp;
    /* the filler repeated to about ctx_tokens (chars_per_token measured on this filler), the needle
     * between two repetitions nearest the sweep's depth, a fresh random five-digit key */
    int key = 10000 + (int)(rnd(&x) % 90000);
    size_t fl = strlen(std_filler);
    int64_t reps = (int64_t)((double)ctx_tokens * chars_per_token / (double)(fl + 1) + 0.5);
    if (reps < 1) reps = 1;
    char nd[96];
    int nl = snprintf(nd, sizeof nd, "The pass key is %d. Remember it. %d is the pass key.", key, key);
    int64_t at = (int64_t)(task_inner_depth(sample, n_depths) * (double)reps + 0.5);
    if (at > reps) at = reps;
    it->doc = malloc((size_t)reps * (fl + 1) + (size_t)nl + 2);
    if (!it->doc) return -1;
    size_t w = 0, needle_at = 0;
    for (int64_t r = 0; r <= reps; r++) {   /* the pieces, joined by single spaces */
        if (r == at) {
            if (w) it->doc[w++] = ' ';
            needle_at = w;
            memcpy(it->doc + w, nd, (size_t)nl);
            w += (size_t)nl;
        }
        if (r < reps) {
            if (w) it->doc[w++] = ' ';
            memcpy(it->doc + w, std_filler, fl);
            w += fl;
        }
    }
    it->doc[w] = 0;
    snprintf(it->question[0], sizeof it->question[0], "What is the pass key?");
    snprintf(it->expect[0][0], sizeof it->expect[0][0], "%d", key);
    it->n_expect[0] = 1;
    it->depth[0] = (double)needle_at / (double)w;
    *xp = x;
    return 0;
}

/* ppl: the passage p (it becomes the document) and the text that follows it in the source, to
 * score. 0, or -1 when out of memory. */
static int make_ppl(const filler *f, char *p, size_t next, task_item *it)
{
    /* teacher forcing over the text that follows the passage in the source */
    it->kind = TASK_LOGLIK;
    it->doc = p;
    size_t e = next + 600;
    if (e > f->len) e = f->len;
    while (e < f->len && !is_sentence_end(f->text, e)) e++;
    it->cont = malloc(e - next + 2);
    if (!it->cont) return -1;
    it->cont[0] = ' ';
    memcpy(it->cont + 1, f->text + next, e - next);
    it->cont[e - next + 1] = 0;
    it->question[0][0] = 0;
    it->n_expect[0] = 0;
    return 0;
}

/* niah, multikey, multivalue, multiturn: the magic-number needles into nd (their count returned)
 * and the questions and answers into it. */
static int make_number_needles(const char *name, int sample, int n_depths, uint64_t *xp, needle *nd, task_item *it)
{
    uint64_t x = *xp;
    int n = 0;
    int nk = !strcmp(name, "niah") ? 1 : !strcmp(name, "multivalue") ? 1 : 4;
    int nv = !strcmp(name, "multivalue") ? 4 : 1;
    int ki[4];
    pick(&x, COUNT(keys), nk, ki);
    char vals[4][4][24];
    for (int k = 0; k < nk; k++)
        for (int v = 0; v < nv; v++) number(&x, vals[k][v]);
    for (int k = 0; k < nk; k++)
        for (int v = 0; v < nv; v++, n++) {
            snprintf(nd[n].text, sizeof nd[n].text,
                     nv > 1 ? "One of the special magic numbers for %s is %s."
                            : "The special magic number for %s is %s.",
                     keys[ki[k]], vals[k][v]);
            nd[n].q = -1;
            /* multi-turn needles spread over thirds, so the questions reach across the document */
            nd[n].depth = !strcmp(name, "multiturn") ? (k + uniform(&x)) / nk : uniform(&x);
        }
    if (!strcmp(name, "niah")) nd[0].depth = task_sweep_depth(sample, n_depths);
    if (!strcmp(name, "multiturn")) {
        /* three of the four needles are asked, in a shuffled order */
        int order[4];
        pick(&x, 4, 3, order);
        it->n_q = 3;
        for (int q = 0; q < 3; q++) {
            int k = order[q];
            nd[k].q = q;
            snprintf(it->question[q], sizeof it->question[q], "What is the special magic number for %s?",
                     keys[ki[k]]);
            snprintf(it->expect[q][0], sizeof it->expect[q][0], "%s", vals[k][0]);
            it->n_expect[q] = 1;
        }
    } else {
        int ask = nk > 1 ? (int)(rnd(&x) % (uint64_t)nk) : 0;
        if (nv > 1) {
            snprintf(it->question[0], sizeof it->question[0], "What are all the special magic numbers for %s?",
                     keys[ki[0]]);
            for (int v = 0; v < nv; v++) snprintf(it->expect[0][v], sizeof it->expect[0][v], "%.23s", vals[0][v]);
            it->n_expect[0] = nv;
            for (int v = 0; v < nv; v++) nd[v].q = 0;   /* the depth of the earliest value */
        } else {
            snprintf(it->question[0], sizeof it->question[0], "What is the special magic number for %s?",
                     keys[ki[ask]]);
            snprintf(it->expect[0][0], sizeof it->expect[0][0], "%.23s", vals[ask][0]);
            it->n_expect[0] = 1;
            nd[ask].q = 0;
        }
    }
    *xp = x;
    return n;
}

/* babi1, babi2: eight facts about people (and an object) into nd (their count returned), the
 * question and its place into it. */
static int make_babi(const char *name, uint64_t *xp, needle *nd, task_item *it)
{
    uint64_t x = *xp;
    int n = 0;
    /* bAbI-style: eight facts about people (and an object) in time order, spread through the
     * filler; the answer needs the person's last move (babi1) or who holds the object and where
     * they went after picking it up (babi2) */
    it->kind = TASK_PLACE;
    int who[3], where[8], n_f = 8, two = !strcmp(name, "babi2");
    pick(&x, COUNT(people), 3, who);
    double dep[8];
    for (int i = 0; i < n_f; i++) dep[i] = uniform(&x);
    for (int i = 1; i < n_f; i++)   /* sorted: facts appear in the order they happened */
        for (int j = i; j > 0 && dep[j] < dep[j - 1]; j--) {
            double t = dep[j];
            dep[j] = dep[j - 1];
            dep[j - 1] = t;
        }
    int actor[8];
    for (int i = 0; i < n_f; i++) {
        actor[i] = 1 + (int)(rnd(&x) % 2);   /* the others */
        where[i] = (int)(rnd(&x) % COUNT(places));
    }
    /* person 0's two facts: a first place and a different last one */
    int a = (int)(rnd(&x) % 3), b = a + 2 + (int)(rnd(&x) % (uint64_t)(n_f - a - 2));
    int pick_at = two ? a + 1 : -1;
    actor[a] = 0;
    actor[b] = 0;
    while (where[b] == where[a]) where[b] = (int)(rnd(&x) % COUNT(places));
    for (int i = 0; i < n_f; i++) {
        if (i == pick_at) continue;
        snprintf(nd[n].text, sizeof nd[n].text, "%s went to the %s.", people[who[actor[i]]], places[where[i]]);
        nd[n].depth = dep[i];
        nd[n].q = i == b ? 0 : -1;
        n++;
    }
    const char *thing = objects[rnd(&x) % COUNT(objects)];
    if (two) {
        snprintf(nd[n].text, sizeof nd[n].text, "%s picked up the %s.", people[who[0]], thing);
        nd[n].depth = dep[pick_at];
        nd[n].q = -1;
        n++;
        snprintf(it->question[0], sizeof it->question[0], "Where is the %s?", thing);
    } else {
        snprintf(it->question[0], sizeof it->question[0], "Where is %s?", people[who[0]]);
    }
    snprintf(it->expect[0][0], sizeof it->expect[0][0], "%s", places[where[b]]);
    it->n_expect[0] = 1;
    *xp = x;
    return n;
}

int task_make(const char *name, const filler *f, int64_t ctx_tokens, double chars_per_token, uint64_t seed,
              int sample, int n_depths, task_item *it, char *err, size_t errlen)
{
    memset(it, 0, sizeof *it);
    for (int q = 0; q < TASK_MAX_Q; q++) it->depth[q] = -1;
    it->n_q = 1;
    it->kind = TASK_NUMBERS;
    if (!task_known(name)) {
        snprintf(err, errlen, "unknown task '%s'", name);
        return -1;
    }
    int rc = 0;
    if (!strcmp(name, "passkey")) {
        rc = make_passkey(ctx_tokens, seed, sample, it);
    } else {
        uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ hash_str(name) ^ (uint64_t)ctx_tokens * 0x100000001B3ull;
        uint64_t base = x;   /* the same for every sample */
        x += (uint64_t)sample * 7919ull;
        for (int i = 0; i < 4; i++) rnd(&x);
        if (!strcmp(name, "passkey-std")) {
            rc = make_passkey_std(ctx_tokens, chars_per_token, sample, n_depths, &x, it);
        } else {
            size_t n_chars = (size_t)((double)ctx_tokens * chars_per_token), plen, next;
            int ppl = !strcmp(name, "ppl");
            char *p = ppl ? passage_spread(f, n_chars, sample, base, &plen, &next) : passage(f, n_chars, &x, &plen, &next);
            if (!p) {
                rc = -1;
            } else if (ppl) {
                rc = make_ppl(f, p, next, it);
            } else {
                needle nd[12];
                int babi = !strcmp(name, "babi1") || !strcmp(name, "babi2");
                int n = babi ? make_babi(name, &x, nd, it) : make_number_needles(name, sample, n_depths, &x, nd, it);
                it->doc = insert_needles(p, plen, nd, n, it);
                free(p);
                rc = it->doc ? 0 : -1;
            }
        }
    }
    if (rc) {
        task_item_free(it);
        snprintf(err, errlen, "out of memory");
    }
    return rc;
}

void task_item_free(task_item *it)
{
    free(it->doc);
    free(it->cont);
    it->doc = it->cont = NULL;
}

/* ---- scoring --------------------------------------------------------------------------------- */

int task_numbers_present(const char *answer, const char *const *values, int n)
{
    /* the answer's digit runs, with thousands separators between digits dropped ("1,234,567") */
    char runs[32][24];
    int nr = 0;
    for (const char *s = answer; *s && nr < 32;) {
        if (!isdigit((unsigned char)*s)) {
            s++;
            continue;
        }
        size_t l = 0;
        while (*s && (isdigit((unsigned char)*s) || (*s == ',' && isdigit((unsigned char)s[1]) && l > 0))) {
            if (*s != ',' && l < 23) runs[nr][l++] = *s;
            s++;
        }
        runs[nr++][l] = 0;
    }
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int r = 0; r < nr && !found; r++) found = !strcmp(runs[r], values[i]);
        if (!found) return 0;
    }
    return n > 0;
}

int task_first_place_is(const char *answer, const char *place)
{
    const char *best = NULL, *best_at = NULL;
    for (int i = 0; i < COUNT(places); i++) {
        size_t l = strlen(places[i]);
        for (const char *s = answer; *s; s++) {
            if (strncasecmp(s, places[i], l)) continue;
            int left = s == answer || !isalpha((unsigned char)s[-1]), right = !isalpha((unsigned char)s[l]);
            if (left && right) {
                if (!best_at || s < best_at) {
                    best_at = s;
                    best = places[i];
                }
                break;
            }
        }
    }
    return best && !strcmp(best, place);
}

int task_check(const task_item *it, int q, const char *answer)
{
    if (q < 0 || q >= it->n_q) return 0;
    if (it->kind == TASK_PLACE) return task_first_place_is(answer, it->expect[q][0]);
    if (it->kind == TASK_NUMBERS) {
        const char *v[TASK_MAX_VALS];
        for (int i = 0; i < it->n_expect[q]; i++) v[i] = it->expect[q][i];
        return task_numbers_present(answer, v, it->n_expect[q]);
    }
    return 0;
}
