//! One sequence's state on the device: GDN conv and recurrent state, attention caches,
//! and the buffers a verify pass records for its rollback.

use super::*;

/// Positions a fresh attention cache holds before it grows (doubling).
const INITIAL_KV_CAPACITY: usize = 1024;

/// One sequence's state on the device.
#[derive(Clone)]
pub(crate) struct GpuState {
    model: Arc<GpuModel>,
    pub(super) layers: Vec<GpuLayerState>,
    pub(super) kv: KvFormat,
    /// Per layer, where a pass run from a checkpoint records what [`GpuState::rollback`]
    /// needs (GDN layers; allocated at the first such pass and kept, so a captured verify
    /// pass writes to the same buffers every time).
    pub(super) replay: Vec<Option<GdnReplay>>,
    /// Whether the last pass recorded into `replay`.
    pub(super) recorded: bool,
}

/// A GDN layer's state before a verify pass and the pass's conv inputs and gates: enough to
/// rebuild the state after any prefix of the pass (model-spec §2.6 (a), on the device).
#[derive(Clone)]
pub(super) struct GdnReplay {
    pub(super) conv: Buf,
    pub(super) recurrent: Buf,
    /// `in_proj_qkv` rows `[T, C]`, decays `g` and `beta` `[T, hv]` of the pass, for up to
    /// `rows` tokens.
    pub(super) qkv: Buf,
    pub(super) g: Buf,
    pub(super) beta: Buf,
    rows: usize,
}

impl GdnReplay {
    /// Every buffer of the record.
    fn buffers(&self) -> [&Buf; 5] {
        [&self.conv, &self.recurrent, &self.qkv, &self.g, &self.beta]
    }
}

#[derive(Clone)]
pub(super) enum GpuLayerState {
    Gdn {
        conv: Buf,
        recurrent: Buf,
    },
    /// Keys and values `[cap, hkv, d]` in the KV format, with int8 row scales `[cap, hkv]`.
    Attn {
        k: CudaSlice<u8>,
        v: CudaSlice<u8>,
        ks: Buf,
        vs: Buf,
        cap: usize,
    },
}

impl std::fmt::Debug for GpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GpuState({} layers, {:?} KV, {} bytes)",
            self.layers.len(),
            self.kv,
            self.bytes()
        )
    }
}

impl GpuState {
    /// Keeps the first `keep` of the `ran` tokens of the last (recorded) pass: attention rows
    /// past them are simply overwritten later; GDN layers replay the kept tokens from the
    /// state saved before the pass.
    pub(crate) fn rollback(&mut self, keep: usize, ran: usize) -> Result<(), ModelError> {
        if !std::mem::take(&mut self.recorded) || keep == ran {
            return Ok(());
        }
        let m = &*self.model;
        let gpu = &*m.gpu;
        let mut replayed = Vec::new();
        let mut shape = None;
        for ((layer, ls), r) in m.layers.iter().zip(&mut self.layers).zip(&self.replay) {
            if let (GpuMixer::Gdn(g), GpuLayerState::Gdn { conv, recurrent }, Some(r)) =
                (&layer.mixer, ls, r)
            {
                shape = Some(g.replay_shape());
                replayed.push(dev::ReplayLayer {
                    conv_saved: ptr(gpu, &r.conv, 0),
                    conv: ptr(gpu, conv, 0),
                    rec_saved: ptr(gpu, &r.recurrent, 0),
                    rec: ptr(gpu, recurrent, 0),
                    qkv: ptr(gpu, &r.qkv, 0),
                    g: ptr(gpu, &r.g, 0),
                    beta: ptr(gpu, &r.beta, 0),
                    conv_w: g.conv_weights(gpu),
                });
            }
        }
        let Some((c, kernel, heads)) = shape else {
            return Ok(());
        };
        let mixed = m.scratch(replayed.len() * keep * c)?;
        let mp = ptr(gpu, &mixed, 0);
        dev::gdn_replay(gpu, &m.k, &replayed, mp, keep, c, kernel, heads)?;
        Ok(())
    }

    /// A device copy holding the first `len` positions of each attention cache (the prefix
    /// cache keeps these: no room for growth).
    pub(crate) fn try_clone(&self, len: usize) -> Result<GpuState, ModelError> {
        let m = &self.model;
        let g = &*m.gpu;
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    GpuLayerState::Gdn { conv, recurrent } => GpuLayerState::Gdn {
                        conv: m.clone_buf(conv)?,
                        recurrent: m.clone_buf(recurrent)?,
                    },
                    GpuLayerState::Attn { k, v, ks, vs, cap } => {
                        let (row, hkv) = (k.len() / cap, ks.len() / cap);
                        let new_cap = len.max(1);
                        let bytes = new_cap * row;
                        let (k2, v2) = (g.uninit::<u8>(bytes)?, g.uninit::<u8>(bytes)?);
                        let (ks2, vs2) = (m.scratch(new_cap * hkv)?, m.scratch(new_cap * hkv)?);
                        g.copy(ptr(g, &k2, 0), ptr(g, k, 0), len * row)?;
                        g.copy(ptr(g, &v2, 0), ptr(g, v, 0), len * row)?;
                        g.copy(ptr(g, &ks2, 0), ptr(g, ks, 0), 4 * len * hkv)?;
                        g.copy(ptr(g, &vs2, 0), ptr(g, vs, 0), 4 * len * hkv)?;
                        GpuLayerState::Attn {
                            k: k2,
                            v: v2,
                            ks: ks2,
                            vs: vs2,
                            cap: new_cap,
                        }
                    }
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(GpuState {
            model: m.clone(),
            layers,
            kv: self.kv,
            replay: Vec::new(),
            recorded: false,
        })
    }

    /// Writes the layers of a state image (see [`SequenceState::save_image`]): the first `len`
    /// positions of each attention cache, in the same layout as a CPU state.
    pub(crate) fn save_image(&self, w: &mut ImageWriter, len: usize) -> Result<(), ModelError> {
        let g = &*self.model.gpu;
        w.u64(self.layers.len() as u64);
        for l in &self.layers {
            match l {
                GpuLayerState::Gdn { conv, recurrent } => {
                    w.u64(0);
                    w.f32s(&g.download(conv, conv.len())?);
                    w.f32s(&g.download(recurrent, recurrent.len())?);
                }
                GpuLayerState::Attn { k, v, ks, vs, cap } => {
                    w.u64(1);
                    let (row, hkv) = (k.len() / cap, ks.len() / cap);
                    let scales = if self.kv == KvFormat::Int8 {
                        len * hkv
                    } else {
                        0
                    };
                    for (x, xs) in [(k, ks), (v, vs)] {
                        w.bytes(&g.download(x, len * row)?);
                        w.f32s(&g.download(xs, scales)?);
                    }
                }
            }
        }
        Ok(())
    }

    /// What a captured pass over this state depends on: the addresses and capacities of its
    /// buffers (with the rollback buffers for a pass that records), its KV format and the
    /// arithmetic mode.
    pub(super) fn graph_key(&self, exact: bool, record: bool) -> Vec<u64> {
        let g = &*self.model.gpu;
        let mut key = vec![self.kv.value_bytes() as u64, exact as u64];
        for r in self.replay.iter().flatten().filter(|_| record) {
            key.extend(r.buffers().map(|b| ptr(g, b, 0)));
        }
        for l in &self.layers {
            match l {
                GpuLayerState::Gdn { conv, recurrent } => {
                    key.extend([ptr(g, conv, 0), ptr(g, recurrent, 0)]);
                }
                GpuLayerState::Attn { k, v, ks, vs, cap } => {
                    key.extend([ptr(g, k, 0), ptr(g, v, 0), ptr(g, ks, 0), ptr(g, vs, 0)]);
                    key.push(*cap as u64);
                }
            }
        }
        key
    }

    /// Makes the rollback buffers hold a recorded pass of `t` tokens.
    pub(super) fn ensure_replay(&mut self, t: usize) -> Result<(), ModelError> {
        let m = self.model.clone();
        self.replay.resize_with(self.layers.len(), || None);
        for ((layer, ls), slot) in m.layers.iter().zip(&self.layers).zip(&mut self.replay) {
            let (GpuMixer::Gdn(g), GpuLayerState::Gdn { conv, recurrent }) = (&layer.mixer, ls)
            else {
                continue;
            };
            if slot.as_ref().is_some_and(|r| r.rows >= t) {
                continue;
            }
            // A whole verify block at least, so that blocks of any size up to it share them.
            let rows = t.max(16);
            let c = g.in_qkv_z.rows().0;
            *slot = Some(GdnReplay {
                conv: m.scratch(conv.len())?,
                recurrent: m.scratch(recurrent.len())?,
                qkv: m.scratch(rows * c)?,
                g: m.scratch(rows * g.hv)?,
                beta: m.scratch(rows * g.hv)?,
                rows,
            });
        }
        Ok(())
    }

    /// Positions the attention caches hold (they grow together).
    pub(super) fn kv_capacity(&self) -> usize {
        self.layers
            .iter()
            .filter_map(|l| match l {
                GpuLayerState::Attn { cap, .. } => Some(*cap),
                GpuLayerState::Gdn { .. } => None,
            })
            .min()
            .unwrap_or(0)
    }

    /// Device bytes held.
    pub(crate) fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| match l {
                GpuLayerState::Gdn { conv, recurrent } => 4 * (conv.len() + recurrent.len()),
                GpuLayerState::Attn { k, v, ks, vs, .. } => {
                    k.len() + v.len() + 4 * (ks.len() + vs.len())
                }
            })
            .sum();
        let replay: usize = self
            .replay
            .iter()
            .flatten()
            .flat_map(GdnReplay::buffers)
            .map(|b| 4 * b.len())
            .sum();
        layers + replay
    }
}

impl GpuModel {
    /// A fresh state: zero conv and recurrent state, empty caches.
    pub(crate) fn new_state(
        self: &Arc<Self>,
        cfg: &ModelConfig,
        kv: KvFormat,
    ) -> Result<GpuState, ModelError> {
        self.zeroed_state(cfg, kv, INITIAL_KV_CAPACITY)
    }

    /// A zeroed state whose attention caches hold `cap` positions.
    fn zeroed_state(
        self: &Arc<Self>,
        cfg: &ModelConfig,
        kv: KvFormat,
        cap: usize,
    ) -> Result<GpuState, ModelError> {
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|kind| {
                Ok(match kind {
                    LayerKind::Linear => GpuLayerState::Gdn {
                        conv: self.gpu.zeros((cfg.conv_kernel - 1) * cfg.conv_dim())?,
                        recurrent: self.gpu.zeros(cfg.gdn.state_len())?,
                    },
                    LayerKind::Full => {
                        // Every format has row scales on the device (unused outside int8).
                        let rows = cap * cfg.num_kv_heads;
                        let bytes = rows * cfg.head_dim * kv.value_bytes();
                        GpuLayerState::Attn {
                            k: self.gpu.zeros(bytes)?,
                            v: self.gpu.zeros(bytes)?,
                            ks: self.gpu.zeros(rows)?,
                            vs: self.gpu.zeros(rows)?,
                            cap,
                        }
                    }
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(GpuState {
            model: self.clone(),
            layers,
            kv,
            replay: Vec::new(),
            recorded: false,
        })
    }

    /// A device state from a parsed image (room for at least the initial capacity).
    pub(crate) fn state_from_image(
        self: &Arc<Self>,
        cfg: &ModelConfig,
        len: usize,
        kv: KvFormat,
        image: Vec<LayerImage<'_>>,
    ) -> Result<GpuState, ModelError> {
        let g = &*self.gpu;
        let mut state = self.zeroed_state(cfg, kv, len.max(INITIAL_KV_CAPACITY))?;
        for (layer, saved) in state.layers.iter_mut().zip(image) {
            match (layer, saved) {
                (
                    GpuLayerState::Gdn { conv, recurrent },
                    LayerImage::Gdn {
                        conv: c,
                        recurrent: r,
                    },
                ) => {
                    g.write(conv, &c)?;
                    g.write(recurrent, &r)?;
                }
                (
                    GpuLayerState::Attn { k, v, ks, vs, .. },
                    LayerImage::Attn {
                        k: hk,
                        ks: hks,
                        v: hv,
                        vs: hvs,
                    },
                ) => {
                    g.write(k, hk)?;
                    g.write(v, hv)?;
                    g.write(ks, &hks)?;
                    g.write(vs, &hvs)?;
                }
                _ => unreachable!("the image was checked against the model's layer kinds"),
            }
        }
        Ok(state)
    }
}

/// Grows an attention cache (doubling) so that it holds `needed` positions.
pub(super) fn ensure_capacity(
    m: &GpuModel,
    state: &mut GpuLayerState,
    kv: KvFormat,
    needed: usize,
    hkv: usize,
    d: usize,
) -> Result<(), ModelError> {
    let GpuLayerState::Attn { k, v, ks, vs, cap } = state else {
        unreachable!("attention layer state")
    };
    if needed <= *cap {
        return Ok(());
    }
    let new_cap = needed.max(*cap * 2);
    let gpu = &*m.gpu;
    let bytes = new_cap * hkv * d * kv.value_bytes();
    *k = gpu.grown(k, bytes)?;
    *v = gpu.grown(v, bytes)?;
    *ks = gpu.grown(ks, new_cap * hkv)?;
    *vs = gpu.grown(vs, new_cap * hkv)?;
    *cap = new_cap;
    Ok(())
}
