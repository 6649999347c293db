//! Every kernel's parameters, declared once. From the declarations below come the typed
//! launchers the ops call ([`launch`]: device addresses as `u64`, scalars as their C types,
//! the slot tables by value), the function types the host emulator calls (`host`, tests only),
//! and a C++ check, compiled with the kernels by the host emulator's build, that every
//! declaration has exactly the kernel's parameter types (`cpp_checks`).
//!
//! A `family` is a set of kernels with one signature, picked by name at run time (the weight
//! format's variant, a token count); its launcher takes the name and checks it is one of the
//! family's in debug builds.

#![allow(clippy::too_many_arguments)]

use std::ffi::c_void;

use super::{Arg, AttnSlots, Gpu, GpuError, Kernels, LayerSlots, ProductGroup, SeqSlots};

/// A kernel parameter type: what the launcher takes for it, and its C spelling.
pub(crate) trait Param {
    /// What the launcher takes (a device address for pointers).
    type Launch;
    /// The type as the kernel source spells it.
    #[cfg_attr(not(test), allow(dead_code))]
    const C: &'static str;
    /// The launch argument.
    fn arg(value: Self::Launch) -> Arg;
}

macro_rules! pointer_params {
    ($($t:ty => $c:literal),* $(,)?) => {$(
        impl Param for $t {
            type Launch = u64;
            const C: &'static str = $c;
            fn arg(value: u64) -> Arg {
                Arg::Ptr(value)
            }
        }
    )*};
}

pointer_params! {
    *const f32 => "const float*",
    *mut f32 => "float*",
    *const u8 => "const u8*",
    *mut u8 => "u8*",
    *const u16 => "const u16*",
    *mut u16 => "u16*",
    *const i8 => "const i8*",
    *mut i8 => "i8*",
    *const i16 => "const short*",
    *mut i16 => "short*",
    *const i32 => "const int*",
    *mut i32 => "int*",
    *const u64 => "const u64*",
    *mut c_void => "void*",
}

macro_rules! value_params {
    ($($t:ty => $c:literal, $arg:expr),* $(,)?) => {$(
        impl Param for $t {
            type Launch = $t;
            const C: &'static str = $c;
            fn arg(value: $t) -> Arg {
                $arg(value)
            }
        }
    )*};
}

value_params! {
    i32 => "int", Arg::I32,
    i64 => "long", Arg::I64,
    f32 => "float", Arg::F32,
    SeqSlots => "SeqSlots", |v| Arg::Seqs(Box::new(v)),
    LayerSlots => "LayerSlots", |v| Arg::Layers(Box::new(v)),
    AttnSlots => "AttnSlots", |v| Arg::Attn(Box::new(v)),
    ProductGroup => "ProductGroup", |v| Arg::Group(Box::new(v)),
}

macro_rules! kernels {
    ($(
        $(#[$doc:meta])*
        $kind:ident $name:ident $([$($variant:literal),* $(,)?])? ( $($p:ident : $t:ty),* $(,)? );
    )*) => {
        /// The kernels' launchers: `grid` blocks of `threads` threads on `gpu`'s stream, from
        /// `kernels` (the module compiled for the model's dimensions).
        pub(crate) mod launch {
            use super::*;
            $( kernels!(@launcher $(#[$doc])* $kind $name $([$($variant),*])? ($($p : $t),*)); )*
        }

        /// The kernels' function types in the host emulator's library (not every kernel has a
        /// host test yet).
        #[cfg(test)]
        #[allow(non_camel_case_types, dead_code)]
        pub(crate) mod host {
            use super::*;
            $( pub(crate) type $name = unsafe extern "C" fn($($t),*); )*
        }

        /// C++ that fails to compile unless every kernel has the parameter types declared here
        /// (appended to the kernel source by the host emulator's build).
        #[cfg(test)]
        pub(crate) fn cpp_checks() -> String {
            let mut out = String::from("#include <type_traits>\n");
            $(
                let names: &[&str] = kernels!(@names $name $([$($variant),*])?);
                let params: &[&str] = &[$(<$t as Param>::C),*];
                for name in names {
                    out += &format!(
                        "static_assert(std::is_same_v<decltype(&{name}), void (*)({})>, \"kernel {name}: its parameters differ from cuda/signatures.rs\");\n",
                        params.join(", ")
                    );
                }
            )*
            out
        }
    };
    (@names $name:ident) => { &[stringify!($name)] };
    (@names $name:ident [$($variant:literal),*]) => { &[$($variant),*] };
    (@launcher $(#[$doc:meta])* kernel $name:ident ($($p:ident : $t:ty),*)) => {
        $(#[$doc])*
        pub(crate) fn $name(
            gpu: &Gpu,
            kernels: &Kernels,
            (grid, threads): (u32, u32),
            $($p: <$t as Param>::Launch),*
        ) -> Result<(), GpuError> {
            let args = [$(<$t as Param>::arg($p)),*];
            // SAFETY: the arguments follow the kernel's declaration; the addresses are the
            // caller's to get right (the ops own the buffers and check the shapes).
            unsafe { gpu.launch(kernels, stringify!($name), grid, threads, &args) }
        }
    };
    (@launcher $(#[$doc:meta])* family $name:ident [$($variant:literal),*] ($($p:ident : $t:ty),*)) => {
        $(#[$doc])*
        pub(crate) fn $name(
            gpu: &Gpu,
            kernels: &Kernels,
            kernel: &str,
            (grid, threads): (u32, u32),
            $($p: <$t as Param>::Launch),*
        ) -> Result<(), GpuError> {
            debug_assert!(
                [$($variant),*].contains(&kernel),
                "{kernel} is not a kernel of the {} family", stringify!($name)
            );
            let args = [$(<$t as Param>::arg($p)),*];
            // SAFETY: as for a single kernel, and `kernel` is one of the family's.
            unsafe { gpu.launch(kernels, kernel, grid, threads, &args) }
        }
    };
}

kernels! {
    // kernels/norm.cu
    kernel rms_norm(x: *const f32, w: *const f32, out: *mut f32, d: i32, eps: f32);
    kernel add_rms_norm(x: *mut f32, y: *const f32, w: *const f32, out: *mut f32, d: i32, eps: f32, pw: *const f32, per: i32);
    kernel add_rms_norm_to_f16_tc(x: *mut f32, y: *const f32, w: *const f32, out: *mut f32, xh: *mut u16, xscale: *mut f32, d: i32, eps: f32, xq: *mut i8, xd: *mut f32, xs: *mut f32, bq: *mut i8, bd: *mut f32, bs: *mut i16, pw: *const f32, per: i32);
    kernel add_rms_norm_to_bf16(x: *mut f32, y: *const f32, w: *const f32, out: *mut f32, ob: *mut u16, d: i32, eps: f32, pw: *const f32, per: i32);
    kernel rms_norm_gated(x: *const f32, z: *const f32, w: *const f32, out: *mut f32, rows: i32, d: i32, eps: f32);
    kernel rms_norm_gated_to_bf16(x: *const f32, z: *const f32, w: *const f32, out: *mut f32, ob: *mut u16, rows: i32, d: i32, eps: f32);
    kernel rms_norm_gated_to_f16_tc(x: *const f32, z: *const f32, w: *const f32, out: *mut f32, xh: *mut u16, xscale: *mut f32, d: i32, eps: f32, blocks: i64, bq: *mut i8, bd: *mut f32, bs: *mut i16, nb: i32);
    kernel add_in_place(x: *mut f32, y: *const f32, n: i64);
    kernel silu_mul(g: *mut f32, u: *const f32, n: i64);
    kernel scale_rows_sigmoid(x: *mut f32, g: *const f32, d: i32);
    kernel gather_rows(x: *const f32, idx: *const i32, out: *mut f32, d: i32);
    kernel scatter_add_rows(y: *const f32, idx: *const i32, w: *const f32, out: *mut f32, d: i32);
    // kernels/rope.cu
    kernel split_q_gate(qg: *const f32, q: *mut f32, gate: *mut f32, d: i32);
    kernel split_q_gate_qk_norm(qg: *const f32, q: *mut f32, gate: *mut f32, k: *mut f32, wq: *const f32, wk: *const f32, d: i32, eps: f32, q_rows: i32);
    kernel rope(x: *mut f32, inv_freq: *const f32, heads: i32, d: i32, rot: i32, pos0: i32, pos_at: *const i32);
    kernel rope_seqs(q: *mut f32, k: *mut f32, inv_freq: *const f32, hq: i32, hkv: i32, d: i32, rot: i32, s: AttnSlots, per: i32);
    kernel rope_table(q: *mut f32, k: *mut f32, inv_freq: *const f32, table: *const f32, hq: i32, hkv: i32, d: i32, rot: i32);
    // kernels/attention.cu
    kernel kv_append(x: *const f32, cache: *mut u8, scales: *mut f32, fmt: i32, d: i32, hkv: i32, pos0: i32, pos_at: *const i32);
    kernel kv_append_seqs(k: *const f32, v: *const f32, fmt: i32, d: i32, hkv: i32, s: AttnSlots, per: i32);
    kernel attention(q: *const f32, kc: *const u8, ks: *const f32, vc: *const u8, vs: *const f32, out: *mut f32, fmt: i32, hq: i32, hkv: i32, pos0: i32, pos_at: *const i32, scale: f32, block: i32, window: i32, hb: i32);
    /// Split decode attention, one head a block (`attention_part`) or grouped heads.
    family attention_part ["attention_part", "attention_part_grouped"](q: *const f32, kc: *const u8, ks: *const f32, vc: *const u8, vs: *const f32, part: *mut f32, fmt: i32, hq: i32, hkv: i32, pos0: i32, pos_at: *const i32, scale: f32, block: i32, window: i32, nchunks: i32, hb: i32);
    /// attention_part over several sequences' caches, one head a block or grouped.
    family attention_part_seqs ["attention_part_seqs", "attention_part_seqs_grouped"](q: *const f32, part: *mut f32, fmt: i32, hq: i32, hkv: i32, scale: f32, s: AttnSlots, rows: i32, nchunks: i32, hb: i32);
    /// Split decode attention over an int8 cache, its keys staged in shared memory, up to 8
    /// heads a block (head dims that are multiples of 128).
    kernel attention_part_staged(q: *const f32, kc: *const u8, ks: *const f32, vc: *const u8, vs: *const f32, part: *mut f32, hq: i32, hkv: i32, pos0: i32, pos_at: *const i32, scale: f32, block: i32, window: i32, nchunks: i32, hb: i32);
    /// attention_part_staged over several sequences' caches.
    kernel attention_part_seqs_staged(q: *const f32, part: *mut f32, hq: i32, hkv: i32, scale: f32, s: AttnSlots, rows: i32, nchunks: i32, hb: i32);
    kernel attention_combine(part: *const f32, out: *mut f32, nchunks: i32);
    kernel attention_combine_seqs(part: *const f32, out: *mut f32, hq: i32, s: AttnSlots, rows: i32, nchunks: i32);
    kernel sigmoid_gate(x: *mut f32, gate: *const f32, n: i64);
    kernel sigmoid_gate_to_f16_tc(x: *mut f32, gate: *const f32, xh: *mut u16, xscale: *mut f32, blocks: i64, bq: *mut i8, bd: *mut f32, bs: *mut i16, nb: i32);
    /// The flash prefill attention (`attention_prefill`), and the one that copies each int8
    /// tile ahead (`attention_prefill_async`).
    family attention_prefill ["attention_prefill", "attention_prefill_async"](q: *const f32, kc: *const u8, ks: *const f32, vc: *const u8, vs: *const f32, out: *mut f32, fmt: i32, hq: i32, hkv: i32, pos0: i32, pos_at: *const i32, scale: f32, block: i32, window: i32, t: i32, chunk: i32, nchunks: i32, part: *mut f32);
    // kernels/gdn.cu
    kernel conv1d_silu(x: *const f32, y: *mut f32, state: *mut f32, w: *const f32, t: i32, c: i32, k: i32);
    kernel conv1d_silu_seqs(x: *const f32, y: *mut f32, seqs: SeqSlots, w: *const f32, per: i32, c: i32, k: i32);
    kernel gdn_gates(b: *mut f32, a: *mut f32, dt_bias: *const f32, neg_a: *const f32, hv: i32, n: i64);
    kernel gdn_recurrent(mixed: *const f32, g: *const f32, beta: *const f32, state: *mut f32, out: *mut f32, t: i32, hk: i32, hv: i32, tiled: i32);
    kernel gdn_recurrent_seqs(mixed: *const f32, g: *const f32, beta: *const f32, seqs: SeqSlots, out: *mut f32, hk: i32, hv: i32, tiled: i32, dt_bias: *const f32, neg_a: *const f32);
    kernel conv1d_silu_replay(layers: LayerSlots, per: i32, t: i32, c: i32, k: i32);
    kernel gdn_recurrent_replay(layers: LayerSlots, t: i32, hk: i32, hv: i32, tiled: i32);
    // kernels/gdn_chunked.cu
    kernel gdn_chunk_prep(mixed: *const f32, g: *const f32, beta: *const f32, scratch: *mut f32, t: i32, hk: i32, hv: i32, tiled: i32);
    kernel gdn_chunk_scan(mixed: *const f32, scratch: *const f32, state: *mut f32, out: *mut f32, t: i32, hk: i32, hv: i32, tiled: i32);
    // kernels/gemv.cu
    /// The float and quantised GEMV of each weight format: `gemv_*` up to 8 tokens a block, `gemv1_*` one.
    family gemv ["gemv_f32", "gemv_f16", "gemv_bf16", "gemv_q4_0", "gemv_q4_1", "gemv_q5_0", "gemv_q5_1", "gemv_q8_0", "gemv_q2_k", "gemv_q3_k", "gemv_q4_k", "gemv_q5_k", "gemv_q6_k", "gemv_iq4_nl", "gemv_iq4_xs", "gemv_affine4", "gemv_affine8", "gemv1_f32", "gemv1_f16", "gemv1_bf16", "gemv1_q4_0", "gemv1_q4_1", "gemv1_q5_0", "gemv1_q5_1", "gemv1_q8_0", "gemv1_q2_k", "gemv1_q3_k", "gemv1_q4_k", "gemv1_q5_k", "gemv1_q6_k", "gemv1_iq4_nl", "gemv1_iq4_xs", "gemv1_affine4", "gemv1_affine8"](w: *const u8, row_bytes: i64, scales: *const f32, biases: *const f32, group: i32, x: *const f32, y: *mut f32, y2: *mut f32, n: i32, k: i32, t: i32, split: i32, rows1: i32);
    /// A weight dequantised to bf16 or f32 rows (`out`), for the cuBLAS prefill.
    family dequant ["dequant_bf16_f32", "dequant_bf16_f16", "dequant_bf16_bf16", "dequant_bf16_q4_0", "dequant_bf16_q4_1", "dequant_bf16_q5_0", "dequant_bf16_q5_1", "dequant_bf16_q8_0", "dequant_bf16_q2_k", "dequant_bf16_q3_k", "dequant_bf16_q4_k", "dequant_bf16_q5_k", "dequant_bf16_q6_k", "dequant_bf16_iq4_nl", "dequant_bf16_iq4_xs", "dequant_bf16_affine4", "dequant_bf16_affine8", "dequant_f32_f32", "dequant_f32_f16", "dequant_f32_bf16", "dequant_f32_q4_0", "dequant_f32_q4_1", "dequant_f32_q5_0", "dequant_f32_q5_1", "dequant_f32_q8_0", "dequant_f32_q2_k", "dequant_f32_q3_k", "dequant_f32_q4_k", "dequant_f32_q5_k", "dequant_f32_q6_k", "dequant_f32_iq4_nl", "dequant_f32_iq4_xs", "dequant_f32_affine4", "dequant_f32_affine8"](w: *const u8, row_bytes: i64, scales: *const f32, biases: *const f32, group: i32, out: *mut c_void, n: i32, k: i32);
    kernel quantize_q8(x: *const f32, xq: *mut i8, xd: *mut f32, xs: *mut f32, blocks: i64);
    kernel silu_mul_to_q8(g: *const f32, u: *const f32, xq: *mut i8, xd: *mut f32, xs: *mut f32, blocks: i64);
    /// The GEMV over int8 activations (`quantize_q8`).
    family gemv_q8 ["gemv_q8_q5_k", "gemv_q8_q8_0", "gemv1_q8_q5_k", "gemv1_q8_q8_0"](w: *const u8, row_bytes: i64, xq: *const i8, xd: *const f32, xs: *const f32, y: *mut f32, y2: *mut f32, n: i32, k: i32, t: i32, split: i32, rows1: i32);
    // kernels/gemv_tc.cu
    kernel gemv_tc_fixup(partials: *const f32, y: *mut f32, y2: *mut f32, split: i32, n: i32, k: i32, t: i32, grid: i32, max_pieces: i32);
    /// The tensor-core GEMV: up to 8 (`gemv_tc8_*`) or 16 (`gemv_tc16_*`) tokens, a tile per block.
    family gemv_tc ["gemv_tc8_q4_k", "gemv_tc8_q6_k", "gemv_tc16_q4_k", "gemv_tc16_q6_k"](w: *const u8, row_bytes: i64, xh: *const u16, xscale: *const f32, y: *mut f32, y2: *mut f32, split: i32, n: i32, k: i32, t: i32);
    /// The int8 GEMV of the tiled formats: up to 1, 2, 4, 8 (`gemv{n}_q8t_*`) or 16 (`gemv_q8t_*`) tokens, a tile per block.
    family gemv_q8t ["gemv_q8t_q4_k", "gemv_q8t_q6_k", "gemv1_q8t_q4_k", "gemv1_q8t_q6_k", "gemv2_q8t_q4_k", "gemv2_q8t_q6_k", "gemv4_q8t_q4_k", "gemv4_q8t_q6_k", "gemv8_q8t_q4_k", "gemv8_q8t_q6_k"](w: *const u8, row_bytes: i64, xq: *const i8, xd: *const f32, xs: *const f32, y: *mut f32, y2: *mut f32, split: i32, n: i32, k: i32, t: i32);
    /// The int8 tensor-core GEMV of Q4_K and Q6_K tiles: one token by dp4a with its bits (`gemv1_i8tc_*`), up to 8 (`gemv8_i8tc_*`) or 16 tokens.
    family gemv_i8tc ["gemv1_i8tc_q4_k", "gemv8_i8tc_q4_k", "gemv_i8tc_q4_k", "gemv1_i8tc_q6_k", "gemv8_i8tc_q6_k", "gemv_i8tc_q6_k"](w: *const u8, row_bytes: i64, xq: *const i8, xd: *const f32, xs: *const i16, y: *mut f32, y2: *mut f32, split: i32, n: i32, k: i32, t: i32);
    family gemv_group ["gemv1_group", "gemv8_group", "gemv_group"](g: ProductGroup, bq: *const i8, bd: *const f32, bs: *const i16, xq: *const i8, xd: *const f32, xs: *const f32, k: i32, t: i32);
    /// Activations for `gemv_i8tc`: int8 per 256 values in its order, a scale a block, sums per 32.
    kernel quantize_q8_blocks(x: *const f32, xq: *mut i8, xd: *mut f32, xs: *mut i16, blocks: i64, nb: i32);
    /// `quantize_q8_blocks` of `silu(g) · u`.
    kernel silu_mul_to_q8_blocks(g: *const f32, u: *const f32, xq: *mut i8, xd: *mut f32, xs: *mut i16, blocks: i64, nb: i32);
    /// The tensor-core GEMV stream-K, partial sums in `partials` (`gemv_tc_fixup`).
    family gemv_tcs ["gemv_tcs8_q4_k", "gemv_tcs8_q6_k", "gemv_tcs16_q4_k", "gemv_tcs16_q6_k"](w: *const u8, row_bytes: i64, xh: *const u16, xscale: *const f32, y: *mut f32, y2: *mut f32, split: i32, n: i32, k: i32, t: i32, partials: *mut f32, max_pieces: i32);
    kernel to_f16_tc(x: *const f32, xh: *mut u16, xscale: *mut f32, blocks: i64);
    kernel silu_mul_to_f16_tc(g: *const f32, u: *const f32, xh: *mut u16, xscale: *mut f32, blocks: i64);
    kernel to_bf16(x: *const f32, out: *mut u16, n: i64);
    kernel silu_mul_to_bf16(g: *const f32, u: *const f32, out: *mut u16, n: i64);
    /// The grouped expert products: decode's tensor-core GEMV (`gemv_tc_experts_*`; `*8_*`,
    /// 8 pairs at a time, for one token) and the prefill GEMM (`gemm_tc_experts_*`).
    family experts ["gemv_tc_experts_q4_k", "gemv_tc_experts_q6_k", "gemv_tc_experts8_q4_k", "gemv_tc_experts8_q6_k", "gemm_tc_experts_q4_k", "gemm_tc_experts_q6_k"](table: *const u64, y: *mut f32, table_b: *const u64, y_b: *mut f32, active: *const i32, offsets: *const i32, order: *const i32, row_bytes: i64, xh: *const u16, xscale: *const f32, n: i32, k: i32, col_div: i32, chains: i32);
    // kernels/moe.cu
    kernel moe_route(logits: *const f32, tokens: i32, ids: *mut i32, weights: *mut f32, e: i32, top_k: i32, shared_gate: *const f32, done: *mut i32, slots: i32, active: *mut i32, offsets: *mut i32, order: *mut i32);
    kernel moe_group(ids: *const i32, pairs: i32, e: i32, slots: i32, active: *mut i32, offsets: *mut i32, order: *mut i32);
    kernel moe_group_counts(ids: *const i32, pairs: i32, e: i32, counts: *mut i32);
    kernel moe_group_slots(counts: *mut i32, chunks: i32, e: i32, slots: i32, active: *mut i32, offsets: *mut i32);
    kernel moe_group_scatter(ids: *const i32, pairs: i32, e: i32, counts: *const i32, order: *mut i32);
    kernel moe_combine(y: *const f32, w: *const f32, out: *mut f32, gate: *const f32, top_k: i32, d: i32);
    // kernels/dflash.cu
    kernel grouped_dynamic_conv(x: *const f32, dynamic: *const f32, stride: i64, base: *const f32, out: *mut f32, t: i32, h: i32, k: i32, group: i32);
    // kernels/vision.cu
    kernel layer_norm(x: *const f32, w: *const f32, b: *const f32, out: *mut f32, d: i32, eps: f32);
    kernel bias_act(y: *mut f32, b: *const f32, residual: *mut f32, rows: i32, cols: i32, act: i32);
    kernel add_position_taps(x: *mut f32, table: *const f32, taps: *const i32, weights: *const f32, d: i32);
    kernel vision_qkv(qkv: *const f32, cos_t: *const f32, sin_t: *const f32, q: *mut u16, k: *mut u16, v: *mut u16, n: i32, heads: i32, hd: i32, hdp: i32, scale: f32);
    /// The vision tower's attention, one kernel per head dim padded to a multiple of 16.
    family vision_attention ["vision_attention_16", "vision_attention_32", "vision_attention_48", "vision_attention_64", "vision_attention_80", "vision_attention_96", "vision_attention_128", "vision_attention_16x2", "vision_attention_32x2", "vision_attention_48x2", "vision_attention_64x2", "vision_attention_80x2"](q: *const u16, k: *const u16, v: *const u16, out: *mut f32, n: i32, heads: i32, hd: i32);
    // kernels/sampling.cu
    kernel top_k_part(logits: *const f32, v: i32, k: i32, mult: f32, cap: f32, parts: i32, ids: *mut i32, vals: *mut f32);
    kernel top_k_merge(ids_in: *const i32, vals_in: *const f32, n_in: i32, k: i32, ids: *mut i32, vals: *mut f32);
}
