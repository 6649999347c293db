//! RMS and L2 normalisation over the rows of a row-major matrix.

use super::activation::silu;

/// `out = x * rsqrt(mean(x²) + eps) * w`, per row of `w.len()` values.
///
/// Zero-centred checkpoints (HF Qwen3.5, applied as `1 + w`) are shifted once at load, so
/// this op always multiplies by the stored-or-shifted `w`.
pub fn rms_norm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let d = w.len();
    assert_eq!(x.len(), out.len());
    assert_eq!(x.len() % d, 0);
    for (o, r) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
        let inv = rms_inv(r, eps);
        for ((o, &v), &wv) in o.iter_mut().zip(r).zip(w) {
            *o = v * inv * wv;
        }
    }
}

/// The GDN output norm: `rms_norm(x, w) * silu(z)`, per row of `w.len()` values.
pub fn rms_norm_gated(out: &mut [f32], x: &[f32], z: &[f32], w: &[f32], eps: f32) {
    let d = w.len();
    assert!(x.len() == out.len() && z.len() == x.len() && x.len().is_multiple_of(d));
    for ((o, r), zr) in out
        .chunks_exact_mut(d)
        .zip(x.chunks_exact(d))
        .zip(z.chunks_exact(d))
    {
        let inv = rms_inv(r, eps);
        for (((o, &v), &wv), &zv) in o.iter_mut().zip(r).zip(w).zip(zr) {
            *o = wv * (v * inv) * silu(zv);
        }
    }
}

/// `x = x * rsqrt(Σx² + eps)` per row of `d` values (the FLA/transformers `l2norm`).
pub fn l2_norm_rows(x: &mut [f32], d: usize, eps: f32) {
    for r in x.chunks_exact_mut(d) {
        let ss: f32 = r.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss + eps).sqrt();
        for v in r {
            *v *= inv;
        }
    }
}

fn rms_inv(r: &[f32], eps: f32) -> f32 {
    let ms = r.iter().map(|v| v * v).sum::<f32>() / r.len() as f32;
    1.0 / (ms + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&mut out, &x, &[1.0, 2.0], 1e-12);
        let s = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / s).abs() < 1e-6 && (out[1] - 8.0 / s).abs() < 1e-6);
        assert_eq!(&out[2..], &[0.0, 0.0]);
    }

    #[test]
    fn l2_norm_gives_unit_length() {
        let mut x = [3.0, 4.0];
        l2_norm_rows(&mut x, 2, 0.0);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
    }
}
