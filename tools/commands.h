/* commands.h - the subcommands of the `fattn` program; each takes the
 * arguments after the program name (argv[0] is the subcommand) and returns
 * the exit status (2 for a bad command line). */
#ifndef FATTN_TOOLS_COMMANDS_H
#define FATTN_TOOLS_COMMANDS_H

int fattn_cmd_run(int argc, char **argv);      /* tools/run.c */
int fattn_cmd_bench(int argc, char **argv);    /* tools/bench.c */
int fattn_cmd_accuracy(int argc, char **argv); /* tools/accuracy.c */

#endif
