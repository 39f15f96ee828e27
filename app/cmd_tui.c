/* cmd_tui.c - `kvchat tui`: the terminal interface (ui/tui.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "ui/config.h"
#include "ui/tui.h"

int cmd_tui(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;   /* answers about a document: reproducible unless --temp says otherwise */
    const char *doc = NULL, *session = NULL;
    static tui_config cfg = { .n_predict = 256, .color = 1 };
    if (config_read(&o, &cfg)) return 1;
    if (cfg.policy[0]) o.policy = cfg.policy;
    if (cfg.budget[0]) o.budget = cfg.budget;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_common(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "-d") || !strcmp(a, "--doc")) {
            if (!(doc = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--session")) {
            if (!(session = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-n")) {
            const char *v = cli_need_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 20, &cfg.n_predict)) return 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kvchat tui [-m MODEL] [-d DOCUMENT | --session ID] [-n MAX_ANSWER_TOKENS] [--policy SPEC]\n"
                   "                  [--budget B] [--db PATH | --no-db] [--threads N] [--ctx N] [--temp T] ...\n"
                   "Without -d or --session it continues the most recent session. The conversation is saved as\n"
                   "it goes (kvchat sessions lists them). In the interface: F1 lists every key and command.\n"
                   "Settings: $XDG_CONFIG_HOME/kvchat/config (key = value; see README).\n");
            return 0;
        } else {
            cli_err("tui: unknown option %s (see kvchat tui --help)", a);
            return 1;
        }
    }
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        cli_err("tui: needs a terminal (use kvchat ask or kvchat chat in scripts)");
        return 1;
    }
    if (cli_finish_common(&o)) return 1;
    if (doc && session) {
        cli_err("tui: give -d DOCUMENT (a new session) or --session ID, not both");
        return 1;
    }
    return tui_main(&o, doc, session, &cfg);
}
