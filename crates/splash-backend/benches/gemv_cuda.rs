//! The quantised GEMV kernels alone, on the shapes of the 27B and 35B-A3B checkpoints: time
//! per product for 1 to 16 tokens and the weight bytes it streams, against the H200's measured
//! copy bandwidth. Random weights (valid scale fields), so no checkpoint is needed:
//! `cargo bench -p splash-backend --features cuda --bench gemv_cuda` on a machine with a GPU.
//! Each product is replayed from a CUDA graph, so the times are the GPU's, without the host's
//! launch cost. Each shape is also timed with its input converted once, outside the graph (the
//! GEMV kernels alone), and on the stream-K GEMV. `GEMV_SWEEP=1` also times the tensor-core
//! GEMV at each warps-per-tile count; `GEMV_ONLY=words` (comma-separated) times the shapes whose
//! names contain one of them. The tiled formats are timed on the int8 GEMVs
//! (`SPLASH_TILED_GEMV=int8`, `int8-mma`) too. Then a 35B-A3B MoE layer's routing (`moe_route`)
//! and grouped expert products (256 experts, 8 a token) at each warps-per-block count, and for
//! one token the 16-pair build beside the 8-pair one (`GEMV_EXPERTS_ONLY=1`: these alone).
//! Last, the time to download a verify block's logits.

use std::time::Instant;

use splash_backend::cuda::{self as dev, ptr, Gpu, KernelDims};
use splash_backend::ggml::GgmlType;
use splash_backend::{DType, HostBytes, Weight};

/// Copy bandwidth of one H200 (`/work/.library/device/KINDS.md`), the roofline of a GEMV.
const COPY_BANDWIDTH: f64 = 4.3e12;

/// Random blocks of `t` with every f16 scale field set to a small normal value; f32 values
/// in ±1e-3 for `None` (the MoE router).
fn random_weight(t: Option<GgmlType>, n: usize, k: usize, seed: u64) -> Weight {
    let Some(t) = t else {
        let raw: Vec<u8> = (0..n * k)
            .flat_map(|i| ((i * 7919 % 2000) as f32 * 1e-6 - 1e-3).to_le_bytes())
            .collect();
        return Weight::new(DType::F32, vec![n, k], HostBytes::from_vec(raw)).unwrap();
    };
    let (block, fields): (usize, &[usize]) = match t {
        GgmlType::Q4_K => (144, &[0, 2]),
        GgmlType::Q6_K => (210, &[208]),
        GgmlType::Q8_0 => (34, &[0]),
        other => panic!("no random blocks for {other}"),
    };
    let per_block = if t == GgmlType::Q8_0 { 32 } else { 256 };
    let mut s = seed | 1;
    let mut raw: Vec<u8> = (0..n * k / per_block * block)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    let scale = half::f16::from_f32(1e-3).to_bits().to_le_bytes();
    for b in raw.chunks_exact_mut(block) {
        for &f in fields {
            b[f..f + 2].copy_from_slice(&scale);
        }
    }
    Weight::new(DType::Ggml(t), vec![n, k], HostBytes::from_vec(raw)).unwrap()
}

fn main() {
    // The SPLASH_* variables set the options (kernel constants too), as in `splash`.
    let options = match dev::GpuOptions::from_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let gpu = match Gpu::with_options(0, options) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("no GPU: {e}");
            return;
        }
    };
    let k = gpu
        .kernels(KernelDims {
            head_dim: 256,
            gdn_dk: 128,
            gdn_dv: 128,
        })
        .unwrap();
    use GgmlType::{Q4_K, Q6_K, Q8_0};
    let shapes: &[(&str, Option<GgmlType>, usize, usize)] = &[
        ("27B mlp gate/up", Some(Q4_K), 17408, 5120),
        ("27B mlp down", Some(Q4_K), 5120, 17408),
        ("27B mlp down (Q6_K layers)", Some(Q6_K), 5120, 17408),
        ("27B gdn qkv", Some(Q4_K), 10240, 5120),
        ("27B gdn z / out", Some(Q4_K), 6144, 5120),
        ("27B gdn b + a, stacked", Some(Q8_0), 96, 5120),
        ("27B lm head", Some(Q6_K), 248320, 5120),
        ("35B expert gate/up", Some(Q4_K), 512, 2048),
        ("35B gdn qkv", Some(Q4_K), 8192, 2048),
        ("35B router + shared gate", None, 257, 2048),
    ];
    println!(
        "{:<28} {:>6} {:>10} | time per product (µs) and share of {:.1} TB/s, by tokens",
        "shape",
        "format",
        "MB",
        COPY_BANDWIDTH / 1e12
    );
    // A tiled shape's first row is the f16 tensor-core GEMV, the other families below it.
    tune(&gpu, |o| o.tiled_gemv = dev::TiledGemv::TensorCores);
    if std::env::var_os("GEMV_EXPERTS_ONLY").is_some() {
        experts(&gpu, &k);
        return;
    }
    // GEMV_ONLY: the shapes whose names contain one of these comma-separated words.
    let only = std::env::var("GEMV_ONLY").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|w| name.contains(w)))
    };
    for &(name, t, n, kd) in shapes.iter().filter(|s| wanted(s.0)) {
        let w = random_weight(t, n, kd, n as u64 * 31 + kd as u64);
        let bytes = w.raw_bytes().len() as f64;
        let dw = gpu.upload_weight(&w).unwrap();
        // The time of one product, replayed from a graph (as a decode pass runs it); with
        // `alone`, the activations are converted once before the graph, which then holds the
        // GEMV kernels only (what a product costs when it shares its input's conversion).
        let time_of = |tokens: usize, alone: bool| -> f64 {
            let x: Vec<f32> = (0..tokens * kd)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0)
                .collect();
            let xd = gpu.upload(&x).unwrap();
            let out = gpu.uninit::<f32>(tokens * n).unwrap();
            let (op, xp) = (ptr(&gpu, &out, 0), ptr(&gpu, &xd, 0));
            // Enough products to take ~20 ms.
            let reps = ((20e-3 * COPY_BANDWIDTH / bytes) as usize).clamp(10, 2000);
            let shared = dev::Activations::new(xp, tokens, kd);
            if alone {
                dev::matmul_activations(&gpu, &k, op, &shared, &dw, 0, n).unwrap();
            }
            let graph = gpu
                .capture(|| {
                    for _ in 0..reps {
                        if alone {
                            dev::matmul_activations(&gpu, &k, op, &shared, &dw, 0, n)?;
                        } else {
                            dev::matmul(&gpu, &k, op, xp, &dw, 0, n, tokens)?;
                        }
                    }
                    Ok::<(), dev::GpuError>(())
                })
                .unwrap();
            if tokens == 1 && !alone {
                // Whether dependent launches survived the capture (see Graph::census).
                println!(
                    "    graph of {reps} products: {:?}",
                    graph.census().unwrap()
                );
            }
            replay_time(&gpu, &graph, reps)
        };
        let time = |tokens: usize| time_of(tokens, false);
        let cell = |secs: f64| {
            format!(
                "{:>7.1} ({:>3.0}%)",
                secs * 1e6,
                bytes / secs / COPY_BANDWIDTH * 100.0
            )
        };
        let format = t.map_or("F32".to_string(), |t| t.to_string());
        let mut line = format!("{name:<28} {format:>6} {:>10.1} |", bytes / 1e6);
        for tokens in [1, 2, 4, 8, 16] {
            line += &format!(" {tokens}: {}", cell(time(tokens)));
        }
        println!("{line}");
        let alone = |label: &str| {
            let (one, sixteen) = (cell(time_of(1, true)), cell(time_of(16, true)));
            println!("    {label}, conversion shared: 1: {one}  16: {sixteen}");
        };
        alone("the same");
        // Stream-K and the warp counts are the tensor-core GEMV's (Q4_K, Q6_K).
        let tensor_core = matches!(t, Some(Q4_K | Q6_K));
        if tensor_core {
            tune(&gpu, |o| o.stream_k = true);
            let mut line = format!("{:<28} {:>6} {:>10} |", "    stream-K", "", "");
            for tokens in [1, 4, 16] {
                line += &format!(" {tokens}: {}", cell(time(tokens)));
            }
            println!("{line}");
            alone("stream-K");
            tune(&gpu, |o| o.stream_k = false);
            // The other families of the tiled formats.
            for family in [dev::TiledGemv::Int8, dev::TiledGemv::Int8Mma] {
                tune(&gpu, |o| o.tiled_gemv = family);
                let label = format!("    {}", family.name());
                let mut line = format!("{label:<28} {:>6} {:>10} |", "", "");
                for tokens in [1, 2, 4, 8, 16] {
                    line += &format!(" {tokens}: {}", cell(time(tokens)));
                }
                println!("{line}");
                alone(family.name());
            }
            tune(&gpu, |o| o.tiled_gemv = dev::TiledGemv::TensorCores);
        }
        if std::env::var_os("GEMV_SWEEP").is_some() && tensor_core {
            for warps in [1, 2, 4, 8] {
                tune(&gpu, |o| o.tensor_core_warps = Some(warps));
                let (one, sixteen) = (cell(time(1)), cell(time(16)));
                println!("    {warps} warps per tile: 1: {one}  16: {sixteen}");
            }
            tune(&gpu, |o| o.tensor_core_warps = None);
        }
    }
    if only.is_some() {
        return;
    }
    experts(&gpu, &k);
    // What a verify block's logits (16 rows of the 248,320-token vocabulary) cost to bring
    // to the host, through the page-locked staging buffer (`Gpu::download`).
    let len = 16 * 248_320;
    let logits = gpu.zeros::<f32>(len).unwrap();
    let _ = gpu.download(&logits, len).unwrap();
    let reps = 20;
    let t0 = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(gpu.download(&logits, len).unwrap());
    }
    let staged = t0.elapsed().as_secs_f64() / reps as f64;
    // The same into pageable memory, as downloads went before.
    let t0 = Instant::now();
    for _ in 0..reps {
        let mut out = vec![0f32; len];
        gpu.stream().memcpy_dtoh(&logits, &mut out).unwrap();
        std::hint::black_box(out);
    }
    let pageable = t0.elapsed().as_secs_f64() / reps as f64;
    for (how, secs) in [("page-locked staging", staged), ("pageable", pageable)] {
        println!(
            "download of {:.1} MB of logits, {how}: {:.2} ms ({:.1} GB/s)",
            len as f64 * 4e-6,
            secs * 1e3,
            len as f64 * 4.0 / secs / 1e9
        );
    }
}

/// The grouped expert products of a 35B-A3B MoE layer (256 experts, top 8): gate / up
/// (Q4_K, 512 x 2048, the tokens' rows) and down (Q6_K, 2048 x 512, the pairs' rows), for
/// 1, 4 and 16 tokens and a 2,048-token prefill pass (there by each of the prefill kernels,
/// [`dev::PrefillExperts`]) routed by random router logits, with the warps per block chosen
/// by size ("default") and forced to 1, 2, 4 and 8 (the same bits); the bytes are those of
/// the distinct experts chosen.
/// Changes one of `gpu`'s options for the measurements that follow.
fn tune(gpu: &Gpu, change: impl FnOnce(&mut dev::GpuOptions)) {
    let mut options = gpu.options();
    change(&mut options);
    gpu.set_options(options);
}

/// Router logits of `tokens` tokens over `e` experts, spread so that their top-k differ.
fn router_logits(tokens: usize, e: usize) -> Vec<f32> {
    (0..tokens * e)
        .map(|i| ((i * 2_654_435_761usize) % 10_007) as f32 / 1000.0)
        .collect()
}

/// Seconds a call of `run` takes on the GPU, `reps` calls captured in one graph.
fn graph_time(gpu: &Gpu, reps: usize, run: impl Fn() -> Result<(), dev::GpuError>) -> f64 {
    run().unwrap();
    let graph = gpu
        .capture(|| {
            for _ in 0..reps {
                run()?;
            }
            Ok::<(), dev::GpuError>(())
        })
        .unwrap();
    replay_time(gpu, &graph, reps)
}

/// Seconds each of the `reps` calls a graph holds takes: replayed once to warm up, once timed.
fn replay_time(gpu: &Gpu, graph: &dev::Graph, reps: usize) -> f64 {
    gpu.replay(graph).unwrap();
    gpu.synchronize().unwrap();
    let t0 = Instant::now();
    gpu.replay(graph).unwrap();
    gpu.synchronize().unwrap();
    t0.elapsed().as_secs_f64() / reps as f64
}

fn experts(gpu: &Gpu, k: &dev::Kernels) {
    let (e, top_k) = (256, 8);
    let narrow_default = gpu.options().narrow_experts;
    // The routing and grouping (`moe_route`, the shared expert routed as the 257th).
    for tokens in [1, 4, 16] {
        let logits = gpu.upload(&router_logits(tokens, e)).unwrap();
        let gate = gpu.upload(&vec![0.5f32; tokens]).unwrap();
        let (lp, gp) = (ptr(gpu, &logits, 0), ptr(gpu, &gate, 0));
        let route = || dev::moe_route(gpu, k, lp, tokens, (e, top_k), Some(gp)).map(drop);
        let secs = graph_time(gpu, 200, route);
        println!("35B-A3B routing, {tokens:>2} tokens: {:.2} µs", secs * 1e6);
    }
    println!("35B-A3B experts ({e}, top {top_k}): time per grouped product (µs) and share of the bandwidth");
    for (name, t, n, kd, col_div) in [
        ("expert gate/up", GgmlType::Q4_K, 512, 2048, top_k),
        ("expert down", GgmlType::Q6_K, 2048, 512, 1),
    ] {
        // All experts in one weight: expert i's rows start at row i·n (whole 16-row tiles).
        let all = gpu
            .upload_weight(&random_weight(Some(t), e * n, kd, 7))
            .unwrap();
        let proto = gpu
            .upload_weight(&random_weight(Some(t), n, kd, 8))
            .unwrap();
        let expert_bytes = (n * proto.row_bytes()) as u64;
        let table: Vec<u64> = (0..e as u64)
            .map(|i| all.device_ptr(gpu) + i * expert_bytes)
            .collect();
        let table = gpu.upload(&table).unwrap();
        for tokens in [1, 4, 16, 2048] {
            let logits = gpu.upload(&router_logits(tokens, e)).unwrap();
            let routing =
                dev::moe_route(gpu, k, ptr(gpu, &logits, 0), tokens, (e, top_k), None).unwrap();
            let mut ids = gpu.download(&routing.ids, tokens * top_k).unwrap();
            ids.sort_unstable();
            ids.dedup();
            let bytes = (ids.len() as u64 * expert_bytes) as f64;
            let rows = tokens * top_k / col_div;
            let x: Vec<f32> = (0..rows * kd)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0)
                .collect();
            let xd = gpu.upload(&x).unwrap();
            let out = gpu.uninit::<f32>(tokens * top_k * n).unwrap();
            let xa = dev::Activations::new(ptr(gpu, &xd, 0), rows, kd);
            let kernels: &[_] = if tokens > 16 {
                &dev::PrefillExperts::ALL
            } else {
                &[dev::PrefillExperts::Gemv]
            };
            for &kernel in kernels {
                tune(gpu, |o| o.prefill_experts = kernel);
                let mut line = format!(
                    "{name:<16} {tokens:>4} tokens, {:>3} experts, {:>5.1} MB, {:<4} |",
                    ids.len(),
                    bytes / 1e6,
                    kernel.name()
                );
                // Each column: its label, the warps forced (None: by size) and whether the
                // 8-pair build may serve. For one token "16-pair" is the 16-pair build
                // (SPLASH_NARROW_EXPERTS=0) at the default warps, for the 8-pair build's A/B.
                let mut columns = vec![("default".to_string(), None, narrow_default)];
                for w in [1, 2, 4, 8] {
                    columns.push((format!("{w}w"), Some(w), narrow_default));
                }
                if tokens == 1 {
                    columns.push(("16-pair".to_string(), None, false));
                }
                for (label, warps, narrow) in columns {
                    tune(gpu, |o| {
                        o.expert_warps = warps;
                        o.narrow_experts = narrow;
                    });
                    let run = || {
                        let (tp, op) = (ptr(gpu, &table, 0), ptr(gpu, &out, 0));
                        dev::matmul_experts(gpu, k, op, &xa, tp, &proto, &routing, col_div)
                    };
                    let secs = graph_time(gpu, if tokens > 16 { 20 } else { 200 }, run);
                    line += &format!(
                        " {label}: {:.1} ({:.0}%)",
                        secs * 1e6,
                        bytes / secs / COPY_BANDWIDTH * 100.0
                    );
                }
                tune(gpu, |o| {
                    o.expert_warps = None;
                    o.narrow_experts = narrow_default;
                });
                println!("{line}");
            }
            tune(gpu, |o| {
                o.prefill_experts = dev::GpuOptions::default().prefill_experts
            });
        }
    }
}
