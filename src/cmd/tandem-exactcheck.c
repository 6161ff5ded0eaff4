/* tandem-exactcheck — the exactness gate: (a) every verify kernel's M-row call against M one-row
 * calls, bit for bit; (b) speculative output against one-token-at-a-time output; (c) graphed
 * against eager runs. Not built yet: it parses its options and says so. */
#include "err.h"
#include <getopt.h>
#include <stdio.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-exactcheck -m DIR [-p FILE] [--json FILE]\n"
            "The exactness gate (design.md): (a) each verify kernel's M-row call against M one-row calls,\n"
            "bit for bit, M = 2..32, rows sharing inputs; (b) speculative output (chain and tree, each\n"
            "drafter) against one-token-at-a-time output, near ties measured and reported; (c) graphed\n"
            "against eager runs.\n"
            "\n"
            "NOT BUILT YET: the speculative engine it checks does not exist; the tool exits 2.\n"
            "\n"
            "  -m, --model DIR     checkpoint directory\n"
            "  -p, --prompt FILE   prompt token file\n"
            "      --json FILE     JSON report\n"
            "  -h, --help          this text\n"
            "Exit status: 0 all identical (or measured near ties only), 1 a difference, 2 bad usage or not built.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"json", 1, 0, 'j'},
                                         {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "m:p:h", opts, NULL)) != -1) {
        if (o == 'h') { usage(stdout); return 0; }
        if (o == '?') { usage(stderr); return TDM_EXIT_USAGE; }
    }
    fprintf(stderr, "tandem-exactcheck: not built yet (the speculative engine it checks does not exist)\n");
    return TDM_EXIT_USAGE;
}
