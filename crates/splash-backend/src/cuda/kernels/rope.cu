// Gated attention, before the attention itself: the query / gate split and partial RoPE.

// The q_proj output is per head [q(D) | gate(D)]: split it into q [rows, D] and gate [rows, D].
extern "C" __global__ void split_q_gate(const float* qg, float* q, float* gate, int d) {
    GRID_PROLOGUE();
    long r = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        q[r * d + i] = qg[r * 2 * d + i];
        gate[r * d + i] = qg[r * 2 * d + d + i];
    }
}

// split_q_gate, then rms_norm of the q rows (weight wq) and of the key rows k in place (weight
// wk), in one launch with the bits of the three: blocks below q_rows take a query head row each
// (its q read straight from qg), the others a key head row each. Block size: rms_norm's.
extern "C" __global__ void split_q_gate_qk_norm(const float* qg, float* q, float* gate, float* k, const float* wq,
                                                const float* wk, int d, float eps, int q_rows) {
    GRID_PROLOGUE();
    long r = blockIdx.x;
    if (r >= q_rows) {
        float* kr = k + (r - q_rows) * d;
        rms_norm_row(kr, wk, kr, d, eps);
        return;
    }
    rms_norm_row(qg + r * 2 * d, wq, q + r * d, d, eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) gate[r * d + i] = qg[r * 2 * d + d + i];
}

// A pass's first position: pos0, plus the int at pos_at when it is set (a captured graph
// replayed at many positions reads it from there).
__device__ __forceinline__ int position(int pos0, const int* pos_at) { return pos_at ? pos0 + *pos_at : pos0; }

// Turns the pair (h[j], h[j + half]) by `angle`.
__device__ __forceinline__ void rope_turn(float* h, int j, int half, float angle) {
    float c = cosf(angle), s = sinf(angle);
    float a = h[j], b = h[j + half];
    h[j] = a * c - b * s;
    h[j + half] = b * c + a * s;
}

// Partial NeoX RoPE on x [T, heads, d]: dim j < rot/2 pairs with j + rot/2. One block per
// (token, head).
__device__ __forceinline__ void rope_row(float* h, const float* inv_freq, int rot, int pos) {
    int half = rot / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) rope_turn(h, j, half, (float)pos * inv_freq[j]);
}

// RoPE of one sequence's query rows q [T, hq, d] and key rows k [T, hkv, d] with a position per
// row and frequency, table [T, rot/2]: interleaved M-RoPE rows of an image, and text after an
// image, whose rotary position is not its cache row. One block per (row, head).
extern "C" __global__ void rope_table(float* q, float* k, const float* inv_freq, const float* table, int hq,
                                      int hkv, int d, int rot) {
    GRID_PROLOGUE();
    int heads = hq + hkv, t = blockIdx.x / heads, h = blockIdx.x % heads, half = rot / 2;
    float* x = h < hq ? q + ((long)t * hq + h) * d : k + ((long)t * hkv + h - hq) * d;
    const float* p = table + (long)t * half;
    for (int j = threadIdx.x; j < half; j += blockDim.x) rope_turn(x, j, half, p[j] * inv_freq[j]);
}

extern "C" __global__ void rope(float* x, const float* inv_freq, int heads, int d, int rot, int pos0,
                                const int* pos_at) {
    GRID_PROLOGUE();
    int t = blockIdx.x / heads;
    rope_row(x + (long)blockIdx.x * d, inv_freq, rot, position(pos0, pos_at) + t);
}

// Up to ATTN_SLOTS sequences of an attention layer's pass, by value in a kernel's parameters (a
// captured graph keeps them): sequence i has rows off[i] .. off[i] + n[i] - 1 of the pass, its
// first position pos0[i] (plus *pos_at[i] when that is not null, see `position`) and its caches
// kc/ks (keys, int8 scales) and vc/vs (values).
#define ATTN_SLOTS 16
struct AttnSlots {
    u64 kc[ATTN_SLOTS], ks[ATTN_SLOTS], vc[ATTN_SLOTS], vs[ATTN_SLOTS], pos_at[ATTN_SLOTS];
    int pos0[ATTN_SLOTS], off[ATTN_SLOTS], n[ATTN_SLOTS];
};

__device__ __forceinline__ int slot_position(const AttnSlots& s, int i) {
    return position(s.pos0[i], (const int*)s.pos_at[i]);
}

// RoPE of every sequence's query rows q [T, hq, d] and key rows k [T, hkv, d] at its own
// positions: `per` = (hq + hkv) · its most tokens blocks a sequence, one per (token, head).
extern "C" __global__ void rope_seqs(float* q, float* k, const float* inv_freq, int hq, int hkv, int d, int rot,
                                     AttnSlots s, int per) {
    GRID_PROLOGUE();
    int i = blockIdx.x / per, b = blockIdx.x % per, heads = hq + hkv;
    int t = b / heads, h = b % heads;
    if (t >= s.n[i]) return;
    long row = s.off[i] + t;
    float* x = h < hq ? q + (row * hq + h) * d : k + (row * hkv + h - hq) * d;
    rope_row(x, inv_freq, rot, slot_position(s, i) + t);
}
