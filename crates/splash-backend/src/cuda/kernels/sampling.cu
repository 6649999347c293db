// Sampling on the device: the best k entries of each row of logits.

// The k best entries of each row of logits [R, V] (value descending, id ascending on ties),
// after a draft's shaping: v·mult, then cap·tanh(v/cap) when cap > 0. Writes ids [R, k] and
// values [R, k], best first: what DFlash2's candidate selector walks (and with k = 1 a greedy
// pass's argmax), without the row leaving the GPU. Two stages: blocks of TOPK_THREADS over
// TOPK_CHUNK values of a row, then (for rows of several chunks) one block per row over the
// chunks' candidates. In a block each thread keeps the best k of its entries, then k rounds
// pick the block's best head and its owner pops it. k ≤ TOPK_MAX ≤ V.
#define TOPK_MAX 32
#define TOPK_THREADS 256
#define TOPK_PER_THREAD 8
#define TOPK_CHUNK (TOPK_THREADS * TOPK_PER_THREAD)
__device__ __forceinline__ bool topk_better(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// Inserts (v, id) into a thread's list of its best n ≤ k entries, best first.
__device__ __forceinline__ void topk_insert(float* bv, int* bi, int& n, int k, float v, int id) {
    if (n == k && !topk_better(v, id, bv[k - 1], bi[k - 1])) return;
    int j = n < k ? n : k - 1;
    while (j > 0 && topk_better(v, id, bv[j - 1], bi[j - 1])) {
        bv[j] = bv[j - 1];
        bi[j] = bi[j - 1];
        j--;
    }
    bv[j] = v;
    bi[j] = id;
    if (n < k) n++;
}

// The block's best k of its threads' lists into ids / vals [k], best first; a slot no thread
// filled gets (-inf, INT_MAX), which loses to every entry of a later merge.
__device__ void topk_block_merge(const float* bv, const int* bi, int n, int k, int* ids, float* vals) {
    __shared__ float sv[TOPK_THREADS];
    __shared__ int si[TOPK_THREADS], sowner[TOPK_THREADS];
    int head = 0, t = threadIdx.x;
    for (int r = 0; r < k; r++) {
        bool has = head < n;
        sv[t] = has ? bv[head] : NEG_INF;
        si[t] = has ? bi[head] : 0x7fffffff;
        sowner[t] = t;
        __syncthreads();
        for (int s = TOPK_THREADS / 2; s > 0; s >>= 1) {
            if (t < s && topk_better(sv[t + s], si[t + s], sv[t], si[t])) {
                sv[t] = sv[t + s];
                si[t] = si[t + s];
                sowner[t] = sowner[t + s];
            }
            __syncthreads();
        }
        if (t == 0) {
            ids[r] = si[0];
            vals[r] = sv[0];
        }
        if (sowner[0] == t) head++;
        __syncthreads();
    }
}

// First stage of a row top-k: block (row, part) keeps the best k of values
// part·TOPK_CHUNK .. (part + 1)·TOPK_CHUNK of its row (after v·mult and the softcap) in
// ids / vals [rows, parts, k]. A thread's TOPK_PER_THREAD values are loaded before any is
// compared: one block walking a 248,320-value row load by load took half a millisecond.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    top_k_part(const float* logits, int V, int k, float mult, float cap, int parts, int* ids, float* vals) {
    GRID_PROLOGUE();
    int row = blockIdx.x / parts, part = blockIdx.x % parts;
    const float* x = logits + (long)row * V;
    int c0 = part * TOPK_CHUNK + threadIdx.x;
    float v[TOPK_PER_THREAD];
#pragma unroll
    for (int j = 0; j < TOPK_PER_THREAD; j++) {
        int i = c0 + j * TOPK_THREADS;
        v[j] = i < V ? x[i] : 0.0f;
    }
    float bv[TOPK_MAX];
    int bi[TOPK_MAX];
    int n = 0;
    // Ids come ascending: an entry equal to the worst kept loses the tie.
#pragma unroll
    for (int j = 0; j < TOPK_PER_THREAD; j++) {
        int i = c0 + j * TOPK_THREADS;
        if (i >= V) break;
        float y = v[j] * mult;
        if (cap > 0.0f) y = tanhf(y / cap) * cap;
        topk_insert(bv, bi, n, k, y, i);
    }
    long out = (long)blockIdx.x * k;
    topk_block_merge(bv, bi, n, k, ids + out, vals + out);
}

// Second stage: each row's best k of its parts' candidates [rows, n, k] (n = parts · k).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    top_k_merge(const int* ids_in, const float* vals_in, int n_in, int k, int* ids, float* vals) {
    GRID_PROLOGUE();
    long base = (long)blockIdx.x * n_in;
    float bv[TOPK_MAX];
    int bi[TOPK_MAX];
    int n = 0;
    for (int i = threadIdx.x; i < n_in; i += TOPK_THREADS) topk_insert(bv, bi, n, k, vals_in[base + i], ids_in[base + i]);
    long out = (long)blockIdx.x * k;
    topk_block_merge(bv, bi, n, k, ids + out, vals + out);
}
