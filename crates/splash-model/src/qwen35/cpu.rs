//! The CPU device: the exact reference forward pass, states in host memory.

use std::any::Any;

use splash_backend::cpu::{
    add_in_place, argmax, embedding, rms_norm, KvFormat, KvStore, Sums, ROW_BY_ROW_TOKENS,
};

use super::attention::AttnPart;
use super::device::{DeviceItem, DeviceState, LayerImage, TextDevice};
use super::gdn::{GdnPart, GdnReplay};
use super::positions::{place_image_rows, Rotary};
use super::{Logits, Mixer, PassOutput, Weights};
use crate::config::{LayerKind, ModelConfig};
use crate::device::downcast;
use crate::error::ModelError;
use crate::image::ImageWriter;

/// The host CPU.
pub(crate) struct Cpu;

impl TextDevice for Cpu {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn new_state(&self, config: &ModelConfig, kv: KvFormat) -> Box<dyn DeviceState> {
        Box::new(CpuState::new(config, kv))
    }

    fn state_from_image(
        &self,
        config: &ModelConfig,
        _len: usize,
        kv: KvFormat,
        layers: Vec<LayerImage<'_>>,
    ) -> Result<Box<dyn DeviceState>, ModelError> {
        let mut state = CpuState::new(config, kv);
        state.layers = layers
            .into_iter()
            .map(|l| match l {
                LayerImage::Gdn { conv, recurrent } => LayerState::Gdn { conv, recurrent },
                LayerImage::Attn { k, ks, v, vs } => LayerState::Attn {
                    k: KvStore::from_raw(kv, k, &ks, config.head_dim),
                    v: KvStore::from_raw(kv, v, &vs, config.head_dim),
                },
            })
            .collect();
        Ok(Box::new(state))
    }

    fn forward(
        &self,
        weights: &Weights,
        items: &mut [DeviceItem<'_>],
        want: Logits,
        taps: &[usize],
    ) -> Result<Vec<PassOutput>, ModelError> {
        let mut items = items
            .iter_mut()
            .map(|i| {
                Ok(CpuItem {
                    state: downcast(i.state.as_any_mut(), "cpu")?,
                    tokens: i.tokens,
                    pos0: i.pos0,
                    rotary: &i.rotary,
                    embedded: &i.embedded,
                    record: i.record,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        // Decode rows and verify blocks (a few tokens per sequence) must give each sequence
        // what a pass of its own gives, however many run together: products row by row.
        let sums = if items.len() > 1 && items.iter().all(|i| i.tokens.len() <= ROW_BY_ROW_TOKENS) {
            Sums::PerRow
        } else {
            Sums::Tiled
        };
        forward_rows(weights, &mut items, want, taps, sums)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One sequence's part of a CPU pass.
struct CpuItem<'a> {
    state: &'a mut CpuState,
    tokens: &'a [u32],
    pos0: usize,
    rotary: &'a Rotary,
    embedded: &'a [(usize, &'a [f32])],
    record: bool,
}

/// The state of one layer for one sequence.
#[derive(Clone, Debug)]
enum LayerState {
    /// Last `K-1` conv inputs `[K-1, conv_dim]` and the f32 recurrent state `[Hv, dk, dv]`.
    Gdn { conv: Vec<f32>, recurrent: Vec<f32> },
    /// Keys (after norm and RoPE) and values, `[len, Hkv, head_dim]` each.
    Attn { k: KvStore, v: KvStore },
}

/// One sequence's layers in host memory.
#[derive(Clone, Debug)]
struct CpuState {
    layers: Vec<LayerState>,
    /// Per layer, what the pass run since the checkpoint recorded for a rollback (GDN layers).
    replay: Vec<Option<GdnReplay>>,
    /// KV heads of the attention layers: one cached row per token and kv head.
    kv_heads: usize,
}

impl CpuState {
    /// Zero conv and recurrent state, empty caches storing keys and values as `kv`.
    fn new(config: &ModelConfig, kv: KvFormat) -> Self {
        let layers = config
            .layer_kinds
            .iter()
            .map(|kind| match kind {
                LayerKind::Linear => LayerState::Gdn {
                    conv: vec![0.0; (config.conv_kernel - 1) * config.conv_dim()],
                    recurrent: vec![0.0; config.gdn.state_len()],
                },
                LayerKind::Full => LayerState::Attn {
                    k: KvStore::new(kv),
                    v: KvStore::new(kv),
                },
            })
            .collect();
        Self {
            replay: vec![None; config.layer_kinds.len()],
            layers,
            kv_heads: config.num_kv_heads,
        }
    }
}

/// Writes the image layers of a state that has run nothing yet (any device's fresh state).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn save_fresh_layers(w: &mut ImageWriter, config: &ModelConfig, kv: KvFormat) {
    CpuState::new(config, kv)
        .save_layers(w, 0)
        .expect("host state images cannot fail");
}

impl DeviceState for CpuState {
    fn try_clone(&self, _len: usize) -> Result<Box<dyn DeviceState>, ModelError> {
        Ok(Box::new(Self {
            replay: vec![None; self.layers.len()],
            ..self.clone()
        }))
    }

    fn save_layers(&self, w: &mut ImageWriter, _len: usize) -> Result<(), ModelError> {
        w.u64(self.layers.len() as u64);
        for layer in &self.layers {
            match layer {
                LayerState::Gdn { conv, recurrent } => {
                    w.u64(0);
                    w.f32s(conv);
                    w.f32s(recurrent);
                }
                LayerState::Attn { k, v } => {
                    w.u64(1);
                    for store in [k, v] {
                        let (bytes, scales) = store.raw();
                        w.bytes(&bytes);
                        w.f32s(&scales);
                    }
                }
            }
        }
        Ok(())
    }

    fn memory_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Gdn { conv, recurrent } => (conv.len() + recurrent.len()) * 4,
                LayerState::Attn { k, v } => k.bytes() + v.bytes(),
            })
            .sum()
    }

    fn kv_pages(&self) -> Vec<(usize, usize)> {
        let mut pages = Vec::new();
        for layer in &self.layers {
            if let LayerState::Attn { k, v } = layer {
                pages.extend(k.pages().chain(v.pages()));
            }
        }
        pages
    }

    fn begin_checkpoint(&mut self) {
        self.replay.iter_mut().for_each(|r| *r = None);
    }

    /// The KV cache is truncated; the GDN conv and recurrent state are rebuilt by replaying
    /// the recurrence over the kept tokens (model-spec §2.6 (a)).
    fn rollback(&mut self, start: usize, keep: usize, ran: usize) -> Result<(), ModelError> {
        let replay = std::mem::replace(&mut self.replay, vec![None; self.layers.len()]);
        if keep == ran {
            return Ok(());
        }
        let end = (start + keep) * self.kv_heads;
        for (layer, replay) in self.layers.iter_mut().zip(&replay) {
            match (layer, replay) {
                (LayerState::Attn { k, v }, _) => {
                    k.truncate(end);
                    v.truncate(end);
                }
                (LayerState::Gdn { conv, recurrent }, Some(r)) => {
                    r.state_after(keep, conv, recurrent)
                }
                (LayerState::Gdn { .. }, None) => {
                    unreachable!("a GDN layer ran without recording its replay")
                }
            }
        }
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The pass over every item's rows, each linear layer once for all of them.
fn forward_rows(
    w: &Weights,
    items: &mut [CpuItem<'_>],
    want: Logits,
    taps: &[usize],
    sums: Sums,
) -> Result<Vec<PassOutput>, ModelError> {
    let cfg = &w.config;
    let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
    let rows: Vec<usize> = items.iter().map(|i| i.tokens.len()).collect();
    let pos0: Vec<usize> = items.iter().map(|i| i.pos0).collect();
    let tokens: Vec<u32> = items
        .iter()
        .flat_map(|i| i.tokens.iter().copied())
        .collect();
    let r = tokens.len();
    debug_assert!(
        items.iter().all(|i| !i.tokens.is_empty()),
        "TextDevice::forward gets items with tokens"
    );
    let mut features: Vec<Vec<f32>> = rows
        .iter()
        .map(|&t| vec![0.0; t * taps.len() * h])
        .collect();
    let mut x = vec![0.0f32; r * h];
    embedding(&mut x, &w.embed, &tokens);
    let mut r0 = 0;
    for (item, &t) in items.iter().zip(&rows) {
        place_image_rows(&mut x, h, r0, item.embedded);
        r0 += t;
    }
    let mut normed = vec![0.0f32; r * h];
    for (li, layer) in w.layers.iter().enumerate() {
        rms_norm(&mut normed, &x, &layer.input_norm, eps);
        let mixed = match &layer.mixer {
            Mixer::Linear(g) => {
                let mut parts: Vec<GdnPart> = items
                    .iter_mut()
                    .zip(&rows)
                    .map(|(item, &rows)| {
                        let CpuState { layers, replay, .. } = &mut *item.state;
                        let LayerState::Gdn { conv, recurrent } = &mut layers[li] else {
                            unreachable!("sequence state was built for another model")
                        };
                        let record = item.record.then(|| &mut replay[li]);
                        GdnPart {
                            conv,
                            recurrent,
                            record,
                            rows,
                        }
                    })
                    .collect();
                g.forward(&normed, &mut parts, eps, sums)
            }
            Mixer::Full(a) => {
                let mut parts: Vec<AttnPart> = items
                    .iter_mut()
                    .zip(rows.iter().zip(&pos0))
                    .map(|(item, (&rows, &pos0))| {
                        let LayerState::Attn { k, v } = &mut item.state.layers[li] else {
                            unreachable!("sequence state was built for another model")
                        };
                        AttnPart {
                            k,
                            v,
                            pos0,
                            rotary: item.rotary,
                            rows,
                        }
                    })
                    .collect();
                a.forward(&normed, &mut parts, &w.rope, eps, sums)
            }
        };
        add_in_place(&mut x, &mixed);
        rms_norm(&mut normed, &x, &layer.post_norm, eps);
        add_in_place(&mut x, &layer.ffn.forward(&normed, sums));
        for (j, _) in taps.iter().enumerate().filter(|(_, &l)| l == li) {
            let width = taps.len() * h;
            let mut x_rows = x.chunks_exact(h);
            for f in features.iter_mut() {
                for row_features in f.chunks_exact_mut(width) {
                    let row = x_rows.next().expect("one row per token");
                    row_features[j * h..][..h].copy_from_slice(row);
                }
            }
        }
    }
    // The rows whose logits are wanted, all items' at once through the head.
    let mut picked: Vec<(usize, usize)> = Vec::new();
    let mut r0 = 0;
    for &t in &rows {
        let range = match want {
            Logits::None => (r0, r0),
            Logits::Last => (r0 + t - 1, r0 + t),
            Logits::All | Logits::Argmax => (r0, r0 + t),
        };
        picked.push(range);
        r0 += t;
    }
    let selected: Vec<f32> = picked
        .iter()
        .flat_map(|&(a, b)| x[a * h..b * h].iter().copied())
        .collect();
    let mut final_h = vec![0.0f32; selected.len()];
    rms_norm(&mut final_h, &selected, &w.final_norm, eps);
    let logits = if final_h.is_empty() {
        Vec::new()
    } else {
        w.lm_head(&final_h, sums)
    };
    let v = cfg.vocab_size;
    let mut next = 0;
    Ok(picked
        .iter()
        .zip(features)
        .map(|(&(a, b), features)| {
            let n = b - a;
            let rows = &logits[next * v..(next + n) * v];
            next += n;
            if want == Logits::Argmax {
                let argmax = rows.chunks_exact(v).map(argmax).collect();
                PassOutput {
                    argmax,
                    features,
                    ..Default::default()
                }
            } else {
                PassOutput {
                    logits: rows.to_vec(),
                    features,
                    ..Default::default()
                }
            }
        })
        .collect())
}
