//! The vision tower (transformers' `Qwen3_5VisionModel`, the same for qwen3_5 and
//! qwen3_5_moe), on the CPU in f32: the reference its device versions are checked against.
//! Patch rows in, one embedding of the text model's width per merged 2×2 block out.

use std::path::Path;

use splash_backend::cpu::matmul;
use splash_backend::Weight;

use crate::checkpoint::Checkpoint;
use crate::error::ModelError;
use crate::gguf::Value as GgufValue;
use crate::vision::PreparedImage;

/// Queries a block of the tower's attention takes at once (its scores: block × patches).
const ATTENTION_BLOCK: usize = 256;

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

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Values in one patch row: channels × temporal frames × patch × patch.
    pub fn patch_len(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// `y = x·Wᵀ + b`.
struct Linear {
    /// `[outputs, inputs]`, f32.
    w: Weight,
    b: Vec<f32>,
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

    /// `x` `[T, inputs]` → `[T, outputs]` (the CPU backend's tiled, threaded product).
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let outputs = self.b.len();
        let mut y = vec![0.0f32; x.len() / self.w.cols() * outputs];
        matmul(&mut y, x, &self.w);
        for row in y.chunks_exact_mut(outputs) {
            row.iter_mut().zip(&self.b).for_each(|(v, b)| *v += b);
        }
        y
    }
}

struct LayerNorm {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl LayerNorm {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = self.w.len();
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks_exact(n) {
            let mean = row.iter().sum::<f32>() / n as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let inv = 1.0 / (var + 1e-6).sqrt();
            y.extend(
                row.iter()
                    .zip(&self.w)
                    .zip(&self.b)
                    .map(|((v, w), b)| (v - mean) * inv * w + b),
            );
        }
        y
    }
}

struct Block {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// The tower's weights and settings.
pub struct VisionTower {
    config: VisionConfig,
    patch: Linear,
    positions: Vec<f32>,
    blocks: Vec<Block>,
    merger_norm: LayerNorm,
    merger_fc1: Linear,
    merger_fc2: Linear,
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
        };
        Ok(tower)
    }

    /// The tower's settings.
    pub fn config(&self) -> &VisionConfig {
        &self.config
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
        let mut x = self.patch.apply(&image.rows);
        self.add_positions(&mut x, &coords, gh, gw);
        let (cos, sin) = self.rotary(&coords);
        for b in &self.blocks {
            let h = b.norm1.apply(&x);
            let attn = b
                .proj
                .apply(&self.attention(&b.qkv.apply(&h), &cos, &sin, n));
            x.iter_mut().zip(attn).for_each(|(x, a)| *x += a);
            let mut mid = b.fc1.apply(&b.norm2.apply(&x));
            mid.iter_mut().for_each(|v| *v = gelu_tanh(*v));
            x.iter_mut()
                .zip(b.fc2.apply(&mid))
                .for_each(|(x, a)| *x += a);
        }
        // The merger normalises each patch, then reads m·m consecutive rows as one.
        let mut mid = self.merger_fc1.apply(&self.merger_norm.apply(&x));
        mid.iter_mut().for_each(|v| *v = gelu_erf(*v));
        Ok(self.merger_fc2.apply(&mid))
    }

    /// Adds the learned positions, resampled bilinearly (align corners) from their square
    /// grid to the image's, in f32 as transformers computes the weights.
    fn add_positions(&self, x: &mut [f32], coords: &[(usize, usize)], gh: usize, gw: usize) {
        let d = self.config.hidden_size;
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
        for (row, &(r, col)) in x.chunks_exact_mut(d).zip(coords) {
            let (r0, r1, dr) = taps(r, gh);
            let (c0, c1, dc) = taps(col, gw);
            let corners = [
                (r0 * side + c0, (1.0 - dr) * (1.0 - dc)),
                (r0 * side + c1, (1.0 - dr) * dc),
                (r1 * side + c0, dr * (1.0 - dc)),
                (r1 * side + c1, dr * dc),
            ];
            for (k, v) in row.iter_mut().enumerate() {
                *v += corners
                    .iter()
                    .map(|&(p, w)| self.positions[p * d + k] * w)
                    .sum::<f32>();
            }
        }
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

    /// Bidirectional attention over the image's own patches, every head, rotary on the
    /// queries and keys; `qkv` rows are `[3, heads, head_dim]`. Per head, blocks of queries
    /// against all keys through the backend's products (a block's scores, not all n², are
    /// held at once).
    fn attention(&self, qkv: &[f32], cos: &[f32], sin: &[f32], n: usize) -> Vec<f32> {
        let (heads, hd, d) = (
            self.config.num_heads,
            self.config.head_dim(),
            self.config.hidden_size,
        );
        let half = hd / 2;
        let rotate = |v: &[f32], i: usize, out: &mut [f32]| {
            let (c, s) = (&cos[i * hd..(i + 1) * hd], &sin[i * hd..(i + 1) * hd]);
            for j in 0..hd {
                let other = if j < half { -v[j + half] } else { v[j - half] };
                out[j] = v[j] * c[j] + other * s[j];
            }
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let block = ATTENTION_BLOCK.min(n);
        let mut out = vec![0.0f32; n * d];
        let (mut q, mut k, mut vt) = (
            vec![0.0f32; n * hd],
            vec![0.0f32; n * hd],
            vec![0.0f32; hd * n],
        );
        let mut scores = vec![0.0f32; block * n];
        let mut o = vec![0.0f32; block * hd];
        for h in 0..heads {
            let part = |i: usize, which: usize| &qkv[i * 3 * d + which * d + h * hd..][..hd];
            for i in 0..n {
                rotate(part(i, 0), i, &mut q[i * hd..(i + 1) * hd]);
                rotate(part(i, 1), i, &mut k[i * hd..(i + 1) * hd]);
                for (j, &v) in part(i, 2).iter().enumerate() {
                    vt[j * n + i] = v;
                }
            }
            let keys = Weight::from_f32(vec![n, hd], &k);
            let values = Weight::from_f32(vec![hd, n], &vt);
            for start in (0..n).step_by(block) {
                let rows = block.min(n - start);
                let s = &mut scores[..rows * n];
                matmul(s, &q[start * hd..(start + rows) * hd], &keys);
                for row in s.chunks_exact_mut(n) {
                    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) * scale;
                    let mut total = 0.0f32;
                    for x in row.iter_mut() {
                        *x = (*x * scale - max).exp();
                        total += *x;
                    }
                    row.iter_mut().for_each(|x| *x /= total);
                }
                let o = &mut o[..rows * hd];
                matmul(o, s, &values);
                for (r, vals) in o.chunks_exact(hd).enumerate() {
                    out[(start + r) * d + h * hd..][..hd].copy_from_slice(vals);
                }
            }
        }
        out
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

/// GELU, tanh approximation (`gelu_pytorch_tanh`, the blocks').
fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// GELU, exact (`nn.GELU()`, the merger's).
fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// The error function to f32 precision: Numerical Recipes' Chebyshev fit of erfc (fractional
/// error below 1.2e-7), in f64.
fn erf(x: f32) -> f32 {
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = t
        * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    (if x >= 0.0 { 1.0 - y } else { y - 1.0 }) as f32
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

    #[test]
    fn erf_is_accurate() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
            (3.5, 0.999_999_3),
        ] {
            assert!((erf(x) - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
        }
    }
}
