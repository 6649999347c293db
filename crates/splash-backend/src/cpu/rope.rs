//! Rotary position embedding over the first `rot` dims of each head (NeoX pairing).

/// Inverse frequencies of a (partial) rotary embedding.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// `inv_freq[i] = theta^(-2i/rot)` for `i < rot/2`, computed in f32 as transformers does.
    pub fn new(rot: usize, theta: f64) -> Self {
        assert!(rot.is_multiple_of(2), "rotary dim must be even, got {rot}");
        let inv_freq = (0..rot / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / rot as f32;
                1.0 / (theta as f32).powf(exponent)
            })
            .collect();
        Self { inv_freq }
    }

    /// Number of rotated dims per head.
    pub fn rot_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// Rotates `x` (`[T, heads, head_dim]`) in place; token `t` sits at position `pos0 + t`.
    /// Dim `i < rot/2` pairs with `i + rot/2`; dims from `rot` on pass through unchanged.
    pub fn apply(&self, x: &mut [f32], heads: usize, head_dim: usize, pos0: usize) {
        let half = self.inv_freq.len();
        assert!(2 * half <= head_dim && x.len().is_multiple_of(heads * head_dim));
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        for (t, token) in x.chunks_exact_mut(heads * head_dim).enumerate() {
            let pos = (pos0 + t) as f32;
            for j in 0..half {
                // f32 angle, as transformers computes `inv_freq @ position_ids` in f32.
                let angle = pos * self.inv_freq[j];
                cos[j] = angle.cos();
                sin[j] = angle.sin();
            }
            for head in token.chunks_exact_mut(head_dim) {
                for j in 0..half {
                    let (a, b) = (head[j], head[j + half]);
                    head[j] = a * cos[j] - b * sin[j];
                    head[j + half] = b * cos[j] + a * sin[j];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_pass_through_dims_and_norm() {
        let rope = Rope::new(4, 10000.0);
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 * 0.1).collect(); // T=2, heads=1, D=8
        let orig = x.clone();
        rope.apply(&mut x, 1, 8, 5);
        for t in 0..2 {
            let (a, b) = (&x[t * 8..t * 8 + 8], &orig[t * 8..t * 8 + 8]);
            assert_eq!(&a[4..], &b[4..]);
            let na: f32 = a[..4].iter().map(|v| v * v).sum();
            let nb: f32 = b[..4].iter().map(|v| v * v).sum();
            assert!((na - nb).abs() < 1e-5);
        }
        let mut y = orig.clone();
        rope.apply(&mut y, 1, 8, 0);
        assert_eq!(&y[..8], &orig[..8], "position 0 is the identity");
    }
}
