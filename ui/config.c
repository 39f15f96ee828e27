/* config.c - the interface's settings file (see config.h). */
#include "ui/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/files.h"

/* A settings file is a few dozen lines; this bounds what is read at start. */
#define CONFIG_MAX_BYTES ((size_t)1 << 20)

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

/* Every settings key, for the message about an unknown one. */
static void list_keys(const opt_group *groups, int n_groups, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < n_groups; k++)
        for (const opt_def *d = groups[k].defs; d->name; d++)
            if (d->key && o < cap) o += (size_t)snprintf(buf + o, cap - o, "%s, ", d->key);
    if (o < cap) snprintf(buf + o, cap - o, "color, color.ELEMENT, key.ACTION");
}

static int setting(const opt_group *groups, int n_groups, tui_config *c, const char *where, const char *k,
                   const char *v, char *err, size_t errlen)
{
    const opt_group *g;
    const opt_def *d = opt_find_key(groups, n_groups, k, &g);
    if (d) {
        char what[1200];
        snprintf(what, sizeof what, "%s: %s", where, k);
        if (d->type == OPT_STR || d->type == OPT_STRS) {   /* the line buffer is reused: the value is kept in c */
            if (c->n_text == (int)(sizeof c->text / sizeof c->text[0])) {
                snprintf(err, errlen, "%s: too many text settings", where);
                return -1;
            }
            snprintf(c->text[c->n_text], sizeof c->text[0], "%s", v);
            v = c->text[c->n_text++];
        }
        /* where the policy and budget come from, for the note when they cannot apply together */
        if (!strcmp(d->key, "policy")) snprintf(c->policy_at, sizeof c->policy_at, "%s", where);
        if (!strcmp(d->key, "budget")) snprintf(c->budget_at, sizeof c->budget_at, "%s", where);
        return opt_set(d, g->base, what, v, err, errlen);
    }
    if (!strcmp(k, "color")) {
        if (strcmp(v, "on") && strcmp(v, "off")) {
            snprintf(err, errlen, "%s: color is on or off", where);
            return -1;
        }
        c->color = !strcmp(v, "on");
    } else if (!strncmp(k, "color.", 6)) {
        int e = 0;
        while (e < COL_COUNT && strcmp(color_names[e], k + 6)) e++;
        if (e == COL_COUNT) {
            snprintf(err, errlen, "%s: no colour '%s' (user, answer, info, error, bar, heading, event, map_low, map_mid, "
                     "map_high, frame)", where, k + 6);
            return -1;
        }
        if (parse_color_pair(v, &c->fg[e], &c->bg[e])) {
            snprintf(err, errlen, "%s: %s: expected a colour (black, red, green, yellow, blue, magenta, cyan, white, "
                     "default or 0-255), optionally 'on' a background colour", where, k);
            return -1;
        }
    } else if (!strncmp(k, "key.", 4)) {
        int a = keymap_action(k + 4);
        char e[300];
        if (a < 0) {
            snprintf(err, errlen, "%s: no action '%s' (help, seen, sessions, policy, settings, open, regen, scroll_up, "
                     "scroll_down, top, bottom, find, mouse, quit)", where, k + 4);
            return -1;
        }
        if (keymap_bind(&c->keys, a, v, e, sizeof e)) {
            snprintf(err, errlen, "%s: %s", where, e);
            return -1;
        }
    } else {
        char keys[600];
        list_keys(groups, n_groups, keys, sizeof keys);
        snprintf(err, errlen, "%s: unknown setting '%s' (%s)", where, k, keys);
        return -1;
    }
    return 0;
}

/* The file's lines into c and the options of groups; with only, the keys listed there alone (the
 * others are another command's and left alone). */
static int read_file(const opt_group *groups, int n_groups, tui_config *c, const char *const *only, char *err,
                     size_t errlen)
{
    char path[1024];
    if (config_path(path, sizeof path)) return 0;
    /* the checked open: a FIFO or a link to /dev/zero there is refused at once, never waited on or read */
    FILE *f = files_open_read(path, CONFIG_MAX_BYTES, "a settings file", err, errlen);
    if (!f) return errno == ENOENT ? 0 : -1;
    char line[1024], where[1100];
    int ln = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        char *k, *v;
        snprintf(where, sizeof where, "%s:%d", path, ln);
        if (split(line, &k, &v)) {
            snprintf(err, errlen, "%s: expected key = value", where);
            rc = -1;
        } else if (k) {
            int take = !only;
            for (int i = 0; only && only[i] && !take; i++) take = !strcmp(only[i], k);
            if (take) rc = setting(groups, n_groups, c, where, k, v, err, errlen);
        }
    }
    fclose(f);
    return rc;
}

int config_read(const opt_group *groups, int n_groups, tui_config *c, char *err, size_t errlen)
{
    char path[1024];
    keymap_default(&c->keys);
    config_default_colors(c);
    c->n_text = 0;
    c->policy_at[0] = c->budget_at[0] = 0;
    c->n_notes = 0;
    int rc = read_file(groups, n_groups, c, NULL, err, errlen);
    char e[300];
    if (rc == 0 && keymap_check(&c->keys, e, sizeof e)) {
        config_path(path, sizeof path);
        snprintf(err, errlen, "%s: %s", path, e);
        rc = -1;
    }
    return rc;
}

int config_read_answer_settings(const opt_group *groups, int n_groups, char *err, size_t errlen)
{
    static const char *const answer_keys[] = { "stop", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                                               "seed", NULL };
    static tui_config texts;   /* holds the text values (stop sequences) for the rest of the run */
    texts.n_text = 0;
    return read_file(groups, n_groups, &texts, answer_keys, err, errlen);
}

int config_update(const char *const *keys, const char *const *values, int n, char *err, size_t errlen)
{
    char path[1024];
    if (config_path(path, sizeof path)) {
        snprintf(err, errlen, "no place for the settings file (set HOME or XDG_CONFIG_HOME)");
        return -1;
    }
    if (files_make_parents(path)) {
        snprintf(err, errlen, "cannot create the directory of %s: %s", path, strerror(errno));
        return -1;
    }
    files_atomic fa;   /* a new temporary file renamed over the old one: a link there is never followed */
    if (files_atomic_open(&fa, path, err, errlen)) return -1;
    char e[1200];
    FILE *in = files_open_read(path, CONFIG_MAX_BYTES, "a settings file", e, sizeof e), *out = fa.f;
    if (!in && errno != ENOENT) {   /* the settings there are kept, not replaced by a file without them */
        files_atomic_abort(&fa);
        snprintf(err, errlen, "%s", e);
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
    return files_atomic_commit(&fa, err, errlen);
}
