/* commands.h - the subcommands of the kvchat binary; each returns the process exit status. */
#ifndef KVCHAT_COMMANDS_H
#define KVCHAT_COMMANDS_H

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_ask(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sessions(int argc, char **argv);
int cmd_tui(int argc, char **argv);
int cmd_genmodel(int argc, char **argv);

#endif
