//! The vision tower's device seam: the host prepares each image's tables once
//! ([`TowerPass`]); a [`VisionDevice`] runs the layers. The CPU's is the reference.

use splash_backend::profile::ProfileRow;

use crate::error::ModelError;
use crate::vision::VisionTower;

/// A patch's four taps into the learned positions: (row of the table, weight).
pub(crate) type PositionTaps = [(usize, f32); 4];

/// One image as every device takes it.
pub(crate) struct TowerPass<'a> {
    /// Patch rows `[n, patch_len]`, in merge-block order.
    pub rows: &'a [f32],
    /// Patches.
    pub n: usize,
    /// Each patch's learned-position taps.
    pub taps: &'a [PositionTaps],
    /// Cos and sin of each patch's rotary angles, `[n, head_dim]`.
    pub cos: &'a [f32],
    pub sin: &'a [f32],
}

/// Where the tower's layers run.
pub(crate) trait VisionDevice: Send + Sync {
    /// The merged embeddings of one image, `[n / merge², out_hidden_size]`, from the weights
    /// of `tower` (the host's, or the device's own copy).
    fn encode(&self, tower: &VisionTower, pass: &TowerPass) -> Result<Vec<f32>, ModelError>;

    /// "cpu", or the GPU's name.
    fn name(&self) -> String;

    /// The GPU's launches so far, by kernel, with SPLASH_GPU_PROFILE set; `None` otherwise.
    fn profile(&self) -> Option<Vec<ProfileRow>> {
        None
    }
}
