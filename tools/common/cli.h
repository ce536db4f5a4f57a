/* Command-line conventions shared by the beamd tools: every message goes
 * to stderr as "<program>: ...", a bad option value reads
 * "<program>: bad value for --OPT: 'VALUE' (WHY)", and a bad command line
 * exits 2 after "<program>: try --help". The program name is set once by
 * tool_cli_init() at the top of main(). */
#ifndef BEAMD_TOOLS_COMMON_CLI_H
#define BEAMD_TOOLS_COMMON_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

/* --version in every tool: the long option, its getopt value and its help
 * line. A parse_args returning TOOL_ARGS_VERSION has tool_args_exit print
 * it, as 1 does for --help. */
enum { TOOL_OPT_VERSION = 0x7d00, TOOL_ARGS_VERSION = 2 };
#define TOOL_VERSION_LONGOPT {"version", no_argument, 0, TOOL_OPT_VERSION}
#define TOOL_VERSION_USAGE "  --version           print the version (beamd's) and exit\n"

/* Program name used as the prefix of every message; a static string. */
void tool_cli_init(const char *prog);
const char *tool_prog(void);

/* "<program>: " + the formatted text + newline, on stderr. */
void tool_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints the bad-value message for --opt; returns -1 so a parser can
 * `return tool_bad(...)`. */
int tool_bad(const char *opt, const char *val, const char *why);

/* Non-negative decimal integer in lo..hi. A malformed number and one out of
 * range get different reasons ("must be in lo..hi" names the range). */
int tool_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

/* Non-negative decimal integer up to hi, one reason for every failure. */
int tool_parse_u64_max(const char *opt, const char *s, uint64_t hi, uint64_t *out);

/* Number in lo..hi (NaN never passes). why is the reason printed on
 * failure; NULL prints "expected a number in lo..hi". */
int tool_parse_double(const char *opt, const char *s, double lo, double hi, const char *why,
                      double *out);

/* The message for getopt_long's '?' (opterr = 0); returns -1. With
 * tell_missing the message says whether a known option lacked its value;
 * without it one message covers both. */
int tool_bad_option(char *const *argv, int tell_missing);

/* For tools that take no operands: 0 when getopt_long consumed every
 * argument, else -1 after naming the first one left. */
int tool_no_operands(int argc, char *const *argv);

/* "<program> <version>" on stdout: the version is beamd's, so a tool and
 * the daemon it talks to can be matched at a glance. */
void tool_print_version(void);

/* After parse_args, whose result is 0 (go on), 1 (--help),
 * TOOL_ARGS_VERSION or < 0 (error already printed): returns -1 to go on,
 * else the exit code for main (0 after printing usage or the version on
 * stdout, 2 after "try --help"). */
int tool_args_exit(int parsed, void (*usage)(FILE *));

#endif
