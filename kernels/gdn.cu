// gdn.cu — the Gated DeltaNet layer's own kernels (layers.h): the causal conv with its rolling
// state, and the gates + L2 norms + delta-rule recurrence over the FP32 state. The projections
// are matrix products (matmul.h); the gated norm is in norm.cu.
#include "layers.h"
#include "layers_dev.cuh"
#include "cuda_check.h"

using namespace tdm_ly;

namespace {

constexpr int CONV_THREADS = 256;

// One thread a channel, the M tokens in order: exactly tdm_ref_gdn_conv's arithmetic
// (acc = 0, acc += w[j] * in[j] for j = 0..K-1, then bf16(silu(bf16(acc)))). The state is read
// from state and, unless state_out is NULL, the advanced window written to state_out (the same
// buffer for a forward; each thread reads and writes only its own channel).
template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv_kernel(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state, uint16_t *state_out, int M, int C,
            uint16_t *y)
{
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= C) return;
    float win[K], wk[K];
#pragma unroll
    for (int j = 0; j < K; j++) wk[j] = w[(size_t)c * K + j];
#pragma unroll
    for (int j = 0; j < K - 1; j++) win[j] = bf2f(state[(size_t)j * C + c]);
    for (int t = 0; t < M; t++) {
        win[K - 1] = bf2f(x[(size_t)t * ldx + c]);
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < K; j++) acc = __fadd_rn(acc, __fmul_rn(wk[j], win[j]));
        y[(size_t)t * C + c] = f2bf(silu_ref(bfr(acc)));
#pragma unroll
        for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
    }
    if (!state_out) return;  // a verify: the round's entry state stays for the commit
#pragma unroll
    for (int j = 0; j < K - 1; j++) state_out[(size_t)j * C + c] = f2bf(win[j]);
}

// The prefill form: thread (channel c, block of CONV_TB tokens), the block's first window read from
// x (or, before token 0, from the state) — the window conv_kernel has at that token, since its
// shifts only move values — then conv_kernel's sum and roundings per token. The state is left to
// conv_state_kernel, launched after this one: other blocks of the channel still read it here.
constexpr int CONV_TB = 16;

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
    for (int j = 0; j < K - 1; j++) {
        const int s = t0 - (K - 1) + j;  // the input of tap j at token t0
        win[j] = bf2f(s >= 0 ? x[(size_t)s * ldx + c] : state[(size_t)(K - 1 + s) * C + c]);
    }
    for (int t = t0; t < t1; t++) {
        win[K - 1] = bf2f(x[(size_t)t * ldx + c]);
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < K; j++) acc = __fadd_rn(acc, __fmul_rn(wk[j], win[j]));
        y[(size_t)t * C + c] = f2bf(silu_ref(bfr(acc)));
#pragma unroll
        for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
    }
}

// The state after M tokens, in place: row j becomes input M + j of (state ++ x), conv_kernel's
// final window. Rows ascend, so row j + M (j + M > j) is read before it is written.
template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv_state_kernel(const uint16_t *x, int64_t ldx, uint16_t *state, int M, int C)
{
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= C) return;
#pragma unroll
    for (int j = 0; j < K - 1; j++) {
        const int s = M - (K - 1) + j;
        state[(size_t)j * C + c] = s >= 0 ? x[(size_t)s * ldx + c] : state[(size_t)(j + M) * C + c];
    }
}

// The tree form (layers.h, Trees): thread c per channel, node t's window built along its path —
// tap j holds the input of t's ancestor at depth s = depth(t) - (K - 1) + j, or for s < 0 the
// committed state's row K - 1 + s — which is the window conv_kernel has at the last token of that
// path fed as a chain (its shifts only move values). The sum and roundings are conv_kernel's.
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
    for (int t = 0; t < M; t++) {
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
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < K; j++) acc = __fadd_rn(acc, __fmul_rn(wk[j], win[j]));
        y[(size_t)t * C + c] = f2bf(silu_ref(bfr(acc)));
    }
}

constexpr int UNGROUP_THREADS = 256;

// Block t: token t's grouped qkvz [Hk][2 Dk + 2 r Dv] and ba [Hk][2 r] copied into conv order
// (tdm_ref_gdn_ungroup). One thread per source value; copies only.
__global__ void __launch_bounds__(UNGROUP_THREADS)
ungroup_kernel(const uint16_t *qkvz, int64_t ldqkvz, const uint16_t *ba, int64_t ldba, int Hk, int Hv, int Dk, int Dv,
               uint16_t *mixed, uint16_t *z, uint16_t *b, uint16_t *a)
{
    const int t = blockIdx.x, r = Hv / Hk, rDv = r * Dv, Wg = 2 * Dk + 2 * rDv;
    const int C = 2 * Hk * Dk + Hv * Dv;
    const uint16_t *src = qkvz + (size_t)t * ldqkvz;
    uint16_t *mt = mixed + (size_t)t * C, *zt = z + (size_t)t * Hv * Dv;
    for (int i = threadIdx.x; i < Hk * Wg; i += UNGROUP_THREADS) {
        const int g = i / Wg, o = i - g * Wg;
        uint16_t *dst;
        if (o < Dk) dst = mt + g * Dk + o;
        else if (o < 2 * Dk) dst = mt + Hk * Dk + g * Dk + (o - Dk);
        else if (o < 2 * Dk + rDv) dst = mt + 2 * Hk * Dk + g * rDv + (o - 2 * Dk);
        else dst = zt + g * rDv + (o - 2 * Dk - rDv);
        *dst = src[i];
    }
    const uint16_t *bsrc = ba + (size_t)t * ldba;
    for (int i = threadIdx.x; i < 2 * Hv; i += UNGROUP_THREADS) {
        const int g = i / (2 * r), o = i - g * 2 * r;
        if (o < r) b[(size_t)t * Hv + g * r + o] = bsrc[i];
        else a[(size_t)t * Hv + g * r + (o - r)] = bsrc[i];
    }
}

constexpr int REC_WARPS = 8;  // the Dk rows of a column split into 8 slices of Dk/8

// One block per (value head h, 32 state columns j). Thread (warp w, lane l) holds S[i][j] for its
// column j = 32 blockIdx.y + l and the rows i = w ROWS .. w ROWS + ROWS - 1 in registers for all
// M tokens. Per token, tdm_ref_gdn_token's steps in its order, elementwise with its operations:
//   q, k of key head h / rep: L2 norms in tdm_dot's order (warp_dot_ref), q *= 1/sqrt(Dk);
//   beta = bf16(sigmoid(b)), g = -exp(A_log) softplus(a + dt_bias), S *= exp(g);
//   kv = S^T k: per thread a serial sum over its rows, then the 8 warps' sums in warp order;
//   u = (v - kv) beta; S += k u^T; o = S^T q (as kv) ->bf16.
// Only the two sums over Dk differ from the CPU's serial order. No value depends on M: the tokens
// run in sequence and a token's arithmetic is the same in every call. The state is read from S and,
// unless S_out is NULL, written to S_out after the last token (the same buffer for a forward; each
// thread reads and writes only its own elements).
//
// TREE (parent not NULL, S_out NULL; layers.h, Trees): token t is node t, and s must hold its
// parent's state when the step starts. The block keeps every node's factors in shared memory (fk:
// the normed k, fu: u for its 32 columns, fdec: the decay), each computed by the step as above.
// When the parent is not the node whose state s holds (cur), s is reloaded from S and the parent's
// path is replayed root first with the step's own two state operations, s = s decay, then
// s = s + k u: the values s had after each of those steps, so the node's step then runs on its
// parent's state exactly as the chain kernel runs it on that path. Ancestors come as a bit mask:
// a node's ancestors have smaller indices, so ascending bits are the path root first.
template <int ROWS, bool TREE>
__global__ void __launch_bounds__(REC_WARPS * 32)
recur_kernel(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda, const float *A_log,
             const float *dt_bias, const float *S, float *S_out, const int32_t *parent, int M, int Hk, int Hv, int Dv,
             uint16_t *o)
{
    constexpr int Dk = ROWS * REC_WARPS;
    constexpr int NT = TREE ? TDM_TREE_MAX : 1;  // the factor store, only for trees
    __shared__ float qs[Dk], ks[Dk], red[REC_WARPS][32], us[32], sc[4];
    __shared__ float fk[NT][TREE ? Dk : 1], fu[NT][32], fdec[NT];
    __shared__ int32_t par[NT];
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
    const int j = blockIdx.y * 32 + lane, i0 = warp * ROWS;
    const int kh = h / (Hv / Hk), C = 2 * Hk * Dk + Hv * Dv;
    const float *Sh = S + (size_t)h * Dk * Dv;
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) s[r] = Sh[(size_t)(i0 + r) * Dv + j];
    int cur = -1;  // TREE: the node whose state s holds (-1: the entry state)
    if constexpr (TREE) {
        if (tid < M) par[tid] = parent[tid];
        __syncthreads();
    }
    const float qscale = __fdiv_rn(1.0f, __fsqrt_rn((float)Dk));
    for (int t = 0; t < M; t++) {
        if constexpr (TREE) {
            const int p = par[t];
            if (p != cur) {  // block-uniform
#pragma unroll
                for (int r = 0; r < ROWS; r++) s[r] = Sh[(size_t)(i0 + r) * Dv + j];
                uint32_t anc = 0;
                for (int x = p, n = 0; x >= 0 && n < TDM_TREE_MAX; x = par[x], n++) anc |= 1u << x;
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
        const uint16_t *ct = qkv + (size_t)t * C;
        for (int i = tid; i < Dk; i += REC_WARPS * 32) {
            qs[i] = bf2f(ct[(size_t)kh * Dk + i]);
            ks[i] = bf2f(ct[(size_t)(Hk + kh) * Dk + i]);
        }
        __syncthreads();
        if (warp == 0) {
            const float d = warp_dot_ref(qs, qs, Dk);
            if (lane == 0) sc[0] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(d, 1e-6f)));
        } else if (warp == 1) {
            const float d = warp_dot_ref(ks, ks, Dk);
            if (lane == 0) sc[1] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(d, 1e-6f)));
        } else if (warp == 2 && lane == 0) {
            sc[2] = bfr(sigmoid_ref(bf2f(b[(size_t)t * ldb + h])));
            const float gt = __fmul_rn(-expf(A_log[h]), softplus_ref(__fadd_rn(bf2f(a[(size_t)t * lda + h]), dt_bias[h])));
            sc[3] = expf(gt);
            if constexpr (TREE) fdec[t] = sc[3];
        }
        __syncthreads();
        const float invq = sc[0], invk = sc[1], beta = sc[2], decay = sc[3];
        if constexpr (TREE)  // kr below, for every row (read after the barriers of later nodes)
            for (int i = tid; i < Dk; i += REC_WARPS * 32) fk[t][i] = __fmul_rn(ks[i], invk);
        // every thread scales its own copy of the rows it needs: no second barrier for qs/ks
        float kr[ROWS], qr[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            kr[r] = __fmul_rn(ks[i0 + r], invk);
            qr[r] = __fmul_rn(__fmul_rn(qs[i0 + r], invq), qscale);
        }
        const float v = bf2f(ct[(size_t)2 * Hk * Dk + (size_t)h * Dv + j]);
        float p = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            s[r] = __fmul_rn(s[r], decay);
            p = __fadd_rn(p, __fmul_rn(s[r], kr[r]));
        }
        red[warp][lane] = p;
        __syncthreads();
        if (warp == 0) {
            float kv = red[0][lane];
#pragma unroll
            for (int w = 1; w < REC_WARPS; w++) kv = __fadd_rn(kv, red[w][lane]);
            us[lane] = __fmul_rn(__fsub_rn(v, kv), beta);
            if constexpr (TREE) fu[t][lane] = us[lane];
        }
        __syncthreads();
        const float u = us[lane];
        p = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            s[r] = __fadd_rn(s[r], __fmul_rn(kr[r], u));
            p = __fadd_rn(p, __fmul_rn(s[r], qr[r]));
        }
        red[warp][lane] = p;  // warp 0 read red before the barrier above
        __syncthreads();
        if (warp == 0) {
            float ov = red[0][lane];
#pragma unroll
            for (int w = 1; w < REC_WARPS; w++) ov = __fadd_rn(ov, red[w][lane]);
            o[((size_t)t * Hv + h) * Dv + j] = f2bf(ov);
        }
        __syncthreads();  // qs, ks, sc, red are rewritten by the next token
    }
    if (TREE || !S_out) return;  // a verify: the round's entry state stays for the commit
    float *So = S_out + (size_t)h * Dk * Dv;
#pragma unroll
    for (int r = 0; r < ROWS; r++) So[(size_t)(i0 + r) * Dv + j] = s[r];
}

}  // namespace

static int conv_launch(const char *who, const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state,
                       uint16_t *state_out, int M, int C, int K, uint16_t *y, void *stream)
{
    if (M < 0 || C <= 0 || K < 2 || K > 4 || ldx < C)
        return tdm_errf("%s: bad shape M %d, C %d, K %d (2..4), ldx %lld", who, M, C, K, (long long)ldx);
    if (M == 0) return 0;
    const int blocks = (C + CONV_THREADS - 1) / CONV_THREADS;
    cudaStream_t st = (cudaStream_t)stream;
    if (K == 4) conv_kernel<4><<<blocks, CONV_THREADS, 0, st>>>(x, ldx, w, state, state_out, M, C, y);
    else if (K == 3) conv_kernel<3><<<blocks, CONV_THREADS, 0, st>>>(x, ldx, w, state, state_out, M, C, y);
    else conv_kernel<2><<<blocks, CONV_THREADS, 0, st>>>(x, ldx, w, state, state_out, M, C, y);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_gdn_conv(const uint16_t *x, int64_t ldx, const float *w, uint16_t *state, int M, int C, int K,
                            uint16_t *y, void *stream)
{
    return conv_launch("tdm_gdn_conv", x, ldx, w, state, state, M, C, K, y, stream);
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
    return conv_launch("tdm_gdn_conv_verify", x, ldx, w, state, NULL, M, C, K, y, stream);
}

extern "C" int tdm_gdn_conv_tree(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state,
                                 const int32_t *parent, int M, int C, int K, uint16_t *y, void *stream)
{
    if (M < 0 || M > TDM_TREE_MAX || C <= 0 || K < 2 || K > 4 || ldx < C || !parent)
        return tdm_errf("tdm_gdn_conv_tree: bad shape M %d (at most %d), C %d, K %d (2..4), ldx %lld, parent %s", M,
                        TDM_TREE_MAX, C, K, (long long)ldx, parent ? "given" : "NULL");
    if (M == 0) return 0;
    const int blocks = (C + CONV_THREADS - 1) / CONV_THREADS;
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
    ungroup_kernel<<<M, UNGROUP_THREADS, 0, (cudaStream_t)stream>>>(qkvz, ldqkvz, ba, ldba, Hk, Hv, Dk, Dv, mixed, z, b, a);
    TDM_LAUNCH_CHECK();
    return 0;
}

template <bool TREE>
static void recur_go(dim3 grid, cudaStream_t st, const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a,
                     int64_t lda, const float *A_log, const float *dt_bias, const float *S, float *S_out,
                     const int32_t *parent, int M, int Hk, int Hv, int Dk, int Dv, uint16_t *o)
{
    if (Dk == 128)
        recur_kernel<16, TREE><<<grid, REC_WARPS * 32, 0, st>>>(qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, parent, M,
                                                                Hk, Hv, Dv, o);
    else if (Dk == 64)
        recur_kernel<8, TREE><<<grid, REC_WARPS * 32, 0, st>>>(qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, parent, M,
                                                               Hk, Hv, Dv, o);
    else
        recur_kernel<32, TREE><<<grid, REC_WARPS * 32, 0, st>>>(qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, parent, M,
                                                                Hk, Hv, Dv, o);
}

// parent not NULL: the tree form (S_out must be NULL; M <= TDM_TREE_MAX).
static int recur_launch(const char *who, const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a,
                        int64_t lda, const float *A_log, const float *dt_bias, const float *S, float *S_out,
                        const int32_t *parent, int M, int Hk, int Hv, int Dk, int Dv, uint16_t *o, void *stream)
{
    if (M < 0 || Hk <= 0 || Hv <= 0 || Hv % Hk || (Dk != 64 && Dk != 128 && Dk != 256) || Dv <= 0 || Dv % 32 ||
        ldb < Hv || lda < Hv || (parent && (M > TDM_TREE_MAX || S_out)))
        return tdm_errf("%s: bad shape M %d, Hk %d, Hv %d, Dk %d (64, 128 or 256), Dv %d (a multiple of 32), "
                        "ldb %lld, lda %lld%s", who, M, Hk, Hv, Dk, Dv, (long long)ldb, (long long)lda,
                        parent ? " (a tree: M at most 32)" : "");
    if (M == 0) return 0;
    dim3 grid(Hv, Dv / 32);
    cudaStream_t st = (cudaStream_t)stream;
    if (parent) recur_go<true>(grid, st, qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, parent, M, Hk, Hv, Dk, Dv, o);
    else recur_go<false>(grid, st, qkv, b, ldb, a, lda, A_log, dt_bias, S, S_out, NULL, M, Hk, Hv, Dk, Dv, o);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_gdn_recur(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                             const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk, int Dv,
                             uint16_t *o, void *stream)
{
    return recur_launch("tdm_gdn_recur", qkv, b, ldb, a, lda, A_log, dt_bias, S, S, NULL, M, Hk, Hv, Dk, Dv, o, stream);
}

extern "C" int tdm_gdn_recur_verify(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                    const float *A_log, const float *dt_bias, const float *S, int M, int Hk, int Hv, int Dk,
                                    int Dv, uint16_t *o, void *stream)
{
    return recur_launch("tdm_gdn_recur_verify", qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, NULL, M, Hk, Hv, Dk, Dv, o,
                        stream);
}

extern "C" int tdm_gdn_recur_tree(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                                  const float *A_log, const float *dt_bias, const float *S, const int32_t *parent, int M,
                                  int Hk, int Hv, int Dk, int Dv, uint16_t *o, void *stream)
{
    if (!parent) return tdm_errf("tdm_gdn_recur_tree: parent is NULL");
    return recur_launch("tdm_gdn_recur_tree", qkv, b, ldb, a, lda, A_log, dt_bias, S, NULL, parent, M, Hk, Hv, Dk, Dv, o,
                        stream);
}

extern "C" int64_t tdm_gdn_recur_bytes(int M, int Hk, int Hv, int Dk, int Dv)
{
    // the conv output (q, k, v), b and a in; o out; the state read and written; A_log, dt_bias
    const int64_t C = 2LL * Hk * Dk + (int64_t)Hv * Dv;
    return (int64_t)M * (C * 2 + (int64_t)Hv * 4 + (int64_t)Hv * Dv * 2) + (int64_t)Hv * Dk * Dv * 8 + (int64_t)Hv * 8;
}
