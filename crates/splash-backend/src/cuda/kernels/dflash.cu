// The DFlash2 draft's own op.

// DFlash2's grouped dynamic causal conv inside one block (CPU twin: cpu::grouped_dynamic_conv):
// out[t, c] = Σ_{o<K, o≤t} (base[o, c] + dyn[t·stride + o·G + c/group]) · x[t−o, c], G = H/group,
// summed from o = 0 up as the CPU does. `dyn` rows are `stride` apart: the kernel projection
// writes both sides of a sublayer side by side. One thread per (t, c); out must not alias x.
extern "C" __global__ void grouped_dynamic_conv(const float* x, const float* dyn, long stride, const float* base,
                                                float* out, int T, int H, int K, int group) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)T * H) return;
    int t = (int)(i / H), c = (int)(i % H), G = H / group;
    float acc = 0.0f;
    for (int o = 0; o < K && o <= t; o++)
        acc += (base[o * H + c] + dyn[t * stride + o * G + c / group]) * x[(long)(t - o) * H + c];
    out[i] = acc;
}
