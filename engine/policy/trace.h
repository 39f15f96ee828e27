/* trace.h - what the policies decided about chosen positions (a needle), for finding out why a
 * method kept or lost it (`kvchat ask --trace TEXT`, docs/policies.md "Tracing a decision").
 *
 * Off unless pol_set_trace turned it on: a policy then sees env->trace != NULL and reports each
 * decision over its units (tokens, segments, pages, chunks, grids, merge links): every unit's score,
 * whether it was kept, and the positions it covers. The trace keeps one line per decision that
 * touches the traced positions: the unit count, how many were kept, the lowest kept score, the best
 * dropped score, and each traced unit's score, rank (1 = best; ties counted) and fate. Text only:
 * the caller prints it. */
#ifndef KVCHAT_POL_TRACE_H
#define KVCHAT_POL_TRACE_H

#include <stdint.h>

typedef struct pol_trace pol_trace;

/* Trace the positions [lo, hi). NULL when out of memory. */
pol_trace *pol_trace_create(int64_t lo, int64_t hi);
void pol_trace_free(pol_trace *t);
/* Where the next decisions happen ("prefill chunk 0+512", "decode pos 4013"); the runtime sets it. */
void pol_trace_at(pol_trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Everything traced so far, one decision a line ("" when nothing touched the positions). */
const char *pol_trace_text(const pol_trace *t);

/* For the policies. 1 when [first, last] meets the traced positions. */
int pol_trace_covers(const pol_trace *t, int64_t first, int64_t last);
/* A decision over n units: unit u has score[u], was kept when kept[u] != 0 and covers positions
 * first[u] .. last[u]. what names the policy's step ("sentkv segments"); il and g the layer and KV
 * head (-1: all). Recorded only when some unit covers a traced position. */
void pol_trace_units(pol_trace *t, const char *what, int il, int g, int64_t n, const float *score,
                     const unsigned char *kept, const int64_t *first, const int64_t *last);
/* The same with one position per unit (token units). */
void pol_trace_tokens(pol_trace *t, const char *what, int il, int g, int64_t n, const float *score,
                      const unsigned char *kept, const int32_t *pos);
/* A free line (a merge, a probe's placement). */
void pol_trace_note(pol_trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
