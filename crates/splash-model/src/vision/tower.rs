//! The vision tower (transformers' `Qwen3_5VisionModel`, the same for qwen3_5 and
//! qwen3_5_moe): its weights in f32 on the host, and what every device shares per image (the
//! patches' places, their learned-position taps and rotary angles). Patch rows in, one
//! embedding of the text model's width per merged 2×2 block out. The layers run on a
//! [`VisionDevice`]: the CPU's (`cpu.rs`, the reference) or the GPU's (`cuda.rs`).

use std::path::Path;

use splash_backend::Weight;

use crate::checkpoint::Checkpoint;
use crate::error::ModelError;
use crate::gguf::Value as GgufValue;
use crate::vision::cpu::CpuTower;
use crate::vision::device::{PositionTaps, TowerPass, VisionDevice};
use crate::vision::PreparedImage;

/// `vision_config` of a checkpoint's config.json.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub out_hidden_size: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub num_position_embeddings: usize,
    pub in_channels: usize,
    pub rope_theta: f32,
}

impl VisionConfig {
    /// Reads `vision_config`; the defaults are transformers' (depth 27, hidden 1152, ...).
    pub fn from_json(v: &serde_json::Value) -> Result<Self, String> {
        let get = |k: &str, d: usize| v.get(k).and_then(|x| x.as_u64()).map_or(d, |x| x as usize);
        let c = Self {
            depth: get("depth", 27),
            hidden_size: get("hidden_size", 1152),
            num_heads: get("num_heads", 16),
            intermediate_size: get("intermediate_size", 4304),
            out_hidden_size: get("out_hidden_size", 3584),
            patch_size: get("patch_size", 16),
            temporal_patch_size: get("temporal_patch_size", 2),
            spatial_merge_size: get("spatial_merge_size", 2),
            num_position_embeddings: get("num_position_embeddings", 2304),
            in_channels: get("in_channels", 3),
            rope_theta: v
                .pointer("/rope_parameters/rope_theta")
                .and_then(|x| x.as_f64())
                .unwrap_or(10_000.0) as f32,
        };
        let side = (c.num_position_embeddings as f64).sqrt() as usize;
        if c.num_heads == 0
            || !c.hidden_size.is_multiple_of(c.num_heads)
            || !(c.hidden_size / c.num_heads).is_multiple_of(4)
        {
            return Err(format!(
                "vision_config: hidden_size {} must split into num_heads {} heads of a multiple of 4",
                c.hidden_size, c.num_heads
            ));
        }
        if side * side != c.num_position_embeddings || side < 2 || c.spatial_merge_size == 0 {
            return Err(format!(
                "vision_config: num_position_embeddings {} must be a square of at least 4, spatial_merge_size positive",
                c.num_position_embeddings
            ));
        }
        Ok(c)
    }

    pub(crate) fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Values in one patch row: channels × temporal frames × patch × patch.
    pub fn patch_len(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// `y = x·Wᵀ + b`.
pub(crate) struct Linear {
    /// `[outputs, inputs]`, f32.
    pub(crate) w: Weight,
    pub(crate) b: Vec<f32>,
}

impl Linear {
    fn new(w: Vec<f32>, b: Vec<f32>, inputs: usize) -> Result<Self, String> {
        if inputs == 0 || w.len() != b.len() * inputs {
            return Err(format!(
                "a weight of {} values does not fit {} outputs of {inputs} inputs",
                w.len(),
                b.len()
            ));
        }
        Ok(Self {
            w: Weight::from_f32(vec![b.len(), inputs], &w),
            b,
        })
    }
}

/// LayerNorm with bias (eps 1e-6).
pub(crate) struct LayerNorm {
    pub(crate) w: Vec<f32>,
    pub(crate) b: Vec<f32>,
}

/// One transformer block of the tower.
pub(crate) struct Block {
    pub(crate) norm1: LayerNorm,
    pub(crate) qkv: Linear,
    pub(crate) proj: Linear,
    pub(crate) norm2: LayerNorm,
    pub(crate) fc1: Linear,
    pub(crate) fc2: Linear,
}

/// The tower's weights and settings, and the device its layers run on.
pub struct VisionTower {
    pub(crate) config: VisionConfig,
    pub(crate) patch: Linear,
    /// The learned positions `[num_position_embeddings, hidden]`.
    pub(crate) positions: Vec<f32>,
    pub(crate) blocks: Vec<Block>,
    pub(crate) merger_norm: LayerNorm,
    pub(crate) merger_fc1: Linear,
    pub(crate) merger_fc2: Linear,
    pub(crate) device: Box<dyn VisionDevice>,
}

impl VisionTower {
    /// The tower of the checkpoint in `dir` (HF names `model.visual.*` or `visual.*`, MLX
    /// `vision_tower.*`), or `None` when its config.json has no `vision_config` or its weights
    /// hold no tower (a text-only conversion that kept the config).
    pub fn load(dir: &Path) -> Result<Option<Self>, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ModelError::Json {
                path: path.clone(),
                source,
            })?;
        let Some(v) = json.get("vision_config") else {
            return Ok(None);
        };
        let config =
            VisionConfig::from_json(v).map_err(|message| ModelError::Config { path, message })?;
        let ck = Checkpoint::open(dir)?;
        let Some(prefix) = ["model.visual.", "visual.", "vision_tower."]
            .into_iter()
            .find(|p| ck.contains(&format!("{p}pos_embed.weight")))
        else {
            tracing::warn!(
                "{}: config.json has a vision_config but the weights hold no vision tower; serving text only",
                dir.display()
            );
            return Ok(None);
        };
        let patch = format!("{prefix}patch_embed.proj.weight");
        let (d, (c, t, p)) = (
            config.hidden_size,
            (
                config.in_channels,
                config.temporal_patch_size,
                config.patch_size,
            ),
        );
        // MLX stores the Conv3d kernel channels last: [D, T, P, P, C].
        let mlx_patch = ck.get(&patch)?.shape() == [d, t, p, p, c];
        let tensor = |name: &str| -> Result<Vec<f32>, ModelError> {
            let w = ck.get(&format!("{prefix}{name}"))?.to_f32_vec();
            Ok(if mlx_patch && name == "patch_embed.proj.weight" {
                channels_first(&w, d, (c, t, p))
            } else {
                w
            })
        };
        Self::from_tensors(config, tensor).map(Some)
    }

    /// The tower of a llama.cpp `mmproj` GGUF file (`clip.projector_type` `qwen3vl_merger`):
    /// its settings from the `clip.vision.*` metadata, its tensors renamed to transformers'
    /// (the two temporal frames of the patch kernel, stored apart, put together).
    pub fn load_gguf(path: &Path) -> Result<Self, ModelError> {
        let err = |message: String| ModelError::Gguf {
            path: path.to_path_buf(),
            message,
        };
        let mut config = None;
        let (ck, _) = Checkpoint::open_gguf(&[path.to_path_buf()], |h| {
            let projector = h.get("clip.projector_type").and_then(GgufValue::as_str);
            if projector != Some("qwen3vl_merger") {
                return Err(err(format!(
                    "clip.projector_type is {projector:?}: splash reads Qwen3-VL / Qwen3.5 projectors (qwen3vl_merger) only"
                )));
            }
            let int = |key: &str| -> Result<usize, ModelError> {
                h.get(&format!("clip.vision.{key}"))
                    .and_then(GgufValue::as_u64)
                    .map(|x| x as usize)
                    .ok_or_else(|| err(format!("clip.vision.{key} is missing")))
            };
            let positions = h
                .tensors
                .iter()
                .find(|t| t.name == "v.position_embd.weight")
                .map(|t| t.dims.get(1).copied().unwrap_or(0) as usize)
                .ok_or_else(|| err("v.position_embd.weight is missing".into()))?;
            let json = serde_json::json!({
                "depth": int("block_count")?,
                "hidden_size": int("embedding_length")?,
                "num_heads": int("attention.head_count")?,
                "intermediate_size": int("feed_forward_length")?,
                "out_hidden_size": int("projection_dim")?,
                "patch_size": int("patch_size")?,
                "spatial_merge_size": int("spatial_merge_size")?,
                "num_position_embeddings": positions,
            });
            config = Some(VisionConfig::from_json(&json).map_err(err)?);
            Ok(|name: &str, shape: &[usize]| gguf_name(name).map(|hf| (hf, shape.to_vec())))
        })?;
        let config = config.expect("set by the plan");
        let (d, c, p) = (config.hidden_size, config.in_channels, config.patch_size);
        let tensor = |name: &str| -> Result<Vec<f32>, ModelError> {
            if name != "patch_embed.proj.weight" {
                return Ok(ck.get(name)?.to_f32_vec());
            }
            // Frames [D, C, P, P] each → [D, C, T, P, P].
            let frames = [
                ck.get("patch.frame0")?.to_f32_vec(),
                ck.get("patch.frame1")?.to_f32_vec(),
            ];
            let mut w = vec![0.0f32; d * c * 2 * p * p];
            for (i, out) in w.chunks_exact_mut(p * p).enumerate() {
                let (dc, t) = (i / 2, i % 2);
                out.copy_from_slice(&frames[t][dc * p * p..][..p * p]);
            }
            Ok(w)
        };
        Self::from_tensors(config, tensor)
    }

    /// The tower from its tensors under transformers' names (after `model.visual.`), in f32.
    fn from_tensors(
        config: VisionConfig,
        tensor: impl Fn(&str) -> Result<Vec<f32>, ModelError>,
    ) -> Result<Self, ModelError> {
        let linear = |name: &str, inputs: usize| -> Result<Linear, ModelError> {
            let w = tensor(&format!("{name}.weight"))?;
            let b = tensor(&format!("{name}.bias"))?;
            Linear::new(w, b, inputs)
                .map_err(|e| ModelError::Image(format!("vision tower tensor `{name}.weight`: {e}")))
        };
        let norm = |name: &str| -> Result<LayerNorm, ModelError> {
            Ok(LayerNorm {
                w: tensor(&format!("{name}.weight"))?,
                b: tensor(&format!("{name}.bias"))?,
            })
        };
        let (d, m) = (config.hidden_size, config.spatial_merge_size);
        let blocks = (0..config.depth)
            .map(|i| {
                let b = format!("blocks.{i}");
                Ok(Block {
                    norm1: norm(&format!("{b}.norm1"))?,
                    qkv: linear(&format!("{b}.attn.qkv"), d)?,
                    proj: linear(&format!("{b}.attn.proj"), d)?,
                    norm2: norm(&format!("{b}.norm2"))?,
                    fc1: linear(&format!("{b}.mlp.linear_fc1"), d)?,
                    fc2: linear(&format!("{b}.mlp.linear_fc2"), config.intermediate_size)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let tower = Self {
            // The Conv3d kernel [D, C, T, P, P] is a [D, C·T·P·P] matrix over patch rows.
            patch: linear("patch_embed.proj", config.patch_len())?,
            positions: tensor("pos_embed.weight")?,
            blocks,
            merger_norm: norm("merger.norm")?,
            merger_fc1: linear("merger.linear_fc1", d * m * m)?,
            merger_fc2: linear("merger.linear_fc2", d * m * m)?,
            config,
            device: Box::new(CpuTower),
        };
        Ok(tower)
    }

    /// The tower's settings.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// Runs the layers where `text` runs (this build has no GPU device: on the CPU).
    #[cfg(not(feature = "cuda"))]
    pub fn place_like(&mut self, _text: &crate::Qwen35) -> Result<(), ModelError> {
        Ok(())
    }

    /// Memory one image of `patches` patches takes while it is encoded (an upper bound over
    /// the devices): the activations, the patch rows, and the bf16 copy of a product's input.
    pub fn activation_bytes(&self, patches: usize) -> u64 {
        let c = &self.config;
        let (d, mlp) = (c.hidden_size, c.intermediate_size);
        let hdp = c.head_dim().div_ceil(16) * 16;
        let per_patch = 4 * (3 * d + 3 * d + mlp + c.patch_len())
            + 2 * 3 * c.num_heads * hdp
            + 2 * mlp.max(c.patch_len());
        (patches * per_patch) as u64
    }

    /// The GPU's launches so far, by kernel (SPLASH_GPU_PROFILE); `None` otherwise.
    pub fn gpu_profile(&self) -> Option<Vec<splash_backend::profile::ProfileRow>> {
        self.device.profile()
    }

    /// Where the layers run: "cpu" or the GPU's name.
    pub fn device(&self) -> String {
        self.device.name()
    }

    /// Host memory the weights take (f32).
    pub fn memory_bytes(&self) -> u64 {
        let linear = |l: &Linear| l.w.len() + l.b.len();
        let norm = |n: &LayerNorm| n.w.len() + n.b.len();
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                norm(&b.norm1)
                    + linear(&b.qkv)
                    + linear(&b.proj)
                    + norm(&b.norm2)
                    + linear(&b.fc1)
                    + linear(&b.fc2)
            })
            .sum();
        let rest = linear(&self.patch)
            + self.positions.len()
            + norm(&self.merger_norm)
            + linear(&self.merger_fc1)
            + linear(&self.merger_fc2);
        4 * (blocks + rest) as u64
    }

    /// The embeddings of one prepared image: `[tokens, out_hidden_size]`, one per merged
    /// block, in the order the image's `<|image_pad|>` tokens take them.
    pub fn encode(&self, image: &PreparedImage) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let (gh, gw) = image.grid;
        let n = gh * gw;
        let m = c.spatial_merge_size;
        if image.rows.len() != n * c.patch_len() || gh % m != 0 || gw % m != 0 {
            return Err(ModelError::Image(format!(
                "an image of {gh}×{gw} patches with {} values does not fit the tower ({} values a patch, merge {m})",
                image.rows.len(),
                c.patch_len()
            )));
        }
        // Each patch's (row, column) in the image, in the rows' merge-block order.
        let coords: Vec<(usize, usize)> = (0..n)
            .map(|i| {
                let (block, within) = (i / (m * m), i % (m * m));
                let (br, bc) = (block / (gw / m), block % (gw / m));
                (br * m + within / m, bc * m + within % m)
            })
            .collect();
        let taps = self.position_taps(&coords, gh, gw);
        let (cos, sin) = self.rotary(&coords);
        self.device.encode(
            self,
            &TowerPass {
                rows: &image.rows,
                n,
                taps: &taps,
                cos: &cos,
                sin: &sin,
            },
        )
    }

    /// Each patch's four taps into the learned positions, resampled bilinearly (align corners)
    /// from their square grid to the image's, in f32 as transformers computes the weights.
    fn position_taps(&self, coords: &[(usize, usize)], gh: usize, gw: usize) -> Vec<PositionTaps> {
        let side = (self.config.num_position_embeddings as f64).sqrt() as usize;
        let taps = |i: usize, len: usize| -> (usize, usize, f32) {
            let pos = if len == 1 {
                0.0
            } else {
                i as f32 * (side - 1) as f32 / (len - 1) as f32
            };
            let lo = (pos.floor() as usize).min(side - 1);
            (lo, (lo + 1).min(side - 1), pos - lo as f32)
        };
        coords
            .iter()
            .map(|&(r, col)| {
                let (r0, r1, dr) = taps(r, gh);
                let (c0, c1, dc) = taps(col, gw);
                [
                    (r0 * side + c0, (1.0 - dr) * (1.0 - dc)),
                    (r0 * side + c1, (1.0 - dr) * dc),
                    (r1 * side + c0, dr * (1.0 - dc)),
                    (r1 * side + c1, dr * dc),
                ]
            })
            .collect()
    }

    /// Cos and sin of the 2-D rotary angles, `[n, head_dim]`: the first quarter of the
    /// frequencies turn with the row, the second with the column, and the second half of the
    /// head repeats the first (rotate-half pairs i with i + head_dim/2).
    fn rotary(&self, coords: &[(usize, usize)]) -> (Vec<f32>, Vec<f32>) {
        let hd = self.config.head_dim();
        let quarter = hd / 4;
        let inv: Vec<f32> = (0..quarter)
            .map(|k| {
                1.0 / self
                    .config
                    .rope_theta
                    .powf((2 * k) as f32 / (hd / 2) as f32)
            })
            .collect();
        let (mut cos, mut sin) = (
            Vec::with_capacity(coords.len() * hd),
            Vec::with_capacity(coords.len() * hd),
        );
        for &(r, c) in coords {
            let angles: Vec<f32> = inv
                .iter()
                .map(|f| r as f32 * f)
                .chain(inv.iter().map(|f| c as f32 * f))
                .collect();
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos()));
                sin.extend(angles.iter().map(|a| a.sin()));
            }
        }
        (cos, sin)
    }
}

/// An MLX patch kernel `[D, T, P, P, C]` as transformers' `[D, C, T, P, P]`.
fn channels_first(w: &[f32], d: usize, (c, t, p): (usize, usize, usize)) -> Vec<f32> {
    let mut out = vec![0.0f32; w.len()];
    for di in 0..d {
        for ti in 0..t {
            for y in 0..p {
                for x in 0..p {
                    for ci in 0..c {
                        let from = (((di * t + ti) * p + y) * p + x) * c + ci;
                        let to = (((di * c + ci) * t + ti) * p + y) * p + x;
                        out[to] = w[from];
                    }
                }
            }
        }
    }
    out
}

/// The transformers name (after `model.visual.`) of an mmproj tensor; the patch kernel's two
/// frames as `patch.frame0` / `patch.frame1`. `None` for tensors the tower does not use.
fn gguf_name(name: &str) -> Option<String> {
    let fixed = match name {
        "v.patch_embd.weight" => "patch.frame0",
        "v.patch_embd.weight.1" => "patch.frame1",
        "v.patch_embd.bias" => "patch_embed.proj.bias",
        "v.position_embd.weight" => "pos_embed.weight",
        "v.post_ln.weight" => "merger.norm.weight",
        "v.post_ln.bias" => "merger.norm.bias",
        "mm.0.weight" => "merger.linear_fc1.weight",
        "mm.0.bias" => "merger.linear_fc1.bias",
        "mm.2.weight" => "merger.linear_fc2.weight",
        "mm.2.bias" => "merger.linear_fc2.bias",
        _ => "",
    };
    if !fixed.is_empty() {
        return Some(fixed.to_string());
    }
    let rest = name.strip_prefix("v.blk.")?;
    let (block, rest) = rest.split_once('.')?;
    let (part, kind) = rest.rsplit_once('.')?;
    let part = match part {
        "ln1" => "norm1",
        "ln2" => "norm2",
        "attn_qkv" => "attn.qkv",
        "attn_out" => "attn.proj",
        "ffn_up" => "mlp.linear_fc1",
        "ffn_down" => "mlp.linear_fc2",
        _ => return None,
    };
    Some(format!("blocks.{block}.{part}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(name)
    }

    /// The tiny towers of two fixtures against transformers' `model.visual` on three grids
    /// (`make_vision_reference.py`): merged embeddings within 5e-6 of the largest (they are
    /// within 2–4e-7 of values about 0.25).
    #[test]
    fn the_tower_matches_transformers() {
        for dir in ["qwen35-moe", "qwen35-vl-tied"] {
            let tower = VisionTower::load(&fixture(dir)).unwrap().unwrap();
            let ck = Checkpoint::open(&fixture(&format!("vision/tower-{dir}"))).unwrap();
            for k in 0..3 {
                let g = ck.get(&format!("grid{k}")).unwrap().to_f32_vec();
                let (gh, gw) = (g[0] as usize, g[1] as usize);
                let width = tower.config().patch_len();
                let rows = (0..gh * gw)
                    .flat_map(|i| {
                        (0..width).map(move |j| ((i * 131 + j * 71) % 255) as f32 / 127.5 - 1.0)
                    })
                    .collect();
                let got = tower
                    .encode(&PreparedImage {
                        grid: (gh, gw),
                        rows,
                    })
                    .unwrap();
                let want = ck.get(&format!("merged{k}")).unwrap().to_f32_vec();
                assert_eq!(got.len(), want.len(), "{dir} grid {k}");
                let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                println!("{dir} grid {gh}×{gw}: off by {worst:.2e} (largest {scale})");
                assert!(
                    worst <= 5e-6 * scale,
                    "{dir} grid {gh}×{gw}: off by {worst} (largest {scale})"
                );
            }
        }
    }
}
