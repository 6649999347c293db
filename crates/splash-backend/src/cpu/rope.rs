//! Rotary position embedding over the first `rot` dims of each head (NeoX pairing).

/// Inverse frequencies of a (partial) rotary embedding.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Frequencies that turn with the (temporal, height, width) position under M-RoPE.
    section: [usize; 3],
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
            .collect::<Vec<f32>>();
        let section = [inv_freq.len(), 0, 0];
        Self { inv_freq, section }
    }

    /// The same rotation with `section` frequencies for M-RoPE's temporal, height and width
    /// positions ([`apply_3d`](Self::apply_3d)).
    pub fn with_section(self, section: [usize; 3]) -> Self {
        Self { section, ..self }
    }

    /// Number of rotated dims per head.
    pub fn rot_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// Rotates `x` (`[T, heads, head_dim]`) in place; token `t` sits at position `pos0 + t`.
    /// Dim `i < rot/2` pairs with `i + rot/2`; dims from `rot` on pass through unchanged.
    pub fn apply(&self, x: &mut [f32], heads: usize, head_dim: usize, pos0: usize) {
        self.rotate(x, heads, head_dim, |t, _| (pos0 + t) as f32);
    }

    /// [`apply`](Self::apply) at a (temporal, height, width) position per token (interleaved
    /// M-RoPE, vision-spec): frequency `j` turns with the height position when `j % 3 == 1`
    /// and `j < 3·section[1]`, with the width position when `j % 3 == 2` and
    /// `j < 3·section[2]`, else with the temporal one. A token at (p, p, p) turns exactly as
    /// [`apply`](Self::apply) turns it at p.
    pub fn apply_3d(&self, x: &mut [f32], heads: usize, head_dim: usize, positions: &[[u32; 3]]) {
        assert_eq!(x.len(), positions.len() * heads * head_dim);
        self.rotate(x, heads, head_dim, |t, j| positions[t][self.axis(j)] as f32);
    }

    /// The position each token's frequency `j` turns by under [`apply_3d`](Self::apply_3d):
    /// `[tokens, rotary_dim / 2]` (the GPU's RoPE of image rows reads it).
    pub fn position_table(&self, positions: &[[u32; 3]]) -> Vec<f32> {
        let half = self.inv_freq.len();
        positions
            .iter()
            .flat_map(|p| (0..half).map(|j| p[self.axis(j)] as f32))
            .collect()
    }

    /// The axis (temporal, height, width) frequency `j` turns with.
    fn axis(&self, j: usize) -> usize {
        match j % 3 {
            1 if j < 3 * self.section[1] => 1,
            2 if j < 3 * self.section[2] => 2,
            _ => 0,
        }
    }

    /// Rotates each token `t`'s frequency `j` by `position(t, j) · inv_freq[j]`.
    fn rotate(
        &self,
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        position: impl Fn(usize, usize) -> f32,
    ) {
        let half = self.inv_freq.len();
        assert!(2 * half <= head_dim && x.len().is_multiple_of(heads * head_dim));
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        for (t, token) in x.chunks_exact_mut(heads * head_dim).enumerate() {
            for j in 0..half {
                // f32 angle, as transformers computes `inv_freq @ position_ids` in f32.
                let angle = position(t, j) * self.inv_freq[j];
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

    #[test]
    fn three_d_positions_pick_an_axis_per_frequency() {
        // rot 12: six frequencies; section [2, 2, 2]: j = 1, 4 turn with the height position,
        // j = 2, 5 with the width, j = 0, 3 with the temporal one.
        let rope = Rope::new(12, 10000.0).with_section([2, 2, 2]);
        let x: Vec<f32> = (0..12).map(|i| 1.0 + i as f32 * 0.25).collect();
        let at = |p: [u32; 3]| {
            let mut y = x.clone();
            rope.apply_3d(&mut y, 1, 12, &[p]);
            y
        };
        let mut plain = x.clone();
        rope.apply(&mut plain, 1, 12, 7);
        assert_eq!(
            at([7, 7, 7]),
            plain,
            "a text token turns as with 1-D positions"
        );
        let (t, h, w) = (at([3, 0, 0]), at([0, 5, 0]), at([0, 0, 9]));
        for j in 0..6 {
            let moved = |y: &[f32]| y[j] != x[j] || y[j + 6] != x[j + 6];
            assert_eq!(
                (moved(&t), moved(&h), moved(&w)),
                (j % 3 == 0, j % 3 == 1, j % 3 == 2),
                "frequency {j}"
            );
        }
    }
}
