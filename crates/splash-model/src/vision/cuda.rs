//! The vision tower's layers on the GPU: the products on cuBLAS in bf16 with f32 accumulation,
//! the attention on the tensor cores (f16, head dim padded to a multiple of 16), the norms,
//! activations and residuals in f32 (kernels/vision.cu). The tower runs on a stream of its
//! own, so that images are encoded while the text model decodes.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use splash_backend::cuda::{self as dev, ptr, Activation, DeviceWeight, Gpu, KernelDims, Kernels};
use splash_backend::{DType, HostBytes, Weight};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::vision::device::{TowerPass, VisionDevice};
use crate::vision::tower::{LayerNorm, Linear};
use crate::vision::VisionTower;

struct GpuLinear {
    w: DeviceWeight,
    b: CudaSlice<f32>,
}

struct GpuNorm {
    w: CudaSlice<f32>,
    b: CudaSlice<f32>,
}

struct GpuBlock {
    norm1: GpuNorm,
    qkv: GpuLinear,
    proj: GpuLinear,
    norm2: GpuNorm,
    fc1: GpuLinear,
    fc2: GpuLinear,
}

/// The tower's weights on one GPU.
pub(crate) struct GpuTower {
    gpu: Arc<Gpu>,
    k: Arc<Kernels>,
    patch: GpuLinear,
    positions: CudaSlice<f32>,
    blocks: Vec<GpuBlock>,
    merger_norm: GpuNorm,
    merger_fc1: GpuLinear,
    merger_fc2: GpuLinear,
    /// The attention kernels' head dim.
    padded_head_dim: usize,
}

impl VisionTower {
    /// Runs the layers where `text` runs: on its GPU (through a handle of the tower's own),
    /// or on the CPU.
    pub fn place_like(&mut self, text: &crate::Qwen35) -> Result<(), ModelError> {
        let Some(gpu) = text.gpu() else {
            return Ok(());
        };
        let own = Gpu::with_options(gpu.ordinal(), gpu.options())?;
        self.to_gpu(own, text.config())
    }

    /// Moves the tower's layers to `gpu` (a handle of its own: its own stream), the weights
    /// copied in bf16. The kernels are those compiled for the text model `text` (one
    /// compilation for both).
    pub fn to_gpu(&mut self, gpu: Arc<Gpu>, text: &ModelConfig) -> Result<(), ModelError> {
        let hd = self.config.head_dim();
        let padded_head_dim = dev::padded_head_dim(hd).ok_or_else(|| {
            ModelError::Gpu(format!(
                "the GPU vision tower takes head dims up to 128 (this tower's is {hd})"
            ))
        })?;
        let k = gpu.kernels(KernelDims {
            head_dim: text.head_dim,
            gdn_dk: text.gdn.dk,
            gdn_dv: text.gdn.dv,
        })?;
        let g = &*gpu;
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                Ok(GpuBlock {
                    norm1: upload_norm(g, &b.norm1)?,
                    qkv: upload_linear(g, &b.qkv)?,
                    proj: upload_linear(g, &b.proj)?,
                    norm2: upload_norm(g, &b.norm2)?,
                    fc1: upload_linear(g, &b.fc1)?,
                    fc2: upload_linear(g, &b.fc2)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let tower = GpuTower {
            patch: upload_linear(g, &self.patch)?,
            positions: g.upload(&self.positions)?,
            blocks,
            merger_norm: upload_norm(g, &self.merger_norm)?,
            merger_fc1: upload_linear(g, &self.merger_fc1)?,
            merger_fc2: upload_linear(g, &self.merger_fc2)?,
            padded_head_dim,
            k,
            gpu,
        };
        self.device = Box::new(tower);
        Ok(())
    }
}

fn upload_linear(gpu: &Gpu, l: &Linear) -> Result<GpuLinear, ModelError> {
    let bytes: Vec<u8> =
        l.w.f32_data()
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
    let w = Weight::new(
        DType::BF16,
        l.w.shape().to_vec(),
        HostBytes::from_vec(bytes),
    )
    .map_err(|e| ModelError::Gpu(e.to_string()))?;
    Ok(GpuLinear {
        w: gpu.upload_weight(&w)?,
        b: gpu.upload(&l.b)?,
    })
}

fn upload_norm(gpu: &Gpu, n: &LayerNorm) -> Result<GpuNorm, ModelError> {
    Ok(GpuNorm {
        w: gpu.upload(&n.w)?,
        b: gpu.upload(&n.b)?,
    })
}

impl GpuTower {
    /// `out = act(x · Wᵀ + b)` for `rows` rows, or with `residual`, `residual += x · Wᵀ + b`
    /// (`out` its scratch).
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        out: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        l: &GpuLinear,
        rows: usize,
        act: Activation,
        residual: Option<&CudaSlice<f32>>,
    ) -> Result<(), ModelError> {
        let (g, k) = (&*self.gpu, &*self.k);
        let out = ptr(g, out, 0);
        dev::matmul_dense(g, k, out, ptr(g, x, 0), &l.w, rows)?;
        let residual = residual.map(|r| ptr(g, r, 0));
        dev::bias_act(g, k, out, ptr(g, &l.b, 0), residual, rows, l.w.rows(), act)?;
        Ok(())
    }

    /// `out = LayerNorm(x)` for `rows` rows of `d`.
    fn norm(
        &self,
        out: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        n: &GpuNorm,
        rows: usize,
        d: usize,
    ) -> Result<(), ModelError> {
        let g = &*self.gpu;
        let (w, b) = (ptr(g, &n.w, 0), ptr(g, &n.b, 0));
        dev::layer_norm(
            g,
            &self.k,
            ptr(g, x, 0),
            (w, b),
            ptr(g, out, 0),
            rows,
            d,
            1e-6,
        )?;
        Ok(())
    }
}

impl VisionDevice for GpuTower {
    fn encode(&self, t: &VisionTower, pass: &TowerPass) -> Result<Vec<f32>, ModelError> {
        let c = &t.config;
        let (g, k) = (&*self.gpu, &*self.k);
        let (n, d, heads, hd) = (pass.n, c.hidden_size, c.num_heads, c.head_dim());
        let (hdp, m2) = (
            self.padded_head_dim,
            c.spatial_merge_size * c.spatial_merge_size,
        );
        let merged = n / m2;

        let rows = g.upload(pass.rows)?;
        let x = g.uninit::<f32>(n * d)?;
        self.linear(&x, &rows, &self.patch, n, Activation::None, None)?;
        drop(rows);
        let taps: Vec<i32> = pass
            .taps
            .iter()
            .flat_map(|t| t.map(|(p, _)| p as i32))
            .collect();
        let weights: Vec<f32> = pass.taps.iter().flat_map(|t| t.map(|(_, w)| w)).collect();
        let (taps, weights) = (g.upload(&taps)?, g.upload(&weights)?);
        let table = (ptr(g, &taps, 0), ptr(g, &weights, 0));
        dev::add_position_taps(g, k, ptr(g, &x, 0), ptr(g, &self.positions, 0), table, n, d)?;
        let (cos, sin) = (g.upload(pass.cos)?, g.upload(pass.sin)?);

        let h = g.uninit::<f32>(n * d)?;
        let tmp = g.uninit::<f32>(n * d)?;
        let qkv = g.uninit::<f32>(n * 3 * d)?;
        let heads_len = heads * n * hdp;
        let (q, kh, v) = (
            g.uninit::<u16>(heads_len)?,
            g.uninit::<u16>(heads_len)?,
            g.uninit::<u16>(heads_len)?,
        );
        let mid = g.uninit::<f32>(n * c.intermediate_size)?;
        let fp = |b: &CudaSlice<f32>| ptr(g, b, 0);
        let hp = |b: &CudaSlice<u16>| ptr(g, b, 0);
        // The attention's softmax is in base 2.
        let scale = std::f32::consts::LOG2_E / (hd as f32).sqrt();
        for b in &self.blocks {
            self.norm(&h, &x, &b.norm1, n, d)?;
            self.linear(&qkv, &h, &b.qkv, n, Activation::None, None)?;
            let (qp, kp, vp) = (hp(&q), hp(&kh), hp(&v));
            let rot = (fp(&cos), fp(&sin));
            dev::vision_qkv(
                g,
                k,
                fp(&qkv),
                rot,
                (qp, kp, vp),
                n,
                (heads, hd, hdp),
                scale,
            )?;
            dev::vision_attention(g, k, (qp, kp, vp), fp(&h), n, (heads, hd, hdp))?;
            self.linear(&tmp, &h, &b.proj, n, Activation::None, Some(&x))?;
            self.norm(&h, &x, &b.norm2, n, d)?;
            self.linear(&mid, &h, &b.fc1, n, Activation::GeluTanh, None)?;
            self.linear(&tmp, &mid, &b.fc2, n, Activation::None, Some(&x))?;
        }
        // The merger normalises each patch, then reads m² consecutive rows as one.
        self.norm(&h, &x, &self.merger_norm, n, d)?;
        let wide = g.uninit::<f32>(merged * m2 * d)?;
        self.linear(
            &wide,
            &h,
            &self.merger_fc1,
            merged,
            Activation::GeluErf,
            None,
        )?;
        let out = g.uninit::<f32>(merged * c.out_hidden_size)?;
        self.linear(
            &out,
            &wide,
            &self.merger_fc2,
            merged,
            Activation::None,
            None,
        )?;
        Ok(g.download(&out, merged * c.out_hidden_size)?)
    }

    fn name(&self) -> String {
        self.gpu.name().to_string()
    }

    fn profile(&self) -> Option<Vec<splash_backend::profile::ProfileRow>> {
        self.gpu.profile_table()
    }
}
