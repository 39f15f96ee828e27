/* test_cli_gpu_scripts.c - the scripts that prove the CUDA backend on a lent GPU, run here without
 * one: scripts/gpu-figures.sh turns kvchat bench's rows into figures.csv and divides each by the
 * peer's figure of the same name; scripts/gpu-check.sh on a machine without a GPU records every step
 * (figures.csv, summary.md), skips the model steps that would only spend its budget on the CPU, and
 * exits 1; a payload (gpu-pack.sh's compressed binaries) that does not unpack is recorded. Runs
 * from the repository root, with ./kvchat or $KVCHAT_BIN. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TD "../shared/testdata/"

static const char *bin(void)
{
    const char *b = getenv("KVCHAT_BIN");
    return b && *b ? b : "./kvchat";
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

static int sh(const char *cmd)
{
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "%s did not exit normally", cmd);
    return WEXITSTATUS(st);
}

/* One row of figures.csv: "step","what","config",value,"unit" (value bare or quoted). */
typedef struct fig_row {
    char step[128], what[128], config[128], value[128], unit[32];
} fig_row;

static int parse_row(const char *line, fig_row *r)
{
    char *fields[5] = { r->step, r->what, r->config, r->value, r->unit };
    size_t caps[5] = { sizeof r->step, sizeof r->what, sizeof r->config, sizeof r->value, sizeof r->unit };
    const char *p = line;
    for (int i = 0; i < 5; i++) {
        size_t n = 0;
        if (*p == '"') {
            for (p++; *p && !(*p == '"' && p[1] != '"'); p++) {
                if (*p == '"') p++;   /* a doubled quote */
                if (n + 1 < caps[i]) fields[i][n++] = *p;
            }
            if (*p != '"') return -1;
            p++;
        } else {
            for (; *p && *p != ',' && *p != '\n'; p++)
                if (n + 1 < caps[i]) fields[i][n++] = *p;
        }
        fields[i][n] = 0;
        if (i < 4 && *p++ != ',') return -1;
    }
    return *p == '\n' || *p == 0 ? 0 : -1;
}

/* Every line of a figures.csv after its header, parsed; asserts each has the five fields. */
static int read_figures(const char *path, fig_row *rows, int cap)
{
    char *s = slurp(path);
    cr_assert(!strncmp(s, "step,what,config,value,unit\n", 28), "%s: header is %.60s", path, s);
    int n = 0;
    for (char *l = strchr(s, '\n') + 1; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        cr_assert(n < cap);
        cr_assert(!parse_row(l, &rows[n]), "%s: not five CSV fields: %.200s", path, l);
        n++;
    }
    free(s);
    return n;
}

static const fig_row *find(const fig_row *rows, int n, const char *step, const char *what, const char *config)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].step, step) && !strcmp(rows[i].what, what) && (!config || !strcmp(rows[i].config, config)))
            return &rows[i];
    return NULL;
}

Test(gpu_scripts, figures_divide_kvchat_by_the_peers_figure_of_the_same_name)
{
    char dir[] = "/tmp/kvchat-gpufig-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256], cmd[2048];
    /* kvchat bench rows at depths the peer measured and one it did not (1024); the machine field is
     * quoted and holds a comma */
    const int depths[] = { 512, 1024, 2048, 8192 };
    double prefill[4], decode[4];
    srand((unsigned)getpid());
    snprintf(path, sizeof path, "%s/bench.csv", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "date,commit,machine,threads,model,depth,prefill_tok_s,decode_tok_s,n_gen\n");
    for (int i = 0; i < 4; i++) {
        prefill[i] = 1000.0 + rand() % 50000 + 0.25;
        decode[i] = 10.0 + rand() % 900 + 0.5;
        fprintf(f, "2026-11-27T01:00:07Z,abc1234,\"Xeon, 16 cores + cuda\",16,gemma3-270m-q4_k_m.gguf,%d,%.2f,%.2f,32\n",
                depths[i], prefill[i], decode[i]);
    }
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "bash scripts/gpu-figures.sh header >%s/f.csv && "
             "bash scripts/gpu-figures.sh bench 'bench cuda' 'cuda KVCHAT_CUDA_MMV=0' %s >>%s/f.csv && "
             "bash scripts/gpu-figures.sh compare %s/f.csv >%s/t.md",
             dir, path, dir, dir, dir);
    cr_assert_eq(sh(cmd), 0);

    static fig_row rows[256];
    snprintf(path, sizeof path, "%s/f.csv", dir);
    int n = read_figures(path, rows, 256);
    snprintf(path, sizeof path, "%s/t.md", dir);
    char *table = slurp(path);
    int ratios = 0, expected = 0;
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++) {
            char what[128];
            snprintf(what, sizeof what, "gemma3-270m-q4_k_m %s %d", k ? "decode at" : "prefill", depths[i]);
            double mine = k ? decode[i] : prefill[i];
            const fig_row *own = find(rows, n, "bench cuda", what, "cuda KVCHAT_CUDA_MMV=0");
            cr_assert(own, "no figure for %s", what);
            cr_expect(fabs(atof(own->value) - mine) < 0.01, "%s: %s, wrote %.2f", what, own->value, mine);
            cr_expect_str_eq(own->unit, "tok/s");
            const fig_row *peer = find(rows, n, "peer", what, NULL);
            const fig_row *ratio = find(rows, n, "kvchat / peer", what, "cuda KVCHAT_CUDA_MMV=0");
            if (!peer) {   /* a figure the peer did not measure gets no ratio */
                cr_expect(!ratio, "%s: a ratio without a peer figure", what);
                continue;
            }
            expected++;
            cr_assert(ratio, "%s: no kvchat / peer row", what);
            ratios++;
            double want = mine / atof(peer->value);
            cr_expect(fabs(atof(ratio->value) - want) <= 6e-4, "%s: ratio %s, want %.4f", what, ratio->value, want);
            char line[1024];
            snprintf(line, sizeof line, "| %s | cuda KVCHAT_CUDA_MMV=0 | %.2f | %s | %s |", what, mine, peer->value,
                     ratio->value);
            cr_expect(strstr(table, line), "the table lacks: %s\n%s", line, table);
        }
    cr_expect(expected > 0 && ratios == expected, "%d ratios for %d figures the peer has", ratios, expected);
    cr_expect(!find(rows, n, "peer", "gemma3-270m-q4_k_m prefill 1024", NULL), "the peer never measured depth 1024");
    free(table);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
}

Test(gpu_scripts, figures_refuses_a_missing_file_in_one_line)
{
    char dir[] = "/tmp/kvchat-gpufig-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[512], path[256];
    snprintf(cmd, sizeof cmd, "bash scripts/gpu-figures.sh bench s c %s/none.csv >%s/out 2>%s/err", dir, dir, dir);
    cr_expect_eq(sh(cmd), 1);
    snprintf(path, sizeof path, "%s/err", dir);
    char *err = slurp(path);
    cr_expect(strstr(err, "cannot read") && strstr(err, "none.csv") && strchr(err, '\n') == err + strlen(err) - 1,
              "stderr: %s", err);
    free(err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
}

/* A pack as gpu-pack.sh lays it out in DIR/pack: the scripts, the tiny models, the vocabularies,
 * and the CPU build's kvchat with the default model's vocabulary (any vocabulary serves) in
 * payload.tar.gz (without the CUDA test binaries), or, when !good, a payload that is not a tar.gz.
 * The vocabularies are there, so only the missing GPU keeps the model steps away. */
static void make_pack(const char *dir, int good)
{
    char kv[PATH_MAX], td[PATH_MAX], cmd[32768];
    cr_assert(realpath(bin(), kv), "no %s", bin());
    cr_assert(realpath(TD, td));
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/pack/testdata/vocab %s/stage && cp scripts/gpu-check.sh scripts/gpu-figures.sh %s/pack/ && "
             "ln -s %s/tiny %s/pack/testdata/tiny && ln -s %s/vocab/llama-spm.gguf %s/pack/testdata/vocab/ && "
             "cp %s %s/stage/kvchat && cp %s/vocab/llama-spm.gguf %s/stage/gemma-vocab.gguf && "
             "tar -C %s/stage -czf %s/pack/payload.tar.gz . && rm -r %s/stage && echo abc1234 >%s/pack/COMMIT",
             dir, dir, dir, td, dir, td, dir, kv, dir, td, dir, dir, dir, dir, dir);
    cr_assert_eq(sh(cmd), 0);
    if (!good) {
        snprintf(cmd, sizeof cmd, "echo not a tar >%s/pack/payload.tar.gz", dir);
        cr_assert_eq(sh(cmd), 0);
    }
}

static int run_check(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "GPU_CHECK_BUDGET=120 bash %s/pack/gpu-check.sh %s/out >%s/stdout 2>%s/stderr", dir, dir,
             dir, dir);
    return sh(cmd);
}

/* gpu-check.sh without a GPU on a fresh pack in a new folder dir (a payload that unpacks or not):
 * it must fail; the figures it wrote go to rows, their count is returned. */
static int check_without_gpu(char *dir, int good_payload, fig_row *rows, int cap)
{
    cr_assert(mkdtemp(dir));
    make_pack(dir, good_payload);
    cr_expect_eq(run_check(dir), 1, "a check without a GPU must fail");
    char path[256];
    snprintf(path, sizeof path, "%s/out/figures.csv", dir);
    return read_figures(path, rows, cap);
}

Test(gpu_scripts, check_without_a_gpu_records_each_step_skips_the_models_and_fails)
{
    if (system("nvidia-smi -L >/dev/null 2>&1") == 0) cr_skip("a GPU is here: gpu-check.sh would run for minutes");
    char dir[] = "/tmp/kvchat-gpucheck-XXXXXX", cmd[512], path[256];
    static fig_row rows[256];
    int n = check_without_gpu(dir, 1, rows, 256);
    const fig_row *r = find(rows, n, "nvidia-smi", "GPU", NULL);
    cr_expect(r && !strcmp(r->value, "none"), "nvidia-smi's row: %s", r ? r->value : "(none)");
    cr_expect(!find(rows, n, "payload", "result", NULL), "the payload did unpack");
    r = find(rows, n, "kvchat starts", "result", NULL);   /* the payload's kvchat */
    cr_expect(r && !strcmp(r->value, "passed"), "kvchat starts: %s", r ? r->value : "(no row)");
    const char *gpu_steps[] = { "gpu_tests", "gpu_bench" };
    for (int i = 0; i < 2; i++) {
        r = find(rows, n, gpu_steps[i], "result", NULL);
        cr_expect(r && !strncmp(r->value, "failed", 6), "%s: %s", gpu_steps[i], r ? r->value : "(no row)");
        cr_expect(find(rows, n, gpu_steps[i], "seconds", NULL), "%s: no seconds", gpu_steps[i]);
    }
    for (int i = 0; i < n; i++) cr_expect(!strstr(rows[i].step, "gen-model") && !strstr(rows[i].step, "bench "),
                                          "a model step ran without a GPU: %s", rows[i].step);
    cr_expect(find(rows, n, "peer", "mistral-7b-f16 decode at 512", NULL), "the peer's figures are missing");

    snprintf(path, sizeof path, "%s/out/summary.md", dir);
    char *summary = slurp(path);
    cr_expect(strstr(summary, "Pack: abc1234"), "%s", summary);
    cr_expect(strstr(summary, "- no GPU: skipped"), "%s", summary);
    cr_expect(strstr(summary, "**gpu_tests**: FAILED"), "%s", summary);
    cr_expect(strstr(summary, "| figure | kvchat config |"), "%s", summary);
    cr_expect(strstr(summary, "step(s) failed, timed out or skipped."), "%s", summary);
    free(summary);
    snprintf(cmd, sizeof cmd, "test -s %s/out/log.txt", dir);
    cr_expect_eq(sh(cmd), 0, "log.txt is empty");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
}

Test(gpu_scripts, check_records_a_payload_that_does_not_unpack)
{
    if (system("nvidia-smi -L >/dev/null 2>&1") == 0) cr_skip("a GPU is here: gpu-check.sh would run for minutes");
    char dir[] = "/tmp/kvchat-gpucheck-XXXXXX", cmd[512], path[256];
    static fig_row rows[256];
    int n = check_without_gpu(dir, 0, rows, 256);
    const fig_row *r = find(rows, n, "payload", "result", NULL);
    cr_expect(r && !strcmp(r->value, "failed"), "payload: %s", r ? r->value : "(no row)");
    r = find(rows, n, "kvchat starts", "result", NULL);
    cr_expect(r && strcmp(r->value, "passed"), "kvchat started from a payload that did not unpack");
    snprintf(path, sizeof path, "%s/out/summary.md", dir);
    char *summary = slurp(path);
    cr_expect(strstr(summary, "- the pack's payload did not unpack: "), "%s", summary);
    free(summary);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
}

/* Stand-ins for nvcc (always there) and nvidia-smi in dir: `nvidia-smi -L` prints list and exits
 * status; `nvidia-smi --query-gpu=compute_cap ...` prints cc (when not NULL). */
static void stand_in_gpu_tools(const char *dir, const char *list, int status, const char *cc)
{
    char path[512], cmd[1024];
    snprintf(path, sizeof path, "%s/nvidia-smi", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "#!/bin/sh\ncase \"$1\" in\n-L) printf '%s'; exit %d ;;\n", list, status);
    if (cc) fprintf(f, "--query-gpu=compute_cap) printf '%s\\n' ;;\n", cc);
    fprintf(f, "*) exit 6 ;;\nesac\n");
    fclose(f);
    snprintf(path, sizeof path, "%s/nvcc", dir);
    f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "#!/bin/sh\nexit 0\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "chmod +x %s/nvidia-smi %s/nvcc", dir, dir);
    cr_assert_eq(sh(cmd), 0);
}

/* scripts/run-device.sh (make run's choice) with the stand-ins first on PATH and env before it:
 * its standard output in out (one word), its standard error in err. The exit status. */
static int run_device(const char *dir, const char *env, const char *nvcc, char *out, size_t out_cap, char *err,
                      size_t err_cap)
{
    char path[512], cmd[2048];
    snprintf(cmd, sizeof cmd, "env -u CUDA_VISIBLE_DEVICES %s PATH=%s:/usr/bin:/bin scripts/run-device.sh %s >%s/out "
             "2>%s/err", env, dir, nvcc, dir, dir);
    int rc = sh(cmd);
    snprintf(path, sizeof path, "%s/out", dir);
    char *s = slurp(path);
    snprintf(out, out_cap, "%s", s);
    free(s);
    snprintf(path, sizeof path, "%s/err", dir);
    s = slurp(path);
    snprintf(err, err_cap, "%s", s);
    free(s);
    return rc;
}

#define H200 "GPU 0: NVIDIA H200 (UUID: GPU-0b4c1d2e-aaaa-bbbb-cccc-0123456789ab)\\nGPU 1: NVIDIA H200 (UUID: GPU-1)\\n"

Test(gpu_scripts, make_run_takes_the_cuda_build_only_with_nvcc_and_a_gpu_it_can_run)
{
    char dir[] = "/tmp/kvchat-rundev-XXXXXX", out[256], err[1024], cmd[512];
    cr_assert(mkdtemp(dir));
    /* nvcc and a GPU: the CUDA build, and a line naming the first GPU */
    stand_in_gpu_tools(dir, H200, 0, "9.0");
    cr_expect_eq(run_device(dir, "", "nvcc", out, sizeof out, err, sizeof err), 0);
    cr_expect_str_eq(out, "cuda\n");
    cr_expect(strstr(err, "make run: NVIDIA H200 and nvcc found: the CUDA build") && !strstr(err, "UUID") &&
                  !strstr(err, "GPU 1"), "stderr: %s", err);
    /* a driver that cannot say the compute capability: nothing assumed */
    stand_in_gpu_tools(dir, H200, 0, NULL);
    cr_expect_eq(run_device(dir, "", "nvcc", out, sizeof out, err, sizeof err), 0);
    cr_expect_str_eq(out, "cuda\n");
    /* a GPU without the compiler: the CPU build, and what is missing */
    cr_expect_eq(run_device(dir, "", "kvchat-test-no-such-nvcc", out, sizeof out, err, sizeof err), 0);
    cr_expect_str_eq(out, "cpu\n");
    cr_expect(strstr(err, "NVIDIA H200 is present but kvchat-test-no-such-nvcc is not installed"), "stderr: %s", err);
    /* GPUs hidden by CUDA_VISIBLE_DEVICES; one left visible */
    const char *hidden[] = { "CUDA_VISIBLE_DEVICES=", "CUDA_VISIBLE_DEVICES=-1", "CUDA_VISIBLE_DEVICES=-1,0" };
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(run_device(dir, hidden[i], "nvcc", out, sizeof out, err, sizeof err), 0);
        cr_expect_str_eq(out, "cpu\n", "%s", hidden[i]);
        cr_expect(strstr(err, "hides NVIDIA H200: the CPU build"), "%s: stderr: %s", hidden[i], err);
    }
    cr_expect_eq(run_device(dir, "CUDA_VISIBLE_DEVICES=1", "nvcc", out, sizeof out, err, sizeof err), 0);
    cr_expect_str_eq(out, "cuda\n");
    /* a GPU older than the build's code (sm_80): the CPU build, and why */
    stand_in_gpu_tools(dir, "GPU 0: Tesla T4 (UUID: GPU-3)\\n", 0, "7.5");
    cr_expect_eq(run_device(dir, "", "nvcc", out, sizeof out, err, sizeof err), 0);
    cr_expect_str_eq(out, "cpu\n");
    cr_expect(strstr(err, "Tesla T4 has compute capability 7.5, older than the CUDA build's 8.0"), "stderr: %s", err);
    /* the compiler without a GPU (nvidia-smi fails as it does without a driver): the CPU build, quietly */
    stand_in_gpu_tools(dir, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\\n", 9, NULL);
    cr_expect_eq(run_device(dir, "", "nvcc", out, sizeof out, err, sizeof err), 0);
    cr_expect_str_eq(out, "cpu\n");
    cr_expect_str_eq(err, "");
    /* the driver's text reaches the terminal escaped: no control bytes */
    stand_in_gpu_tools(dir, "GPU 0: Odd\\033[2J\\033]0;x\\007 (UUID: GPU-2)\\n", 0, "8.6");
    cr_expect_eq(run_device(dir, "", "nvcc", out, sizeof out, err, sizeof err), 0);
    cr_expect_str_eq(out, "cuda\n");
    cr_expect(strstr(err, "make run: Odd?[2J?]0;x? and nvcc found"), "stderr: %s", err);
    for (const char *p = err; *p; p++) cr_expect(*p == '\n' || (*p >= 0x20 && *p < 0x7f), "byte %d in stderr", *p);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
}

/* `make -n run` runs nothing (a recipe line naming $(MAKE) would run even under -n) and says what
 * make run would run: the CUDA build with nvcc and a GPU, ./kvchat without a GPU or with CUDA=0. */
Test(gpu_scripts, make_n_run_says_which_build_it_would_run_and_runs_nothing)
{
    char dir[] = "/tmp/kvchat-makerun-XXXXXX", path[256], cmd[1024];
    cr_assert(mkdtemp(dir));
    const struct {
        const char *list, *vars, *runs;
    } cases[] = {
        { H200, "", "make run would run build-cuda/kvchat --version" },
        { H200, "CUDA=0", "make run would run ./kvchat --version" },
        { "", "", "make run would run ./kvchat --version" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        stand_in_gpu_tools(dir, cases[i].list, 0, "9.0");
        snprintf(cmd, sizeof cmd, "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CUDA_VISIBLE_DEVICES PATH=%s:/usr/bin:/bin "
                 "make -n run ARGS=--version %s >%s/out 2>&1", dir, cases[i].vars, dir);
        cr_expect_eq(sh(cmd), 0, "%s", cmd);
        snprintf(path, sizeof path, "%s/out", dir);
        char *out = slurp(path);
        cr_expect(strstr(out, cases[i].runs), "case %zu: %s", i, out);
        for (const char *l = out; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)   /* its version line */
            cr_expect(strncmp(l, "kvchat ", 7), "case %zu: kvchat ran: %s", i, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
}
