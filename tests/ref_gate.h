/* ref_gate.h - the correctness gates of the forward pass against the reference outputs in
 * TESTDATA/tiny/ref (rules in ../shared/testdata/README.md), on any backend: the CPU unit tests
 * (tests/test_ref_tiny.c) and the GPU tests (tests/gpu/test_cuda.c) run the same checker. Reports
 * failures through Criterion, so only tests link it. */
#ifndef KVCHAT_REF_GATE_H
#define KVCHAT_REF_GATE_H

#include "kernels/backend.h"

/* Top-logit tolerances relative to max(1, |logit|), as the README gives them. */
#define REF_GATE_F16_TOL 5e-3f
#define REF_GATE_Q_TOL 3e-2f

typedef struct ref_gate_result {
    double worst;          /* largest relative top-logit difference over positions and steps */
    int ties_skipped;      /* top-1 mismatches excused as genuine ties of the reference */
    double last_max_abs;   /* max |diff| of the full logit vector after the prompt */
} ref_gate_result;

/* Model model_name (TESTDATA/tiny/NAME.gguf) on prompt (TESTDATA/prompts/PROMPT.txt) through backend
 * b: prompt ids identical, then at every position and at each of the 32 teacher-forced greedy steps
 * the top-1 identical except genuine ties and the top logit within tol. note is appended to the
 * label of messages (""); the result is logged with cr_log_info and stored in *out when not NULL. */
void ref_gate_run(be_backend *b, const char *testdata, const char *model_name, const char *prompt, float tol,
                  const char *note, ref_gate_result *out);

#endif
