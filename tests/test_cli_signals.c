/* test_cli_signals.c - never losing a turn (issue 27): `kvchat ask --session` stopped mid-answer by
 * SIGTERM, SIGHUP or a closed pipe (`| head -c 10`) saves the question and the partial answer,
 * marked interrupted, and exits with 128 + the signal; kill -9 mid-answer keeps the question (saved
 * before the answer began), shown as unanswered, and the next question goes on from the answer
 * before it. The tiny Gemma model answers for many seconds with a long -n, so every signal lands
 * mid-answer: each test waits for the first answer bytes (polled), never a fixed time. Runs ./kvchat,
 * or $KVCHAT_BIN (the old binary shows what the issue reported). `kvchat chat` whose output closes
 * exits with 141 itself, not killed by SIGPIPE. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TD "../shared/testdata/"
#define TINY_G TD "tiny/tiny-gemma3-q4_k_m.gguf"
#define QUESTION "What happened at the mill?"

static const char *bin(void)
{
    const char *b = getenv("KVCHAT_BIN");
    return b && *b ? b : "./kvchat";
}

static void pause_10ms(void) { nanosleep(&(struct timespec){ 0, 10000000 }, NULL); }

/* `kvchat ask --session s` in dir (database dir/s.db, settings from dir) with stdout to out_fd and
 * stderr to dir/err; a long answer (-n 100000: seconds on the tiny model). */
static pid_t start_ask(const char *dir, int out_fd)
{
    char db[600], errp[600];
    snprintf(db, sizeof db, "%s/s.db", dir);
    snprintf(errp, sizeof errp, "%s/err", dir);
    const char *exe = bin();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 2);
        dup2(out_fd, 1);
        setenv("XDG_CONFIG_HOME", dir, 1);   /* hermetic: no settings file of the user's */
        signal(SIGPIPE, SIG_DFL);            /* as a shell starts it */
        execl(exe, exe, "ask", "-t", "1", "-m", TINY_G, "-d", TD "prompts/p2.txt", "-q", QUESTION, "-n", "100000",
              "--session", "s", "--db", db, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Wait (up to 60 s, polled) for pid to end; its wait status, or -1 when it did not (then killed). */
static int wait_end(pid_t pid)
{
    int st = 0;
    for (int t = 0; t < 6000; t++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return st;
        pause_10ms();
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* The output of `kvchat sessions --db dir/s.db ARGS` into buf. */
static void sessions(const char *dir, const char *args, char *buf, size_t cap)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "XDG_CONFIG_HOME='%s' %s sessions --db '%s/s.db' %s 2>&1", dir, bin(), dir, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    pclose(p);
}

static void read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
}

static void rm_rf(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect(system(cmd) == 0);
}

/* The stored conversation holds the question and a non-empty answer marked interrupted. */
static void expect_partial_turn_saved(const char *dir, const char *what)
{
    static char show[1 << 16], json[1 << 16];
    sessions(dir, "show s", show, sizeof show);
    cr_expect(strstr(show, "2 messages") && strstr(show, "[1] user:\n" QUESTION "\n"), "%s: the question: %s", what,
              show);
    const char *ans = strstr(show, "[2, reply to 1, policy full] assistant (interrupted):\n");
    cr_expect(ans, "%s: the partial answer, marked interrupted: %s", what, show);
    if (ans) {
        const char *text = strchr(ans, '\n') + 1;
        cr_expect(*text && *text != '\n', "%s: the partial answer is empty: %s", what, show);
    }
    sessions(dir, "export s --format json", json, sizeof json);
    cr_expect(strstr(json, "\"interrupted\": true"), "%s: the metrics say interrupted: %s", what, json);
}

/* SIGTERM and SIGHUP mid-answer: the turn is saved, the status is 128 + the signal. */
Test(cli_signals, ask_session_saves_the_partial_turn_on_sigterm_and_sighup, .timeout = 240)
{
    const int sigs[] = { SIGTERM, SIGHUP };
    for (int i = 0; i < 2; i++) {
        char dir[] = "/tmp/kvchat-sig-XXXXXX", outp[600], errp[600], err[8192];
        cr_assert(mkdtemp(dir));
        snprintf(outp, sizeof outp, "%s/out", dir);
        snprintf(errp, sizeof errp, "%s/err", dir);
        int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        cr_assert(out >= 0);
        pid_t pid = start_ask(dir, out);
        close(out);
        int t = 0;
        while (t++ < 6000 && file_size(outp) <= 0) pause_10ms();   /* the answer is streaming */
        cr_assert(file_size(outp) > 0, "no answer appeared");
        cr_assert_eq(kill(pid, sigs[i]), 0);
        int st = wait_end(pid);
        read_file(errp, err, sizeof err);
        cr_expect(st != -1, "signal %d did not stop ask within 60 s", sigs[i]);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 128 + sigs[i], "signal %d: %s %d (stderr: %s)", sigs[i],
                  WIFEXITED(st) ? "exit status" : "killed by signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
                  err);
        cr_expect(strstr(err, "(interrupted)") && strstr(err, "turn saved (messages 1, 2)"), "signal %d: %s", sigs[i],
                  err);
        expect_partial_turn_saved(dir, sigs[i] == SIGTERM ? "SIGTERM" : "SIGHUP");
        rm_rf(dir);
    }
}

/* What head -c 10 does: read 10 bytes of the answer, then close the pipe. */
static void read_10_and_close(int fd)
{
    char got[10];
    size_t n = 0;
    while (n < sizeof got) {
        ssize_t r = read(fd, got + n, sizeof got - n);
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    cr_assert_eq(n, sizeof got, "the answer ended before 10 bytes");
}

/* st (wait_end's) is an exit with 141 (128 + SIGPIPE) of its own, not a death by the signal. */
static void expect_closed_pipe_exit(int st, const char *cmd, const char *err)
{
    cr_expect(st != -1, "a closed pipe did not stop %s within 60 s", cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGPIPE, "%s %d (stderr: %s)",
              WIFEXITED(st) ? "exit status" : "killed by signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), err);
}

/* `kvchat ask --session s ... | head -c 10`: the reader leaves, the answer stops there, and the turn
 * is saved; the status is 141 (128 + SIGPIPE), no crash. */
Test(cli_signals, ask_session_saves_the_partial_turn_when_its_output_pipe_closes, .timeout = 120)
{
    char dir[] = "/tmp/kvchat-sig-XXXXXX", errp[600], err[8192];
    cr_assert(mkdtemp(dir));
    snprintf(errp, sizeof errp, "%s/err", dir);
    int fds[2];
    cr_assert(pipe2(fds, O_CLOEXEC) == 0);   /* the child holds only the write end (as stdout) */
    pid_t pid = start_ask(dir, fds[1]);
    close(fds[1]);
    read_10_and_close(fds[0]);
    int st = wait_end(pid);
    read_file(errp, err, sizeof err);
    expect_closed_pipe_exit(st, "ask", err);
    cr_expect(strstr(err, "turn saved (messages 1, 2)"), "%s", err);
    expect_partial_turn_saved(dir, "closed pipe");
    rm_rf(dir);
}

/* kill -9 mid-answer: nothing can be saved then, but the question was saved before the answer began;
 * `sessions show` marks it unanswered, and the next question continues the conversation as it was
 * before it (a sibling: here the first question of the session again, another branch). */
Test(cli_signals, ask_session_keeps_the_question_through_kill_9, .timeout = 120)
{
    char dir[] = "/tmp/kvchat-sig-XXXXXX", outp[600], err[8192], cmd[2000];
    static char show[1 << 16];
    cr_assert(mkdtemp(dir));
    snprintf(outp, sizeof outp, "%s/out", dir);
    int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(out >= 0);
    pid_t pid = start_ask(dir, out);
    close(out);
    int t = 0;
    while (t++ < 6000 && file_size(outp) <= 0) pause_10ms();
    cr_assert(file_size(outp) > 0, "no answer appeared");
    cr_assert_eq(kill(pid, SIGKILL), 0);
    int st = wait_end(pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    sessions(dir, "show s", show, sizeof show);
    cr_expect(strstr(show, "1 messages") && strstr(show, "[1] user:\n" QUESTION "\n(no answer: interrupted)\n"),
              "the question is kept, shown unanswered: %s", show);
    /* the next question: the conversation goes on (the unanswered question is not in its prompt) */
    snprintf(cmd, sizeof cmd,
             "XDG_CONFIG_HOME='%s' %s ask -t 1 -m " TINY_G " --resume s -q 'And then?' -n 4 --db '%s/s.db' "
             ">/dev/null 2>'%s/err'",
             dir, bin(), dir, dir);
    st = system(cmd);
    snprintf(outp, sizeof outp, "%s/err", dir);
    read_file(outp, err, sizeof err);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the next question failed: %s", err);
    sessions(dir, "show s", show, sizeof show);
    cr_expect(strstr(show, "3 messages") && strstr(show, "[1] user:\n" QUESTION "\n(no answer: interrupted)\n") &&
                  strstr(show, "[2] user (another branch):\nAnd then?\n") &&
                  strstr(show, "[3, reply to 2, policy full] assistant:"),
              "%s", show);
    rm_rf(dir);
}

/* `kvchat chat` whose output closes mid-answer: it stops and exits with 141 itself (no store to save
 * to; not killed by SIGPIPE), with one line on stderr. */
Test(cli_signals, chat_stops_cleanly_when_its_output_pipe_closes, .timeout = 120)
{
    char dir[] = "/tmp/kvchat-sig-XXXXXX", inp[600], errp[600], err[8192];
    cr_assert(mkdtemp(dir));
    snprintf(inp, sizeof inp, "%s/in", dir);
    snprintf(errp, sizeof errp, "%s/err", dir);
    FILE *f = fopen(inp, "w");
    cr_assert(f);
    fputs("Tell me everything.\nAnd more.\n", f);
    fclose(f);
    int fds[2];
    cr_assert(pipe2(fds, O_CLOEXEC) == 0);
    const char *exe = bin();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int in = open(inp, O_RDONLY), e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(in, 0);
        dup2(fds[1], 1);
        dup2(e, 2);
        setenv("XDG_CONFIG_HOME", dir, 1);
        signal(SIGPIPE, SIG_DFL);
        execl(exe, exe, "chat", "-t", "1", "-m", TINY_G, "-n", "100000", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    read_10_and_close(fds[0]);
    int st = wait_end(pid);
    read_file(errp, err, sizeof err);
    expect_closed_pipe_exit(st, "chat", err);
    cr_expect(!strchr(err, '\n') || strchr(err, '\n') == err + strlen(err) - 1, "one line on stderr: %s", err);
    rm_rf(dir);
}
