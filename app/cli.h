/* cli.h - what the subcommands share: option parsing helpers, opening a model with a backend and a
 * forward context, reading prompt files, the Ctrl-C flag, timing and memory figures.
 *
 * Only app/ prints and chooses exit statuses; these helpers print one-line errors prefixed "kvchat: ". */
#ifndef KVCHAT_CLI_H
#define KVCHAT_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "forward.h"
#include "model.h"
#include "policy.h"
#include "sampler.h"

/* Options common to the commands that run a model. */
typedef struct cli_opts {
    const char *model_path;     /* -m; NULL: the default model */
    const char *tokenizer_path; /* --tokenizer */
    int n_threads;              /* --threads; 0 = all cores */
    int64_t n_ctx;              /* --ctx; 0 = the model's training context */
    int n_batch;                /* --batch */
    int no_simd;                /* --no-simd */
    const char *policy;         /* --policy SPEC (NULL: full) */
    const char *budget;         /* --budget B (fraction of the context or tokens) */
    int page_size;              /* --page-size (0: 32) */
    pol_spec pspec;             /* parsed --policy/--budget (after cli_finish_common) */
    samp_params sp;             /* --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed */
} cli_opts;

typedef struct cli_runtime {
    model *m;
    be_backend *b;
    fwd_ctx *f;
    pol_set *ps;                /* the policies attached to f */
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

/* Sample, stream and decode up to n_predict tokens after a prefill whose logits are in logits,
 * stopping at end of generation, a full context or Ctrl-C (stop_note says which), then flush the
 * text and end the line. 0, or -1 with a message in err when a decode step fails. */
int cli_stream_answer(cli_runtime *rt, samp *s, float *logits, int64_t n_predict, int64_t *n_gen,
                      const char **stop_note, char *err, size_t errlen);

/* Read a whole text file, refusing binary data and invalid UTF-8. malloc'd, NUL-terminated. */
char *cli_read_text_file(const char *path, size_t *len);

double cli_now(void);                 /* monotonic seconds */
double cli_peak_rss_mib(void);        /* peak resident set size of this process */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
