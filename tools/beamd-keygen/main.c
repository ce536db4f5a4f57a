/* beamd-keygen: writes a CURVE key pair as CZMQ zcert certificates
 * (NAME and NAME_secret, or pyzmq's NAME.key and NAME.key_secret), for
 * beamd's curve.secret_key, its curve.allow directory and the tools'
 * --curve-secret / --curve-server. The secret file is mode 0600; an
 * existing key is never overwritten without --force. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "daemon/curve.h"
#include "tools/common/cli.h"

static void usage(FILE *f) {
  fprintf(f,
"usage: beamd-keygen [options] NAME\n"
"Writes a CURVE key pair: DIR/NAME (public: give it to peers, or put it in a\n"
"server's allow directory) and DIR/NAME_secret (keep it; mode 0600).\n"
"  --dir DIR   where to write (default .)\n"
"  --pyzmq     name the files NAME.key and NAME.key_secret, as pyzmq does\n"
"  --force     overwrite existing files\n"
"  --print     also print the public key (Z85) on stdout\n"
"  --help      this text\n"
"  --version   print the version (beamd's) and exit\n");
}

int main(int argc, char **argv) {
  enum { O_DIR = 256, O_PYZMQ, O_FORCE, O_PRINT, O_HELP };
  static const struct option lo[] = {{"dir", required_argument, 0, O_DIR},
                                     {"pyzmq", no_argument, 0, O_PYZMQ},
                                     {"force", no_argument, 0, O_FORCE},
                                     {"print", no_argument, 0, O_PRINT},
                                     {"help", no_argument, 0, O_HELP},
                                     TOOL_VERSION_LONGOPT,
                                     {0, 0, 0, 0}};
  tool_cli_init("beamd-keygen");
  const char *dir = ".";
  int pyzmq = 0, force = 0, print = 0, c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case O_DIR: dir = optarg; break;
    case O_PYZMQ: pyzmq = 1; break;
    case O_FORCE: force = 1; break;
    case O_PRINT: print = 1; break;
    case O_HELP: usage(stdout); return 0;
    case TOOL_OPT_VERSION: tool_print_version(); return 0;
    default:
      tool_bad_option(argv, 1);
      tool_log("try --help");
      return 2;
    }
  }
  if (optind != argc - 1) {
    tool_log(optind == argc ? "give the key's NAME" : "one NAME only");
    tool_log("try --help");
    return 2;
  }
  beam_cert_t cert;
  beam_diag_t d = {0};
  if (beam_cert_generate(dir, argv[optind], pyzmq, force, &cert, &d) != 0) {
    tool_log("%s", d.msg);
    return 1;
  }
  tool_log("wrote %s/%s%s (public) and %s/%s%s (secret, mode 0600)", dir, argv[optind],
           pyzmq ? ".key" : "", dir, argv[optind], pyzmq ? ".key_secret" : "_secret");
  if (print)
    printf("%s\n", cert.public_z85);
  return 0;
}
