/* options.c - table-driven option parsing (see options.h). */
#include "common/options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *field(void *base, const opt_def *d) { return (char *)base + d->off; }

static int takes_value(const opt_def *d)
{
    return d->type != OPT_FLAG && d->type != OPT_SET && d->type != OPT_HELP;
}

/* Index of text in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *text)
{
    int i = 0;
    size_t tl = strlen(text);
    for (const char *p = choices; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == tl && !strncmp(p, text, l)) return i;
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

int opt_set(const opt_def *d, void *base, const char *what, const char *text, char *err, size_t errlen)
{
    void *p = field(base, d);
    char *end;
    switch (d->type) {
    case OPT_FLAG:
    case OPT_SET: {
        if (!text) {
            *(int *)p = d->type == OPT_SET ? d->set : 1;
            return 0;
        }
        int on = !strcmp(text, "on") || !strcmp(text, "1") || !strcmp(text, "true");
        int off = !strcmp(text, "off") || !strcmp(text, "0") || !strcmp(text, "false");
        if (!on && !off) {
            snprintf(err, errlen, "%s is on or off, not '%s'", what, text);
            return -1;
        }
        *(int *)p = on ? (d->type == OPT_SET ? d->set : 1) : 0;
        return 0;
    }
    case OPT_INT:
    case OPT_I64:
    case OPT_U64: {
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (errno || end == text || *end || (double)v < d->lo || (double)v > d->hi) {
            snprintf(err, errlen, "%s: '%s' is not an integer in [%.0f, %.0f]", what, text, d->lo, d->hi);
            return -1;
        }
        if (d->type == OPT_INT)
            *(int *)p = (int)v;
        else if (d->type == OPT_I64)
            *(int64_t *)p = v;
        else
            *(uint64_t *)p = (uint64_t)v;
        return 0;
    }
    case OPT_FLOAT: {
        errno = 0;
        double v = strtod(text, &end);
        if (errno || end == text || *end || !(v >= d->lo && v <= d->hi)) {
            snprintf(err, errlen, "%s: '%s' is not a number in [%g, %g]", what, text, d->lo, d->hi);
            return -1;
        }
        *(float *)p = (float)v;
        return 0;
    }
    case OPT_STR:
        *(const char **)p = text;
        return 0;
    case OPT_STRS: {
        opt_strs *l = p;
        if (l->n == OPT_STRS_MAX) {
            snprintf(err, errlen, "%s: at most %d of them", what, OPT_STRS_MAX);
            return -1;
        }
        l->v[l->n++] = text;
        return 0;
    }
    case OPT_CHOICE: {
        int i = choice_index(d->choices, text);
        if (i < 0) {
            snprintf(err, errlen, "%s is one of %s, not '%s'", what, d->choices, text);
            return -1;
        }
        *(int *)p = i;
        return 0;
    }
    case OPT_HELP:
        return 0;
    }
    return 0;
}

int opt_value(const opt_def *d, const char *what, const char *text, double *out, char *err, size_t errlen)
{
    /* parse into a scratch field of the option's type, so nothing is set */
    union {
        int i;
        int64_t l;
        uint64_t u;
        float f;
        const char *s;
    } v;
    opt_def scratch = *d;
    scratch.off = 0;
    if (d->type == OPT_STRS) scratch.type = OPT_STR;
    if (opt_set(&scratch, &v, what, text, err, errlen)) return -1;
    switch (d->type) {
    case OPT_INT:
    case OPT_CHOICE:
    case OPT_FLAG:
    case OPT_SET: *out = v.i; break;
    case OPT_I64: *out = (double)v.l; break;
    case OPT_U64: *out = (double)v.u; break;
    case OPT_FLOAT: *out = v.f; break;
    default: *out = 0; break;
    }
    return 0;
}

static const opt_def *find(const opt_group *groups, int n_groups, const char *a, const opt_group **g, size_t *nlen)
{
    for (int k = 0; k < n_groups; k++)
        for (const opt_def *d = groups[k].defs; d->name; d++) {
            const char *names[2] = { d->name, d->alias };
            for (int j = 0; j < 2; j++) {
                size_t l = names[j] ? strlen(names[j]) : 0;
                /* "--name value" or "--name=value" */
                if (l && !strncmp(a, names[j], l) && (a[l] == 0 || (a[l] == '=' && takes_value(d) && a[1] == '-'))) {
                    *g = &groups[k];
                    *nlen = l;
                    return d;
                }
            }
        }
    return NULL;
}

int opt_parse(int argc, char **argv, const opt_group *groups, int n_groups, const char **pos, int max_pos, int *n_pos,
              char *err, size_t errlen)
{
    int np = 0, only_pos = 0, help = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && !strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (!pos || np >= max_pos) {
                snprintf(err, errlen, "unexpected argument '%s'", a);
                return -1;
            }
            pos[np++] = a;
            continue;
        }
        const opt_group *g;
        size_t l;
        const opt_def *d = find(groups, n_groups, a, &g, &l);
        if (!d) {
            snprintf(err, errlen, "unknown option %s", a);
            return -1;
        }
        if (d->type == OPT_HELP) {
            help = 1;
            continue;
        }
        const char *v = NULL;
        if (takes_value(d)) {
            if (a[l] == '=') {
                v = a + l + 1;
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                snprintf(err, errlen, "option %s needs a value", a);
                return -1;
            }
        }
        if (opt_set(d, g->base, d->name, v, err, errlen)) return -1;
    }
    if (n_pos) *n_pos = np;
    return help ? OPT_WANT_HELP : 0;
}

const opt_def *opt_find_key(const opt_group *groups, int n_groups, const char *key, const opt_group **group)
{
    for (int k = 0; k < n_groups; k++)
        for (const opt_def *d = groups[k].defs; d->name; d++)
            if (d->key && !strcmp(d->key, key)) {
                if (group) *group = &groups[k];
                return d;
            }
    return NULL;
}

void opt_help(FILE *f, const char *usage, const char *about, const opt_group *groups, int n_groups)
{
    fprintf(f, "usage: %s\n", usage);
    if (about && *about) fprintf(f, "\n%s\n", about);
    for (int k = 0; k < n_groups; k++) {
        fprintf(f, "\n%s:\n", groups[k].title ? groups[k].title : "options");
        for (const opt_def *d = groups[k].defs; d->name; d++) {
            const opt_group *first;
            size_t l;
            if (find(groups, n_groups, d->name, &first, &l) != d) continue;   /* an earlier group's wins */
            char left[96];
            int n = snprintf(left, sizeof left, "  %s%s%s", d->alias ? d->alias : "", d->alias ? ", " : "", d->name);
            if (takes_value(d) && n > 0 && (size_t)n < sizeof left)
                snprintf(left + n, sizeof left - (size_t)n, " %s",
                         d->metavar ? d->metavar : d->type == OPT_CHOICE ? d->choices : "X");
            fprintf(f, "%-30s%s%s", left, strlen(left) >= 30 ? "\n                              " : "", d->help);
            if (d->type == OPT_STRS) fprintf(f, " (repeatable)");
            if (d->type == OPT_INT || d->type == OPT_I64 || d->type == OPT_U64)
                fprintf(f, " [%.0f..%.0f]", d->lo, d->hi);
            else if (d->type == OPT_FLOAT)
                fprintf(f, " [%g..%g]", d->lo, d->hi);
            fputc('\n', f);
        }
    }
}
