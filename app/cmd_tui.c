/* cmd_tui.c - `kvchat tui`: the terminal interface (ui/tui.c). The settings file and then the
 * command line set the options (one table for both); the engine session is made here and handed to
 * the interface's worker thread. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
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

int cmd_tui(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;   /* answers about a document: reproducible unless --temp says otherwise */
    tui_opts to = { NULL, NULL, 256 };
    static tui_config cfg = { .color = 1 };
    opt_group g[] = { { tui_defs, &to, NULL }, CLI_MODEL(&o), CLI_POLICY(&o), CLI_SAMPLING(&o), CLI_STORE(&o) };
    char err[1400];
    if (config_read(g, 5, &cfg, err, sizeof err)) {
        cli_err("%s", err);
        return 1;
    }
    const char *file_policy = o.policy;
    int r = cli_parse(argc, argv, "kvchat tui [-m MODEL] [-d DOCUMENT | --session ID] [options]",
                      "The terminal interface. Without -d or --session it continues the most recent session. The\n"
                      "conversation is saved as it goes (kvchat sessions lists them). In the interface F1 lists every\n"
                      "key and command. Settings: $XDG_CONFIG_HOME/kvchat/config (key = value; see README).",
                      g, 5, NULL, 0, NULL);
    if (r) return r > 0 ? 0 : 1;
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
