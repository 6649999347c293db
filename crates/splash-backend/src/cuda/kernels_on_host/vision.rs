//! The vision tower's kernels (kernels/vision.cu) on the host, against plain f64 arithmetic.

use half::f16;

use super::*;

/// LayerNorm with bias, and the bias with each activation, as the CPU tower computes them.
#[test]
fn layer_norm_and_bias_activations_on_the_host_match_the_reference() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (rows, d) = (5usize, 72usize);
    let x: Vec<f32> = random(rows * d, 1).iter().map(|v| 3.0 * v + 0.5).collect();
    let (w, b) = (random(d, 2), random(d, 3));
    let out = vec![0.0f32; rows * d];
    // SAFETY: the signature of layer_norm, over buffers of the sizes it indexes.
    unsafe {
        let f: host::layer_norm = kern.kernel("layer_norm");
        let (xa, wa, ba, oa) = (Addr::of(&x), Addr::of(&w), Addr::of(&b), Addr::of(&out));
        kern.launch(rows as u32, 96, &|| {
            f(xa.ptr(), wa.ptr(), ba.ptr(), oa.ptr(), d as i32, 1e-6)
        });
    }
    let want: Vec<f32> = x
        .chunks(d)
        .flat_map(|r| {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + 1e-6).sqrt();
            (0..d).map(move |i| ((r[i] as f64 - mean) * inv) as f32)
        })
        .enumerate()
        .map(|(i, v)| v * w[i % d] + b[i % d])
        .collect();
    assert!(rel_err(&out, &want) < 1e-6, "{}", rel_err(&out, &want));

    let erf = |x: f64| {
        // Abramowitz–Stegun 7.1.26 is too coarse; integrate instead (Simpson, fine steps).
        let steps = 2000;
        let h = x / steps as f64;
        let f = |t: f64| (-t * t).exp();
        let s: f64 = (0..=steps)
            .map(|i| {
                let c = if i == 0 || i == steps {
                    1.0
                } else if i % 2 == 1 {
                    4.0
                } else {
                    2.0
                };
                c * f(i as f64 * h)
            })
            .sum();
        s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
    };
    // Rows of a multiple of 4 (float4) and not; in place, and added to a residual.
    for (act, name, d, residual) in [
        (0, "none", d, false),
        (1, "tanh", d, false),
        (2, "erf", d, false),
        (1, "tanh", 70, false),
        (0, "none + residual", d, true),
        (2, "erf + residual", 70, true),
    ] {
        let b = random(d, 3);
        let x = random(rows * d, 4);
        let y = x.clone();
        let base = random(rows * d, 8);
        let res = base.clone();
        // SAFETY: the signature of bias_act, over buffers of the sizes it indexes.
        unsafe {
            let f: host::bias_act = kern.kernel("bias_act");
            let (ya, ba, ra) = (Addr::of(&y), Addr::of(&b), Addr::of(&res));
            kern.launch(2, 64, &|| {
                let r = if residual {
                    ra.ptr()
                } else {
                    std::ptr::null_mut()
                };
                f(ya.ptr(), ba.ptr(), r, rows as i32, d as i32, act)
            });
        }
        let want: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let v = (v + b[i % d]) as f64;
                (match act {
                    0 => v,
                    1 => 0.5 * v * (1.0 + (0.797_884_560_8 * (v + 0.044_715 * v * v * v)).tanh()),
                    _ => 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)),
                }) as f32
            })
            .collect();
        if residual {
            assert_eq!(bits(&y), bits(&x), "{name}: y unchanged");
            let want: Vec<f32> = base.iter().zip(&want).map(|(a, b)| a + b).collect();
            assert!(
                rel_err(&res, &want) < 1e-6,
                "{name}: {}",
                rel_err(&res, &want)
            );
        } else {
            assert!(rel_err(&y, &want) < 1e-6, "{name}: {}", rel_err(&y, &want));
        }
    }
}

/// Learned positions by four taps a row.
#[test]
fn position_taps_on_the_host_match_the_reference() {
    let Some(kern) = kernels(DIMS_32) else { return };
    let (rows, d, table_rows) = (6usize, 40usize, 9usize);
    let table = random(table_rows * d, 5);
    let taps: Vec<i32> = (0..rows * 4)
        .map(|i| ((i * 7) % table_rows) as i32)
        .collect();
    let weights: Vec<f32> = random(rows * 4, 6).iter().map(|v| v.abs()).collect();
    let x0 = random(rows * d, 7);
    let x = x0.clone();
    // SAFETY: the signature of add_position_taps, over buffers of the sizes it indexes.
    unsafe {
        let f: host::add_position_taps = kern.kernel("add_position_taps");
        let (xa, ta, ia, wa) = (
            Addr::of(&x),
            Addr::of(&table),
            Addr::of(&taps),
            Addr::of(&weights),
        );
        kern.launch(rows as u32, 32, &|| {
            f(xa.ptr(), ta.ptr(), ia.ptr(), wa.ptr(), d as i32)
        });
    }
    let want: Vec<f32> = (0..rows * d)
        .map(|i| {
            let (r, c) = (i / d, i % d);
            x0[i]
                + (0..4)
                    .map(|j| table[taps[4 * r + j] as usize * d + c] * weights[4 * r + j])
                    .sum::<f32>()
        })
        .collect();
    assert!(rel_err(&x, &want) < 1e-6, "{}", rel_err(&x, &want));
}

/// The rotary split into f16 heads and the flash attention over all patches, for the real
/// tower's head dim (72, padded to 80) and the fixture's (8, padded to 16), with a patch count
/// that fills neither a query block nor a key tile: within f16 rounding of f64 softmax
/// attention with the rotary applied.
#[test]
fn vision_attention_on_the_host_matches_the_reference() {
    let Some(kern) = kernels(DIMS_32) else { return };
    for (n, heads, hd) in [(70usize, 2usize, 72usize), (37, 3, 8), (100, 2, 128)] {
        let hdp = crate::cuda::padded_head_dim(hd).unwrap();
        let qkv = random(n * 3 * heads * hd, 11 + hd as u64);
        let angles: Vec<f32> = (0..n * hd).map(|i| (i % 97) as f32 * 0.173).collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let scale2 = scale * std::f32::consts::LOG2_E;
        let (q, k, v) = (
            vec![0u16; heads * n * hdp],
            vec![0u16; heads * n * hdp],
            vec![0u16; heads * n * hdp],
        );
        let out = vec![0.0f32; n * heads * hd];
        let out2 = vec![0.0f32; n * heads * hd];
        let two_tiles = hdp <= crate::cuda::ops::TWO_TILES_MAX_HDP;
        // SAFETY: the signatures of vision_qkv and vision_attention_*, over buffers of the
        // sizes they index.
        unsafe {
            let split: host::vision_qkv = kern.kernel("vision_qkv");
            let attend: host::vision_attention = kern.kernel(&format!("vision_attention_{hdp}"));
            let attend2: Option<host::vision_attention> =
                two_tiles.then(|| kern.kernel(&format!("vision_attention_{hdp}x2")));
            let (xa, ca, sa) = (Addr::of(&qkv), Addr::of(&cos), Addr::of(&sin));
            let (qa, ka, va, oa) = (Addr::of(&q), Addr::of(&k), Addr::of(&v), Addr::of(&out));
            let (ni, hi, di, pi) = (n as i32, heads as i32, hd as i32, hdp as i32);
            kern.launch(n as u32, 64, &|| {
                split(
                    xa.ptr(),
                    ca.ptr(),
                    sa.ptr(),
                    qa.ptr(),
                    ka.ptr(),
                    va.ptr(),
                    ni,
                    hi,
                    di,
                    pi,
                    scale2,
                )
            });
            // Blocks of VA_QUERIES (128) queries: 8 warps of one tile of 16 each, or 4 of two.
            let grid = n.div_ceil(128) * heads;
            kern.launch(grid as u32, 256, &|| {
                attend(qa.ptr(), ka.ptr(), va.ptr(), oa.ptr(), ni, hi, di)
            });
            if let Some(attend2) = attend2 {
                let o2 = Addr::of(&out2);
                kern.launch(grid as u32, 128, &|| {
                    attend2(qa.ptr(), ka.ptr(), va.ptr(), o2.ptr(), ni, hi, di)
                });
            }
        }
        // Two query tiles a warp compute each row exactly as one does.
        if two_tiles {
            assert!(
                out2 == out,
                "hd {hd}: two query tiles a warp changed the output"
            );
        }
        // Padding is zero; q carries the scale and log2 e.
        let half16 = |h: u16| f16::from_bits(h).to_f32();
        assert!(
            (0..heads * n).all(|r| (hd..hdp).all(|j| q[r * hdp + j] == 0 && v[r * hdp + j] == 0))
        );
        let rot = |which: usize, i: usize, h: usize| -> Vec<f64> {
            let x = &qkv[i * 3 * heads * hd + which * heads * hd + h * hd..][..hd];
            (0..hd)
                .map(|j| {
                    let o = if j < hd / 2 {
                        -(x[j + hd / 2] as f64)
                    } else {
                        x[j - hd / 2] as f64
                    };
                    x[j] as f64 * cos[i * hd + j] as f64 + o * sin[i * hd + j] as f64
                })
                .collect()
        };
        let (got0, want0) = (half16(q[hdp]) as f64, rot(0, 1, 0)[0] * scale2 as f64);
        assert!((got0 - want0).abs() < 2e-3, "hd {hd}: {got0} vs {want0}");
        let mut want = vec![0.0f32; n * heads * hd];
        for h in 0..heads {
            let keys: Vec<Vec<f64>> = (0..n).map(|j| rot(1, j, h)).collect();
            for i in 0..n {
                let qi = rot(0, i, h);
                let s: Vec<f64> = keys
                    .iter()
                    .map(|kj| qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale as f64)
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let total: f64 = p.iter().sum();
                for c in 0..hd {
                    let val: f64 = (0..n)
                        .map(|j| {
                            p[j] * qkv[j * 3 * heads * hd + 2 * heads * hd + h * hd + c] as f64
                        })
                        .sum();
                    want[i * heads * hd + h * hd + c] = (val / total) as f32;
                }
            }
        }
        let err = rel_err(&out, &want);
        assert!(err < 3e-3, "n {n}, hd {hd}: {err}");
    }
}
