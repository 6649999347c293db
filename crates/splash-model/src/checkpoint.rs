//! A directory of safetensors shards, memory-mapped: tensors are views into the maps.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use splash_backend::{DType, HostBytes, Weight};

use crate::error::{read_json, ModelError};

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the file.
    start: usize,
    end: usize,
}

/// The tensors of a checkpoint directory, by name.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, Arc<Mmap>)>,
    tensors: HashMap<String, Entry>,
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
            let file = File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: the map is read-only; like every mmap-based loader we rely on the file not
            // being truncated while the server runs.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
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
                        dtype: info.dtype,
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
            files,
            tensors,
        })
    }

    /// The checkpoint directory.
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
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => {
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
        if e.dtype != Dtype::U32 || e.shape != packed {
            return Err(ModelError::Config {
                path: path.clone(),
                message: format!(
                    "tensor `{name}` is {:?} {:?}; a {bits}-bit group-{group} quantised weight of shape {shape:?} is U32 {packed:?} (check `quantization` in config.json)",
                    e.dtype, e.shape
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
