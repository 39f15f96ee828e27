/* main.c - the kvchat binary: dispatch to a subcommand. With no arguments it opens the terminal
 * interface on the default model (the line chat when input or output is not a terminal). */
#include <errno.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"

/* The commands, in the order the help lists them. */
static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    { "tui", cmd_tui, "the terminal interface (the default in a terminal)" },
    { "chat", cmd_chat, "line-oriented chat (the default when input or output is not a terminal)" },
    { "ask", cmd_ask, "answer a question about a document under a KV-cache policy, with metrics" },
    { "generate", cmd_generate, "complete a prompt or answer it (--chat), streaming the text" },
    { "info", cmd_info, "architecture, hyperparameters, tensor types and sizes of a model" },
    { "logits", cmd_logits, "top-5 logits per position and a greedy continuation, in the reference format" },
    { "perplexity", cmd_perplexity, "perplexity of the model on a text (chunks from BOS, as llama.cpp measures it)" },
    { "bench", cmd_bench, "prefill and decode speed at several prompt lengths" },
    { "calibrate", cmd_calibrate, "the uncertainty thresholds of a model (entropy statistics of its answers)" },
    { "eval", cmd_eval, "accuracy of policies on generated retrieval tasks (pass key), with backtracking" },
    { "sessions", cmd_sessions, "list, search, show, export, rename and delete saved sessions" },
    { "gen-model", cmd_genmodel, "write a random-weight model of a real model's shape as a GGUF file" },
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fputs("kvchat - chat with a local language model over long documents\n\nusage: kvchat [COMMAND] [OPTIONS]\n\n"
          "commands:\n", out);
    for (int i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fputs("\n`kvchat COMMAND --help` shows a command's options; `kvchat --version` the commit this program\n"
          "was built from. Without -m, the default model (Gemma 3 270M Q4_K_M, fetched by `make model`) is used.\n",
          out);
}

/* A command's status, unless what it printed did not reach stdout (a full disk, a closed pipe): that
 * is a failure too, said in one line. */
static int finish(int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kvchat: writing the output failed: %s\n", strerror(errno ? errno : EIO));
        return rc ? rc : 1;
    }
    return rc;
}

/* With no command: the terminal interface in a terminal, the line chat when piped (argv[0] names
 * the command in messages). */
static int default_command(int argc, char **argv)
{
    int tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    argv[0] = tty ? "tui" : "chat";
    return tty ? cmd_tui(argc, argv) : cmd_chat(argc, argv);
}

int main(int argc, char **argv)
{
    /* display widths (wcwidth) of the names and titles laid out in columns need a UTF-8 locale */
    if (!setlocale(LC_CTYPE, "") || MB_CUR_MAX == 1) setlocale(LC_CTYPE, "C.UTF-8");
    if (argc < 2) return finish(default_command(argc, argv));
    const char *c = argv[1];
    if (!strcmp(c, "-h") || !strcmp(c, "--help") || !strcmp(c, "help")) {
        usage(stdout);
        return finish(0);
    }
    if (!strcmp(c, "--version") || !strcmp(c, "version")) {
        printf("kvchat %s\n", cli_build_commit());
        return finish(0);
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(c, commands[i].name)) return finish(commands[i].run(argc - 1, argv + 1));
    if (c[0] == '-') return finish(default_command(argc, argv));
    fprintf(stderr, "kvchat: unknown command '%s' (see kvchat --help)\n", c);
    return 1;
}
