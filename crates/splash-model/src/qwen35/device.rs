//! The text model's side of the device seam (see `crate::device`): what a device implements to
//! run the Qwen3.5 forward pass, and what it holds for each sequence.

use std::any::Any;
use std::fmt::Debug;

use splash_backend::cpu::KvFormat;
use splash_backend::profile::ProfileRow;
use splash_backend::timeline::Span;

use super::positions::Rotary;
use super::{Logits, PassOutput, Weights};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::image::ImageWriter;

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

    /// Starts a timeline of the launches, where they are timed (`SPLASH_TIMELINE` on a GPU);
    /// whether they are.
    fn timeline_reset(&self) -> Result<bool, ModelError> {
        Ok(false)
    }

    /// The launches since [`timeline_reset`](Self::timeline_reset) as they ran, where they are
    /// timed (`Err` inside: the records and the launches could not be paired).
    fn timeline(&self) -> Result<Option<Result<Vec<Span>, String>>, ModelError> {
        Ok(None)
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
    /// Tokens already in the state (the KV row of the first of `tokens`).
    pub(crate) pos0: usize,
    /// The rows' rotary positions.
    pub(crate) rotary: Rotary,
    /// Runs of rows whose input is given (image rows) instead of their token's embedding:
    /// (first row, `[run, hidden]`).
    pub(crate) embedded: Vec<(usize, &'a [f32])>,
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
