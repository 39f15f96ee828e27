/* cmd_tui.c - `kvchat tui`: the terminal interface (ui/tui.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "tui.h"

/* $XDG_CONFIG_HOME/kvchat/config (~/.config/kvchat/config): "key = value" lines, # comments.
 * Keys: policy, budget, temperature, top_k, top_p, min_p, repeat_penalty, seed, n_predict,
 * page_size, color (on/off). The command line overrides it. 0, or -1 after printing. */
static int read_config(cli_opts *o, int64_t *n_predict, int *color, char *policy, char *budget, size_t cap)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    char path[1024];
    if (xdg && *xdg)
        snprintf(path, sizeof path, "%s/kvchat/config", xdg);
    else if (home && *home)
        snprintf(path, sizeof path, "%s/.config/kvchat/config", home);
    else
        return 0;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : (cli_err("%s: %s", path, strerror(errno)), -1);
    char line[1024];
    int ln = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        char *p = line + strspn(line, " \t");
        p[strcspn(p, "\r\n#")] = 0;
        if (!*p) continue;
        char *eq = strchr(p, '=');
        if (!eq) {
            cli_err("%s:%d: expected key = value", path, ln);
            rc = -1;
            break;
        }
        char *k = p, *v = eq + 1;
        *eq = 0;
        for (char *e = eq - 1; e >= k && (*e == ' ' || *e == '\t'); e--) *e = 0;
        v += strspn(v, " \t");
        for (char *e = v + strlen(v) - 1; e >= v && (*e == ' ' || *e == '\t'); e--) *e = 0;
        char opt[2200];
        snprintf(opt, sizeof opt, "%s:%d: %s", path, ln, k);
        double d;
        int64_t iv;
        if (!strcmp(k, "policy")) {
            snprintf(policy, cap, "%s", v);
        } else if (!strcmp(k, "budget")) {
            snprintf(budget, cap, "%s", v);
        } else if (!strcmp(k, "temperature")) {
            rc = cli_parse_float(opt, v, 0, 100, &d);
            o->sp.temperature = (float)d;
        } else if (!strcmp(k, "top_k")) {
            rc = cli_parse_int(opt, v, 0, 1 << 30, &iv);
            o->sp.top_k = (int32_t)iv;
        } else if (!strcmp(k, "top_p")) {
            rc = cli_parse_float(opt, v, 0, 1, &d);
            o->sp.top_p = (float)d;
        } else if (!strcmp(k, "min_p")) {
            rc = cli_parse_float(opt, v, 0, 1, &d);
            o->sp.min_p = (float)d;
        } else if (!strcmp(k, "repeat_penalty")) {
            rc = cli_parse_float(opt, v, 0.01, 100, &d);
            o->sp.repeat_penalty = (float)d;
        } else if (!strcmp(k, "seed")) {
            rc = cli_parse_int(opt, v, 0, INT64_MAX, &iv);
            o->sp.seed = (uint64_t)iv;
        } else if (!strcmp(k, "n_predict")) {
            rc = cli_parse_int(opt, v, 1, 1 << 20, n_predict);
        } else if (!strcmp(k, "page_size")) {
            rc = cli_parse_int(opt, v, 1, 4096, &iv);
            o->page_size = (int)iv;
        } else if (!strcmp(k, "color")) {
            if (strcmp(v, "on") && strcmp(v, "off")) {
                cli_err("%s:%d: color is on or off", path, ln);
                rc = -1;
            }
            *color = !strcmp(v, "on");
        } else {
            cli_err("%s:%d: unknown setting '%s' (policy, budget, temperature, top_k, top_p, min_p, repeat_penalty, "
                    "seed, n_predict, page_size, color)",
                    path, ln, k);
            rc = -1;
        }
    }
    fclose(f);
    return rc;
}

int cmd_tui(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    o.sp.temperature = 0;   /* answers about a document: reproducible unless --temp says otherwise */
    const char *doc = NULL, *session = NULL;
    int64_t n_predict = 256;
    int color = 1;
    static char cfg_policy[256], cfg_budget[256];
    if (read_config(&o, &n_predict, &color, cfg_policy, cfg_budget, sizeof cfg_budget)) return 1;
    if (cfg_policy[0]) o.policy = cfg_policy;
    if (cfg_budget[0]) o.budget = cfg_budget;
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
            if (!v || cli_parse_int(a, v, 1, 1 << 20, &n_predict)) return 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kvchat tui [-m MODEL] [-d DOCUMENT | --session ID] [-n MAX_ANSWER_TOKENS] [--policy SPEC]\n"
                   "                  [--budget B] [--db PATH | --no-db] [--threads N] [--ctx N] [--temp T] ...\n"
                   "Without -d or --session it continues the most recent session. The conversation is saved as\n"
                   "it goes (kvchat sessions lists them). In the interface: /open PATH, /policy SPEC, /help (F1),\n"
                   "/quit; Ctrl-C stops an answer.\n");
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
    return tui_main(&o, doc, session, n_predict, color);
}
