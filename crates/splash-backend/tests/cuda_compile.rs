//! Every CUDA kernel compiles with NVRTC for the model dimensions splash serves. Needs the
//! NVRTC library (CUDA toolkit, or `pip install nvidia-cuda-nvrtc` with its lib directory on
//! LD_LIBRARY_PATH) but no GPU; skipped without it unless `SPLASH_REQUIRE_NVRTC` is set (CI).
#![cfg(feature = "cuda")]

use std::sync::atomic::{AtomicUsize, Ordering};

use splash_backend::cuda::{compile_ptx, KernelDims, KernelOptions};

/// The kernel dimensions of Qwen3.5/3.6 (head dim 256, GDN 128/128).
const QWEN35_DIMS: KernelDims = KernelDims {
    head_dim: 256,
    gdn_dk: 128,
    gdn_dv: 128,
};

fn nvrtc_present() -> bool {
    // SAFETY: only probes whether the library can be loaded.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

#[test]
fn every_kernel_compiles_for_the_served_shapes() {
    if !nvrtc_present() {
        assert!(
            std::env::var_os("SPLASH_REQUIRE_NVRTC").is_none(),
            "SPLASH_REQUIRE_NVRTC is set but libnvrtc cannot be loaded (check LD_LIBRARY_PATH)"
        );
        eprintln!(
            "skipped: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13 NVRTC lib directory)"
        );
        return;
    }
    let tmp = std::env::temp_dir().join(format!("splash-kcache-{}", std::process::id()));
    std::env::set_var("SPLASH_KERNEL_CACHE", &tmp);
    // Qwen3.5/3.6 (head dim 256, GDN 128/128), their DFlash drafts (head dim 128), the test
    // fixtures (32, 16/16) and the fixture drafts (16), for Ampere and Hopper.
    let jobs: Vec<(KernelDims, &str)> = [(256, 128), (128, 128), (32, 16), (16, 16)]
        .into_iter()
        .flat_map(|(head_dim, gdn)| {
            let dims = KernelDims {
                head_dim,
                gdn_dk: gdn,
                gdn_dv: gdn,
            };
            ["compute_80", "compute_90"].map(|arch| (dims, arch))
        })
        .collect();
    // NVRTC compiles independent programs concurrently; one compile takes ~20 s of a core.
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(jobs.len()) {
            scope.spawn(|| {
                while let Some(&(dims, arch)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    check_kernels(dims, arch);
                }
            });
        }
    });
    // Each compile left its PTX in the disk cache.
    let n = std::fs::read_dir(&tmp).unwrap().count();
    assert_eq!(n, 8, "one cached PTX per (dims, arch)");
    check_launch_triggers();
    check_timeline_build();
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Compiles the kernels for `dims` and `arch` and checks that every kernel is in the PTX.
fn check_kernels(dims: KernelDims, arch: &'static str) {
    let ptx = compile_ptx(dims, &KernelOptions::default(), arch)
        .unwrap_or_else(|e| panic!("{dims:?} {arch}: {e}"));
    for kernel in [
        "gemv_q4_k",
        "gemv_q8_q8_0",
        "gemv1_q8_q5_k",
        "gemv_tc8_q4_k",
        "gemv_tc16_q6_k",
        "gemv_tcs8_q4_k",
        "gemv_tcs16_q6_k",
        "gemv_tc_fixup",
        "to_f16_tc",
        "gemv_tc_experts_q4_k",
        "gemm_tc_experts_q6_k",
        "moe_route",
        "moe_group",
        "gemv1_group",
        "gemv8_group",
        "gemv_group",
        "gemv1_i8tc_q4_k",
        "gemv1_i8tc_q6_k",
        "moe_group_scatter",
        "moe_combine",
        "quantize_q8",
        "gemv_q6_k",
        "gemv_iq4_xs",
        "gemv_affine4",
        "gemv1_f32",
        "gemv_bf16",
        "dequant_bf16_q8_0",
        "rms_norm",
        "add_rms_norm",
        "rms_norm_gated",
        "attention",
        "attention_prefill",
        "attention_prefill_async",
        "grouped_dynamic_conv",
        "kv_append",
        "rope",
        "conv1d_silu",
        "gdn_recurrent",
        "gdn_gates",
        "scatter_add_rows",
    ] {
        assert!(
            ptx.contains(&format!(".entry {kernel}(")),
            "{kernel} missing from the PTX"
        );
    }
}

/// Whether kernel `name` of `ptx` lets the next kernel launch before it waits for the one before.
fn triggers_before_waiting(ptx: &str, name: &str) -> bool {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} missing from the PTX"));
    let body = &ptx[start..];
    let body = &body[..body[1..].find(".entry ").map_or(body.len(), |e| e + 1)];
    let (launch, wait) = (
        body.find("griddepcontrol.launch_dependents"),
        body.find("griddepcontrol.wait"),
    );
    launch.expect("launch_dependents") < wait.expect("wait")
}

/// The dependent-launch variants compile as their options say (SPLASH_DEPENDENT_LAUNCH): by
/// default every kernel waits, then lets the next launch; `bridge` turns that around in the
/// small kernels between products only; `early` everywhere. One-head decode attention
/// (SPLASH_ATTENTION_HEADS=1, the 96-register bound) and the 16-token int8 GEMVs capped at 128
/// registers (SPLASH_INT8_MMA16_REGS=128) compile too.
fn check_launch_triggers() {
    let dims = QWEN35_DIMS;
    let bridges = [
        "add_rms_norm_to_f16_tc",
        "silu_mul_to_f16_tc",
        "quantize_q8",
    ];
    let others = ["gemv_tc8_q4_k", "attention_part", "gdn_recurrent_seqs"];
    let compile = |options: KernelOptions| compile_ptx(dims, &options, "compute_90").unwrap();
    let default = compile(KernelOptions::default());
    let bridge = compile(KernelOptions {
        bridge_early: true,
        ..Default::default()
    });
    let early = compile(KernelOptions {
        trigger_early: true,
        attention_heads: Some(1),
        int8_mma16_regs: Some(128),
        ..Default::default()
    });
    for name in bridges {
        assert!(!triggers_before_waiting(&default, name), "{name}, default");
        assert!(triggers_before_waiting(&bridge, name), "{name}, bridge");
        assert!(triggers_before_waiting(&early, name), "{name}, early");
    }
    for name in others {
        assert!(!triggers_before_waiting(&default, name), "{name}, default");
        assert!(!triggers_before_waiting(&bridge, name), "{name}, bridge");
        assert!(triggers_before_waiting(&early, name), "{name}, early");
    }
}

/// The timeline build (SPLASH_TIMELINE) records at every wait: each kernel that waits for the
/// one before reads the global timer and its grid id; the default build reads neither.
fn check_timeline_build() {
    let dims = QWEN35_DIMS;
    let timeline = KernelOptions {
        timeline: true,
        ..Default::default()
    };
    let ptx = compile_ptx(dims, &timeline, "compute_90").unwrap();
    let mut waiting = 0;
    for entry in ptx.split(".entry ").skip(1) {
        if entry.contains("griddepcontrol.wait") {
            waiting += 1;
            let name = &entry[..entry.find('(').unwrap_or(0)];
            assert!(
                entry.contains("%globaltimer") && entry.contains("%gridid"),
                "{name} waits without recording"
            );
        }
    }
    assert!(waiting > 50, "only {waiting} kernels wait");
    let default = compile_ptx(dims, &KernelOptions::default(), "compute_90").unwrap();
    assert!(!default.contains("%globaltimer"));
}
