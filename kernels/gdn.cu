// gdn.cu — the Gated DeltaNet layer's own kernels (layers.h): the causal conv with its rolling
// state, and the gates + L2 norms + delta-rule recurrence over the FP32 state. The projections
// are matrix products (matmul.h); the gated norm is in norm.cu.
#include "layers.h"
#include "layers_dev.cuh"
#include "cuda_check.h"
#include "pdl.cuh"
#include <cooperative_groups.h>

using namespace tdm_ly;

namespace {

constexpr int CONV_THREADS = 256;
constexpr int CONV_TB = 16;   // tokens a block of the prefill form

// One output of the conv from its window (win[K - 1] the token's own input): tdm_ref_gdn_conv's
// sum in tap order and its roundings, bf16(silu(bf16(acc))). Every conv kernel ends a token here.
template <int K>
__device__ __forceinline__ uint16_t conv_out(const float (&wk)[K], const float (&win)[K])
{
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; j++) acc = __fadd_rn(acc, __fmul_rn(wk[j], win[j]));
    return f2bf(silu_ref(bfr(acc)));
}

// Input s of (state ++ x) for channel c: x's row s, or for s < 0 the state's row K - 1 + s (the conv
// kernels' windows and the advanced state are made of these).
template <int K>
__device__ __forceinline__ uint16_t conv_input(const uint16_t *x, int64_t ldx, const uint16_t *state, int C, int c, int s)
{
    return s >= 0 ? x[(size_t)s * ldx + c] : state[(size_t)(K - 1 + s) * C + c];
}

// Channel c's state after M tokens into out: row j becomes input M - (K - 1) + j of (state ++ x).
// In place (out == state) too: rows ascend, so row j + M (j + M > j) is read before it is written.
template <int K>
__device__ __forceinline__ void conv_write_state(const uint16_t *x, int64_t ldx, const uint16_t *state, uint16_t *out,
                                                 int M, int C, int c)
{
#pragma unroll
    for (int j = 0; j < K - 1; j++) out[(size_t)j * C + c] = conv_input<K>(x, ldx, state, C, c, M - (K - 1) + j);
}

// The decode conv (tdm_gdn_conv, _pending, _verify): block (CX channels, TY token lanes), thread
// (channel c, lane ty) the tokens ty, ty + TY, ... < M, each from its own window — tap j the input of
// token t - (K - 1) + j of (state ++ x), the window a walk over the tokens in order has at token t,
// since its shifts only move values — then conv_out: exactly tdm_ref_gdn_conv's arithmetic. The M
// tokens of a channel are in one block, so after a barrier (every read of the state is done) lane 0
// writes the channel's advanced window in place (conv_write_state), unless state_out is NULL
// (a verify: the round's entry state stays for the commit; else the same buffer as state).
// tdm_gdn_conv_pending: d_M (device) holds the token count, at most M; and the grid's threads first
// copy gcount values gsrc -> gdst (the pending rows' gates, kept for the recurrence).
// (Before, one thread a channel walked the M tokens in order: a 16-row verify's two convs took
// 10.7 us a layer on the H200 against 8.0 side by side; bench/NOTES.md.)
// TDM_GDN_CONV_RELEASE (default 1): the decode conv lets the programmatic kernel after it start
// (pdl.cuh) at its own start: a round's pending conv (tdm_gdn_conv_pending, a plain launch) is followed
// by in_proj_qkv, which may then load its first weights beside it (the decode and verify forms are
// followed by the plain recurrence, on which release() has no effect). 0: released at completion. A
// speed knob only (release() changes no value): on a 16-layer NVFP4 27B, four alternated passes ran
// 16-row chain rounds 0.6 % faster (4 of 4), 1-5-row ones within +-0.4 % (H100, bench/NOTES.md).
#ifndef TDM_GDN_CONV_RELEASE
#define TDM_GDN_CONV_RELEASE 1
#endif
template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv_kernel(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state, uint16_t *state_out, int M,
            int C, uint16_t *y, const int32_t *d_M, const uint16_t *gsrc, uint16_t *gdst, int64_t gcount)
{
    if (TDM_GDN_CONV_RELEASE) tdm_pdl::release();
    const int ty = threadIdx.y, TY = blockDim.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t i = (int64_t)blockIdx.x * CONV_THREADS + ty * blockDim.x + threadIdx.x; i < gcount;
         i += (int64_t)gridDim.x * CONV_THREADS)
        gdst[i] = gsrc[i];
    if (d_M) M = min(max(*d_M, 0), M);
    if (M == 0) return;   // block-uniform
    if (c < C) {
        float wk[K];
#pragma unroll
        for (int j = 0; j < K; j++) wk[j] = w[(size_t)c * K + j];
        for (int t = ty; t < M; t += TY) {
            float win[K];
#pragma unroll
            for (int j = 0; j < K; j++) win[j] = bf2f(conv_input<K>(x, ldx, state, C, c, t - (K - 1) + j));
            y[(size_t)t * C + c] = conv_out<K>(wk, win);
        }
    }
    if (!state_out) return;   // block-uniform
    __syncthreads();
    if (c < C && ty == 0) conv_write_state<K>(x, ldx, state, state_out, M, C, c);
}

// The prefill form: thread (channel c, block of CONV_TB tokens), the block's first window read from
// x (or, before token 0, from the state) — conv_kernel's window of that token — then shifted a token
// at a time (the shifts only move values), conv_out per token. The state is left to
// conv_state_kernel, launched after this one: other blocks of the channel still read it here.

template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv_prefill_kernel(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state, int M, int C, uint16_t *y)
{
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= C) return;
    const int t0 = blockIdx.y * CONV_TB, t1 = min(M, t0 + CONV_TB);
    float win[K], wk[K];
#pragma unroll
    for (int j = 0; j < K; j++) wk[j] = w[(size_t)c * K + j];
#pragma unroll
    for (int j = 0; j < K - 1; j++) win[j] = bf2f(conv_input<K>(x, ldx, state, C, c, t0 - (K - 1) + j));   // tap j at t0
    for (int t = t0; t < t1; t++) {
        win[K - 1] = bf2f(x[(size_t)t * ldx + c]);
        y[(size_t)t * C + c] = conv_out<K>(wk, win);
#pragma unroll
        for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
    }
}

// The state after M tokens, in place, as conv_kernel leaves it (conv_write_state).
template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv_state_kernel(const uint16_t *x, int64_t ldx, uint16_t *state, int M, int C)
{
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= C) return;
    conv_write_state<K>(x, ldx, state, state, M, C, c);
}

// The tree form (layers.h, Trees): thread (channel c, node t = the grid row), t's window built along its path —
// tap j holds the input of t's ancestor at depth s = depth(t) - (K - 1) + j, or for s < 0 the
// committed state's row K - 1 + s — which is conv_kernel's window of the last token of that path fed
// as a chain. The sum and roundings are conv_out's.
template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv_tree_kernel(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state, const int32_t *parent, int M,
                 int C, uint16_t *y)
{
    __shared__ int32_t par[TDM_TREE_MAX];
    if (threadIdx.x < M) par[threadIdx.x] = parent[threadIdx.x];
    __syncthreads();
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= C) return;
    float wk[K];
#pragma unroll
    for (int j = 0; j < K; j++) wk[j] = w[(size_t)c * K + j];
    const int t = blockIdx.y;   // one node a grid row: the nodes' loads in flight together
    const int d = tree_depth(par, t);
    float win[K];
    int at = t;  // the node whose input tap j takes, walking up from t
#pragma unroll
    for (int j = K - 1; j >= 0; j--) {
        const int s = d - (K - 1) + j;
        if (s >= 0) {
            win[j] = bf2f(x[(size_t)at * ldx + c]);
            at = par[at];
        } else {
            win[j] = bf2f(state[(size_t)(K - 1 + s) * C + c]);
        }
    }
    y[(size_t)t * C + c] = conv_out<K>(wk, win);
}

constexpr int UNGROUP_THREADS = 256;

// Block (t, g): key-head group g of token t's grouped qkvz [Hk][2 Dk + 2 r Dv] and ba [Hk][2 r] copied
// into conv order (tdm_ref_gdn_ungroup). One thread per source value; copies only. (A block a token
// took ~13 us at one token of the 80B's shapes on an H100: one SM.)
__global__ void __launch_bounds__(UNGROUP_THREADS)
ungroup_kernel(const uint16_t *qkvz, int64_t ldqkvz, const uint16_t *ba, int64_t ldba, int Hk, int Hv, int Dk, int Dv,
               uint16_t *mixed, uint16_t *z, uint16_t *b, uint16_t *a)
{
    const int t = blockIdx.x, g = blockIdx.y, r = Hv / Hk, rDv = r * Dv, Wg = 2 * Dk + 2 * rDv;
    const int C = 2 * Hk * Dk + Hv * Dv;
    const uint16_t *src = qkvz + (size_t)t * ldqkvz + (size_t)g * Wg;
    uint16_t *mt = mixed + (size_t)t * C, *zt = z + (size_t)t * Hv * Dv;
    for (int o = threadIdx.x; o < Wg; o += UNGROUP_THREADS) {
        uint16_t *dst;
        if (o < Dk) dst = mt + g * Dk + o;
        else if (o < 2 * Dk) dst = mt + Hk * Dk + g * Dk + (o - Dk);
        else if (o < 2 * Dk + rDv) dst = mt + 2 * Hk * Dk + g * rDv + (o - 2 * Dk);
        else dst = zt + g * rDv + (o - 2 * Dk - rDv);
        *dst = src[o];
    }
    const uint16_t *bsrc = ba + (size_t)t * ldba + (size_t)g * 2 * r;
    for (int o = threadIdx.x; o < 2 * r; o += UNGROUP_THREADS) {
        if (o < r) b[(size_t)t * Hv + g * r + o] = bsrc[o];
        else a[(size_t)t * Hv + g * r + (o - r)] = bsrc[o];
    }
}

constexpr int REC_WARPS = 8;  // the Dk rows of a column split into 8 slices of Dk/8

// Tokens a recurrence block prepares at once (recur_prep): one a warp, three when Dk is 256, so that
// a batch's factors, the o copy (RecSmem) and a tree's factor store stay within 48 KB of shared memory.
template <int DK>
__host__ __device__ constexpr int rec_tb() { return DK <= 128 ? REC_WARPS : 3; }

// Rows whose o a block also keeps in shared memory for the fused gated norm (gated_norm_tail): the
// head's other blocks read them from there; rows past it from o.
constexpr int REC_OSM_ROWS = 32;

// The 8 warps' partial sums of column lane, added in warp order (the recurrence's kv and o sums).
__device__ __forceinline__ float sum_in_warp_order(const float (&red)[REC_WARPS][32], int lane)
{
    float v = red[0][lane];
#pragma unroll
    for (int q = 1; q < REC_WARPS; q++) v = __fadd_rn(v, red[q][lane]);
    return v;
}

// A recurrence block's shared memory: for each token of a batch (recur_prep) its normed and scaled
// q, its normed k, v of the block's 32 columns, beta and the decay; the 8 warps' partial sums
// (two sets, by token parity: a token's o sum is read while the next token's kv sum is written)
// and u for its 32 columns.
template <int DK>
struct RecSmem {
    float qn[rec_tb<DK>()][DK], kn[rec_tb<DK>()][DK], vs[rec_tb<DK>()][32], beta[rec_tb<DK>()], decay[rec_tb<DK>()];
    float red[2][REC_WARPS][32], us[32];
    uint16_t osm[REC_OSM_ROWS][32];   // the block's o columns of rows 0..31 (the fused gated norm)
};

// The state-free part of n <= rec_tb tokens (rows ct = qkv + w C, bt = b + w ldb, at = a + w lda of
// token w), warp w the token w, tdm_ref_gdn_token's steps in its order:
//   q, k of key head kh: L2 norms in tdm_dot's order (warp_dot_ref), q *= 1/|q| * 1/sqrt(Dk),
//   k *= 1/|k|; beta = bf16(sigmoid(b)); g = -exp(A_log) softplus(a + dt_bias), decay = exp(g);
//   v of the block's columns.
// None of it depends on the state, so a batch's tokens are prepared side by side and only
// recur_apply runs token after token (a 16-row verify paid these loads and sums 16 times in series:
// ~3 us a token on the H200). The same operations on the same values as one token alone: the
// same bits. fk, fdec: a tree's factor store for these tokens (normed k, decay), or NULL. Starts
// with a barrier (the previous batch's factors are read until then) and ends with one.
//
// TDM_GDN_PREP_EARLY (0 or 1; default 1): the head's -exp(A_log) and dt_bias come in as values the
// kernel took at its start (gates_pre: a DRAM round trip each step that lane 0 made after the norms,
// off the path), and a batch of at most REC_WARPS / 2 tokens has token w's gates (beta, decay)
// computed by the idle warp w + REC_WARPS / 2 beside warp w's norms instead of after them. The same
// operations on the same values, so the same bits; 0: both where they were (warp w, after the norms,
// the parameters loaded there). Measured on an H100 (bench/NOTES.md, builds alternated 3 times): the
// 16-layer 27B's one-row step 2.138 -> 2.128 ms, the 4-layer 80B's 0.352 -> 0.349; 16-32 rows the same.
#ifndef TDM_GDN_PREP_EARLY
#define TDM_GDN_PREP_EARLY 1
#endif
struct GatesPre {   // -exp(A_log[h]) and dt_bias[h], taken at the kernel's start (TDM_GDN_PREP_EARLY)
    float neg_a, dt_bias;
};
__device__ __forceinline__ GatesPre gates_pre(const float *A_log, const float *dt_bias, int h)
{
    GatesPre g = {0.0f, 0.0f};
    if (TDM_GDN_PREP_EARLY) g.neg_a = -expf(A_log[h]), g.dt_bias = dt_bias[h];
    return g;
}
template <int ROWS>
__device__ __forceinline__ void recur_prep(RecSmem<ROWS * REC_WARPS> &sm, const uint16_t *qkv, int64_t C,
                                           const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                           const float *A_log, const float *dt_bias, GatesPre gp, int h, int kh,
                                           int Hk, int Dv, float qscale, int n, float (*fk)[ROWS * REC_WARPS],
                                           float *fdec)
{
    constexpr int Dk = ROWS * REC_WARPS, HALF = REC_WARPS / 2;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    // the token whose gates this warp computes (none where out of [0, n))
    const int gw = TDM_GDN_PREP_EARLY && n <= HALF ? w - HALF : w;
    __syncthreads();
    float bt = 0.0f, at = 0.0f;
    if (gw >= 0 && gw < n) bt = bf2f(b[(size_t)gw * ldb + h]), at = bf2f(a[(size_t)gw * lda + h]);
    if (w < n) {
        const uint16_t *ct = qkv + (size_t)w * C;
        float *qs = sm.qn[w], *ks = sm.kn[w];
        for (int i = lane; i < Dk; i += 32) {
            qs[i] = bf2f(ct[(size_t)kh * Dk + i]);
            ks[i] = bf2f(ct[(size_t)(Hk + kh) * Dk + i]);
        }
        sm.vs[w][lane] = bf2f(ct[(size_t)2 * Hk * Dk + (size_t)h * Dv + blockIdx.y * 32 + lane]);
        __syncwarp();
        const float dq = warp_dot_ref(qs, qs, Dk), dk = warp_dot_ref(ks, ks, Dk);   // every lane: lane 0's sum
        const float invq = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(dq, 1e-6f)));
        const float invk = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(dk, 1e-6f)));
        __syncwarp();   // the sums have read qs and ks
        for (int i = lane; i < Dk; i += 32) {
            ks[i] = __fmul_rn(ks[i], invk);
            qs[i] = __fmul_rn(__fmul_rn(qs[i], invq), qscale);
            if (fk) fk[w][i] = ks[i];
        }
    }
    if (gw >= 0 && gw < n && lane == 0) {
        sm.beta[gw] = bfr(sigmoid_ref(bt));
        const float neg_a = TDM_GDN_PREP_EARLY ? gp.neg_a : -expf(A_log[h]);
        const float gt = __fmul_rn(neg_a, softplus_ref(__fadd_rn(at, TDM_GDN_PREP_EARLY ? gp.dt_bias : dt_bias[h])));
        sm.decay[gw] = expf(gt);
        if (fdec) fdec[gw] = sm.decay[gw];
    }
    __syncthreads();
}

// A term of the token step's two sums over a thread's rows (kv = S^T k, o = S^T q): p + a b as one
// fused multiply-add (the sums already differ from the reference's serial order; this is one more
// rounding fewer a term, the same in every form). Measured on the H200 against a product then an
// add (bench/NOTES.md, call 76): a 16-layer 27B's recurrence 311.2 -> 300.6 us a 16-row verify,
// 91.7 -> 90.8 a step.
__device__ __forceinline__ float rec_madd(float a, float b, float p) { return __fmaf_rn(a, b, p); }

// Token w of the prepared batch on the block's state slice s (thread: column j, rows i0 .. i0 +
// ROWS - 1), tdm_ref_gdn_token's state steps in its order, elementwise with its operations:
//   S *= decay; kv = S^T k: per thread a serial sum over its rows (rec_madd), then the 8 warps'
//   sums in warp order; u = (v - kv) beta; S += k u^T; o = S^T q (as kv) ->bf16.
// par: the token's parity (which set of partial sums it uses). o_t: its output row [Hv][Dv], or
// NULL (a pending row of a deferred commit, whose output a verify already gave: the o sum is
// skipped, the state arithmetic is the same). fu_t: where a tree node keeps its u [32], or NULL.
// Every kernel that advances a state (a forward, a verify's pending rows, a tree's nodes) runs its
// tokens through recur_prep and this one function: a pending row applied at the next pass's load
// is the bits of the commit that replayed it.
template <int ROWS>
__device__ __forceinline__ void recur_apply(float (&s)[ROWS], RecSmem<ROWS * REC_WARPS> &sm, int w, int par, int h,
                                            int Dv, uint16_t *o_t, float *fu_t, uint16_t *osm_t)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.y * 32 + lane, i0 = warp * ROWS;
    const float decay = sm.decay[w], beta = sm.beta[w];
    float kr[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) kr[r] = sm.kn[w][i0 + r];
    float p = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        s[r] = __fmul_rn(s[r], decay);
        p = rec_madd(s[r], kr[r], p);
    }
    sm.red[par][warp][lane] = p;
    __syncthreads();
    if (warp == 0) {
        const float kv = sum_in_warp_order(sm.red[par], lane);
        sm.us[lane] = __fmul_rn(__fsub_rn(sm.vs[w][lane], kv), beta);
        if (fu_t) fu_t[lane] = sm.us[lane];
    }
    __syncthreads();
    const float u = sm.us[lane];   // read before this thread reaches the next token's first barrier
    if (!o_t) {  // block-uniform: a pending row's state update alone
#pragma unroll
        for (int r = 0; r < ROWS; r++) s[r] = __fadd_rn(s[r], __fmul_rn(kr[r], u));
        return;
    }
    p = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        s[r] = __fadd_rn(s[r], __fmul_rn(kr[r], u));
        p = rec_madd(s[r], sm.qn[w][i0 + r], p);
    }
    // this parity's set again (warp 0 read the kv sums before the barrier above); warp 0 reads the
    // o sums after the barrier below, while the next token writes the other set, and the token
    // after that writes this set only past barriers that warp 0 reaches after its read: no
    // closing barrier
    sm.red[par][warp][lane] = p;
    __syncthreads();
    if (warp == 0) {
        const uint16_t v = f2bf(sum_in_warp_order(sm.red[par], lane));
        o_t[(size_t)h * Dv + j] = v;
        if (osm_t) osm_t[lane] = v;
    }
}

// TANDEM_GDN_FUSED_NORM (layers.h: struct tdm_gdn_gnorm): value head h's Dv/32 blocks are one
// cluster (recur_go). Once every block of it has written its 32 columns of o for every row (a
// cluster barrier), each block runs the gated norm of (row, h) for its own 32 columns of the M rows,
// warp w the rows w, w + nw, ...: the row's whole o gathered into the warp's scratch (the block's q
// scratch, free now) from the blocks' shared copies (rows below REC_OSM_ROWS) or from o, then
// gated_norm_head over the row and its output for the block's columns, as gated_norm_kernel runs it
// over all of them: the same bits. A second cluster barrier keeps every copy alive until the last
// read. (Before, the last block of a head to finish did the head's norm after a fence and an atomic
// counter: the fences, the counter's round trip and the reads of o back from L2 were ~4 us of a
// one-row step's 9.5 us a layer on the H200; bench/NOTES.md.)
//
// TDM_GDN_TAIL_EARLY (0 or 1; default 1): a warp's first row's z and norm weight at its column come
// from registers loaded at the kernel's start (gated_norm_early; the inputs are complete when the
// recurrence starts: it is not launched programmatically), silu(z) is taken before the first
// cluster barrier, and a row's o columns are gathered in one batch of loads: the step's last DRAM
// or L2 round trip before the norm's sum goes. The same values, so the same bits; 0: each loaded
// where it is used, as gated_norm_kernel does.
#ifndef TDM_GDN_TAIL_EARLY
#define TDM_GDN_TAIL_EARLY 1
#endif
// The warps that run the tail's rows (row r by warp r % nw): >= 1 (the launcher's check of Dv).
template <int DK>
__device__ __forceinline__ int gated_norm_warps(int Dv)
{
    return min(REC_WARPS, (int)(sizeof(RecSmem<DK>::qn) / sizeof(float)) / Dv);
}
// The raw factors of the warp's first row (row warp) at the lane's column, where the warp has one
// (has: the warp runs a row and the early form is on).
struct GnormEarly {
    bool has;
    uint16_t z;
    float w;
};
template <int DK>
__device__ __forceinline__ GnormEarly gated_norm_early(const tdm_gdn_gnorm &gn, int M, int Hv, int Dv, int h)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = 32 * (int)blockIdx.y + lane;
    GnormEarly e = {TDM_GDN_TAIL_EARLY && warp < M && warp < gated_norm_warps<DK>(Dv), 0, 0.0f};
    if (e.has && gn.y) {
        e.z = gn.z[(size_t)warp * gn.ldz + (size_t)h * Dv + j];
        e.w = gn.w[j];
    }
    return e;
}
template <int DK>
__device__ __forceinline__ void gated_norm_tail(RecSmem<DK> &sm, const tdm_gdn_gnorm &gn, const uint16_t *o, int M,
                                                int Hv, int Dv, int h, GnormEarly early)
{
    namespace cg = cooperative_groups;
    const cg::cluster_group cl = cg::this_cluster();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = gated_norm_warps<DK>(Dv);
    const float zs_pre = early.has ? silu_ref(bf2f(early.z)) : 0.0f;
    if (M > REC_OSM_ROWS) __threadfence();   // rows read back from o by the head's other blocks
    cl.sync();
    if (warp < nw) {
        float *xs = &sm.qn[0][0] + (size_t)warp * Dv;
        for (int r = warp; r < M; r += nw) {
            const uint16_t *orow = o + ((size_t)r * Hv + h) * Dv;
            if (TDM_GDN_TAIL_EARLY) {   // every load of the row, then every store (Dv <= 8 * 32)
                uint16_t v[TDM_GDN_FUSED_NORM_DV_MAX / 32];
#pragma unroll
                for (int q = 0; q < TDM_GDN_FUSED_NORM_DV_MAX / 32; q++)
                    if (32 * q < Dv)
                        v[q] = r < REC_OSM_ROWS ? cl.map_shared_rank(&sm.osm[r][0], q)[lane] : __ldcg(orow + 32 * q + lane);
#pragma unroll
                for (int q = 0; q < TDM_GDN_FUSED_NORM_DV_MAX / 32; q++)
                    if (32 * q < Dv) xs[32 * q + lane] = bf2f(v[q]);
            } else {
                for (int c = lane; c < Dv; c += 32)
                    xs[c] = bf2f(r < REC_OSM_ROWS ? cl.map_shared_rank(&sm.osm[r][0], c / 32)[c % 32] : __ldcg(orow + c));
            }
            const bool first = early.has && r == warp;
            gated_norm_head(xs, gn.z + (size_t)r * gn.ldz + (size_t)h * Dv, gn.w, Dv, gn.eps,
                            gn.y + ((size_t)r * Hv + h) * Dv, gn.yb, r, h, Hv, lane, 32 * (int)blockIdx.y, 32, first,
                            zs_pre, early.w);
        }
    }
    cl.sync();
}

// One block per (value head h, 32 state columns j). Thread (warp w, lane l) holds S[i][j] for its
// column j = 32 blockIdx.y + l and the rows i = w ROWS .. w ROWS + ROWS - 1 in registers for all
// M tokens, each run through recur_prep and recur_apply. Only the two sums over Dk differ from the
// CPU's serial order (their order and their fused multiply-adds). No value depends on M: the tokens
// run in sequence and a token's arithmetic is the same in every call. The state is read from S and, unless S_out is NULL, written to S_out after the last
// token (the same buffer for a forward; each thread reads and writes only its own elements).
//
// PENDING (pend.d_n not NULL; layers.h, Deferred commit): before its own tokens the block runs
// the n = *pend.d_n pending rows (pend.qkv, pend.b, pend.a) through recur_prep and recur_apply on the state it
// just loaded, with no output. A forward then goes on and writes the state once at the end; a
// verify or tree (S_out NULL) writes the state after the pending rows to S_pend (S itself) when
// n > 0 — its only write — and then runs its own tokens read-only from there.
//
// TREE (parent not NULL, S_out NULL; layers.h, Trees): token t is node t, and s must hold its
// parent's state when the step starts. The block keeps every node's factors in shared memory (fk:
// the normed k, fu: u for its 32 columns, fdec: the decay), each computed by recur_prep and
// recur_apply as above.
// When the parent is not the node whose state s holds (cur), s is reloaded (from S, or from S_pend
// when pending rows were written there: the same elements this thread wrote) and the parent's
// path is replayed root first with the step's own two state operations, s = s decay, then
// s = s + k u: the values s had after each of those steps, so the node's step then runs on its
// parent's state exactly as the chain kernel runs it on that path. Ancestors come as a bit mask:
// a node's ancestors have smaller indices, so ascending bits are the path root first.
// sm_121a: without a minimum of blocks a SM ptxas held the 16-row slice at 64 registers and spilled
// (with the fused multiply-adds); 2 a SM (128 registers at most) spills nothing. sm_90: none given.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define REC_MIN_BLOCKS 2
#else
#define REC_MIN_BLOCKS 0
#endif
template <int ROWS, bool TREE>
__global__ void __launch_bounds__(REC_WARPS * 32, REC_MIN_BLOCKS)
recur_kernel(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda, const float *A_log,
             const float *dt_bias, const float *S, float *S_out, const int32_t *parent, int M, int Hk, int Hv, int Dv,
             uint16_t *o, tdm_gdn_pend pend, float *S_pend, tdm_gdn_gnorm gn)
{
    constexpr int Dk = ROWS * REC_WARPS;
    constexpr int NT = TREE ? TDM_TREE_MAX : 1;  // the factor store, only for trees
    __shared__ RecSmem<Dk> sm;
    __shared__ float fk[NT][TREE ? Dk : 1], fu[NT][32], fdec[NT];
    __shared__ int32_t par[NT];
    tdm_pdl::release();   // the gated norm may start (pdl.cuh)
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
    const int j = blockIdx.y * 32 + lane, i0 = warp * ROWS;
    const int kh = h / (Hv / Hk), C = 2 * Hk * Dk + Hv * Dv;
    const float *Sh = S + (size_t)h * Dk * Dv;
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) s[r] = Sh[(size_t)(i0 + r) * Dv + j];
    const GnormEarly gearly = gated_norm_early<Dk>(gn, M, Hv, Dv, h);
    const GatesPre gp = gates_pre(A_log, dt_bias, h);
    const float qscale = __fdiv_rn(1.0f, __fsqrt_rn((float)Dk));
    const int np = pend.d_n ? min(max(*pend.d_n, 0), TDM_GDN_PEND_MAX) : 0;  // block-uniform
    constexpr int TB = rec_tb<Dk>();
    int k = 0;  // tokens applied so far: the parity of the partial sums' set
    for (int t0 = 0; t0 < np; t0 += TB) {
        const int n = min(TB, np - t0);
        recur_prep<ROWS>(sm, pend.qkv + (size_t)t0 * C, C, pend.b + (size_t)t0 * pend.ldb, pend.ldb,
                         pend.a + (size_t)t0 * pend.lda, pend.lda, A_log, dt_bias, gp, h, kh, Hk, Dv, qscale, n,
                         nullptr, nullptr);
        for (int w = 0; w < n; w++, k++) recur_apply<ROWS>(s, sm, w, k & 1, h, Dv, nullptr, nullptr, nullptr);
    }
    if (np > 0 && S_pend) {
        float *Sp = S_pend + (size_t)h * Dk * Dv;
#pragma unroll
        for (int r = 0; r < ROWS; r++) Sp[(size_t)(i0 + r) * Dv + j] = s[r];
        Sh = Sp;  // a tree's reloads read the state after the pending rows
    }
    int cur = -1;  // TREE: the node whose state s holds (-1: the entry state)
    if constexpr (TREE) {
        if (tid < M) par[tid] = parent[tid];
        __syncthreads();
    }
    for (int t0 = 0; t0 < M; t0 += TB) {
        const int n = min(TB, M - t0);
        float(*fk_t)[Dk] = nullptr;  // TREE: the batch's slots in the factor store
        float *fdec_t = nullptr;
        if constexpr (TREE) fk_t = &fk[t0], fdec_t = &fdec[t0];
        recur_prep<ROWS>(sm, qkv + (size_t)t0 * C, C, b + (size_t)t0 * ldb, ldb, a + (size_t)t0 * lda, lda, A_log,
                         dt_bias, gp, h, kh, Hk, Dv, qscale, n, fk_t, fdec_t);
        for (int w = 0; w < n; w++, k++) {
            const int t = t0 + w;
            if constexpr (TREE) {
                const int p = par[t];
                if (p != cur) {  // block-uniform
#pragma unroll
                    for (int r = 0; r < ROWS; r++) s[r] = Sh[(size_t)(i0 + r) * Dv + j];
                    uint32_t anc = 0;
                    for (int x = p, m = 0; x >= 0 && m < TDM_TREE_MAX; x = par[x], m++) anc |= 1u << x;
                    for (int x = 0; x <= p; x++) {
                        if (!((anc >> x) & 1u)) continue;
                        const float dec = fdec[x], u = fu[x][lane];
#pragma unroll
                        for (int r = 0; r < ROWS; r++) s[r] = __fmul_rn(s[r], dec);
#pragma unroll
                        for (int r = 0; r < ROWS; r++) s[r] = __fadd_rn(s[r], __fmul_rn(fk[x][i0 + r], u));
                    }
                }
                cur = t;
            }
            recur_apply<ROWS>(s, sm, w, k & 1, h, Dv, o + (size_t)t * Hv * Dv, TREE ? fu[t] : nullptr,
                              gn.y && t < REC_OSM_ROWS ? sm.osm[t] : nullptr);
        }
    }
    if (!TREE && S_out) {  // (a verify: the state stays as loaded, or as the pending rows left it)
        float *So = S_out + (size_t)h * Dk * Dv;
#pragma unroll
        for (int r = 0; r < ROWS; r++) So[(size_t)(i0 + r) * Dv + j] = s[r];
    }
    if (gn.y && M > 0) gated_norm_tail<Dk>(sm, gn, o, M, Hv, Dv, h, gearly);
}

// ---- the chunked delta rule (tdm_gdn_recur_chunked; layers.h has the equations) ----------------

constexpr int CH = 64;           // tokens per chunk
constexpr int CK_THREADS = 256;
constexpr int CK_DVS = 32;       // state columns per block of the scan
constexpr int CK_LT = CH + 1;    // row stride of the chunk matrices in shared memory
// per (value head, chunk) in the scratch: T [CH][CH], P [CH][CH], then per token beta, exp(G_t),
// exp(G_last - G_t), 1/|q|, 1/|k|
constexpr int CK_T = 0, CK_P = CH * CH, CK_BETA = 2 * CH * CH, CK_EG = CK_BETA + CH, CK_EGE = CK_EG + CH,
              CK_INVQ = CK_EGE + CH, CK_INVK = CK_INVQ + CH, CK_SCR = CK_INVK + CH;

__device__ __forceinline__ void fma4(float4 &acc, float a, const float4 &b)
{
    acc.x = fmaf(a, b.x, acc.x);
    acc.y = fmaf(a, b.y, acc.y);
    acc.z = fmaf(a, b.z, acc.z);
    acc.w = fmaf(a, b.w, acc.w);
}
__device__ __forceinline__ float dot4(const float4 &a, const float4 &b, float acc)
{
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}
// four BF16 values (8 bytes, aligned) as floats
__device__ __forceinline__ float4 ld_bf16x4(const uint16_t *p)
{
    const uint2 r = *reinterpret_cast<const uint2 *>(p);
    return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u), __uint_as_float(r.y << 16),
                       __uint_as_float(r.y & 0xffff0000u));
}

template <int DK>
__host__ __device__ constexpr size_t prep_smem() { return (size_t)2 * CH * (DK + 4) * 4 + (size_t)4 * CH * 4 + (size_t)CH * 8; }
// the scan's q buffer also holds T and P after phase 1
template <int DK>
__host__ __device__ constexpr int scan_qb() { return CH * (DK + 4) > 2 * CH * CK_LT ? CH * (DK + 4) : 2 * CH * CK_LT; }
template <int DK>
__host__ __device__ constexpr size_t scan_smem() { return ((size_t)DK * CK_DVS + CH * (DK + 4) + scan_qb<DK>() + 2 * CH * CK_DVS + 3 * CH) * 4; }

// Pass 1, one block per (chunk, value head h), independent of the state: the chunk's normalised k
// and q (tdm_ref_gdn_token's arithmetic: the norms in tdm_dot's order, q * (1/|q|) * Dk^-1/2), the
// gates (beta = bf16(sigmoid(b)), g = -exp(A_log) softplus(a + dt_bias)), G = the running sum of g
// in double, and from them
//   L[t][s] = beta_t exp(G_t - G_s) (k_t . k_s)     s < t  (0 elsewhere)
//   P[t][s] = exp(G_t - G_s) (q_t . k_s)            s <= t (0 elsewhere)
//   T = (I + L)^-1 by forward substitution, a column a thread: T[t][s] = -L[t][s] - sum_{s<m<t} L[t][m] T[m][s]
// T, P and the per-token factors go to the scratch. Tokens past the sequence (t >= n) are zero
// rows: their L, P, beta and factors are 0, their T rows the identity's.
template <int DK>
__global__ void __launch_bounds__(CK_THREADS)
chunk_prep_kernel(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda, const float *A_log,
                  const float *dt_bias, int M, int Hk, int Hv, int Dv, float *scratch)
{
    constexpr int LD = DK + 4;
    extern __shared__ float4 smem4[];
    float *kn = reinterpret_cast<float *>(smem4), *qn = kn + CH * LD;
    float *sbeta = qn + CH * LD, *sg = sbeta + CH, *sinvq = sg + CH, *sinvk = sinvq + CH;
    double *sG = reinterpret_cast<double *>(sinvk + CH);
    float *Lm = qn, *Tm = kn;  // after the products: L over q, T over k
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = c * CH, n = min(CH, M - t0), kh = h / (Hv / Hk);
    const int64_t Cq = 2LL * Hk * DK + (int64_t)Hv * Dv;
    float *out = scratch + ((size_t)h * gridDim.x + c) * CK_SCR;

    // the chunk's raw q and k (every load issued before the stores), the gates
#pragma unroll
    for (int it = 0; it < CH * DK / 4 / CK_THREADS; it++) {
        const int i = tid + it * CK_THREADS, t = i / (DK / 4), d = (i % (DK / 4)) * 4;
        float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), kv = qv;
        if (t < n) {
            const uint16_t *row = qkv + (size_t)(t0 + t) * Cq;
            qv = ld_bf16x4(row + (size_t)kh * DK + d);
            kv = ld_bf16x4(row + (size_t)(Hk + kh) * DK + d);
        }
        *reinterpret_cast<float4 *>(qn + t * LD + d) = qv;
        *reinterpret_cast<float4 *>(kn + t * LD + d) = kv;
    }
    if (tid < CH) {
        float beta = 0.0f, g = 0.0f;
        if (tid < n) {
            beta = bfr(sigmoid_ref(bf2f(b[(size_t)(t0 + tid) * ldb + h])));
            g = __fmul_rn(-expf(A_log[h]), softplus_ref(__fadd_rn(bf2f(a[(size_t)(t0 + tid) * lda + h]), dt_bias[h])));
        }
        sbeta[tid] = beta;
        sg[tid] = g;
    }
    __syncthreads();
    // the norms (tdm_dot's order), a warp per token; the running sum of g
    for (int t = warp; t < CH; t += CK_THREADS / 32) {
        const float dq = warp_dot_ref(qn + t * LD, qn + t * LD, DK);
        const float dk = warp_dot_ref(kn + t * LD, kn + t * LD, DK);
        if (lane == 0) {
            sinvq[t] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(dq, 1e-6f)));
            sinvk[t] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(dk, 1e-6f)));
        }
    }
    if (tid == 0) {
        double G = 0.0;
        for (int t = 0; t < CH; t++) sG[t] = G += (double)sg[t];  // g = 0 past the sequence
    }
    __syncthreads();
    const float qscale = __fdiv_rn(1.0f, __fsqrt_rn((float)DK));
    for (int i = tid; i < CH * DK; i += CK_THREADS) {
        const int t = i / DK, d = i % DK;
        kn[t * LD + d] = __fmul_rn(kn[t * LD + d], sinvk[t]);
        qn[t * LD + d] = __fmul_rn(__fmul_rn(qn[t * LD + d], sinvq[t]), qscale);
    }
    if (tid < CH) {
        const int t = tid;
        const bool in = t < n;
        out[CK_BETA + t] = sbeta[t];
        out[CK_EG + t] = in ? expf((float)sG[t]) : 0.0f;
        out[CK_EGE + t] = in ? expf((float)(sG[n - 1] - sG[t])) : 0.0f;
        out[CK_INVQ + t] = in ? sinvq[t] : 0.0f;
        out[CK_INVK + t] = in ? sinvk[t] : 0.0f;
    }
    __syncthreads();
    // k k^T and q k^T: thread (ti, tj) has rows ti + 16 i and columns tj + 16 j
    const int ti = tid >> 4, tj = tid & 15;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) kk[i][j] = qk[i][j] = 0.0f;
    for (int d = 0; d < DK; d += 4) {
        float4 ak[4], aq[4], bk[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            ak[i] = *reinterpret_cast<const float4 *>(kn + (ti + 16 * i) * LD + d);
            aq[i] = *reinterpret_cast<const float4 *>(qn + (ti + 16 * i) * LD + d);
            bk[i] = *reinterpret_cast<const float4 *>(kn + (tj + 16 * i) * LD + d);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                kk[i][j] = dot4(ak[i], bk[j], kk[i][j]);
                qk[i][j] = dot4(aq[i], bk[j], qk[i][j]);
            }
    }
    __syncthreads();  // q and k are read: L goes over q, T over k
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int t = ti + 16 * i, s = tj + 16 * j;
            const float dec = s <= t && t < n ? expf((float)(sG[t] - sG[s])) : 0.0f;
            Lm[t * CK_LT + s] = s < t ? sbeta[t] * dec * kk[i][j] : 0.0f;
            out[CK_P + t * CH + s] = dec * qk[i][j];
        }
    __syncthreads();
    // T = (I + L)^-1, column s by thread s, rows in order
    if (tid < CH) {
        const int s = tid;
        for (int t = 0; t <= s; t++) Tm[t * CK_LT + s] = t == s ? 1.0f : 0.0f;
        for (int t = s + 1; t < CH; t++) {
            float acc0 = -Lm[t * CK_LT + s], acc1 = 0.0f;
            int m = s + 1;
            for (; m + 1 < t; m += 2) {
                acc0 = fmaf(-Lm[t * CK_LT + m], Tm[m * CK_LT + s], acc0);
                acc1 = fmaf(-Lm[t * CK_LT + m + 1], Tm[(m + 1) * CK_LT + s], acc1);
            }
            if (m < t) acc0 = fmaf(-Lm[t * CK_LT + m], Tm[m * CK_LT + s], acc0);
            Tm[t * CK_LT + s] = acc0 + acc1;
        }
    }
    __syncthreads();
    for (int i = tid; i < CH * CH; i += CK_THREADS) out[CK_T + i] = Tm[(i / CH) * CK_LT + i % CH];
}

// Pass 2, one block per (value head h, CK_DVS state columns), the chunks in order with the state
// slice S [DK][CK_DVS] in shared memory. Per chunk (n tokens, K, Q the normalised rows, G as above):
//   KS = K S, QS = Q S                                       (phase 1)
//   R_t = beta_t (v_t - exp(G_t) KS_t);  U = T R              (phase 2: the corrected values u_t)
//   o_t = exp(G_t) QS_t + sum_{s<=t} P[t][s] u_s  ->bf16      (phase 3)
//   S = exp(G_last) S + sum_t k_t (exp(G_last - G_t) u_t)^T  (phase 4)
// Thread layout: c4 = tid % 8 owns columns 4 c4..4 c4+3 of the slice in every phase; r = tid / 8
// owns rows r + 32 i of the products over the chunk (phase 1: K rows r, r+32 and Q rows r, r+32;
// phases 2, 3: rows r, r+32) and state rows DK/32 r .. DK/32 (r+1) - 1 (phase 4).
template <int DK>
__global__ void __launch_bounds__(CK_THREADS, DK <= 128 ? 2 : 1)
chunk_scan_kernel(const uint16_t *qkv, const float *scratch, float *S, int M, int Hk, int Hv, int Dv, uint16_t *o)
{
    constexpr int LD = DK + 4, RPT = DK / 32;
    extern __shared__ float4 smem4[];
    float *Ss = reinterpret_cast<float *>(smem4);    // [DK][CK_DVS]
    float *Kn = Ss + DK * CK_DVS;                     // [CH][LD]
    float *Qb = Kn + CH * LD;                         // [CH][LD] q, then T and P [CH][CK_LT]
    float *Ub = Qb + scan_qb<DK>();                   // [CH][CK_DVS] KS -> R -> u
    float *Qs = Ub + CH * CK_DVS;                     // [CH][CK_DVS] exp(G) QS
    float *sbeta = Qs + CH * CK_DVS, *seg = sbeta + CH, *sege = seg + CH;
    float *Tm = Qb, *Pm = Qb + CH * CK_LT;
    const int h = blockIdx.x, j0 = blockIdx.y * CK_DVS, tid = threadIdx.x;
    const int c4 = (tid & 7) * 4, r = tid >> 3;
    const int kh = h / (Hv / Hk), nchunks = (M + CH - 1) / CH;
    const int64_t Cq = 2LL * Hk * DK + (int64_t)Hv * Dv;
    const float qscale = __fdiv_rn(1.0f, __fsqrt_rn((float)DK));
    float *Sh = S + (size_t)h * DK * Dv;
    for (int i = tid; i < DK * CK_DVS / 4; i += CK_THREADS) {
        const int d = i / (CK_DVS / 4), cc = (i % (CK_DVS / 4)) * 4;
        *reinterpret_cast<float4 *>(Ss + d * CK_DVS + cc) = *reinterpret_cast<const float4 *>(Sh + (size_t)d * Dv + j0 + cc);
    }
    for (int c = 0; c < nchunks; c++) {
        const int t0 = c * CH, n = min(CH, M - t0);
        const float *sc = scratch + ((size_t)h * nchunks + c) * CK_SCR;
        if (tid < CH) {
            sbeta[tid] = sc[CK_BETA + tid];
            seg[tid] = sc[CK_EG + tid];
            sege[tid] = sc[CK_EGE + tid];
        }
        // the chunk's q and k, every load issued before the stores
#pragma unroll
        for (int it = 0; it < CH * DK / 4 / CK_THREADS; it++) {
            const int i = tid + it * CK_THREADS, t = i / (DK / 4), d = (i % (DK / 4)) * 4;
            float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), kv = qv;
            if (t < n) {
                const uint16_t *row = qkv + (size_t)(t0 + t) * Cq;
                const float iq = sc[CK_INVQ + t], ik = sc[CK_INVK + t];
                qv = ld_bf16x4(row + (size_t)kh * DK + d);
                kv = ld_bf16x4(row + (size_t)(Hk + kh) * DK + d);
                qv = make_float4(__fmul_rn(__fmul_rn(qv.x, iq), qscale), __fmul_rn(__fmul_rn(qv.y, iq), qscale),
                                 __fmul_rn(__fmul_rn(qv.z, iq), qscale), __fmul_rn(__fmul_rn(qv.w, iq), qscale));
                kv = make_float4(__fmul_rn(kv.x, ik), __fmul_rn(kv.y, ik), __fmul_rn(kv.z, ik), __fmul_rn(kv.w, ik));
            }
            *reinterpret_cast<float4 *>(Qb + t * LD + d) = qv;
            *reinterpret_cast<float4 *>(Kn + t * LD + d) = kv;
        }
        __syncthreads();
        // phase 1: KS, QS for rows r, r + 32
        {
            float4 acc[4];
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            const float *a0 = Kn + r * LD, *a1 = Kn + (r + 32) * LD, *a2 = Qb + r * LD, *a3 = Qb + (r + 32) * LD;
#pragma unroll 2
            for (int d = 0; d < DK; d += 4) {
                const float4 x0 = *reinterpret_cast<const float4 *>(a0 + d), x1 = *reinterpret_cast<const float4 *>(a1 + d);
                const float4 x2 = *reinterpret_cast<const float4 *>(a2 + d), x3 = *reinterpret_cast<const float4 *>(a3 + d);
                float4 sv[4];
#pragma unroll
                for (int e = 0; e < 4; e++) sv[e] = *reinterpret_cast<const float4 *>(Ss + (d + e) * CK_DVS + c4);
                fma4(acc[0], x0.x, sv[0]); fma4(acc[0], x0.y, sv[1]); fma4(acc[0], x0.z, sv[2]); fma4(acc[0], x0.w, sv[3]);
                fma4(acc[1], x1.x, sv[0]); fma4(acc[1], x1.y, sv[1]); fma4(acc[1], x1.z, sv[2]); fma4(acc[1], x1.w, sv[3]);
                fma4(acc[2], x2.x, sv[0]); fma4(acc[2], x2.y, sv[1]); fma4(acc[2], x2.z, sv[2]); fma4(acc[2], x2.w, sv[3]);
                fma4(acc[3], x3.x, sv[0]); fma4(acc[3], x3.y, sv[1]); fma4(acc[3], x3.z, sv[2]); fma4(acc[3], x3.w, sv[3]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int t = r + 32 * i;
                float4 rr = make_float4(0.f, 0.f, 0.f, 0.f);
                if (t < n) {
                    const float4 v = ld_bf16x4(qkv + (size_t)(t0 + t) * Cq + 2LL * Hk * DK + (size_t)h * Dv + j0 + c4);
                    const float be = sbeta[t], eg = seg[t];
                    rr = make_float4(be * (v.x - eg * acc[i].x), be * (v.y - eg * acc[i].y), be * (v.z - eg * acc[i].z),
                                     be * (v.w - eg * acc[i].w));
                }
                *reinterpret_cast<float4 *>(Ub + t * CK_DVS + c4) = rr;
                const float eg = seg[t];
                *reinterpret_cast<float4 *>(Qs + t * CK_DVS + c4) =
                    make_float4(eg * acc[2 + i].x, eg * acc[2 + i].y, eg * acc[2 + i].z, eg * acc[2 + i].w);
            }
        }
        __syncthreads();  // q is read: T and P go over it
        constexpr int TP_IT = CH * CH / 4 / CK_THREADS;
        float4 tv[TP_IT], pv[TP_IT];
#pragma unroll
        for (int it = 0; it < TP_IT; it++) {
            tv[it] = *reinterpret_cast<const float4 *>(sc + CK_T + 4 * (tid + it * CK_THREADS));
            pv[it] = *reinterpret_cast<const float4 *>(sc + CK_P + 4 * (tid + it * CK_THREADS));
        }
#pragma unroll
        for (int it = 0; it < TP_IT; it++) {
            const int i = tid + it * CK_THREADS, t = i / (CH / 4), s = (i % (CH / 4)) * 4;
            float *tr = Tm + t * CK_LT + s, *pr = Pm + t * CK_LT + s;
            tr[0] = tv[it].x; tr[1] = tv[it].y; tr[2] = tv[it].z; tr[3] = tv[it].w;
            pr[0] = pv[it].x; pr[1] = pv[it].y; pr[2] = pv[it].z; pr[3] = pv[it].w;
        }
        __syncthreads();
        // phase 2: u = T R (T is unit lower triangular: row t needs R rows 0..t)
        {
            float4 u0 = make_float4(0.f, 0.f, 0.f, 0.f), u1 = u0;
            const int send = r + 32 + 1;
            for (int s = 0; s < send; s++) {
                const float4 rv = *reinterpret_cast<const float4 *>(Ub + s * CK_DVS + c4);
                fma4(u0, Tm[r * CK_LT + s], rv);
                fma4(u1, Tm[(r + 32) * CK_LT + s], rv);
            }
            __syncthreads();  // every thread has read R
            *reinterpret_cast<float4 *>(Ub + r * CK_DVS + c4) = u0;
            *reinterpret_cast<float4 *>(Ub + (r + 32) * CK_DVS + c4) = u1;
        }
        __syncthreads();
        // phase 3: o = exp(G) QS + P u
        {
            float4 o0 = *reinterpret_cast<const float4 *>(Qs + r * CK_DVS + c4);
            float4 o1 = *reinterpret_cast<const float4 *>(Qs + (r + 32) * CK_DVS + c4);
            const int send = r + 32 + 1;
            for (int s = 0; s < send; s++) {
                const float4 uv = *reinterpret_cast<const float4 *>(Ub + s * CK_DVS + c4);
                fma4(o0, Pm[r * CK_LT + s], uv);
                fma4(o1, Pm[(r + 32) * CK_LT + s], uv);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int t = r + 32 * i;
                if (t >= n) continue;
                const float4 ov = i ? o1 : o0;
                uint2 pk;
                pk.x = (uint32_t)f2bf(ov.x) | (uint32_t)f2bf(ov.y) << 16;
                pk.y = (uint32_t)f2bf(ov.z) | (uint32_t)f2bf(ov.w) << 16;
                *reinterpret_cast<uint2 *>(o + ((size_t)(t0 + t) * Hv + h) * Dv + j0 + c4) = pk;
            }
        }
        // phase 4: S = exp(G_last) S + K^T (exp(G_last - G) u), rows RPT r .. RPT r + RPT - 1
        {
            const float el = seg[n - 1];
            float4 acc[RPT];
#pragma unroll
            for (int i = 0; i < RPT; i++) {
                const float4 sv = *reinterpret_cast<const float4 *>(Ss + (RPT * r + i) * CK_DVS + c4);
                acc[i] = make_float4(el * sv.x, el * sv.y, el * sv.z, el * sv.w);
            }
            for (int t = 0; t < n; t++) {
                float4 uv = *reinterpret_cast<const float4 *>(Ub + t * CK_DVS + c4);
                const float w = sege[t];
                uv = make_float4(w * uv.x, w * uv.y, w * uv.z, w * uv.w);
                float kv[RPT];
                if constexpr (RPT == 2) {
                    const float2 k2 = *reinterpret_cast<const float2 *>(Kn + t * LD + RPT * r);
                    kv[0] = k2.x; kv[1] = k2.y;
                } else {
#pragma unroll
                    for (int i = 0; i < RPT; i += 4) {
                        const float4 k4 = *reinterpret_cast<const float4 *>(Kn + t * LD + RPT * r + i);
                        kv[i] = k4.x; kv[i + 1] = k4.y; kv[i + 2] = k4.z; kv[i + 3] = k4.w;
                    }
                }
#pragma unroll
                for (int i = 0; i < RPT; i++) fma4(acc[i], kv[i], uv);
            }
#pragma unroll
            for (int i = 0; i < RPT; i++) *reinterpret_cast<float4 *>(Ss + (RPT * r + i) * CK_DVS + c4) = acc[i];
        }
        __syncthreads();  // the next chunk overwrites K, q, R and reads the state
    }
    for (int i = tid; i < DK * CK_DVS / 4; i += CK_THREADS) {
        const int d = i / (CK_DVS / 4), cc = (i % (CK_DVS / 4)) * 4;
        *reinterpret_cast<float4 *>(Sh + (size_t)d * Dv + j0 + cc) = *reinterpret_cast<const float4 *>(Ss + d * CK_DVS + cc);
    }
}

}  // namespace

// d_M, gsrc, gdst, gcount: tdm_gdn_conv_pending's (NULL, 0 otherwise).
static int conv_launch(const char *who, const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state,
                       uint16_t *state_out, int M, int C, int K, uint16_t *y, const int32_t *d_M, const uint16_t *gsrc,
                       uint16_t *gdst, int64_t gcount, void *stream)
{
    if (M < 0 || C <= 0 || K < 2 || K > 4 || ldx < C || gcount < 0 || (gcount && (!gsrc || !gdst)))
        return tdm_errf("%s: bad shape M %d, C %d, K %d (2..4), ldx %lld, gates %lld", who, M, C, K, (long long)ldx,
                        (long long)gcount);
    if (M == 0 && gcount == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    // token lanes a block: up to 8 (a channel's M tokens then take ceil(M / 8) steps a thread)
    const int ty = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8, cx = CONV_THREADS / ty;
    const dim3 grid((unsigned)((C + cx - 1) / cx)), block((unsigned)cx, (unsigned)ty);
    if (K == 4) conv_kernel<4><<<grid, block, 0, st>>>(x, ldx, w, state, state_out, M, C, y, d_M, gsrc, gdst, gcount);
    else if (K == 3) conv_kernel<3><<<grid, block, 0, st>>>(x, ldx, w, state, state_out, M, C, y, d_M, gsrc, gdst, gcount);
    else conv_kernel<2><<<grid, block, 0, st>>>(x, ldx, w, state, state_out, M, C, y, d_M, gsrc, gdst, gcount);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_gdn_conv(const uint16_t *x, int64_t ldx, const float *w, uint16_t *state, int M, int C, int K,
                            uint16_t *y, void *stream)
{
    return conv_launch("tdm_gdn_conv", x, ldx, w, state, state, M, C, K, y, NULL, NULL, NULL, 0, stream);
}

extern "C" int tdm_gdn_conv_pending(const uint16_t *x, int64_t ldx, const float *w, uint16_t *state, const int32_t *d_n,
                                    int C, int K, uint16_t *y, const uint16_t *gsrc, uint16_t *gdst, int64_t gcount,
                                    void *stream)
{
    if (!d_n) return tdm_errf("tdm_gdn_conv_pending: d_n is NULL");
    return conv_launch("tdm_gdn_conv_pending", x, ldx, w, state, state, TDM_GDN_PEND_MAX, C, K, y, d_n, gsrc, gdst, gcount,
                       stream);
}

template <int K>
static void conv_prefill_go(dim3 grid, cudaStream_t st, const uint16_t *x, int64_t ldx, const float *w, uint16_t *state,
                            int M, int C, uint16_t *y)
{
    conv_prefill_kernel<K><<<grid, CONV_THREADS, 0, st>>>(x, ldx, w, state, M, C, y);
    conv_state_kernel<K><<<grid.x, CONV_THREADS, 0, st>>>(x, ldx, state, M, C);
}

extern "C" int tdm_gdn_conv_prefill(const uint16_t *x, int64_t ldx, const float *w, uint16_t *state, int M, int C, int K,
                                    uint16_t *y, void *stream)
{
    const int tblocks = (M + CONV_TB - 1) / CONV_TB;
    if (M < 0 || C <= 0 || K < 2 || K > 4 || ldx < C || tblocks > 65535)
        return tdm_errf("tdm_gdn_conv_prefill: bad shape M %d (at most %d), C %d, K %d (2..4), ldx %lld", M,
                        65535 * CONV_TB, C, K, (long long)ldx);
    if (M == 0) return 0;
    const dim3 grid((C + CONV_THREADS - 1) / CONV_THREADS, tblocks);
    cudaStream_t st = (cudaStream_t)stream;
    if (K == 4) conv_prefill_go<4>(grid, st, x, ldx, w, state, M, C, y);
    else if (K == 3) conv_prefill_go<3>(grid, st, x, ldx, w, state, M, C, y);
    else conv_prefill_go<2>(grid, st, x, ldx, w, state, M, C, y);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_gdn_conv_verify(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state, int M, int C,
                                   int K, uint16_t *y, void *stream)
{
    return conv_launch("tdm_gdn_conv_verify", x, ldx, w, state, NULL, M, C, K, y, NULL, NULL, NULL, 0, stream);
}

extern "C" int tdm_gdn_conv_tree(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state,
                                 const int32_t *parent, int M, int C, int K, uint16_t *y, void *stream)
{
    if (M < 0 || M > TDM_TREE_MAX || C <= 0 || K < 2 || K > 4 || ldx < C || !parent)
        return tdm_errf("tdm_gdn_conv_tree: bad shape M %d (at most %d), C %d, K %d (2..4), ldx %lld, parent %s", M,
                        TDM_TREE_MAX, C, K, (long long)ldx, parent ? "given" : "NULL");
    if (M == 0) return 0;
    const dim3 blocks((C + CONV_THREADS - 1) / CONV_THREADS, M);
    cudaStream_t st = (cudaStream_t)stream;
    if (K == 4) conv_tree_kernel<4><<<blocks, CONV_THREADS, 0, st>>>(x, ldx, w, state, parent, M, C, y);
    else if (K == 3) conv_tree_kernel<3><<<blocks, CONV_THREADS, 0, st>>>(x, ldx, w, state, parent, M, C, y);
    else conv_tree_kernel<2><<<blocks, CONV_THREADS, 0, st>>>(x, ldx, w, state, parent, M, C, y);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int64_t tdm_gdn_conv_bytes(int M, int C, int K)
{
    // x in, y out, taps, the state read and written
    return (int64_t)M * C * 4 + (int64_t)C * K * 4 + (int64_t)(K - 1) * C * 4;
}

extern "C" int tdm_gdn_ungroup(const uint16_t *qkvz, int64_t ldqkvz, const uint16_t *ba, int64_t ldba, int M, int Hk,
                               int Hv, int Dk, int Dv, uint16_t *mixed, uint16_t *z, uint16_t *b, uint16_t *a,
                               void *stream)
{
    if (M < 0 || Hk <= 0 || Hv <= 0 || Hv % Hk || Dk <= 0 || Dv <= 0 || ldqkvz < 2LL * Hk * Dk + 2LL * Hv * Dv ||
        ldba < 2LL * Hv || !qkvz || !ba || !mixed || !z || !b || !a)
        return tdm_errf("tdm_gdn_ungroup: bad arguments M %d, Hk %d, Hv %d (a multiple of Hk), Dk %d, Dv %d, ldqkvz %lld, "
                        "ldba %lld", M, Hk, Hv, Dk, Dv, (long long)ldqkvz, (long long)ldba);
    if (M == 0) return 0;
    ungroup_kernel<<<dim3(M, Hk), UNGROUP_THREADS, 0, (cudaStream_t)stream>>>(qkvz, ldqkvz, ba, ldba, Hk, Hv, Dk, Dv,
                                                                            mixed, z, b, a);
    TDM_LAUNCH_CHECK();
    return 0;
}

// The fused gated norm (gn.y set) runs a value head's Dv/32 blocks as one cluster (gated_norm_tail).
template <int ROWS, bool TREE>
static cudaError_t recur_go_rows(dim3 grid, cudaStream_t st, const uint16_t *qkv, const uint16_t *b, int64_t ldb,
                                 const uint16_t *a, int64_t lda, const float *A_log, const float *dt_bias, const float *S,
                                 float *S_out, const int32_t *parent, int M, int Hk, int Hv, int Dv, uint16_t *o,
                                 const tdm_gdn_pend &pend, float *S_pend, const tdm_gdn_gnorm &gn)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(REC_WARPS * 32, 1, 1);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    if (gn.y) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1;
        attr[0].val.clusterDim.y = grid.y;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, recur_kernel<ROWS, TREE>, qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, parent, M,
                              Hk, Hv, Dv, o, pend, S_pend, gn);
}
template <bool TREE>
static cudaError_t recur_go(dim3 grid, cudaStream_t st, const uint16_t *qkv, const uint16_t *b, int64_t ldb,
                            const uint16_t *a, int64_t lda, const float *A_log, const float *dt_bias, const float *S,
                            float *S_out, const int32_t *parent, int M, int Hk, int Hv, int Dk, int Dv, uint16_t *o,
                            const tdm_gdn_pend &pend, float *S_pend, const tdm_gdn_gnorm &gn)
{
    if (Dk == 128)
        return recur_go_rows<16, TREE>(grid, st, qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, parent, M, Hk, Hv, Dv, o,
                                       pend, S_pend, gn);
    if (Dk == 64)
        return recur_go_rows<8, TREE>(grid, st, qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, parent, M, Hk, Hv, Dv, o,
                                      pend, S_pend, gn);
    return recur_go_rows<32, TREE>(grid, st, qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, parent, M, Hk, Hv, Dv, o,
                                   pend, S_pend, gn);
}

// parent not NULL: the tree form (S_out must be NULL; M <= TDM_TREE_MAX). pend NULL: no pending
// rows; else they are applied first (recur_kernel, PENDING) and, when S_out is NULL, the state
// after them written to S_pend.
static int recur_launch(const char *who, const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a,
                        int64_t lda, const float *A_log, const float *dt_bias, const float *S, float *S_out,
                        const int32_t *parent, int M, int Hk, int Hv, int Dk, int Dv, uint16_t *o,
                        const struct tdm_gdn_pend *pend, float *S_pend, const struct tdm_gdn_gnorm *gn, void *stream)
{
    if (M < 0 || Hk <= 0 || Hv <= 0 || Hv % Hk || (Dk != 64 && Dk != 128 && Dk != 256) || Dv <= 0 || Dv % 32 ||
        ldb < Hv || lda < Hv || (parent && (M > TDM_TREE_MAX || S_out)))
        return tdm_errf("%s: bad shape M %d, Hk %d, Hv %d, Dk %d (64, 128 or 256), Dv %d (a multiple of 32), "
                        "ldb %lld, lda %lld%s", who, M, Hk, Hv, Dk, Dv, (long long)ldb, (long long)lda,
                        parent ? " (a tree: M at most 32)" : "");
    if (pend && (!pend->d_n || !pend->qkv || !pend->b || !pend->a || pend->ldb < Hv || pend->lda < Hv || (!S_out && !S_pend)))
        return tdm_errf("%s: bad pending rows: d_n, qkv, b, a %s, ldb %lld, lda %lld (at least Hv %d)", who,
                        pend->d_n && pend->qkv && pend->b && pend->a ? "given" : "not all given", (long long)pend->ldb,
                        (long long)pend->lda, Hv);
    if (gn) {
        const int scratch = Dk == 64 ? rec_tb<64>() * 64 : Dk == 128 ? rec_tb<128>() * 128 : rec_tb<256>() * 256;
        const int dv_max = scratch < TDM_GDN_FUSED_NORM_DV_MAX ? scratch : TDM_GDN_FUSED_NORM_DV_MAX;
        if (!gn->z || !gn->w || !gn->y || gn->ldz < (int64_t)Hv * Dv || Dv > dv_max || !o)
            return tdm_errf("%s: bad gated norm: z, w, y, o %s, ldz %lld (at least Hv Dv %lld), Dv %d (at most %d "
                            "at Dk %d)", who, gn->z && gn->w && gn->y && o ? "given" : "not all given",
                            (long long)gn->ldz, (long long)Hv * Dv, Dv, dv_max, Dk);
        if (xb_refused(who, gn->yb, M)) return -1;
    }
    if (M == 0 && !pend) return 0;
    const tdm_gdn_pend none = {NULL, NULL, NULL, 0, 0, NULL}, &pv = pend ? *pend : none;
    const tdm_gdn_gnorm gnone = {NULL, 0, NULL, 0.0f, NULL, NULL}, &gv = gn ? *gn : gnone;
    float *sp = pend ? S_pend : NULL;
    dim3 grid(Hv, Dv / 32);
    cudaStream_t st = (cudaStream_t)stream;
    const cudaError_t e =
        parent ? recur_go<true>(grid, st, qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, parent, M, Hk, Hv, Dk, Dv, o, pv, sp, gv)
               : recur_go<false>(grid, st, qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, NULL, M, Hk, Hv, Dk, Dv, o, pv, sp, gv);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tdm_errf("%s: launch failed: %s", who, cudaGetErrorString(e));
    }
    return 0;
}

extern "C" int tdm_gdn_recur(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                             const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk, int Dv,
                             uint16_t *o, const struct tdm_gdn_gnorm *gn, void *stream)
{
    return recur_launch("tdm_gdn_recur", qkv, b, ldb, a, lda, A_log, dt_bias, S, S, NULL, M, Hk, Hv, Dk, Dv, o, NULL, NULL,
                        gn, stream);
}

extern "C" int tdm_gdn_recur_verify(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                    const float *A_log, const float *dt_bias, const float *S, int M, int Hk, int Hv, int Dk,
                                    int Dv, uint16_t *o, const struct tdm_gdn_gnorm *gn, void *stream)
{
    return recur_launch("tdm_gdn_recur_verify", qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, NULL, M, Hk, Hv, Dk, Dv, o,
                        NULL, NULL, gn, stream);
}

extern "C" int tdm_gdn_recur_tree(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                  const float *A_log, const float *dt_bias, const float *S, const int32_t *parent, int M,
                                  int Hk, int Hv, int Dk, int Dv, uint16_t *o, const struct tdm_gdn_gnorm *gn, void *stream)
{
    if (!parent) return tdm_errf("tdm_gdn_recur_tree: parent is NULL");
    return recur_launch("tdm_gdn_recur_tree", qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, parent, M, Hk, Hv, Dk, Dv, o,
                        NULL, NULL, gn, stream);
}

extern "C" int tdm_gdn_recur_pend(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                  const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk, int Dv,
                                  uint16_t *o, const struct tdm_gdn_pend *pend, const struct tdm_gdn_gnorm *gn, void *stream)
{
    if (!pend) return tdm_errf("tdm_gdn_recur_pend: pend is NULL");
    return recur_launch("tdm_gdn_recur_pend", qkv, b, ldb, a, lda, A_log, dt_bias, S, S, NULL, M, Hk, Hv, Dk, Dv, o, pend,
                        NULL, gn, stream);
}

extern "C" int tdm_gdn_recur_verify_pend(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a,
                                         int64_t lda, const float *A_log, const float *dt_bias, float *S, int M, int Hk,
                                         int Hv, int Dk, int Dv, uint16_t *o, const struct tdm_gdn_pend *pend,
                                         const struct tdm_gdn_gnorm *gn, void *stream)
{
    if (!pend) return tdm_errf("tdm_gdn_recur_verify_pend: pend is NULL");
    return recur_launch("tdm_gdn_recur_verify_pend", qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, NULL, M, Hk, Hv, Dk, Dv,
                        o, pend, S, gn, stream);
}

extern "C" int tdm_gdn_recur_tree_pend(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                       const float *A_log, const float *dt_bias, float *S, const int32_t *parent, int M,
                                       int Hk, int Hv, int Dk, int Dv, uint16_t *o, const struct tdm_gdn_pend *pend,
                                       const struct tdm_gdn_gnorm *gn, void *stream)
{
    if (!parent || !pend) return tdm_errf("tdm_gdn_recur_tree_pend: parent or pend is NULL");
    return recur_launch("tdm_gdn_recur_tree_pend", qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, parent, M, Hk, Hv, Dk, Dv,
                        o, pend, S, gn, stream);
}

extern "C" int64_t tdm_gdn_recur_bytes(int M, int Hk, int Hv, int Dk, int Dv)
{
    // the conv output (q, k, v), b and a in; o out; the state read and written; A_log, dt_bias
    const int64_t C = 2LL * Hk * Dk + (int64_t)Hv * Dv;
    return (int64_t)M * (C * 2 + (int64_t)Hv * 4 + (int64_t)Hv * Dv * 2) + (int64_t)Hv * Dk * Dv * 8 + (int64_t)Hv * 8;
}

extern "C" size_t tdm_gdn_recur_chunked_scratch_bytes(int M, int Hv)
{
    if (M <= 0 || Hv <= 0) return 0;
    return (size_t)((M + CH - 1) / CH) * (size_t)Hv * CK_SCR * sizeof(float);
}

// Raises a kernel's dynamic shared memory limit to bytes once (not inside a later graph capture);
// 0 when the device cannot give it.
template <typename F>
static int smem_allow(F *kern, size_t bytes, int *done)
{
    if (*done) return *done > 0;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || (size_t)optin < bytes ||
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        *done = -1;
        return 0;
    }
    *done = 1;
    return 1;
}

template <int DK>
static int chunked_go(cudaStream_t st, const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                      const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dv, float *scratch,
                      uint16_t *o)
{
    static int prep_ok = 0, scan_ok = 0;
    if (!smem_allow(chunk_prep_kernel<DK>, prep_smem<DK>(), &prep_ok) ||
        !smem_allow(chunk_scan_kernel<DK>, scan_smem<DK>(), &scan_ok))
        return 1;  // not on this device: the token-serial kernel
    const int nchunks = (M + CH - 1) / CH;
    chunk_prep_kernel<DK><<<dim3(nchunks, Hv), CK_THREADS, prep_smem<DK>(), st>>>(qkv, b, ldb, a, lda, A_log, dt_bias, M,
                                                                                  Hk, Hv, Dv, scratch);
    chunk_scan_kernel<DK><<<dim3(Hv, Dv / CK_DVS), CK_THREADS, scan_smem<DK>(), st>>>(qkv, scratch, S, M, Hk, Hv, Dv, o);
    return 0;
}

extern "C" int tdm_gdn_recur_chunked(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                     const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk,
                                     int Dv, float *scratch, uint16_t *o, void *stream)
{
    if (M < 0 || Hk <= 0 || Hv <= 0 || Hv % Hk || (Dk != 64 && Dk != 128 && Dk != 256) || Dv <= 0 || Dv % 32 ||
        ldb < Hv || lda < Hv || (M > 0 && !scratch) || ((uintptr_t)qkv | (uintptr_t)o) % 8 ||
        ((uintptr_t)S | (uintptr_t)scratch) % 16)
        return tdm_errf("tdm_gdn_recur_chunked: bad arguments M %d, Hk %d, Hv %d, Dk %d (64, 128 or 256), Dv %d (a "
                        "multiple of 32), ldb %lld, lda %lld, scratch %s (qkv and o 8-byte aligned, S and scratch "
                        "16-byte)", M, Hk, Hv, Dk, Dv, (long long)ldb, (long long)lda, scratch ? "given" : "NULL");
    if (M == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    const int rc = Dk == 128 ? chunked_go<128>(st, qkv, b, ldb, a, lda, A_log, dt_bias, S, M, Hk, Hv, Dv, scratch, o)
                   : Dk == 64 ? chunked_go<64>(st, qkv, b, ldb, a, lda, A_log, dt_bias, S, M, Hk, Hv, Dv, scratch, o)
                              : chunked_go<256>(st, qkv, b, ldb, a, lda, A_log, dt_bias, S, M, Hk, Hv, Dv, scratch, o);
    if (rc) return tdm_gdn_recur(qkv, b, ldb, a, lda, A_log, dt_bias, S, M, Hk, Hv, Dk, Dv, o, NULL, stream);
    TDM_LAUNCH_CHECK();
    return 0;
}
