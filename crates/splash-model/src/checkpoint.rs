//! The tensors of a checkpoint, memory-mapped: a directory of safetensors shards, or the
//! GGUF file(s) of one model. Tensors are views into the maps.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use splash_backend::ggml::GgmlType;
use splash_backend::{DType, HostBytes, Weight};

use crate::error::{read_json, ModelError};
use crate::gguf::GgufHeader;

/// How a tensor's elements are stored.
#[derive(Clone, Copy)]
enum Stored {
    Safetensors(Dtype),
    Ggml(GgmlType),
}

/// The file format of a checkpoint, which decides how some values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Hugging Face or MLX safetensors.
    Safetensors,
    /// llama.cpp GGUF: tensors renamed to the HF names at open, norms stored as `1 + w`,
    /// `ssm_a` = `-exp(A_log)`, V heads of GDN layers in tiled order (model-spec §5.3).
    Gguf,
}

struct Entry {
    file: usize,
    dtype: Stored,
    shape: Vec<usize>,
    /// Byte range inside the file.
    start: usize,
    end: usize,
}

/// The tensors of a checkpoint directory, by name.
pub struct Checkpoint {
    dir: PathBuf,
    format: Format,
    files: Vec<(PathBuf, Arc<Mmap>)>,
    tensors: HashMap<String, Entry>,
}

/// Maps a file read-only.
fn map_file(path: &Path) -> Result<Mmap, ModelError> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is read-only; like every mmap-based loader we rely on the file not
    // being truncated while the server runs.
    unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))
}

impl Checkpoint {
    /// Maps every shard of `dir`: those listed in `model.safetensors.index.json`, else every
    /// `*.safetensors` file. Reads only the headers.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let mut names: Vec<String> = Vec::new();
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let v = read_json(&index)?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::config(&index, "missing `weight_map` object"))?;
            for f in map.values().filter_map(|f| f.as_str()) {
                if !names.iter().any(|n| n == f) {
                    names.push(f.to_string());
                }
            }
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
            for entry in rd {
                let name = entry.map_err(|e| ModelError::io(dir, e))?.file_name();
                let name = name.to_string_lossy();
                if name.ends_with(".safetensors") {
                    names.push(name.into_owned());
                }
            }
            names.sort();
        }
        if names.is_empty() {
            return Err(ModelError::config(
                dir,
                "no *.safetensors weights found (expected model.safetensors or shards with model.safetensors.index.json)",
            ));
        }
        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        for name in names {
            let path = dir.join(&name);
            let map = map_file(&path)?;
            let (header_len, meta) =
                SafeTensors::read_metadata(&map[..]).map_err(|e| ModelError::Safetensors {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            let data_start = 8 + header_len;
            for (tname, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                tensors.insert(
                    tname,
                    Entry {
                        file: files.len(),
                        dtype: Stored::Safetensors(info.dtype),
                        shape: info.shape.clone(),
                        start: data_start + s,
                        end: data_start + e,
                    },
                );
            }
            files.push((path, Arc::new(map)));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            format: Format::Safetensors,
            files,
            tensors,
        })
    }

    /// Maps the GGUF file(s) of one model (all parts of a split model) and returns the
    /// checkpoint with the first file's header. `plan` sees that header first (each header is
    /// parsed once) and returns the renaming: each tensor (name, shape outermost first) gets
    /// its HF name and shape, or `None` when the model does not use it. Every used tensor's
    /// type is checked here, so an unsupported quantisation is refused by name before any
    /// weight is read.
    pub fn open_gguf<R>(
        paths: &[PathBuf],
        plan: impl FnOnce(&GgufHeader) -> Result<R, ModelError>,
    ) -> Result<(Self, GgufHeader), ModelError>
    where
        R: Fn(&str, &[usize]) -> Option<(String, Vec<usize>)>,
    {
        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        let mut first = None;
        let mut plan = Some(plan);
        let mut rename = None;
        for path in paths {
            let map = map_file(path)?;
            let header = GgufHeader::parse(path, &map[..])?;
            if let Some(plan) = plan.take() {
                rename = Some(plan(&header)?);
            }
            let rename = rename.as_ref().expect("planned on the first file");
            for t in &header.tensors {
                let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
                let Some((name, shape)) = rename(&t.name, &shape) else {
                    continue;
                };
                let ty = GgmlType::from_id(t.type_id).map_err(|known| ModelError::Gguf {
                    path: path.clone(),
                    message: format!(
                        "tensor `{}` has type {}, which splash cannot read yet (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS); pick another quantisation of this model",
                        t.name,
                        known.map_or(format!("id {}", t.type_id), str::to_string)
                    ),
                })?;
                let cols = *shape.last().unwrap_or(&1);
                let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
                let bytes = (cols.is_multiple_of(ty.block_elems()))
                    .then(|| rows * ty.row_bytes(cols))
                    .ok_or_else(|| ModelError::Gguf {
                        path: path.clone(),
                        message: format!(
                            "tensor `{}` {shape:?} does not fill whole {ty} blocks",
                            t.name
                        ),
                    })?;
                let start = header.data_start + t.offset;
                let end = start + bytes as u64;
                if end > map.len() as u64 {
                    return Err(ModelError::Gguf {
                        path: path.clone(),
                        message: format!(
                            "tensor `{}` ends at byte {end} but the file has {} bytes (truncated download?)",
                            t.name,
                            map.len()
                        ),
                    });
                }
                tensors.insert(
                    name,
                    Entry {
                        file: files.len(),
                        dtype: Stored::Ggml(ty),
                        shape,
                        start: start as usize,
                        end: end as usize,
                    },
                );
            }
            files.push((path.clone(), Arc::new(map)));
            first.get_or_insert(header);
        }
        let header = first.ok_or_else(|| ModelError::config(".", "no GGUF file given"))?;
        let dir = paths[0].clone();
        Ok((
            Self {
                dir,
                format: Format::Gguf,
                files,
                tensors,
            },
            header,
        ))
    }

    /// The file format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Total size of the mapped weight files.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|(_, m)| m.len() as u64).sum()
    }

    /// The checkpoint directory (the first file of a GGUF checkpoint).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True when the checkpoint holds a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the checkpoint holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The tensor `name`, a view into the mapped file.
    pub fn get(&self, name: &str) -> Result<Weight, ModelError> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
                dir: self.dir.clone(),
            })?;
        let (path, map) = &self.files[e.file];
        let dtype = match e.dtype {
            Stored::Safetensors(Dtype::F32) | Stored::Ggml(GgmlType::F32) => DType::F32,
            Stored::Safetensors(Dtype::F16) | Stored::Ggml(GgmlType::F16) => DType::F16,
            Stored::Safetensors(Dtype::BF16) | Stored::Ggml(GgmlType::BF16) => DType::BF16,
            Stored::Ggml(t) => DType::Ggml(t),
            Stored::Safetensors(other) => {
                return Err(ModelError::TensorDtype {
                    name: name.to_string(),
                    file: path.clone(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map.clone();
        let bytes = HostBytes::new(owner, e.start..e.end);
        Weight::new(dtype, e.shape.clone(), bytes).map_err(|source| ModelError::TensorLayout {
            name: name.to_string(),
            file: path.clone(),
            source,
        })
    }

    /// The affine-quantised (MLX) weight of `module`: packed codes in `{module}.weight`, group
    /// scales and biases in `{module}.scales` / `.biases`; `shape` is the unpacked shape.
    pub fn get_affine(
        &self,
        module: &str,
        shape: &[usize],
        bits: u32,
        group: usize,
    ) -> Result<Weight, ModelError> {
        let name = format!("{module}.weight");
        let e = self
            .tensors
            .get(&name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.clone(),
                dir: self.dir.clone(),
            })?;
        let (path, map) = &self.files[e.file];
        let layout = |source| ModelError::TensorLayout {
            name: name.clone(),
            file: path.clone(),
            source,
        };
        let cols = *shape.last().unwrap_or(&0);
        let mut packed = shape.to_vec();
        *packed.last_mut().expect("non-empty shape") = cols * bits as usize / 32;
        if !matches!(e.dtype, Stored::Safetensors(Dtype::U32)) || e.shape != packed {
            return Err(ModelError::Config {
                path: path.clone(),
                message: format!(
                    "tensor `{name}` has shape {:?}; a {bits}-bit group-{group} quantised weight of shape {shape:?} is U32 {packed:?} (check `quantization` in config.json)",
                    e.shape
                ),
            });
        }
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map.clone();
        let codes = HostBytes::new(owner, e.start..e.end);
        let scales = self.get(&format!("{module}.scales"))?;
        let biases = self.get(&format!("{module}.biases"))?;
        Weight::affine(shape.to_vec(), bits, group, codes, scales, biases).map_err(layout)
    }

    /// The tensor `name`, which must have exactly `shape`.
    pub fn get_shaped(&self, name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
        let w = self.get(name)?;
        w.expect_shape(shape)
            .map_err(|source| ModelError::TensorLayout {
                name: name.to_string(),
                file: self.files[self.tensors[name].file].0.clone(),
                source,
            })?;
        Ok(w)
    }
}
