/* cli.h - what the subcommands share: option parsing helpers, opening a model with a backend and a
 * forward context, reading prompt files, the Ctrl-C flag, timing and memory figures.
 *
 * Only app/ prints and chooses exit statuses; these helpers print one-line errors prefixed "kvchat: ". */
#ifndef KVCHAT_CLI_H
#define KVCHAT_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/policy/policy.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/uncertainty.h"

enum { CLI_DEV_AUTO, CLI_DEV_CPU, CLI_DEV_CUDA };

/* Options common to the commands that run a model. */
typedef struct cli_opts {
    const char *model_path;     /* -m; NULL: the default model */
    const char *tokenizer_path; /* --tokenizer */
    int n_threads;              /* --threads; 0 = all cores */
    int64_t n_ctx;              /* --ctx; 0 = the model's training context */
    int n_batch;                /* --batch */
    int no_simd;                /* --no-simd */
    int device;                 /* --device: CLI_DEV_AUTO (cuda when present), CLI_DEV_CPU, CLI_DEV_CUDA */
    const char *policy;         /* --policy SPEC (NULL: full) */
    const char *budget;         /* --budget B (fraction of the context or tokens) */
    int page_size;              /* --page-size (0: 32) */
    pol_spec pspec;             /* parsed --policy/--budget (after cli_finish_common) */
    samp_params sp;             /* --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed */
    int backtrack;              /* --backtrack R: regenerations per answer (-1: 2 when the decode policy can
                                   reselect, else 0) */
    const char *thresholds;     /* --thresholds FILE or H,V (NULL: the model's calibration, if any) */
    int show_events;            /* --show-events: page statistics and events on stderr */
    const char *db;             /* --db PATH: the session database (NULL: the default location) */
    int no_db;                  /* --no-db: the interface saves nothing */
} cli_opts;

typedef struct cli_runtime {
    model *m;
    be_backend *b;
    fwd_ctx *f;
    pol_set *ps;                /* the policies attached to f */
    unc_monitor *mon;           /* uncertainty of the current answer */
    unc_thresholds thr;         /* when a generated page is uncertain (thr.valid 0: none known) */
    int backtrack;              /* regenerations per answer, resolved */
} cli_runtime;

extern volatile sig_atomic_t cli_interrupted;
void cli_install_sigint(void);

void cli_opts_init(cli_opts *o);
/* If argv[*i] is a common option, consume it (and its value) and return 1; 0 if not ours;
 * -1 on a bad value (message printed). */
int cli_parse_common(cli_opts *o, int argc, char **argv, int *i);
/* Validate what the common options combine into (the policy spec). 0, or -1 after printing. */
int cli_finish_common(cli_opts *o);
/* Help text for the policy options. */
void cli_policy_help(void);
/* Value of an option that takes one: prints an error and returns NULL when missing. */
const char *cli_need_value(int argc, char **argv, int *i);
int cli_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);

/* Path of the default model (KVCHAT_MODEL, else the cache location). */
const char *cli_default_model_path(char *buf, size_t cap);
/* Load the model, create the backend and (if with_fwd) the forward context. 0, or -1 after printing. */
int cli_open(cli_runtime *rt, const cli_opts *o, int with_fwd);
void cli_close(cli_runtime *rt);
/* Hand the calibration's per-head key similarity (rt->thr) to the forward context, for policies
 * created after this. 0, or -1 when out of memory. */
int cli_apply_head_similarity(cli_runtime *rt);

/* Sample, stream and decode up to n_predict tokens after a prefill whose logits are in logits
 * (prev_token: the prompt's last token), with the uncertainty monitor and backtracking, stopping at
 * end of generation, a full context or Ctrl-C (stop_note says which), then flush the text and end
 * the line. With show_events, page statistics and events go to stderr as they happen. 0, or -1
 * with a message in err when a decode step fails. */
typedef struct cli_answer {
    int32_t *ids;               /* the answer's tokens (an end-of-turn token that stopped it is not one) */
    int64_t n, cap;
    char *text;                 /* as printed */
    size_t len, text_cap;
    int oom;
} cli_answer;
void cli_answer_free(cli_answer *a);
int cli_stream_answer(cli_runtime *rt, samp *s, float *logits, int32_t prev_token, int64_t n_predict,
                      int show_events, gen_result *res, const char **stop_note, cli_answer *out, char *err,
                      size_t errlen);
/* Open rt's forward context again with another KV page size (a resumed session's), keeping the
 * policies' spec. 0, or -1 after printing. */
int cli_reopen_fwd(cli_runtime *rt, const cli_opts *o, int page_size);
/* Replace the policies of rt with spec/budget (a resumed session's own). 0, or -1 after printing. */
int cli_set_policy(cli_runtime *rt, const char *spec, const char *budget);
/* Where the thresholds of model file path are looked up: --thresholds, then the session database
 * (when it exists and already knows this model file), then the file kvchat calibrate wrote (data
 * dir), then the ones shipped for the default model. Fills t (t->valid 0 when none exist). 0, or -1
 * after printing (a bad --thresholds). */
int cli_find_thresholds(const char *model_path, const char *spec, const char *db_path, unc_thresholds *t);
/* The data directory's calibration file for a fingerprint: $XDG_DATA_HOME/kvchat/thresholds/FP.txt. */
int cli_thresholds_path(const char *fingerprint, char *buf, size_t cap, int create_dirs);

/* The tokens of a question about a document: the model's chat template with document and question
 * in one user turn (format 1), or a "Question: ... Answer:" completion (format 0; a base model was
 * never trained on turn markers), or (-1) the template when the model file has one. 0, or -1 with
 * a message. */
int cli_doc_prompt(const cli_runtime *rt, const char *doc, const char *question, int format, int32_t **ids,
                   size_t *n_ids, char *err, size_t errlen);

/* Split a --policy list on the commas that start a new spec ("full,chess:preset=aggressive,every=2,
 * quest" is full / chess:preset=aggressive,every=2 / quest): a piece with '=' and no ':' continues
 * the previous spec's parameters. The count, or -1 when there are more than max. */
int cli_split_policies(const char *list, char specs[][256], int max);

/* Read a whole text file, refusing binary data and invalid UTF-8. malloc'd, NUL-terminated.
 * cli_load_text puts the one-line reason in err instead of printing it. */
char *cli_load_text(const char *path, size_t *len, char *err, size_t errlen);
char *cli_read_text_file(const char *path, size_t *len);

double cli_now(void);                 /* monotonic seconds */
/* The first line a shell command prints ("" when it prints nothing or cannot run): the commit and
 * machine that benchmark and eval records name. */
void cli_read_cmd(const char *cmd, char *buf, size_t cap);
double cli_peak_rss_mib(void);        /* peak resident set size of this process */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* From now on this thread's cli_err writes its message into buf (the last one wins) instead of
 * stderr; NULL goes back to stderr. The terminal interface uses it, since it owns the screen. */
void cli_err_to(char *buf, size_t cap);

#endif
