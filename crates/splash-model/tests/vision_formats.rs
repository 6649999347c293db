//! The vision tower from every layout splash reads: transformers' (`model.visual.*`), MLX's
//! (`vision_tower.*`, the patch kernel channels last) and a llama.cpp `mmproj` GGUF (`v.*`,
//! `mm.*`, the patch kernel's two temporal frames apart), all made here from the same weights
//! of `tests/fixtures/qwen35-vl-tied`: each gives the same rows for the same image.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

mod common;
use common::fixture;
use splash_model::vision::{PreparedImage, VisionTower};

/// The fixture's vision tensors, by name without `model.visual.`: (shape, f32 values).
fn hf_tensors() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(fixture("qwen35-vl-tied").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            let rest = name.strip_prefix("model.visual.")?.to_string();
            assert_eq!(view.dtype(), Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            Some((rest, (view.shape().to_vec(), values)))
        })
        .collect()
}

/// A scratch directory holding the fixture's config.json, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("splash-vision-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            fixture("qwen35-vl-tied").join("config.json"),
            dir.join("config.json"),
        )
        .unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A 4×6-patch image of deterministic values (a non-square grid, so rows and columns differ).
fn image(patch_len: usize) -> PreparedImage {
    let (gh, gw) = (4, 6);
    let rows = (0..gh * gw * patch_len)
        .map(|i| ((i * 37 + 11) % 255) as f32 / 127.5 - 1.0)
        .collect();
    PreparedImage {
        grid: (gh, gw),
        rows,
    }
}

fn reference() -> (VisionTower, Vec<f32>) {
    let tower = VisionTower::load(&fixture("qwen35-vl-tied"))
        .unwrap()
        .unwrap();
    let rows = tower.encode(&image(tower.config().patch_len())).unwrap();
    (tower, rows)
}

#[test]
fn the_mlx_layout_gives_the_same_rows() {
    let (tower, want) = reference();
    let c = tower.config();
    let (d, ch, t, p) = (
        c.hidden_size,
        c.in_channels,
        c.temporal_patch_size,
        c.patch_size,
    );
    let scratch = Scratch::new("mlx");
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, (shape, values)) in hf_tensors() {
        let (shape, values) = if name == "patch_embed.proj.weight" {
            // [D, C, T, P, P] → [D, T, P, P, C].
            let mut out = vec![0.0f32; values.len()];
            for (i, v) in values.iter().enumerate() {
                let (x, rest) = (i % p, i / p);
                let (y, rest) = (rest % p, rest / p);
                let (ti, rest) = (rest % t, rest / t);
                let (ci, di) = (rest % ch, rest / ch);
                out[(((di * t + ti) * p + y) * p + x) * ch + ci] = *v;
            }
            (vec![d, t, p, p, ch], out)
        } else {
            (shape, values)
        };
        owned.push((format!("vision_tower.{name}"), shape, f32_bytes(&values)));
    }
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &scratch.0.join("model.safetensors")).unwrap();
    let mlx = VisionTower::load(&scratch.0)
        .unwrap()
        .expect("an MLX tower");
    let got = mlx.encode(&image(c.patch_len())).unwrap();
    assert!(got == want, "the MLX layout changed the rows");
}

#[test]
fn the_mmproj_gguf_gives_the_same_rows() {
    let (tower, want) = reference();
    let c = tower.config();
    let (d, ch, p) = (c.hidden_size, c.in_channels, c.patch_size);
    let scratch = Scratch::new("gguf");
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (name, (shape, values)) in hf_tensors() {
        if name == "patch_embed.proj.weight" {
            // [D, C, T, P, P] → two frames [D, C, P, P].
            for frame in 0..2 {
                let v: Vec<f32> = values
                    .chunks_exact(p * p)
                    .enumerate()
                    .filter(|(i, _)| i % 2 == frame)
                    .flat_map(|(_, c)| c.iter().copied())
                    .collect();
                let gname = if frame == 0 {
                    "v.patch_embd.weight".to_string()
                } else {
                    "v.patch_embd.weight.1".to_string()
                };
                tensors.push((gname, vec![d, ch, p, p], v));
            }
            continue;
        }
        let gname = gguf_name(&name);
        tensors.push((gname, shape, values));
    }
    let meta: Vec<(&str, Meta)> = vec![
        ("general.architecture", Meta::Str("clip")),
        ("clip.projector_type", Meta::Str("qwen3vl_merger")),
        ("clip.vision.block_count", Meta::U32(c.depth as u32)),
        ("clip.vision.embedding_length", Meta::U32(d as u32)),
        (
            "clip.vision.attention.head_count",
            Meta::U32(c.num_heads as u32),
        ),
        (
            "clip.vision.feed_forward_length",
            Meta::U32(c.intermediate_size as u32),
        ),
        (
            "clip.vision.projection_dim",
            Meta::U32(c.out_hidden_size as u32),
        ),
        ("clip.vision.patch_size", Meta::U32(p as u32)),
        (
            "clip.vision.spatial_merge_size",
            Meta::U32(c.spatial_merge_size as u32),
        ),
        ("clip.vision.attention.layer_norm_epsilon", Meta::F32(1e-6)),
    ];
    let path = scratch.0.join("mmproj-model-f32.gguf");
    write_gguf(&path, &meta, &tensors);
    let gguf = VisionTower::load_gguf(&path).unwrap();
    assert_eq!(gguf.config(), c);
    let got = gguf.encode(&image(c.patch_len())).unwrap();
    assert!(got == want, "the mmproj GGUF changed the rows");

    // Another projector is refused by name.
    let mut other = meta.clone();
    other[1] = ("clip.projector_type", Meta::Str("mlp"));
    write_gguf(&path, &other, &tensors);
    let e = VisionTower::load_gguf(&path).err().expect("refused");
    assert!(e.to_string().contains("qwen3vl_merger"), "{e}");
}

/// llama.cpp's name of a transformers vision tensor (after `model.visual.`).
fn gguf_name(name: &str) -> String {
    let fixed = [
        ("patch_embed.proj.bias", "v.patch_embd.bias"),
        ("pos_embed.weight", "v.position_embd.weight"),
        ("merger.norm.weight", "v.post_ln.weight"),
        ("merger.norm.bias", "v.post_ln.bias"),
        ("merger.linear_fc1.weight", "mm.0.weight"),
        ("merger.linear_fc1.bias", "mm.0.bias"),
        ("merger.linear_fc2.weight", "mm.2.weight"),
        ("merger.linear_fc2.bias", "mm.2.bias"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == name) {
        return g.to_string();
    }
    let rest = name.strip_prefix("blocks.").unwrap();
    let (block, rest) = rest.split_once('.').unwrap();
    let (part, kind) = rest.rsplit_once('.').unwrap();
    let part = match part {
        "norm1" => "ln1",
        "norm2" => "ln2",
        "attn.qkv" => "attn_qkv",
        "attn.proj" => "attn_out",
        "mlp.linear_fc1" => "ffn_up",
        "mlp.linear_fc2" => "ffn_down",
        other => panic!("unexpected vision tensor {other}"),
    };
    format!("v.blk.{block}.{part}.{kind}")
}

#[derive(Clone)]
enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
}

/// A GGUF v3 file of F32 tensors (shapes outermost first, as transformers'), 32-byte aligned.
fn write_gguf(path: &Path, meta: &[(&str, Meta)], tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        string(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
        }
    }
    let mut offset = 0u64;
    for (name, shape, values) in tensors {
        string(&mut out, name);
        out.extend((shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            out.extend((d as u64).to_le_bytes());
        }
        out.extend(0u32.to_le_bytes()); // F32
        out.extend(offset.to_le_bytes());
        offset += (values.len() as u64 * 4).div_ceil(32) * 32;
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    for (_, _, values) in tensors {
        out.extend(f32_bytes(values));
        out.resize(out.len().div_ceil(32) * 32, 0);
    }
    std::fs::write(path, out).unwrap();
}
