/* main.c - the kvchat binary: dispatch to a subcommand. With no arguments it opens the terminal
 * interface on the default model (the line chat when input or output is not a terminal). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "app/commands.h"

static void usage(FILE *out)
{
    fputs("kvchat - chat with a local language model over long documents\n"
          "\n"
          "usage: kvchat [COMMAND] [OPTIONS]\n"
          "\n"
          "commands:\n"
          "  tui        the terminal interface (the default in a terminal)\n"
          "  chat       line-oriented chat (the default when input or output is not a terminal)\n"
          "  ask        answer a question about a document under a KV-cache policy, with metrics\n"
          "  generate   complete a prompt or answer it (--chat), streaming the text\n"
          "  info       architecture, hyperparameters, tensor types and sizes of a model\n"
          "  logits     top-5 logits per position and a greedy continuation, in the reference format\n"
          "  bench      prefill and decode speed at several prompt lengths\n"
          "  calibrate  the uncertainty thresholds of a model (entropy statistics of its answers)\n"
          "  eval       accuracy of policies on generated retrieval tasks (pass key), with backtracking\n"
          "  sessions   list, search, show, export, rename and delete saved sessions\n"
          "\n"
          "`kvchat COMMAND --help` shows a command's options. Without -m, the default model\n"
          "(Gemma 3 270M Q4_K_M, fetched by `make model`) is used.\n",
          out);
}

/* With no command: the terminal interface in a terminal, the line chat when piped. */
static int default_command(int argc, char **argv)
{
    return isatty(STDIN_FILENO) && isatty(STDOUT_FILENO) ? cmd_tui(argc, argv) : cmd_chat(argc, argv);
}

int main(int argc, char **argv)
{
    if (argc < 2) return default_command(argc, argv);
    const char *c = argv[1];
    if (!strcmp(c, "-h") || !strcmp(c, "--help") || !strcmp(c, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(c, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(c, "ask")) return cmd_ask(argc - 1, argv + 1);
    if (!strcmp(c, "chat")) return cmd_chat(argc - 1, argv + 1);
    if (!strcmp(c, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(c, "logits")) return cmd_logits(argc - 1, argv + 1);
    if (!strcmp(c, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(c, "calibrate")) return cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(c, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(c, "sessions")) return cmd_sessions(argc - 1, argv + 1);
    if (!strcmp(c, "tui")) return cmd_tui(argc - 1, argv + 1);
    if (c[0] == '-') return default_command(argc, argv);
    fprintf(stderr, "kvchat: unknown command '%s' (see kvchat --help)\n", c);
    return 1;
}
