/* policy.h - KV-cache policies: what the model keeps (prefill / storage policies) and what each
 * decode step attends to (selection policies).
 *
 * A policy is a named table of hooks (pol_ops) with typed parameters and defaults. The forward
 * pass calls
 *   - begin        before an eval (a prefill, or a decode step) with its token ids; when decoding,
 *                  a selection policy prepares the step's choice (CHESS rebuilds it there);
 *   - prepare      before a batch's begins, each sequence's: device work a begin will read
 *                  started for every sequence first (CHESS's scores), so the batch waits once;
 *   - layer_done   after each global layer's attention, in prefill and in decode (a prefill policy
 *                  evicts or merges there; prefill_only says it does nothing while decoding), with
 *                  the rows of the chunk's queries query_rows named (a device sends back only
 *                  those);
 *   - select       per global layer of a decode step, once that layer's query is known: the pages
 *                  (optionally per KV head, optionally with a token mask) the layer attends to;
 *   - reselect     when the uncertainty monitor fires (backtracking): rebuild the selection now;
 * and asks prefill_shape for the chunk size and probe rows a prefill policy wants.
 * A spec names at most one prefill policy and one decode policy, e.g. "take+chess:preset=aggressive".
 * Selection (decode) policies keep every page: they save bandwidth, not memory. Prefill and storage
 * policies drop or merge tokens: they save memory. Sliding-window layers are never selected on.
 *
 * Parameters are declared once per policy, in a static table indexed by an enum beside it:
 *     enum { P_SINKS, P_BUDGET, P_COUNT };
 *     static const pol_param params[] = { [P_SINKS] = { "sinks", POL_INT, 4, 0, 1 << 20, NULL, "..." }, ... };
 *     _Static_assert(POL_COUNT(params) == P_COUNT && P_COUNT <= POL_MAX_PARAMS, "...");
 * and .params = params, .n_params = P_COUNT in its pol_ops. The enum names the slots create reads
 * (vals[P_SINKS]); the table alone drives parsing, range checks, the canonical text and --help. A
 * designated initializer per entry ties it to its enum value, and the assertion catches a missing
 * last entry (a hole in the middle has no name: tests/test_policy.c checks every table). Plain
 * tables, not an X-macro: they read as data, with nothing to expand. An enum parameter's values
 * are a pol_choice list ending in { NULL }. A choice that sets other parameters (sets =
 * "rho_g=0.8,...") is a preset: a policy's presets, the choices of its "preset" parameter, are
 * written once, in its own file; the parser applies them, and --help and the TUI list them from
 * there (pol_presets). */
#ifndef KVCHAT_POLICY_H
#define KVCHAT_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "engine/bytes.h"
#include "engine/kvcache.h"

struct page_span;

#define POL_MAX_PARAMS 16
/* Entries of a static array (a parameter table, checked against its enum). */
#define POL_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef enum { POL_INT, POL_FLOAT, POL_ENUM } pol_param_type;

/* One value of an enum parameter. A preset (CHESS's conservative, moderate, aggressive) also sets
 * other parameters of its policy: each one the spec leaves at its default takes the preset's value
 * (so rho_g=0, the default, means "from the preset"), and the spec's own values win. */
typedef struct pol_choice {
    const char *name;
    const char *sets;         /* NULL, or "name=value,..." of other parameters (a preset) */
} pol_choice;

typedef struct pol_param {
    const char *name;
    pol_param_type type;
    double def;               /* default (for an enum: index into choices) */
    double lo, hi;            /* valid range of an int or float */
    const pol_choice *choices;   /* enum: its values, ending with { NULL } */
    const char *help;
} pol_param;

/* What a policy sees of the engine. */
typedef struct pol_env {
    kv_cache *kv;
    be_backend *b;
    int n_head, n_head_kv, head_dim;
    const int *global;        /* global (not sliding-window) layers, ascending */
    int n_global;
    /* Per token id: its weight as a sentence boundary S(b) for this model's vocabulary (1 for text
     * ending in . ! ?, 0.9 for a newline, 0.6 for ; and :, 0.3 for a comma, else 0). */
    const float *boundary;
    int32_t n_vocab;
    /* Per layer and KV head [n_layer * n_head_kv]: how similar its keys are along the sequence
     * (kvchat calibrate; NaN where not measured), or NULL without a calibration. Chelsea spares the
     * least similar heads. */
    const float *head_sim;
    /* NULL unless a trace of chosen positions is on (pol_set_trace): policies then report their
     * decisions there (engine/policy/trace.h). */
    struct pol_trace *trace;
    /* Where a selection may have bound_pages leave its best for attention as they are (be_bounds.best,
     * bound to a device backend, so that neither waits): layer il's best (k a head, k <= BE_PICK_MAX)
     * at sel_buf + il * n_head_kv * (BE_PICK_MAX + 1) and their counts n_head_kv * BE_PICK_MAX after
     * that. NULL on a backend that has the answer at once. */
    int32_t *sel_buf;
    /* Where SentKV's choice may stay on a device for attention (be_bounds.bits bound, so that
     * neither waits): in a step whose heads' bitmaps take `words` words each (words <= bits_words),
     * the gl-th global layer's at bits_buf + gl * n_head_kv * words. NULL as sel_buf. */
    uint64_t *bits_buf;
    int64_t bits_words;
    /* Where the cache is a fork (kv_fork) of a source whose engine keeps a list of every page of
     * layer il (engine/page_list.h) naming only pages from before the fork: that list, and its
     * name on the backend (for be_page_list.from_table), which a policy's own list of every page
     * may start as (page_list_copy) instead of reading every page. NULL otherwise; NULL: none. */
    const struct page_list *(*fork_source)(const struct pol_env *env, int il, uint64_t *table);
    const void *fork_ud;
} pol_env;

/* A decode-time selection for one layer: page indices into the layer's page table (ascending),
 * each with an optional token mask (bit t: token t of the page is attended). Shared by all KV
 * heads unless per_head. Fill it with pol_sel_add; the engine owns the storage. */
typedef struct pol_sel {
    int per_head;
    int n_head_kv;
    int64_t *off;             /* [n_head_kv + 1] start of each head's entries */
    int *idx;                 /* [entries] page index */
    const uint64_t **mask;    /* [entries] NULL: the whole page */
    int64_t n, cap;
    /* Instead of the entries above, a bound_pages call's best left where the backend put them
     * (pol_env.sel_buf): KV head h attends to the pages at the ascending indices best[h * k ..]
     * (n_best[h] of them) among its first from[h], then to every page from from[h] on. The engine
     * hands them to attention as they are and reads them after the step. NULL: the entries. */
    const int32_t *best, *n_best;
    const int64_t *from;
    int32_t k;
    /* Instead of the entries: a choice of tokens left where the backend put it (pol_env.bits_buf):
     * KV head h attends to the tokens of its pages whose positions have their bit set in
     * bits[h * words ..]. The engine hands it to attention as it is and, once it is on the host
     * after the step, counts the pages it names through the layer's spans (the policy's, as they
     * stand until the step ends) and gives it back to the policy (pol_ops.chosen). NULL: none. */
    const uint64_t *bits;
    int64_t words;
    const struct page_spans *spans;
} pol_sel;

/* Start head h's list (heads in order 0, 1, ...; only head 0 when shared), then add its pages. */
void pol_sel_head(pol_sel *s, int h);
void pol_sel_add(pol_sel *s, int page, const uint64_t *mask);

enum { POL_STAGE_PREFILL = 1, POL_STAGE_DECODE = 2 };

/* One chunk as layer_done sees it. */
typedef struct pol_chunk {
    const float *q;          /* [n + n_probe][n_head * head_dim] */
    int64_t n, p0;           /* chunk rows and their first position */
    int64_t n_probe, probe_p0;   /* probe rows after them (0 on the last chunk and in decode) */
    int64_t probe_len;       /* the probe's length (pol_set_probe_tokens): the last chunk's own last rows */
    int last;                /* the eval's last chunk */
    int decoding;            /* a decode step (n = 1) */
} pol_chunk;
/* What a reselection changed: logical pages that entered and left the selection (lists capped at
 * POL_CHANGE_MAX; the counts are exact). */
#define POL_CHANGE_MAX 64
typedef struct pol_change {
    int n_added, n_removed;
    int added[POL_CHANGE_MAX], removed[POL_CHANGE_MAX];
    int supported;           /* the decode policy keeps a selection it could rebuild */
} pol_change;

/* The prefill shape a policy asks for: chunk size (0: the engine's) and probe rows appended to every
 * chunk but the last (the eval's last tokens at their own positions; 0: none). */
typedef struct pol_shape {
    int chunk, probe;
} pol_shape;

typedef struct pol_ops {
    const char *name;
    const char *summary;
    int stage;                /* POL_STAGE_PREFILL (drops or merges tokens) or POL_STAGE_DECODE (selects) */
    /* 1: layer_done does nothing while decoding (the method acts on the prompt only), so decoding
     * leaves the cache alone and a decode step need not stop after each layer for it. */
    int prefill_only;
    const pol_param *params;
    int n_params;
    /* vals[i] is params[i] (enum: the choice's index; a preset's parameters already applied);
     * budget in tokens (0: none), resolved from --budget or the policy's own budget= against the
     * context when a step needs it. */
    int (*create)(void **st, const pol_env *env, const double *vals, char *err, size_t errlen);
    void (*destroy)(void *st);
    /* Before an eval runs: its token ids at positions p0 .. p0+n-1; decoding: a decode step (n = 1),
     * where a selection policy prepares the step's choice before any layer runs. */
    void (*begin)(void *st, const pol_env *env, const int32_t *tokens, int64_t n, int64_t p0, int decoding);
    /* A decode step at p0 begins next: start the device work its begin will read, without waiting
     * for it. A batch's step calls every sequence's prepare before any begin, so the sequences'
     * work runs together and their begins wait once between them (CHESS's scores). Always followed
     * by begin at p0. NULL: begin does it all. */
    void (*prepare)(void *st, const pol_env *env, int64_t p0);
    /* What the policy asks of a prefill (NULL: the engine's chunks, no probe). */
    pol_shape (*prefill_shape)(void *st);
    /* After global layer il attended, in prefill and in decode (c says which, with the chunk's
     * queries, scaled, [n + n_probe][n_head][head_dim]). The layer's cache already holds the chunk's
     * tokens (never the probe rows); after the last global layer of a chunk every global layer
     * does. A policy may evict from layer il here. */
    int (*layer_done)(void *st, const pol_env *env, int il, const pol_chunk *c, char *err, size_t errlen);
    /* The rows of a chunk's queries (of its n + n_probe) that layer_done will read, as [*r0, *r1)
     * (empty: none), asked before the chunk runs (c->q not yet valid): a device backend sends back
     * only those. NULL with a layer_done: every row. */
    void (*query_rows)(void *st, const pol_chunk *c, int64_t *r0, int64_t *r1);
    /* Fill sel for global layer il; q is the layer's query [n_head][head_dim], already scaled.
     * Return 0 to attend to every page instead. The step's own row may not be in the layer's
     * cache yet (on a device backend the cache takes it after the last layer, and attention reads
     * it after the listed pages, always: kv_next_row_opens_page says where it will go); the
     * selection lists the pages as they are and gives the same tokens either way. */
    int (*select)(void *st, const pol_env *env, int il, const float *q, pol_sel *sel);
    /* A choice of tokens that select left with the backend (pol_sel.bits) for global layer il,
     * once it is on the host, after the step's layers and before the cache takes the step's row.
     * NULL: the policy never leaves one. */
    void (*chosen)(void *st, const pol_env *env, int il, const uint64_t *bits, int64_t words);
    /* The cache was just restored from a snapshot (and its pages placed on a device backend): put
     * what the policy's next step will read there too (be_place_bounds), as that step would, so it
     * sends only what changed since. NULL: nothing of its own to place. */
    void (*place)(void *st, const pol_env *env);
    /* Rebuild the selection now from the cache as it is (pos: the next position) and keep it for
     * a regeneration that restarts at keep_from; record what changed in chg. NULL: the policy has no
     * standing selection (it selects afresh every step). */
    void (*reselect)(void *st, const pol_env *env, int64_t pos, int64_t keep_from, pol_change *chg);
    /* Refuse a budget that cannot work for a context of ctx tokens (larger than the context, or
     * smaller than what the policy always keeps). NULL: nothing to check. */
    int (*check)(void *st, const pol_env *env, int64_t ctx, char *err, size_t errlen);
    /* One line describing the policy's current state (for the UI and ask's metrics). */
    void (*describe)(void *st, char *buf, size_t len);
    /* Snapshots: the state later steps depend on (NULL: none). load reads what save wrote, checking
     * sizes against this sequence (the bytes passed a checksum, but may come from another build). */
    void (*save)(void *st, struct bytes_w *w);
    int (*load)(void *st, const pol_env *env, struct bytes_r *r);
} pol_ops;

/* The name of full attention (every token kept and attended): the reference the others are
 * measured against, and the key of snapshots taken without a prefill policy. */
#define POL_FULL "full"

/* Every registered policy (NULL-terminated), and one by name. */
const pol_ops *const *pol_registry(void);
const pol_ops *pol_find(const char *name);
/* The named presets of policy p: the choices of its parameter "preset" (name, and the parameters
 * it sets, which serve as its description), ending with { NULL }; NULL when it has none. */
const pol_choice *pol_presets(const pol_ops *p);

/* A parsed spec: up to one prefill and one decode policy with their parameter values. */
typedef struct pol_spec {
    const pol_ops *ops[2];
    double vals[2][POL_MAX_PARAMS];
    int set[2][POL_MAX_PARAMS];  /* given explicitly */
    int n;
    char text[256];              /* canonical form for display, e.g. "take+chess:preset=aggressive" */
} pol_spec;

/* Parse "name[:k=v,...][+name[:k=v,...]]". Errors name the bad policy or parameter and list the
 * valid ones. budget (NULL or "") applies to every policy with a budget parameter that the spec
 * does not set itself: a fraction of the context (0 < b < 1) or a token count (b >= 1). */
int pol_parse(pol_spec *out, const char *spec, const char *budget, char *err, size_t errlen);
/* Value of parameter name of policy slot i (or def when it has none). */
double pol_spec_value(const pol_spec *s, int i, const char *name, double def);
/* spec without its budget= parameters ("quest:budget=0.1,x=2+take" -> "quest:x=2+take"), so a
 * budget given apart from it applies. */
void pol_strip_budget(const char *spec, char *out, size_t cap);
/* Tokens a budget value stands for in a context of ctx tokens (0: no budget). */
int64_t pol_budget_tokens(double budget, int64_t ctx);
/* A multi-line description of every policy and its parameters (for --help and error messages). */
void pol_list(char *buf, size_t len);
/* Split a list of specs on the commas that start a new spec ("full,chess:preset=aggressive,rebuild=2,
 * quest" is full / chess:preset=aggressive,rebuild=2 / quest): a piece with '=' and no ':' continues
 * the previous spec's parameters. The count, or -1 when there are more than max. */
int pol_split_list(const char *list, char specs[][256], int max);

/* 1 when decoding leaves the cache under spec alone: no policy of it drops or merges tokens while
 * decoding (H2O and Chelsea do), so decode-time policies can be compared on one cache. From the
 * hooks: every policy with a layer_done is prefill_only (a selection policy only reads the cache). */
int pol_spec_decode_keeps_cache(const pol_spec *s);
/* How similar the keys of KV head g of layer il are along the sequence: the measure that storage
 * policies merging tokens are calibrated with (kvchat calibrate records it per head; Chelsea spares
 * the least similar heads, given through pol_env.head_sim). 0, or -1 when the head holds fewer than
 * 2 tokens or memory runs out. */
int pol_head_similarity(be_backend *b, const kv_cache *kv, int il, int g, double *out);

/* Per-step facts the engine records about attention (for the UI, ask --show-pages and bench). */
typedef struct pol_step_stats {
    int64_t steps;                  /* decode steps so far */
    int64_t pages_last;             /* pages attended, summed over global layers and KV heads, last step */
    int64_t tokens_last;            /* tokens attended, summed over all layers and KV heads, last step */
    uint64_t bytes_touched_last;    /* K+V bytes read by attention, last step */
    uint64_t bytes_touched_total;
    double select_ms_last, select_ms_total;
    double select_ms_first;         /* the first step's (one-off costs: summaries built, lists sent) */
    double attn_ms_total;           /* decode attention time, all layers */
    int64_t pages_total_last;       /* pages available in the global layers, last step */
    int64_t pages_sum, pages_total_sum;   /* the same two summed over all steps */
} pol_step_stats;

/* The policies of one sequence, bound to its cache. */
typedef struct pol_set pol_set;
pol_set *pol_set_create(const pol_spec *spec, const pol_env *env, char *err, size_t errlen);
void pol_set_free(pol_set *ps);
const pol_spec *pol_set_spec(const pol_set *ps);
const pol_env *pol_set_env(const pol_set *ps);

/* Validate the budgets against a context of ctx tokens (call before prefill). */
int pol_set_check(pol_set *ps, int64_t ctx, char *err, size_t errlen);

/* Engine side (called by forward.c). begin: see pol_ops.begin. */
void pol_set_begin(pol_set *ps, const int32_t *tokens, int64_t n, int64_t p0, int decoding);
/* A decode step at p0 begins next (pol_ops.prepare); begin at p0 must follow. */
void pol_set_prepare(pol_set *ps, int64_t p0);
int pol_set_layer_done(pol_set *ps, int il, const pol_chunk *c, char *err, size_t errlen);
/* The prefill shape the set's prefill policy asks for (pol_shape). */
int pol_set_chunk_size(const pol_set *ps);
int pol_set_probe_tokens(const pol_set *ps);
/* 1 when no policy of the set needs a decode step's own row in the cache before its last layer (no
 * layer_done that acts while decoding; a selection sees the pages without it, pol_ops.select): the
 * step may run its layers without waiting for its K/V rows, the cache taking them after the last
 * layer. */
int pol_set_decode_can_defer(const pol_set *ps);
/* 1 when no policy of the set looks at a prefill chunk between its layers (no layer_done; a
 * selection acts in decode only): the chunk may run its layers without the host, the cache taking
 * its rows after the last layer. */
int pol_set_prefill_layer_free(const pol_set *ps);
/* The rows of chunk c's queries (c->q unused) that the set's layer_done hooks will read on the
 * host (a selection reads them through backend ops), as the span [*r0, *r1) covering every
 * policy's (pol_ops.query_rows): only those does a device backend send back. 0 (and an empty
 * span) when none reads any. */
int pol_set_query_rows(const pol_set *ps, const pol_chunk *c, int64_t *r0, int64_t *r1);
/* The selection for global layer il, or NULL: attend to everything. */
const pol_sel *pol_set_select(pol_set *ps, int il, const float *q);
/* A choice of tokens the selection left with the backend for layer il (pol_sel.bits), now on the
 * host: handed to the policies (pol_ops.chosen). */
void pol_set_chosen(pol_set *ps, int il, const uint64_t *bits, int64_t words);
/* After a restore: each policy's place (pol_ops.place). */
void pol_set_place(pol_set *ps);
/* An uncertainty event: the decode policy rebuilds its selection (see pol_ops.reselect). */
void pol_set_reselect(pol_set *ps, int64_t pos, int64_t keep_from, pol_change *chg);
/* 1 when the decode policy keeps a selection that reselect rebuilds (CHESS). */
int pol_set_can_reselect(const pol_set *ps);
void pol_set_record_step(pol_set *ps, int64_t pages, int64_t tokens, uint64_t bytes, double select_ms,
                         double attn_ms, int64_t pages_total);
/* The page list of the first global layer at this step (KV head 0), for the UI. */
void pol_set_last_reset(pol_set *ps);
void pol_set_last_add(pol_set *ps, int logical_page);
/* Count one attendance of the page starting at position first_pos (the page map). */
void pol_set_hit_page(pol_set *ps, int64_t first_pos);
/* Count one attendance of each nonempty page of span[0, n) (a head's whole list, as kept in a
 * page_spans: no page touched, no division where the page size is a power of two); its first seq
 * are pages 0 .. seq - 1 in order (page_spans.seq, or fewer), counted as one run in O(1); with
 * last, each also in this step's pages (pol_set_last_add). */
void pol_set_hit_spans(pol_set *ps, const struct page_span *span, int64_t n, int64_t seq, int last);

/* Read side (UI, CLI). */
const pol_step_stats *pol_set_stats(const pol_set *ps);
/* Attendance counts per document page (page i covers positions [i*P, (i+1)*P)), summed when read
 * (O(pages): the runs of pol_set_hit_spans are added here) into a buffer the set keeps, valid until
 * the next hit or read. */
const int64_t *pol_set_page_map(const pol_set *ps, int64_t *n_pages);
/* Pages the first global layer attended at the last step (KV head 0), ascending logical indices. */
const int *pol_set_last_pages(const pol_set *ps, int *n);
void pol_set_describe(const pol_set *ps, char *buf, size_t len);
/* The next prefill ends with a question of n_tokens tokens (kvchat ask prefills the document and
 * the question together): the task-aware methods' probe is then the question (at most their probe
 * size p of its last tokens); 0 (the default: a document loaded before any question, a conversation
 * read again) leaves it the prompt's last p tokens. */
void pol_set_question(pol_set *ps, int64_t n_tokens);
/* Snapshot of the policies' state: the spec text, then per policy its name and a length-prefixed
 * state. Loading with apply = 0 checks the framing and loads each state into a scratch copy of the
 * policy (nothing changes); with apply = 1 each policy whose name
 * matches the one saved in its slot loads its state (a policy switched since keeps a fresh state).
 * -1 with a message. */
void pol_set_save(const pol_set *ps, bytes_w *w);
/* Trace what the policies decide about positions [lo, hi) from now on (kvchat ask --trace): each
 * decision that touches them, with the scores, ranks and the kept threshold (engine/policy/trace.h).
 * 0, or -1 when out of memory. pol_set_trace_text: the trace so far ("" when off). */
int pol_set_trace(pol_set *ps, int64_t lo, int64_t hi);
const char *pol_set_trace_text(const pol_set *ps);
int pol_set_load(pol_set *ps, bytes_r *r, int apply, char *err, size_t errlen);
int pol_set_saves_memory(const pol_set *ps);

#endif
