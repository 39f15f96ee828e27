/* test_ref_tiny.c - correctness gates of the forward pass on the CPU backend against the reference
 * outputs in ../shared/testdata/tiny/ref (every model x prompt), with the checker of ref_gate.c:
 * prompt ids identical; with the reference's greedy ids fed back, top-1 identical at every position
 * and step except genuine ties, and the top logit within 5e-3 (F16) or 3e-2 (quantized) relative to
 * max(1, |logit|). */
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/backend.h"
#include "tests/ref_gate.h"
#include "kernels/cpu/vec_dot.h"

#define TD "../shared/testdata"

static void run_ref(const char *model_name, const char *prompt, float tol, int threads, int scalar)
{
    char err[512];
    vd_force_scalar(scalar);
    be_backend *b = be_cpu_create(threads, err, sizeof err);
    cr_assert(b, "%s", err);
    char note[64];
    snprintf(note, sizeof note, "%s%s", scalar ? " (scalar)" : "", threads > 1 ? " (threads)" : "");
    ref_gate_run(b, TD, model_name, prompt, tol, note, NULL);
    be_free(b);
    vd_force_scalar(0);
}

#define F16_TOL REF_GATE_F16_TOL
#define Q_TOL REF_GATE_Q_TOL

Test(ref_tiny, llama_f16_p1) { run_ref("tiny-llama-f16", "p1", F16_TOL, 1, 0); }
Test(ref_tiny, llama_f16_p2) { run_ref("tiny-llama-f16", "p2", F16_TOL, 1, 0); }
Test(ref_tiny, llama_f16_p3) { run_ref("tiny-llama-f16", "p3", F16_TOL, 1, 0); }
Test(ref_tiny, llama_q4km_p1) { run_ref("tiny-llama-q4_k_m", "p1", Q_TOL, 1, 0); }
Test(ref_tiny, llama_q4km_p2) { run_ref("tiny-llama-q4_k_m", "p2", Q_TOL, 1, 0); }
Test(ref_tiny, llama_q4km_p3) { run_ref("tiny-llama-q4_k_m", "p3", Q_TOL, 1, 0); }
Test(ref_tiny, gemma3_f16_p1) { run_ref("tiny-gemma3-f16", "p1", F16_TOL, 1, 0); }
Test(ref_tiny, gemma3_f16_p2) { run_ref("tiny-gemma3-f16", "p2", F16_TOL, 1, 0); }
Test(ref_tiny, gemma3_f16_p3) { run_ref("tiny-gemma3-f16", "p3", F16_TOL, 1, 0); }
Test(ref_tiny, gemma3_q4km_p1) { run_ref("tiny-gemma3-q4_k_m", "p1", Q_TOL, 1, 0); }
Test(ref_tiny, gemma3_q4km_p2) { run_ref("tiny-gemma3-q4_k_m", "p2", Q_TOL, 1, 0); }
Test(ref_tiny, gemma3_q4km_p3) { run_ref("tiny-gemma3-q4_k_m", "p3", Q_TOL, 1, 0); }
/* The portable kernels and the threaded paths must meet the same gates. */
Test(ref_tiny, gemma3_q4km_p2_scalar_kernels) { run_ref("tiny-gemma3-q4_k_m", "p2", Q_TOL, 1, 1); }
Test(ref_tiny, llama_q4km_p2_two_threads) { run_ref("tiny-llama-q4_k_m", "p2", Q_TOL, 2, 0); }
