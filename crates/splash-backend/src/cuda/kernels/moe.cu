// Mixture of experts on the device (few tokens: decode, verify blocks, batched passes). Pair
// p = t·k + j is token t's j-th expert (k: top_k, or top_k + 1 with the shared expert routed as
// a pair, see moe_route); the expert products are gemv_tc_experts_* (gemv_tc.cu).

// The router, a warp a token (E ≤ 1024 experts; lane l holds experts l, l + 32, ...): softmax
// over the token's logits, its top_k most probable experts (ties: the lower index first), their
// probabilities renormalised to sum 1, summed in that order (as ffn.rs::route). A warp a token
// keeps the pick in registers and shuffles: no block-wide round or global-memory pass between
// the softmax, the top_k and the renormalisation.
// Threads of a moe_route block (a thread an expert, so that a block can group the pairs, see
// group_pairs), the tokens a block routes, the most experts a token keeps (lane j keeps pick j),
// the experts a lane holds (of at most a thread's worth).
#define MOE_ROUTE_THREADS 1024
#define MOE_ROUTE_TOKENS (MOE_ROUTE_THREADS / 32)
#define MOE_TOP_K_MAX 32
#define MOE_LANE_EXPERTS (MOE_ROUTE_THREADS / 32)

// Token's logits l [E] → its top_k (≤ MOE_TOP_K_MAX) (expert, weight) pairs at out_i, out_w, by
// one warp whose lanes hold up to SLOTS experts each (route_token picks the fewest that hold E):
// the loops over a lane's experts are unrolled, so slots past E would still cost instructions
// in each of the top_k rounds.
// Returns lane j's pick j (j < top_k).
template <int SLOTS>
static __device__ int route_token_in(const float* l, int E, int top_k, int* out_i, float* out_w) {
    int lane = threadIdx.x & 31, n = (E + 31) >> 5;
    // p[k]: expert lane + 32k's logit, then its probability; −inf past the last expert. The
    // warp-uniform k < n skips the slots no lane holds (E = 200: 7 of 8).
    float p[SLOTS];
    float m = NEG_INF;
#pragma unroll
    for (int k = 0; k < SLOTS; k++) {
        p[k] = k < n && lane + 32 * k < E ? l[lane + 32 * k] : NEG_INF;
        m = fmaxf(m, p[k]);
    }
    m = warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < SLOTS; k++)
        if (k < n && lane + 32 * k < E) {
            p[k] = expf(p[k] - m);
            s += p[k];
        }
    s = warp_sum(s);
#pragma unroll
    for (int k = 0; k < SLOTS; k++)
        if (k < n && lane + 32 * k < E) p[k] /= s;
    // Pick j: each lane's best (its lowest expert on ties), then the warp's (the lowest expert on
    // ties); its lane marks it taken, lane j keeps it. A mask, not p[k] = −inf: that store's
    // slot is known at run time only, and nvcc then keeps p in local memory.
    float kept_v = 0.0f;
    int kept_i = 0;
    unsigned taken = 0;
    for (int j = 0; j < top_k; j++) {
        float bv = NEG_INF;
        int bk = 0;
#pragma unroll
        for (int k = 0; k < SLOTS; k++)
            if (k < n && !(taken >> k & 1) && p[k] > bv) {
                bv = p[k];
                bk = k;
            }
        int bi = lane + 32 * bk;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == j) {
            kept_v = bv;
            kept_i = bi;
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < top_k; j++) sum += __shfl_sync(0xffffffffu, kept_v, j);
    if (lane < top_k) {
        out_i[lane] = kept_i;
        out_w[lane] = kept_v / sum;
    }
    return kept_i;
}

// route_token_in with the fewest slots a lane that hold E experts (a warp-uniform choice).
static __device__ int route_token(const float* l, int E, int top_k, int* out_i, float* out_w) {
    int n = (E + 31) >> 5;
    if (n <= 1) return route_token_in<1>(l, E, top_k, out_i, out_w);
    if (n <= 2) return route_token_in<2>(l, E, top_k, out_i, out_w);
    if (n <= 4) return route_token_in<4>(l, E, top_k, out_i, out_w);
    if (n <= 8) return route_token_in<8>(l, E, top_k, out_i, out_w);
    if (n <= 16) return route_token_in<16>(l, E, top_k, out_i, out_w);
    return route_token_in<MOE_LANE_EXPERTS>(l, E, top_k, out_i, out_w);
}

// The pairs of up to 32 (lane p holds pair p's expert `id`; lanes past `pairs` hold none)
// grouped as group_pairs groups them, by the warp alone: a pair's place in `order` is the
// count of pairs before it by (expert, pair); the first pair of each expert writes its slot.
static __device__ void group_pairs_warp(int id, int pairs, int slots, int* active, int* offsets, int* order) {
    int lane = threadIdx.x & 31;
    if (lane >= pairs) id = 0x7fffffff;
    int rank = 0;
    bool first = lane < pairs;
    for (int o = 0; o < 32; o++) {
        int other = __shfl_sync(0xffffffffu, id, o);
        bool same_before = other == id && o < lane;
        rank += other < id || same_before;
        first = first && !same_before;
    }
    // The slot: the experts below this one (each counted at its first pair), and all of them.
    int slot = 0, used = 0;
    for (int o = 0; o < 32; o++) {
        int other = __shfl_sync(0xffffffffu, id, o), other_first = __shfl_sync(0xffffffffu, (int)first, o);
        used += other_first;
        slot += other_first && other < id;
    }
    if (lane < pairs) order[rank] = lane;
    if (first) {
        active[slot] = id;
        offsets[slot] = rank;
    }
    if (lane == 0) offsets[used] = pairs;
    for (int i = used + lane; i < slots; i += 32) {
        active[i] = -1;
        offsets[i + 1] = pairs;
    }
}

// Token t's pairs at ids, weights [t · per ..] by one warp: with shared_gate the shared expert
// first (expert E, weight sigmoid(shared_gate[t])), then its top_k routed ones (route_token).
// Returns lane j's routed pick j (j < top_k).
static __device__ int route_token_pairs(const float* logits, int t, int* ids, float* weights, int E, int top_k,
                                        const float* shared_gate, int per) {
    int* out_i = ids + (long)t * per;
    float* out_w = weights + (long)t * per;
    if (shared_gate) {
        if ((threadIdx.x & 31) == 0) {
            out_i[0] = E;
            out_w[0] = sigmoid(shared_gate[t]);
        }
        out_i++;
        out_w++;
    }
    return route_token(logits + (long)t * E, E, top_k, out_i, out_w);
}

static __device__ void group_pairs(const int* ids, int pairs, int E, int slots, int* active, int* offsets,
                                   int* order);

// ids, weights [tokens, top_k]; MOE_ROUTE_TOKENS tokens a block.
// With shared_gate, the shared expert is one more pair of every token, its first: expert E with
// weight sigmoid(shared_gate[t]), so that the grouped products run it with the routed experts
// (ids, weights [tokens, top_k + 1]).
// With `done` (a counter at 0, left at 0), the block also groups the pairs (group_pairs, up to
// 1,024 pairs), the last to finish when there are several: routing and grouping in one launch.
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)
    moe_route(const float* logits, int tokens, int* ids, float* weights, int E, int top_k, const float* shared_gate,
              int* done, int slots, int* active, int* offsets, int* order) {
    GRID_PROLOGUE();
    int per = shared_gate ? top_k + 1 : top_k;
    if (blockDim.x == 32) {
        // Up to 32 pairs (a decode step's): one warp routes the tokens in turn, each lane
        // keeping its pair's expert, then groups them; no block barrier and no pair read back.
        int lane = threadIdx.x & 31, id = 0;
        for (int t = 0; t < tokens; t++) {
            int pick = route_token_pairs(logits, t, ids, weights, E, top_k, shared_gate, per);
            int j = lane - t * per - (shared_gate ? 1 : 0);  // this lane's pair's pick of token t
            int from = __shfl_sync(0xffffffffu, pick, j & 31);
            if (lane >= t * per && lane < (t + 1) * per) id = j < 0 ? E : from;
        }
        if (done) group_pairs_warp(id, tokens * per, slots, active, offsets, order);
        return;
    }
    int t = blockIdx.x * MOE_ROUTE_TOKENS + (threadIdx.x >> 5);
    if (t < tokens) route_token_pairs(logits, t, ids, weights, E, top_k, shared_gate, per);
    if (!done) return;
    if (gridDim.x > 1) {
        // Every block's pairs are visible to every block before it is counted.
        __shared__ int last;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(done, 1) == (int)gridDim.x - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
    } else {
        __syncthreads();
    }
    group_pairs(ids, tokens * per, shared_gate ? E + 1 : E, slots, active, offsets, order);
    if (threadIdx.x == 0 && gridDim.x > 1) *done = 0;
}

// The slots of a MoE layer's active experts, from thread e's count c of expert e's pairs (one
// block, a thread an expert, E ≤ 1024): the active experts in increasing order (active[a]; -1
// after the last, up to `slots`), offsets[a], offsets[a + 1] bounding their pairs in `order`.
// Returns where expert e's pairs start.
static __device__ int group_slots(int c, int E, int slots, int* active, int* offsets) {
    __shared__ int warp_pairs[32], warp_active[32], total[2];
    int e = threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Exclusive scans over the experts of the pair counts (where an expert's pairs start) and of
    // the active flags (its slot).
    int on = c > 0, cs = c, os = on;
    for (int o = 1; o < 32; o <<= 1) {
        int uc = __shfl_up_sync(0xffffffffu, cs, o), uo = __shfl_up_sync(0xffffffffu, os, o);
        if (lane >= o) {
            cs += uc;
            os += uo;
        }
    }
    if (lane == 31) {
        warp_pairs[warp] = cs;
        warp_active[warp] = os;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        int wc = lane < nw ? warp_pairs[lane] : 0, wo = lane < nw ? warp_active[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int uc = __shfl_up_sync(0xffffffffu, wc, o), uo = __shfl_up_sync(0xffffffffu, wo, o);
            if (lane >= o) {
                wc += uc;
                wo += uo;
            }
        }
        if (lane < nw) {
            warp_pairs[lane] = wc;  // inclusive: the pairs and active experts up to warp `lane`
            warp_active[lane] = wo;
        }
        if (lane == nw - 1) {
            total[0] = wc;
            total[1] = wo;
        }
    }
    __syncthreads();
    int before_p = cs - c + (warp > 0 ? warp_pairs[warp - 1] : 0);
    int before_a = os - on + (warp > 0 ? warp_active[warp - 1] : 0);
    if (on) {
        active[before_a] = e;
        offsets[before_a] = before_p;
    }
    // After the last active expert: -1 up to `slots`, each bounding no pairs.
    int used = total[1], all = total[0];
    if (threadIdx.x == 0) offsets[used] = all;
    for (int i = used + threadIdx.x; i < slots; i += blockDim.x) {
        active[i] = -1;
        offsets[i + 1] = all;
    }
    return before_p;
}

// The pairs of a MoE layer grouped by expert for gemv_tc_experts: the slots (group_slots) and
// in `order` each expert's pairs in increasing order. One block of 1,024 threads (moe_route's
// last), E ≤ 1024; for up to 1,024 pairs (decode steps, verify blocks, short passes:
// ops::moe_route gives longer passes moe_group_counts, moe_group_slots and moe_group_scatter).
// The ids are read past L1: other blocks of the launch wrote them.
static __device__ void group_pairs(const int* ids, int pairs, int E, int slots, int* active, int* offsets,
                                   int* order) {
    __shared__ int count[1024];
    int e = threadIdx.x;
    if (e < E) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[__ldcg(ids + p)], 1);
    __syncthreads();
    int c = e < E ? count[e] : 0, on = c > 0;
    int before_p = group_slots(c, E, slots, active, offsets);
    // Each active expert's thread lists its pairs in order, over the pairs staged a block at a
    // time in shared memory: O(pairs) a thread (counting each pair's earlier ones was
    // O(pairs²) over the block, a 2,048-token prefill chunk's 16,384 pairs included).
    __shared__ int stage[1024];
    int next = before_p;
    for (int p0 = 0; p0 < pairs; p0 += blockDim.x) {
        int n = min((int)blockDim.x, pairs - p0);
        __syncthreads();
        if (threadIdx.x < n) stage[threadIdx.x] = __ldcg(ids + p0 + threadIdx.x);
        __syncthreads();
        if (on)
            for (int i = 0; i < n; i++)
                if (stage[i] == e) order[next++] = p0 + i;
    }
}

// group_pairs in a launch of its own (after moe_route without its counter).
extern "C" __global__ void moe_group(const int* ids, int pairs, int E, int slots, int* active, int* offsets,
                                     int* order) {
    GRID_PROLOGUE();
    group_pairs(ids, pairs, E, slots, active, offsets, order);
}

// A prefill pass's grouping (group_pairs' result for thousands of pairs, over many blocks), in
// three launches: each chunk of MOE_GROUP_CHUNK pairs counts its pairs per expert into
// counts [chunks, E]; one block sums them, writes the slots and turns counts into each chunk's
// first position per expert; each chunk writes its pairs there in order.
#define MOE_GROUP_CHUNK 256

extern "C" __global__ void moe_group_counts(const int* ids, int pairs, int E, int* counts) {
    GRID_PROLOGUE();
    __shared__ int hist[1024];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    int p = blockIdx.x * MOE_GROUP_CHUNK + threadIdx.x;
    if (threadIdx.x < MOE_GROUP_CHUNK && p < pairs) atomicAdd(&hist[ids[p]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) counts[(long)blockIdx.x * E + e] = hist[e];
}

// One block of 1,024 threads, a thread an expert.
extern "C" __global__ void moe_group_slots(int* counts, int chunks, int E, int slots, int* active, int* offsets) {
    GRID_PROLOGUE();
    int e = threadIdx.x, c = 0;
    if (e < E)
        for (int i = 0; i < chunks; i++) {
            int n = counts[(long)i * E + e];
            counts[(long)i * E + e] = c;
            c += n;
        }
    int start = group_slots(c, E, slots, active, offsets);
    if (e < E)
        for (int i = 0; i < chunks; i++) counts[(long)i * E + e] += start;
}

// A block a chunk, MOE_GROUP_CHUNK threads: a pair's place is its chunk's first for its expert
// plus the chunk's earlier pairs of that expert.
extern "C" __global__ void moe_group_scatter(const int* ids, int pairs, int E, const int* counts, int* order) {
    GRID_PROLOGUE();
    __shared__ int stage[MOE_GROUP_CHUNK];
    int p0 = blockIdx.x * MOE_GROUP_CHUNK, t = threadIdx.x, n = min(MOE_GROUP_CHUNK, pairs - p0);
    if (t < n) stage[t] = ids[p0 + t];
    __syncthreads();
    if (t >= n) return;
    int id = stage[t], rank = 0;
    for (int i = 0; i < t; i++) rank += stage[i] == id;
    order[counts[(long)blockIdx.x * E + id] + rank] = p0 + t;
}

// out[t, :] = out[t, :] · sigmoid(gate[t]) + Σ_j w[t, j] · y[t·k + j, :], the experts added in
// order j; without a gate, the sum alone (out is not read: the shared expert is one of the
// pairs, see moe_route).
extern "C" __global__ void moe_combine(const float* y, const float* w, float* out, const float* gate, int top_k,
                                       int d) {
    GRID_PROLOGUE();
    // Block (t, c) takes values c·blockDim.x .. of token t: one value a thread, so the top_k
    // loads of each are in flight together (a block a token walked its values in turn).
    int chunks = (d + blockDim.x - 1) / blockDim.x;
    long t = blockIdx.x / chunks;
    // The shared expert's gate first, as scale_rows_sigmoid applies it.
    float s = gate ? sigmoid(gate[t]) : 1.0f;
    int i0 = blockIdx.x % chunks * blockDim.x;
    for (int i = i0 + threadIdx.x; i < min(d, i0 + (int)blockDim.x); i += blockDim.x)
        out[t * d + i] = pair_sum(y, w, top_k, t, d, i, gate ? out[t * d + i] * s : 0.0f);
}
