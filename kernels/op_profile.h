/* op_profile.h - where a run's time goes, op by op (issue 25: finding what a GPU step spends).
 *
 * A profiled backend stands in front of any other: every op it is asked goes to the backend behind
 * it, and the profile counts the calls, the wall time spent inside the op and the device traffic
 * the op caused (be_ops.counters: waits, bytes up, bytes down; behind a CUDA backend also the
 * calls into its runtime an op makes on average, be_cuda_runtime_calls, the last column, absent
 * for other backends). Products and attention are counted
 * apart for one token (a decode step) and for several (a prefill chunk). The window runs from the
 * first op after loading (prepare, the weights' upload, and the warm-up are reported apart) to the
 * last; the time in it between ops is everything else the program did: the engine's own host work
 * (the forward pass's bookkeeping, the policies, the sampler, the cache), and in an interactive
 * command its waits for the user.
 *
 * Two modes. OP_PROFILE_HOST: each op's time is what it costs the host (launches, staging, its
 * waits), while a device runs behind; an op that waits absorbs the device's backlog. OP_PROFILE_SYNC:
 * after each op the profile waits for the device (be_ops.finish), so an op's time is its host and
 * device time together; the run is slower, the split is exact. The CPU backend's ops are the same in
 * both.
 *
 * be_create wraps its backend when KVCHAT_PROFILE is 1 (host) or sync (0 or empty: off), and the
 * report goes to standard error when the backend is destroyed. */
#ifndef KVCHAT_OP_PROFILE_H
#define KVCHAT_OP_PROFILE_H

#include <stdio.h>

#include "kernels/backend.h"

enum { OP_PROFILE_HOST = 1, OP_PROFILE_SYNC = 2 };

/* A backend that profiles inner's ops in the mode given and owns inner (destroying it destroys
 * inner, after writing the report to `report`, or to nothing when report is NULL). NULL when out of
 * memory (inner is then left to the caller). */
be_backend *op_profile_wrap(be_backend *inner, int mode, FILE *report);

/* The mode KVCHAT_PROFILE asks for: 0 (unset, empty or "0"), OP_PROFILE_HOST ("1"),
 * OP_PROFILE_SYNC ("sync"), or -1 for any other value. */
int op_profile_mode_from_env(void);

/* While on, b's ops are loading's (be_warming_up): each one's time goes to the report's "warm-up"
 * row, which like prepare is outside the window, and to no other row. Nothing when b is not a
 * backend op_profile_wrap made. */
void op_profile_set_warming_up(be_backend *b, int on);

/* b (made by op_profile_wrap) writes no report when destroyed: a backend given up before the run
 * (--device auto leaving a GPU that failed to get ready) is not the run's. Nothing for any other
 * backend. */
void op_profile_discard(be_backend *b);

/* The backend behind b when op_profile_wrap made b; b itself otherwise. */
be_backend *op_profile_inner(be_backend *b);

/* The profile so far of a backend op_profile_wrap made, written to f (the report). */
void op_profile_write(be_backend *b, FILE *f);
/* The same report as a string (the caller frees it); NULL when out of memory. */
char *op_profile_text(be_backend *b);

/* Calls, and seconds inside them, of one row of the report by its name ("matmul 1 token"), for
 * tests. 0 when no such row or no calls. */
long op_profile_calls(be_backend *b, const char *row, double *seconds);

#endif
