/* cli.h - what the subcommands share: the option tables every command that runs a model takes,
 * parsing and help through them (common/options.h), opening an engine session from the options,
 * the stop flag (Ctrl-C, SIGTERM, SIGHUP), timing and memory figures.
 *
 * Only app/ prints and chooses exit statuses; these helpers print one-line errors prefixed "kvchat: ". */
#ifndef KVCHAT_CLI_H
#define KVCHAT_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/options.h"
#include "engine/session.h"

enum { CLI_DEV_AUTO, CLI_DEV_CPU, CLI_DEV_CUDA };   /* --device: the index in "auto|cpu|cuda" */

/* Options common to the commands that run a model (groups below: model, policy, sampling, store). */
typedef struct cli_opts {
    const char *model_path;     /* -m; NULL: the default model */
    const char *tokenizer_path; /* --tokenizer */
    int n_threads;              /* --threads; 0 = all cores */
    int64_t n_ctx;              /* --ctx; 0 = the model's training context */
    int n_batch;                /* --batch */
    int no_simd;                /* --no-simd */
    const char *isa;            /* --isa scalar|avx2|avxvnni|avx512 (default: the best this CPU has) */
    int device;                 /* --device: CLI_DEV_* */
    const char *policy;         /* --policy SPEC (NULL: full) */
    const char *budget;         /* --budget B (fraction of the context or tokens) */
    int page_size;              /* --page-size (0: 32) */
    pol_spec pspec;             /* parsed --policy/--budget (after cli_finish_common) */
    samp_params sp;             /* --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed */
    int backtrack;              /* --backtrack R: regenerations per answer (-1: 2 when the decode policy can
                                   reselect, else 0) */
    const char *thresholds;     /* --thresholds FILE or H,V (NULL: the model's calibration, if any) */
    int show_events;            /* --show-events: page statistics and events on stderr */
    int answer_end;             /* --answer-end paragraph|line|turn: PROMPT_END_* (engine/prompt.h) */
    opt_strs stop;              /* --stop TEXT (repeatable; \n, \t and \\ escapes): answers end there */
    const char *db;             /* --db PATH: the session database (NULL: the default location) */
    int no_calibration;         /* the run takes no calibrated thresholds (kvchat calibrate measures them) */
    int no_db;                  /* --no-db: nothing is saved */
} cli_opts;

extern const opt_def cli_model_opts[];     /* -m --tokenizer --threads --ctx --batch --no-simd --isa --device */
extern const opt_def cli_policy_opts[];    /* --policy --budget --page-size --backtrack --thresholds --show-events --stop */
extern const opt_def cli_sampling_opts[];  /* --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --seed */
extern const opt_def cli_store_opts[];     /* --db --no-db */
#define CLI_MODEL(o) { cli_model_opts, (o), "model and engine" }
#define CLI_POLICY(o) { cli_policy_opts, (o), "KV-cache policy (--policy help lists them)" }
#define CLI_SAMPLING(o) { cli_sampling_opts, &(o)->sp, "sampling" }
/* The same for the commands whose answers are greedy unless --temp says otherwise (ask, tui). */
extern const opt_def cli_greedy_sampling_opts[];
#define CLI_GREEDY_SAMPLING(o) { cli_greedy_sampling_opts, &(o)->sp, "sampling" }
#define CLI_STORE(o) { cli_store_opts, (o), "sessions" }

/* Ctrl-C, SIGTERM and SIGHUP stop a command the same way: cli_interrupted is set to the signal's
 * number (long work checks it as its abort flag), so the command stops at the next check, removes
 * its temporary files and exits with cli_interrupt_status(), 128 + the signal's number. A second
 * Ctrl-C exits at once. Signals ignored at start (nohup) stay ignored. */
extern volatile sig_atomic_t cli_interrupted;
void cli_catch_stop_signals(void);
/* For the commands that stream an answer to stdout (ask, chat): SIGPIPE is ignored, and an answer
 * whose output was closed (`kvchat ask ... | head -c 10`: a write fails with EPIPE) stops as if
 * SIGPIPE had been caught: cli_interrupted is SIGPIPE, so the turn is saved and the status is 141. */
void cli_stop_on_closed_output(void);
int cli_interrupt_status(void);

void cli_opts_init(cli_opts *o);
/* Parse a command's options (argv[0] is the command's name). 0 to go on; 1 when the help was asked
 * for and printed (exit 0); -1 after printing the error (exit 1). */
int cli_parse(int argc, char **argv, const char *usage, const char *about, const opt_group *groups, int n_groups,
              const char **pos, int max_pos, int *n_pos);
/* Validate what the common options combine into (the policy spec; `--policy help` prints the
 * policies and exits 0). 0, or -1 after printing. */
int cli_finish_common(cli_opts *o);
void cli_policy_help(void);

/* Path of the default model (KVCHAT_MODEL, else the cache location). */
const char *cli_default_model_path(char *buf, size_t cap);
/* The model path the options name (the default model when none), checked to exist. NULL after printing. */
const char *cli_model_path(const cli_opts *o, char *buf, size_t cap);
/* An engine session from the options: the model, the backend, the policies, sampling, and the
 * model's calibrated thresholds (found as cli_find_thresholds says). NULL after printing. */
session *cli_session(const cli_opts *o, int64_t n_predict, int format);
/* The runtime alone from the same options (what bench, eval, calibrate and logits drive). NULL after
 * printing. */
run *cli_run(const cli_opts *o);
/* The kernels' instruction set: --isa NAME (or $KVCHAT_ISA), and --no-simd for the portable ones.
 * 0, or -1 after one line on stderr when the name is unknown or the CPU lacks it. */
int cli_set_kernels(const char *isa, int no_simd);

/* Where the thresholds of model file path are looked up: --thresholds, then the session database
 * (when it exists and already knows this model file), then the file kvchat calibrate wrote (data
 * dir), then the ones shipped for the default model. Fills t (t->valid 0 when none exist). 0, or -1
 * after printing (a bad --thresholds). */
int cli_find_thresholds(const char *model_path, const char *spec, const char *db_path, unc_thresholds *t);
/* The data directory's calibration file for a fingerprint: $XDG_DATA_HOME/kvchat/thresholds/FP.txt. */
int cli_thresholds_path(const char *fingerprint, char *buf, size_t cap, int create_dirs);

/* A document or prompt file as checked text (engine/document.h); NULL after printing. */
char *cli_read_text_file(const char *path, size_t *len);
/* Standard output flushed: 0, or 1 after saying "CMD: error writing the output" (a full disk, a
 * closed pipe). */
int cli_stdout_done(const char *cmd);

/* Callbacks that print a session's answer text on stdout and, with show_events, each page's
 * statistics and every uncertainty event (and the session's notes) on stderr. */
sess_callbacks cli_print_callbacks(int *show_events);
/* The header --show-events prints before an answer: the thresholds and the regeneration budget. */
void cli_print_event_header(const session *s);

/* After an answer: the newline, and the uncertainty summary when there were events (or show_events). */
void cli_print_answer_end(const session *s, int show_events);
/* " (interrupted)", " (context full)" or "": why an answer stopped before its length. */
const char *cli_stop_note(const gen_result *g);
/* The session database: --db PATH, else the default location, checked by cli_check_db_path first.
 * NULL after printing. */
struct store *cli_open_db(const char *path);
/* What --db may name (a file name or an sqlite file: URI): not empty, not sqlite's in-memory
 * database (nothing would be kept), and, when it exists, a regular file (sqlite would put a journal
 * beside /dev/null, or block on a FIFO). 0, or -1 after one line on stderr. */
int cli_check_db_path(const char *path);

double cli_now(void);                 /* monotonic seconds */
/* The commit this program was built from ("+changes" when its sources differed from it; "unknown"
 * outside a git checkout): `kvchat --version`. */
const char *cli_build_commit(void);
/* The commit that benchmark and eval figures name: KVCHAT_COMMIT when set (to name them by another,
 * e.g. a build whose sources were changed by hand), else cli_build_commit(). */
const char *cli_figures_commit(void);
double cli_peak_rss_mib(void);        /* peak resident set size of this process */
/* "kvchat: MESSAGE" on one line of stderr, control characters in it shown escaped. */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 when stdout is a terminal (what is printed there is escaped). */
int cli_stdout_tty(void);

#endif
