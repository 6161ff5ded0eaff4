/* tandem-prefillcheck — the chunked prefill kernel path against the one-token decode path, and
 * both against the reference forward. Not built yet: it parses its options and says so. */
#include "err.h"
#include <getopt.h>
#include <stdio.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-prefillcheck -m DIR -p FILE [--ref FILE] [--json FILE]\n"
            "The chunked prefill kernel path against the one-token decode path, and both against the\n"
            "reference forward (the CPU reference, or --ref FILE with logits): next-token agreement, top-1\n"
            "margins, disagreements where both paths are sure (margin > 5), greedy continuations.\n"
            "\n"
            "NOT BUILT YET: the CUDA prefill kernels it checks do not exist; the tool exits 2.\n"
            "\n"
            "  -m, --model DIR     checkpoint directory\n"
            "  -p, --prompt FILE   prompt token file\n"
            "      --ref FILE      reference logits (safetensors with F32 'logits')\n"
            "      --json FILE     JSON report\n"
            "  -h, --help          this text\n"
            "Exit status: 0 the gate holds, 1 it fails, 2 bad usage or not built.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"ref", 1, 0, 'r'},
                                         {"json", 1, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "m:p:h", opts, NULL)) != -1) {
        if (o == 'h') { usage(stdout); return 0; }
        if (o == '?') { usage(stderr); return TDM_EXIT_USAGE; }
    }
    fprintf(stderr, "tandem-prefillcheck: not built yet (the CUDA prefill kernels it checks do not exist)\n");
    return TDM_EXIT_USAGE;
}
