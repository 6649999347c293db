//! Per-sequence decoding state: the length, the KV format and the checkpoint of a verify pass
//! here; the layers (KV caches, conv and recurrent state) with the device that runs them.

use splash_backend::cpu::KvFormat;

use super::device::{DeviceState, LayerImage};
use crate::config::{LayerKind, ModelConfig};
use crate::image::{bad, ImageReader, ImageWriter};
use crate::ModelError;

/// The tag that starts a saved [`SequenceState`] image (version 2: the rotary shift after
/// the length).
const STATE_IMAGE: &[u8; 8] = b"SPLSTAT2";

/// Everything one sequence carries between forward passes.
#[derive(Debug)]
pub struct SequenceState {
    len: usize,
    /// How far the rotary position of the next text token falls behind `len` (≤ 0): the sum of
    /// the shifts of the images run so far (`ImageSpan::rotary_shift`).
    rotary_shift: i64,
    /// How keys and values are stored.
    kv: KvFormat,
    /// Set by [`SequenceState::checkpoint`]: the length the verify pass started from; the
    /// passes run since record what [`SequenceState::rollback`] needs.
    checkpoint: Option<usize>,
    layers: Box<dyn DeviceState>,
}

fn kv_code(kv: KvFormat) -> u64 {
    match kv {
        KvFormat::F32 => 0,
        KvFormat::Bf16 => 1,
        KvFormat::Int8 => 2,
    }
}

/// A parsed state image, before a device holds its layers.
pub(crate) struct ParsedState<'a> {
    pub(crate) len: usize,
    pub(crate) rotary_shift: i64,
    pub(crate) kv: KvFormat,
    pub(crate) layers: Vec<LayerImage<'a>>,
}

impl SequenceState {
    /// A state of `len` tokens over `layers` (made by the model's device).
    pub(crate) fn new(
        len: usize,
        rotary_shift: i64,
        kv: KvFormat,
        layers: Box<dyn DeviceState>,
    ) -> Self {
        Self {
            len,
            rotary_shift,
            kv,
            checkpoint: None,
            layers,
        }
    }

    /// A copy of this state (on a GPU, holding just its tokens' cache rows); fails instead of
    /// aborting when the device is out of memory. The copy has no checkpoint.
    pub fn try_clone(&self) -> Result<Self, ModelError> {
        Ok(Self::new(
            self.len,
            self.rotary_shift,
            self.kv,
            self.layers.try_clone(self.len)?,
        ))
    }

    /// The state as bytes, the same whichever device holds it (for the prefix cache's disk
    /// tier); [`Qwen35::load_state`](crate::Qwen35::load_state) reads it back.
    pub fn save_image(&self) -> Result<Vec<u8>, ModelError> {
        let mut w = ImageWriter::new(STATE_IMAGE);
        w.u64(self.len as u64);
        w.u64(self.rotary_shift as u64);
        w.u64(kv_code(self.kv));
        self.layers.save_layers(&mut w, self.len)?;
        Ok(w.finish())
    }

    /// Reads an image written by [`save_image`](Self::save_image) for a model of `config`:
    /// the layers, lengths and KV format must match, or the image is refused.
    pub(crate) fn parse_image<'a>(
        config: &ModelConfig,
        image: &'a [u8],
    ) -> Result<ParsedState<'a>, ModelError> {
        let mut r = ImageReader::new(image, STATE_IMAGE)?;
        let len = r.u64("the length")? as usize;
        if len > config.max_position_embeddings.max(1 << 24) {
            return Err(bad(format!("a length of {len} tokens is beyond the model")));
        }
        let rotary_shift = r.u64("the rotary shift")? as i64;
        if rotary_shift > 0 || rotary_shift < -(len as i64) {
            return Err(bad(format!(
                "a rotary shift of {rotary_shift} for {len} tokens"
            )));
        }
        let kv = match r.u64("the KV format")? {
            0 => KvFormat::F32,
            1 => KvFormat::Bf16,
            2 => KvFormat::Int8,
            other => return Err(bad(format!("unknown KV format code {other}"))),
        };
        let n = r.u64("the layer count")? as usize;
        if n != config.layer_kinds.len() {
            return Err(bad(format!(
                "{n} layers, the model has {}",
                config.layer_kinds.len()
            )));
        }
        let rows = len * config.num_kv_heads;
        let kv_bytes = rows * config.head_dim * kv.value_bytes();
        let scales = if kv == KvFormat::Int8 { rows } else { 0 };
        let layers = config
            .layer_kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let code = r.u64("a layer kind")?;
                Ok(match (kind, code) {
                    (LayerKind::Linear, 0) => LayerImage::Gdn {
                        conv: r
                            .f32s((config.conv_kernel - 1) * config.conv_dim(), "a conv state")?,
                        recurrent: r.f32s(config.gdn.state_len(), "a recurrent state")?,
                    },
                    (LayerKind::Full, 1) => LayerImage::Attn {
                        k: r.bytes(kv_bytes, "the keys")?,
                        ks: r.f32s(scales, "the key scales")?,
                        v: r.bytes(kv_bytes, "the values")?,
                        vs: r.f32s(scales, "the value scales")?,
                    },
                    _ => return Err(bad(format!("layer {i} is of another kind"))),
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        r.end()?;
        Ok(ParsedState {
            len,
            rotary_shift,
            kv,
            layers,
        })
    }

    /// How keys and values are stored.
    pub fn kv_format(&self) -> KvFormat {
        self.kv
    }

    /// Tokens consumed so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// How far the rotary position of the next text token falls behind [`len`](Self::len)
    /// (0 until an image has run; see [`ImageSpan`](crate::ImageSpan)).
    pub fn rotary_shift(&self) -> i64 {
        self.rotary_shift
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The KV pages this state holds, as (identity, bytes): copies of a state share them
    /// (see `KvStore::pages`), so a holder of several copies counts each page once. None (an
    /// empty list) on a GPU, whose caches are whole buffers.
    pub fn kv_pages(&self) -> Vec<(usize, usize)> {
        self.layers.kv_pages()
    }

    /// Bytes held by this state (shared KV pages included).
    pub fn memory_bytes(&self) -> usize {
        self.layers.memory_bytes()
    }

    pub(crate) fn advance(&mut self, tokens: usize, rotary_shift: i64) {
        self.len += tokens;
        self.rotary_shift = rotary_shift;
    }

    /// Whether a checkpoint is set (the next pass records for a rollback).
    pub(crate) fn is_checkpointed(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// The layers, for the device that runs them.
    pub(crate) fn layers_mut(&mut self) -> &mut dyn DeviceState {
        &mut *self.layers
    }

    /// Marks the current length: the next forward pass (a speculative verify) records what a
    /// [`rollback`](Self::rollback) into it needs.
    pub fn checkpoint(&mut self) {
        self.checkpoint = Some(self.len);
        self.layers.begin_checkpoint();
    }

    /// Keeps the first `keep` tokens of the pass run since [`checkpoint`](Self::checkpoint)
    /// and forgets the rest: the KV cache is truncated, the GDN conv and recurrent state are
    /// rebuilt by replaying the recurrence over the kept tokens (model-spec §2.6 (a)). Ends
    /// the checkpoint; a no-op without one.
    pub fn rollback(&mut self, keep: usize) -> Result<(), ModelError> {
        let Some(start) = self.checkpoint.take() else {
            return Ok(());
        };
        let ran = self.len - start;
        assert!(
            keep <= ran,
            "cannot keep {keep} of the {ran} tokens of the pass"
        );
        self.layers.rollback(start, keep, ran)?;
        self.len = start + keep;
        Ok(())
    }
}
