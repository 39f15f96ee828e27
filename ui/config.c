/* config.c - the interface's settings file (see config.h). */
#include "ui/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const color_names[COL_COUNT] = { "user", "answer", "info", "error", "bar", "heading",
                                                     "event", "map_low", "map_mid", "map_high", "frame" };

const char *config_color_name(int element) { return element >= 0 && element < COL_COUNT ? color_names[element] : "?"; }

void config_default_colors(tui_config *c)
{
    /* curses colour numbers: black 0, red 1, green 2, yellow 3, blue 4, magenta 5, cyan 6, white 7 */
    static const short fg[COL_COUNT] = { 6, -1, 2, 1, 0, 3, 5, 4, 6, 3, 7 };
    static const short bg[COL_COUNT] = { -1, -1, -1, -1, 6, -1, -1, -1, -1, -1, -1 };
    memcpy(c->fg, fg, sizeof fg);
    memcpy(c->bg, bg, sizeof bg);
}

/* A colour by name or number; -2 when it is neither. */
static short parse_color(const char *s)
{
    static const char *const names[] = { "black", "red", "green", "yellow", "blue", "magenta", "cyan", "white" };
    if (!strcmp(s, "default")) return -1;
    for (short i = 0; i < 8; i++)
        if (!strcmp(s, names[i])) return i;
    char *end;
    long n = strtol(s, &end, 10);
    return *s && !*end && n >= 0 && n <= 255 ? (short)n : -2;
}

/* "FG" or "FG on BG". */
static int parse_color_pair(const char *v, short *fg, short *bg)
{
    char a[64], b[64];
    int n = sscanf(v, "%63s on %63s", a, b);
    if (n < 1) return -1;
    short f = parse_color(a), g = n == 2 ? parse_color(b) : *bg;
    if (f == -2 || g == -2) return -1;
    char rest[8];
    if (n == 1 && sscanf(v, "%63s %7s", a, rest) == 2) return -1;   /* "red blue": say "red on blue" */
    *fg = f;
    *bg = g;
    return 0;
}

int config_path(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(buf, cap, "%s/kvchat/config", xdg);
    else if (home && *home)
        snprintf(buf, cap, "%s/.config/kvchat/config", home);
    else
        return -1;
    return 0;
}

/* Split "key = value" in place (comments and blank lines: *k = NULL). -1 when there is no '='. */
static int split(char *line, char **k, char **v)
{
    char *p = line + strspn(line, " \t");
    p[strcspn(p, "\r\n#")] = 0;
    *k = *v = NULL;
    if (!*p) return 0;
    char *eq = strchr(p, '=');
    if (!eq) return -1;
    *eq = 0;
    for (char *e = eq - 1; e >= p && (*e == ' ' || *e == '\t'); e--) *e = 0;
    char *val = eq + 1 + strspn(eq + 1, " \t");
    for (char *e = val + strlen(val) - 1; e >= val && (*e == ' ' || *e == '\t'); e--) *e = 0;
    *k = p;
    *v = val;
    return 0;
}

static int setting(cli_opts *o, tui_config *c, const char *path, int ln, const char *k, const char *v)
{
    char opt[1200];
    snprintf(opt, sizeof opt, "%s:%d: %s", path, ln, k);
    double d;
    int64_t iv;
    int rc = 0;
    if (!strcmp(k, "policy")) {
        snprintf(c->policy, sizeof c->policy, "%s", v);
    } else if (!strcmp(k, "budget")) {
        snprintf(c->budget, sizeof c->budget, "%s", v);
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
        rc = cli_parse_int(opt, v, 1, 1 << 20, &c->n_predict);
    } else if (!strcmp(k, "page_size")) {
        rc = cli_parse_int(opt, v, 1, 4096, &iv);
        o->page_size = (int)iv;
    } else if (!strcmp(k, "color")) {
        if (strcmp(v, "on") && strcmp(v, "off")) {
            cli_err("%s:%d: color is on or off", path, ln);
            return -1;
        }
        c->color = !strcmp(v, "on");
    } else if (!strncmp(k, "color.", 6)) {
        int e = 0;
        while (e < COL_COUNT && strcmp(color_names[e], k + 6)) e++;
        if (e == COL_COUNT) {
            cli_err("%s:%d: no colour '%s' (user, answer, info, error, bar, heading, event, map_low, map_mid, "
                    "map_high, frame)",
                    path, ln, k + 6);
            return -1;
        }
        if (parse_color_pair(v, &c->fg[e], &c->bg[e])) {
            cli_err("%s:%d: %s: expected a colour (black, red, green, yellow, blue, magenta, cyan, white, default "
                    "or 0-255), optionally 'on' a background colour",
                    path, ln, k);
            return -1;
        }
    } else if (!strncmp(k, "key.", 4)) {
        int a = keymap_action(k + 4);
        char err[300];
        if (a < 0) {
            cli_err("%s:%d: no action '%s' (help, seen, sessions, policy, settings, open, regen, scroll_up, "
                    "scroll_down, quit)",
                    path, ln, k + 4);
            return -1;
        }
        if (keymap_bind(&c->keys, a, v, err, sizeof err)) {
            cli_err("%s:%d: %s", path, ln, err);
            return -1;
        }
    } else {
        cli_err("%s:%d: unknown setting '%s' (policy, budget, temperature, top_k, top_p, min_p, repeat_penalty, seed, "
                "n_predict, page_size, color, color.ELEMENT, key.ACTION)",
                path, ln, k);
        return -1;
    }
    return rc;
}

int config_read(cli_opts *o, tui_config *c)
{
    char path[1024];
    keymap_default(&c->keys);
    config_default_colors(c);
    if (config_path(path, sizeof path)) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : (cli_err("%s: %s", path, strerror(errno)), -1);
    char line[1024];
    int ln = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        char *k, *v;
        if (split(line, &k, &v)) {
            cli_err("%s:%d: expected key = value", path, ln);
            rc = -1;
        } else if (k) {
            rc = setting(o, c, path, ln, k, v);
        }
    }
    fclose(f);
    char err[300];
    if (rc == 0 && keymap_check(&c->keys, err, sizeof err)) {
        cli_err("%s: %s", path, err);
        rc = -1;
    }
    return rc;
}

/* mkdir -p for the directory holding path */
static int make_parent(const char *path)
{
    char d[1024];
    snprintf(d, sizeof d, "%s", path);
    for (char *p = d + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(d, 0700) && errno != EEXIST) return -1;
        *p = '/';
    }
    return 0;
}

int config_update(const char *const *keys, const char *const *values, int n, char *err, size_t errlen)
{
    char path[1024], tmp[1100];
    if (config_path(path, sizeof path)) {
        snprintf(err, errlen, "no place for the settings file (set HOME or XDG_CONFIG_HOME)");
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    if (make_parent(path)) {
        snprintf(err, errlen, "cannot create the directory of %s: %s", path, strerror(errno));
        return -1;
    }
    FILE *in = fopen(path, "r"), *out = fopen(tmp, "w");
    if (!out) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        if (in) fclose(in);
        return -1;
    }
    int done[32] = { 0 };
    char line[1024], copy[1024];
    while (in && fgets(line, sizeof line, in)) {
        snprintf(copy, sizeof copy, "%s", line);
        char *k, *v;
        int i = -1;
        if (split(copy, &k, &v) == 0 && k)
            for (i = n - 1; i >= 0 && strcmp(keys[i], k) != 0; i--) {}
        if (i >= 0 && i < 32) {
            if (!done[i]) fprintf(out, "%s = %s\n", keys[i], values[i]);   /* a repeated key once */
            done[i] = 1;
        } else {
            fputs(line, out);
            if (!strchr(line, '\n')) fputc('\n', out);
        }
    }
    if (in) fclose(in);
    for (int i = 0; i < n && i < 32; i++)
        if (!done[i]) fprintf(out, "%s = %s\n", keys[i], values[i]);
    int bad = fflush(out) != 0 || ferror(out) != 0 || fsync(fileno(out)) != 0;
    if (fclose(out) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}
