/* The layer kernels on the GPU (kernels/layers.h, kernels/moe.h; skips without a device), on the
 * shapes of the tiny fixtures (both layouts), Qwen3.8-27B and Qwen3-Next-80B-A3B (presets.c):
 *   check: each kernel against the CPU reference function it replaces (src/common/ref.c), 32 rows
 *     of random inputs (rows 9 and 21 repeat row 0, row 30 repeats row 3), outputs poisoned (0xff)
 *     before every run. Bounds, per element (an "ulp" below is 2^-7 |ref|, at least one BF16 ulp):
 *       add_rmsnorm: the residual h = bf16(h + y) bit for bit; the norm within 1 ulp (the sum of
 *         squares is a parallel tree, not the CPU's order);
 *       gated norm, conv (+ its state bit for bit): within 1 ulp (the order is the reference's;
 *         only expf may differ by an FP32 ulp from the C library's);
 *       q/k norm + rotary: within 1 ulp + 2^-7 max|normed head| (cos, sin, pow of the GPU), the V
 *         rows appended bit for bit;
 *       recurrence (32 tokens in sequence): o within 1 ulp + 1e-4 max|o| of the head and token, the
 *         state within 1e-4 max|S| of the head (the sums over Dk are parallel);
 *       attention: within 2^-7 (A + |ref|), A = sum_j p_j |v_j| / sum_j p_j (the probabilities are
 *         rounded to BF16 relative to their sub-chunk's max, the reference's relative to the row's);
 *       prefill attention (tdm_attn_prefill; heads of the 27B, the 80B, D 128 and the tiny
 *         fixtures' D 64; 1, 33, 100 and 300 rows at positions 0, 37 and 500; cache rows past the
 *         chunk NaN, the row after the output poisoned and left so): within 2^-7 (A + |ref|) of
 *         the reference (its probabilities are rounded relative to the running max) and a relative
 *         error (L2 over the output) <= 1e-2; against tdm_attn_decode on the same inputs within
 *         2^-6 (A + |ref|) and a relative error <= 1e-2; the launcher's argument checks;
 *       router: the chosen experts equal, the weights within 1 ulp; argmax: equal;
 *       grouped GDN de-interleave (qwen3_next): bit for bit against tdm_ref_gdn_ungroup;
 *       MoE experts (kernels/moe.h), experts in BF16 (also as fused [gate; up] views), FP8 (F32
 *         and BF16 block scales) and NVFP4, the tiny fixture's shape (32 rows) and the 80B's (all
 *         512 experts, top-10; 1, 5 and 32 rows) of top-k pairs (even rows pick among k + 2
 *         experts, so that rows share experts; rows 9, 21 and 30 repeat rows 0 and 3): the pair
 *         order equal to a sort by (expert, pair); the kernels' dots run in their own order
 *         (moe.h), so gate+up is checked against tdm_ref_mlp_act with the dots within 1e-4
 *         sum|x w| and one BF16 ulp per rounding they pass through (act_bound), down on the
 *         kernel's own products against tdm_ref_linear_bf16 within 1e-4 sum|a w| + 1 ulp, both
 *         with a relative error (L2 over the call) <= 1e-2; the combination on the kernels' own
 *         expert outputs within 1 ulp + 1 ulp of the shared value against
 *         tdm_ref_moe_combine (the sigmoid's expf);
 *       MoE grouped form (moe.h; prefill chunks, no twin contract): T = 1, 33, 100 and 512 rows
 *         on the tiny fixture's shape and the 80B's in BF16, FP8 and NVFP4, skewed routing (one
 *         expert in every row, a pool of k + 2 experts taking most of the rest, a quarter of the
 *         experts taking none): act, y and the combination with the per-pair kernels' bounds above,
 *         and the whole MoE output against the reference's chain with a relative error <= 1e-2;
 *   blocked copies (mm_layout.h: xb): add_rmsnorm, the gated norm, attention (chain and tree) and
 *     SiLU x up at 1, 7, 16 and 32 rows with their blocked copy: the output the same bits as without,
 *     the copy equal to the output laid out by tdm_mm_xb_index; 33 rows refused;
 *   twins: for M = 2..32, an M-row call equals M one-row calls made in sequence, bit for bit, on
 *     every output (and the state after M tokens for the conv and the recurrence; for the MoE
 *     experts the products, the experts' outputs and the sums); every element written; attention
 *     and the q/k append also with the position in device memory, and as a CUDA graph captured
 *     once and replayed;
 *   verify forms (tdm_gdn_conv_verify, tdm_gdn_recur_verify): 32 rows give the forward's outputs bit
 *     for bit and leave the state as it was; the forward over the first j rows after them (a commit)
 *     gives the state of j one-row calls, bit for bit;
 *   the deferred commit's forms (layers.h, Deferred commit), the pending count in device memory:
 *     tdm_gdn_conv_pending of 0, 1, 3, 13, 32 rows equals tdm_gdn_conv over them (rows and state)
 *     and copies the gates it carries, eager and from a graph captured at another count; the
 *     recurrence with j = 1, 5, 13, 32 pending rows before 8 rows of its own equals j one-row
 *     tdm_gdn_recur calls followed by the plain form, bit for bit: tdm_gdn_recur_verify_pend (o,
 *     and the state after the j rows written), tdm_gdn_recur_pend (o and the state after j + 8
 *     rows; with no rows of its own the state after j), tdm_gdn_recur_tree_pend on an 8-node tree
 *     with back-ups (o, state after j), and the verify form from a graph captured at another count;
 *   the gated norm inside the recurrence (TANDEM_GDN_FUSED_NORM): each of the six recurrence forms
 *     at M = 1, 8, 32 (the pending ones with 5 rows) equals the form then tdm_gdn_gated_norm, bit
 *     for bit (o, y, y's blocked copy, the state), the counters zero after; its twins; no counters
 *     refused;
 *   trees (the *_tree launchers, layers.h) on five trees of 32 nodes (a chain, branching 4,3,2,1, a
 *     star, a random depth-first tree, a chain of 20 with siblings under node 9), rows sharing
 *     inputs: every node's outputs equal the chain kernels run on its root-to-node path, bit for
 *     bit (GDN conv and recurrence: the verify forms; q/k norm + rotary: q and the K/V rows, the
 *     node's K/V at cache row P + node; attention: tdm_attn_decode over the path's rows); the
 *     chain as a tree equals the chain kernels' 32 rows; each node against the reference along its
 *     path with the bounds above (conv from the state, tdm_ref_gdn_token from S0, rotary at P +
 *     depth, tdm_ref_attn_head over the cache and the path's rows); the states and the cache rows
 *     outside the round's are left alone; a graph captured on one tree and replayed on another
 *     (parents in device memory) equals the eager call;
 *   prefill forms (a prompt chunk; no twin contract): tdm_gdn_conv_prefill equals tdm_gdn_conv bit
 *     for bit (y and the final state, from a non-zero state) at M = 1, 5, 100 (a row stride past C)
 *     and 4096; tdm_gdn_recur_chunked, checked by agreement at M = 1, 63, 64, 65, 300 and 4096 from
 *     a non-zero state with keys near a common direction and gates in the models' ranges, against
 *     tdm_ref_gdn_token and against tdm_gdn_recur: the final state within 1e-4 max|S| of the head,
 *     o within 1 ulp + 1e-4 max|o| of the head and max|d| <= 1.6e-2 max|o| per token and head
 *     (CHUNK_*_TOL, CHUNK_O_REL); the measured worst errors (and the token-serial kernel's own
 *     against the reference) in the messages. */
#include "config.h"
#include "device.h"
#include "err.h"
#include "formats.h"
#include "layers.h"
#include "engine_glue.h"
#include "mm_layout.h"
#include "moe.h"
#include "presets.h"
#include "ref.h"
#include "tap.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "gputest.h"

#define R 32 /* rows of every check and the largest twin */

static tdm_stream st;

static void down(void *h, const void *d, size_t n)
{
    if (tdm_stream_sync(st) != 0 || tdm_cuda_sync() != 0 || tdm_cuda_d2h(h, d, n) != 0) bail("copy from device");
}
static void poison(void *d, size_t n)
{
    if (tdm_cuda_sync() != 0 || tdm_cuda_memset(d, 0xff, n) != 0 || tdm_cuda_sync() != 0) bail("cudaMemset");
}

/* n random BF16 values in [-amp, amp), and their floats */
static void rand_bf16(uint16_t *h, float *f, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) {
        h[i] = tdm_f32_to_bf16(frand() * amp);
        f[i] = tdm_bf16_to_f32(h[i]);
    }
}
/* rows 9 and 21 repeat row 0, row 30 repeats row 3 */
static void share_rows(uint16_t *h, float *f, size_t row)
{
    const int same[3][2] = {{9, 0}, {21, 0}, {30, 3}};
    for (int i = 0; i < 3; i++) {
        memcpy(h + same[i][0] * row, h + same[i][1] * row, row * sizeof *h);
        memcpy(f + same[i][0] * row, f + same[i][1] * row, row * sizeof *f);
    }
}
static float bfv(float x) { return tdm_bf16r(x); }
static float ulp(float ref) { return ldexpf(fabsf(ref), -7); }

/* ---- comparisons ---- */

struct cmp { long n, bad, exact; double worst; };
static void cmp_add(struct cmp *c, float got, float ref, double bound)
{
    const double d = fabs((double)got - (double)ref);
    c->n++;
    if (memcmp(&got, &ref, sizeof got) == 0) c->exact++;
    if (!(d <= bound)) c->bad++;
    const double q = isnan(d) ? INFINITY : d == 0 ? 0 : bound > 0 ? d / bound : INFINITY;
    if (q > c->worst) c->worst = q;
}
static void cmp_ok(const struct cmp *c, const char *label, const char *what)
{
    ok(c->n > 0 && c->bad == 0, "%s: %s: %ld of %ld outside the bound, %.2f%% bit-identical to the reference, worst %.3g "
       "of the bound", label, what, c->bad, c->n, c->n ? 100.0 * c->exact / c->n : 0.0, c->worst);
}

/* ---- twins ---- */

#define TWIN_OUTS 4
struct dout {
    void *d;            /* device: row 0 of the output */
    size_t row_bytes;
    int kind;           /* 0: BF16 (poison 0xffff is NaN, never a result), 1: int32 (>= 0), 2: in/out, not poisoned */
};
struct twin {
    /* rows row0..row0+m-1 (continuing the sequence); devpos 1: the position of row0 copied to device
     * memory and read from there, 2: read from there as set (for graph capture) */
    int (*launch)(void *ctx, int row0, int m, int devpos);
    void (*reset)(void *ctx);                             /* inputs and state back to the start */
    void *ctx;
    int nout;
    struct dout out[TWIN_OUTS];
    void *state;        /* device, or NULL */
    size_t state_bytes;
    int devpos;         /* also compare the call with the position in device memory */
    int32_t *dpos;      /* that position (device), and the position of row 0 */
    int P;
};

static int unwritten(const struct dout *o, const unsigned char *h, int rows)
{
    int n = 0;
    if (o->kind == 0) {
        const uint16_t *p = (const uint16_t *)h;
        for (size_t i = 0; i < rows * o->row_bytes / 2; i++) n += p[i] == 0xffff;
    } else if (o->kind == 1) {
        const int32_t *p = (const int32_t *)h;
        for (size_t i = 0; i < rows * o->row_bytes / 4; i++) n += p[i] < 0;
    }
    return n;
}

static void twin_test(const char *label, const struct twin *t)
{
    unsigned char *one[TWIN_OUTS], *many[TWIN_OUTS], *st1 = NULL, *stm = NULL;
    for (int o = 0; o < t->nout; o++) {
        one[o] = hal(R * t->out[o].row_bytes);
        many[o] = hal(R * t->out[o].row_bytes);
    }
    if (t->state) {
        st1 = hal((size_t)R * t->state_bytes);
        stm = hal(t->state_bytes);
    }
    int bad_rows = 0, bad_state = 0, unw = 0, bad_dev = 0, rc = 0;
    t->reset(t->ctx);
    for (int r = 0; r < R && !rc; r++) {
        for (int o = 0; o < t->nout; o++)
            if (t->out[o].kind != 2) poison(t->out[o].d, R * t->out[o].row_bytes);
        rc = t->launch(t->ctx, r, 1, 0);
        for (int o = 0; o < t->nout && !rc; o++)
            down(one[o] + r * t->out[o].row_bytes, (char *)t->out[o].d + r * t->out[o].row_bytes, t->out[o].row_bytes);
        if (t->state && !rc) down(st1 + (size_t)r * t->state_bytes, t->state, t->state_bytes);
    }
    for (int o = 0; o < t->nout && !rc; o++) unw += unwritten(&t->out[o], one[o], R);
    for (int m = 2; m <= R && !rc; m++) {
        for (int dp = 0; dp <= (t->devpos && (m == 2 || m == 7 || m == R)) && !rc; dp++) {
            t->reset(t->ctx);
            for (int o = 0; o < t->nout; o++)
                if (t->out[o].kind != 2) poison(t->out[o].d, R * t->out[o].row_bytes);
            rc = t->launch(t->ctx, 0, m, dp);
            int bad = 0;
            for (int o = 0; o < t->nout && !rc; o++) {
                down(many[o], t->out[o].d, m * t->out[o].row_bytes);
                for (int r = 0; r < m; r++)
                    if (memcmp(many[o] + r * t->out[o].row_bytes, one[o] + r * t->out[o].row_bytes, t->out[o].row_bytes))
                        bad++;
            }
            if (t->state && !rc) {
                down(stm, t->state, t->state_bytes);
                if (memcmp(stm, st1 + (size_t)(m - 1) * t->state_bytes, t->state_bytes)) bad_state++;
            }
            if (dp) bad_dev += bad;
            else bad_rows += bad;
        }
    }
    ok(!rc && bad_rows == 0 && bad_state == 0 && unw == 0,
       "%s: twins, M = 2..32 rows equal M one-row calls in sequence bit for bit (%d rows differ, %d states differ, %d "
       "outputs unwritten)%s%s", label, bad_rows, bad_state, unw, rc ? ": " : "", rc ? tdm_err() : "");
    if (t->devpos)
        ok(!rc && bad_dev == 0, "%s: the position in device memory gives the same bits (M = 2, 7, 32; %d rows differ)",
           label, bad_dev);
    for (int o = 0; o < t->nout; o++) { free(one[o]); free(many[o]); }
    free(st1);
    free(stm);
}

/* A CUDA graph captured once with the position in device memory, replayed for rows 3..7, equals
 * the eager call bit for bit. */
/* After a verify form that left t's state as it was: j rows in one call from that entry state leave
 * the state of j one-row calls (the commit a round makes). */
static void commit_test(const char *label, const struct twin *t, int j)
{
    unsigned char *sv = hal(t->state_bytes), *sj = hal(t->state_bytes);
    if (t->launch(t->ctx, 0, j, 0) != 0) bail(label);
    down(sv, t->state, t->state_bytes);
    t->reset(t->ctx);
    for (int r = 0; r < j; r++)
        if (t->launch(t->ctx, r, 1, 0) != 0) bail(label);
    down(sj, t->state, t->state_bytes);
    ok(memcmp(sv, sj, t->state_bytes) == 0,
       "%s: after the verify form, %d rows from the entry state leave the state of %d one-row calls", label, j, j);
    free(sv);
    free(sj);
}

static void graph_test(const char *label, const struct twin *t)
{
    const int r0 = 3, m = 5;
    const int32_t pos = t->P + r0;
    unsigned char *eager[TWIN_OUTS], *replay[TWIN_OUTS];
    int rc = 0, bad = 0;
    tdm_graph g = NULL;
    for (int o = 0; o < t->nout; o++) {
        eager[o] = hal(m * t->out[o].row_bytes);
        replay[o] = hal(m * t->out[o].row_bytes);
    }
    t->reset(t->ctx);
    for (int o = 0; o < t->nout; o++) poison(t->out[o].d, R * t->out[o].row_bytes);
    rc = t->launch(t->ctx, r0, m, 0);
    for (int o = 0; o < t->nout && !rc; o++)
        down(eager[o], (char *)t->out[o].d + r0 * t->out[o].row_bytes, m * t->out[o].row_bytes);
    up(t->dpos, &pos, 4);
    rc = rc || tdm_graph_begin(st) || t->launch(t->ctx, r0, m, 2) || tdm_graph_end(st, &g);
    t->reset(t->ctx);
    for (int o = 0; o < t->nout; o++) poison(t->out[o].d, R * t->out[o].row_bytes);
    rc = rc || tdm_graph_launch(g, st);
    for (int o = 0; o < t->nout && !rc; o++) {
        down(replay[o], (char *)t->out[o].d + r0 * t->out[o].row_bytes, m * t->out[o].row_bytes);
        bad += memcmp(eager[o], replay[o], m * t->out[o].row_bytes) != 0;
    }
    ok(!rc && bad == 0, "%s: graph replay (position in device memory) equals eager, rows 3..7 (%d outputs differ)%s%s",
       label, bad, rc ? ": " : "", rc ? tdm_err() : "");
    if (g) tdm_graph_destroy(g);
    for (int o = 0; o < t->nout; o++) { free(eager[o]); free(replay[o]); }
}

/* ---- the shapes ---- */

struct shape { const char *name; struct tdm_config c; };
static struct shape shapes[4];
static int nshapes;

static void add_shape(const char *label, const char *preset, enum tdm_arch arch)
{
    struct shape *s = &shapes[nshapes];
    if (tdm_preset(preset, arch, &s->c) != 0) bail("preset");
    s->name = label;
    nshapes++;
}

/* ================================================================================================
 * add_rmsnorm
 */
struct norm_ctx { uint16_t *dh, *dy, *dout, *h0; float *dw; int H; float eps; };
static int norm_launch(void *p, int r0, int m, int devpos)
{
    struct norm_ctx *c = p;
    (void)devpos;
    const size_t H = c->H;
    return tdm_add_rmsnorm(c->dh + r0 * H, c->dy + r0 * H, H, c->dw, c->H, m, c->eps, c->dout + r0 * H, NULL, st);
}
static void norm_reset(void *p)
{
    struct norm_ctx *c = p;
    up(c->dh, c->h0, (size_t)R * c->H * 2);
}

static void test_norm(const struct shape *s)
{
    const int H = s->c.hidden;
    const float eps = s->c.rms_eps;
    char label[128];
    snprintf(label, sizeof label, "%s add_rmsnorm H %d", s->name, H);
    const size_t n = (size_t)R * H;
    uint16_t *h = hal(n * 2), *y = hal(n * 2), *out = hal(n * 2), *hg = hal(n * 2);
    float *hf = hal(n * 4), *yf = hal(n * 4), *w = hal(H * 4), *x = hal(H * 4), *ref = hal(H * 4);
    rand_bf16(h, hf, n, 4.0f);
    rand_bf16(y, yf, n, 4.0f);
    share_rows(h, hf, H);
    share_rows(y, yf, H);
    for (int i = 0; i < H; i++) w[i] = bfv(frand() * 0.5f);
    struct norm_ctx c = {dal(n * 2), dal(n * 2), dal(n * 2), h, dal(H * 4), H, eps};
    up(c.dy, y, n * 2);
    up(c.dw, w, H * 4);
    for (int add = 1; add >= 0; add--) {
        norm_reset(&c);
        poison(c.dout, n * 2);
        if (tdm_add_rmsnorm(c.dh, add ? c.dy : NULL, H, c.dw, H, R, eps, c.dout, NULL, st) != 0) bail("tdm_add_rmsnorm");
        down(out, c.dout, n * 2);
        down(hg, c.dh, n * 2);
        struct cmp cn = {0}, ch = {0};
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < H; i++) {
                const size_t at = (size_t)r * H + i;
                x[i] = add ? bfv(hf[at] + yf[at]) : hf[at];
                cmp_add(&ch, tdm_bf16_to_f32(hg[at]), x[i], 0);
            }
            tdm_ref_rmsnorm(x, w, H, eps, ref);
            for (int i = 0; i < H; i++) cmp_add(&cn, tdm_bf16_to_f32(out[(size_t)r * H + i]), ref[i], ulp(ref[i]));
        }
        if (add) ok(ch.bad == 0 && ch.exact == ch.n, "%s: residual h = bf16(h + y) bit for bit (%ld of %ld differ)", label,
                    ch.n - ch.exact, ch.n);
        else ok(ch.exact == ch.n, "%s: without y, h is left alone", label);
        cmp_ok(&cn, label, add ? "check against bf16(h + y), tdm_ref_rmsnorm (1 ulp)" : "check without the add (1 ulp)");
    }
    /* tdm_add_rmsnorm_to: rows ldo apart, at column 0 and at column H of the wider rows (the MTP's fc
     * input), nothing else of the wider rows written. 2H: the vector kernel, the rows of the plain
     * call above (out, its last pass: no add) bit for bit; 2H + 3 (rows not 16-byte aligned): the
     * element-wise kernel, whose sum runs in another order, against the reference (1 ulp). */
    for (int form = 0; form < 2; form++) {
        const int64_t ldo = 2 * (int64_t)H + (form ? 3 : 0);
        const size_t nw = (size_t)R * ldo;
        uint16_t *dw2 = dal(nw * 2), *w2 = hal(nw * 2), *p2 = hal(nw * 2);
        poison(dw2, nw * 2);
        down(p2, dw2, nw * 2);
        norm_reset(&c);
        if (tdm_add_rmsnorm_to(c.dh, NULL, H, c.dw, H, R, eps, dw2, ldo, NULL, st) != 0 ||
            tdm_add_rmsnorm_to(c.dh, NULL, H, c.dw, H, R, eps, dw2 + H, ldo, NULL, st) != 0)
            bail("tdm_add_rmsnorm_to");
        down(w2, dw2, nw * 2);
        long bad = 0;
        struct cmp cw = {0};
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < H; i++) x[i] = hf[(size_t)r * H + i];
            tdm_ref_rmsnorm(x, w, H, eps, ref);
            for (int64_t i = 0; i < ldo; i++) {
                const uint16_t got = w2[(size_t)r * ldo + i];
                if (i >= 2 * H) bad += got != p2[(size_t)r * ldo + i];
                else if (form == 0) bad += got != out[(size_t)r * H + i % H];
                else cmp_add(&cw, tdm_bf16_to_f32(got), ref[i % H], ulp(ref[i % H]));
            }
        }
        ok(bad == 0, "%s: rows %lld apart, at columns 0 and H: %s, the rest untouched (%ld of %ld differ)", label,
           (long long)ldo, form ? "columns past 2H" : "the plain call's rows bit for bit", bad, (long)nw);
        if (form) cmp_ok(&cw, label, "rows 2H + 3 apart (the element-wise kernel): check without the add (1 ulp)");
        tdm_cuda_free(dw2); free(w2); free(p2);
    }
    struct twin t = {norm_launch, norm_reset, &c, 2, {{c.dout, (size_t)H * 2, 0}, {c.dh, (size_t)H * 2, 2}}, NULL, 0, 0, NULL, 0};
    twin_test(label, &t);
    tdm_cuda_free(c.dh); tdm_cuda_free(c.dy); tdm_cuda_free(c.dout); tdm_cuda_free(c.dw);
    free(h); free(y); free(out); free(hg); free(hf); free(yf); free(w); free(x); free(ref);
}

/* ================================================================================================
 * GDN gated norm
 */
struct gn_ctx { uint16_t *dO, *dz, *dy; float *dw; int Hv, Dv; float eps; };
static int gn_launch(void *p, int r0, int m, int devpos)
{
    struct gn_ctx *c = p;
    (void)devpos;
    const size_t row = (size_t)c->Hv * c->Dv;
    return tdm_gdn_gated_norm(c->dO + r0 * row, c->dz + r0 * row, row, c->dw, m, c->Hv, c->Dv, c->eps, c->dy + r0 * row, NULL, st);
}
static void noop_reset(void *p) { (void)p; }

static void test_gated_norm(const struct shape *s)
{
    const int Hv = s->c.gdn_v_heads, Dv = s->c.gdn_v_dim;
    const size_t row = (size_t)Hv * Dv, n = R * row;
    char label[128];
    snprintf(label, sizeof label, "%s gdn_gated_norm Hv %d Dv %d", s->name, Hv, Dv);
    uint16_t *o = hal(n * 2), *z = hal(n * 2), *y = hal(n * 2);
    float *of = hal(n * 4), *zf = hal(n * 4), *w = hal(Dv * 4), *ref = hal(Dv * 4);
    rand_bf16(o, of, n, 2.0f);
    rand_bf16(z, zf, n, 4.0f);
    share_rows(o, of, row);
    share_rows(z, zf, row);
    for (int i = 0; i < Dv; i++) w[i] = bfv(1.0f + frand() * 0.5f);
    struct gn_ctx c = {dal(n * 2), dal(n * 2), dal(n * 2), dal(Dv * 4), Hv, Dv, s->c.rms_eps};
    up(c.dO, o, n * 2);
    up(c.dz, z, n * 2);
    up(c.dw, w, Dv * 4);
    poison(c.dy, n * 2);
    if (gn_launch(&c, 0, R, 0) != 0) bail("tdm_gdn_gated_norm");
    down(y, c.dy, n * 2);
    struct cmp cm = {0};
    for (size_t hd = 0; hd < (size_t)R * Hv; hd++) {
        memcpy(ref, of + hd * Dv, Dv * 4);
        tdm_ref_gated_norm(ref, zf + hd * Dv, w, Dv, s->c.rms_eps);
        for (int j = 0; j < Dv; j++) cmp_add(&cm, tdm_bf16_to_f32(y[hd * Dv + j]), ref[j], ulp(ref[j]));
    }
    cmp_ok(&cm, label, "check against tdm_ref_gated_norm (1 ulp)");
    struct twin t = {gn_launch, noop_reset, &c, 1, {{c.dy, row * 2, 0}}, NULL, 0, 0, NULL, 0};
    twin_test(label, &t);
    tdm_cuda_free(c.dO); tdm_cuda_free(c.dz); tdm_cuda_free(c.dy); tdm_cuda_free(c.dw);
    free(o); free(z); free(y); free(of); free(zf); free(w); free(ref);
}

/* ================================================================================================
 * q/k norm + rotary + KV append
 */
struct qk_ctx {
    uint16_t *dqg, *dk, *dv, *dq, *dkc, *dvc;
    float *dqn, *dkn;
    int32_t *dpos;
    int Hq, Hkv, D, Rd, P, ctx;
    double theta;
    float eps;
};
static int qk_launch(void *p, int r0, int m, int devpos)
{
    struct qk_ctx *c = p;
    const size_t ldqg = (size_t)c->Hq * 2 * c->D, ldkv = (size_t)c->Hkv * c->D;
    if (devpos == 1) {
        const int32_t pos = c->P + r0;
        up(c->dpos, &pos, 4);
    }
    /* with the position on the device, the host value is only an upper bound */
    return tdm_qk_norm_rope(c->dqg + r0 * ldqg, ldqg, c->dk + r0 * ldkv, c->dv + r0 * ldkv, ldkv, c->dqn, c->dkn, m, c->Hq,
                            c->Hkv, c->D, c->Rd, c->theta, c->eps, c->P + r0, devpos ? c->dpos : NULL, c->ctx,
                            c->dq + r0 * (size_t)c->Hq * c->D, c->dkc, c->dvc, st);
}

/* The q/k norm tests' inputs: R random rows of the gated q (ldqg), k and v (ldkv), with rows that
 * share their values (share_rows), and the two norms' weights of D; uploaded to the device copies. */
static void qk_inputs(size_t ldqg, size_t ldkv, int D, uint16_t *qg, float *qgf, uint16_t *k, float *kf, uint16_t *v,
                      float *vf, float *qn, float *kn, uint16_t *dqg, uint16_t *dk, uint16_t *dv, float *dqn, float *dkn)
{
    rand_bf16(qg, qgf, R * ldqg, 3.0f);
    rand_bf16(k, kf, R * ldkv, 3.0f);
    rand_bf16(v, vf, R * ldkv, 3.0f);
    share_rows(qg, qgf, ldqg);
    share_rows(k, kf, ldkv);
    share_rows(v, vf, ldkv);
    for (int i = 0; i < D; i++) { qn[i] = bfv(frand() * 0.5f); kn[i] = bfv(frand() * 0.5f); }
    up(dqg, qg, R * ldqg * 2);
    up(dk, k, R * ldkv * 2);
    up(dv, v, R * ldkv * 2);
    up(dqn, qn, D * 4);
    up(dkn, kn, D * 4);
}

/* One row's q heads (q_row, Hq x D) and k heads (k_row, Hkv x D) as the kernel wrote them against
 * tdm_ref_rmsnorm + tdm_ref_rope_bf16 at position pos of the row's gated q (qgf_row: each head's D
 * q values, then its D gate values) and k (kf_row), into cq and ck: 1 ulp + 2^-7 of the head's
 * largest. ref: D floats of scratch. */
static void qk_ref_row(const struct shape *s, const float *qgf_row, const float *kf_row, const float *qn, const float *kn,
                       int pos, const uint16_t *q_row, const uint16_t *k_row, struct cmp *cq, struct cmp *ck, float *ref)
{
    const int Hq = s->c.n_q_heads, Hkv = s->c.n_kv_heads, D = s->c.head_dim, Rd = s->c.rotary_dim;
    for (int hd = 0; hd < Hq + Hkv; hd++) {
        const float *src = hd < Hq ? qgf_row + (size_t)hd * 2 * D : kf_row + (size_t)(hd - Hq) * D;
        tdm_ref_rmsnorm(src, hd < Hq ? qn : kn, D, s->c.rms_eps, ref);
        float mx = 0;
        for (int i = 0; i < D; i++) mx = fmaxf(mx, fabsf(ref[i]));
        tdm_ref_rope_bf16(ref, Rd, pos, s->c.rope_theta);
        const uint16_t *got = hd < Hq ? q_row + (size_t)hd * D : k_row + (size_t)(hd - Hq) * D;
        for (int i = 0; i < D; i++)
            cmp_add(hd < Hq ? cq : ck, tdm_bf16_to_f32(got[i]), ref[i], ulp(ref[i]) + ldexpf(mx, -7));
    }
}

static void test_qk(const struct shape *s, int P)
{
    const int Hq = s->c.n_q_heads, Hkv = s->c.n_kv_heads, D = s->c.head_dim, Rd = s->c.rotary_dim;
    const size_t ldqg = (size_t)Hq * 2 * D, ldkv = (size_t)Hkv * D;
    const int ctx = P + R;
    char label[160];
    snprintf(label, sizeof label, "%s qk_norm_rope Hq %d Hkv %d D %d R %d at %d", s->name, Hq, Hkv, D, Rd, P);
    uint16_t *qg = hal(R * ldqg * 2), *k = hal(R * ldkv * 2), *v = hal(R * ldkv * 2), *q = hal(R * Hq * D * 2);
    uint16_t *kc = hal(R * ldkv * 2), *vc = hal(R * ldkv * 2);
    float *qgf = hal(R * ldqg * 4), *kf = hal(R * ldkv * 4), *vf = hal(R * ldkv * 4), *qn = hal(D * 4), *kn = hal(D * 4);
    float *ref = hal(D * 4);
    struct qk_ctx c = {dal(R * ldqg * 2), dal(R * ldkv * 2), dal(R * ldkv * 2), dal(R * Hq * D * 2),
                       dal((size_t)ctx * ldkv * 2), dal((size_t)ctx * ldkv * 2), dal(D * 4), dal(D * 4), dal(4),
                       Hq, Hkv, D, Rd, P, ctx, s->c.rope_theta, s->c.rms_eps};
    qk_inputs(ldqg, ldkv, D, qg, qgf, k, kf, v, vf, qn, kn, c.dqg, c.dk, c.dv, c.dqn, c.dkn);
    uint16_t *dkrows = c.dkc + (size_t)P * ldkv, *dvrows = c.dvc + (size_t)P * ldkv;
    poison(c.dq, R * Hq * D * 2);
    poison(dkrows, R * ldkv * 2);
    poison(dvrows, R * ldkv * 2);
    if (qk_launch(&c, 0, R, 0) != 0) bail("tdm_qk_norm_rope");
    down(q, c.dq, R * Hq * D * 2);
    down(kc, dkrows, R * ldkv * 2);
    down(vc, dvrows, R * ldkv * 2);
    struct cmp cq = {0}, ck = {0};
    int vbad = 0;
    for (int r = 0; r < R; r++) {
        qk_ref_row(s, qgf + r * ldqg, kf + r * ldkv, qn, kn, P + r, q + (size_t)r * Hq * D, kc + r * ldkv, &cq, &ck, ref);
        vbad += memcmp(vc + r * ldkv, v + r * ldkv, ldkv * 2) != 0;
    }
    cmp_ok(&cq, label, "q against tdm_ref_rmsnorm + tdm_ref_rope_bf16 (1 ulp + 2^-7 max)");
    cmp_ok(&ck, label, "k cache rows against tdm_ref_rmsnorm + tdm_ref_rope_bf16 (1 ulp + 2^-7 max)");
    ok(vbad == 0, "%s: v cache rows are the v rows (%d rows differ)", label, vbad);
    struct twin t = {qk_launch, noop_reset, &c, 3,
                     {{c.dq, (size_t)Hq * D * 2, 0}, {dkrows, ldkv * 2, 0}, {dvrows, ldkv * 2, 0}}, NULL, 0, 1, c.dpos, P};
    twin_test(label, &t);
    graph_test(label, &t);
    tdm_cuda_free(c.dqg); tdm_cuda_free(c.dk); tdm_cuda_free(c.dv); tdm_cuda_free(c.dq); tdm_cuda_free(c.dkc);
    tdm_cuda_free(c.dvc); tdm_cuda_free(c.dqn); tdm_cuda_free(c.dkn); tdm_cuda_free(c.dpos);
    free(qg); free(k); free(v); free(q); free(kc); free(vc); free(qgf); free(kf); free(vf); free(qn); free(kn); free(ref);
}

/* ================================================================================================
 * GDN conv
 */
struct conv_ctx { uint16_t *dx, *dy, *dst, *st0; float *dw; int C, K; };
static int conv_launch(void *p, int r0, int m, int devpos)
{
    struct conv_ctx *c = p;
    (void)devpos;
    return tdm_gdn_conv(c->dx + (size_t)r0 * c->C, c->C, c->dw, c->dst, m, c->C, c->K, c->dy + (size_t)r0 * c->C, st);
}
static void conv_reset(void *p)
{
    struct conv_ctx *c = p;
    up(c->dst, c->st0, (size_t)(c->K - 1) * c->C * 2);
}

static void test_conv(const struct shape *s)
{
    const int C = tdm_gdn_conv_dim(&s->c), K = s->c.conv_kernel;
    const size_t n = (size_t)R * C, ns = (size_t)(K - 1) * C;
    char label[128];
    snprintf(label, sizeof label, "%s gdn_conv C %d K %d", s->name, C, K);
    uint16_t *x = hal(n * 2), *y = hal(n * 2), *s0 = hal(ns * 2), *sg = hal(ns * 2);
    float *xf = hal(n * 4), *sf = hal(ns * 4), *w = hal((size_t)C * K * 4), *ref = hal(n * 4);
    rand_bf16(x, xf, n, 3.0f);
    share_rows(x, xf, C);
    rand_bf16(s0, sf, ns, 3.0f);
    for (size_t i = 0; i < (size_t)C * K; i++) w[i] = bfv(frand() * 0.6f);
    struct conv_ctx c = {dal(n * 2), dal(n * 2), dal(ns * 2), s0, dal((size_t)C * K * 4), C, K};
    up(c.dx, x, n * 2);
    up(c.dw, w, (size_t)C * K * 4);
    conv_reset(&c);
    poison(c.dy, n * 2);
    if (conv_launch(&c, 0, R, 0) != 0) bail("tdm_gdn_conv");
    down(y, c.dy, n * 2);
    down(sg, c.dst, ns * 2);
    tdm_ref_gdn_conv(w, C, K, sf, xf, R, ref);
    struct cmp cm = {0}, cs = {0};
    for (size_t i = 0; i < n; i++) cmp_add(&cm, tdm_bf16_to_f32(y[i]), ref[i], ulp(ref[i]));
    for (size_t i = 0; i < ns; i++) cmp_add(&cs, tdm_bf16_to_f32(sg[i]), sf[i], 0);
    cmp_ok(&cm, label, "check against tdm_ref_gdn_conv, 32 tokens (1 ulp)");
    ok(cs.bad == 0 && cs.exact == cs.n, "%s: the conv state after 32 tokens equals the reference's bit for bit (%ld of %ld "
       "differ)", label, cs.n - cs.exact, cs.n);
    struct twin t = {conv_launch, conv_reset, &c, 1, {{c.dy, (size_t)C * 2, 0}}, c.dst, ns * 2, 0, NULL, 0};
    twin_test(label, &t);
    /* the verify form, then a commit of j rows against j one-row calls */
    uint16_t *yv = hal(n * 2), *sv = hal(ns * 2);
    conv_reset(&c);
    poison(c.dy, n * 2);
    if (tdm_gdn_conv_verify(c.dx, C, c.dw, c.dst, R, C, K, c.dy, st) != 0) bail("tdm_gdn_conv_verify");
    down(yv, c.dy, n * 2);
    down(sv, c.dst, ns * 2);
    ok(memcmp(yv, y, n * 2) == 0 && memcmp(sv, s0, ns * 2) == 0,
       "%s: the verify form gives the forward's 32 rows bit for bit and leaves the state as it was", label);
    commit_test(label, &t, 13);
    /* the deferred commit's conv (tdm_gdn_conv_pending): the count from device memory, against
     * tdm_gdn_conv over those rows, bit for bit; with the gate copy it carries (3C + 5 values: more
     * than one per thread); one graph captured at one count and replayed at another */
    {
        const int js[5] = {0, 1, 3, 13, 32};
        const int64_t gn = 3 * (int64_t)C + 5;
        int32_t *dn = dal(4);
        uint16_t *dg = dal((size_t)gn * 2), *yr = hal(n * 2), *sr = hal(ns * 2), *yp = hal(n * 2), *sp = hal(ns * 2);
        uint16_t *gp = hal((size_t)gn * 2);
        tdm_graph g = NULL;
        for (int i = 0; i < 5; i++) {
            const int j = js[i];
            conv_reset(&c);
            poison(c.dy, n * 2);
            if (tdm_gdn_conv(c.dx, C, c.dw, c.dst, j, C, K, c.dy, st) != 0) bail("tdm_gdn_conv");
            down(yr, c.dy, n * 2);
            down(sr, c.dst, ns * 2);
            int same[2] = {1, 1};
            for (int graphed = 0; graphed < 2; graphed++) {
                const int32_t j32 = j, other = (j + 7) % 33;
                conv_reset(&c);
                poison(c.dy, n * 2);
                poison(dg, (size_t)gn * 2);
                int rc = 0;
                if (graphed && !g) { /* captured at another count */
                    up(dn, &other, 4);
                    rc = tdm_graph_begin(st) ||
                         tdm_gdn_conv_pending(c.dx, C, c.dw, c.dst, dn, C, K, c.dy, c.dx, dg, gn, st) ||
                         tdm_graph_end(st, &g);
                    conv_reset(&c);
                    poison(c.dy, n * 2);
                }
                up(dn, &j32, 4);
                rc = rc || (graphed ? tdm_graph_launch(g, st) : tdm_gdn_conv_pending(c.dx, C, c.dw, c.dst, dn, C, K, c.dy, c.dx,
                                                                                      dg, gn, st));
                if (rc) bail("tdm_gdn_conv_pending");
                down(yp, c.dy, n * 2);
                down(sp, c.dst, ns * 2);
                down(gp, dg, (size_t)gn * 2);
                same[graphed] = memcmp(yp, yr, (size_t)j * C * 2) == 0 && memcmp(sp, sr, ns * 2) == 0 &&
                                memcmp(gp, x, (size_t)gn * 2) == 0;
            }
            ok(same[0] && same[1], "%s: tdm_gdn_conv_pending of %d rows (the count in device memory; eager %s, a graph "
               "captured at another count %s): tdm_gdn_conv's rows and state bit for bit, the gates copied", label, j,
               same[0] ? "same" : "DIFFERS", same[1] ? "same" : "DIFFERS");
        }
        if (g) tdm_graph_destroy(g);
        tdm_cuda_free(dn); tdm_cuda_free(dg);
        free(yr); free(sr); free(yp); free(sp); free(gp);
    }
    free(yv); free(sv);
    tdm_cuda_free(c.dx); tdm_cuda_free(c.dy); tdm_cuda_free(c.dst); tdm_cuda_free(c.dw);
    free(x); free(y); free(s0); free(sg); free(xf); free(sf); free(w); free(ref);
}

/* ================================================================================================
 * GDN recurrence
 */
struct rec_ctx {
    uint16_t *dqkv, *db, *da, *dO;
    float *dA, *ddt, *dS, *S0;
    int Hk, Hv, Dk, Dv, C;
    const struct tdm_gdn_gnorm *gn;   /* the gated norm inside (rows from 0; its blocked copy not used), or NULL */
};
static int rec_launch(void *p, int r0, int m, int devpos)
{
    struct rec_ctx *c = p;
    (void)devpos;
    struct tdm_gdn_gnorm g;
    if (c->gn) {
        g = *c->gn;
        g.z += (size_t)r0 * g.ldz;
        g.y += (size_t)r0 * c->Hv * c->Dv;
        g.yb = NULL;
    }
    return tdm_gdn_recur(c->dqkv + (size_t)r0 * c->C, c->db + (size_t)r0 * c->Hv, c->Hv, c->da + (size_t)r0 * c->Hv, c->Hv,
                         c->dA, c->ddt, c->dS, m, c->Hk, c->Hv, c->Dk, c->Dv, c->dO + (size_t)r0 * c->Hv * c->Dv,
                         c->gn ? &g : NULL, st);
}
static void rec_reset(void *p)
{
    struct rec_ctx *c = p;
    up(c->dS, c->S0, (size_t)c->Hv * c->Dk * c->Dv * 4);
}

/* The recurrence tests' inputs: R random rows of the conv's output (C: q, k, v), of b and a (Hv),
 * with rows that share their values; A and dt a head; the nS values of the starting state. */
static void rec_inputs(int C, int Hv, size_t nS, uint16_t *qkv, float *qkvf, uint16_t *b, float *bf_, uint16_t *a, float *af,
                       float *A, float *dt, float *S0)
{
    rand_bf16(qkv, qkvf, (size_t)R * C, 1.0f);
    share_rows(qkv, qkvf, C);
    rand_bf16(b, bf_, (size_t)R * Hv, 3.0f);
    rand_bf16(a, af, (size_t)R * Hv, 3.0f);
    share_rows(b, bf_, Hv);
    share_rows(a, af, Hv);
    for (int h = 0; h < Hv; h++) { A[h] = frand() * 1.5f - 0.5f; dt[h] = frand(); }
    for (size_t i = 0; i < nS; i++) S0[i] = frand() * 0.5f;
}

/* One token's recurrence output as the kernel wrote it (o_row, Hv x Dv) against the reference's
 * (oref, FP32, rounded to BF16 here), into co: 1 ulp + 1e-4 of the head's largest. */
static void rec_o_cmp(int Hv, int Dv, const float *oref, const uint16_t *o_row, struct cmp *co)
{
    for (int h = 0; h < Hv; h++) {
        float mx = 0;
        for (int j = 0; j < Dv; j++) mx = fmaxf(mx, fabsf(bfv(oref[h * Dv + j])));
        for (int j = 0; j < Dv; j++) {
            const float r = bfv(oref[h * Dv + j]);
            cmp_add(co, tdm_bf16_to_f32(o_row[h * Dv + j]), r, ulp(r) + 1e-4 * mx);
        }
    }
}

static void test_recur(const struct shape *s)
{
    const int Hk = s->c.gdn_k_heads, Hv = s->c.gdn_v_heads, Dk = s->c.gdn_k_dim, Dv = s->c.gdn_v_dim;
    const int C = tdm_gdn_conv_dim(&s->c);
    const size_t nS = (size_t)Hv * Dk * Dv, no = (size_t)Hv * Dv;
    char label[160];
    snprintf(label, sizeof label, "%s gdn_recur Hk %d Hv %d Dk %d Dv %d", s->name, Hk, Hv, Dk, Dv);
    uint16_t *qkv = hal((size_t)R * C * 2), *b = hal((size_t)R * Hv * 2), *a = hal((size_t)R * Hv * 2);
    uint16_t *o = hal(R * no * 2);
    float *qkvf = hal((size_t)R * C * 4), *bf_ = hal((size_t)R * Hv * 4), *af = hal((size_t)R * Hv * 4);
    float *A = hal(Hv * 4), *dt = hal(Hv * 4), *S0 = hal(nS * 4), *S = hal(nS * 4), *Sg = hal(nS * 4);
    float *oref = hal(no * 4), *scratch = hal((size_t)(2 * Hk * Dk + Dv) * 4);
    rec_inputs(C, Hv, nS, qkv, qkvf, b, bf_, a, af, A, dt, S0);
    struct rec_ctx c = {dal((size_t)R * C * 2), dal((size_t)R * Hv * 2), dal((size_t)R * Hv * 2), dal(R * no * 2),
                        dal(Hv * 4), dal(Hv * 4), dal(nS * 4), S0, Hk, Hv, Dk, Dv, C, NULL};
    up(c.dqkv, qkv, (size_t)R * C * 2);
    up(c.db, b, (size_t)R * Hv * 2);
    up(c.da, a, (size_t)R * Hv * 2);
    up(c.dA, A, Hv * 4);
    up(c.ddt, dt, Hv * 4);
    rec_reset(&c);
    poison(c.dO, R * no * 2);
    if (rec_launch(&c, 0, R, 0) != 0) bail("tdm_gdn_recur");
    down(o, c.dO, R * no * 2);
    down(Sg, c.dS, nS * 4);
    memcpy(S, S0, nS * 4);
    struct cmp co = {0}, cs = {0};
    for (int t = 0; t < R; t++) {
        tdm_ref_gdn_token(Hk, Hv, Dk, Dv, A, dt, qkvf + (size_t)t * C, bf_ + (size_t)t * Hv, af + (size_t)t * Hv, S, oref,
                          scratch);
        rec_o_cmp(Hv, Dv, oref, o + (size_t)t * no, &co);
    }
    for (int h = 0; h < Hv; h++) {
        const float *Sh = S + (size_t)h * Dk * Dv;
        float mx = 0;
        for (size_t i = 0; i < (size_t)Dk * Dv; i++) mx = fmaxf(mx, fabsf(Sh[i]));
        for (size_t i = 0; i < (size_t)Dk * Dv; i++) cmp_add(&cs, Sg[(size_t)h * Dk * Dv + i], Sh[i], 1e-4 * mx);
    }
    cmp_ok(&co, label, "o of 32 tokens against tdm_ref_gdn_token (1 ulp + 1e-4 max|o|)");
    cmp_ok(&cs, label, "the state after 32 tokens against tdm_ref_gdn_token (1e-4 max|S|)");
    struct twin t = {rec_launch, rec_reset, &c, 1, {{c.dO, no * 2, 0}}, c.dS, nS * 4, 0, NULL, 0};
    twin_test(label, &t);
    /* the verify form, then a commit of j rows against j one-row calls */
    uint16_t *ov = hal(R * no * 2);
    float *Sv = hal(nS * 4);
    rec_reset(&c);
    poison(c.dO, R * no * 2);
    if (tdm_gdn_recur_verify(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, R, Hk, Hv, Dk, Dv, c.dO, NULL, st) != 0)
        bail("tdm_gdn_recur_verify");
    down(ov, c.dO, R * no * 2);
    down(Sv, c.dS, nS * 4);
    ok(memcmp(ov, o, R * no * 2) == 0 && memcmp(Sv, S0, nS * 4) == 0,
       "%s: the verify form gives the forward's 32 rows bit for bit and leaves the state as it was", label);
    commit_test(label, &t, 13);
    /* the deferred commit's recurrence (layers.h, Deferred commit): j pending rows (rows 0..j-1,
     * their count in device memory) applied inside the pending forms before their own 8 rows
     * (rows 0..7 again), against j one-row tdm_gdn_recur calls and then the plain form, bit for bit:
     * the verify form (o; S = the state after the j rows), the forward (o; S after j + 8 rows), the
     * forward over no rows of its own (S after j), the tree form on an 8-node tree, and the verify
     * form from a graph captured at another count */
    {
        const int js[4] = {1, 5, 13, 32}, M = 8;
        const int32_t par[8] = {-1, 0, 0, 2, 1, 4, 2, 6};
        int32_t *dn = dal(4), *dpar = dal(sizeof par);
        uint16_t *dov = dal((size_t)M * no * 2), *or_ = hal((size_t)M * no * 2), *otr = hal((size_t)M * no * 2);
        uint16_t *op = hal((size_t)M * no * 2);
        float *Sj = hal(nS * 4), *SjM = hal(nS * 4), *Sp = hal(nS * 4);
        const struct tdm_gdn_pend pd = {c.dqkv, c.db, c.da, Hv, Hv, dn};
        tdm_graph g = NULL;
        up(dpar, par, sizeof par);
        for (int i = 0; i < 4; i++) {
            const int j = js[i];
            const int32_t j32 = j, other = (j + 11) % 33;
            /* the reference: j one-row calls, then the verify, tree and forward forms from there */
            rec_reset(&c);
            for (int r = 0; r < j; r++)
                if (rec_launch(&c, r, 1, 0) != 0) bail("tdm_gdn_recur, one row");
            down(Sj, c.dS, nS * 4);
            if (tdm_gdn_recur_verify(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, M, Hk, Hv, Dk, Dv, dov, NULL, st) != 0)
                bail("tdm_gdn_recur_verify");
            down(or_, dov, (size_t)M * no * 2);
            if (tdm_gdn_recur_tree(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, dpar, M, Hk, Hv, Dk, Dv, dov, NULL, st) != 0)
                bail("tdm_gdn_recur_tree");
            down(otr, dov, (size_t)M * no * 2);
            if (tdm_gdn_recur(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, M, Hk, Hv, Dk, Dv, dov, NULL, st) != 0)
                bail("tdm_gdn_recur");
            down(SjM, c.dS, nS * 4);
            up(dn, &j32, 4);
            /* the verify form */
            rec_reset(&c);
            poison(dov, (size_t)M * no * 2);
            if (tdm_gdn_recur_verify_pend(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, M, Hk, Hv, Dk, Dv, dov, &pd, NULL, st) != 0)
                bail("tdm_gdn_recur_verify_pend");
            down(op, dov, (size_t)M * no * 2);
            down(Sp, c.dS, nS * 4);
            ok(memcmp(op, or_, (size_t)M * no * 2) == 0 && memcmp(Sp, Sj, nS * 4) == 0,
               "%s: tdm_gdn_recur_verify_pend, %d pending rows: the 8 rows' o of %d one-row calls then the verify form, "
               "and the state after the %d rows written, bit for bit", label, j, j, j);
            /* the forward form, with and without rows of its own */
            rec_reset(&c);
            poison(dov, (size_t)M * no * 2);
            if (tdm_gdn_recur_pend(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, M, Hk, Hv, Dk, Dv, dov, &pd, NULL, st) != 0)
                bail("tdm_gdn_recur_pend");
            down(op, dov, (size_t)M * no * 2);
            down(Sp, c.dS, nS * 4);
            int same = memcmp(op, or_, (size_t)M * no * 2) == 0 && memcmp(Sp, SjM, nS * 4) == 0;
            rec_reset(&c);
            if (tdm_gdn_recur_pend(NULL, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, 0, Hk, Hv, Dk, Dv, NULL, &pd, NULL, st) != 0)
                bail("tdm_gdn_recur_pend, no rows");
            down(Sp, c.dS, nS * 4);
            ok(same && memcmp(Sp, Sj, nS * 4) == 0,
               "%s: tdm_gdn_recur_pend, %d pending rows: with 8 rows, their o and the state of %d + 8 one-row calls; with "
               "none, the state of %d, bit for bit", label, j, j, j);
            /* the tree form */
            rec_reset(&c);
            poison(dov, (size_t)M * no * 2);
            if (tdm_gdn_recur_tree_pend(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, dpar, M, Hk, Hv, Dk, Dv, dov, &pd, NULL,
                                        st) != 0)
                bail("tdm_gdn_recur_tree_pend");
            down(op, dov, (size_t)M * no * 2);
            down(Sp, c.dS, nS * 4);
            ok(memcmp(op, otr, (size_t)M * no * 2) == 0 && memcmp(Sp, Sj, nS * 4) == 0,
               "%s: tdm_gdn_recur_tree_pend, %d pending rows, an 8-node tree with back-ups: the nodes' o of %d one-row "
               "calls then the tree form, and the state after the %d rows, bit for bit", label, j, j, j);
            /* a graph of the verify form captured at another count, replayed at j */
            int rc = 0;
            if (!g) {
                up(dn, &other, 4);
                rec_reset(&c);
                rc = tdm_graph_begin(st) ||
                     tdm_gdn_recur_verify_pend(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, M, Hk, Hv, Dk, Dv, dov, &pd, NULL, st) ||
                     tdm_graph_end(st, &g);
                up(dn, &j32, 4);
            }
            rec_reset(&c);
            poison(dov, (size_t)M * no * 2);
            rc = rc || tdm_graph_launch(g, st);
            if (rc) bail("graph of tdm_gdn_recur_verify_pend");
            down(op, dov, (size_t)M * no * 2);
            down(Sp, c.dS, nS * 4);
            ok(memcmp(op, or_, (size_t)M * no * 2) == 0 && memcmp(Sp, Sj, nS * 4) == 0,
               "%s: tdm_gdn_recur_verify_pend from a graph captured at %d pending rows, replayed at %d: the eager bits",
               label, (js[0] + 11) % 33, j);
        }
        if (g) tdm_graph_destroy(g);
        tdm_cuda_free(dn); tdm_cuda_free(dpar); tdm_cuda_free(dov);
        free(or_); free(otr); free(op); free(Sj); free(SjM); free(Sp);
    }
    free(ov); free(Sv);
    tdm_cuda_free(c.dqkv); tdm_cuda_free(c.db); tdm_cuda_free(c.da); tdm_cuda_free(c.dO); tdm_cuda_free(c.dA);
    tdm_cuda_free(c.ddt); tdm_cuda_free(c.dS);
    free(qkv); free(b); free(a); free(o); free(qkvf); free(bf_); free(af); free(A); free(dt); free(S0); free(S); free(Sg);
    free(oref); free(scratch);
}

/* ---- the gated norm inside the recurrence (layers.h: struct tdm_gdn_gnorm) ----
 * Every recurrence form with gn against the same form without it, then tdm_gdn_gated_norm: o, y,
 * y's blocked copy (where Hv Dv has a full slab), and the state, bit for bit, at M = 1, 8 and 32,
 * and the forms other than the trees also at M = RL (rows past the blocks' shared copies of o, read
 * back from o); the pending forms with 5 pending rows; the fused forward's twins (M rows against M
 * one-row calls: o, y and the state); a launch without y refused. */
#define RL (R + 16)
enum { RF_FWD, RF_VERIFY, RF_TREE, RF_PEND, RF_VPEND, RF_TPEND, RF_FORMS };
static const char *const rf_names[RF_FORMS] = {"forward", "verify", "tree", "forward with pending rows",
                                               "verify with pending rows", "tree with pending rows"};
static int rec_form(const struct rec_ctx *c, int f, int M, const int32_t *dpar, const struct tdm_gdn_pend *pd,
                    const struct tdm_gdn_gnorm *gn)
{
    const int Hk = c->Hk, Hv = c->Hv, Dk = c->Dk, Dv = c->Dv;
    switch (f) {
    case RF_FWD: return tdm_gdn_recur(c->dqkv, c->db, Hv, c->da, Hv, c->dA, c->ddt, c->dS, M, Hk, Hv, Dk, Dv, c->dO, gn, st);
    case RF_VERIFY:
        return tdm_gdn_recur_verify(c->dqkv, c->db, Hv, c->da, Hv, c->dA, c->ddt, c->dS, M, Hk, Hv, Dk, Dv, c->dO, gn, st);
    case RF_TREE:
        return tdm_gdn_recur_tree(c->dqkv, c->db, Hv, c->da, Hv, c->dA, c->ddt, c->dS, dpar, M, Hk, Hv, Dk, Dv, c->dO, gn,
                                  st);
    case RF_PEND:
        return tdm_gdn_recur_pend(c->dqkv, c->db, Hv, c->da, Hv, c->dA, c->ddt, c->dS, M, Hk, Hv, Dk, Dv, c->dO, pd, gn, st);
    case RF_VPEND:
        return tdm_gdn_recur_verify_pend(c->dqkv, c->db, Hv, c->da, Hv, c->dA, c->ddt, c->dS, M, Hk, Hv, Dk, Dv, c->dO, pd,
                                         gn, st);
    default:
        return tdm_gdn_recur_tree_pend(c->dqkv, c->db, Hv, c->da, Hv, c->dA, c->ddt, c->dS, dpar, M, Hk, Hv, Dk, Dv, c->dO,
                                       pd, gn, st);
    }
}

static void test_recur_fused(const struct shape *s)
{
    const int Hk = s->c.gdn_k_heads, Hv = s->c.gdn_v_heads, Dk = s->c.gdn_k_dim, Dv = s->c.gdn_v_dim;
    const int C = tdm_gdn_conv_dim(&s->c);
    const size_t nS = (size_t)Hv * Dk * Dv, no = (size_t)Hv * Dv, nxb = (size_t)tdm_mm_xb_elems((int64_t)no);
    char label[160];
    snprintf(label, sizeof label, "%s gdn_recur with the gated norm inside, Hk %d Hv %d Dk %d Dv %d", s->name, Hk, Hv, Dk,
             Dv);
    uint16_t *qkv = hal((size_t)RL * C * 2), *b = hal((size_t)RL * Hv * 2), *a = hal((size_t)RL * Hv * 2);
    uint16_t *z = hal(RL * no * 2);
    float *qkvf = hal((size_t)RL * C * 4), *bf_ = hal((size_t)RL * Hv * 4), *af = hal((size_t)RL * Hv * 4);
    float *zf = hal(RL * no * 4), *A = hal(Hv * 4), *dt = hal(Hv * 4), *S0 = hal(nS * 4), *w = hal(Dv * 4);
    rand_bf16(qkv, qkvf, (size_t)RL * C, 1.0f);
    share_rows(qkv, qkvf, C);
    rand_bf16(b, bf_, (size_t)RL * Hv, 3.0f);
    rand_bf16(a, af, (size_t)RL * Hv, 3.0f);
    rand_bf16(z, zf, RL * no, 4.0f);
    share_rows(z, zf, no);
    for (int h = 0; h < Hv; h++) { A[h] = frand() * 1.5f - 0.5f; dt[h] = frand(); }
    for (size_t i = 0; i < nS; i++) S0[i] = frand() * 0.5f;
    for (int i = 0; i < Dv; i++) w[i] = bfv(1.0f + frand() * 0.5f);
    struct rec_ctx c = {dal((size_t)RL * C * 2), dal((size_t)RL * Hv * 2), dal((size_t)RL * Hv * 2), dal(RL * no * 2),
                        dal(Hv * 4), dal(Hv * 4), dal(nS * 4), S0, Hk, Hv, Dk, Dv, C, NULL};
    uint16_t *dz = dal(RL * no * 2), *dy = dal(RL * no * 2), *dyb = nxb ? dal(nxb * 2) : NULL;
    float *dw = dal(Dv * 4);
    int32_t *dn = dal(4), *dpar = dal(R * 4);
    int32_t par[R];
    for (int t = 0; t < R; t++) par[t] = t ? (t - 1) / 2 : -1;   /* a binary tree, depth first enough for the check */
    const int32_t npend = 5;
    up(c.dqkv, qkv, (size_t)RL * C * 2);
    up(c.db, b, (size_t)RL * Hv * 2);
    up(c.da, a, (size_t)RL * Hv * 2);
    up(c.dA, A, Hv * 4);
    up(c.ddt, dt, Hv * 4);
    up(dz, z, RL * no * 2);
    up(dw, w, Dv * 4);
    up(dpar, par, sizeof par);
    up(dn, &npend, 4);
    const struct tdm_gdn_pend pd = {c.dqkv + (size_t)8 * C, c.db + 8 * Hv, c.da + 8 * Hv, Hv, Hv, dn};
    const struct tdm_gdn_gnorm gn = {dz, (int64_t)no, dw, s->c.rms_eps, dy, NULL};
    const size_t bo = RL * no * 2, bxb = nxb * 2;
    unsigned char *ref[4], *got[4];
    const size_t bytes[4] = {bo, bo, bxb ? bxb : 1, nS * 4};
    for (int i = 0; i < 4; i++) { ref[i] = hal(bytes[i]); got[i] = hal(bytes[i]); }
    const int ms[4] = {1, 8, R, RL};
    int runs = 0, differ = 0, rc = 0;
    char what[160] = "";
    for (int f = 0; f < RF_FORMS && !rc; f++)
        for (int k = 0; k < 4 && !rc; k++) {
            const int M = ms[k];
            if (M > TDM_TREE_MAX && (f == RF_TREE || f == RF_TPEND)) continue;   /* trees: at most 32 nodes */
            struct tdm_gdn_gnorm g = gn;
            g.yb = M <= TDM_MM_XB_ROWS ? dyb : NULL;
            for (int fused = 0; fused < 2 && !rc; fused++) {
                unsigned char **out = fused ? got : ref;
                rec_reset(&c);
                poison(c.dO, bo);
                poison(dy, bo);
                if (dyb) poison(dyb, bxb);
                rc = rec_form(&c, f, M, dpar, &pd, fused ? &g : NULL) ||
                     (!fused && tdm_gdn_gated_norm(c.dO, dz, (int64_t)no, dw, M, Hv, Dv, s->c.rms_eps, dy, g.yb, st));
                if (rc) break;
                down(out[0], c.dO, bo);
                down(out[1], dy, bo);
                if (dyb) down(out[2], dyb, bxb);
                down(out[3], c.dS, nS * 4);
            }
            if (rc) break;
            runs++;
            for (int i = 0; i < 4; i++)
                if ((i != 2 || dyb) && memcmp(ref[i], got[i], bytes[i])) {
                    if (!differ++)
                        snprintf(what, sizeof what, ": first %s at M = %d (%s)", rf_names[f], M,
                                 i == 0 ? "o" : i == 1 ? "y" : i == 2 ? "y's blocked copy" : "the state");
                }
        }
    ok(!rc && differ == 0,
       "%s: the six recurrence forms (forward, verify, tree; each also with 5 pending rows) at M = 1, 8, 32 (and %d but "
       "the trees) give the o, y, y's blocked copy and state of the form then tdm_gdn_gated_norm, bit for bit (%d of %d "
       "runs differ%s)%s%s", label, RL, differ, runs, what, rc ? ": " : "", rc ? tdm_err() : "");
    /* the fused forward's twins */
    c.gn = &gn;
    struct twin t = {rec_launch, rec_reset, &c, 2, {{c.dO, no * 2, 0}, {dy, no * 2, 0}}, c.dS, nS * 4, 0, NULL, 0};
    twin_test(label, &t);
    c.gn = NULL;
    struct tdm_gdn_gnorm noy = gn;
    noy.y = NULL;
    rc = tdm_gdn_recur(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, 1, Hk, Hv, Dk, Dv, c.dO, &noy, st);
    ok(rc != 0 && strstr(tdm_err(), "gated norm") != NULL, "%s: a gated norm without y is refused: %s", label,
       rc ? tdm_err() : "accepted");
    for (int i = 0; i < 4; i++) { free(ref[i]); free(got[i]); }
    tdm_cuda_free(c.dqkv); tdm_cuda_free(c.db); tdm_cuda_free(c.da); tdm_cuda_free(c.dO); tdm_cuda_free(c.dA);
    tdm_cuda_free(c.ddt); tdm_cuda_free(c.dS); tdm_cuda_free(dz); tdm_cuda_free(dy); tdm_cuda_free(dyb);
    tdm_cuda_free(dw); tdm_cuda_free(dn); tdm_cuda_free(dpar);
    free(qkv); free(b); free(a); free(z); free(qkvf); free(bf_); free(af); free(zf); free(A); free(dt); free(S0); free(w);
}
#undef RL

/* ================================================================================================
 * GDN prefill forms (a prompt chunk; layers.h): the conv bit for bit against tdm_gdn_conv, the
 * chunked delta rule within stated bounds of tdm_gdn_recur and of the reference
 */
static void test_conv_prefill(const struct shape *s, int M)
{
    const int C = tdm_gdn_conv_dim(&s->c), K = s->c.conv_kernel, ldx = M == 100 ? C + 8 : C;
    const size_t nx = (size_t)M * ldx, ny = (size_t)M * C, ns = (size_t)(K - 1) * C;
    char label[128];
    snprintf(label, sizeof label, "%s gdn_conv_prefill C %d K %d M %d ldx %d", s->name, C, K, M, ldx);
    uint16_t *x = hal(nx * 2), *y1 = hal(ny * 2), *y2 = hal(ny * 2), *s0 = hal(ns * 2), *s1 = hal(ns * 2), *s2 = hal(ns * 2);
    float *xf = hal(nx * 4), *sf = hal(ns * 4), *w = hal((size_t)C * K * 4);
    rand_bf16(x, xf, nx, 3.0f);
    rand_bf16(s0, sf, ns, 3.0f);
    for (size_t i = 0; i < (size_t)C * K; i++) w[i] = bfv(frand() * 0.6f);
    uint16_t *dx = dal(nx * 2), *dy1 = dal(ny * 2), *dy2 = dal(ny * 2), *ds1 = dal(ns * 2), *ds2 = dal(ns * 2);
    float *dw = dal((size_t)C * K * 4);
    up(dx, x, nx * 2);
    up(dw, w, (size_t)C * K * 4);
    up(ds1, s0, ns * 2);
    up(ds2, s0, ns * 2);
    poison(dy1, ny * 2);
    poison(dy2, ny * 2);
    if (tdm_gdn_conv(dx, ldx, dw, ds1, M, C, K, dy1, st) != 0) bail("tdm_gdn_conv");
    if (tdm_gdn_conv_prefill(dx, ldx, dw, ds2, M, C, K, dy2, st) != 0) bail("tdm_gdn_conv_prefill");
    down(y1, dy1, ny * 2);
    down(y2, dy2, ny * 2);
    down(s1, ds1, ns * 2);
    down(s2, ds2, ns * 2);
    long dy = 0, dst = 0, unw = 0;
    for (size_t i = 0; i < ny; i++) { dy += y1[i] != y2[i]; unw += y2[i] == 0xffff; }
    for (size_t i = 0; i < ns; i++) dst += s1[i] != s2[i];
    ok(dy == 0 && dst == 0 && unw == 0 && memcmp(s1, s0, ns * 2) != 0,
       "%s: y and the final conv state (from a non-zero one) equal tdm_gdn_conv's bit for bit (%ld of %zu outputs, %ld "
       "of %zu state values differ; %ld unwritten)", label, dy, ny, dst, ns, unw);
    tdm_cuda_free(dx); tdm_cuda_free(dy1); tdm_cuda_free(dy2); tdm_cuda_free(ds1); tdm_cuda_free(ds2); tdm_cuda_free(dw);
    free(x); free(y1); free(y2); free(s0); free(s1); free(s2); free(xf); free(sf); free(w);
}

/* The chunked delta rule's bounds (checked by agreement, not bits; layers.h): the final state within
 * CHUNK_S_TOL max|S| of the head; o (BF16) within 1 ulp + CHUNK_O_TOL max|o| of the head over the M
 * tokens (its FP32 error follows the state's scale, not a token's), and no token and head with
 * max|d| above CHUNK_O_REL max|o| of its own (one BF16 rounding flip at the max is 2^-7). */
#define CHUNK_S_TOL 1e-4
#define CHUNK_O_TOL 1e-4
#define CHUNK_O_REL 1.6e-2

/* max|got - ref| / max|ref| per block of n values (a head), the worst over the blocks; and the
 * elements outside tol max|ref| of their block */
static double block_rel(const float *got, const float *ref, size_t nblocks, size_t n, double tol, long *bad)
{
    double worst = 0;
    for (size_t b = 0; b < nblocks; b++) {
        double mx = 0, md = 0;
        for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[b * n + i]));
        for (size_t i = 0; i < n; i++) {
            const double d = fabs((double)got[b * n + i] - ref[b * n + i]);
            md = isnan(d) || md == INFINITY ? INFINITY : fmax(md, d);
            if (!(d <= tol * mx)) (*bad)++;
        }
        const double q = mx > 0 ? md / mx : md > 0 ? INFINITY : 0;
        if (q > worst) worst = q;
    }
    return worst;
}
/* o [M][Hv][Dv] BF16 against ref (floats): the elements outside 1 ulp + CHUNK_O_TOL max|ref| of
 * their head over the M tokens (*bad), the tokens and heads with max|d| above CHUNK_O_REL max|ref|
 * of their own (*badrel); returns the worst max|d| / max|ref| of a token and head */
static double o_rel(const uint16_t *got, const float *ref, int M, int Hv, int Dv, long *bad, long *badrel)
{
    double worst = 0, *hmax = hal((size_t)Hv * sizeof(double));
    for (size_t i = 0; i < (size_t)M * Hv * Dv; i++) {
        const int h = (int)(i / Dv % Hv);
        hmax[h] = fmax(hmax[h], fabs(ref[i]));
    }
    for (size_t b = 0; b < (size_t)M * Hv; b++) {
        double mx = 0, md = 0;
        for (int j = 0; j < Dv; j++) mx = fmax(mx, fabs(ref[b * Dv + j]));
        for (int j = 0; j < Dv; j++) {
            const float r = ref[b * Dv + j];
            const double d = fabs((double)tdm_bf16_to_f32(got[b * Dv + j]) - r);
            md = isnan(d) || md == INFINITY ? INFINITY : fmax(md, d);
            if (!(d <= ulp(r) + CHUNK_O_TOL * hmax[b % Hv])) (*bad)++;
        }
        const double q = mx > 0 ? md / mx : md > 0 ? INFINITY : 0;
        if (!(q <= CHUNK_O_REL)) (*badrel)++;
        if (q > worst) worst = q;
    }
    free(hmax);
    return worst;
}

static void test_recur_chunked(const struct shape *s, int M)
{
    const int Hk = s->c.gdn_k_heads, Hv = s->c.gdn_v_heads, Dk = s->c.gdn_k_dim, Dv = s->c.gdn_v_dim;
    const int C = tdm_gdn_conv_dim(&s->c), qk = Hk * Dk;
    const size_t nS = (size_t)Hv * Dk * Dv, no = (size_t)Hv * Dv, nx = (size_t)M * C;
    char label[160];
    snprintf(label, sizeof label, "%s gdn_recur_chunked Hk %d Hv %d Dk %d Dv %d M %d", s->name, Hk, Hv, Dk, Dv, M);
    uint16_t *qkv = hal(nx * 2), *b = hal((size_t)M * Hv * 2), *a = hal((size_t)M * Hv * 2);
    uint16_t *o1 = hal(M * no * 2), *o2 = hal(M * no * 2);
    float *qkvf = hal(nx * 4), *bf_ = hal((size_t)M * Hv * 4), *af = hal((size_t)M * Hv * 4), *base = hal((size_t)2 * qk * 4);
    float *A = hal(Hv * 4), *dt = hal(Hv * 4), *S0 = hal(nS * 4), *S = hal(nS * 4), *S1 = hal(nS * 4), *S2 = hal(nS * 4);
    float *oref = hal(M * no * 4), *o1f = hal(M * no * 4), *scratch = hal((size_t)(2 * Hk * Dk + Dv) * 4);
    /* keys and queries near a per-head direction (neighbouring keys at cosine ~0.4, so the chunk's
     * triangular system is not the identity), values uniform; gates in the models' ranges: A_log =
     * log(1..16), dt_bias = softplus^-1(dt), dt log-uniform in 0.001..0.1, a in [-3, 3] (decays
     * exp(g) from about 1e-7 to 1 - 5e-5), b in [-4, 4] */
    for (int i = 0; i < 2 * qk; i++) base[i] = frand();
    rand_bf16(qkv, qkvf, nx, 1.0f);
    for (int t = 0; t < M; t++)
        for (int i = 0; i < 2 * qk; i++) {
            const size_t at = (size_t)t * C + i;
            qkv[at] = tdm_f32_to_bf16(0.8f * base[i] + frand());
            qkvf[at] = tdm_bf16_to_f32(qkv[at]);
        }
    rand_bf16(b, bf_, (size_t)M * Hv, 4.0f);
    rand_bf16(a, af, (size_t)M * Hv, 3.0f);
    for (int h = 0; h < Hv; h++) {
        A[h] = logf(1.0f + 7.5f * (frand() + 1.0f));
        const float d = expf(logf(0.001f) + 0.5f * (frand() + 1.0f) * (logf(0.1f) - logf(0.001f)));
        dt[h] = d + logf(-expm1f(-d));
    }
    for (size_t i = 0; i < nS; i++) S0[i] = frand() * 0.5f;
    const size_t scb = tdm_gdn_recur_chunked_scratch_bytes(M, Hv);
    uint16_t *dqkv = dal(nx * 2), *db = dal((size_t)M * Hv * 2), *da = dal((size_t)M * Hv * 2);
    uint16_t *dO1 = dal(M * no * 2), *dO2 = dal(M * no * 2);
    float *dA = dal(Hv * 4), *ddt = dal(Hv * 4), *dS1 = dal(nS * 4), *dS2 = dal(nS * 4), *dscr = dal(scb);
    up(dqkv, qkv, nx * 2);
    up(db, b, (size_t)M * Hv * 2);
    up(da, a, (size_t)M * Hv * 2);
    up(dA, A, Hv * 4);
    up(ddt, dt, Hv * 4);
    up(dS1, S0, nS * 4);
    up(dS2, S0, nS * 4);
    poison(dO1, M * no * 2);
    poison(dO2, M * no * 2);
    poison(dscr, scb);
    if (tdm_gdn_recur(dqkv, db, Hv, da, Hv, dA, ddt, dS1, M, Hk, Hv, Dk, Dv, dO1, NULL, st) != 0) bail("tdm_gdn_recur");
    if (tdm_gdn_recur_chunked(dqkv, db, Hv, da, Hv, dA, ddt, dS2, M, Hk, Hv, Dk, Dv, dscr, dO2, st) != 0)
        bail("tdm_gdn_recur_chunked");
    down(o1, dO1, M * no * 2);
    down(o2, dO2, M * no * 2);
    down(S1, dS1, nS * 4);
    down(S2, dS2, nS * 4);
    /* the reference, token by token; its o rounded to BF16 as the kernels round it */
    memcpy(S, S0, nS * 4);
    for (int t = 0; t < M; t++)
        tdm_ref_gdn_token(Hk, Hv, Dk, Dv, A, dt, qkvf + (size_t)t * C, bf_ + (size_t)t * Hv, af + (size_t)t * Hv, S,
                          oref + (size_t)t * no, scratch);
    for (size_t i = 0; i < M * no; i++) {
        oref[i] = bfv(oref[i]);
        o1f[i] = tdm_bf16_to_f32(o1[i]);
    }
    long bo = 0, bor = 0, bs = 0, bo1 = 0, bor1 = 0, bs1 = 0, bo2 = 0, bor2 = 0, bs2 = 0;
    const double eo = o_rel(o2, oref, M, Hv, Dv, &bo, &bor);
    const double es = block_rel(S2, S, Hv, (size_t)Dk * Dv, CHUNK_S_TOL, &bs);
    const double eo1 = o_rel(o2, o1f, M, Hv, Dv, &bo1, &bor1);
    const double es1 = block_rel(S2, S1, Hv, (size_t)Dk * Dv, CHUNK_S_TOL, &bs1);
    const double eo2 = o_rel(o1, oref, M, Hv, Dv, &bo2, &bor2); /* the token-serial kernel's own */
    const double es2 = block_rel(S1, S, Hv, (size_t)Dk * Dv, CHUNK_S_TOL, &bs2);
    ok(bo == 0 && bor == 0 && bs == 0,
       "%s: against tdm_ref_gdn_token from a non-zero state: o within 1 ulp + %.0e max|o| of the head (%ld of %zu "
       "outside), worst max|d|/max|o| of a token and head %.2e <= %.1e (%ld above), the final state within %.0e max|S| "
       "of the head (%ld outside; worst %.2e); the token-serial kernel's own: o %.2e (%ld outside), S %.2e (%ld outside)",
       label, CHUNK_O_TOL, bo, M * no, eo, CHUNK_O_REL, bor, CHUNK_S_TOL, bs, es, eo2, bo2 + bor2, es2, bs2);
    ok(bo1 == 0 && bor1 == 0 && bs1 == 0,
       "%s: against tdm_gdn_recur: o within 1 ulp + %.0e max|o| of the head (%ld outside), worst max|d|/max|o| of a "
       "token and head %.2e <= %.1e (%ld above), the final state within %.0e max|S| (%ld outside; worst %.2e)", label,
       CHUNK_O_TOL, bo1, eo1, CHUNK_O_REL, bor1, CHUNK_S_TOL, bs1, es1);
    tdm_cuda_free(dqkv); tdm_cuda_free(db); tdm_cuda_free(da); tdm_cuda_free(dO1); tdm_cuda_free(dO2);
    tdm_cuda_free(dA); tdm_cuda_free(ddt); tdm_cuda_free(dS1); tdm_cuda_free(dS2); tdm_cuda_free(dscr);
    free(qkv); free(b); free(a); free(o1); free(o2); free(qkvf); free(bf_); free(af); free(base); free(A); free(dt);
    free(S0); free(S); free(S1); free(S2); free(oref); free(o1f); free(scratch);
}

/* ================================================================================================
 * attention
 */
struct att_ctx { uint16_t *dq, *dqg, *dkc, *dvc, *dout; float *scratch; int32_t *dpos; int Hq, Hkv, D, P, ctx; };
static int att_launch(void *p, int r0, int m, int devpos)
{
    struct att_ctx *c = p;
    const size_t ldqg = (size_t)c->Hq * 2 * c->D, row = (size_t)c->Hq * c->D;
    int pos = c->P + r0;
    if (devpos) {
        const int32_t dp = pos;
        if (devpos == 1) up(c->dpos, &dp, 4);
        pos = c->ctx - m; /* the host value is only an upper bound: a larger grid, the same bits */
    }
    return tdm_attn_decode(c->dq + r0 * row, c->dqg + r0 * ldqg, ldqg, c->dkc, c->dvc, m, c->Hq, c->Hkv, c->D, pos,
                           devpos ? c->dpos : NULL, c->ctx, c->scratch, c->dout + r0 * row, NULL, st);
}

/* The scale of an attention head's error against tdm_ref_attn_head: amag[d] = A = sum_j p_j |v_j[d]| / sum_j p_j
 * over the n positions (p_j = exp(s_j - max s), s_j = q . k_j / sqrt(D); K and V row j at kh, vh + j ld), since the
 * rounding of the probabilities may move the output by 2^-8 of A. */
static void attn_err_scale(const float *qr, const float *kh, const float *vh, size_t ld, int n, int D, double *amag)
{
    const float scale = 1.0f / sqrtf((float)D);
    double mxs = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) mxs = fmax(mxs, (double)tdm_dot(qr, kh + (size_t)j * ld, D) * scale);
    for (int d = 0; d < D; d++) amag[d] = 0;
    for (int j = 0; j < n; j++) {
        const double p = exp((double)tdm_dot(qr, kh + (size_t)j * ld, D) * scale - mxs);
        sum += p;
        for (int d = 0; d < D; d++) amag[d] += p * fabs(vh[(size_t)j * ld + d]);
    }
    for (int d = 0; d < D; d++) amag[d] /= sum;
}

static void test_attn(const struct shape *s, int P)
{
    const int Hq = s->c.n_q_heads, Hkv = s->c.n_kv_heads, D = s->c.head_dim, grp = Hq / Hkv;
    const size_t ldqg = (size_t)Hq * 2 * D, row = (size_t)Hq * D, kvrow = (size_t)Hkv * D;
    const int ctx = P + R + 600; /* rows past P + 31 are never seen */
    char label[160];
    snprintf(label, sizeof label, "%s attn_decode Hq %d Hkv %d D %d at %d", s->name, Hq, Hkv, D, P);
    uint16_t *q = hal(R * row * 2), *qg = hal(R * ldqg * 2), *kc = hal((size_t)ctx * kvrow * 2);
    uint16_t *vc = hal((size_t)ctx * kvrow * 2), *out = hal(R * row * 2);
    float *qf = hal(R * row * 4), *qgf = hal(R * ldqg * 4), *kf = hal((size_t)ctx * kvrow * 4);
    float *vf = hal((size_t)ctx * kvrow * 4), *pr = hal((size_t)ctx * 4), *ref = hal(D * 4);
    double *amag = hal(D * sizeof(double));
    rand_bf16(q, qf, R * row, 2.0f);
    rand_bf16(qg, qgf, R * ldqg, 4.0f);
    share_rows(q, qf, row);
    share_rows(qg, qgf, ldqg);
    rand_bf16(kc, kf, (size_t)ctx * kvrow, 2.0f);
    rand_bf16(vc, vf, (size_t)ctx * kvrow, 3.0f);
    const size_t sb = tdm_attn_scratch_bytes(R, Hq, D, ctx);
    struct att_ctx c = {dal(R * row * 2), dal(R * ldqg * 2), dal((size_t)ctx * kvrow * 2), dal((size_t)ctx * kvrow * 2),
                        dal(R * row * 2), dal(sb), dal(4), Hq, Hkv, D, P, ctx};
    up(c.dq, q, R * row * 2);
    up(c.dqg, qg, R * ldqg * 2);
    up(c.dkc, kc, (size_t)ctx * kvrow * 2);
    up(c.dvc, vc, (size_t)ctx * kvrow * 2);
    poison(c.dout, R * row * 2);
    poison(c.scratch, sb);
    if (att_launch(&c, 0, R, 0) != 0) bail("tdm_attn_decode");
    down(out, c.dout, R * row * 2);
    struct cmp cm = {0};
    for (int r = 0; r < R; r++)
        for (int h = 0; h < Hq; h++) {
            const float *qr = qf + r * row + (size_t)h * D, *gate = qgf + r * ldqg + (size_t)h * 2 * D + D;
            const float *kh = kf + (size_t)(h / grp) * D, *vh = vf + (size_t)(h / grp) * D;
            const int n = P + r + 1;
            attn_err_scale(qr, kh, vh, kvrow, n, D, amag);
            tdm_ref_attn_head(qr, gate, kh, vh, kvrow, n, D, pr, ref);
            for (int d = 0; d < D; d++)
                cmp_add(&cm, tdm_bf16_to_f32(out[r * row + (size_t)h * D + d]), ref[d], ldexp(amag[d] + fabs(ref[d]), -7));
        }
    cmp_ok(&cm, label, "check against tdm_ref_attn_head (2^-7 (A + |ref|))");
    struct twin t = {att_launch, noop_reset, &c, 1, {{c.dout, row * 2, 0}}, NULL, 0, 1, c.dpos, P};
    twin_test(label, &t);
    graph_test(label, &t);
    tdm_cuda_free(c.dq); tdm_cuda_free(c.dqg); tdm_cuda_free(c.dkc); tdm_cuda_free(c.dvc); tdm_cuda_free(c.dout);
    tdm_cuda_free(c.scratch); tdm_cuda_free(c.dpos);
    free(q); free(qg); free(kc); free(vc); free(out); free(qf); free(qgf); free(kf); free(vf); free(pr); free(ref);
    free(amag);
}

/* ================================================================================================
 * prefill attention (tdm_attn_prefill): M queries at positions P.. in one launch, against the
 * reference and against tdm_attn_decode on the same inputs
 */
#define PREFILL_REL 1e-2 /* relative error (L2 over the output) against the reference and the decode kernel */

static void test_attn_prefill(const char *name, int Hq, int Hkv, int D, int M, int P)
{
    const int grp = Hq / Hkv;
    const size_t ldqg = (size_t)Hq * 2 * D, row = (size_t)Hq * D, kvrow = (size_t)Hkv * D;
    const int ctx = P + M + 40; /* rows past P + M - 1 hold NaN: never read into a result */
    char label[160];
    snprintf(label, sizeof label, "%s attn_prefill Hq %d Hkv %d D %d, %d rows at %d", name, Hq, Hkv, D, M, P);
    uint16_t *q = hal(M * row * 2), *qg = hal(M * ldqg * 2), *kc = hal((size_t)ctx * kvrow * 2);
    uint16_t *vc = hal((size_t)ctx * kvrow * 2), *out = hal((M + 1) * row * 2), *dec = hal(M * row * 2);
    float *qf = hal(M * row * 4), *qgf = hal(M * ldqg * 4), *kf = hal((size_t)ctx * kvrow * 4);
    float *vf = hal((size_t)ctx * kvrow * 4), *pr = hal((size_t)ctx * 4);
    float *ref = hal(M * row * 4), *got = hal(M * row * 4), *decf = hal(M * row * 4);
    double *amag = hal(D * sizeof(double));
    rand_bf16(q, qf, M * row, 2.0f);
    rand_bf16(qg, qgf, M * ldqg, 4.0f);
    rand_bf16(kc, kf, (size_t)ctx * kvrow, 2.0f);
    rand_bf16(vc, vf, (size_t)ctx * kvrow, 3.0f);
    for (size_t i = (size_t)(P + M) * kvrow; i < (size_t)ctx * kvrow; i++) kc[i] = vc[i] = 0x7fc0;
    const size_t sb = tdm_attn_scratch_bytes(M, Hq, D, ctx);
    uint16_t *dq = dal(M * row * 2), *dqg = dal(M * ldqg * 2), *dkc = dal((size_t)ctx * kvrow * 2);
    uint16_t *dvc = dal((size_t)ctx * kvrow * 2), *dout = dal((M + 1) * row * 2), *ddec = dal(M * row * 2);
    float *scratch = dal(sb);
    up(dq, q, M * row * 2);
    up(dqg, qg, M * ldqg * 2);
    up(dkc, kc, (size_t)ctx * kvrow * 2);
    up(dvc, vc, (size_t)ctx * kvrow * 2);
    poison(dout, (M + 1) * row * 2);
    poison(ddec, M * row * 2);
    if (tdm_attn_prefill(dq, dqg, ldqg, dkc, dvc, M, Hq, Hkv, D, P, ctx, dout, st) != 0) bail("tdm_attn_prefill");
    if (tdm_attn_decode(dq, dqg, ldqg, dkc, dvc, M, Hq, Hkv, D, P, NULL, ctx, scratch, ddec, NULL, st) != 0) bail("tdm_attn_decode");
    down(out, dout, (M + 1) * row * 2);
    down(dec, ddec, M * row * 2);
    int past = 0;
    for (size_t i = 0; i < row; i++) past += out[M * row + i] != 0xffff;
    struct cmp cr = {0}, cd = {0};
    for (int r = 0; r < M; r++)
        for (int h = 0; h < Hq; h++) {
            const size_t o = r * row + (size_t)h * D;
            const float *qr = qf + o, *gate = qgf + r * ldqg + (size_t)h * 2 * D + D;
            const float *kh = kf + (size_t)(h / grp) * D, *vh = vf + (size_t)(h / grp) * D;
            const int n = P + r + 1;
            attn_err_scale(qr, kh, vh, kvrow, n, D, amag);
            tdm_ref_attn_head(qr, gate, kh, vh, kvrow, n, D, pr, ref + o);
            for (int d = 0; d < D; d++) {
                got[o + d] = tdm_bf16_to_f32(out[o + d]);
                decf[o + d] = tdm_bf16_to_f32(dec[o + d]);
                cmp_add(&cr, got[o + d], ref[o + d], ldexp(amag[d] + fabs(ref[o + d]), -7));
                cmp_add(&cd, got[o + d], decf[o + d], ldexp(amag[d] + fabs(ref[o + d]), -6));
            }
        }
    const double er = tdm_rel_err(got, ref, (int64_t)M * row), ed = tdm_rel_err(got, decf, (int64_t)M * row);
    const double edr = tdm_rel_err(decf, ref, (int64_t)M * row);
    ok(cr.n > 0 && cr.bad == 0 && er <= PREFILL_REL && past == 0,
       "%s: against tdm_ref_attn_head: %ld of %ld outside 2^-7 (A + |ref|) (worst %.3g of it, %.2f%% bit-identical), "
       "relative error %.2e <= %.0e; row %d untouched (%d written)", label, cr.bad, cr.n, cr.worst,
       cr.n ? 100.0 * cr.exact / cr.n : 0.0, er, PREFILL_REL, M, past);
    ok(cd.n > 0 && cd.bad == 0 && ed <= PREFILL_REL,
       "%s: against tdm_attn_decode on the same inputs: %ld of %ld outside 2^-6 (A + |ref|) (worst %.3g of it, %.2f%% "
       "equal), relative error %.2e <= %.0e (decode against the reference: %.2e)", label, cd.bad, cd.n, cd.worst,
       cd.n ? 100.0 * cd.exact / cd.n : 0.0, ed, PREFILL_REL, edr);
    tdm_cuda_free(dq); tdm_cuda_free(dqg); tdm_cuda_free(dkc); tdm_cuda_free(dvc); tdm_cuda_free(dout);
    tdm_cuda_free(ddec); tdm_cuda_free(scratch);
    free(q); free(qg); free(kc); free(vc); free(out); free(dec); free(qf); free(qgf); free(kf); free(vf); free(pr);
    free(ref); free(got); free(decf); free(amag);
}

/* The launcher's checks: a misaligned output, a chunk past the cache, a bad head count. */
static void test_attn_prefill_args(void)
{
    uint16_t *d = dal(64 * 1024);
    const int misaligned = tdm_attn_prefill(d, d, 2 * 64, d, d, 1, 1, 1, 64, 0, 4, d + 1, st);
    const int past = tdm_attn_prefill(d, d, 2 * 64, d, d, 4, 1, 1, 64, 2, 5, d, st);
    const int heads = tdm_attn_prefill(d, d, 3 * 2 * 64, d, d, 1, 3, 2, 64, 0, 4, d, st);
    ok(misaligned != 0 && past != 0 && heads != 0,
       "tdm_attn_prefill refuses a misaligned output, positions past the cache and Hq not a multiple of Hkv");
    tdm_cuda_free(d);
}

/* ================================================================================================
 * trees (layers.h, Trees): the *_tree kernels on trees of 32 nodes, each node against the chain
 * kernel run on its root-to-node path (bit for bit) and against the reference along that path
 */
#define NTREES 5
static const char *const tree_names[NTREES] = {"chain", "tree 4,3,2,1", "star", "random", "deep then wide"};

static void tree_branch(int32_t *par, int *n, int t, int dep, const int *br, int nbr)
{
    if (dep >= nbr) return;
    for (int i = 0; i < br[dep] && *n < R; i++) {
        const int c = (*n)++;
        par[c] = t;
        tree_branch(par, n, c, dep + 1, br, nbr);
    }
}

/* Tree k of NTREES, R nodes laid out depth-first, node 0 the root. */
static void make_tree(int k, int32_t *par)
{
    par[0] = -1;
    if (k == 0 || k == 2) {
        for (int t = 1; t < R; t++) par[t] = k == 0 ? t - 1 : 0;
    } else if (k == 1) {
        static const int br[] = {4, 3, 2, 1, 1, 1};
        int n = 1;
        tree_branch(par, &n, 0, 0, br, 6);
        for (; n < R; n++) par[n] = n - 1; /* the rest as a tail under the last node */
    } else {
        /* each node's parent somewhere on the previous node's path (depth-first by construction):
         * random, or a chain of 20 and then siblings under node 9 */
        int path[R], d = 0;
        path[0] = 0;
        for (int t = 1; t < R; t++) {
            int a = k == 3 ? (int)(next() % (uint64_t)(d + 1)) : t < 20 ? d : 9;
            if (a > d) a = d;
            par[t] = path[a];
            d = a + 1;
            path[d] = t;
        }
    }
}

static int node_depth(const int32_t *par, int t)
{
    int d = 0;
    for (int x = par[t]; x >= 0; x = par[x]) d++;
    return d;
}
/* path[0..d]: node t's ancestors root first, then t; returns d */
static int node_path(const int32_t *par, int t, int *path)
{
    const int d = node_depth(par, t);
    for (int x = t, i = d; i >= 0; i--, x = par[x]) path[i] = x;
    return d;
}
/* rows path[0..n-1] of src [][row] into dst, contiguous */
static void gather_rows(void *dst, const void *src, size_t row, const int *path, int n)
{
    for (int i = 0; i < n; i++) memcpy((char *)dst + i * row, (const char *)src + path[i] * row, row);
}

/* A graph captured with tree a in *dpar, replayed after tree b was copied there, equals the eager
 * call on tree b (one graph serves every tree of R nodes). launch writes its output to out. */
static void tree_graph_test(const char *label, int (*launch)(void *ctx), void *ctx, int32_t *dpar, void *out, size_t bytes)
{
    int32_t a[R], b[R];
    make_tree(1, a);
    make_tree(3, b);
    unsigned char *eager = hal(bytes), *replay = hal(bytes);
    tdm_graph g = NULL;
    up(dpar, b, sizeof b);
    poison(out, bytes);
    int rc = launch(ctx);
    if (!rc) down(eager, out, bytes);
    up(dpar, a, sizeof a);
    rc = rc || tdm_graph_begin(st) || launch(ctx) || tdm_graph_end(st, &g);
    up(dpar, b, sizeof b);
    poison(out, bytes);
    rc = rc || tdm_graph_launch(g, st);
    if (!rc) down(replay, out, bytes);
    ok(!rc && memcmp(eager, replay, bytes) == 0, "%s: a graph captured on one tree and replayed on another (the parents in "
       "device memory) equals the eager call%s%s", label, rc ? ": " : "", rc ? tdm_err() : "");
    if (g) tdm_graph_destroy(g);
    free(eager);
    free(replay);
}

/* ---- GDN conv and recurrence ---- */

struct gtree_ctx {
    uint16_t *dx, *dy, *dst, *dqkv, *db, *da, *dO;
    float *dw, *dA, *ddt, *dS;
    int32_t *dpar;
    int C, K, Hk, Hv, Dk, Dv;
};
static int conv_tree_launch(void *p)
{
    struct gtree_ctx *c = p;
    return tdm_gdn_conv_tree(c->dx, c->C, c->dw, c->dst, c->dpar, R, c->C, c->K, c->dy, st);
}
static int recur_tree_launch(void *p)
{
    struct gtree_ctx *c = p;
    return tdm_gdn_recur_tree(c->dqkv, c->db, c->Hv, c->da, c->Hv, c->dA, c->ddt, c->dS, c->dpar, R, c->Hk, c->Hv, c->Dk,
                              c->Dv, c->dO, NULL, st);
}

static void test_gdn_tree(const struct shape *s)
{
    const int Hk = s->c.gdn_k_heads, Hv = s->c.gdn_v_heads, Dk = s->c.gdn_k_dim, Dv = s->c.gdn_v_dim;
    const int C = tdm_gdn_conv_dim(&s->c), K = s->c.conv_kernel;
    const size_t nS = (size_t)Hv * Dk * Dv, no = (size_t)Hv * Dv, nx = (size_t)R * C, ns = (size_t)(K - 1) * C;
    char label[160];
    snprintf(label, sizeof label, "%s gdn tree C %d K %d Hk %d Hv %d Dk %d Dv %d", s->name, C, K, Hk, Hv, Dk, Dv);
    /* conv inputs and state; recurrence inputs (the conv's output shape), gates, state */
    uint16_t *x = hal(nx * 2), *s0 = hal(ns * 2), *qkv = hal(nx * 2), *b = hal((size_t)R * Hv * 2), *a = hal((size_t)R * Hv * 2);
    float *xf = hal(nx * 4), *sf = hal(ns * 4), *w = hal((size_t)C * K * 4), *qkvf = hal(nx * 4);
    float *bf_ = hal((size_t)R * Hv * 4), *af = hal((size_t)R * Hv * 4), *A = hal(Hv * 4), *dt = hal(Hv * 4);
    float *S0 = hal(nS * 4), *S = hal(nS * 4);
    rand_bf16(x, xf, nx, 3.0f);
    share_rows(x, xf, C);
    rand_bf16(s0, sf, ns, 3.0f);
    for (size_t i = 0; i < (size_t)C * K; i++) w[i] = bfv(frand() * 0.6f);
    rec_inputs(C, Hv, nS, qkv, qkvf, b, bf_, a, af, A, dt, S0);
    struct gtree_ctx c = {dal(nx * 2), dal(nx * 2), dal(ns * 2), dal(nx * 2), dal((size_t)R * Hv * 2), dal((size_t)R * Hv * 2),
                          dal(R * no * 2), dal((size_t)C * K * 4), dal(Hv * 4), dal(Hv * 4), dal(nS * 4), dal(R * 4),
                          C, K, Hk, Hv, Dk, Dv};
    up(c.dw, w, (size_t)C * K * 4);
    up(c.dst, s0, ns * 2);
    up(c.dA, A, Hv * 4);
    up(c.ddt, dt, Hv * 4);
    up(c.dS, S0, nS * 4);
    /* path buffers: the chain kernels' inputs gathered along a node's path */
    uint16_t *px = hal(nx * 2), *pq = hal(nx * 2), *pb = hal((size_t)R * Hv * 2), *pa = hal((size_t)R * Hv * 2);
    uint16_t *dpx = dal(nx * 2), *dpy = dal(nx * 2), *dpq = dal(nx * 2), *dpb = dal((size_t)R * Hv * 2);
    uint16_t *dpa = dal((size_t)R * Hv * 2), *dpo = dal(R * no * 2);
    uint16_t *ty = hal(nx * 2), *to = hal(R * no * 2), *cy = hal(nx * 2), *co_ = hal(R * no * 2), *sv = hal(ns * 2);
    float *Sv = hal(nS * 4), *pxf = hal(nx * 4), *ref = hal(nx * 4), *stmp = hal(ns * 4), *oref = hal(no * 4);
    float *scratch = hal((size_t)(2 * Hk * Dk + Dv) * 4);
    uint16_t *chain_y = hal(nx * 2), *chain_o = hal(R * no * 2);
    /* the chain kernels' verify forms over the 32 rows, for chain-as-tree */
    up(c.dx, x, nx * 2);
    up(c.dqkv, qkv, nx * 2);
    up(c.db, b, (size_t)R * Hv * 2);
    up(c.da, a, (size_t)R * Hv * 2);
    if (tdm_gdn_conv_verify(c.dx, C, c.dw, c.dst, R, C, K, c.dy, st) != 0 ||
        tdm_gdn_recur_verify(c.dqkv, c.db, Hv, c.da, Hv, c.dA, c.ddt, c.dS, R, Hk, Hv, Dk, Dv, c.dO, NULL, st) != 0)
        bail("verify forms");
    down(chain_y, c.dy, nx * 2);
    down(chain_o, c.dO, R * no * 2);
    for (int k = 0; k < NTREES; k++) {
        int32_t par[R];
        make_tree(k, par);
        up(c.dpar, par, sizeof par);
        poison(c.dy, nx * 2);
        poison(c.dO, R * no * 2);
        if (conv_tree_launch(&c) != 0) bail("tdm_gdn_conv_tree");
        if (recur_tree_launch(&c) != 0) bail("tdm_gdn_recur_tree");
        down(ty, c.dy, nx * 2);
        down(to, c.dO, R * no * 2);
        down(sv, c.dst, ns * 2);
        down(Sv, c.dS, nS * 4);
        ok(memcmp(sv, s0, ns * 2) == 0 && memcmp(Sv, S0, nS * 4) == 0, "%s, %s: the conv and recurrent states are left as "
           "they were", label, tree_names[k]);
        if (k == 0)
            ok(memcmp(ty, chain_y, nx * 2) == 0 && memcmp(to, chain_o, R * no * 2) == 0,
               "%s: a chain as a tree gives tdm_gdn_conv_verify's and tdm_gdn_recur_verify's 32 rows bit for bit", label);
        int bad_y = 0, bad_o = 0, unw = 0;
        struct cmp cy_ref = {0}, co_ref = {0};
        for (int t = 0; t < R; t++) {
            int path[R];
            const int d = node_path(par, t, path), n = d + 1;
            /* the chain kernels on the path */
            gather_rows(px, x, (size_t)C * 2, path, n);
            gather_rows(pq, qkv, (size_t)C * 2, path, n);
            gather_rows(pb, b, (size_t)Hv * 2, path, n);
            gather_rows(pa, a, (size_t)Hv * 2, path, n);
            up(dpx, px, (size_t)n * C * 2);
            up(dpq, pq, (size_t)n * C * 2);
            up(dpb, pb, (size_t)n * Hv * 2);
            up(dpa, pa, (size_t)n * Hv * 2);
            if (tdm_gdn_conv_verify(dpx, C, c.dw, c.dst, n, C, K, dpy, st) != 0 ||
                tdm_gdn_recur_verify(dpq, dpb, Hv, dpa, Hv, c.dA, c.ddt, c.dS, n, Hk, Hv, Dk, Dv, dpo, NULL, st) != 0)
                bail("verify forms on a path");
            down(cy, dpy + (size_t)d * C, (size_t)C * 2);
            down(co_, dpo + (size_t)d * no, no * 2);
            bad_y += memcmp(cy, ty + (size_t)t * C, (size_t)C * 2) != 0;
            bad_o += memcmp(co_, to + (size_t)t * no, no * 2) != 0;
            for (size_t i = 0; i < (size_t)C; i++) unw += ty[(size_t)t * C + i] == 0xffff;
            for (size_t i = 0; i < no; i++) unw += to[(size_t)t * no + i] == 0xffff;
            /* the reference along the path: the conv from the state, the recurrence from S0 */
            for (int i = 0; i < n; i++) memcpy(pxf + (size_t)i * C, xf + (size_t)path[i] * C, (size_t)C * 4);
            memcpy(stmp, sf, ns * 4);
            tdm_ref_gdn_conv(w, C, K, stmp, pxf, n, ref);
            for (size_t i = 0; i < (size_t)C; i++) {
                const float r = ref[(size_t)d * C + i];
                cmp_add(&cy_ref, tdm_bf16_to_f32(ty[(size_t)t * C + i]), r, ulp(r));
            }
            memcpy(S, S0, nS * 4);
            for (int i = 0; i < n; i++) {
                const int q = path[i];
                tdm_ref_gdn_token(Hk, Hv, Dk, Dv, A, dt, qkvf + (size_t)q * C, bf_ + (size_t)q * Hv, af + (size_t)q * Hv, S,
                                  oref, scratch);
            }
            rec_o_cmp(Hv, Dv, oref, to + (size_t)t * no, &co_ref);
        }
        ok(bad_y == 0 && bad_o == 0 && unw == 0, "%s, %s: every node's conv and recurrence output equals the chain verify "
           "forms on its root-to-node path, bit for bit (%d conv rows, %d recurrence rows differ, %d unwritten)", label,
           tree_names[k], bad_y, bad_o, unw);
        char what[96];
        snprintf(what, sizeof what, "%s: conv along each path against tdm_ref_gdn_conv (1 ulp)", tree_names[k]);
        cmp_ok(&cy_ref, label, what);
        snprintf(what, sizeof what, "%s: o along each path against tdm_ref_gdn_token (1 ulp + 1e-4 max|o|)", tree_names[k]);
        cmp_ok(&co_ref, label, what);
    }
    tree_graph_test(label, conv_tree_launch, &c, c.dpar, c.dy, nx * 2);
    tree_graph_test(label, recur_tree_launch, &c, c.dpar, c.dO, R * no * 2);
    tdm_cuda_free(c.dx); tdm_cuda_free(c.dy); tdm_cuda_free(c.dst); tdm_cuda_free(c.dqkv); tdm_cuda_free(c.db);
    tdm_cuda_free(c.da); tdm_cuda_free(c.dO); tdm_cuda_free(c.dw); tdm_cuda_free(c.dA); tdm_cuda_free(c.ddt);
    tdm_cuda_free(c.dS); tdm_cuda_free(c.dpar);
    tdm_cuda_free(dpx); tdm_cuda_free(dpy); tdm_cuda_free(dpq); tdm_cuda_free(dpb); tdm_cuda_free(dpa); tdm_cuda_free(dpo);
    free(x); free(s0); free(qkv); free(b); free(a); free(xf); free(sf); free(w); free(qkvf); free(bf_); free(af); free(A);
    free(dt); free(S0); free(S); free(px); free(pq); free(pb); free(pa); free(ty); free(to); free(cy); free(co_); free(sv);
    free(Sv); free(pxf); free(ref); free(stmp); free(oref); free(scratch); free(chain_y); free(chain_o);
}

/* ---- q/k norm + rotary + KV append, and attention ---- */

struct atree_ctx {
    uint16_t *dqg, *dk, *dv, *dq, *dkc, *dvc, *dout;
    float *dqn, *dkn, *scratch;
    int32_t *dpar, *dpos;
    int Hq, Hkv, D, Rd, P, ctx;
    double theta;
    float eps;
};
static int qk_tree_launch(void *p)
{
    struct atree_ctx *c = p;
    const size_t ldqg = (size_t)c->Hq * 2 * c->D, ldkv = (size_t)c->Hkv * c->D;
    return tdm_qk_norm_rope_tree(c->dqg, ldqg, c->dk, c->dv, ldkv, c->dqn, c->dkn, c->dpar, R, c->Hq, c->Hkv, c->D, c->Rd,
                                 c->theta, c->eps, c->ctx - R, c->dpos, c->ctx, c->dq, c->dkc, c->dvc, st);
}
static int attn_tree_launch(void *p)
{
    struct atree_ctx *c = p;
    const size_t ldqg = (size_t)c->Hq * 2 * c->D;
    return tdm_attn_tree(c->dq, c->dqg, ldqg, c->dkc, c->dvc, c->dpar, R, c->Hq, c->Hkv, c->D, c->ctx - R, c->dpos, c->ctx,
                         c->scratch, c->dout, NULL, st);
}

/* The nodes' q/k norm + rotary (node r at P + depth, its K/V at cache row P + r), then attention
 * over the cache: per node against the chain kernels on its path and against the reference. */
static void test_attn_tree(const struct shape *s, int P)
{
    const int Hq = s->c.n_q_heads, Hkv = s->c.n_kv_heads, D = s->c.head_dim, Rd = s->c.rotary_dim, grp = Hq / Hkv;
    const size_t ldqg = (size_t)Hq * 2 * D, ldkv = (size_t)Hkv * D, row = (size_t)Hq * D;
    const int ctx = P + R + 300;
    char label[160];
    snprintf(label, sizeof label, "%s attention tree Hq %d Hkv %d D %d at %d", s->name, Hq, Hkv, D, P);
    uint16_t *qg = hal(R * ldqg * 2), *k = hal(R * ldkv * 2), *v = hal(R * ldkv * 2), *kc = hal((size_t)ctx * ldkv * 2);
    uint16_t *vc = hal((size_t)ctx * ldkv * 2), *q = hal(R * row * 2), *out = hal(R * row * 2), *kct = hal(R * ldkv * 2);
    uint16_t *vct = hal(R * ldkv * 2), *cq = hal(row * 2), *ck = hal(ldkv * 2), *cv = hal(ldkv * 2), *co_ = hal(row * 2);
    uint16_t *pqg = hal(R * ldqg * 2), *pk = hal(R * ldkv * 2), *pv = hal(R * ldkv * 2);
    float *qgf = hal(R * ldqg * 4), *kf = hal(R * ldkv * 4), *vf = hal(R * ldkv * 4), *qn = hal(D * 4), *kn = hal(D * 4);
    float *reff = hal(D * 4), *kcf = hal((size_t)ctx * ldkv * 4), *vcf = hal((size_t)ctx * ldkv * 4);
    float *pr = hal((size_t)ctx * 4), *ref = hal(D * 4), *qf = hal(row * 4), *gate = hal(D * 4);
    double *amag = hal(D * sizeof(double));
    const size_t sb = tdm_attn_scratch_bytes(R, Hq, D, ctx);
    struct atree_ctx c = {dal(R * ldqg * 2), dal(R * ldkv * 2), dal(R * ldkv * 2), dal(R * row * 2),
                          dal((size_t)ctx * ldkv * 2), dal((size_t)ctx * ldkv * 2), dal(R * row * 2), dal(D * 4), dal(D * 4),
                          dal(sb), dal(R * 4), dal(4), Hq, Hkv, D, Rd, P, ctx, s->c.rope_theta, s->c.rms_eps};
    qk_inputs(ldqg, ldkv, D, qg, qgf, k, kf, v, vf, qn, kn, c.dqg, c.dk, c.dv, c.dqn, c.dkn);
    rand_bf16(kc, kcf, (size_t)ctx * ldkv, 2.0f);
    rand_bf16(vc, vcf, (size_t)ctx * ldkv, 3.0f);
    up(c.dpos, &P, 4);
    /* a second cache for the chain kernels on a path: the same rows below P */
    uint16_t *dkc2 = dal((size_t)ctx * ldkv * 2), *dvc2 = dal((size_t)ctx * ldkv * 2), *dpqg = dal(R * ldqg * 2);
    uint16_t *dpk = dal(R * ldkv * 2), *dpv = dal(R * ldkv * 2), *dpq = dal(R * row * 2), *dpo = dal(R * row * 2);
    uint16_t *chain_q = hal(R * row * 2), *chain_k = hal(R * ldkv * 2), *chain_o = hal(R * row * 2);
    for (int k0 = 0; k0 < NTREES; k0++) {
        int32_t par[R];
        make_tree(k0, par);
        up(c.dpar, par, sizeof par);
        up(c.dkc, kc, (size_t)ctx * ldkv * 2);
        up(c.dvc, vc, (size_t)ctx * ldkv * 2);
        poison(c.dq, R * row * 2);
        poison(c.dout, R * row * 2);
        poison(c.scratch, sb);
        if (qk_tree_launch(&c) != 0) bail("tdm_qk_norm_rope_tree");
        if (attn_tree_launch(&c) != 0) bail("tdm_attn_tree");
        down(q, c.dq, R * row * 2);
        down(kct, c.dkc + (size_t)P * ldkv, R * ldkv * 2);
        down(vct, c.dvc + (size_t)P * ldkv, R * ldkv * 2);
        down(out, c.dout, R * row * 2);
        {   /* the cache rows outside P..P+31 are untouched */
            uint16_t *all = hal((size_t)ctx * ldkv * 2);
            down(all, c.dkc, (size_t)ctx * ldkv * 2);
            const int same = memcmp(all, kc, (size_t)P * ldkv * 2) == 0 &&
                             memcmp(all + (size_t)(P + R) * ldkv, kc + (size_t)(P + R) * ldkv, (size_t)(ctx - P - R) * ldkv * 2) == 0;
            ok(same, "%s, %s: the K cache rows outside P..P+31 are left as they were", label, tree_names[k0]);
            free(all);
        }
        if (k0 == 0) { /* chain as a tree against the chain kernels on the 32 rows */
            up(dkc2, kc, (size_t)ctx * ldkv * 2);
            up(dvc2, vc, (size_t)ctx * ldkv * 2);
            if (tdm_qk_norm_rope(c.dqg, ldqg, c.dk, c.dv, ldkv, c.dqn, c.dkn, R, Hq, Hkv, D, Rd, c.theta, c.eps, P, NULL, ctx,
                                 dpq, dkc2, dvc2, st) != 0 ||
                tdm_attn_decode(dpq, c.dqg, ldqg, dkc2, dvc2, R, Hq, Hkv, D, P, NULL, ctx, c.scratch, dpo, NULL, st) != 0)
                bail("chain kernels");
            down(chain_q, dpq, R * row * 2);
            down(chain_k, dkc2 + (size_t)P * ldkv, R * ldkv * 2);
            down(chain_o, dpo, R * row * 2);
            ok(memcmp(chain_q, q, R * row * 2) == 0 && memcmp(chain_k, kct, R * ldkv * 2) == 0 &&
               memcmp(chain_o, out, R * row * 2) == 0,
               "%s: a chain as a tree gives tdm_qk_norm_rope's and tdm_attn_decode's 32 rows bit for bit", label);
        }
        /* per node: the chain kernels on its path, in the second cache from row P (the rows below P
         * are the first cache's, and the chain writes only rows P..P+depth) */
        up(dkc2, kc, (size_t)ctx * ldkv * 2);
        up(dvc2, vc, (size_t)ctx * ldkv * 2);
        int bad_qkv = 0, bad_o = 0, unw = 0;
        struct cmp cq_ref = {0}, ck_ref = {0}, co_ref = {0};
        for (int t = 0; t < R; t++) {
            int path[R];
            const int d = node_path(par, t, path), n = d + 1;
            gather_rows(pqg, qg, ldqg * 2, path, n);
            gather_rows(pk, k, ldkv * 2, path, n);
            gather_rows(pv, v, ldkv * 2, path, n);
            up(dpqg, pqg, n * ldqg * 2);
            up(dpk, pk, n * ldkv * 2);
            up(dpv, pv, n * ldkv * 2);
            if (tdm_qk_norm_rope(dpqg, ldqg, dpk, dpv, ldkv, c.dqn, c.dkn, n, Hq, Hkv, D, Rd, c.theta, c.eps, P, NULL, ctx, dpq,
                                 dkc2, dvc2, st) != 0 ||
                tdm_attn_decode(dpq, dpqg, ldqg, dkc2, dvc2, n, Hq, Hkv, D, P, NULL, ctx, c.scratch, dpo, NULL, st) != 0)
                bail("chain kernels on a path");
            down(cq, dpq + (size_t)d * row, row * 2);
            down(ck, dkc2 + (size_t)(P + d) * ldkv, ldkv * 2);
            down(cv, dvc2 + (size_t)(P + d) * ldkv, ldkv * 2);
            down(co_, dpo + (size_t)d * row, row * 2);
            bad_qkv += memcmp(cq, q + (size_t)t * row, row * 2) != 0 || memcmp(ck, kct + (size_t)t * ldkv, ldkv * 2) != 0 ||
                       memcmp(cv, vct + (size_t)t * ldkv, ldkv * 2) != 0;
            bad_o += memcmp(co_, out + (size_t)t * row, row * 2) != 0;
            for (size_t i = 0; i < row; i++) unw += out[(size_t)t * row + i] == 0xffff || q[(size_t)t * row + i] == 0xffff;
            /* the reference: q and k normed and rotated at P + d */
            qk_ref_row(s, qgf + t * ldqg, kf + t * ldkv, qn, kn, P + d, q + (size_t)t * row, kct + t * ldkv, &cq_ref, &ck_ref,
                       reff);
            /* attention against tdm_ref_attn_head on the kernels' own q and K/V rows: the cache below
             * P, then the path's rows */
            for (int i = 0; i < n; i++)
                for (size_t e = 0; e < ldkv; e++) {
                    kcf[(size_t)(P + i) * ldkv + e] = tdm_bf16_to_f32(kct[(size_t)path[i] * ldkv + e]);
                    vcf[(size_t)(P + i) * ldkv + e] = tdm_bf16_to_f32(vct[(size_t)path[i] * ldkv + e]);
                }
            for (size_t i = 0; i < row; i++) qf[i] = tdm_bf16_to_f32(q[(size_t)t * row + i]);
            for (int h = 0; h < Hq; h++) {
                const float *qr = qf + (size_t)h * D, *kh = kcf + (size_t)(h / grp) * D, *vh = vcf + (size_t)(h / grp) * D;
                for (int i = 0; i < D; i++) gate[i] = qgf[t * ldqg + (size_t)h * 2 * D + D + i];
                const int nk = P + n;
                attn_err_scale(qr, kh, vh, ldkv, nk, D, amag);
                tdm_ref_attn_head(qr, gate, kh, vh, ldkv, nk, D, pr, ref);
                for (int i = 0; i < D; i++)
                    cmp_add(&co_ref, tdm_bf16_to_f32(out[(size_t)t * row + (size_t)h * D + i]), ref[i],
                            ldexp(amag[i] + fabs(ref[i]), -7));
            }
        }
        ok(bad_qkv == 0 && bad_o == 0 && unw == 0, "%s, %s: every node's q, K/V rows and attention output equal the chain "
           "kernels on its root-to-node path, bit for bit (%d q/K/V rows, %d outputs differ, %d unwritten)", label,
           tree_names[k0], bad_qkv, bad_o, unw);
        char what[112];
        snprintf(what, sizeof what, "%s: q at P + depth against tdm_ref_rmsnorm + tdm_ref_rope_bf16 (1 ulp + 2^-7 max)",
                 tree_names[k0]);
        cmp_ok(&cq_ref, label, what);
        snprintf(what, sizeof what, "%s: K rows (at P + node) rotated at P + depth against the reference", tree_names[k0]);
        cmp_ok(&ck_ref, label, what);
        snprintf(what, sizeof what, "%s: attention against tdm_ref_attn_head over the cache and the path (2^-7 (A + |ref|))",
                 tree_names[k0]);
        cmp_ok(&co_ref, label, what);
    }
    tree_graph_test(label, qk_tree_launch, &c, c.dpar, c.dq, R * row * 2);
    tree_graph_test(label, attn_tree_launch, &c, c.dpar, c.dout, R * row * 2);
    tdm_cuda_free(c.dqg); tdm_cuda_free(c.dk); tdm_cuda_free(c.dv); tdm_cuda_free(c.dq); tdm_cuda_free(c.dkc);
    tdm_cuda_free(c.dvc); tdm_cuda_free(c.dout); tdm_cuda_free(c.dqn); tdm_cuda_free(c.dkn); tdm_cuda_free(c.scratch);
    tdm_cuda_free(c.dpar); tdm_cuda_free(c.dpos);
    tdm_cuda_free(dkc2); tdm_cuda_free(dvc2); tdm_cuda_free(dpqg); tdm_cuda_free(dpk); tdm_cuda_free(dpv);
    tdm_cuda_free(dpq); tdm_cuda_free(dpo);
    free(qg); free(k); free(v); free(kc); free(vc); free(q); free(out); free(kct); free(vct); free(cq); free(ck); free(cv);
    free(co_); free(pqg); free(pk); free(pv); free(qgf); free(kf); free(vf); free(qn); free(kn); free(reff);
    free(kcf); free(vcf); free(pr); free(ref); free(qf); free(gate); free(amag); free(chain_q); free(chain_k); free(chain_o);
}

/* ================================================================================================
 * MoE router
 */
struct route_ctx { uint16_t *dl, *dw; int32_t *dsel; int E, k, norm; };
static int route_launch(void *p, int r0, int m, int devpos)
{
    struct route_ctx *c = p;
    (void)devpos;
    return tdm_moe_route(c->dl + (size_t)r0 * c->E, c->E, m, c->E, c->k, c->norm, c->dsel + (size_t)r0 * c->k,
                         c->dw + (size_t)r0 * c->k, st);
}

static void test_route(const struct shape *s, int norm)
{
    const int E = s->c.n_experts, k = s->c.top_k;
    const size_t n = (size_t)R * E;
    char label[128];
    snprintf(label, sizeof label, "%s moe_route E %d k %d%s", s->name, E, k, norm ? "" : " (no renormalisation)");
    uint16_t *l = hal(n * 2), *w = hal((size_t)R * k * 2);
    int32_t *sel = hal((size_t)R * k * 4);
    float *lf = hal(n * 4), *p = hal(E * 4), *wr = hal(k * 4);
    int *sr = hal(k * sizeof(int));
    rand_bf16(l, lf, n, 4.0f);
    /* ties: row 5 all equal, row 6 on a coarse grid (many equal logits), row 7 two equal maxima */
    for (int e = 0; e < E; e++) {
        l[5 * E + e] = tdm_f32_to_bf16(0.5f);
        l[6 * E + e] = tdm_f32_to_bf16((float)(next() % 5));
    }
    l[7 * E + E - 1] = l[7 * E + 1] = tdm_f32_to_bf16(9.0f);
    for (size_t i = 0; i < n; i++) lf[i] = tdm_bf16_to_f32(l[i]);
    share_rows(l, lf, E);
    struct route_ctx c = {dal(n * 2), dal((size_t)R * k * 2), dal((size_t)R * k * 4), E, k, norm};
    up(c.dl, l, n * 2);
    poison(c.dw, (size_t)R * k * 2);
    poison(c.dsel, (size_t)R * k * 4);
    if (route_launch(&c, 0, R, 0) != 0) bail("tdm_moe_route");
    down(w, c.dw, (size_t)R * k * 2);
    down(sel, c.dsel, (size_t)R * k * 4);
    struct cmp cw = {0};
    int selbad = 0;
    for (int r = 0; r < R; r++) {
        tdm_ref_route(lf + (size_t)r * E, E, k, norm, p, sr, wr);
        for (int j = 0; j < k; j++) {
            selbad += sel[r * k + j] != sr[j];
            cmp_add(&cw, tdm_bf16_to_f32(w[r * k + j]), wr[j], ulp(wr[j]));
        }
    }
    ok(selbad == 0, "%s: the chosen experts equal tdm_ref_route's, in order (%d of %d differ)", label, selbad, R * k);
    cmp_ok(&cw, label, "weights against tdm_ref_route (1 ulp)");
    struct twin t = {route_launch, noop_reset, &c, 2, {{c.dsel, (size_t)k * 4, 1}, {c.dw, (size_t)k * 2, 0}}, NULL, 0, 0, NULL, 0};
    twin_test(label, &t);
    tdm_cuda_free(c.dl); tdm_cuda_free(c.dw); tdm_cuda_free(c.dsel);
    free(l); free(w); free(sel); free(lf); free(p); free(wr); free(sr);
}

/* ================================================================================================
 * grouped GDN projections (qwen3_next)
 */
struct ug_ctx { uint16_t *dqkvz, *dba, *dmix, *dz, *db, *da; int Hk, Hv, Dk, Dv; int64_t ldq, ldba; };
static int ug_launch(void *p, int r0, int m, int devpos)
{
    struct ug_ctx *c = p;
    (void)devpos;
    const size_t C = 2 * (size_t)c->Hk * c->Dk + (size_t)c->Hv * c->Dv, HvDv = (size_t)c->Hv * c->Dv;
    return tdm_gdn_ungroup(c->dqkvz + r0 * c->ldq, c->ldq, c->dba + r0 * c->ldba, c->ldba, m, c->Hk, c->Hv, c->Dk, c->Dv,
                           c->dmix + r0 * C, c->dz + r0 * HvDv, c->db + (size_t)r0 * c->Hv, c->da + (size_t)r0 * c->Hv, st);
}

static void test_ungroup(const struct shape *s)
{
    const int Hk = s->c.gdn_k_heads, Hv = s->c.gdn_v_heads, Dk = s->c.gdn_k_dim, Dv = s->c.gdn_v_dim;
    const size_t W = 2 * (size_t)Hk * Dk + 2 * (size_t)Hv * Dv, C = (size_t)tdm_gdn_conv_dim(&s->c), HvDv = (size_t)Hv * Dv;
    const int64_t ldq = (int64_t)W + 8, ldba = 2 * Hv + 2; /* row strides wider than the rows */
    char label[128];
    snprintf(label, sizeof label, "%s gdn_ungroup Hk %d Hv %d Dk %d Dv %d", s->name, Hk, Hv, Dk, Dv);
    uint16_t *q = hal(R * ldq * 2), *ba = hal(R * ldba * 2), *mix = hal(R * C * 2), *z = hal(R * HvDv * 2);
    uint16_t *b = hal(R * Hv * 2), *a = hal(R * Hv * 2);
    float *qf = hal(R * ldq * 4), *baf = hal(R * ldba * 4), *rm = hal(C * 4), *rz = hal(HvDv * 4), *rb = hal(Hv * 4),
          *ra = hal(Hv * 4);
    rand_bf16(q, qf, R * ldq, 4.0f);
    rand_bf16(ba, baf, R * ldba, 4.0f);
    struct ug_ctx c = {dal(R * ldq * 2), dal(R * ldba * 2), dal(R * C * 2), dal(R * HvDv * 2), dal(R * Hv * 2),
                       dal(R * Hv * 2), Hk, Hv, Dk, Dv, ldq, ldba};
    up(c.dqkvz, q, R * ldq * 2);
    up(c.dba, ba, R * ldba * 2);
    poison(c.dmix, R * C * 2); poison(c.dz, R * HvDv * 2); poison(c.db, R * Hv * 2); poison(c.da, R * Hv * 2);
    if (ug_launch(&c, 0, R, 0) != 0) bail("tdm_gdn_ungroup");
    down(mix, c.dmix, R * C * 2); down(z, c.dz, R * HvDv * 2); down(b, c.db, R * Hv * 2); down(a, c.da, R * Hv * 2);
    struct cmp cm = {0};
    for (int r = 0; r < R; r++) {
        tdm_ref_gdn_ungroup(Hk, Hv, Dk, Dv, qf + r * ldq, baf + r * ldba, rm, rz, rb, ra);
        for (size_t i = 0; i < C; i++) cmp_add(&cm, tdm_bf16_to_f32(mix[r * C + i]), rm[i], 0);
        for (size_t i = 0; i < HvDv; i++) cmp_add(&cm, tdm_bf16_to_f32(z[r * HvDv + i]), rz[i], 0);
        for (int i = 0; i < Hv; i++) {
            cmp_add(&cm, tdm_bf16_to_f32(b[r * Hv + i]), rb[i], 0);
            cmp_add(&cm, tdm_bf16_to_f32(a[r * Hv + i]), ra[i], 0);
        }
    }
    ok(cm.n > 0 && cm.exact == cm.n, "%s: check against tdm_ref_gdn_ungroup, bit for bit (%ld of %ld differ)", label,
       cm.n - cm.exact, cm.n);
    struct twin t = {ug_launch, noop_reset, &c, 4,
                     {{c.dmix, C * 2, 0}, {c.dz, HvDv * 2, 0}, {c.db, (size_t)Hv * 2, 0}, {c.da, (size_t)Hv * 2, 0}},
                     NULL, 0, 0, NULL, 0};
    twin_test(label, &t);
    tdm_cuda_free(c.dqkvz); tdm_cuda_free(c.dba); tdm_cuda_free(c.dmix); tdm_cuda_free(c.dz); tdm_cuda_free(c.db);
    tdm_cuda_free(c.da);
    free(q); free(ba); free(mix); free(z); free(b); free(a); free(qf); free(baf); free(rm); free(rz); free(rb); free(ra);
}

/* ================================================================================================
 * MoE experts
 */

/* A random stored weight of rows x k on the host (codes straight into the format; no NaN codes). */
static struct tdm_qweight make_weight(enum tdm_wfmt fmt, enum tdm_dtype sdt, int64_t rows, int64_t k, void **mem)
{
    struct tdm_qweight q = {.fmt = fmt, .n = rows, .k = k, .scale_dt = sdt};
    const int64_t B = TDM_FP8_BLOCK;
    if (fmt == TDM_W_BF16) {
        uint16_t *p = hal((size_t)(rows * k) * 2);
        for (int64_t i = 0; i < rows * k; i++) p[i] = tdm_f32_to_bf16(frand() * 0.08f);
        q.w = mem[0] = p;
    } else if (fmt == TDM_W_FP8) {
        uint8_t *p = hal((size_t)(rows * k));
        for (int64_t i = 0; i < rows * k; i++) {
            p[i] = (uint8_t)next();
            if ((p[i] & 0x7f) == 0x7f) p[i] ^= 0x08;
        }
        const int64_t nb = ((rows + B - 1) / B) * ((k + B - 1) / B);
        void *sc = hal((size_t)nb * 4);
        for (int64_t i = 0; i < nb; i++) {
            const float v = ldexpf(1.0f + 0.5f * frand(), -9);
            if (sdt == TDM_DT_BF16) ((uint16_t *)sc)[i] = tdm_f32_to_bf16(v);
            else ((float *)sc)[i] = v;
        }
        q.w = mem[0] = p;
        q.scale = mem[1] = sc;
    } else {
        uint8_t *p = hal((size_t)(rows * k / 2)), *sc = hal((size_t)(rows * k / TDM_NVFP4_GROUP));
        for (int64_t i = 0; i < rows * k / 2; i++) p[i] = (uint8_t)next();
        for (int64_t i = 0; i < rows * k / TDM_NVFP4_GROUP; i++) sc[i] = (uint8_t)(((4 + next() % 4) << 3) | (next() & 7));
        q.w = mem[0] = p;
        q.scale = mem[1] = sc;
        q.scale2 = 0.0625f;
    }
    return q;
}

/* E experts of gate, up [I, H] and down [H, I] (fused: BF16 gate and up as row views of one [2I, H]
 * matrix per expert, the fused checkpoints' layout); *mem: their host buffers, (3E + 1) * 2 slots
 * (the last pair for the caller's shared gate), freed by free_experts. */
static struct tdm_mlp *make_experts(int E, enum tdm_wfmt fmt, enum tdm_dtype sdt, int fused, int H, int I, void ***mem)
{
    void **m = *mem = hal((size_t)(3 * E + 1) * 2 * sizeof(void *));
    struct tdm_mlp *ex = hal((size_t)E * sizeof *ex);
    for (int e = 0; e < E; e++) {
        if (fused) {
            struct tdm_qweight gu = make_weight(fmt, sdt, 2 * (int64_t)I, H, m + 6 * e);
            ex[e].gate = tdm_qweight_rows(&gu, 0, I);
            ex[e].up = tdm_qweight_rows(&gu, I, I);
        } else {
            ex[e].gate = make_weight(fmt, sdt, I, H, m + 6 * e);
            ex[e].up = make_weight(fmt, sdt, I, H, m + 6 * e + 2);
        }
        ex[e].down = make_weight(fmt, sdt, H, I, m + 6 * e + 4);
    }
    return ex;
}
static void free_experts(struct tdm_mlp *ex, int E, void **mem)
{
    for (int i = 0; i < (3 * E + 1) * 2; i++) free(mem[i]);
    free(mem);
    free(ex);
}

struct moe_ctx {
    struct tdm_moe_experts ex;
    struct tdm_dweight sg;
    uint16_t *dx, *dw, *dact, *dy, *dsh, *dout;
    int32_t *dsel, *dorder;
    float *dgate;
    int H, I, k;
};
static int moe_launch(void *p, int r0, int m, int devpos)
{
    struct moe_ctx *c = p;
    (void)devpos;
    const size_t k = c->k, H = c->H, I = c->I;
    const int32_t *sel = c->dsel + r0 * k;
    return tdm_moe_order(sel, m, c->k, c->dorder, st) ||
           tdm_moe_gate_up(&c->ex, c->dx + r0 * H, H, m, c->k, c->dorder, c->dact + r0 * k * I, st) ||
           tdm_moe_down(&c->ex, c->dact + r0 * k * I, m, c->k, c->dorder, c->dy + r0 * k * H, st) ||
           tdm_moe_shared_gate(&c->sg, c->dx + r0 * H, H, m, c->H, c->dgate + r0, st) ||
           tdm_moe_combine(c->dy + r0 * k * H, c->dw + r0 * k, sel, m, c->k, c->H, c->dgate + r0, c->dsh + r0 * H, H,
                           c->dout + r0 * H, H, st);
}

/* The expert kernels' dots run in their own fixed order (moe.h), not tdm_dot's: a dot may differ
 * from the reference's by MOE_DOT_REL of sum |x w| (the FP32 sums of 2 x 8192 terms in two orders),
 * and a value rounded to BF16 from it by one BF16 ulp more. MOE_REL: the relative error (L2 over a
 * call's outputs) of the products and the experts' outputs. */
#define MOE_DOT_REL 1e-4
#define MOE_REL 1e-2

/* The bound on a SwiGLU product act = bf16(bf16(silu(bf16(g))) * bf16(u)) against the reference's,
 * given the reference's dots g, u and their sums |x w| mg, mu: each dot within MOE_DOT_REL m, then
 * its BF16 rounding one ulp (2^-7 |.|) more; silu's slope is at most 1.1; its BF16 rounding one ulp
 * more; the product's own rounding one ulp of the result. */
static double act_bound(float g, float u, double mg, double mu, float aref)
{
    const double dg = MOE_DOT_REL * mg + ldexp(fabs(g), -7), du = MOE_DOT_REL * mu + ldexp(fabs(u), -7);
    const double sg = fabs((double)g / (1.0 + exp(-(double)g)));
    const double ds = 1.1 * dg + ldexp(sg + 1.1 * dg, -7);
    return ulp(aref) + ds * (fabs(u) + du) + sg * du;
}

/* E experts of the shape's H and moe_intermediate_size (E below the shape's count keeps the host
 * reference quick; the matrices are the real ones), top-k of the shape. fused: BF16 gate and up as
 * row views of one [2I, H] matrix per expert (the fused checkpoints' layout). rows: the rows of the
 * check call (1..R); the twins (M = 2..R against one-row calls) run when rows is R. */
static void test_moe(const struct shape *s, int E, enum tdm_wfmt fmt, enum tdm_dtype sdt, int fused, int rows)
{
    const int H = s->c.hidden, I = s->c.moe_intermediate, k = s->c.top_k, P = R * k, PC = rows * k;
    char label[160];
    snprintf(label, sizeof label, "%s moe experts %s%s%s E %d k %d H %d I %d M %d", s->name, tdm_wfmt_name(fmt),
             fmt == TDM_W_FP8 ? (sdt == TDM_DT_BF16 ? " (BF16 scales)" : " (F32 scales)") : "", fused ? " fused" : "", E, k,
             H, I, rows);
    void **mem;
    struct tdm_mlp *ex = make_experts(E, fmt, sdt, fused, H, I, &mem);
    const struct tdm_qweight sgq = make_weight(fmt, sdt, 1, H, mem + 6 * E);
    struct moe_ctx c = {.H = H, .I = I, .k = k};
    if (tdm_moe_experts_upload(ex, E, &c.ex) != 0 || tdm_dweight_upload(&sgq, &c.sg) != 0) bail("MoE upload");

    /* inputs: x, the routing (distinct experts a row; even rows among the first k + 2), weights, shared output */
    const size_t nx = (size_t)R * H;
    uint16_t *x = hal(nx * 2), *w = hal((size_t)P * 2), *sh = hal(nx * 2);
    float *xf = hal(nx * 4), *wf = hal((size_t)P * 4), *shf = hal(nx * 4);
    int32_t *sel = hal((size_t)P * 4), *order = hal((size_t)P * 4);
    rand_bf16(x, xf, nx, 2.0f);
    rand_bf16(sh, shf, nx, 2.0f);
    for (int i = 0; i < P; i++) {
        w[i] = tdm_f32_to_bf16(0.05f + 0.45f * (frand() + 1.0f));
        wf[i] = tdm_bf16_to_f32(w[i]);
    }
    for (int r = 0; r < R; r++) {
        const int pool = r % 2 == 0 && k + 2 < E ? k + 2 : E;
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)(next() % (uint64_t)pool);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= sel[r * k + i] == e;
            } while (dup);
            sel[r * k + j] = e;
        }
    }
    share_rows(x, xf, H);
    share_rows(sh, shf, H);
    share_rows(w, wf, k);
    {
        const int same[3][2] = {{9, 0}, {21, 0}, {30, 3}};
        for (int i = 0; i < 3; i++) memcpy(sel + same[i][0] * k, sel + same[i][1] * k, (size_t)k * 4);
    }
    c.dx = dal(nx * 2); c.dsh = dal(nx * 2); c.dout = dal(nx * 2); c.dw = dal((size_t)P * 2);
    c.dact = dal((size_t)P * I * 2); c.dy = dal((size_t)P * H * 2);
    c.dsel = dal((size_t)P * 4); c.dorder = dal((size_t)P * 4); c.dgate = dal((size_t)R * 4);
    up(c.dx, x, nx * 2); up(c.dsh, sh, nx * 2); up(c.dw, w, (size_t)P * 2); up(c.dsel, sel, (size_t)P * 4);
    poison(c.dact, (size_t)P * I * 2); poison(c.dy, (size_t)P * H * 2); poison(c.dout, nx * 2);
    poison(c.dorder, (size_t)P * 4); poison(c.dgate, (size_t)R * 4);
    if (moe_launch(&c, 0, rows, 0) != 0) bail("MoE experts");
    uint16_t *act = hal((size_t)P * I * 2), *y = hal((size_t)P * H * 2), *out = hal(nx * 2);
    down(order, c.dorder, (size_t)P * 4);
    down(act, c.dact, (size_t)P * I * 2);
    down(y, c.dy, (size_t)P * H * 2);
    down(out, c.dout, nx * 2);

    /* the pair order: a stable sort by expert id, each entry the pair (low 16 bits) and its expert */
    int obad = 0;
    for (int i = 0, at = 0; i < E; i++)
        for (int p = 0; p < PC; p++)
            if (sel[p] == i) {
                obad += order[at] != (int32_t)((uint32_t)p | (uint32_t)i << 16);
                at++;
            }
    ok(obad == 0, "%s: tdm_moe_order equals the pairs sorted by (expert, pair), each with its expert (%d of %d differ)",
       label, obad, PC);

    /* gate+up against tdm_ref_mlp_act; down on the kernel's products against tdm_ref_linear_bf16;
     * bounds from the reference's dots and their sums |x w| (act_bound, MOE_DOT_REL) */
    struct cmp ca = {0}, cd = {0}, cc = {0};
    float *aref = hal((size_t)I * 4), *af = hal((size_t)I * 4), *yref = hal((size_t)H * 4);
    float *wrow = hal((size_t)(H > I ? H : I) * 4), *wrow2 = hal((size_t)H * 4);
    float *ag = hal((size_t)PC * I * 4), *ar = hal((size_t)PC * I * 4), *yg = hal((size_t)PC * H * 4),
          *yr = hal((size_t)PC * H * 4);
    for (int p = 0; p < PC; p++) {
        const struct tdm_mlp *xp = &ex[sel[p]];
        const float *xr = xf + (size_t)(p / k) * H;
        tdm_ref_mlp_act(xp, xr, 1, aref);
        for (int i = 0; i < I; i++) {
            tdm_qweight_row(&xp->gate, i, wrow);
            tdm_qweight_row(&xp->up, i, wrow2);
            double mg = 0, mu = 0;
            for (int j = 0; j < H; j++) {
                mg += fabs((double)xr[j] * wrow[j]);
                mu += fabs((double)xr[j] * wrow2[j]);
            }
            const float g = tdm_dot(xr, wrow, H), u = tdm_dot(xr, wrow2, H);
            af[i] = tdm_bf16_to_f32(act[(size_t)p * I + i]);
            cmp_add(&ca, af[i], aref[i], act_bound(g, u, mg, mu, aref[i]));
            ag[(size_t)p * I + i] = af[i];
            ar[(size_t)p * I + i] = aref[i];
        }
        tdm_ref_linear_bf16(&xp->down, af, 1, yref);
        for (int i = 0; i < H; i++) {
            tdm_qweight_row(&xp->down, i, wrow);
            double m = 0;
            for (int j = 0; j < I; j++) m += fabs((double)af[j] * wrow[j]);
            const float got = tdm_bf16_to_f32(y[(size_t)p * H + i]);
            cmp_add(&cd, got, yref[i], MOE_DOT_REL * m + ulp(yref[i]));
            yg[(size_t)p * H + i] = got;
            yr[(size_t)p * H + i] = yref[i];
        }
    }
    const double rela = tdm_rel_err(ag, ar, (int64_t)PC * I), rely = tdm_rel_err(yg, yr, (int64_t)PC * H);
    cmp_ok(&ca, label, "gate+up against tdm_ref_mlp_act (the dots within 1e-4 sum|xw|, +1 ulp a rounding)");
    ok(rela <= MOE_REL, "%s: gate+up relative error %.2e <= %.0e", label, rela, MOE_REL);
    cmp_ok(&cd, label, "down on the kernel's products against tdm_ref_linear_bf16 (1e-4 sum|aw| + 1 ulp)");
    ok(rely <= MOE_REL, "%s: down relative error %.2e <= %.0e", label, rely, MOE_REL);
    free(wrow); free(wrow2); free(ag); free(ar); free(yg); free(yr);

    /* the combination on the kernels' expert outputs against tdm_ref_moe_combine */
    float *ye = hal((size_t)k * H * 4), *oref = hal((size_t)H * 4), sg;
    int *selr = hal((size_t)k * sizeof(int));
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < k; j++) selr[j] = sel[r * k + j];
        for (size_t i = 0; i < (size_t)k * H; i++) ye[i] = tdm_bf16_to_f32(y[(size_t)r * k * H + i]);
        tdm_ref_linear_bf16(&sgq, xf + (size_t)r * H, 1, &sg);
        tdm_ref_moe_combine(H, k, selr, wf + r * k, ye, shf + (size_t)r * H, sg, oref);
        for (int i = 0; i < H; i++)
            cmp_add(&cc, tdm_bf16_to_f32(out[(size_t)r * H + i]), oref[i], ulp(oref[i]) + ulp(shf[(size_t)r * H + i]));
    }
    cmp_ok(&cc, label, "combination against tdm_ref_moe_combine (1 ulp + 1 ulp of the shared value)");

    struct twin t = {moe_launch, noop_reset, &c, 3,
                     {{c.dact, (size_t)k * I * 2, 0}, {c.dy, (size_t)k * H * 2, 0}, {c.dout, (size_t)H * 2, 0}},
                     NULL, 0, 0, NULL, 0};
    if (rows == R) twin_test(label, &t);

    tdm_moe_experts_free(&c.ex);
    tdm_dweight_free(&c.sg);
    tdm_cuda_free(c.dx); tdm_cuda_free(c.dsh); tdm_cuda_free(c.dout); tdm_cuda_free(c.dw); tdm_cuda_free(c.dact);
    tdm_cuda_free(c.dy); tdm_cuda_free(c.dsel); tdm_cuda_free(c.dorder); tdm_cuda_free(c.dgate);
    free_experts(ex, E, mem);
    free(x); free(w); free(sh); free(xf); free(wf); free(shf); free(sel); free(order); free(act);
    free(y); free(out); free(aref); free(af); free(yref); free(ye); free(oref); free(selr);
}

/* The grouped form (moe.h: tdm_moe_group, tdm_moe_gate_up_grouped, tdm_moe_down_grouped, then
 * tdm_moe_combine) for prefill chunks of T = 1, 33, 100 and 512 rows, against the CPU reference, on
 * the same E experts per format. Skewed routing: every row takes expert E - 1 (T rows on one expert,
 * several 128-row tiles at T = 512); three rows in four take the rest among a pool of k + 2 experts
 * (many rows each), the fourth among all; the experts e = 1 mod 4 take no row. Bounds (the sums run
 * in the wide GEMM's order, BF16 products exact in FP32 — no twin contract): act against
 * tdm_ref_mlp_act within act_bound (each dot within MOE_DOT_REL sum|x w|, +1 ulp a rounding); y on
 * the kernel's own act against tdm_ref_linear_bf16 within MOE_DOT_REL sum|a w| + 1 ulp; both with a
 * relative error (L2 over the call) <= MOE_REL; the combination on the kernels' expert outputs
 * within 1 ulp + 1 ulp of the shared value of tdm_ref_moe_combine; and the whole MoE output against
 * the reference's own chain (tdm_ref_mlp_act, tdm_ref_linear_bf16, tdm_ref_moe_combine) with a
 * relative error <= MOE_REL. The reference runs per expert over its rows, each weight decoded once. */
static void test_moe_grouped(const struct shape *s, int E, enum tdm_wfmt fmt, enum tdm_dtype sdt)
{
    enum { NT = 4, TMAX = 512 };
    const int Ts[NT] = {1, 33, 100, TMAX};
    const int H = s->c.hidden, I = s->c.moe_intermediate, k = s->c.top_k, PM = TMAX * k;
    void **mem;
    struct tdm_mlp *ex = make_experts(E, fmt, sdt, 0, H, I, &mem);
    const struct tdm_qweight sgq = make_weight(fmt, sdt, 1, H, mem + 6 * E);
    struct tdm_moe_experts dex;
    struct tdm_dweight dsg;
    if (tdm_moe_experts_upload(ex, E, &dex) != 0 || tdm_dweight_upload(&sgq, &dsg) != 0) bail("MoE upload");

    /* inputs for the largest chunk; a chunk of T rows takes the first T */
    const size_t nx = (size_t)TMAX * H;
    uint16_t *x = hal(nx * 2), *w = hal((size_t)PM * 2), *sh = hal(nx * 2);
    float *xf = hal(nx * 4), *wf = hal((size_t)PM * 4), *shf = hal(nx * 4);
    int32_t *sel = hal((size_t)PM * 4);
    rand_bf16(x, xf, nx, 2.0f);
    rand_bf16(sh, shf, nx, 2.0f);
    for (int i = 0; i < PM; i++) {
        w[i] = tdm_f32_to_bf16(0.05f + 0.45f * (frand() + 1.0f));
        wf[i] = tdm_bf16_to_f32(w[i]);
    }
    int pool[64], npool = 0;   /* the first k + 2 experts that take rows, E - 1 aside */
    for (int e = 0; e < E - 1 && npool < k + 2; e++)
        if (e % 4 != 1) pool[npool++] = e;
    for (int r = 0; r < TMAX; r++) {
        sel[r * k] = E - 1;
        for (int j = 1; j < k; j++) {
            int e, dup;
            do {
                e = r % 4 != 3 ? pool[next() % (uint64_t)npool] : (int)(next() % (uint64_t)E);
                dup = e % 4 == 1;
                for (int i = 0; i < j; i++) dup |= sel[r * k + i] == e;
            } while (dup);
            sel[r * k + j] = e;
        }
    }
    uint16_t *dx = dal(nx * 2), *dsh = dal(nx * 2), *dout = dal(nx * 2), *dw = dal((size_t)PM * 2);
    uint16_t *dact = dal((size_t)PM * I * 2), *dy = dal((size_t)PM * H * 2);
    int32_t *dsel = dal((size_t)PM * 4);
    float *dgate = dal((size_t)TMAX * 4);
    void *dgroup = dal(tdm_moe_group_bytes(TMAX, k, E));
    up(dx, x, nx * 2); up(dsh, sh, nx * 2); up(dw, w, (size_t)PM * 2); up(dsel, sel, (size_t)PM * 4);

    uint16_t *act = hal((size_t)PM * I * 2), *y = hal((size_t)PM * H * 2), *out = hal(nx * 2);
    float *ar = hal((size_t)PM * I * 4), *ag = hal((size_t)PM * I * 4), *yr = hal((size_t)PM * H * 4),
          *yg = hal((size_t)PM * H * 4), *yfull = hal((size_t)PM * H * 4), *of = hal(nx * 4), *ofull = hal(nx * 4);
    float *wg = hal((size_t)I * H * 4), *wu = hal((size_t)I * H * 4), *wd = hal((size_t)H * I * 4);
    float *xe = hal((size_t)TMAX * H * 4), *ae = hal((size_t)TMAX * I * 4), *ye = hal((size_t)TMAX * H * 4);
    float *orow = hal((size_t)H * 4);
    int *pe = hal((size_t)TMAX * sizeof(int));
    for (int ti = 0; ti < NT; ti++) {
        const int T = Ts[ti], P = T * k;
        char label[160];
        snprintf(label, sizeof label, "%s moe grouped %s%s E %d k %d H %d I %d T %d", s->name, tdm_wfmt_name(fmt),
                 fmt == TDM_W_FP8 ? (sdt == TDM_DT_BF16 ? " (BF16 scales)" : " (F32 scales)") : "", E, k, H, I, T);
        poison(dact, (size_t)PM * I * 2); poison(dy, (size_t)PM * H * 2); poison(dout, nx * 2);
        poison(dgroup, tdm_moe_group_bytes(TMAX, k, E));
        if (tdm_moe_group(dsel, T, k, E, dgroup, st) || tdm_moe_gate_up_grouped(&dex, dx, H, T, k, dgroup, dact, st) ||
            tdm_moe_down_grouped(&dex, dact, T, k, dgroup, dy, st) ||
            tdm_moe_shared_gate(&dsg, dx, H, T, H, dgate, st) ||
            tdm_moe_combine(dy, dw, dsel, T, k, H, dgate, dsh, H, dout, H, st))
            bail("MoE grouped");
        down(act, dact, (size_t)P * I * 2);
        down(y, dy, (size_t)P * H * 2);
        down(out, dout, (size_t)T * H * 2);

        /* per expert over its pairs: each weight decoded once */
        struct cmp ca = {0}, cd = {0}, cc = {0};
        int used = 0, most = 0;
        for (int e = 0; e < E; e++) {
            int n = 0;
            for (int p = 0; p < P; p++)
                if (sel[p] == e) pe[n++] = p;
            if (!n) continue;
            used++;
            if (n > most) most = n;
            const struct tdm_mlp *xp = &ex[e];
            for (int i = 0; i < n; i++) memcpy(xe + (size_t)i * H, xf + (size_t)(pe[i] / k) * H, (size_t)H * 4);
            tdm_ref_mlp_act(xp, xe, n, ae);
            for (int i = 0; i < I; i++) {
                tdm_qweight_row(&xp->gate, i, wg + (size_t)i * H);
                tdm_qweight_row(&xp->up, i, wu + (size_t)i * H);
            }
            for (int i = 0; i < H; i++) tdm_qweight_row(&xp->down, i, wd + (size_t)i * I);
            for (int q = 0; q < n; q++) {
                const float *xr = xe + (size_t)q * H;
                for (int i = 0; i < I; i++) {
                    const float *rg = wg + (size_t)i * H, *ru = wu + (size_t)i * H;
                    float g = 0, u = 0, mg = 0, mu = 0;
                    for (int j = 0; j < H; j++) {
                        g += xr[j] * rg[j];
                        u += xr[j] * ru[j];
                        mg += fabsf(xr[j] * rg[j]);
                        mu += fabsf(xr[j] * ru[j]);
                    }
                    const size_t at = (size_t)pe[q] * I + i;
                    const float aref = ae[(size_t)q * I + i];
                    ag[at] = tdm_bf16_to_f32(act[at]);
                    ar[at] = aref;
                    cmp_add(&ca, ag[at], aref, act_bound(g, u, mg, mu, aref));
                }
            }
            /* down on the kernel's products, and the reference's chain on its own */
            for (int q = 0; q < n; q++) memcpy(ae + (size_t)q * I, ag + (size_t)pe[q] * I, (size_t)I * 4);
            tdm_ref_linear_bf16(&xp->down, ae, n, ye);
            for (int q = 0; q < n; q++) {
                const float *arow = ae + (size_t)q * I;
                for (int i = 0; i < H; i++) {
                    const float *rd = wd + (size_t)i * I;
                    float m = 0;
                    for (int j = 0; j < I; j++) m += fabsf(arow[j] * rd[j]);
                    const size_t at = (size_t)pe[q] * H + i;
                    yg[at] = tdm_bf16_to_f32(y[at]);
                    yr[at] = ye[(size_t)q * H + i];
                    cmp_add(&cd, yg[at], yr[at], MOE_DOT_REL * m + ulp(yr[at]));
                }
            }
            for (int q = 0; q < n; q++) memcpy(ae + (size_t)q * I, ar + (size_t)pe[q] * I, (size_t)I * 4);
            tdm_ref_linear_bf16(&xp->down, ae, n, ye);
            for (int q = 0; q < n; q++) memcpy(yfull + (size_t)pe[q] * H, ye + (size_t)q * H, (size_t)H * 4);
        }
        const double rela = tdm_rel_err(ag, ar, (int64_t)P * I), rely = tdm_rel_err(yg, yr, (int64_t)P * H);
        printf("# %s: %d experts take rows (at most %d), %d take none\n", label, used, most, E - used);
        cmp_ok(&ca, label, "gate+up against tdm_ref_mlp_act (the dots within 1e-4 sum|xw|, +1 ulp a rounding)");
        ok(rela <= MOE_REL, "%s: gate+up relative error %.2e <= %.0e", label, rela, MOE_REL);
        cmp_ok(&cd, label, "down on the kernel's products against tdm_ref_linear_bf16 (1e-4 sum|aw| + 1 ulp)");
        ok(rely <= MOE_REL, "%s: down relative error %.2e <= %.0e", label, rely, MOE_REL);

        /* the combination on the kernels' expert outputs; the whole output against the reference's chain */
        int selr[64];
        for (int r = 0; r < T; r++) {
            float sg;
            for (int j = 0; j < k; j++) selr[j] = sel[r * k + j];
            tdm_ref_linear_bf16(&sgq, xf + (size_t)r * H, 1, &sg);
            tdm_ref_moe_combine(H, k, selr, wf + r * k, yg + (size_t)r * k * H, shf + (size_t)r * H, sg, orow);
            for (int i = 0; i < H; i++) {
                of[(size_t)r * H + i] = tdm_bf16_to_f32(out[(size_t)r * H + i]);
                cmp_add(&cc, of[(size_t)r * H + i], orow[i], ulp(orow[i]) + ulp(shf[(size_t)r * H + i]));
            }
            tdm_ref_moe_combine(H, k, selr, wf + r * k, yfull + (size_t)r * k * H, shf + (size_t)r * H, sg,
                                ofull + (size_t)r * H);
        }
        cmp_ok(&cc, label, "combination against tdm_ref_moe_combine (1 ulp + 1 ulp of the shared value)");
        const double relo = tdm_rel_err(of, ofull, (int64_t)T * H);
        ok(relo <= MOE_REL, "%s: the MoE output against the CPU reference's chain: relative error %.2e <= %.0e", label,
           relo, MOE_REL);
    }
    tdm_moe_experts_free(&dex);
    tdm_dweight_free(&dsg);
    tdm_cuda_free(dx); tdm_cuda_free(dsh); tdm_cuda_free(dout); tdm_cuda_free(dw); tdm_cuda_free(dact);
    tdm_cuda_free(dy); tdm_cuda_free(dsel); tdm_cuda_free(dgroup); tdm_cuda_free(dgate);
    free_experts(ex, E, mem);
    free(x); free(w); free(sh); free(xf); free(wf); free(shf); free(sel); free(act); free(y); free(out); free(ar);
    free(ag); free(yr); free(yg); free(yfull); free(of); free(ofull); free(wg); free(wu); free(wd); free(xe); free(ae);
    free(ye); free(orow); free(pe);
}

/* ================================================================================================
 * argmax
 */
struct am_ctx { float *dl; void *scratch; int32_t *dids; int V; };
static int am_launch(void *p, int r0, int m, int devpos)
{
    struct am_ctx *c = p;
    (void)devpos;
    return tdm_argmax_rows(c->dl + (size_t)r0 * c->V, c->V, m, c->V, c->scratch, c->dids + r0, st);
}

static void test_argmax(const struct shape *s)
{
    const int V = s->c.vocab;
    const size_t n = (size_t)R * V;
    char label[128];
    snprintf(label, sizeof label, "%s argmax V %d", s->name, V);
    float *l = hal(n * 4);
    int32_t ids[R];
    for (size_t i = 0; i < n; i++) l[i] = frand() * 10.0f;
    /* ties: row 1 the maximum at two ids, row 2 all equal,
     * row 4 the maximum at the last id, row 8 a NaN before the maximum */
    l[(size_t)1 * V + V - 3] = l[(size_t)1 * V + V / 2] = 20.0f;
    for (int i = 0; i < V; i++) l[(size_t)2 * V + i] = -1.0f;
    l[(size_t)4 * V + V - 1] = 30.0f;
    l[(size_t)8 * V + 3] = NAN;
    l[(size_t)8 * V + 5] = 25.0f;
    for (int i = 0; i < 3; i++) {
        const int same[3][2] = {{9, 0}, {21, 0}, {30, 3}};
        memcpy(l + (size_t)same[i][0] * V, l + (size_t)same[i][1] * V, (size_t)V * 4);
    }
    const size_t sb = tdm_argmax_scratch_bytes(R, V);
    struct am_ctx c = {dal(n * 4), dal(sb), dal(R * 4), V};
    up(c.dl, l, n * 4);
    poison(c.dids, R * 4);
    if (am_launch(&c, 0, R, 0) != 0) bail("tdm_argmax_rows");
    down(ids, c.dids, R * 4);
    int bad = 0;
    for (int r = 0; r < R; r++) bad += ids[r] != tdm_argmax(l + (size_t)r * V, V);
    ok(bad == 0, "%s: check against tdm_argmax, ties to the lower id (%d of %d rows differ)", label, bad, R);
    struct twin t = {am_launch, noop_reset, &c, 1, {{c.dids, 4, 1}}, NULL, 0, 0, NULL, 0};
    twin_test(label, &t);
    /* rows that start one logit in (not 16-byte aligned: the element-wise loads) and rows of V - 3
     * (a last slice that ends inside a thread's four) */
    for (int form = 0; form < 2; form++) {
        const int off = form == 0 ? 1 : 0, v = form == 0 ? V - 1 : V - 3;
        poison(c.dids, R * 4);
        if (tdm_argmax_rows(c.dl + off, V, R, v, c.scratch, c.dids, st) != 0) bail("tdm_argmax_rows");
        down(ids, c.dids, R * 4);
        bad = 0;
        for (int r = 0; r < R; r++) bad += ids[r] != tdm_argmax(l + (size_t)r * V + off, v);
        ok(bad == 0, "%s: rows of %d logits %s: check against tdm_argmax (%d of %d rows differ)", label, v,
           form == 0 ? "from the second logit on (unaligned)" : "(a partial last unit)", bad, R);
    }
    tdm_cuda_free(c.dl); tdm_cuda_free(c.scratch); tdm_cuda_free(c.dids);
    free(l);
}

/* The groups named on the command line (none: all): "attn" (decode, tree and prefill attention),
 * "rest" (everything else); "moe" (the router, the experts and their grouped form) and "gdn" (the
 * gated norm, the conv, the recurrence with its fused norm, trees, the ungroup and the prefill forms):
 * parts of rest, alone. */
static int want_attn = 1, want_rest = 1, want_moe = 0, want_gdn = 0;

/* ================================================================================================
 * blocked copies (mm_layout.h: xb): the kernels that write a product's input (add_rmsnorm,
 * the gated norm, attention's output, chain and tree, SiLU x up) write its blocked copy as well
 * when asked: the copy equals their output laid out by tdm_mm_xb_index, and the output is the
 * same bits as without the copy, at 1, 7, 16 and 32 rows; 33 rows with a copy are refused.
 */
/* Elements of the copy dxb that differ from dout [M][K] laid out by tdm_mm_xb_index. */
static int64_t xb_diff(const uint16_t *dout, const uint16_t *dxb, int M, int64_t K)
{
    const int64_t ne = tdm_mm_xb_elems(K), kf = K / TDM_MM_SLAB_K * TDM_MM_SLAB_K;
    uint16_t *out = hal((size_t)M * K * 2), *xb = hal((size_t)ne * 2 + 2);
    down(out, dout, (size_t)M * K * 2);
    down(xb, dxb, (size_t)ne * 2);
    int64_t diff = 0;
    for (int r = 0; r < M; r++)
        for (int64_t k = 0; k < kf; k++) diff += xb[tdm_mm_xb_index(r, k)] != out[r * K + k];
    free(out);
    free(xb);
    return diff;
}
/* Whether two device buffers hold the same n bytes. */
static int same_bytes(const void *a, const void *b, size_t n)
{
    unsigned char *ha = hal(n), *hb = hal(n);
    down(ha, a, n);
    down(hb, b, n);
    const int same = memcmp(ha, hb, n) == 0;
    free(ha);
    free(hb);
    return same;
}
static void blocked_ok(const char *label, const char *what, int M, int same, int64_t diff)
{
    ok(same && diff == 0, "%s %s, %d rows, with its blocked copy: the output's bits unchanged, the copy = the output laid out "
       "(%lld elements differ)", label, what, M, (long long)diff);
}

static void test_blocked(const struct shape *s)
{
    const int H = s->c.hidden, Hv = s->c.gdn_v_heads, Dv = s->c.gdn_v_dim, I = s->c.intermediate;
    const int Hq = s->c.n_q_heads, Hkv = s->c.n_kv_heads, D = s->c.head_dim, P = 300, ctx = P + TDM_MM_XB_ROWS + 1;
    const size_t HvDv = (size_t)Hv * Dv, HqD = (size_t)Hq * D, ldqg = 2 * HqD, kvrow = (size_t)Hkv * D;
    size_t wmax = H > (int)HvDv ? (size_t)H : HvDv;
    if (ldqg > wmax) wmax = ldqg;
    if ((size_t)I > wmax) wmax = I;
    const size_t nmax = (size_t)TDM_MM_XB_ROWS * wmax;   /* the widest input of the most rows a copy holds */
    uint16_t *h = hal(nmax * 2), *a = hal(nmax * 2), *b = hal(nmax * 2);
    float *f = hal(nmax * 4), *w = hal(wmax * 4);
    rand_bf16(a, f, nmax, 3.0f);
    rand_bf16(b, f, nmax, 3.0f);
    rand_bf16(h, f, nmax, 3.0f);
    for (size_t i = 0; i < wmax; i++) w[i] = bfv(frand() * 0.5f);
    uint16_t *dh = dal(nmax * 2), *da = dal(nmax * 2), *db = dal(nmax * 2), *d0 = dal(nmax * 2), *d1 = dal(nmax * 2);
    uint16_t *dxb = dal((size_t)tdm_mm_xb_elems((int64_t)wmax) * 2 + 16);
    float *dw = dal(wmax * 4);
    up(da, a, nmax * 2);
    up(db, b, nmax * 2);
    up(dw, w, wmax * 4);
    /* attention: q, qg, caches at positions 0..ctx-1, a chain as a tree */
    uint16_t *kc = hal((size_t)ctx * kvrow * 2), *dkc = dal((size_t)ctx * kvrow * 2), *dvc = dal((size_t)ctx * kvrow * 2);
    float *kf = hal((size_t)ctx * kvrow * 4);
    rand_bf16(kc, kf, (size_t)ctx * kvrow, 2.0f);
    up(dkc, kc, (size_t)ctx * kvrow * 2);
    rand_bf16(kc, kf, (size_t)ctx * kvrow, 2.0f);
    up(dvc, kc, (size_t)ctx * kvrow * 2);
    float *scratch = dal(tdm_attn_scratch_bytes(TDM_MM_XB_ROWS, Hq, D, ctx));
    int32_t par[R], *dpar = dal(R * 4);
    make_tree(0, par);
    up(dpar, par, R * 4);
    const int Ms[4] = {1, 7, 16, TDM_MM_XB_ROWS};
    for (int j = 0; j < 4; j++) {
        const int M = Ms[j];
        int same;
        /* add_rmsnorm (h = h + y in place: reset before each run) */
        up(dh, h, (size_t)M * H * 2);
        if (tdm_add_rmsnorm(dh, db, H, dw, H, M, s->c.rms_eps, d0, NULL, st) != 0) bail("tdm_add_rmsnorm");
        up(dh, h, (size_t)M * H * 2);
        poison(dxb, (size_t)tdm_mm_xb_elems(H) * 2);
        if (tdm_add_rmsnorm(dh, db, H, dw, H, M, s->c.rms_eps, d1, dxb, st) != 0) bail("tdm_add_rmsnorm (blocked)");
        same = same_bytes(d0, d1, (size_t)M * H * 2);
        blocked_ok(s->name, "add_rmsnorm", M, same, xb_diff(d1, dxb, M, H));
        /* the gated norm */
        if (Hv) {
            if (tdm_gdn_gated_norm(da, db, HvDv, dw, M, Hv, Dv, s->c.rms_eps, d0, NULL, st) != 0 ||
                tdm_gdn_gated_norm(da, db, HvDv, dw, M, Hv, Dv, s->c.rms_eps, d1, dxb, st) != 0)
                bail("tdm_gdn_gated_norm");
            same = same_bytes(d0, d1, (size_t)M * HvDv * 2);
            blocked_ok(s->name, "gdn gated norm", M, same, xb_diff(d1, dxb, M, (int64_t)HvDv));
        }
        /* attention: the chain (rows at P + r) and the chain as a tree */
        for (int tree = 0; tree < 2; tree++) {
            const int32_t *pp = tree ? dpar : NULL;
            if ((tree ? tdm_attn_tree(da, db, ldqg, dkc, dvc, pp, M, Hq, Hkv, D, P, NULL, ctx, scratch, d0, NULL, st)
                      : tdm_attn_decode(da, db, ldqg, dkc, dvc, M, Hq, Hkv, D, P, NULL, ctx, scratch, d0, NULL, st)) != 0 ||
                (tree ? tdm_attn_tree(da, db, ldqg, dkc, dvc, pp, M, Hq, Hkv, D, P, NULL, ctx, scratch, d1, dxb, st)
                      : tdm_attn_decode(da, db, ldqg, dkc, dvc, M, Hq, Hkv, D, P, NULL, ctx, scratch, d1, dxb, st)) != 0)
                bail("attention");
            same = same_bytes(d0, d1, (size_t)M * HqD * 2);
            blocked_ok(s->name, tree ? "attention (a tree)" : "attention", M, same, xb_diff(d1, dxb, M, (int64_t)HqD));
        }
        /* SiLU x up */
        if (I) {
            if (tdm_silu_mul(da, db, I, M, d0, NULL, st) != 0 || tdm_silu_mul(da, db, I, M, d1, dxb, st) != 0) bail("tdm_silu_mul");
            same = same_bytes(d0, d1, (size_t)M * I * 2);
            blocked_ok(s->name, "silu_mul", M, same, xb_diff(d1, dxb, M, I));
        }
    }
    ok(tdm_add_rmsnorm(dh, db, H, dw, H, TDM_MM_XB_ROWS + 1, s->c.rms_eps, d1, dxb, st) != 0,
       "%s: a blocked copy of %d rows refused: %s", s->name, TDM_MM_XB_ROWS + 1, tdm_err());
    tdm_cuda_free(dh); tdm_cuda_free(da); tdm_cuda_free(db); tdm_cuda_free(d0); tdm_cuda_free(d1); tdm_cuda_free(dxb);
    tdm_cuda_free(dw); tdm_cuda_free(dkc); tdm_cuda_free(dvc); tdm_cuda_free(scratch); tdm_cuda_free(dpar);
    free(h); free(a); free(b); free(f); free(w); free(kc); free(kf);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        want_attn = want_rest = 0;
        for (int i = 1; i < argc; i++) {
            if (!strcmp(argv[i], "attn")) want_attn = 1;
            else if (!strcmp(argv[i], "rest")) want_rest = 1;
            else if (!strcmp(argv[i], "moe")) want_moe = 1;
            else if (!strcmp(argv[i], "gdn")) want_gdn = 1;
            else {
                fprintf(stderr, "layers_gpu: unknown group '%s' (attn, rest, moe, gdn)\n", argv[i]);
                return 2;
            }
        }
    }
    if (want_rest) want_moe = want_gdn = 1;   /* moe and gdn are parts of rest */
    if (tdm_cuda_device_count() < 1) skip_all("no CUDA device visible");
    struct tdm_device_info info;
    if (tdm_cuda_device_info(0, &info) != 0 || tdm_stream_create(&st) != 0) bail("device");
    printf("# %s, sm_%d%d\n", info.name, info.sm_major, info.sm_minor);
    add_shape("qwen35-tiny", "tiny", TDM_ARCH_QWEN3_5);
    add_shape("qwen3next-tiny", "tiny", TDM_ARCH_QWEN3_NEXT);
    add_shape("qwen3.8-27b", "qwen3.8-27b", TDM_ARCH_QWEN3_5);
    add_shape("qwen3-next-80b", "qwen3-next-80b", TDM_ARCH_QWEN3_NEXT);
    for (int i = 0; i < nshapes; i++) {
        const struct shape *s = &shapes[i];
        if (want_attn) {
            test_attn(s, 500);
            test_attn_tree(s, 500);
        }
        if (want_moe && s->c.n_experts) test_route(s, 1);
        if (want_rest) test_norm(s);
        if (want_gdn) test_gated_norm(s);
        if (want_rest) {
            test_blocked(s);
            test_qk(s, 3000);
        }
        if (!want_gdn) continue;
        test_conv(s);
        test_recur(s);
        test_recur_fused(s);
        test_gdn_tree(s);
        if (want_rest) test_argmax(s);
        if (s->c.arch == TDM_ARCH_QWEN3_NEXT) test_ungroup(s);
        const int conv_m[] = {1, 5, 100, 4096}, rec_m[] = {1, 63, 64, 65, 300, 4096};
        for (int j = 0; j < 4; j++) test_conv_prefill(s, conv_m[j]);
        for (int j = 0; j < 6; j++) test_recur_chunked(s, rec_m[j]);
    }
    if (want_moe) {
        /* the experts: the tiny fixture's shape in every format (all 8 experts), the 80B's (all 512
         * experts, top-10) in every format at M = 1, 5 and 32 */
        test_moe(&shapes[1], 8, TDM_W_BF16, TDM_DT_F32, 0, R);
        test_moe(&shapes[1], 8, TDM_W_BF16, TDM_DT_F32, 1, R);
        test_moe(&shapes[1], 8, TDM_W_FP8, TDM_DT_F32, 0, R);
        test_moe(&shapes[1], 8, TDM_W_FP8, TDM_DT_BF16, 0, R);
        test_moe(&shapes[1], 8, TDM_W_NVFP4, TDM_DT_F32, 0, R);
        const int moe_m[3] = {1, 5, R};
        for (int j = 0; j < 3; j++) {
            test_moe(&shapes[3], 512, TDM_W_BF16, TDM_DT_F32, 0, moe_m[j]);
            test_moe(&shapes[3], 512, TDM_W_FP8, TDM_DT_BF16, 0, moe_m[j]);
            test_moe(&shapes[3], 512, TDM_W_NVFP4, TDM_DT_F32, 0, moe_m[j]);
        }
        /* the grouped form (prefill chunks of 1, 33, 100 and 512 rows): the tiny fixture's shape and
         * the 80B's (all 512 experts, top-10), in BF16, FP8 and NVFP4 */
        test_moe_grouped(&shapes[1], 8, TDM_W_BF16, TDM_DT_F32);
        test_moe_grouped(&shapes[1], 8, TDM_W_FP8, TDM_DT_F32);
        test_moe_grouped(&shapes[1], 8, TDM_W_NVFP4, TDM_DT_F32);
        test_moe_grouped(&shapes[3], 512, TDM_W_BF16, TDM_DT_F32);
        test_moe_grouped(&shapes[3], 512, TDM_W_FP8, TDM_DT_BF16);
        test_moe_grouped(&shapes[3], 512, TDM_W_NVFP4, TDM_DT_F32);
        test_route(&shapes[3], 0);
    }
    if (want_rest) test_qk(&shapes[0], 250000);  /* large rotary angles */
    if (want_attn) {
        test_attn(&shapes[0], 0);     /* the first tokens */
        test_attn_tree(&shapes[0], 0);
        test_attn(&shapes[2], 3000);  /* 12 chunks */
        /* prefill attention: the 27B's and the 80B's heads, D 128, the tiny fixtures' D 64; chunks
         * at position 0 and past it, shorter than a query block, across block and tile edges */
        const struct { const char *name; int Hq, Hkv, D; } pf[4] = {
            {"qwen3.8-27b", 24, 4, 256}, {"qwen3-next-80b", 16, 2, 256}, {"D 128", 8, 2, 128}, {"qwen35-tiny", 6, 2, 64}};
        const int pf_m[4] = {1, 33, 100, 300}, pf_p[3] = {0, 37, 500};
        for (int i = 0; i < 4; i++)
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 3; b++)
                    test_attn_prefill(pf[i].name, pf[i].Hq, pf[i].Hkv, pf[i].D, pf_m[a], pf_p[b]);
        test_attn_prefill_args();
    }
    for (int i = 0; i < nshapes; i++) tdm_config_free(&shapes[i].c);
    tdm_stream_destroy(st);
    return done_testing();
}
