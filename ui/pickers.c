/* pickers.c - the policy picker, the settings and the file picker (see pickers.h). */
#include "ui/pickers.h"

#include <dirent.h>
#include <ncurses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "ui/config.h"
#include "engine/policy/policy.h"

/* ---- policy picker ---- */

/* The stage of the policy a spec part names (the text before ':'), 0 when unknown. */
static int part_stage(const char *part)
{
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(part, ":"), part);
    const pol_ops *op = pol_find(name);
    return op ? op->stage : 0;
}

void policy_combine(const char *current, const char *pick, char *out, size_t cap)
{
    char pre[256] = "", dec[256] = "", buf[256];
    snprintf(buf, sizeof buf, "%s", current);
    for (char *part = strtok(buf, "+"); part; part = strtok(NULL, "+")) {
        if (part_stage(part) == POL_STAGE_PREFILL)
            snprintf(pre, sizeof pre, "%s", part);
        else if (strcmp(part, POL_FULL) != 0)
            snprintf(dec, sizeof dec, "%s", part);
    }
    if (!strcmp(pick, "none"))
        pre[0] = 0;
    else if (!strcmp(pick, POL_FULL))
        dec[0] = 0;
    else if (part_stage(pick) == POL_STAGE_PREFILL)
        snprintf(pre, sizeof pre, "%s", pick);
    else
        snprintf(dec, sizeof dec, "%s", pick);
    if (pre[0] && dec[0])
        snprintf(out, cap, "%s+%s", pre, dec);
    else
        snprintf(out, cap, "%s", pre[0] ? pre : dec[0] ? dec : POL_FULL);
}

/* Is pick the half of current it would replace? */
static int in_use(const char *current, const char *pick)
{
    char combined[512];
    policy_combine(current, pick, combined, sizeof combined);
    return !strcmp(combined, current);
}

static void add_policy(policy_picker *p, const char *current, const char *spec, const char *summary)
{
    if (p->n >= 32) return;
    snprintf(p->specs[p->n], sizeof p->specs[p->n], "%s", spec);
    menu_add(&p->m, p->n, "%s %-28s %s", in_use(current, spec) ? "*" : " ", spec, summary);
    p->n++;
}

void policy_picker_open(policy_picker *p, const char *current)
{
    menu_free(&p->m);
    menu_init(&p->m, "Policy", "Enter switch (replaces that half of the spec)   /policy NAME:k=v for parameters   Esc close", 0);
    p->n = 0;
    const pol_ops *const *reg = pol_registry();
    menu_add(&p->m, -1, "Decode-time selection: every token stays in memory, each step reads fewer");
    for (int i = 0; reg[i]; i++) {
        if (reg[i]->stage != POL_STAGE_DECODE) continue;
        const pol_choice *pr = pol_presets(reg[i]);
        if (!pr) add_policy(p, current, reg[i]->name, reg[i]->summary);
        /* a policy with presets: one entry each, the first with the policy's summary */
        for (int k = 0; pr && pr[k].name; k++) {
            char spec[128], what[256];
            snprintf(spec, sizeof spec, "%s:preset=%s", reg[i]->name, pr[k].name);
            snprintf(what, sizeof what, "%s, %s preset (%s)", reg[i]->name, pr[k].name, pr[k].sets ? pr[k].sets : "");
            add_policy(p, current, spec, k == 0 ? reg[i]->summary : what);
        }
    }
    menu_add(&p->m, -1, "%s", "");
    menu_add(&p->m, -1, "Prefill and storage: tokens are dropped or merged, memory is freed");
    add_policy(p, current, "none", "keep every token (no prefill policy)");
    for (int i = 0; reg[i]; i++)
        if (reg[i]->stage == POL_STAGE_PREFILL) add_policy(p, current, reg[i]->name, reg[i]->summary);
    snprintf(p->m.detail, sizeof p->m.detail, "current: %s", current);
    menu_select_tag(&p->m, 0);
}

int policy_switch(ui_worker *w, const char *spec, const char *budget, char *note, size_t notecap, char *err,
                  size_t errlen)
{
    note[0] = 0;
    if (uw_set_policy(w, spec, NULL, err, errlen) == 0) return 0;
    char again[600];
    /* refused with the budget kept: without it (each policy's own)? then that is what the user meant */
    if (!budget || !budget[0] || uw_set_policy(w, spec, "", again, sizeof again)) return -1;
    if (!strcmp(spec, POL_FULL))
        snprintf(note, notecap, "full keeps everything: the budget %s is dropped", budget);
    else
        snprintf(note, notecap, "%s has no budget: the budget %s is dropped", spec, budget);
    return 0;
}

int policy_picker_key(policy_picker *p, ui_worker *w, const char *current, const char *budget, int ch, int is_key)
{
    int r = menu_key(&p->m, ch, is_key);
    if (r == MENU_CLOSE) return 1;
    if (r != MENU_PICK) return 0;
    char spec[512], err[600];
    policy_combine(current, p->specs[menu_tag(&p->m)], spec, sizeof spec);
    if (!strcmp(spec, current)) return 1;
    if (policy_switch(w, spec, budget, p->note, sizeof p->note, err, sizeof err)) {
        menu_say(&p->m, 1, "%s", err);
        return 0;
    }
    return 1;
}

/* ---- settings ---- */

enum { S_TEMP, S_TOPK, S_TOPP, S_MINP, S_REPEAT, S_SEED, S_NPRED, S_BUDGET, S_COUNT };

static void settings_fill(settings_menu *s)
{
    int keep = s->m.sel;
    menu_clear(&s->m);
    menu_add(&s->m, S_TEMP, "temperature      %-10.2f 0 answers greedily", s->sp.temperature);
    menu_add(&s->m, S_TOPK, "top_k            %-10d 0: off", s->sp.top_k);
    menu_add(&s->m, S_TOPP, "top_p            %-10.2f 1: off", s->sp.top_p);
    menu_add(&s->m, S_MINP, "min_p            %-10.2f 0: off", s->sp.min_p);
    menu_add(&s->m, S_REPEAT, "repeat_penalty   %-10.2f 1: off", s->sp.repeat_penalty);
    menu_add(&s->m, S_SEED, "seed             %-10llu", (unsigned long long)s->sp.seed);
    menu_add(&s->m, S_NPRED, "n_predict        %-10lld the longest answer, in tokens", (long long)s->n_predict);
    menu_add(&s->m, S_BUDGET, "budget           %-10s fraction or tokens for every policy with a budget; empty: "
                              "each policy's own",
             s->budget[0] ? s->budget : "-");
    s->m.sel = keep;
}

void settings_open(settings_menu *s, const uw_view *v, const opt_group *groups, int n_groups)
{
    s->groups = groups;
    s->n_groups = n_groups;
    menu_free(&s->m);
    menu_init(&s->m, "Settings",
              "Left/Right change   Enter type a new value (Backspace edits the old)   s save to the settings file   Esc close", 0);
    s->sp = v->sp;
    s->n_predict = v->n_predict;
    snprintf(s->budget, sizeof s->budget, "%s", v->budget);
    snprintf(s->m.detail, sizeof s->m.detail, "sampling applies from the next answer; a budget re-applies the policy");
    settings_fill(s);
}

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Each row's settings key: the option of that name checks what is typed as the command line does. */
static const char *const row_key[S_COUNT] = { "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed",
                                              "n_predict", "budget" };

static const opt_def *row_def(const settings_menu *s, int row)
{
    return s->groups ? opt_find_key(s->groups, s->n_groups, row_key[row], NULL) : NULL;
}

static void step(settings_menu *s, int row, int dir)
{
    static const char *budgets[] = { "", "0.01", "0.05", "0.1", "0.2", "0.5" };
    switch (row) {   /* (each range lies inside the option's own) */
    case S_TEMP: s->sp.temperature = (float)clampd(s->sp.temperature + 0.1 * dir, 0, 2); break;
    case S_TOPK: s->sp.top_k = (int32_t)clampd(s->sp.top_k + 5 * dir, 0, 1000); break;
    case S_TOPP: s->sp.top_p = (float)clampd(s->sp.top_p + 0.05 * dir, 0.05, 1); break;
    case S_MINP: s->sp.min_p = (float)clampd(s->sp.min_p + 0.01 * dir, 0, 1); break;
    case S_REPEAT: s->sp.repeat_penalty = (float)clampd(s->sp.repeat_penalty + 0.05 * dir, 1, 2); break;
    case S_SEED: s->sp.seed = dir < 0 && s->sp.seed == 0 ? 0 : s->sp.seed + (uint64_t)(int64_t)dir; break;
    case S_NPRED: s->n_predict = (int64_t)clampd((double)s->n_predict + 32.0 * dir, 16, 1 << 20); break;
    case S_BUDGET: {
        int n = (int)(sizeof budgets / sizeof *budgets), i = 0;
        while (i < n && strcmp(budgets[i], s->budget) != 0) i++;
        i = i == n ? 0 : (i + dir + n) % n;
        snprintf(s->budget, sizeof s->budget, "%s", budgets[i]);
        break;
    }
    }
}

/* A typed value for row, checked by the row's option (the command line's range and type); the
 * budget is checked by the engine when it is applied. 0, or -1 with a message in the menu. */
static int set_typed(settings_menu *s, int row, const char *v)
{
    if (row == S_BUDGET) {
        if (strlen(v) >= sizeof s->budget) {
            menu_say(&s->m, 1, "that budget is too long");
            return -1;
        }
        memcpy(s->budget, v, strlen(v) + 1);
        return 0;
    }
    const opt_def *def = row_def(s, row);
    char what[64], err[300];
    double d;
    snprintf(what, sizeof what, "%s", row_key[row]);
    if (!def) {
        menu_say(&s->m, 1, "%s: no such setting", row_key[row]);
        return -1;
    }
    if (opt_value(def, what, v, &d, err, sizeof err)) {
        menu_say(&s->m, 1, "%s", err);
        return -1;
    }
    switch (row) {
    case S_TEMP: s->sp.temperature = (float)d; break;
    case S_TOPK: s->sp.top_k = (int32_t)d; break;
    case S_TOPP: s->sp.top_p = (float)d; break;
    case S_MINP: s->sp.min_p = (float)d; break;
    case S_REPEAT: s->sp.repeat_penalty = (float)d; break;
    case S_SEED: s->sp.seed = (uint64_t)strtoull(v, NULL, 10); break;
    case S_NPRED: s->n_predict = (int64_t)d; break;
    }
    return 0;
}

/* Hand the edited values to the worker; a changed budget re-applies the policy (the engine checks
 * it against this conversation first: a refusal shows here and changes nothing). */
static void apply(settings_menu *s, ui_worker *w, const char *policy, int row, const char *old_budget)
{
    uw_set_sampling(w, &s->sp, s->n_predict);
    if (row >= 0 && row < S_COUNT) s->dirty[row] = 1;
    if (strcmp(old_budget, s->budget) != 0) {
        char err[600];
        if (uw_set_policy(w, policy, s->budget, err, sizeof err)) {
            menu_say(&s->m, 1, "%s", err);
            snprintf(s->budget, sizeof s->budget, "%s", old_budget);
            s->dirty[S_BUDGET] = 0;
        } else {
            menu_say(&s->m, 0, "budget %s: applying %s", s->budget[0] ? s->budget : "(each policy's own)", policy);
        }
    }
    settings_fill(s);
}

int settings_key(settings_menu *s, ui_worker *w, const char *policy, int ch, int is_key)
{
    char old_budget[32];
    snprintf(old_budget, sizeof old_budget, "%s", s->budget);
    int r = menu_key(&s->m, ch, is_key);
    int row = (int)menu_tag(&s->m);
    if (r == MENU_CLOSE) return 1;
    if (r == MENU_PICK) {
        /* the row reads "name  value  note": the prompt starts from the value shown */
        const char *line = s->m.rows[s->m.sel], *val = line + strcspn(line, " ");
        val += strspn(val, " ");
        char name[32], cur[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(line, " "), line);
        snprintf(cur, sizeof cur, "%.*s", (int)strcspn(val, " "), val);
        s->editing_row = row;
        menu_prompt(&s->m, name, strcmp(cur, "-") ? cur : "");
        return 0;
    }
    if (r == MENU_EDIT_DONE) {
        if (set_typed(s, s->editing_row, s->m.edit) == 0) apply(s, w, policy, s->editing_row, old_budget);
        return 0;
    }
    if (r != MENU_UNHANDLED || row < 0) return 0;
    if (is_key && (ch == KEY_LEFT || ch == KEY_RIGHT)) {
        step(s, row, ch == KEY_RIGHT ? 1 : -1);
        apply(s, w, policy, row, old_budget);
    } else if (!is_key && ch == 's') {
        /* only what was changed here: a value set on the command line stays out of the file. The
         * policy goes in only with a budget, which means nothing without it (a budget alone would
         * meet the default policy, full, at the next start); a resumed session keeps its own. */
        char v[S_COUNT][64], err[600], pol[256];
        snprintf(v[S_TEMP], 64, "%g", s->sp.temperature);
        snprintf(v[S_TOPK], 64, "%d", s->sp.top_k);
        snprintf(v[S_TOPP], 64, "%g", s->sp.top_p);
        snprintf(v[S_MINP], 64, "%g", s->sp.min_p);
        snprintf(v[S_REPEAT], 64, "%g", s->sp.repeat_penalty);
        snprintf(v[S_SEED], 64, "%llu", (unsigned long long)s->sp.seed);
        snprintf(v[S_NPRED], 64, "%lld", (long long)s->n_predict);
        snprintf(v[S_BUDGET], 64, "%s", s->budget);
        const char *keys[S_COUNT + 1], *vals[S_COUNT + 1];
        char names[300] = "";
        int n = 0;
        for (int i = 0; i < S_COUNT; i++) {
            if (!s->dirty[i]) continue;
            keys[n] = row_key[i];
            vals[n++] = v[i];
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "", row_key[i]);
        }
        if (s->dirty[S_BUDGET] && s->budget[0]) {
            pol_strip_budget(policy, pol, sizeof pol);   /* the budget is its own line */
            keys[n] = "policy";
            vals[n++] = pol;
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, " with policy %s", pol);
        }
        char path[1024];
        if (n == 0)
            menu_say(&s->m, 0, "nothing changed here to save");
        else if (config_update(keys, vals, n, err, sizeof err))
            menu_say(&s->m, 1, "%s", err);
        else
            menu_say(&s->m, 0, "saved %s to %s", names, config_path(path, sizeof path) ? "the settings file" : path);
    }
    return 0;
}

/* ---- file picker ---- */

void human_size(long long bytes, char *buf, size_t cap)
{
    static const char *unit[] = { "KiB", "MiB", "GiB", "TiB" };
    if (bytes < 1024) {
        snprintf(buf, cap, "%lld B", bytes);
        return;
    }
    double v = (double)bytes / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, v < 10 ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

void path_expand(const char *arg, char *out, size_t cap)
{
    char raw[1024];
    size_t k = 0;
    const char *p = arg + strspn(arg, " ");
    char q = (*p == '"' || *p == '\'') ? *p++ : 0;
    for (; *p && k + 1 < sizeof raw; p++) {
        if (q && *p == q) break;                       /* the closing quote */
        if (*p == '\\' && p[1] && q != '\'') p++;       /* "\ " and "\"" stand for the character */
        raw[k++] = *p;
    }
    while (!q && k > 0 && raw[k - 1] == ' ') k--;       /* trailing blanks of an unquoted path */
    raw[k] = 0;
    const char *home = getenv("HOME");
    if (raw[0] == '~' && (raw[1] == '/' || raw[1] == 0) && home && *home)
        snprintf(out, cap, "%s%s", home, raw + 1);
    else
        snprintf(out, cap, "%s", raw);
}

/* How a name ranks under the filter: 0 begins with it, 1 contains it, -1 neither (case ignored). */
static int match_rank(const char *name, const char *filter)
{
    if (!*filter) return 0;
    if (!strncasecmp(name, filter, strlen(filter))) return 0;
    return strcasestr(name, filter) ? 1 : -1;
}

static int by_rank_kind_name(const void *a, const void *b, void *ud)
{
    const file_picker *f = ud;
    int i = *(const int *)a, j = *(const int *)b;
    int ri = match_rank(f->names[i], f->m.filter), rj = match_rank(f->names[j], f->m.filter);
    if (ri != rj) return ri - rj;
    if (f->is_dir[i] != f->is_dir[j]) return f->is_dir[j] - f->is_dir[i];
    return strcmp(f->names[i], f->names[j]);
}

static void files_fill(file_picker *f)
{
    menu_clear(&f->m);
    free(f->names);
    free(f->is_dir);
    free(f->size);
    f->names = NULL;
    f->is_dir = NULL;
    f->size = NULL;
    f->n = 0;
    f->m.msg[0] = 0;
    DIR *d = opendir(f->dir);
    if (!d) {
        menu_say(&f->m, 1, "cannot read %s", f->dir);
        return;
    }
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (e->d_name[0] == '.' && f->m.filter[0] != '.') continue;   /* hidden unless asked for */
        if (match_rank(e->d_name, f->m.filter) < 0) continue;
        if (f->n == cap) {
            cap = cap ? cap * 2 : 64;
            void *a = realloc(f->names, sizeof *f->names * (size_t)cap), *b = realloc(f->is_dir, sizeof(int) * (size_t)cap),
                 *c = realloc(f->size, sizeof(long long) * (size_t)cap);
            if (a) f->names = a;
            if (b) f->is_dir = b;
            if (c) f->size = c;
            if (!a || !b || !c) break;
        }
        char full[1400];
        snprintf(full, sizeof full, "%s/%s", f->dir, e->d_name);
        struct stat st;
        if (stat(full, &st) != 0) continue;
        snprintf(f->names[f->n], sizeof f->names[f->n], "%s", e->d_name);
        f->is_dir[f->n] = S_ISDIR(st.st_mode);
        f->size[f->n] = (long long)st.st_size;
        f->n++;
    }
    closedir(d);
    int *order = malloc(sizeof(int) * (size_t)(f->n > 0 ? f->n : 1));
    if (!order) return;
    for (int i = 0; i < f->n; i++) order[i] = i;
    qsort_r(order, (size_t)f->n, sizeof *order, by_rank_kind_name, f);
    /* "../" while nothing is typed; with a filter, only what matches (Enter on nothing does nothing) */
    if (!f->m.filter[0]) menu_add(&f->m, 1000000, "../");
    int64_t first = f->n > 0 ? order[0] : 1000000;
    for (int k = 0; k < f->n; k++) {
        int i = order[k];
        char size[32];
        human_size(f->size[i], size, sizeof size);
        if (f->is_dir[i])
            menu_add(&f->m, i, "%s/", f->names[i]);
        else
            menu_add(&f->m, i, "%-56s %10s", f->names[i], size);
    }
    free(order);
    if (f->m.filter[0] && f->n == 0) menu_say(&f->m, 1, "nothing here matches '%s'", f->m.filter);
    snprintf(f->m.title, sizeof f->m.title, "Open a document: %.130s", f->dir);
    menu_select_tag(&f->m, first);
}

/* A filter holding a path: go to its directory, and filter by what follows the last '/'. */
static void follow_typed_path(file_picker *f)
{
    char *slash = strrchr(f->m.filter, '/');
    if (!slash) return;
    char head[1024], exp[1100], where[2200], tail[128];
    snprintf(head, sizeof head, "%.*s", (int)(slash - f->m.filter + 1), f->m.filter);
    snprintf(tail, sizeof tail, "%s", slash + 1);
    path_expand(head, exp, sizeof exp);
    if (exp[0] == '/')
        snprintf(where, sizeof where, "%s", exp);
    else
        snprintf(where, sizeof where, "%s/%s", f->dir, exp);
    char real[1024];
    struct stat st;
    if (!realpath(where, real) || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) return;   /* not there (yet) */
    snprintf(f->dir, sizeof f->dir, "%s", real);
    snprintf(f->m.filter, sizeof f->m.filter, "%s", tail);
}

void file_picker_open(file_picker *f, const char *dir)
{
    file_picker_close(f);
    menu_init(&f->m, "Open a document",
              "Enter open / enter directory   type to filter (or a path: / ~/)   Backspace up   Esc close", 1);
    f->m.filter_label = "filter";
    if (!realpath(dir && *dir ? dir : ".", f->dir)) snprintf(f->dir, sizeof f->dir, "%s", dir && *dir ? dir : ".");
    snprintf(f->m.detail, sizeof f->m.detail, "text or Markdown (UTF-8); kvchat says whether it fits before prefilling");
    files_fill(f);
}

void file_picker_close(file_picker *f)
{
    menu_free(&f->m);
    free(f->names);
    free(f->is_dir);
    free(f->size);
    memset(f, 0, sizeof *f);
}

static void go_up(file_picker *f)
{
    char *s = strrchr(f->dir, '/');
    if (s && s != f->dir)
        *s = 0;
    else
        snprintf(f->dir, sizeof f->dir, "/");
    f->m.filter[0] = 0;
    files_fill(f);
}

int file_picker_key(file_picker *f, ui_worker *w, int ch, int is_key)
{
    int r = menu_key(&f->m, ch, is_key);
    if (r == MENU_CLOSE) return 1;
    if (r == MENU_FILTER) {
        follow_typed_path(f);
        files_fill(f);
    }
    if (r == MENU_BACK) go_up(f);
    if (r != MENU_PICK) return 0;
    int64_t i = menu_tag(&f->m);
    if (i < 0) return 0;
    if (i == 1000000) {
        go_up(f);
        return 0;
    }
    char full[1400];
    snprintf(full, sizeof full, "%s%s%s", f->dir, strcmp(f->dir, "/") ? "/" : "", f->names[i]);
    if (f->is_dir[i]) {
        if (strlen(full) >= sizeof f->dir) {
            menu_say(&f->m, 1, "that path is too long");
            return 0;
        }
        memcpy(f->dir, full, strlen(full) + 1);
        f->m.filter[0] = 0;
        files_fill(f);
        return 0;
    }
    if (uw_open(w, full)) {
        menu_say(&f->m, 1, "busy: wait for the current job or press Ctrl-C");
        return 0;
    }
    return 1;
}
