/* cmd_bench.c - `kvchat bench`: prefill speed at several prompt lengths and decode speed at those
 * depths, printed as a table and appended to a CSV with the commit, machine and thread count.
 * A benchmark, not a test: it asserts nothing. Token ids are a fixed pseudo-random sequence, since
 * speed does not depend on what the tokens say. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "commands.h"
#include "tokenizer.h"
#include "vec_dot.h"

static void read_cmd(const char *cmd, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (fgets(buf, (int)cap, p)) buf[strcspn(buf, "\n")] = 0;
    pclose(p);
}

static void cpu_name(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, cap, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

int cmd_bench(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o);
    const char *depths_arg = "512,2048,8192";
    const char *csv = "bench/results.csv";
    int64_t n_gen = 32;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_common(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--depths")) {
            if (!(depths_arg = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--gen")) {
            const char *v = cli_need_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 4096, &n_gen)) return 1;
        } else if (!strcmp(a, "--csv")) {
            if (!(csv = cli_need_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--no-csv")) {
            csv = NULL;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs("usage: kvchat bench [-m MODEL] [--depths 512,2048,8192] [--gen N] [--threads T] [--batch N]\n"
                  "                    [--csv FILE | --no-csv]\n",
                  stderr);
            return 0;
        } else {
            cli_err("bench: unknown option %s", a);
            return 1;
        }
    }
    int64_t depths[16];
    int nd = 0;
    for (const char *p = depths_arg; *p && nd < 16;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 22)) {
            cli_err("bench: --depths: bad list '%s'", depths_arg);
            return 1;
        }
        depths[nd++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            cli_err("bench: --depths: bad list '%s'", depths_arg);
            return 1;
        }
    }
    int64_t maxd = 0;
    for (int i = 0; i < nd; i++)
        if (depths[i] > maxd) maxd = depths[i];
    if (o.n_ctx <= 0) o.n_ctx = maxd + n_gen;
    cli_runtime rt;
    if (cli_open(&rt, &o, 1) != 0) return 1;
    if (maxd + n_gen > fwd_n_ctx(rt.f)) {
        cli_err("bench: depth %lld + %lld generated tokens exceed the context %lld", (long long)maxd, (long long)n_gen,
                (long long)fwd_n_ctx(rt.f));
        cli_close(&rt);
        return 1;
    }
    int32_t nv = rt.m->hp.n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)maxd);
    float *logits = malloc(sizeof(float) * (size_t)nv);
    if (!toks || !logits) {
        cli_err("bench: out of memory");
        free(toks);
        free(logits);
        cli_close(&rt);
        return 1;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    toks[0] = tok_bos(rt.m->vocab) >= 0 ? tok_bos(rt.m->vocab) : 1;
    for (int64_t i = 1; i < maxd; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(300 + (x >> 33) % (uint64_t)(nv - 600));
    }
    char commit[64], machine[256], date[32];
    read_cmd("git rev-parse --short HEAD 2>/dev/null", commit, sizeof commit);
    if (!commit[0]) snprintf(commit, sizeof commit, "unknown");
    cpu_name(machine, sizeof machine);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    const char *base = strrchr(rt.m->path, '/') ? strrchr(rt.m->path, '/') + 1 : rt.m->path;
    printf("kvchat bench: %s, %d threads, %s kernels, batch %d, commit %s\n", base, rt.b->n_threads,
           vd_simd_active() ? "AVX2" : "scalar", o.n_batch > 0 ? o.n_batch : 512, commit);
    printf("%8s %14s %14s\n", "depth", "prefill tok/s", "decode tok/s");
    FILE *out = NULL;
    if (csv) {
        FILE *chk = fopen(csv, "r");
        int fresh = chk == NULL;
        if (chk) fclose(chk);
        out = fopen(csv, "a");
        if (!out) {
            cli_err("bench: cannot open %s for appending", csv);
        } else if (fresh) {
            fprintf(out, "date,commit,machine,threads,model,depth,prefill_tok_s,decode_tok_s,n_gen\n");
        }
    }
    int rc = 0;
    char err[512];
    cli_install_sigint();
    for (int di = 0; di < nd && !cli_interrupted; di++) {
        int64_t d = depths[di];
        fwd_rewind(rt.f, 0);
        double t0 = cli_now();
        if (fwd_eval(rt.f, toks, d, logits, NULL, NULL, NULL, NULL, &cli_interrupted, err, sizeof err)) {
            cli_err("bench: %s", err);
            rc = 1;
            break;
        }
        double t1 = cli_now();
        for (int64_t g = 0; g < n_gen; g++) {
            int32_t id = samp_argmax(logits, nv);
            if (fwd_decode(rt.f, id, logits, NULL, err, sizeof err)) {
                cli_err("bench: %s", err);
                rc = 1;
                break;
            }
        }
        double t2 = cli_now();
        double pf = (double)d / (t1 - t0), dc = (double)n_gen / (t2 - t1);
        printf("%8lld %14.1f %14.1f\n", (long long)d, pf, dc);
        fflush(stdout);
        if (out)
            fprintf(out, "%s,%s,\"%s\",%d,%s,%lld,%.2f,%.2f,%lld\n", date, commit, machine, rt.b->n_threads, base,
                    (long long)d, pf, dc, (long long)n_gen);
    }
    printf("peak RSS %.1f MiB\n", cli_peak_rss_mib());
    if (out) fclose(out);
    free(toks);
    free(logits);
    cli_close(&rt);
    return rc;
}
