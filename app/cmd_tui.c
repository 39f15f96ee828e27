/* cmd_tui.c - `kvchat tui`: the terminal interface (ui/tui.c). The settings file and then the
 * command line set the options (one table for both); the engine session is made here and handed to
 * the interface's worker thread. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "engine/policy/policy.h"
#include "store/store.h"
#include "ui/config.h"
#include "ui/tui.h"

typedef struct tui_opts {
    const char *doc, *session;
    int64_t n_predict;
} tui_opts;

#define T(field) offsetof(tui_opts, field)
static const opt_def tui_defs[] = {
    { "--doc", "-d", OPT_STR, T(doc), 0, 0, NULL, 0, "FILE", "open this document (a new session)", NULL },
    { "--session", NULL, OPT_STR, T(session), 0, 0, NULL, 0, "ID", "continue this session (name or id)", NULL },
    { "--n-predict", "-n", OPT_I64, T(n_predict), 1, 1 << 20, NULL, 0, "N", "answer tokens at most (default 256)",
      "n_predict" },
    { "--help", "-h", OPT_HELP, 0, 0, 0, NULL, 0, NULL, "this help", NULL },
    OPT_END
};
#undef T

/* Does any policy of spec have a budget parameter? */
static int takes_budget(const pol_spec *spec)
{
    for (int i = 0; i < spec->n; i++)
        if (!isnan(pol_spec_value(spec, i, "budget", NAN))) return 1;
    return 0;
}

/* The settings file's policy or budget that cannot apply (a budget saved for a policy that has
 * none, a policy this build does not know) is left out with a note naming its file and line, shown
 * in the conversation: a setting never stops the interface from starting. What the command line
 * gave is checked as before (cli_finish_common). */
static void drop_unusable_settings(cli_opts *o, tui_config *cfg, const char *file_policy, const char *file_budget)
{
    pol_spec spec;
    char err[600];
    int policy_from_file = o->policy && o->policy == file_policy && cfg->policy_at[0];
    int budget_from_file = o->budget && o->budget == file_budget && cfg->budget_at[0];
    if (policy_from_file && pol_parse(&spec, o->policy, NULL, err, sizeof err)) {
        snprintf(cfg->notes[cfg->n_notes++], sizeof cfg->notes[0], "%s: policy %.200s: %.600s (ignored)",
                 cfg->policy_at, o->policy, err);
        o->policy = NULL;
    }
    if (!budget_from_file || !pol_parse(&spec, o->policy, o->budget, err, sizeof err)) return;
    if (pol_parse(&spec, o->policy, NULL, err, sizeof err)) return;   /* the command line's policy: said later */
    if (!takes_budget(&spec))
        snprintf(cfg->notes[cfg->n_notes++], sizeof cfg->notes[0], "%s: budget %.100s does not apply to policy "
                 "%.200s (ignored)", cfg->budget_at, o->budget, spec.text);
    else {
        pol_parse(&spec, o->policy, o->budget, err, sizeof err);
        snprintf(cfg->notes[cfg->n_notes++], sizeof cfg->notes[0], "%s: budget %.100s: %.600s (ignored)",
                 cfg->budget_at, o->budget, err);
    }
    o->budget = NULL;
}

int cmd_tui(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;   /* answers about a document: reproducible unless --temp says otherwise */
    tui_opts to = { NULL, NULL, 256 };
    static tui_config cfg = { .color = 1 };
    opt_group g[] = { { tui_defs, &to, NULL }, CLI_MODEL(&o), CLI_POLICY(&o), CLI_GREEDY_SAMPLING(&o), CLI_STORE(&o) };
    char err[1400];
    if (config_read(g, 5, &cfg, err, sizeof err)) {
        cli_err("%s", err);
        return 1;
    }
    const char *file_policy = o.policy, *file_budget = o.budget;
    int r = cli_parse(argc, argv, "kvchat tui [-m MODEL] [-d DOCUMENT | --session ID] [options]",
                      "The terminal interface. Without -d or --session it continues the most recent session. The\n"
                      "conversation is saved as it goes (kvchat sessions lists them). In the interface F1 lists every\n"
                      "key and command. Settings: $XDG_CONFIG_HOME/kvchat/config (key = value; see README).",
                      g, 5, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
    drop_unusable_settings(&o, &cfg, file_policy, file_budget);
    if (cli_finish_common(&o)) return 1;
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        cli_err("tui: needs a terminal (use kvchat ask or kvchat chat in scripts)");
        return 1;
    }
    /* a policy from the command line holds for the session it continues; the settings file's is the
     * default for new documents, and a resumed session keeps its own */
    cfg.keep_policy = o.policy != file_policy;
    cfg.groups = g;
    cfg.n_groups = 5;
    if (to.doc && to.session) {
        cli_err("tui: give -d DOCUMENT (a new session) or --session ID, not both");
        return 1;
    }
    store *db = NULL;
    char db_path[1024] = "";
    if (!o.no_db) {
        if (!(db = cli_open_db(o.db))) return 1;
        if (o.db)
            snprintf(db_path, sizeof db_path, "%s", o.db);
        else if (store_default_path(db_path, sizeof db_path, 0))
            db_path[0] = 0;
    }
    session *s = cli_session(&o, to.n_predict, SESS_FORMAT_AUTO);
    if (!s) {
        store_close(db);
        return 1;
    }
    ui_worker *w = uw_start(s, db, db_path, err, sizeof err);
    if (!w) {
        cli_err("tui: %s", err);
        sess_free(s);
        store_close(db);
        return 1;
    }
    /* SIGTERM and SIGHUP (a closed terminal, tmux kill-session) leave the interface the way Ctrl-Q
     * does: the answer is stopped and saved, the terminal restored; caught before initscr, so that
     * ncurses, which would exit at once, leaves them to us */
    cli_catch_stop_signals();
    cfg.stop_signal = &cli_interrupted;
    if (tui_main(w, to.doc, to.session, &cfg, err, sizeof err)) {
        cli_err("%s", err);
        return 1;
    }
    return cli_interrupted ? cli_interrupt_status() : 0;
}
