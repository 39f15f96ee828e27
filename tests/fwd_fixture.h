/* fwd_fixture.h - what the forward-pass tests share (tests/test_residency.c, test_policy.c,
 * test_uncertainty.c, test_attn_lists.c). */
#ifndef KVCHAT_TESTS_FWD_FIXTURE_H
#define KVCHAT_TESTS_FWD_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/model.h"
#include "engine/policy/policy.h"

/* The policy set of spec made for f, asserted; fwd_fixture_policy also sets it on f (NULL spec:
 * none, NULL). */
pol_set *fwd_fixture_policy_make(fwd_ctx *f, const char *spec);
pol_set *fwd_fixture_policy(fwd_ctx *f, const char *spec);
/* The tokens of a prompt file (with m's BOS when it adds one), asserted; *n their count. */
int32_t *fwd_fixture_prompt(const model *m, const char *path, size_t *n);

#endif
