//! Launchers of kernels/affine_gemv.wgsl: decode and micro-batch products
//! with MLX affine-quantized weights (up to [`super::STREAM_MAX_M`] rows of
//! x or tokens). Larger batches take the matmul and route-list kernels,
//! which read quantized weights through kernels/affine.wgsl too.

use bytemuck::{Pod, Zeroable};
use turbospark::ops::{Matmul, Moe};
use turbospark::{DType, DownArgs, GateUpArgs, Result};

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::WgpuBuffer;

/// One problem's sizes (kernels/affine_gemv.wgsl `Prob`).
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
struct Prob {
    n: u32,
    k: u32,
    top_k: u32,
    experts: u32,
    nrb: u32,
    so: u32,
    bo: u32,
    _p: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    m: u32,
    rows: u32,
    row0: u32,
    groups_a: u32,
    a: Prob,
    /// The pair entries' second problem (zero elsewhere).
    b: Prob,
    /// `affine_gate_up_pair_slotted`: the experts the router ranks, and
    /// where the lookup's log begins (zero elsewhere).
    ranked: u32,
    log_at: u32,
    _q: [u32; 2],
}

/// Weight rows a workgroup of `affine_gemv` computes (`TEAMS * RPT`).
const ROWS: usize = 32;

/// Weight rows a team of the one-row entries holds (`RPT1`) for a weight
/// of `rows` rows: 4 (x read once for four rows, the decode's arithmetic
/// shared), 1 for small weights (k_proj full, 1024 rows: 12.3 -> 7.3 us on
/// the H200 at 096aeae; o_proj full, 2816 rows, was slower at 2).
fn rpt(rows: usize) -> usize {
    if rows >= 2048 {
        4
    } else {
        1
    }
}

/// Lanes a team of the one-row entries (`LPR`, a workgroup holding 256 /
/// LPR teams) for `teams` teams each over `span` units: enough that the
/// problem runs about 2^17 lanes (some thirty warps an SM of an H200), so
/// few rows still fill the GPU and each lane's serial work stays short,
/// between 32 and 256 and no more than the span needs.
fn lanes(teams: usize, span: usize) -> usize {
    const WANT: usize = 1 << 17;
    let by_size = (WANT / teams.max(1)).max(1);
    // the largest power of two not above by_size
    let by_size = 1 << (usize::BITS - 1 - by_size.leading_zeros());
    by_size.min(span.next_power_of_two()).clamp(32, 256)
}

/// The scales' and biases' word offsets in a binding of `len` elements of
/// `dtype` (an affine one).
fn offsets(dtype: DType, len: usize) -> [u32; 2] {
    match dtype {
        DType::Affine(a) => crate::quant::offsets(a, len),
        _ => [0, 0],
    }
}

/// The units (32 values) of a row of `k`, compiled into the one-row
/// entries.
fn units(k: usize) -> (&'static str, i64) {
    ("KU", (k / 32) as i64)
}

/// Whether these kernels take a product over `m` rows of x with weight `w`.
pub(crate) fn takes(w: &WgpuBuffer, m: usize) -> bool {
    matches!(w.dtype, DType::Affine(_)) && m <= super::STREAM_MAX_M
}

pub(crate) fn gemv(
    gpu: &Gpu,
    w: &WgpuBuffer,
    x: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Matmul,
) -> Result<()> {
    let [wd, qbits, qgroup] = super::weight_constants(w.dtype);
    // one row of x: the one-row entry (its loop's trip count compiled in)
    let r = rpt(p.n);
    let l = lanes(p.n.div_ceil(r), p.k / 32);
    let (entry, per_group, constants) = if p.m == 1 {
        let c = [
            wd,
            qbits,
            qgroup,
            units(p.k),
            ("RPT1", r as i64),
            ("LPR", l as i64),
        ];
        ("affine_gemv1", 256 / l * r, c)
    } else {
        // (KU, RPT1 and LPR are the one-row entries')
        let c = [
            wd,
            qbits,
            qgroup,
            ("MT", p.m as i64),
            ("RPT1", 4),
            ("LPR", 32),
        ];
        ("affine_gemv", ROWS, c)
    };
    let (xb, ob) = (one(x), one(out));
    for c in w.chunks.iter() {
        let (row0, rows) = super::chunk_rows(w, c, p.n);
        let [so, bo] = offsets(w.dtype, rows * p.k);
        let params = Params {
            m: p.m as u32,
            rows: rows as u32,
            row0: row0 as u32,
            groups_a: 0,
            a: Prob {
                n: p.n as u32,
                k: p.k as u32,
                so,
                bo,
                ..Default::default()
            },
            b: Prob::default(),
            ..Zeroable::zeroed()
        };
        gpu.launch(Launch {
            kernel: "affine_gemv",
            entry,
            constants: &constants,
            params: bytemuck::bytes_of(&params),
            buffers: &[
                (&c.buffer, true),
                (xb, true),
                (xb, true),
                (xb, true),
                (ob, false),
            ],
            groups: gpu.grid(rows.div_ceil(per_group) as u32),
        })?;
    }
    Ok(())
}

/// Problem `p` of an MoE phase reducing over `k`, `nrb` workgroups a
/// (token, slot) pair (phase 1) or token (phase 2). `len`: the elements
/// of the expert stack's binding (its slots', where experts are streamed).
fn moe_prob(p: &Moe, k: usize, nrb: usize, (dtype, len): (DType, usize)) -> Prob {
    let [so, bo] = offsets(dtype, len);
    Prob {
        n: p.inter as u32,
        k: k as u32,
        top_k: p.top_k as u32,
        experts: p.experts as u32,
        nrb: nrb as u32,
        so,
        bo,
        _p: 0,
    }
}

/// An MoE launch's parameters: problem `a`, and a pair's `b` after
/// `groups_a` workgroups.
fn moe_params(p: &Moe, a: Prob, b: Option<(Prob, usize)>) -> Params {
    let (b, groups_a) = b.unwrap_or_default();
    Params {
        m: p.m as u32,
        rows: p.hidden as u32,
        row0: 0,
        groups_a: groups_a as u32,
        a,
        b,
        ..Zeroable::zeroed()
    }
}

/// A team's rows (`RPT1`) and lanes (`LPR`) of the one-row MoE entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Team {
    rows: usize,
    lanes: usize,
}

impl Team {
    /// Phase 1 over `features` activations (the (token, slot) pairs' inter
    /// each, both problems' in a pair) of rows of `hidden` (a team holds a
    /// feature's gate and up rows at the least).
    fn gate_up(features: usize, hidden: usize) -> Team {
        let rows = rpt(2 * features).max(2);
        let lanes = lanes(features.div_ceil(rows / 2), hidden / 32);
        Team { rows, lanes }
    }

    /// Phase 2 over `outputs` rows of output (tokens x hidden; a pair's
    /// twice that) whose (slot, unit) tasks number at most `span`.
    fn down(outputs: usize, hidden_rows: usize, span: usize) -> Team {
        let rows = rpt(hidden_rows);
        let lanes = lanes(outputs.div_ceil(rows), span);
        Team { rows, lanes }
    }

    /// Features a phase-1 workgroup computes.
    fn features(self) -> usize {
        256 / self.lanes * self.rows / 2
    }

    /// Output rows a phase-2 workgroup computes.
    fn outputs(self) -> usize {
        256 / self.lanes * self.rows
    }

    fn constants(self) -> [(&'static str, i64); 2] {
        [("RPT1", self.rows as i64), ("LPR", self.lanes as i64)]
    }
}

/// MoE phase 1, every (token, slot) pair on its own.
pub(crate) fn gate_up(
    gpu: &Gpu,
    (x, gu, ids, act): (&WgpuBuffer, &wgpu::Buffer, &WgpuBuffer, &WgpuBuffer),
    (dtype, len): (DType, usize),
    p: &Moe,
) -> Result<()> {
    let team = Team::gate_up(p.m * p.top_k * p.inter, p.hidden);
    let nrb = p.inter.div_ceil(team.features());
    let params = moe_params(p, moe_prob(p, p.hidden, nrb, (dtype, len)), None);
    let xb = one(x);
    let [wd, qbits, qgroup] = super::weight_constants(dtype);
    let [rpt1, lpr] = team.constants();
    gpu.launch(Launch {
        kernel: "affine_gemv",
        entry: "affine_gate_up",
        constants: &[wd, qbits, qgroup, units(p.hidden), rpt1, lpr],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (gu, true),
            (xb, true),
            (one(ids), true),
            // phase 1 has no routing weights: x stands in, never read
            (xb, true),
            (one(act), false),
        ],
        groups: gpu.grid((p.m * p.top_k * nrb) as u32),
    })
}

/// MoE phase 2, a token's sum over its experts inside the workgroup that
/// owns its output rows.
pub(crate) fn down(
    gpu: &Gpu,
    (act, d, ids, wts, out): (
        &WgpuBuffer,
        &wgpu::Buffer,
        &WgpuBuffer,
        &WgpuBuffer,
        &WgpuBuffer,
    ),
    (dtype, len): (DType, usize),
    p: &Moe,
) -> Result<()> {
    let team = Team::down(p.m * p.hidden, p.m * p.hidden, p.top_k * p.inter / 32);
    let nrb = p.hidden.div_ceil(team.outputs());
    let params = moe_params(p, moe_prob(p, p.inter, nrb, (dtype, len)), None);
    let [wd, qbits, qgroup] = super::weight_constants(dtype);
    let [rpt1, lpr] = team.constants();
    gpu.launch(Launch {
        kernel: "affine_gemv",
        entry: "affine_down",
        constants: &[
            wd,
            qbits,
            qgroup,
            units(p.inter),
            ("TOPK", p.top_k as i64),
            rpt1,
            lpr,
        ],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (d, true),
            (one(act), true),
            (one(ids), true),
            (one(wts), true),
            (one(out), false),
        ],
        groups: gpu.grid((p.m * nrb) as u32),
    })
}

/// Storage bindings of the pair entries (kernels/affine_pair.wgsl, 0-9),
/// of the routed gate_up pair (0-13), and of the slotted one (0-16).
pub(crate) const PAIR_BINDINGS: u32 = 10;
pub(crate) const ROUTED_PAIR_BINDINGS: u32 = 14;
pub(crate) const SLOTTED_PAIR_BINDINGS: u32 = 17;

/// Whether the quantized pair entries take problems `a` and `b` (weights
/// `wa`, `wb`; each phase's reduced dimension passed as `k`): both weights
/// MLX affine of one format (the kernel compiles one QBITS, QGROUP and
/// scale type; a dense MLP of another format runs on its own), one
/// unsplit binding each, one hidden size and token count within the
/// one-row kernels' (both problems share a grid of the same rows), and a
/// device that binds ten storage buffers a stage. Otherwise the caller
/// runs each problem on its own (the same results).
pub(crate) fn pair_takes(
    gpu: &Gpu,
    (a, wa): (&Moe, &WgpuBuffer),
    (b, wb): (&Moe, &WgpuBuffer),
) -> bool {
    matches!(wa.dtype, DType::Affine(_))
        && wa.dtype == wb.dtype
        && !wa.tiled()
        && !wb.tiled()
        && wa.single().is_some()
        && wb.single().is_some()
        && a.hidden == b.hidden
        && a.m == b.m
        && takes(wa, a.m)
        && gpu.limits.max_storage_buffers_per_shader_stage >= PAIR_BINDINGS
}

/// Whether `affine_gate_up_pair_routed` takes the gate_up pair `(a, b)`:
/// [`pair_takes`], one token (a workgroup ranks one token's logits) and a
/// device that binds its 14 buffers. The router's shape is the routed
/// problem's (`RouterArgs::check_routes`) and within kernels/topk.wgsl's
/// bounds (`Router::validate`).
pub(crate) fn routed_pair_takes(
    gpu: &Gpu,
    a: &GateUpArgs<'_, WgpuBuffer>,
    b: &GateUpArgs<'_, WgpuBuffer>,
) -> bool {
    pair_takes(gpu, (&a.p, a.gate_up), (&b.p, b.gate_up))
        && a.p.m == 1
        && gpu.limits.max_storage_buffers_per_shader_stage >= ROUTED_PAIR_BINDINGS
}

/// Whether `affine_gate_up_pair_slotted` takes the gate_up pair `(a, b)`:
/// [`routed_pair_takes`] and a device that binds its 17 buffers.
pub(crate) fn slotted_pair_takes(
    gpu: &Gpu,
    a: &GateUpArgs<'_, WgpuBuffer>,
    b: &GateUpArgs<'_, WgpuBuffer>,
) -> bool {
    routed_pair_takes(gpu, a, b)
        && gpu.limits.max_storage_buffers_per_shader_stage >= SLOTTED_PAIR_BINDINGS
}

/// Phase 1 of problems `a` and `b` in one `affine_gemv_pair` launch (the
/// caller checked [`pair_takes`]), or with `routing = Some((logits, pes,
/// ids, weights))` `affine_gate_up_pair_routed` (one token; b's experts
/// picked from the router's scaled logits, the routing written for phase
/// 2; `b.ids` is not read).
pub(crate) fn gate_up_pair(
    gpu: &Gpu,
    (a, b): (&GateUpArgs<'_, WgpuBuffer>, &GateUpArgs<'_, WgpuBuffer>),
    routing: Option<[&WgpuBuffer; 4]>,
) -> Result<()> {
    gate_up_pair_on(gpu, (a, b), routing, None)
}

/// [`gate_up_pair`], and with `slots` (and `routing`) the routed problem's
/// weights a slot stack its experts are looked up in
/// (`affine_gate_up_pair_slotted`).
pub(crate) fn gate_up_pair_on(
    gpu: &Gpu,
    (a, b): (&GateUpArgs<'_, WgpuBuffer>, &GateUpArgs<'_, WgpuBuffer>),
    routing: Option<[&WgpuBuffer; 4]>,
    slots: Option<&super::SlotRoute<'_>>,
) -> Result<()> {
    let (pa, pb) = (&a.p, &b.p);
    let features = pa.m * pa.top_k * pa.inter + pb.m * pb.top_k * pb.inter;
    let team = Team::gate_up(features, pa.hidden);
    let nrb = (
        pa.inter.div_ceil(team.features()),
        pb.inter.div_ceil(team.features()),
    );
    let groups_a = pa.m * pa.top_k * nrb.0;
    let groups = groups_a + pb.m * pb.top_k * nrb.1;
    let (wa, wb) = (one(a.gate_up), one(b.gate_up));
    let mut params = moe_params(
        pa,
        moe_prob(pa, pa.hidden, nrb.0, (a.gate_up.dtype, a.gate_up.len)),
        Some((
            moe_prob(pb, pb.hidden, nrb.1, (b.gate_up.dtype, b.gate_up.len)),
            groups_a,
        )),
    );
    if let Some(sr) = slots {
        params.ranked = sr.ranked as u32;
        params.log_at = sr.log_at as u32;
    }
    let [wd, qbits, qgroup] = super::weight_constants(a.gate_up.dtype);
    let [rpt1, lpr] = team.constants();
    let (xa, xb) = (one(a.x), one(b.x));
    // (a fixed array, no allocation per decode layer: the plain launch
    // binds the first PAIR_BINDINGS)
    let [logits, pes, ids, wts] = routing.unwrap_or([b.x; 4]);
    let buffers = [
        (wa, true),
        (xa, true),
        (one(a.ids), true),
        // phase 1 has no routing weights: x stands in, never read
        (xa, true),
        (one(a.act), false),
        (wb, true),
        (xb, true),
        // (routed: b's ids are computed, x stands in, never read)
        (routing.map_or(one(b.ids), |_| xb), true),
        (xb, true),
        (one(b.act), false),
        (one(logits), true),
        (one(pes), true),
        (one(ids), false),
        (one(wts), false),
        (slots.map_or(xb, |sr| one(sr.table)), true),
        (slots.map_or(xb, |sr| one(sr.log)), slots.is_none()),
        (slots.map_or(xb, |sr| one(sr.slot_ids)), slots.is_none()),
    ];
    let (bound, entry) = match (routing, slots) {
        (Some(_), Some(_)) => (SLOTTED_PAIR_BINDINGS, "affine_gate_up_pair_slotted"),
        (Some(_), None) => (ROUTED_PAIR_BINDINGS, "affine_gate_up_pair_routed"),
        _ => (PAIR_BINDINGS, "affine_gate_up_pair"),
    };
    gpu.launch(Launch {
        kernel: "affine_gemv_pair",
        entry,
        constants: &[wd, qbits, qgroup, units(pa.hidden), rpt1, lpr],
        params: bytemuck::bytes_of(&params),
        buffers: &buffers[..bound as usize],
        groups: gpu.grid(groups as u32),
    })
}

/// Phase 2 of problems `a` and `b` in one `affine_down_pair` launch (the
/// caller checked [`pair_takes`]): both grids cover the same output rows,
/// each problem with its own units and slots compiled in (KU, TOPK; KU2,
/// TOPK2).
pub(crate) fn down_pair(
    gpu: &Gpu,
    a: &DownArgs<'_, WgpuBuffer>,
    b: &DownArgs<'_, WgpuBuffer>,
) -> Result<()> {
    let (pa, pb) = (&a.p, &b.p);
    let span = (pa.top_k * pa.inter).max(pb.top_k * pb.inter) / 32;
    let team = Team::down(2 * pa.m * pa.hidden, pa.m * pa.hidden, span);
    let nrb = pa.hidden.div_ceil(team.outputs());
    let groups_a = pa.m * nrb;
    let params = moe_params(
        pa,
        moe_prob(pa, pa.inter, nrb, (a.down.dtype, a.down.len)),
        Some((
            moe_prob(pb, pb.inter, nrb, (b.down.dtype, b.down.len)),
            groups_a,
        )),
    );
    let [wd, qbits, qgroup] = super::weight_constants(a.down.dtype);
    let [rpt1, lpr] = team.constants();
    let (_, ku2) = units(pb.inter);
    gpu.launch(Launch {
        kernel: "affine_gemv_pair",
        entry: "affine_down_pair",
        constants: &[
            wd,
            qbits,
            qgroup,
            units(pa.inter),
            ("TOPK", pa.top_k as i64),
            ("KU2", ku2),
            ("TOPK2", pb.top_k as i64),
            rpt1,
            lpr,
        ],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(a.down), true),
            (one(a.act), true),
            (one(a.ids), true),
            (one(a.weights), true),
            (one(a.out), false),
            (one(b.down), true),
            (one(b.act), true),
            (one(b.ids), true),
            (one(b.weights), true),
            (one(b.out), false),
        ],
        groups: gpu.grid((2 * groups_a) as u32),
    })
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    /// The lanes a team at the 26B-A4B's decode shapes, and their bounds.
    #[test]
    fn lanes_fill_the_gpu_within_bounds() {
        // LM head: 65536 teams of four rows
        assert_eq!(lanes(65536, 88), 32);
        // q_proj sliding, 1024 teams: a lane a unit
        assert_eq!(lanes(1024, 88), 128);
        // the down phase, 704 teams over 8 experts' 22 units
        assert_eq!(lanes(704, 176), 128);
        // few units a row: no more lanes than units
        assert_eq!(lanes(16, 3), 32);
        assert_eq!(lanes(1, 10_000), 256);
        assert_eq!(lanes(0, 0), 32);
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use crate::ops::layout::{check, fields};

    /// The parameter blocks as the kernels read them (ops::layout).
    #[test]
    fn params_match_wgsl() {
        check(
            ("affine_gemv", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; m, rows, row0, groups_a, a, b, ranked, log_at, _q),
            &[],
        );
        check(
            ("affine_gemv", "Prob"),
            std::mem::size_of::<Prob>(),
            fields!(Prob; n, k, top_k, experts, nrb, so, bo, _p),
            &[],
        );
    }
}

#[cfg(test)]
mod pair_tests {
    use super::*;
    use crate::tests::{backend, upload_f32, upload_u32};
    use turbospark::quant::{Affine, ScaleType};
    use turbospark::{ComputeBackend, HostBytes};

    /// A `rows` x `cols` weight at `bits`, group 32.
    fn weight(
        be: &impl ComputeBackend<Buffer = WgpuBuffer>,
        bits: u32,
        rows: usize,
        cols: usize,
    ) -> WgpuBuffer {
        let a = Affine::new(bits, 32, ScaleType::BF16).unwrap();
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0)
            .collect();
        let q = turbospark::quant::quantize(&v, bits as u8, 32);
        let sd = a.scales.dtype();
        let bytes = a.assemble(
            v.len(),
            bytemuck::cast_slice(&q.words),
            &turbospark::dtype::encode_f32(sd, &q.scales),
            &turbospark::dtype::encode_f32(sd, &q.biases),
        );
        be.upload_weight(DType::Affine(a), rows, cols, HostBytes::Slice(&bytes), "w")
            .unwrap()
    }

    /// Both down problems in one launch where they share a format; a
    /// dense MLP at another format than the experts runs apart, with the
    /// same results as each problem alone.
    #[test]
    fn down_pair_is_one_launch_at_one_format() {
        let Some(be) = backend() else { return };
        if be.gpu.limits.max_storage_buffers_per_shader_stage < PAIR_BINDINGS {
            return;
        }
        let moe = |experts, top_k, inter| Moe {
            m: 1,
            hidden: 64,
            inter,
            experts,
            top_k,
            precision: turbospark::Precision::Exact,
        };
        let (pa, pb) = (moe(1, 1, 96), moe(4, 2, 32));
        let act_a = upload_f32(&be, &[0.5; 96], "act a");
        let act_b = upload_f32(&be, &[0.25; 64], "act b");
        let (ids_a, ids_b) = (
            upload_u32(&be, &[0], "ids a"),
            upload_u32(&be, &[3, 1], "ids b"),
        );
        let (wts_a, wts_b) = (
            upload_f32(&be, &[1.0], "w a"),
            upload_f32(&be, &[0.5, 0.25], "w b"),
        );
        let routed = weight(&be, 4, 4 * 64, 32);
        for (bits_a, launches) in [(4, 1), (8, 2)] {
            let dense = weight(&be, bits_a, 64, 96);
            let outs = [0, 1].map(|_| upload_f32(&be, &[f32::NAN; 64], "out"));
            let args = |out: usize| {
                let a = DownArgs {
                    act: &act_a,
                    down: &dense,
                    ids: &ids_a,
                    weights: &wts_a,
                    out: &outs[0],
                    p: pa,
                };
                let b = DownArgs {
                    act: &act_b,
                    down: &routed,
                    ids: &ids_b,
                    weights: &wts_b,
                    out: &outs[out],
                    p: pb,
                };
                (a, b)
            };
            let before = be.counters().0;
            let (a, b) = args(1);
            be.moe_down_pair(a, b).unwrap();
            assert_eq!(be.counters().0 - before, launches, "dense at {bits_a} bits");
            let pair = outs.each_ref().map(|o| be.download_f32(o).unwrap());
            assert!(pair.iter().flatten().all(|v| v.is_finite()));
            let (a, b) = args(1);
            a.run(&be).unwrap();
            b.run(&be).unwrap();
            let alone = outs.each_ref().map(|o| be.download_f32(o).unwrap());
            for (p, s) in pair.iter().flatten().zip(alone.iter().flatten()) {
                assert!((p - s).abs() <= 1e-5 * s.abs().max(1.0), "{p} against {s}");
            }
        }
    }
}
