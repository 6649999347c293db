//! The draft's side of the device seam (see `crate::device`): what a device implements to run
//! a DFlash draft, and what it holds for each sequence.

use std::any::Any;
use std::fmt::Debug;

use super::{DraftConfig, DraftWeights};
use crate::error::ModelError;
use crate::qwen35::Qwen35;

/// Where a DFlash draft's passes run.
pub(crate) trait DraftDevice: Send + Sync {
    /// `cpu`, or `cuda`.
    fn name(&self) -> &'static str;

    /// Memory the captured passes of `lanes` sequences over `context` rows may hold.
    fn graph_memory(&self, _config: &DraftConfig, _lanes: usize, _context: usize) -> u64 {
        0
    }

    /// An empty per-sequence context.
    fn new_context(&self, weights: &DraftWeights) -> Box<dyn DeviceContext>;

    /// A context of `len` rows from a parsed image: each layer's first position and its keys
    /// and values from there.
    fn context_from_image(
        &self,
        weights: &DraftWeights,
        len: usize,
        layers: Vec<ContextLayer>,
    ) -> Result<Box<dyn DeviceContext>, ModelError>;

    /// Appends the taps `features` `[T, n·H]` of the positions `pos0..pos0 + T`.
    fn append_context(
        &self,
        weights: &DraftWeights,
        ctx: &mut dyn DeviceContext,
        features: &[f32],
        pos0: usize,
    ) -> Result<(), ModelError>;

    /// Drafts one block from its embedded rows `x` `[block, H]` at positions `pos0..`:
    /// the final-normed hidden rows of the mask slots `[block - 1, H]`, their unshaped logits
    /// through the target's head, or (when the device selects, `top` given) the candidates
    /// `[block - 1, top]` of the shaped logits and no logits.
    fn draft(
        &self,
        weights: &DraftWeights,
        ctx: &mut dyn DeviceContext,
        target: &Qwen35,
        x: &[f32],
        pos0: usize,
        top: Option<usize>,
    ) -> Result<DraftedRows, ModelError>;
}

/// What a device's draft pass returns (see [`DraftDevice::draft`]).
pub(crate) struct DraftedRows {
    pub(crate) hidden: Vec<f32>,
    pub(crate) logits: Vec<f32>,
    pub(crate) candidates: Vec<(u32, f32)>,
}

/// One draft layer's cached context: its first position and keys and values from there
/// (`[rows, hkv, d]`).
#[derive(Clone, Debug, Default)]
pub(crate) struct ContextLayer {
    pub(crate) pos0: usize,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
}

/// One sequence's draft context as a device holds it.
pub(crate) trait DeviceContext: Send + Debug {
    /// Bytes held.
    fn memory_bytes(&self) -> usize;

    /// A copy of the first `len` rows; fails instead of aborting when out of memory.
    fn try_clone(&self, len: usize) -> Result<Box<dyn DeviceContext>, ModelError>;

    /// The layers of a context of `len` rows, on the host (for its image).
    fn layers(&self, len: usize) -> Result<Vec<ContextLayer>, ModelError>;

    /// The context as `Any`, for the device that made it.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}
