#include "settings.h"
#include "err.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

const struct tdm_setting_def tdm_settings[] = {
    {"TANDEM_BACKEND", "auto", "auto|cpu|cuda",
     "compute backend when --backend is not given: auto takes the CUDA engine when a device is visible and "
     "the engine serves the model and the job (else the CPU reference, saying why on the '# backend' line)"},
    {"TANDEM_FIXTURES", "../shared/fixtures", "path", "where the tests find the reference fixtures"},
    {"TANDEM_TILES", "tiles", "path", "directory of the tile tables (tiles/sm_XX/*.json)"},
    {"TANDEM_PREFILL_CHUNK", "4096", "int",
     "prompt tokens per prefill chunk (the CUDA engine holds activations for that many rows, at most --ctx; "
     "its projections then run the wide GEMM once per chunk)"},
    {"TANDEM_CUDA_GRAPH", "on", "on|off",
     "CUDA engine: on replays a captured CUDA graph for every one-token decode step, every verify round "
     "of a shape (rows, first logits row) and every commit of a row count, each captured on its second "
     "use (the position lives in a device buffer); off launches each kernel eagerly"},
    {"TANDEM_ATTN_PREFILL", "on", "on|off",
     "CUDA engine: on runs the attention of a prefill chunk longer than 32 rows as one flash-attention "
     "launch (tdm_attn_prefill, tensor cores); off runs the decode kernel 32 queries a launch (the "
     "older path, for comparison)"},
    {"TANDEM_GDN_PREFILL", "on", "on|off",
     "CUDA engine: on runs a prefill chunk's GDN layers (past 32 rows) through the prefill kernels (the conv "
     "parallel over tokens, the same bits; the chunked delta rule, the same function in another summation "
     "order); off runs them token by token as decode does"},
    {"TANDEM_GDN_FUSED_NORM", "on", "on|off",
     "CUDA engine: on has a GDN layer's recurrence kernel also run its gated norm (each value head's blocks run "
     "as one cluster and normalise their columns of the head's rows with the gated-norm kernel's device code: the "
     "same bits), one "
     "launch and one kernel boundary less a layer; a prefill chunk's chunked recurrence keeps the separate "
     "kernel; off launches the gated-norm kernel after every recurrence (the older path, for comparison)"},
    {"TANDEM_GDN_FUSE_BA", "on", "on|off",
     "CUDA engine: on runs qwen3_5's in_proj_b and in_proj_a as one product per GDN layer (one [2Hv, H] "
     "weight, b's rows then a's) where the two concatenate exactly (same format and k; NVFP4 the same "
     "scale_2; FP8 whole 128-row blocks), else two; off runs two products (the older path, for comparison)"},
    {"TANDEM_MLP_FUSE", "auto", "auto|on|off",
     "CUDA engine: on runs a dense MLP's gate and up projections and SiLU(gate) x up as one skinny-kernel "
     "launch (1-32 rows, where the shape's tile setting takes two n8-tiles a warp; FP8 at 1-16 rows from the "
     "input's blocked copy: the same bits); off runs "
     "the gate's product, then up's with SiLU(gate) x up in its epilogue (1-32 rows but FP8's 17-24, where it is "
     "measured slower, tdm_matmul_gated_pays; past 32 rows and there up's product and the SiLU x up kernel), for "
     "comparison; auto runs the one launch where it is measured faster: every row "
     "count but 9-24 of NVFP4 held in rows (a build with TDM_MM_NVFP4_TILES=0; tdm_matmul_swiglu_pays), which "
     "run as off does"},
    {"TANDEM_CONCURRENT", "on", "on|off",
     "CUDA engine: on runs a layer's sibling projections of one input on two streams in passes of at most 32 "
     "rows (a GDN layer's in_proj_z and in_proj_b/a, or in_proj_ba, beside in_proj_qkv or in_proj_qkvz; an "
     "attention layer's k_proj and v_proj beside q_proj; a MoE layer's shared expert beside the router and the "
     "routed experts), forked and joined by events, in CUDA graphs as "
     "branches: the same kernels, so the same bits; off runs everything on one stream (the older path, for "
     "comparison)"},
    {"TANDEM_PDL", "on", "on|off",
     "CUDA: on launches the skinny matrix kernels and the norm kernels as programmatic dependent launches "
     "(sm_90+): their CTAs start while the kernel before them finishes, ask for their first weights, and wait "
     "for it before reading their inputs (kernels/pdl.cuh); the same kernels, so the same bits; off launches "
     "each kernel after the one before it has finished (the older path, for comparison)"},
    {"TANDEM_MM_DIRECT", "auto", "auto|on|off",
     "CUDA: which NVFP4 products of 1-16 rows (from x's blocked copy: NVFP4 and FP8 products of 1-32 rows) "
     "have each lane load its activations from global memory (no shared-memory staging, no CTA barrier in "
     "the K loop) instead of the CTA staging them: auto and on at every row count (measured inside the engine's rounds: faster at 1-16 rows; auto is kept for a future "
     "row threshold), off at none; the same operands, so the same bits"},
    {"TANDEM_MM_XB", "on", "on|off",
     "CUDA engine: on has the kernels that write a product's input at 1-32 rows (the norms, the GDN gated "
     "norm, attention's output, SiLU x up) also write its blocked copy, from which the NVFP4 and FP8 products "
     "that load their activations per lane read them: 8 rows a load in 512 contiguous bytes and no permute "
     "(kernels/mm_layout.h); the same values, so the same bits; off reads every input as written (the "
     "older path, for comparison)"},
    {"TANDEM_DRAFT_FORMAT", "stored", "stored|nvfp4|fp8",
     "the MTP drafter's weights: stored reads its layer and the model's head as the checkpoint stores them; "
     "nvfp4 requantizes its BF16 projections (fc, attention, a dense MLP) and a copy of the head to NVFP4 at "
     "load, about a quarter of the bytes a draft token reads; fp8 to block FP8 (128x128 blocks, F32 scales), "
     "about half, with about 4x finer rounding than NVFP4's. The verify reads the model as stored, so "
     "speculative output still equals one-token decode; only the drafts, and so the acceptance, may change"},
    {"TANDEM_HEAD_FORMAT", "stored", "stored|nvfp4|fp8",
     "the model's head (lm_head, or the embedding when tied): stored reads it as the checkpoint stores it; nvfp4 "
     "requantizes a BF16 or F32 head to NVFP4 at load (the embedding keeps its format for the lookup), about a "
     "quarter of the bytes the head reads a step (the 27B's BF16 head: 2.5 GB of a ~15 GB step); fp8 to block FP8 "
     "(128x128 blocks, F32 scales), about half. It changes the logits by the format's rounding of the head (an "
     "opt-in: on the tiny fixtures next-token agreement with transformers went from 95-100 % to 72.5-92.5 % with "
     "nvfp4, to 92.5-100 % with fp8 (bench/results/cpu-head-format-v2.txt); measure it with tandem-prefillcheck "
     "--ref first); speculative output still equals one-token decode under it, and a head stored quantized is kept"},
    {"TANDEM_MOE_GROUPED", "on", "on|off",
     "CUDA engine: on lets MoE layouts (qwen3_next, qwen3_5_moe) prefill TANDEM_PREFILL_CHUNK rows a chunk, "
     "the routed experts of a chunk past 32 rows in the grouped form (the pairs sorted by expert, each "
     "expert's weight tiles decoded once for all of its rows; checked by agreement); off prefills them 32 "
     "rows at a time through the per-pair kernels of decode (the older path, for comparison)"},
    {"TANDEM_GDN_DEFER", "on", "on|off",
     "CUDA engine: on defers a speculative round's GDN commit: the commit only records the accepted rows "
     "and the next pass (verify, tree verify, forward, prefill) applies them to each GDN layer's states as "
     "its recurrence loads them, writing each state once (the same bits); off replays the accepted rows "
     "through the conv and recurrence at the commit (the older path, for comparison)"},
    {"TANDEM_SPEC_DEFER", "on", "on|off",
     "speculative rounds on the CPU reference: on records the accepted path's GDN factors and applies them "
     "when the next load reads the state (deferred commit); off applies them at the commit. The CUDA "
     "engine's switch is TANDEM_GDN_DEFER"},
    {"TANDEM_SPEC_FAULT", "0", "int",
     "testing only: N > 0 makes the speculative engine emit the lowest-logit token as its N-th token, so "
     "tests can show that tandem-exactcheck fails on a real difference; 0 off"},
    {"TANDEM_PREFILL_FAULT", "0", "int",
     "testing only: N > 0 makes tandem-prefillcheck negate the prefill path's logits in the first N prompt "
     "rows (after the forward), so tests can show that its gate fails on a real difference; 0 off"},
};
const int tdm_nsettings = (int)(sizeof tdm_settings / sizeof tdm_settings[0]);

static const struct tdm_setting_def *find(const char *name)
{
    for (int i = 0; i < tdm_nsettings; i++)
        if (strcmp(tdm_settings[i].name, name) == 0) return &tdm_settings[i];
    return NULL;
}

const char *tdm_setting(const char *name)
{
    const struct tdm_setting_def *d = find(name);
    if (!d) {
        fprintf(stderr, "internal error: setting %s is not in the table\n", name);
        abort();
    }
    const char *v = getenv(name);
    return v && *v ? v : d->def;
}

int tdm_setting_int(const char *name, long *out)
{
    const char *v = tdm_setting(name);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 0) return tdm_errf("%s=%s: not a non-negative integer", name, v);
    *out = x;
    return 0;
}

static int in_choice(const char *allowed, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = allowed; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

int tdm_settings_check(void)
{
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "TANDEM_", 7) != 0) continue;
        const char *eq = strchr(*e, '=');
        char name[128];
        size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        if (n >= sizeof name) n = sizeof name - 1;
        memcpy(name, *e, n);
        name[n] = 0;
        const struct tdm_setting_def *d = find(name);
        if (!d) return tdm_errf("environment: unknown switch %s (tandem-run --settings lists them)", name);
        const char *v = eq ? eq + 1 : "";
        if (!*v) continue;
        if (strcmp(d->allowed, "int") == 0) {
            long x;
            if (tdm_setting_int(name, &x) != 0) return tdm_err_prefix("environment");
        } else if (strcmp(d->allowed, "path") != 0 && !in_choice(d->allowed, v)) {
            return tdm_errf("environment: %s=%s: expected one of %s", name, v, d->allowed);
        }
    }
    return 0;
}

void tdm_settings_print(FILE *f)
{
    for (int i = 0; i < tdm_nsettings; i++) {
        const struct tdm_setting_def *d = &tdm_settings[i];
        const char *v = getenv(d->name);
        int from_env = v && *v;
        fprintf(f, "%-24s %-20s %-8s %s (default %s; %s)\n", d->name, from_env ? v : d->def,
                from_env ? "env" : "default", d->meaning, d->def, d->allowed);
    }
}
