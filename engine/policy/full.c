/* full.c - the full cache: every decode step attends to every token (the reference policy). */
#include "engine/policy/policy.h"

#include <stdio.h>

static int full_create(void **st, const pol_env *env, const double *vals, char *err, size_t errlen)
{
    (void)env;
    (void)vals;
    (void)err;
    (void)errlen;
    *st = NULL;
    return 0;
}

static void full_destroy(void *st) { (void)st; }

static void full_describe(void *st, char *buf, size_t len)
{
    (void)st;
    snprintf(buf, len, "full: every page");
}

const pol_ops pol_full = {
    .name = "full",
    .summary = "attend to the whole cache",
    .stage = POL_STAGE_DECODE,
    .create = full_create,
    .destroy = full_destroy,
    .describe = full_describe,
};
