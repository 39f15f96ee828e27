/* options.h - table-driven option parsing: each command describes its options once (name, type,
 * range, default, help) and the same table parses the command line, prints `--help`, and validates
 * the settings file's values, so a value is accepted or refused the same way everywhere.
 *
 * A table entry names a field by its offset in an options struct; a command parses with one or more
 * groups (a table and the struct it fills), e.g. the model options every command shares, then its
 * own. Errors are one line ("--threads: '0' is not an integer in [1, 256]"); nothing is printed here. */
#ifndef KVCHAT_OPTIONS_H
#define KVCHAT_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    OPT_FLAG,       /* int = 1 */
    OPT_SET,        /* int = def.set (e.g. --chat and --plain writing one field) */
    OPT_INT,        /* int, in [lo, hi] */
    OPT_I64,        /* int64_t, in [lo, hi] */
    OPT_U64,        /* uint64_t, in [lo, hi] */
    OPT_FLOAT,      /* float, in [lo, hi] */
    OPT_STR,        /* const char * (points into argv) */
    OPT_STRS,       /* opt_strs: each use adds one (points into argv), at most OPT_STRS_MAX */
    OPT_CHOICE,     /* int: the index of the value in choices ("cpu|cuda") */
    OPT_HELP,       /* -h/--help: opt_parse returns OPT_WANT_HELP */
} opt_type;

#define OPT_STRS_MAX 8
typedef struct opt_strs {
    const char *v[OPT_STRS_MAX];
    int n;
} opt_strs;

typedef struct opt_def {
    const char *name;        /* "--threads" */
    const char *alias;       /* "-t", or NULL */
    opt_type type;
    size_t off;              /* offset of the field in the group's struct */
    double lo, hi;           /* the range of a number */
    const char *choices;     /* OPT_CHOICE: "a|b|c" */
    int set;                 /* OPT_SET: the value written */
    const char *metavar;     /* what the value is called in the help ("N", "FILE") */
    const char *help;        /* one line; "(default ...)" is part of it where there is one */
    const char *key;         /* the settings file's name for it, or NULL */
} opt_def;

#define OPT_END { NULL, NULL, OPT_FLAG, 0, 0, 0, NULL, 0, NULL, NULL, NULL }

typedef struct opt_group {
    const opt_def *defs;     /* ends with OPT_END */
    void *base;              /* the struct the offsets point into */
    const char *title;       /* a heading in the help, or NULL */
} opt_group;

enum { OPT_WANT_HELP = 1 };

/* Parse argv[1..argc) against groups; a name two groups define belongs to the earlier group. Arguments that are no option go to pos (at most max_pos;
 * pos may be NULL when a command takes none), in order; "--" ends the options. 0, OPT_WANT_HELP
 * when -h/--help was given, or -1 with a message in err. */
int opt_parse(int argc, char **argv, const opt_group *groups, int n_groups, const char **pos, int max_pos, int *n_pos,
              char *err, size_t errlen);
/* Set the option def in base from text (a command-line value or a settings-file value); flags take
 * "on|off|1|0|true|false". 0, or -1 with a message naming what (e.g. "--temp"). */
int opt_set(const opt_def *def, void *base, const char *what, const char *text, char *err, size_t errlen);
/* Check text as a value of def the way opt_set would, setting nothing; a number's value goes to
 * *out (0 for text). 0, or -1 with the message opt_set gives. */
int opt_value(const opt_def *def, const char *what, const char *text, double *out, char *err, size_t errlen);
/* The option with this settings-file key, or NULL (*group gets its group). */
const opt_def *opt_find_key(const opt_group *groups, int n_groups, const char *key, const opt_group **group);
/* The help: usage line, description, then every option of every group. */
void opt_help(FILE *f, const char *usage, const char *about, const opt_group *groups, int n_groups);

#endif
