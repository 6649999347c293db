//! NVRTC compilation of the kernels (`kernels/`) for one set of model dimensions, cached on
//! disk by the hash of source, dimensions and target architecture.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::{GpuError, KernelOptions};

/// The compile-time dimensions of a kernel module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelDims {
    /// Attention head dim.
    pub head_dim: usize,
    /// Gated DeltaNet key head dim.
    pub gdn_dk: usize,
    /// Gated DeltaNet value head dim (threads per block of the recurrent kernel, ≤ 1024).
    pub gdn_dv: usize,
}

/// The kernel sources (`kernels/`), in the order they compile as one unit: each file may use
/// what the earlier ones define.
const KERNEL_FILES: [(&str, &str); 13] = [
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("quant.cuh", include_str!("kernels/quant.cuh")),
    ("gemv.cu", include_str!("kernels/gemv.cu")),
    ("gemv_tc.cu", include_str!("kernels/gemv_tc.cu")),
    ("norm.cu", include_str!("kernels/norm.cu")),
    ("moe.cu", include_str!("kernels/moe.cu")),
    ("rope.cu", include_str!("kernels/rope.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("dflash.cu", include_str!("kernels/dflash.cu")),
    ("sampling.cu", include_str!("kernels/sampling.cu")),
    ("gdn.cu", include_str!("kernels/gdn.cu")),
    ("gdn_chunked.cu", include_str!("kernels/gdn_chunked.cu")),
    ("vision.cu", include_str!("kernels/vision.cu")),
];

/// The CUDA source of every kernel: the files of [`KERNEL_FILES`] one after the other, each
/// under a `#line` directive so that compiler messages name the file and line.
pub(crate) fn kernel_source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| {
        KERNEL_FILES
            .iter()
            .map(|(name, text)| format!("#line 1 \"kernels/{name}\"\n{text}"))
            .collect()
    })
}

/// The PTX target for a GPU of compute capability `major.minor` (PTX: the driver compiles it
/// for the exact chip at load).
pub(crate) fn arch_for(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, _) => "compute_100",
        (12, _) => "compute_120",
        (m, _) if m > 12 => "compute_120",
        _ => "compute_75",
    }
}

/// PTX of the kernels for `dims`, `options` and `arch`, from the cache directory or freshly
/// compiled.
pub fn compile_ptx(
    dims: KernelDims,
    options: &KernelOptions,
    arch: &'static str,
) -> Result<String, GpuError> {
    if dims.head_dim == 0 || dims.head_dim > 1024 || dims.gdn_dv == 0 || dims.gdn_dv > 1024 {
        return Err(GpuError::Unsupported(format!(
            "the CUDA kernels need an attention head dim and a GDN value head dim of 1..1024 (got {dims:?})"
        )));
    }
    let mut defines = vec![
        format!("-DHEAD_DIM={}", dims.head_dim),
        format!("-DGDN_DK={}", dims.gdn_dk),
        format!("-DGDN_DV={}", dims.gdn_dv),
        format!("-DGDN_SLICES={}", options.gdn_slices(dims.gdn_dk)),
    ];
    // Measurement options (GRID_PROLOGUE and TIMELINE in kernels/common.cuh, TC_L2_AHEAD,
    // EXPERT_REGS, I8TC8_REGS and I8TC16_REGS in kernels/gemv_tc.cu, ATTN_HEADS_MAX and
    // ATTN_CHUNK in kernels/attention.cu).
    if options.trigger_early {
        defines.push("-DGRID_TRIGGER_EARLY".into());
    }
    if options.bridge_early {
        defines.push("-DGRID_BRIDGE_EARLY".into());
    }
    if options.timeline {
        defines.push("-DTIMELINE".into());
    }
    if let Some(ahead) = options.l2_ahead {
        defines.push(format!("-DTC_L2_AHEAD={ahead}"));
    }
    defines.push(format!("-DATTN_HEADS_MAX={}", options.attention_heads()));
    if let Some(chunk) = options.attention_chunk {
        defines.push(format!("-DATTN_CHUNK={chunk}"));
    }
    if let Some(regs) = options.expert_regs {
        defines.push(format!("-DEXPERT_REGS={regs}"));
    }
    if let Some(regs) = options.int8_mma_regs {
        defines.push(format!("-DI8TC8_REGS={regs}"));
    }
    if let Some(regs) = options.int8_mma16_regs {
        defines.push(format!("-DI8TC16_REGS={regs}"));
    }
    let mut h = Sha256::new();
    h.update(kernel_source().as_bytes());
    h.update(defines.join(" ").as_bytes());
    h.update(arch.as_bytes());
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let cached = cache_dir().map(|d| d.join(format!("{key}.ptx")));
    if let Some(path) = &cached {
        if let Ok(ptx) = std::fs::read_to_string(path) {
            return Ok(ptx);
        }
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: defines,
        name: Some("splash_kernels.cu".into()),
        ..Default::default()
    };
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::Compile(
            "the NVRTC library (libnvrtc.so) cannot be loaded: install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc` and put its lib directory on LD_LIBRARY_PATH".into(),
        ));
    }
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(kernel_source(), opts)
        .map_err(|e| GpuError::Compile(format!("{e:?}")))?
        .to_src();
    if let Some(path) = &cached {
        // Written under a temporary name and renamed: a reader never sees half a file.
        if let Some(dir) = path.parent() {
            let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
            if std::fs::create_dir_all(dir).is_ok() && std::fs::write(&tmp, &ptx).is_ok() {
                let _ = std::fs::rename(&tmp, path);
            }
        }
    }
    Ok(ptx)
}

/// `SPLASH_KERNEL_CACHE`, else `$XDG_CACHE_HOME/splash/kernels`, else `~/.cache/splash/kernels`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("SPLASH_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("splash").join("kernels"))
}
