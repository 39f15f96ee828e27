/* cmd_ask.c - `kvchat ask`: answer one question about a document under a KV-cache policy, then print
 * one line of metrics (and, with --show-pages, which pages of the document the answer attended).
 * With --session or --resume the conversation lives in the store and the next question continues
 * it from the snapshot after the last answer. The conversation itself is the engine's session. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "common/text.h"
#include "app/commands.h"
#include "store/persist.h"
#include "ui/config.h"

typedef struct ask_opts {
    const char *doc, *question, *session_name, *resume;
    int cont;                    /* -c: continue the most recent session */
    int64_t n_predict;
    int format;                  /* SESS_FORMAT_* */
    int show_pages;
    const char *trace;
} ask_opts;

#define A(field) offsetof(ask_opts, field)
static const opt_def ask_defs[] = {
    { "--doc", "-d", OPT_STR, A(doc), 0, 0, NULL, 0, "FILE", "the document (UTF-8 text)", NULL },
    { "--question", "-q", OPT_STR, A(question), 0, 0, NULL, 0, "TEXT", "the question, asked after the document", NULL },
    { "--n-predict", "-n", OPT_I64, A(n_predict), 1, 1 << 20, NULL, 0, "N", "answer tokens at most (default 128)",
      NULL },
    { "--chat", NULL, OPT_SET, A(format), 0, 0, NULL, SESS_FORMAT_CHAT, NULL,
      "the model's chat template (default when the model file has one)", NULL },
    { "--plain", NULL, OPT_SET, A(format), 0, 0, NULL, SESS_FORMAT_PLAIN, NULL,
      "the plain completion form DOCUMENT / Question: / Answer:", NULL },
    { "--show-pages", NULL, OPT_FLAG, A(show_pages), 0, 0, NULL, 0, NULL,
      "print the page map: how often each page of the document was attended", NULL },
    { "--trace", NULL, OPT_STR, A(trace), 0, 0, NULL, 0, "TEXT",
      "print what the policies decided about the tokens of TEXT (its first place in the prompt): scores, ranks and "
      "the kept threshold (docs/policies.md)", NULL },
    { "--session", NULL, OPT_STR, A(session_name), 0, 0, NULL, 0, "NAME",
      "keep the conversation in the store: create it, or continue it from its snapshot", NULL },
    { "--resume", NULL, OPT_STR, A(resume), 0, 0, NULL, 0, "SESSION",
      "continue a saved session (name or id; -d not needed) with the next question", NULL },
    { "--continue", "-c", OPT_FLAG, A(cont), 0, 0, NULL, 0, NULL,
      "continue the most recent session (as --resume with its id)", NULL },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef A

/* One character per document page: how often decode steps attended it, relative to the maximum. */
static void print_page_map(const session *s, int64_t doc_tokens)
{
    const run *r = sess_run(s);
    const pol_set *ps = run_policies(r);
    run_figures fg;
    run_get_figures(r, &fg);
    int64_t n;
    const int64_t *map = pol_set_page_map(ps, &n);
    int P = fg.page_size;
    int64_t doc_pages = (doc_tokens + P - 1) / P;
    int64_t total = (fg.positions + P - 1) / P;
    int64_t mx = 0, attended = 0;
    for (int64_t i = 0; i < n; i++) {
        if (map[i] > mx) mx = map[i];
        attended += map[i] > 0;
    }
    static const char ramp[] = " .:-=+*#%@";
    printf("page map: %lld pages of %d tokens (%lld hold the prompt), %lld attended at least once over %lld steps; "
           "one character per page, ' ' never .. '@' most\n",
           (long long)total, P, (long long)doc_pages, (long long)attended, (long long)fg.steps);
    for (int64_t i = 0; i < total; i += 64) {
        printf("%6lld |", (long long)i);
        for (int64_t j = i; j < i + 64 && j < total; j++) {
            int64_t h = j < n ? map[j] : 0;
            int lvl = h == 0 || mx == 0 ? 0 : 1 + (int)((h * 8) / (mx + 1));
            putchar(ramp[lvl > 9 ? 9 : lvl]);
        }
        printf("|\n");
    }
    int nl;
    const int *last = pol_set_last_pages(ps, &nl);
    printf("last step, first global layer: %d pages:", nl);
    for (int i = 0; i < nl && i < 64; i++) printf(" %d", last[i]);
    printf(nl > 64 ? " ...\n" : "\n");
}

/* The metrics line: policy, context, KV held and read, pages per step, speeds, the device. */
static void print_metrics(const session *s)
{
    const sess_answer *a = sess_last_answer(s);
    const pol_set *ps = run_policies(sess_run(s));
    run_figures fg;
    run_get_figures(sess_run(s), &fg);
    double mib = 1024.0 * 1024.0;
    char dev[128];
    run_device(sess_run(s), dev, sizeof dev);
    fprintf(stderr,
            "policy %s | context %lld tokens | KV held %.2f MiB vs full %.2f MiB (peak %.2f MiB, %s; peak per global "
            "layer and KV head %lld tokens) | pages/step "
            "%.1f of %.1f | KV read/step %.2f MiB | prefill %.1f tok/s | decode %.1f tok/s (%lld tokens)%s | on %s\n",
            pol_set_spec(ps)->text, (long long)fg.positions, (double)fg.kv_held / mib, (double)fg.kv_full / mib,
            (double)fg.kv_peak / mib, fg.saves_memory ? "tokens dropped" : "selection keeps every page",
            (long long)fg.peak_layer_tokens, fg.pages_per_step, fg.pages_avail_per_step, fg.kv_read_per_step / mib,
            fg.prefill_tok_s, fg.decode_tok_s, (long long)a->gen.n_gen, cli_stop_note(&a->gen), dev);
    char desc[1024];
    pol_set_describe(ps, desc, sizeof desc);
    if (desc[0]) fprintf(stderr, "%s\n", desc);
}

/* The conversation: continued from the store (--resume, or --session naming one that exists), or
 * a new one about the document. */
static int start(session *s, const ask_opts *a, int has_policy)
{
    if (a->session_name || a->resume) {
        sess_resume_opts ro = { 1, !has_policy, a->format, a->doc };
        int rc = sess_resume(s, a->resume ? a->resume : a->session_name, &ro);
        if (rc == SESS_ENOTFOUND && a->resume && !*a->resume) {
            cli_err("ask: -c: no saved session to continue yet (ask with --session NAME to keep one)");
            return rc;
        }
        char err[400];
        if (rc == SESS_ENOTFOUND && a->session_name && store_session_name_ok(a->session_name, err, sizeof err)) {
            cli_err("ask: no session %s (%s)", a->session_name, err);
            return rc;
        }
        if (rc != SESS_ENOTFOUND || a->resume) {
            if (rc == SESS_EMISMATCH && strstr(sess_error(s), "another model"))
                cli_err("ask: %s; pass -m with that file", sess_error(s));
            else if (rc)
                cli_err("ask: %s", sess_error(s));
            return rc;
        }
    }
    int rc = sess_open_document(s, a->doc, a->question, a->session_name, 1);
    if (rc) cli_err("ask: %s", sess_error(s));
    return rc;
}

int cmd_ask(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;   /* answers are reproducible unless --temp asks otherwise */
    ask_opts a = { NULL, NULL, NULL, NULL, 0, 128, SESS_FORMAT_AUTO, 0, NULL };
    opt_group g[] = { { ask_defs, &a, NULL }, CLI_MODEL(&o), CLI_POLICY(&o), CLI_GREEDY_SAMPLING(&o), CLI_STORE(&o) };
    char err[1400];
    if (config_read_answer_settings(g, 5, err, sizeof err)) {   /* the settings file's, then the command line's */
        cli_err("%s", err);
        return 1;
    }
    int r = cli_parse(argc, argv, "kvchat ask -d DOCUMENT|- -q QUESTION [options]",
                      "Answer a question about a document (- reads it from the standard input) under a KV-cache\n"
                      "policy, then print one line of metrics. -c continues the most recent session.",
                      g, 5, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    if (o.policy && !strcmp(o.policy, "help")) {   /* needs no document or question */
        cli_policy_help();
        return 0;
    }
    if ((a.session_name != NULL) + (a.resume != NULL) + a.cont > 1) {
        cli_err("ask: give one of --session NAME (create or continue), --resume SESSION and -c/--continue");
        return 1;
    }
    if (a.cont) a.resume = "";   /* the most recent session */
    if (!a.question || (!a.doc && !a.resume)) {
        cli_err("ask: give -d DOCUMENT and -q QUESTION (or --resume SESSION -q QUESTION, or -c -q QUESTION)");
        return 1;
    }
    if (a.session_name && !*a.session_name) {
        cli_err("ask: --session needs a name");
        return 1;
    }
    if (cli_finish_common(&o)) return 1;
    struct store *db = NULL;
    store_persist sp;
    if ((a.session_name || a.resume) && !(db = cli_open_db(o.db))) return 1;
    session *s = cli_session(&o, a.n_predict, a.format);
    if (!s) {
        store_close(db);
        return 1;
    }
    int rc = 1;
    sess_callbacks cb = cli_print_callbacks(&o.show_events);
    sess_set_callbacks(s, &cb, &cli_interrupted);
    if (db) {
        store_persist_init(&sp, db);
        if (sess_attach_store(s, &sp.ops)) {
            cli_err("ask: %s", sess_error(s));
            goto done;
        }
    }
    if (start(s, &a, o.policy != NULL)) goto done;
    if (sess_trace(s, a.trace)) {
        cli_err("ask: %s", sess_error(s));
        goto done;
    }
    if (o.show_events) cli_print_event_header(s);
    cli_catch_stop_signals();
    cli_stop_on_closed_output();
    int st = sess_ask(s, a.question);
    if (st != SESS_OK && st != SESS_ESAVE) {
        if (st == SESS_ECANCELLED) {
            cli_err("ask: interrupted during prefill");
            rc = cli_interrupt_status();
        } else {
            cli_err("ask: %s", sess_error(s));
        }
        goto done;
    }
    cli_print_answer_end(s, o.show_events);
    const sess_answer *ans = sess_last_answer(s);
    if (a.show_pages) print_page_map(s, ans->prompt_end);
    if (a.trace) {
        int64_t lo, hi;
        const char *tr = sess_trace_text(s, &lo, &hi);
        char shown[400];
        text_escape(a.trace, shown, sizeof shown, 0);
        printf("trace of positions %lld..%lld ('%s'):\n%s", (long long)lo, (long long)(hi - 1), shown, tr);
    }
    fflush(stdout);
    print_metrics(s);
    rc = cli_interrupted ? cli_interrupt_status() : 0;
    if (st == SESS_ESAVE) {
        cli_err("ask: %s", sess_error(s));
        rc = 1;
    } else if (db) {
        int64_t n_seq;
        run_tokens(sess_run(s), &n_seq);
        char name[400];
        text_escape(a.session_name ? a.session_name : "", name, sizeof name, 0);
        fprintf(stderr, "session %lld%s%s%s: turn saved (messages %lld, %lld), snapshot of %lld tokens, %.1f MiB in %.0f ms\n",
                (long long)sess_stored_id(s), a.session_name ? " (" : "", name, a.session_name ? ")" : "",
                (long long)ans->user_msg, (long long)ans->answer_msg, (long long)n_seq,
                (double)ans->snapshot_bytes / (1024.0 * 1024.0), ans->save_ms);
    }
done:
    sess_free(s);
    store_close(db);
    return rc;
}
