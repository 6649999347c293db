//! The device seam. A model is defined once: its weights load into host memory in their
//! stored format ([`qwen35::Weights`], [`dflash::DraftWeights`]) and the types the engine
//! holds ([`Qwen35`], [`SequenceState`], [`DFlashDraft`], [`DraftContext`]) do everything
//! that does not depend on where the arithmetic runs: validation, positions, checkpoints,
//! images. The arithmetic and the per-sequence buffers belong to a device, behind the traits
//! below. The CPU device is the exact reference; the CUDA device (feature `cuda`) copies the
//! weights to the GPU once and keeps each sequence's state there. A device is chosen once,
//! when the model is placed (`Qwen35::to_gpu`); nothing else asks which one runs.
//!
//! States and contexts are made by the device that runs them; handing one to another device
//! is an error ([`ModelError::WrongDevice`]), not a panic.
//!
//! [`Qwen35`]: crate::Qwen35
//! [`SequenceState`]: crate::SequenceState
//! [`DFlashDraft`]: crate::DFlashDraft
//! [`DraftContext`]: crate::DraftContext
//! [`qwen35::Weights`]: crate::qwen35::Weights
//! [`dflash::DraftWeights`]: crate::dflash::DraftWeights

use std::any::Any;
use std::fmt::Debug;

use splash_backend::cpu::KvFormat;
use splash_backend::profile::ProfileRow;

use crate::config::ModelConfig;
use crate::dflash::{DraftConfig, DraftWeights};
use crate::error::ModelError;
use crate::image::ImageWriter;
use crate::qwen35::{Logits, PassOutput, Qwen35, Weights};

/// Where the text model's forward pass runs.
pub(crate) trait TextDevice: Send + Sync {
    /// `cpu`, or `cuda (NAME)`.
    fn name(&self) -> String;

    /// Free and total bytes of the device's own memory; `None` on the CPU.
    fn memory(&self) -> Option<(u64, u64)> {
        None
    }

    /// Memory the captured passes of `lanes` sequences verifying `rows` tokens over
    /// `context` keys may hold (0 where passes are not captured).
    fn graph_memory(
        &self,
        _config: &ModelConfig,
        _lanes: usize,
        _rows: usize,
        _context: usize,
    ) -> u64 {
        0
    }

    /// Every kernel launched so far with its launches and seconds, when profiling is on.
    fn profile(&self) -> Option<Vec<ProfileRow>> {
        None
    }

    /// Waits for the work queued on the device.
    fn synchronize(&self) -> Result<(), ModelError> {
        Ok(())
    }

    /// A fresh sequence state: zero recurrent state, empty caches with keys and values as `kv`.
    fn new_state(&self, config: &ModelConfig, kv: KvFormat) -> Box<dyn DeviceState>;

    /// A sequence state holding the layers of a parsed image of `len` tokens.
    fn state_from_image(
        &self,
        config: &ModelConfig,
        len: usize,
        kv: KvFormat,
        layers: Vec<LayerImage<'_>>,
    ) -> Result<Box<dyn DeviceState>, ModelError>;

    /// Runs each item's tokens after its state's, advancing the state's layers (the caller
    /// advances the length). Items have at least one token; `taps` are valid layers.
    fn forward(
        &self,
        weights: &Weights,
        items: &mut [DeviceItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<PassOutput>, ModelError>;

    /// The device as `Any`, for the code that placed it (the CUDA draft finds its target's GPU).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn as_any(&self) -> &dyn Any;
}

/// One sequence's part of a pass, as a device sees it.
pub(crate) struct DeviceItem<'a> {
    pub(crate) state: &'a mut dyn DeviceState,
    pub(crate) tokens: &'a [u32],
    /// Tokens already in the state (the position of the first of `tokens`).
    pub(crate) pos0: usize,
    /// The pass runs from a checkpoint: record what [`DeviceState::rollback`] needs.
    pub(crate) record: bool,
}

/// One sequence's layers (KV caches, conv and recurrent state) as a device holds them.
pub(crate) trait DeviceState: Send + Debug {
    /// A copy holding the first `len` positions (no room reserved for growth); fails instead of
    /// aborting when the device is out of memory.
    fn try_clone(&self, len: usize) -> Result<Box<dyn DeviceState>, ModelError>;

    /// Writes the layer count and the layers of a state image of `len` tokens, the same bytes
    /// whichever device holds them (see `SequenceState::save_image`).
    fn save_layers(&self, w: &mut ImageWriter, len: usize) -> Result<(), ModelError>;

    /// Bytes held (shared KV pages included).
    fn memory_bytes(&self) -> usize;

    /// The host KV pages held, as (identity, bytes); empty where caches are whole buffers.
    fn kv_pages(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    /// Forgets any recorded pass: a checkpoint starts.
    fn begin_checkpoint(&mut self) {}

    /// Keeps the first `keep` of the `ran` tokens of the pass recorded since the checkpoint at
    /// `start` tokens, and forgets what it recorded.
    fn rollback(&mut self, start: usize, keep: usize, ran: usize) -> Result<(), ModelError>;

    /// The state as `Any`, for the device that made it.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// One layer of a saved state image, checked against the model's shapes.
pub(crate) enum LayerImage<'a> {
    Gdn {
        conv: Vec<f32>,
        recurrent: Vec<f32>,
    },
    /// Keys and values as stored (`[len, hkv, d]` in the KV format) and their int8 row scales.
    Attn {
        k: &'a [u8],
        ks: Vec<f32>,
        v: &'a [u8],
        vs: Vec<f32>,
    },
}

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

/// `state` as the concrete type of the device asking, or the error that says it is not.
pub(crate) fn downcast<'a, T: 'static>(
    any: &'a mut dyn Any,
    device: &str,
) -> Result<&'a mut T, ModelError> {
    any.downcast_mut::<T>()
        .ok_or_else(|| ModelError::WrongDevice(device.to_string()))
}
