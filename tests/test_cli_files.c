/* test_cli_files.c - the kvchat binary writing files, end to end: what it may replace (a regular file,
 * or a link, which is replaced and never followed) and what it refuses (a directory, FIFO, device or
 * socket at the path), gen-model -o - to a pipe (a model's or a vocabulary's), SIGTERM and SIGHUP
 * stopping a long write cleanly, --db paths that are no database file, and bench's CSV that cannot be
 * written. Every command works in a fresh directory under /tmp. Runs ./kvchat, or $KVCHAT_BIN. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/gguf.h"

#define TD "../shared/testdata/"
#define TINY TD "tiny/tiny-llama-f16.gguf"
#define GEN "gen-model --shape tiny-llama --type f16 --vocab " TINY " -t 1"

/* The binary as an absolute path (some commands run in another directory). */
static const char *bin(void)
{
    static char path[PATH_MAX];
    const char *b = getenv("KVCHAT_BIN");
    if (!b || !*b) b = "./kvchat";
    cr_assert(realpath(b, path), "no kvchat binary at %s", b);
    return path;
}

/* Run a shell command line; its stdout and stderr (each truncated to cap). Returns the exit status. */
static int sh(const char *cmdline, char *out, size_t ocap, char *errb, size_t ecap)
{
    char cap[] = "/tmp/kvchat-capture-XXXXXX", cmd[8192], p[300];
    cr_assert(mkdtemp(cap));
    snprintf(cmd, sizeof cmd, "( %s ) >%s/out 2>%s/err", cmdline, cap, cap);
    int st = system(cmd);
    char *bufs[2] = { out, errb };
    size_t caps[2] = { ocap, ecap };
    const char *names[2] = { "out", "err" };
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", cap, names[i]);
        FILE *f = fopen(p, "rb");
        size_t n = f ? fread(bufs[i], 1, caps[i] - 1, f) : 0;
        bufs[i][n] = 0;
        if (f) fclose(f);
        unlink(p);
    }
    rmdir(cap);
    cr_assert(WIFEXITED(st), "%s did not exit normally (signal?)", cmdline);
    return WEXITSTATUS(st);
}

/* kvchat ARGS (a shell fragment), stopped after 60 s (status 124): a kvchat that blocks on a FIFO
 * fails the test instead of hanging it */
static int kv(const char *args, char *out, size_t ocap, char *errb, size_t ecap)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' %s", bin(), args);
    return sh(cmd, out, ocap, errb, ecap);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* A refusal: exit status 1 and exactly one line on stderr, holding each of the needles. */
static void expect_refused(const char *args, const char *needle, const char *needle2)
{
    static char out[1 << 16], errb[1 << 16];
    int st = kv(args, out, sizeof out, errb, sizeof errb);
    cr_expect_eq(st, 1, "`kvchat %s` exited %d, expected 1 (stderr: %s)", args, st, errb);
    cr_expect_eq(count_lines(errb), 1, "`kvchat %s`: expected one line on stderr, got: %s", args, errb);
    cr_expect(strstr(errb, needle) && (!needle2 || strstr(errb, needle2)), "`kvchat %s`: stderr '%s' lacks '%s' '%s'",
              args, errb, needle, needle2 ? needle2 : "");
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static void expect_text(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    cr_expect_str_eq(buf, text, "%s was written", path);
}

static mode_t kind_of(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? st.st_mode & S_IFMT : 0;
}

static void rm_rf(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* /dev/null as it was: a character device 1,3. */
static void expect_dev_null_untouched(void)
{
    struct stat st;
    cr_assert(lstat("/dev/null", &st) == 0);
    cr_expect(S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3, "/dev/null was replaced");
}

/* gen-model --force replaces a regular file or a link (the link, not its target: /dev/null stays);
 * a FIFO or a directory at -o is refused in one line naming it, and stays what it was. */
Test(cli_files, gen_model_replaces_only_regular_files_and_links, .timeout = 120)
{
    char d[] = "/tmp/kvchat-genf-XXXXXX", fifo[300], adir[300], link[300], args[1024];
    cr_assert(mkdtemp(d));
    snprintf(fifo, sizeof fifo, "%s/fifo.gguf", d);
    snprintf(adir, sizeof adir, "%s/adir.gguf", d);
    snprintf(link, sizeof link, "%s/null.gguf", d);
    cr_assert(mkfifo(fifo, 0600) == 0 && mkdir(adir, 0700) == 0 && symlink("/dev/null", link) == 0);
    snprintf(args, sizeof args, GEN " -o %s --force", fifo);
    expect_refused(args, fifo, "is a FIFO, not a file kvchat replaces");
    snprintf(args, sizeof args, GEN " -o %s", fifo);
    expect_refused(args, fifo, "is a FIFO");   /* not "exists (--force replaces it)" */
    snprintf(args, sizeof args, GEN " -o %s --force", adir);
    expect_refused(args, adir, "is a directory");
    cr_expect_eq(kind_of(fifo), S_IFIFO, "the FIFO was replaced");
    cr_expect_eq(kind_of(adir), S_IFDIR);
    cr_expect_eq(entries(adir), 0);
    static char out[1 << 16], errb[1 << 16];
    snprintf(args, sizeof args, GEN " -o %s --force", link);
    cr_expect_eq(kv(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect_eq(kind_of(link), S_IFREG, "the link itself is replaced by the model");
    expect_dev_null_untouched();
    cr_expect_eq(entries(d), 3, "no temporary file is left");
    rm_rf(d);
}

/* -o - writes the model to standard output when that is a pipe (the writer never seeks), never to a
 * file named "-"; a device as standard output is refused. */
Test(cli_files, gen_model_dash_writes_standard_output, .timeout = 120)
{
    static char cmd[3 * PATH_MAX];
    char d[] = "/tmp/kvchat-gend-XXXXXX", path[300], err[512];
    cr_assert(mkdtemp(d));
    static char out[1 << 16], errb[1 << 16];
    /* run in d, so that a file named "-" would land there: the vocabulary's path made absolute */
    char vocab[PATH_MAX];
    cr_assert(realpath(TINY, vocab));
    snprintf(cmd, sizeof cmd, "cd %s && '%s' gen-model --shape tiny-llama --type f16 --vocab %s -t 1 -o - | cat > piped.gguf",
             d, bin(), vocab);
    cr_assert_eq(sh(cmd, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(errb, "wrote the model to standard output") && !out[0], "stderr: %s stdout: %s", errb, out);
    snprintf(path, sizeof path, "%s/-", d);
    cr_expect(access(path, F_OK) != 0, "a file named '-' was written");
    snprintf(path, sizeof path, "%s/piped.gguf", d);
    gguf_file *g = NULL;
    cr_expect(gguf_open(&g, path, err, sizeof err) == 0, "the piped model does not read back: %s", err);
    if (g) cr_expect_gt(gguf_n_tensors(g), 0);
    gguf_free(g);
    snprintf(cmd, sizeof cmd, "cd %s && '%s' gen-model --shape tiny-llama --type f16 --vocab %s -t 1 -o - >/dev/null", d,
             bin(), vocab);
    cr_expect_eq(sh(cmd, out, sizeof out, errb, sizeof errb), 1);
    cr_expect(count_lines(errb) == 1 && strstr(errb, "standard output, which is a character device"), "%s", errb);
    cr_expect_eq(entries(d), 1);
    expect_dev_null_untouched();
    cr_expect_eq(kv("gen-model --help", out, sizeof out, errb, sizeof errb), 0);
    cr_expect(strstr(out, "- writes it to standard output"), "the help says what -o - does: %s", out);
    rm_rf(d);
}

/* gen-model --vocab-only writes through the model's writer, under the same rules: an existing file
 * refused unless --force, a link replaced (never followed), a FIFO or directory refused and left as
 * it was, -o - to a pipe (the same bytes as the file) and never to a device, no temporary file left. */
Test(cli_files, gen_model_vocab_only_keeps_the_writers_file_rules, .timeout = 120)
{
    static char cmd[3 * PATH_MAX], out[1 << 16], errb[1 << 16];
    char d[] = "/tmp/kvchat-genvf-XXXXXX", fifo[300], adir[300], link[300], file[300], args[1024];
    cr_assert(mkdtemp(d));
    snprintf(fifo, sizeof fifo, "%s/fifo.gguf", d);
    snprintf(adir, sizeof adir, "%s/adir.gguf", d);
    snprintf(link, sizeof link, "%s/null.gguf", d);
    snprintf(file, sizeof file, "%s/v.gguf", d);
    cr_assert(mkfifo(fifo, 0600) == 0 && mkdir(adir, 0700) == 0 && symlink("/dev/null", link) == 0);
#define VOC "gen-model --vocab-only --vocab " TINY
    snprintf(args, sizeof args, VOC " -o %s --force", fifo);
    expect_refused(args, fifo, "is a FIFO, not a file kvchat replaces");
    snprintf(args, sizeof args, VOC " -o %s --force", adir);
    expect_refused(args, adir, "is a directory");
    cr_expect_eq(kind_of(fifo), S_IFIFO, "the FIFO was replaced");
    cr_expect_eq(entries(adir), 0);
    snprintf(args, sizeof args, VOC " -o %s", link);
    expect_refused(args, link, "exists (--force replaces it)");
    snprintf(args, sizeof args, VOC " -o %s --force", link);
    cr_expect_eq(kv(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect_eq(kind_of(link), S_IFREG, "the link itself is replaced by the vocabulary");
    expect_dev_null_untouched();
    snprintf(args, sizeof args, VOC " -o %s", file);
    cr_expect_eq(kv(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    char vocab[PATH_MAX];
    cr_assert(realpath(TINY, vocab));
    snprintf(cmd, sizeof cmd, "cd %s && '%s' gen-model --vocab-only --vocab %s -o - | cat > piped.gguf", d, bin(), vocab);
    cr_assert_eq(sh(cmd, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_expect(strstr(errb, "wrote the vocabulary to standard output") && !out[0], "stderr: %s stdout: %s", errb, out);
    snprintf(cmd, sizeof cmd, "cmp -s %s/piped.gguf %s", d, file);
    cr_expect_eq(system(cmd), 0, "the piped vocabulary differs from the file");
    snprintf(cmd, sizeof cmd, "cd %s && '%s' gen-model --vocab-only --vocab %s -o - >/dev/null", d, bin(), vocab);
    cr_expect_eq(sh(cmd, out, sizeof out, errb, sizeof errb), 1);
    cr_expect(count_lines(errb) == 1 && strstr(errb, "writes the vocabulary to standard output, which is a character device"),
              "%s", errb);
    expect_dev_null_untouched();
    cr_expect_eq(entries(d), 5, "no temporary file is left");
#undef VOC
    rm_rf(d);
}

/* SIGTERM and SIGHUP stop gen-model as Ctrl-C does: the half-written temporary file is removed, one
 * line says so, and the exit status is 128 + the signal. */
Test(cli_files, gen_model_stops_on_sigterm_and_sighup_and_leaves_nothing, .timeout = 240)
{
    const int sigs[] = { SIGTERM, SIGHUP };
    for (int i = 0; i < 2; i++) {
        char d[] = "/tmp/kvchat-gens-XXXXXX", work[100], out_model[200], errp[100];
        cr_assert(mkdtemp(d));
        snprintf(work, sizeof work, "%s/work", d);
        snprintf(out_model, sizeof out_model, "%s/m.gguf", work);
        snprintf(errp, sizeof errp, "%s/stderr", d);
        cr_assert(mkdir(work, 0700) == 0);
        const char *exe = bin();
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {   /* a model big enough (7B) to be stopped long before it is done */
            int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600), nul = open("/dev/null", O_WRONLY);
            dup2(fd, 2);
            dup2(nul, 1);
            execl(exe, exe, "gen-model", "--shape", "mistral-7b", "--type", "q4_k_m", "-o", out_model, "--vocab", TINY, "-t", "1",
                  (char *)NULL);
            _exit(127);
        }
        /* wait until the temporary file beside m.gguf holds data (polled: the child says nothing) */
        int seen = 0;
        for (int t = 0; t < 6000 && !seen; t++) {
            DIR *dd = opendir(work);
            for (struct dirent *e; dd && (e = readdir(dd));) {
                char p[400];
                struct stat st;
                snprintf(p, sizeof p, "%s/%s", work, e->d_name);
                seen |= !strncmp(e->d_name, "m.gguf.", 7) && stat(p, &st) == 0 && st.st_size > 0;
            }
            if (dd) closedir(dd);
            if (!seen) nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
        }
        cr_assert(seen, "no temporary file appeared");
        cr_assert_eq(kill(pid, sigs[i]), 0);
        int st = 0, done = 0;
        for (int t = 0; t < 6000 && !done; t++) {
            done = waitpid(pid, &st, WNOHANG) == pid;
            if (!done) nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
        }
        if (!done) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
        cr_expect(done, "signal %d did not stop gen-model within 60 s", sigs[i]);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 128 + sigs[i], "signal %d: %s %d", sigs[i],
                  WIFEXITED(st) ? "exit status" : "killed by signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        cr_expect_eq(entries(work), 0, "signal %d left a file behind", sigs[i]);
        char line[512] = "";
        FILE *f = fopen(errp, "r");
        cr_assert(f);
        size_t n = fread(line, 1, sizeof line - 1, f);
        line[n] = 0;
        fclose(f);
        cr_expect(strstr(line, "gen-model: interrupted; nothing was written"), "stderr: %s", line);
        rm_rf(d);
    }
}

/* --db that is no database file is refused before sqlite opens it: a device (sqlite would make
 * /dev/null-journal), a FIFO (it would block), a directory, the empty path and :memory: (a session
 * "saved" there is gone when kvchat exits). */
Test(cli_files, db_paths_that_are_no_database_file_are_refused, .timeout = 60)
{
    char d[] = "/tmp/kvchat-dbp-XXXXXX", fifo[300], args[1024];
    cr_assert(mkdtemp(d));
    snprintf(fifo, sizeof fifo, "%s/fifo.db", d);
    cr_assert(mkfifo(fifo, 0600) == 0);
    expect_refused("sessions list --db /dev/null", "/dev/null is a character device, not a session database", NULL);
    cr_expect(access("/dev/null-journal", F_OK) != 0, "sqlite made /dev/null-journal");
    expect_dev_null_untouched();
#define ASK "ask -t 1 -m " TD "tiny/tiny-gemma3-q4_k_m.gguf -d " TD "prompts/p1.txt -q 'What?' -n 2 "
    expect_refused(ASK "--session s --db /dev/zero", "/dev/zero is a character device, not a session database", NULL);
    expect_refused(ASK "--db /dev/full", "/dev/full is a character device", NULL);   /* no session: refused too */
    snprintf(args, sizeof args, "sessions list --db %s", fifo);
    expect_refused(args, fifo, "is a FIFO, not a session database");
    snprintf(args, sizeof args, ASK "--session s --db %s", fifo);
    expect_refused(args, "is a FIFO", NULL);
    snprintf(args, sizeof args, ASK "--session s --db %s", d);
    expect_refused(args, "is a directory, not a session database", NULL);
    expect_refused(ASK "--session s --db ''", "the path is empty", NULL);
    expect_refused(ASK "--session s --db :memory:", "in-memory database, which keeps nothing", NULL);
    expect_refused(ASK "--session s --db 'file::memory:'", "in-memory database", NULL);
    expect_refused("sessions list --db ''", "the path is empty", NULL);
    expect_refused("sessions list --db :memory:", "in-memory", NULL);
    snprintf(args, sizeof args, "sessions list --db 'file:%s?mode=ro'", fifo);
    expect_refused(args, "is a FIFO", NULL);   /* a URI names the same file */
#undef ASK
    cr_expect_eq(kind_of(fifo), S_IFIFO);
    cr_expect_eq(entries(d), 1, "nothing was created beside the FIFO");
    rm_rf(d);
}

/* info --export-tokenizer replaces a link at the path (its target is kept as it was) and refuses a
 * FIFO (it would have blocked until a reader came). */
Test(cli_files, export_tokenizer_replaces_a_link_and_refuses_a_fifo, .timeout = 60)
{
    char d[] = "/tmp/kvchat-tokx-XXXXXX", victim[300], link[300], fifo[300], args[1024];
    cr_assert(mkdtemp(d));
    snprintf(victim, sizeof victim, "%s/victim.txt", d);
    snprintf(link, sizeof link, "%s/tok.model", d);
    snprintf(fifo, sizeof fifo, "%s/fifo.model", d);
    put(victim, "keep me");
    cr_assert(symlink(victim, link) == 0 && mkfifo(fifo, 0600) == 0);
    static char out[1 << 16], errb[1 << 16];
    snprintf(args, sizeof args, "info -m " TINY " --export-tokenizer %s", link);
    cr_expect_eq(kv(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    expect_text(victim, "keep me");
    struct stat st;
    cr_expect(lstat(link, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 1000, "the link was not replaced by the model");
    snprintf(args, sizeof args, "info -m " TINY " --export-tokenizer %s", fifo);
    expect_refused(args, fifo, "is a FIFO, not a file kvchat replaces");
    cr_expect_eq(kind_of(fifo), S_IFIFO);
    cr_expect_eq(entries(d), 3);
    rm_rf(d);
}

/* calibrate writes its thresholds and plot without following a link (one planted at the plot, one at
 * the thresholds' old temporary name), and refuses a FIFO as --out before calibrating. */
Test(cli_files, calibrate_follows_no_link_and_refuses_a_fifo, .timeout = 300)
{
    char d[] = "/tmp/kvchat-calx-XXXXXX", v1[300], v2[300], thr[300], tmp[300], png[300], fifo[300], args[2048];
    cr_assert(mkdtemp(d));
    snprintf(v1, sizeof v1, "%s/victim1", d);
    snprintf(v2, sizeof v2, "%s/victim2", d);
    snprintf(thr, sizeof thr, "%s/t.txt", d);
    snprintf(tmp, sizeof tmp, "%s/t.txt.tmp", d);
    snprintf(png, sizeof png, "%s/p.png", d);
    snprintf(fifo, sizeof fifo, "%s/fifo.txt", d);
    put(v1, "keep 1");
    put(v2, "keep 2");
    cr_assert(symlink(v1, tmp) == 0 && symlink(v2, png) == 0 && mkfifo(fifo, 0600) == 0);
    int plot = system("command -v gnuplot >/dev/null 2>&1") == 0;
    static char out[1 << 16], errb[1 << 16];
    const char *opts = "calibrate -m " TINY " --samples 2 -n 24 --page-size 8 --seed 5";
    snprintf(args, sizeof args, "%s --out %s --plot %s --db %s/c.db", opts, thr, plot ? png : "none", d);
    cr_expect_eq(kv(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    expect_text(v1, "keep 1");
    expect_text(v2, "keep 2");
    cr_expect_eq(kind_of(thr), S_IFREG);
    FILE *f = fopen(thr, "r");
    char buf[4096] = "";
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
        fclose(f);
    }
    cr_expect(strstr(buf, "entropy_mean="), "the thresholds file: %s", buf);
    if (plot) {
        cr_expect_eq(kind_of(png), S_IFREG, "the link at the plot's path was not replaced");
        f = fopen(png, "rb");
        char sig[4] = "";
        cr_expect(f && fread(sig, 1, 4, f) == 4 && !memcmp(sig, "\x89PNG", 4), "p.png is no PNG");
        if (f) fclose(f);
    }
    snprintf(args, sizeof args, "%s --out %s --plot none --db %s/c.db", opts, fifo, d);
    expect_refused(args, fifo, "is a FIFO, not a file kvchat replaces");
    cr_expect_eq(kind_of(fifo), S_IFIFO);
    rm_rf(d);
}

/* bench fails (exit 1, one line) when its CSV cannot be written: a path it cannot create is found
 * before the model loads, a FIFO is refused, and a write that fails (here the file-size limit, as a
 * full disk would) is reported after the measured results are printed. */
Test(cli_files, bench_fails_when_its_csv_cannot_be_written, .timeout = 120)
{
    char d[] = "/tmp/kvchat-bcsv-XXXXXX", file[300], fifo[300], big[300], args[2048];
    cr_assert(mkdtemp(d));
    snprintf(file, sizeof file, "%s/FILE", d);
    snprintf(fifo, sizeof fifo, "%s/fifo.csv", d);
    snprintf(big, sizeof big, "%s/big.csv", d);
    put(file, "");
    cr_assert(mkfifo(fifo, 0600) == 0);
    const char *opts = "bench -m " TINY " --ctx 16 --gen 2 -t 1";
    /* under a regular file, so that it fails for root too (a read-only directory would not) */
    snprintf(args, sizeof args, "%s --csv %s/results.csv", opts, file);
    expect_refused(args, "FILE/results.csv", "Not a directory");
    snprintf(args, sizeof args, "%s --csv %s", opts, fifo);
    expect_refused(args, fifo, "is a FIFO");
    cr_expect_eq(kind_of(fifo), S_IFIFO);
    FILE *f = fopen(big, "w");
    cr_assert(f);
    fputs("date,commit,machine,threads,model,depth,prefill_tok_s,decode_tok_s,n_gen\n", f);   /* bench's columns */
    for (int i = 0; i < 4096; i++) fputc('x', f);   /* beyond the limit below: any append fails */
    fclose(f);
    static char out[1 << 16], errb[1 << 16];
    snprintf(args, sizeof args, "trap '' XFSZ; ulimit -f 2; '%s' %s --csv %s", bin(), opts, big);
    int st = sh(args, out, sizeof out, errb, sizeof errb);
    cr_expect_eq(st, 1, "exit status %d (stderr: %s)", st, errb);
    cr_expect(strstr(out, "      16 "), "the measured row is printed: %s", out);
    cr_expect(count_lines(errb) == 1 && strstr(errb, "writing ") && strstr(errb, "big.csv failed"), "%s", errb);
    rm_rf(d);
}

/* The commit column of a bench CSV's first row. */
static void csv_commit(const char *path, char *out, size_t cap)
{
    char line[4096];
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    cr_assert(fgets(line, sizeof line, f) && fgets(line, sizeof line, f), "no row in %s", path);
    fclose(f);
    const char *c = strchr(line, ',');
    cr_assert(c, "%s", line);
    snprintf(out, cap, "%.*s", (int)strcspn(c + 1, ","), c + 1);
}

/* bench names its figures by the commit the program was built from, whatever checkout it runs in
 * (here a folder outside any), and KVCHAT_COMMIT names another. */
Test(cli_files, bench_rows_name_the_commit_the_program_was_built_from, .timeout = 120)
{
    char d[] = "/tmp/kvchat-bcommit-XXXXXX", tiny[PATH_MAX], args[3 * PATH_MAX], got[128];
    static char out[1 << 16], errb[1 << 16];
    cr_assert(mkdtemp(d));
    cr_assert(realpath(TINY, tiny));
    /* the binary under test says which commit it was built from (it may be another build than these
     * tests') */
    char built[128];
    snprintf(args, sizeof args, "'%s' --version", bin());
    cr_assert_eq(sh(args, out, sizeof out, errb, sizeof errb), 0, "%s", errb);
    cr_assert(!strncmp(out, "kvchat ", 7) && out[7] && count_lines(out) == 1, "%s", out);
    snprintf(built, sizeof built, "%.*s", (int)strcspn(out + 7, "\n"), out + 7);
    snprintf(args, sizeof args,
             "cd %s && env -u KVCHAT_COMMIT '%s' bench -m '%s' --ctx 16 --gen 2 -t 1 --csv a.csv && "
             "KVCHAT_COMMIT=pack1234 '%s' bench -m '%s' --ctx 16 --gen 2 -t 1 --csv b.csv",
             d, bin(), tiny, bin(), tiny);
    int st = sh(args, out, sizeof out, errb, sizeof errb);
    cr_assert_eq(st, 0, "exit status %d: %s", st, errb);
    snprintf(args, sizeof args, "%s/a.csv", d);
    csv_commit(args, got, sizeof got);
    cr_expect_str_eq(got, built, "the binary's commit, not the working folder's");
    snprintf(args, sizeof args, "%s/b.csv", d);
    csv_commit(args, got, sizeof got);
    cr_expect_str_eq(got, "pack1234");
    rm_rf(d);
}
