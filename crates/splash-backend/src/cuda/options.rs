//! The CUDA backend's options: how it runs and which kernel variants it takes, parsed and
//! validated once (from the `SPLASH_*` variables by [`GpuOptions::from_env`], or set by a test
//! or bench) and then held by the [`Gpu`](super::Gpu). Kernels and ops read them from there,
//! never from the environment. The defaults are the measured best on the H200
//! (BENCHMARKS.md); the rest exist to measure against them.

use super::PrefillExperts;

/// How the CUDA backend runs. [`Default`] is what `splash` runs with when no variable is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuOptions {
    /// Replay passes of a few tokens from captured CUDA graphs (`SPLASH_CUDA_GRAPHS`, on).
    pub graphs: bool,
    /// Synchronise and time every launch, for `splash bench`'s table (`SPLASH_GPU_PROFILE`,
    /// off). Launches then cannot be captured: graphs are off with it.
    pub profile: bool,
    /// Let a kernel start while the one before it finishes, on Hopper and later
    /// (`SPLASH_DEPENDENT_LAUNCH`: `late`, the default, or `1`; `early` for
    /// [`KernelOptions::trigger_early`], `bridge` for [`KernelOptions::bridge_early`]; `0`:
    /// off).
    pub dependent_launch: bool,
    /// Allocate the buffers of a capture from a pool of their own, so that a graph's kernels
    /// follow each other without memory nodes between them (`SPLASH_CAPTURE_POOL`, on).
    pub capture_pool: bool,
    /// Split tensor-core GEMVs stream-K over the SMs (`SPLASH_STREAM_K`, off: on the H200 it
    /// was faster only for the one-token 27B Q4_K down product and the 16-token Q6_K one).
    pub stream_k: bool,
    /// The GEMV family of the tiled formats (Q4_K, Q6_K) (`SPLASH_TILED_GEMV`). A GPU runs one
    /// family for every token count, so tokens keep their bits in any batch.
    pub tiled_gemv: TiledGemv,
    /// Blocks per SM of a stream-K launch (`SPLASH_STREAM_K_BLOCKS`, 1..=8, 4: 128 registers
    /// a thread fit four).
    pub stream_k_blocks_per_sm: usize,
    /// Long passes over an int8 cache take `attention_prefill_async`, which copies each tile
    /// while computing on the one before (`SPLASH_FLASH_ASYNC`, on; the same bits).
    pub flash_async: bool,
    /// Prefill chunks of more than 16 tokens scan GDN in the chunked form
    /// (`SPLASH_GDN_CHUNKED`, off: slower than the per-token scan on the H200).
    pub gdn_chunked: bool,
    /// The grouped expert kernel of prefill passes (`SPLASH_PREFILL_EXPERTS`, `gemm`).
    pub prefill_experts: PrefillExperts,
    /// Decode and verify attention over an int8 cache stages each tile of keys in shared memory
    /// for all the query heads of a block (`SPLASH_STAGED_ATTENTION`, on; `0`: the warp-per-key
    /// kernels).
    pub staged_attention: bool,
    /// A MoE layer's shared expert runs as one more pair of each token in the routed experts'
    /// grouped products (`SPLASH_SHARED_EXPERT_GROUPED`, on), where its shape and formats are
    /// theirs: three launches fewer a layer in decode and verify passes.
    pub shared_expert_grouped: bool,
    /// The products of one input in one launch where their kernels allow
    /// (`SPLASH_PRODUCT_GROUPS`, on; see `ops::matmul_group`): a GDN layer's b and a beside its
    /// q/k/v/z, an attention layer's k and v beside its q.
    pub product_groups: bool,
    /// Tiles of 16 queries each warp of the vision tower's attention takes, 1 or 2
    /// (`SPLASH_VISION_QUERY_TILES`, 2: 1.24× faster at 4 Mpx on the H200); 2 only for head
    /// dims up to 80.
    pub vision_query_tiles: usize,
    /// Small launches of a decode step folded into their neighbours, the same bits
    /// (`SPLASH_FOLD_LAUNCHES`, on): the GDN scan makes its gates from the raw `a`, `b` (no
    /// `gdn_gates`); the GDN output norm and the attention output gate write the f16 input of
    /// the tensor-core GEMV after them (no `to_f16_tc`); the norm before a GDN layer writes the
    /// int8 input of its b and a product too (no `quantize_q8`); the attention's query / gate
    /// split and its q and k norms are one launch. Three launches fewer per layer of either kind.
    pub fold_launches: bool,
    /// A MoE layer's small launches folded too, the same bits (`SPLASH_FOLD_MOE`, on): where its
    /// shared expert is one of the grouped pairs, the norm before it writes the experts' f16
    /// input (no `to_f16_tc`), the routing's last block groups the pairs (no `moe_group`) and
    /// the residual add after it sums the pairs (no `moe_combine`). Three launches fewer a MoE
    /// layer.
    pub fold_moe: bool,
    /// The grouped expert GEMV's build of up to 8 pairs at a time for one-token passes
    /// (`SPLASH_NARROW_EXPERTS`, on): the same bits as the 16-pair build, fewer registers
    /// (Q4_K: 135 without spills against 128 with about 200 bytes spilled; Q6_K: 162 against
    /// 238). Passes of several tokens take the 16-pair build, faster there.
    pub narrow_experts: bool,
    /// Warps per 16-row tile of every tensor-core GEMV, 1..=8 (`None`: by shape). The kernel
    /// bench's sweep; no variable.
    pub tensor_core_warps: Option<usize>,
    /// Warps per block of every grouped expert product, 1..=8 (`None`: by size). The kernel
    /// bench's sweep; no variable.
    pub expert_warps: Option<usize>,
    /// What is compiled into the kernels.
    pub kernels: KernelOptions,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            graphs: true,
            profile: false,
            dependent_launch: true,
            capture_pool: true,
            stream_k: false,
            tiled_gemv: TiledGemv::Int8Mma,
            stream_k_blocks_per_sm: 4,
            flash_async: true,
            staged_attention: true,
            shared_expert_grouped: true,
            product_groups: true,
            gdn_chunked: false,
            prefill_experts: PrefillExperts::Gemm,
            vision_query_tiles: 2,
            fold_launches: true,
            fold_moe: true,
            narrow_experts: true,
            tensor_core_warps: None,
            expert_warps: None,
            kernels: KernelOptions::default(),
        }
    }
}

/// The GEMV family of the tiled formats (`SPLASH_TILED_GEMV`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TiledGemv {
    /// f16 activations on the f16 tensor cores (`tensor-cores`).
    TensorCores,
    /// int8 activations per 32 values by dp4a (`int8`): faster for one token, slower for many.
    Int8,
    /// Q4_K and Q6_K: int8 activations per 256 values on the int8 tensor cores, integer sums
    /// until one f32 step a block (`int8-mma`, the default).
    Int8Mma,
    /// Q4_K as `int8-mma`, Q6_K on the f16 tensor cores (`int8-mma-q4k`, the default of
    /// 2026-12-06).
    Int8MmaQ4K,
}

impl TiledGemv {
    /// Every family, in the order the error message lists them.
    pub const ALL: [TiledGemv; 4] = [
        Self::TensorCores,
        Self::Int8,
        Self::Int8Mma,
        Self::Int8MmaQ4K,
    ];

    /// The value of `SPLASH_TILED_GEMV` that picks it.
    pub fn name(self) -> &'static str {
        match self {
            Self::TensorCores => "tensor-cores",
            Self::Int8 => "int8",
            Self::Int8Mma => "int8-mma",
            Self::Int8MmaQ4K => "int8-mma-q4k",
        }
    }
}

/// Options compiled into the kernels as constants: part of a compiled module's key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KernelOptions {
    /// Lanes sharing a column of the GDN scan's state, 4, 8 or 16 (`SPLASH_GDN_SLICES`;
    /// `None`: 8 for key dims from 32 on, 4 below).
    pub gdn_slices: Option<usize>,
    /// A kernel lets the next one launch as it starts rather than once its wait for the one
    /// before is over (`SPLASH_DEPENDENT_LAUNCH=early`; see GRID_PROLOGUE in common.cuh).
    pub trigger_early: bool,
    /// The small kernels between two products (norms, input conversions) let the next one
    /// launch as they start, the others after their wait (`SPLASH_DEPENDENT_LAUNCH=bridge`; see
    /// GRID_PROLOGUE_BRIDGE in common.cuh).
    pub bridge_early: bool,
    /// Weight tiles the tensor-core GEMV prefetches into L2 ahead, 0..=16
    /// (`SPLASH_GEMV_L2_AHEAD`; `None`: the kernel's default).
    pub l2_ahead: Option<u32>,
    /// Register cap of the grouped expert kernels, 64..=255 (`SPLASH_EXPERT_REGS`; `None`: the
    /// kernel's default per format).
    pub expert_regs: Option<u32>,
    /// Register cap of the int8 tensor-core GEMV's 8-token build, 64..=255
    /// (`SPLASH_INT8_MMA_REGS`; `None`: the kernel's default).
    pub int8_mma_regs: Option<u32>,
    /// Register cap of the int8 tensor-core GEMV's 16-token build and of the product groups of
    /// 9 to 16 tokens, 64..=255 (`SPLASH_INT8_MMA16_REGS`; `None`: the kernels' default).
    pub int8_mma16_regs: Option<u32>,
    /// Most query heads of one KV head a decode-attention block of a several-row pass takes,
    /// sharing each key it loads, 1..=4 (`SPLASH_ATTENTION_HEADS`; `None`: 4).
    pub attention_heads: Option<u32>,
    /// Keys per chunk of the split decode attention, a multiple of 32 from 64 to 1,024
    /// (`SPLASH_ATTENTION_CHUNK`; `None`: [`ATTN_CHUNK`](crate::cuda::ops::ATTN_CHUNK)). Fewer
    /// keys make more blocks, each walking fewer tiles one after another; every pass of a
    /// model runs with the same chunks, so a verify row keeps the bits of decoding.
    pub attention_chunk: Option<u32>,
    /// Every block records its launch at its wait (`SPLASH_TIMELINE`, off; TIMELINE in
    /// common.cuh), for [`Gpu::timeline`](crate::cuda::Gpu::timeline): the launches of a pass as
    /// they ran. A measurement build: the records cost each block a few instructions and a store.
    pub timeline: bool,
}

impl KernelOptions {
    /// Lanes sharing a GDN state column for key dim `dk`: as set, else 8 from 32 on, 4 below.
    pub fn gdn_slices(&self, dk: usize) -> usize {
        self.gdn_slices.unwrap_or(if dk >= 32 { 8 } else { 4 })
    }

    /// Most query heads a decode-attention block takes (`ATTN_HEADS_MAX`).
    pub fn attention_heads(&self) -> usize {
        self.attention_heads.unwrap_or(4) as usize
    }

    /// Keys per chunk of the split decode attention (`ATTN_CHUNK`).
    pub fn attention_chunk(&self) -> usize {
        self.attention_chunk
            .map_or(crate::cuda::ops::ATTN_CHUNK, |c| c as usize)
    }

    /// Whether these options fit a model whose GDN key dim is `dk`.
    pub(crate) fn check(&self, dk: usize) -> Result<(), String> {
        match self.gdn_slices {
            Some(s) if !dk.is_multiple_of(4 * s) => Err(format!(
                "SPLASH_GDN_SLICES={s} needs a GDN key head dim divisible by {}; this model's is {dk} (unset it, or use {})",
                4 * s,
                [4, 8, 16]
                    .into_iter()
                    .filter(|s| dk.is_multiple_of(4 * s))
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )),
            _ => Ok(()),
        }
    }
}

impl GpuOptions {
    /// The options the `SPLASH_*` variables set; an error names the variable, its value and
    /// the values it takes.
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables (`var(name)`: its value).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let d = Self::default();
        let flag = |name: &str, default: bool| match var(name).as_deref() {
            None | Some("") => Ok(default),
            Some("1") => Ok(true),
            Some("0") => Ok(false),
            Some(v) => Err(format!("{name}={v}: expected 1 (on) or 0 (off)")),
        };
        let number =
            |name: &str, range: std::ops::RangeInclusive<usize>| -> Result<Option<usize>, String> {
                match var(name).as_deref() {
                    None | Some("") => Ok(None),
                    Some(v) => match v.parse::<usize>() {
                        Ok(n) if range.contains(&n) => Ok(Some(n)),
                        _ => Err(format!(
                            "{name}={v}: expected a whole number from {} to {}",
                            range.start(),
                            range.end()
                        )),
                    },
                }
            };
        let (dependent_launch, trigger_early, bridge_early) =
            match var("SPLASH_DEPENDENT_LAUNCH").as_deref() {
                None | Some("") | Some("1") | Some("late") => (true, false, false),
                Some("0") => (false, false, false),
                Some("early") => (true, true, false),
                Some("bridge") => (true, false, true),
                Some(v) => return Err(format!(
                    "SPLASH_DEPENDENT_LAUNCH={v}: expected late (the default; also 1), early, bridge or 0 (off)"
                )),
            };
        let prefill_experts = match var("SPLASH_PREFILL_EXPERTS").as_deref() {
            None | Some("") => d.prefill_experts,
            Some(v) => PrefillExperts::ALL
                .into_iter()
                .find(|k| k.name() == v)
                .ok_or_else(|| {
                    let names: Vec<_> = PrefillExperts::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "SPLASH_PREFILL_EXPERTS={v}: expected {}",
                        names.join(" or ")
                    )
                })?,
        };
        let gdn_slices = match number("SPLASH_GDN_SLICES", 4..=16)? {
            Some(s) if ![4, 8, 16].contains(&s) => {
                return Err(format!("SPLASH_GDN_SLICES={s}: expected 4, 8 or 16"))
            }
            s => s,
        };
        let tiled_gemv = match var("SPLASH_TILED_GEMV").as_deref() {
            None | Some("") => d.tiled_gemv,
            Some(v) => TiledGemv::ALL
                .into_iter()
                .find(|k| k.name() == v)
                .ok_or_else(|| {
                    let names: Vec<_> = TiledGemv::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "SPLASH_TILED_GEMV={v}: expected one of {} (default {})",
                        names.join(", "),
                        d.tiled_gemv.name()
                    )
                })?,
        };
        let profile = flag("SPLASH_GPU_PROFILE", false)?;
        Ok(Self {
            graphs: flag("SPLASH_CUDA_GRAPHS", d.graphs)?,
            profile,
            dependent_launch,
            capture_pool: flag("SPLASH_CAPTURE_POOL", d.capture_pool)?,
            stream_k: flag("SPLASH_STREAM_K", d.stream_k)?,
            tiled_gemv,
            stream_k_blocks_per_sm: number("SPLASH_STREAM_K_BLOCKS", 1..=8)?
                .unwrap_or(d.stream_k_blocks_per_sm),
            flash_async: flag("SPLASH_FLASH_ASYNC", d.flash_async)?,
            staged_attention: flag("SPLASH_STAGED_ATTENTION", d.staged_attention)?,
            shared_expert_grouped: flag("SPLASH_SHARED_EXPERT_GROUPED", d.shared_expert_grouped)?,
            product_groups: flag("SPLASH_PRODUCT_GROUPS", d.product_groups)?,
            gdn_chunked: flag("SPLASH_GDN_CHUNKED", d.gdn_chunked)?,
            prefill_experts,
            vision_query_tiles: number("SPLASH_VISION_QUERY_TILES", 1..=2)?
                .unwrap_or(d.vision_query_tiles),
            fold_launches: flag("SPLASH_FOLD_LAUNCHES", d.fold_launches)?,
            fold_moe: flag("SPLASH_FOLD_MOE", d.fold_moe)?,
            narrow_experts: flag("SPLASH_NARROW_EXPERTS", d.narrow_experts)?,
            tensor_core_warps: None,
            expert_warps: None,
            kernels: KernelOptions {
                gdn_slices,
                trigger_early,
                bridge_early,
                l2_ahead: number("SPLASH_GEMV_L2_AHEAD", 0..=16)?.map(|n| n as u32),
                expert_regs: number("SPLASH_EXPERT_REGS", 64..=255)?.map(|n| n as u32),
                int8_mma_regs: number("SPLASH_INT8_MMA_REGS", 64..=255)?.map(|n| n as u32),
                int8_mma16_regs: number("SPLASH_INT8_MMA16_REGS", 64..=255)?.map(|n| n as u32),
                attention_heads: number("SPLASH_ATTENTION_HEADS", 1..=4)?.map(|n| n as u32),
                attention_chunk: match number("SPLASH_ATTENTION_CHUNK", 64..=1024)? {
                    Some(c) if c % 32 != 0 => {
                        return Err(format!(
                            "SPLASH_ATTENTION_CHUNK={c}: expected a multiple of 32 (the staged attention's tile of keys)"
                        ))
                    }
                    c => c.map(|c| c as u32),
                },
                timeline: flag("SPLASH_TIMELINE", false)?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<GpuOptions, String> {
        GpuOptions::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn no_variables_give_the_defaults() {
        assert_eq!(parse(&[]).unwrap(), GpuOptions::default());
        assert_eq!(
            parse(&[("SPLASH_STREAM_K", "")]).unwrap(),
            GpuOptions::default()
        );
    }

    #[test]
    fn variables_set_their_options() {
        let o = parse(&[
            ("SPLASH_CUDA_GRAPHS", "0"),
            ("SPLASH_GPU_PROFILE", "1"),
            ("SPLASH_DEPENDENT_LAUNCH", "early"),
            ("SPLASH_CAPTURE_POOL", "0"),
            ("SPLASH_STREAM_K", "1"),
            ("SPLASH_STREAM_K_BLOCKS", "3"),
            ("SPLASH_FLASH_ASYNC", "0"),
            ("SPLASH_STAGED_ATTENTION", "0"),
            ("SPLASH_GDN_CHUNKED", "1"),
            ("SPLASH_PREFILL_EXPERTS", "gemv"),
            ("SPLASH_GDN_SLICES", "16"),
            ("SPLASH_GEMV_L2_AHEAD", "2"),
            ("SPLASH_EXPERT_REGS", "96"),
            ("SPLASH_INT8_MMA_REGS", "128"),
            ("SPLASH_INT8_MMA16_REGS", "128"),
            ("SPLASH_VISION_QUERY_TILES", "1"),
            ("SPLASH_FOLD_LAUNCHES", "0"),
            ("SPLASH_ATTENTION_HEADS", "1"),
            ("SPLASH_ATTENTION_CHUNK", "64"),
            ("SPLASH_TILED_GEMV", "tensor-cores"),
            ("SPLASH_SHARED_EXPERT_GROUPED", "0"),
            ("SPLASH_TIMELINE", "1"),
        ])
        .unwrap();
        assert!(!o.fold_launches && !o.capture_pool && !o.shared_expert_grouped);
        assert_eq!(o.tiled_gemv, TiledGemv::TensorCores);
        assert!(!o.graphs && o.profile && o.dependent_launch && o.stream_k);
        assert_eq!(o.vision_query_tiles, 1);
        assert_eq!(o.stream_k_blocks_per_sm, 3);
        assert!(!o.flash_async && !o.staged_attention && o.gdn_chunked);
        assert_eq!(o.prefill_experts, PrefillExperts::Gemv);
        assert_eq!(
            o.kernels,
            KernelOptions {
                gdn_slices: Some(16),
                trigger_early: true,
                bridge_early: false,
                l2_ahead: Some(2),
                expert_regs: Some(96),
                int8_mma_regs: Some(128),
                int8_mma16_regs: Some(128),
                attention_heads: Some(1),
                attention_chunk: Some(64),
                timeline: true,
            }
        );
        assert!(
            !parse(&[("SPLASH_DEPENDENT_LAUNCH", "0")])
                .unwrap()
                .dependent_launch
        );
        let bridge = parse(&[("SPLASH_DEPENDENT_LAUNCH", "bridge")]).unwrap();
        assert!(bridge.dependent_launch && bridge.kernels.bridge_early);
        assert!(!bridge.kernels.trigger_early);
    }

    #[test]
    fn bad_values_are_errors_that_name_the_valid_ones() {
        for (var, value, expected) in [
            ("SPLASH_CUDA_GRAPHS", "off", "expected 1 (on) or 0 (off)"),
            ("SPLASH_PREFILL_EXPERTS", "fast", "expected gemm or gemv"),
            (
                "SPLASH_DEPENDENT_LAUNCH",
                "soon",
                "expected late (the default; also 1), early, bridge or 0 (off)",
            ),
            ("SPLASH_GDN_SLICES", "6", "expected 4, 8 or 16"),
            ("SPLASH_STREAM_K_BLOCKS", "9", "from 1 to 8"),
            ("SPLASH_EXPERT_REGS", "lots", "from 64 to 255"),
            ("SPLASH_VISION_QUERY_TILES", "4", "from 1 to 2"),
            ("SPLASH_ATTENTION_HEADS", "6", "from 1 to 4"),
            ("SPLASH_ATTENTION_CHUNK", "32", "from 64 to 1024"),
            ("SPLASH_ATTENTION_CHUNK", "100", "a multiple of 32"),
            (
                "SPLASH_TILED_GEMV",
                "dp4a",
                "expected one of tensor-cores, int8, int8-mma, int8-mma-q4k (default int8-mma)",
            ),
        ] {
            let err = parse(&[(var, value)]).unwrap_err();
            assert!(err.contains(&format!("{var}={value}")), "{err}");
            assert!(err.contains(expected), "{err}");
        }
    }

    #[test]
    fn gdn_slices_must_split_the_key_dim() {
        let k = KernelOptions {
            gdn_slices: Some(16),
            ..Default::default()
        };
        assert!(k.check(128).is_ok());
        let err = k.check(32).unwrap_err();
        assert!(
            err.contains("divisible by 64") && err.contains("use 4 or 8"),
            "{err}"
        );
        assert_eq!(KernelOptions::default().gdn_slices(128), 8);
        assert_eq!(KernelOptions::default().gdn_slices(16), 4);
    }
}
