//! The layers on the device: Gated DeltaNet, gated attention, the MLP and the MoE block,
//! each over the rows of all the sequences of a pass.

use super::*;

pub(super) struct GpuGdn {
    /// `in_proj_qkv` and `in_proj_z`.
    pub(super) in_qkv_z: WeightPair,
    /// `in_proj_b` and `in_proj_a` (the gates' inputs, one row per value head each).
    in_b_a: WeightPair,
    conv: Buf,
    conv_kernel: usize,
    dt_bias: Buf,
    neg_a: Buf,
    norm: Buf,
    out: DeviceWeight,
    hk: usize,
    pub(super) hv: usize,
    dv: usize,
    tiled: bool,
}

pub(super) struct GpuAttn {
    q: DeviceWeight,
    k: DeviceWeight,
    v: DeviceWeight,
    o: DeviceWeight,
    q_norm: Buf,
    k_norm: Buf,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

pub(super) struct GpuMlp {
    gate_up: WeightPair,
    down: DeviceWeight,
}

/// Two weights that multiply the same input: stacked into one device weight (the rows of the
/// first, then the second) when one GEMV launch can run both (`dev::pairs_in_one_launch`),
/// else apart.
pub(crate) enum WeightPair {
    Stacked { w: DeviceWeight, split: usize },
    Apart(DeviceWeight, DeviceWeight),
}

impl WeightPair {
    /// `a` and `b` on the device; stacked when `stack` allows and one GEMV launch can run
    /// both (the tensor-core GEMV with `a`'s rows filling whole 16-row tiles, the int8 GEMV).
    pub(crate) fn upload(
        gpu: &Gpu,
        a: &Weight,
        b: &Weight,
        stack: bool,
    ) -> Result<Self, ModelError> {
        let one_launch =
            dev::GpuFormat::of(a.dtype()).is_ok_and(|f| dev::pairs_in_one_launch(f, a.rows()));
        if stack && one_launch {
            if let Some(ab) = a.stack_rows(b) {
                return Ok(Self::Stacked {
                    w: gpu.upload_weight(&ab)?,
                    split: a.rows(),
                });
            }
        }
        Ok(Self::Apart(gpu.upload_weight(a)?, gpu.upload_weight(b)?))
    }

    /// The weight that holds the first product's rows (for its input format).
    pub(super) fn first(&self) -> &DeviceWeight {
        match self {
            Self::Stacked { w, .. } => w,
            Self::Apart(a, _) => a,
        }
    }

    /// Rows of the first and second weight.
    pub(crate) fn rows(&self) -> (usize, usize) {
        match self {
            Self::Stacked { w, split } => (*split, w.rows() - split),
            Self::Apart(a, b) => (a.rows(), b.rows()),
        }
    }

    /// The products `x · Aᵀ` into `out.0` and `x · Bᵀ` into `out.1` as entries of a
    /// [`dev::matmul_group`], pushed onto `group`.
    fn group_products<'a>(&'a self, out: (u64, u64), group: &mut Vec<dev::GroupProduct<'a>>) {
        match self {
            Self::Stacked { w, split } => group.push(dev::GroupProduct {
                w,
                split: *split,
                out,
            }),
            Self::Apart(a, b) => {
                for (w, y) in [(a, out.0), (b, out.1)] {
                    group.push(dev::GroupProduct {
                        w,
                        split: w.rows(),
                        out: (y, 0),
                    });
                }
            }
        }
    }

    /// `x · Aᵀ` into `out.0` and `x · Bᵀ` into `out.1`.
    fn multiply(
        &self,
        m: &GpuModel,
        out: (u64, u64),
        x: &dev::Activations,
    ) -> Result<(), ModelError> {
        self.multiply_on(&m.gpu, &m.k, out, x, false)
    }

    /// [`multiply`](Self::multiply) with `gpu`'s kernels `k`; apart, each product by
    /// `dev::matmul_batched` when `batched` (cuBLAS from two tokens on for BF16: a draft's
    /// block) or `dev::matmul_activations`.
    pub(crate) fn multiply_on(
        &self,
        gpu: &Gpu,
        k: &Kernels,
        out: (u64, u64),
        x: &dev::Activations,
        batched: bool,
    ) -> Result<(), ModelError> {
        let product = if batched {
            dev::matmul_batched
        } else {
            dev::matmul_activations
        };
        match self {
            Self::Stacked { w, split } => dev::matmul_pair(gpu, k, out, x, w, *split)?,
            Self::Apart(a, b) => {
                product(gpu, k, out.0, x, a, 0, a.rows())?;
                product(gpu, k, out.1, x, b, 0, b.rows())?;
            }
        }
        Ok(())
    }
}

pub(super) struct GpuMoe {
    /// The router (experts' logits) and the shared expert's gate (one row), stacked when one
    /// launch can run both: two small products of the same input.
    gates: WeightPair,
    experts: Vec<GpuMlp>,
    top_k: usize,
    shared: GpuMlp,
    /// The experts' weight addresses, when every expert of each projection has the same
    /// tensor-core format and shape: routing and expert products then stay on the device.
    tables: Option<ExpertTables>,
}

impl GpuMoe {
    /// The first products of the layer's input over `tokens` rows: the grouped experts when the
    /// shared expert is one of their pairs, else the shared expert's.
    pub(super) fn input_products(&self, gpu: &Gpu, tokens: usize) -> dev::NextProducts<'_> {
        if self.folds(gpu, tokens) {
            dev::NextProducts::Experts
        } else {
            dev::NextProducts::Weights(self.shared.input_weight(), None)
        }
    }

    /// The expert tables when this layer routes on the device (not in the exact mode).
    pub(super) fn device_tables(&self, gpu: &Gpu) -> Option<&ExpertTables> {
        self.tables.as_ref().filter(|_| !gpu.exact())
    }

    /// Whether the shared expert runs as each token's first pair of the grouped products: where
    /// it would run as GEMVs (passes of a few tokens, and batch-invariant ones), else on its own
    /// before them.
    fn shared_grouped(&self, gpu: &Gpu, tokens: usize) -> bool {
        self.device_tables(gpu).is_some_and(|t| t.with_shared)
            && gpu.options().shared_expert_grouped
            && dev::swiglu_fused(gpu, &self.shared.down, tokens)
    }

    /// Whether the launches around the layer fold its small ones (`GpuOptions::fold_moe`, with
    /// the shared expert grouped): the norm before it writes the experts' f16 input and the
    /// residual add after it sums the pairs.
    fn folds(&self, gpu: &Gpu, tokens: usize) -> bool {
        self.shared_grouped(gpu, tokens) && gpu.options().fold_moe
    }
}

/// Whether `a` and `b` have one format and shape (one expert kernel launch can run both).
fn same_layout(a: &DeviceWeight, b: &DeviceWeight) -> bool {
    a.format() == b.format()
        && (a.rows(), a.cols(), a.row_bytes()) == (b.rows(), b.cols(), b.row_bytes())
}

/// Device tables of a MoE layer's expert weights, one address per expert and projection.
pub(super) struct ExpertTables {
    gate: CudaSlice<u64>,
    up: CudaSlice<u64>,
    down: CudaSlice<u64>,
    /// The tables end with the shared expert (entry `experts.len()`): it has the routed
    /// experts' formats and shapes, so the grouped products can run it as one more pair.
    with_shared: bool,
}

impl ExpertTables {
    /// The tables of `experts` (and of `shared` after them where it fits), or `None` when one
    /// projection mixes formats or shapes or has no device kernel for grouped experts.
    fn new(gpu: &Gpu, experts: &[GpuMlp], shared: &GpuMlp) -> Result<Option<Self>, ModelError> {
        let Some(first) = experts.first() else {
            return Ok(None);
        };
        let (gate, up) = first.expert_weights();
        let protos = [gate, up, &first.down];
        let uniform = |pick: fn(&GpuMlp) -> &DeviceWeight, proto: &DeviceWeight| {
            dev::has_expert_kernel(proto) && experts.iter().map(pick).all(|w| same_layout(w, proto))
        };
        if !(uniform(|e| e.expert_weights().0, gate)
            && uniform(|e| e.expert_weights().1, up)
            && uniform(|e| &e.down, &first.down))
        {
            return Ok(None);
        }
        let extra = shared_entries(gpu, shared, protos);
        let table = |i: usize| -> Result<CudaSlice<u64>, ModelError> {
            let mut ptrs: Vec<u64> = experts
                .iter()
                .map(|e| {
                    let (g, u) = e.expert_weights();
                    [g, u, &e.down][i].device_ptr(gpu)
                })
                .collect();
            ptrs.extend(extra.map(|p| p[i]));
            Ok(gpu.upload(&ptrs)?)
        };
        Ok(Some(Self {
            gate: table(0)?,
            up: table(1)?,
            down: table(2)?,
            with_shared: extra.is_some(),
        }))
    }
}

/// The device addresses of the shared expert's gate, up and down weights when each has the
/// format and shape of `protos` (a routed expert's gate, up and down), stacked or not.
fn shared_entries(gpu: &Gpu, shared: &GpuMlp, protos: [&DeviceWeight; 3]) -> Option<[u64; 3]> {
    // `rows` rows of `w` laid out as `proto`.
    let like = |w: &DeviceWeight, rows: usize, proto: &DeviceWeight| {
        w.format() == proto.format()
            && (rows, w.cols(), w.row_bytes()) == (proto.rows(), proto.cols(), proto.row_bytes())
    };
    let (gate, up) = match &shared.gate_up {
        WeightPair::Apart(g, u) => (like(g, g.rows(), protos[0]) && like(u, u.rows(), protos[1]))
            .then(|| (g.device_ptr(gpu), u.device_ptr(gpu)))?,
        // The up rows start at row `split`, a whole tile (tiles are 16 rows of row_bytes).
        WeightPair::Stacked { w, split } => {
            (like(w, *split, protos[0]) && like(w, w.rows() - split, protos[1])).then(|| {
                let base = w.device_ptr(gpu);
                (base, base + (split * w.row_bytes()) as u64)
            })?
        }
    };
    same_layout(&shared.down, protos[2]).then(|| [gate, up, shared.down.device_ptr(gpu)])
}

/// A FFN's output: rows `[T, hidden]`, or a MoE layer's pair outputs that the residual add after
/// it weights and sums (the shared expert routed as a pair: one launch fewer).
pub(super) enum FfnOut {
    Rows(Buf),
    Pairs {
        y: Buf,
        routing: Box<dev::ExpertRouting>,
    },
}

impl FfnOut {
    /// What the residual add after the FFN adds.
    pub(super) fn addend(&self, gpu: &Gpu) -> dev::Addend<'_> {
        match self {
            Self::Rows(b) => dev::Addend::Rows(ptr(gpu, b, 0)),
            Self::Pairs { y, routing } => dev::Addend::Pairs {
                y: ptr(gpu, y, 0),
                routing,
            },
        }
    }

    /// The output as rows `[tokens, d]` (pairs summed by `moe_combine`).
    pub(super) fn into_rows(
        self,
        m: &GpuModel,
        tokens: usize,
        d: usize,
    ) -> Result<Buf, ModelError> {
        match self {
            Self::Rows(b) => Ok(b),
            Self::Pairs { y, routing } => {
                let (gpu, k) = (&*m.gpu, &*m.k);
                let out = m.scratch(tokens * d)?;
                let (op, yp) = (ptr(gpu, &out, 0), ptr(gpu, &y, 0));
                dev::moe_combine(gpu, k, op, yp, None, &routing, tokens, d)?;
                Ok(out)
            }
        }
    }
}

/// A sequence's share of a GDN layer in a batched pass.
pub(super) struct GdnSeq<'a> {
    pub(super) rows: SeqRows,
    pub(super) conv: &'a mut Buf,
    pub(super) rec: &'a mut Buf,
    pub(super) record: Option<&'a mut GdnReplay>,
}

/// A sequence's share of an attention layer in a batched pass.
pub(super) struct AttnSeq<'a> {
    pub(super) rows: SeqRows,
    pub(super) state: &'a mut GpuLayerState,
    pub(super) kv: KvFormat,
    pub(super) pos: dev::Position,
    /// The rows' rotary positions per frequency on the device, where they are not their cache
    /// positions (see [`super::GpuItem::rotary_table`]).
    pub(super) table: Option<u64>,
}

impl GpuMlp {
    /// `m` on the device, gate and up stacked when `stack` allows (not for routed experts,
    /// whose grouped products take each projection's own weight).
    pub(super) fn upload(gpu: &Gpu, m: &Mlp, stack: bool) -> Result<Self, ModelError> {
        Ok(Self {
            gate_up: WeightPair::upload(gpu, &m.gate, &m.up, stack)?,
            down: gpu.upload_weight(&m.down)?,
        })
    }

    /// The gate and up weights of a routed expert (uploaded apart).
    fn expert_weights(&self) -> (&DeviceWeight, &DeviceWeight) {
        match &self.gate_up {
            WeightPair::Apart(gate, up) => (gate, up),
            WeightPair::Stacked { .. } => unreachable!("routed experts are uploaded apart"),
        }
    }

    /// The weight of the first product of the MLP's input.
    pub(super) fn input_weight(&self) -> &DeviceWeight {
        self.gate_up.first()
    }

    /// `down(silu(gate x) * up x)`.
    pub(super) fn forward(&self, m: &GpuModel, x: &dev::Activations) -> Result<Buf, ModelError> {
        let (gpu, k, t) = (&*m.gpu, &*m.k, x.tokens());
        let i = self.gate_up.rows().0;
        let g = m.scratch(t * i)?;
        let u = m.scratch(t * i)?;
        self.gate_up
            .multiply(m, (ptr(gpu, &g, 0), ptr(gpu, &u, 0)), x)?;
        let out = m.scratch(t * self.down.rows())?;
        dev::matmul_swiglu(
            gpu,
            k,
            ptr(gpu, &out, 0),
            ptr(gpu, &g, 0),
            ptr(gpu, &u, 0),
            &self.down,
            t,
        )?;
        Ok(out)
    }
}

impl GpuModel {
    /// The routed experts and the gated shared expert. With expert tables (tensor-core
    /// formats, not the exact mode) everything stays on the device: routing, one grouped
    /// product per projection, the weighted sum. Otherwise routing (softmax, top-k,
    /// renormalise) runs on the host over the downloaded router logits, exactly as the CPU
    /// does, and each chosen expert runs on its tokens.
    pub(super) fn moe(&self, moe: &GpuMoe, xa: &dev::Activations) -> Result<FfnOut, ModelError> {
        let GpuMoe {
            gates,
            experts,
            top_k,
            shared,
            tables: _,
        } = moe;
        let (gpu, k) = (&*self.gpu, &*self.k);
        let (e, h) = (gates.rows().0, gates.first().cols());
        let (x, t) = (xa.rows(), xa.tokens());
        // One conversion of x for the router, the shared expert and the routed experts.
        let logits = self.scratch(t * e)?;
        let sg = self.scratch(t)?;
        gates.multiply(self, (ptr(gpu, &logits, 0), ptr(gpu, &sg, 0)), xa)?;
        if let Some(tables) = moe.device_tables(gpu) {
            let grouped = moe.shared_grouped(gpu, t);
            let out = if grouped {
                None
            } else {
                Some(shared.forward(self, xa)?)
            };
            let sg = ptr(gpu, &sg, 0);
            let routing = dev::moe_route(
                gpu,
                k,
                ptr(gpu, &logits, 0),
                t,
                (e, *top_k),
                grouped.then_some(sg),
            )?;
            let (per, first) = (routing.per_token, &experts[0]);
            let pairs = t * per;
            let (first_gate, first_up) = first.expert_weights();
            let inter = first_gate.rows();
            let g = self.scratch(pairs * inter)?;
            let u = self.scratch(pairs * inter)?;
            let (gp, up) = (ptr(gpu, &g, 0), ptr(gpu, &u, 0));
            let table = |b: &CudaSlice<u64>| ptr(gpu, b, 0);
            let (gate_p, up_p) = ((table(&tables.gate), gp), (table(&tables.up), up));
            if same_layout(first_gate, first_up) {
                dev::matmul_expert_pair(gpu, k, [gate_p, up_p], xa, first_gate, &routing, per)?;
            } else {
                for ((tp, op), w) in [(gate_p, first_gate), (up_p, first_up)] {
                    dev::matmul_experts(gpu, k, op, xa, tp, w, &routing, per)?;
                }
            }
            let y = self.scratch(pairs * h)?;
            let yp = ptr(gpu, &y, 0);
            let down = table(&tables.down);
            dev::matmul_experts_swiglu(gpu, k, yp, (gp, up), down, &first.down, &routing, pairs)?;
            // The shared expert's gate is applied in the same launch as the experts' sum; as
            // a pair's weight, the residual add after the layer sums the pairs.
            let Some(out) = out else {
                let pairs = FfnOut::Pairs {
                    y,
                    routing: Box::new(routing),
                };
                if moe.folds(gpu, t) {
                    return Ok(pairs);
                }
                return Ok(FfnOut::Rows(pairs.into_rows(self, t, h)?));
            };
            dev::moe_combine(gpu, k, ptr(gpu, &out, 0), yp, Some(sg), &routing, t, h)?;
            return Ok(FfnOut::Rows(out));
        }
        let out = shared.forward(self, xa)?;
        dev::scale_rows_sigmoid(gpu, k, ptr(gpu, &out, 0), ptr(gpu, &sg, 0), t, h)?;
        let mut probs = gpu.download(&logits, t * e)?;
        let routed = crate::qwen35::ffn::route(&mut probs, e, *top_k);
        for (expert, tokens) in experts.iter().zip(&routed) {
            if tokens.is_empty() {
                continue;
            }
            let n = tokens.len();
            let idx: Vec<i32> = tokens.iter().map(|&(ti, _)| ti as i32).collect();
            let weights: Vec<f32> = tokens.iter().map(|&(_, w)| w).collect();
            let idx_d = gpu.upload(&idx)?;
            let w_d = gpu.upload(&weights)?;
            let xs = self.scratch(n * h)?;
            dev::gather_rows(gpu, k, ptr(gpu, &xs, 0), x, ptr(gpu, &idx_d, 0), n, h)?;
            let y = expert.forward(self, &dev::Activations::new(ptr(gpu, &xs, 0), n, h))?;
            dev::scatter_add_rows(
                gpu,
                k,
                ptr(gpu, &out, 0),
                ptr(gpu, &y, 0),
                ptr(gpu, &idx_d, 0),
                ptr(gpu, &w_d, 0),
                n,
                h,
            )?;
        }
        Ok(FfnOut::Rows(out))
    }
}

pub(super) fn upload_gdn(
    gpu: &Gpu,
    cfg: &ModelConfig,
    d: &GatedDeltaNet,
) -> Result<GpuGdn, ModelError> {
    Ok(GpuGdn {
        in_qkv_z: WeightPair::upload(gpu, &d.in_qkv, &d.in_z, true)?,
        in_b_a: WeightPair::upload(gpu, &d.in_b, &d.in_a, true)?,
        conv: upload_vec(gpu, &d.conv)?,
        conv_kernel: cfg.conv_kernel,
        dt_bias: upload_vec(gpu, &d.dt_bias)?,
        neg_a: upload_vec(gpu, &d.neg_a)?,
        norm: upload_vec(gpu, &d.norm)?,
        out: gpu.upload_weight(&d.out)?,
        hk: d.dims.hk,
        hv: d.dims.hv,
        dv: d.dims.dv,
        tiled: d.dims.v_order == VHeadOrder::Tiled,
    })
}

pub(super) fn upload_attn(gpu: &Gpu, a: &Attention) -> Result<GpuAttn, ModelError> {
    Ok(GpuAttn {
        q: gpu.upload_weight(&a.q)?,
        k: gpu.upload_weight(&a.k)?,
        v: gpu.upload_weight(&a.v)?,
        o: gpu.upload_weight(&a.o)?,
        q_norm: upload_vec(gpu, &a.q_norm)?,
        k_norm: upload_vec(gpu, &a.k_norm)?,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
    })
}

pub(super) fn upload_moe(gpu: &Gpu, m: &Moe) -> Result<GpuFfn, ModelError> {
    let experts = m
        .experts
        .iter()
        .map(|e| GpuMlp::upload(gpu, e, false))
        .collect::<Result<Vec<_>, _>>()?;
    let shared = GpuMlp::upload(gpu, &m.shared, true)?;
    let tables = ExpertTables::new(gpu, &experts, &shared)?;
    Ok(GpuFfn::Moe(Box::new(GpuMoe {
        gates: WeightPair::upload(gpu, &m.router, &m.shared_gate, true)?,
        tables,
        experts,
        top_k: m.top_k,
        shared,
    })))
}

impl GpuGdn {
    /// The weight of the first product of the layer's input.
    pub(super) fn input_weight(&self) -> &DeviceWeight {
        self.in_qkv_z.first()
    }

    /// The weight of the gates' product (b and a) of the layer's input.
    pub(super) fn gates_weight(&self) -> &DeviceWeight {
        self.in_b_a.first()
    }

    /// The layer over the rows of `x` belonging to the sequences `parts`: projections for all
    /// rows, conv and scan of every sequence in one launch each, each on its own state. For a
    /// part that records, those kernels also save its conv and recurrent state before the pass
    /// and its rows' conv inputs and gates.
    pub(super) fn forward(
        &self,
        m: &GpuModel,
        x: &dev::Activations,
        parts: &mut [GdnSeq<'_>],
        eps: f32,
    ) -> Result<Buf, ModelError> {
        let (gpu, k, t) = (&*m.gpu, &*m.k, x.tokens());
        let (c, vd) = self.in_qkv_z.rows();
        let qkv = m.scratch(t * c)?;
        let z = m.scratch(t * vd)?;
        let b = m.scratch(t * self.hv)?;
        let a = m.scratch(t * self.hv)?;
        // The gates' small product in the same launch as the large one where it can be.
        let (qkv_z, b_a) = (
            (ptr(gpu, &qkv, 0), ptr(gpu, &z, 0)),
            (ptr(gpu, &b, 0), ptr(gpu, &a, 0)),
        );
        let mut group = Vec::with_capacity(4);
        self.in_qkv_z.group_products(qkv_z, &mut group);
        self.in_b_a.group_products(b_a, &mut group);
        if !dev::matmul_group(gpu, k, x, &group)? {
            self.in_qkv_z.multiply(m, qkv_z, x)?;
            self.in_b_a.multiply(m, b_a, x)?;
        }
        // With GpuOptions::fold_launches the per-token scan makes the gates from the raw a and b
        // itself; only chunked prefill parts get them from gdn_gates (below).
        let fold = gpu.options().fold_launches;
        let (dt_bias, neg_a) = (ptr(gpu, &self.dt_bias, 0), ptr(gpu, &self.neg_a, 0));
        let gates = |off: usize, n: usize| {
            let at = (off * self.hv * 4) as u64;
            dev::gdn_gates(
                gpu,
                k,
                ptr(gpu, &b, 0) + at,
                ptr(gpu, &a, 0) + at,
                dt_bias,
                neg_a,
                self.hv,
                n * self.hv,
            )
        };
        if !fold {
            gates(0, t)?;
        }
        let mixed = m.scratch(t * c)?;
        let o = m.scratch(t * vd)?;
        // Conv and scan of every sequence in one launch each, on their own states; a recorded
        // sequence's kernels save its states before the pass, its conv inputs and its gates.
        let seqs = |recurrent: bool| -> Vec<dev::SeqPart> {
            parts
                .iter()
                .map(|p| {
                    let save = match (&p.record, recurrent) {
                        (None, _) => [0; 3],
                        (Some(r), false) => [ptr(gpu, &r.conv, 0), ptr(gpu, &r.qkv, 0), 0],
                        (Some(r), true) => [
                            ptr(gpu, &r.recurrent, 0),
                            ptr(gpu, &r.g, 0),
                            ptr(gpu, &r.beta, 0),
                        ],
                    };
                    dev::SeqPart {
                        state: ptr(gpu, if recurrent { &*p.rec } else { &*p.conv }, 0),
                        save,
                        off: p.rows.off,
                        n: p.rows.t,
                    }
                })
                .collect()
        };
        dev::conv1d_silu_seqs(
            gpu,
            k,
            ptr(gpu, &mixed, 0),
            ptr(gpu, &qkv, 0),
            &seqs(false),
            ptr(gpu, &self.conv, 0),
            c,
            self.conv_kernel,
        )?;
        // With GpuOptions::gdn_chunked, prefill chunks scan in the chunked form; decode rows and
        // verify blocks (which record) always token by token, so that a verified token gets the
        // bits decoding it alone gives.
        let chunked = dev::gdn_chunked_prefill(gpu);
        let (long, short): (Vec<_>, Vec<_>) = seqs(true).into_iter().partition(|p| {
            chunked && p.save == [0; 3] && p.n > splash_backend::cpu::ROW_BY_ROW_TOKENS
        });
        dev::gdn_recurrent_seqs(
            gpu,
            k,
            ptr(gpu, &o, 0),
            ptr(gpu, &mixed, 0),
            (ptr(gpu, &a, 0), ptr(gpu, &b, 0)),
            fold.then_some((dt_bias, neg_a)),
            &short,
            self.hk,
            self.hv,
            self.tiled,
        )?;
        let dims = k.dims();
        for p in &long {
            if fold {
                gates(p.off, p.n)?;
            }
            let scratch = m.scratch(dev::gdn_chunk_scratch_len(
                p.n,
                self.hv,
                dims.gdn_dk,
                dims.gdn_dv,
            ))?;
            dev::gdn_chunked(
                gpu,
                k,
                ptr(gpu, &o, p.off * vd),
                ptr(gpu, &mixed, p.off * c),
                ptr(gpu, &a, p.off * self.hv),
                ptr(gpu, &b, p.off * self.hv),
                p.state,
                ptr(gpu, &scratch, 0),
                p.n,
                self.hk,
                self.hv,
                self.tiled,
            )?;
        }
        let op = ptr(gpu, &o, 0);
        let normed = dev::rms_norm_gated_activations(
            gpu,
            k,
            op,
            (op, ptr(gpu, &z, 0), ptr(gpu, &self.norm, 0)),
            t * self.hv,
            self.dv,
            eps,
            t,
            &self.out,
        )?;
        let out = m.scratch(t * self.out.rows())?;
        let rows = self.out.rows();
        dev::matmul_activations(gpu, k, ptr(gpu, &out, 0), &normed, &self.out, 0, rows)?;
        Ok(out)
    }

    /// What a rollback replay of the layer needs beside its buffers: the conv channels, the
    /// conv kernel size, and the key heads, value heads and head order of the scan.
    pub(super) fn replay_shape(&self) -> (usize, usize, (usize, usize, bool)) {
        let c = self.in_qkv_z.rows().0;
        (c, self.conv_kernel, (self.hk, self.hv, self.tiled))
    }

    /// The device address of the conv weights.
    pub(super) fn conv_weights(&self, gpu: &Gpu) -> u64 {
        ptr(gpu, &self.conv, 0)
    }
}

impl GpuAttn {
    /// The weight of the first product of the layer's input.
    pub(super) fn input_weight(&self) -> &DeviceWeight {
        &self.q
    }

    /// The layer over the rows of `x` belonging to the sequences `parts`: projections for all
    /// rows; RoPE, the cache appends and attention of every sequence in one launch each.
    pub(super) fn forward(
        &self,
        m: &GpuModel,
        x: &dev::Activations,
        parts: &mut [AttnSeq<'_>],
        eps: f32,
    ) -> Result<Buf, ModelError> {
        let (gpu, k, t) = (&*m.gpu, &*m.k, x.tokens());
        let (hq, hkv, d) = (self.heads, self.kv_heads, self.head_dim);
        let qg = m.scratch(t * hq * 2 * d)?;
        let kb = m.scratch(t * hkv * d)?;
        let vb = m.scratch(t * hkv * d)?;
        // k and v in the same launch as q where they can be.
        let products = [(&self.q, &qg), (&self.k, &kb), (&self.v, &vb)];
        let group: Vec<_> = products
            .iter()
            .map(|&(w, y)| dev::GroupProduct {
                w,
                split: w.rows(),
                out: (ptr(gpu, y, 0), 0),
            })
            .collect();
        if !dev::matmul_group(gpu, k, x, &group)? {
            for (w, y) in products {
                dev::matmul_activations(gpu, k, ptr(gpu, y, 0), x, w, 0, w.rows())?;
            }
        }
        let q = m.scratch(t * hq * d)?;
        let gate = m.scratch(t * hq * d)?;
        let (qp, gp, qgp, kp) = (
            ptr(gpu, &q, 0),
            ptr(gpu, &gate, 0),
            ptr(gpu, &qg, 0),
            ptr(gpu, &kb, 0),
        );
        let (wq, wk) = (ptr(gpu, &self.q_norm, 0), ptr(gpu, &self.k_norm, 0));
        if gpu.options().fold_launches {
            let rows = (t * hq, t * hkv);
            dev::split_q_gate_qk_norm(gpu, k, (qp, gp, qgp), kp, (wq, wk), rows, d, eps)?;
        } else {
            dev::split_q_gate(gpu, k, qp, gp, qgp, t * hq, d)?;
            dev::rms_norm(gpu, k, qp, qp, wq, t * hq, d, eps)?;
            dev::rms_norm(gpu, k, kp, kp, wk, t * hkv, d, eps)?;
        }
        // RoPE, the cache appends and attention of every sequence in one launch each, on its
        // own caches at its own positions.
        let mut seqs = Vec::with_capacity(parts.len());
        let kv = parts.first().map_or(KvFormat::F32, |p| p.kv);
        for p in parts.iter_mut() {
            let (SeqRows { off, t: n }, pos) = (p.rows, p.pos);
            assert_eq!(p.kv, kv, "the sequences of a pass share one cache format");
            // (A captured pass's caches were grown before the capture.)
            if let dev::Position::Host(pos0) = pos {
                ensure_capacity(m, p.state, kv, pos0 + n, hkv, d)?;
            }
            let GpuLayerState::Attn {
                k: kc,
                v: vc,
                ks,
                vs,
                ..
            } = &*p.state
            else {
                unreachable!("attention layer state")
            };
            seqs.push(dev::AttnPart {
                keys: (ptr(gpu, kc, 0), ptr(gpu, ks, 0)),
                values: (ptr(gpu, vc, 0), ptr(gpu, vs, 0)),
                pos,
                off,
                n,
            });
        }
        let vp = ptr(gpu, &vb, 0);
        let inv = ptr(gpu, &m.inv_freq, 0);
        if parts.iter().all(|p| p.table.is_none()) {
            dev::rope_seqs(gpu, k, qp, kp, inv, &seqs, (hq, hkv, d), m.rotary_dim)?;
        } else {
            // Rows with their own rotary positions turn by their tables, the others together.
            let mut plain = Vec::with_capacity(seqs.len());
            for (p, s) in parts.iter().zip(&seqs) {
                let SeqRows { off, t: n } = p.rows;
                match p.table {
                    Some(table) => dev::rope_table(
                        gpu,
                        k,
                        qp + (off * hq * d * 4) as u64,
                        kp + (off * hkv * d * 4) as u64,
                        inv,
                        table,
                        n,
                        (hq, hkv, d),
                        m.rotary_dim,
                    )?,
                    None => plain.push(*s),
                }
            }
            dev::rope_seqs(gpu, k, qp, kp, inv, &plain, (hq, hkv, d), m.rotary_dim)?;
        }
        dev::kv_append_seqs(gpu, k, kp, vp, kv, &seqs, hkv, d)?;
        let attn = m.scratch(t * hq * d)?;
        let scale = (d as f32).powf(-0.5);
        dev::attention_seqs(gpu, k, ptr(gpu, &attn, 0), qp, kv, &seqs, (hq, hkv), scale)?;
        let gated = dev::sigmoid_gate_activations(
            gpu,
            k,
            (ptr(gpu, &attn, 0), ptr(gpu, &gate, 0)),
            t,
            hq * d,
            &self.o,
        )?;
        let out = m.scratch(t * self.o.rows())?;
        dev::matmul_activations(gpu, k, ptr(gpu, &out, 0), &gated, &self.o, 0, self.o.rows())?;
        Ok(out)
    }
}
