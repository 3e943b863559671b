//! Router and MoE expert launchers (`kernels/router.wgsl`, `kernels/moe.wgsl`).
//!
//! The router is two dispatches: logits spread over (token, expert)
//! workgroups (a prefill batch: its scaled input through the prefill GEMM),
//! then top-k and softmax with one workgroup per token. The expert phases read
//! the expert ids on the device: for a single token (decode) slot `s` is the
//! token's `s`-th expert directly; for a micro-batch a one-workgroup
//! `moe_route` dispatch first groups the (token, slot) pairs by expert into
//! backend scratch, so each expert's weights are read once per micro-batch.

use bytemuck::{Pod, Zeroable};
use turbospark::ops::{Moe, Router};
use turbospark::{DType, Error, Result};

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::WgpuBuffer;
use turbospark::{DownArgs, GateUpArgs};

/// Output rows per workgroup: phase 1 (8 teams of 32 lanes), phase 2 (4
/// teams of 64 lanes).
const GATE_UP_ROWS: usize = 8;
const DOWN_ROWS: usize = 4;
/// Tokens per phase-2 workgroup.
const TOKENS_PER_GROUP: usize = 16;
/// Threads per weight row of the decode kernels (kernels/moe_decode.wgsl,
/// their `LANES`): gate_up 32, down 64. Down: smaller workgroups of work
/// finish closer together, and a decode step waits for the last (H200,
/// 2026-12-01 at 4968426, run 9: the down pair 23.3 us a layer at 32
/// lanes, 23.0 at 64). Gate_up took 128 for the same reason (the pair 34.9
/// -> 33.0 us a layer) until the routed pair ranked the router's logits
/// in every workgroup: that work scales with the workgroups, and at 128
/// lanes (5632 routed workgroups) the routed pair took 58.7 us a layer, at
/// 64 40.8, at 32 35.4; decode 210.2 / 236.9 / 245.2 tok/s against 239.7
/// for router_topk and the pair at 128 (2026-12-01 at 58d557e, run 2).
const DECODE_GATE_UP_LANES: usize = 32;
/// Threads per weight row of `moe_down_decode` for one token (`down_lanes`).
/// With the slots' blocks as one flat range (H200, 2026-12-01 at ff0b6d1,
/// run 01): 12.3 us at 64 lanes against 15.9 at 32; gate_up at 16 lanes
/// ran alone in 20.1 us against 20.8 but its pair in 31.1 against 27.9, so
/// it keeps 32.
const DECODE_DOWN_LANES: usize = 64;
// A gate_up workgroup is 256 threads over gate and up rows: more than 128
// lanes a row would leave it no activation row (`decode_pairs` 0); down's
// ROWS is 256 / lanes.
const _: () = assert!(DECODE_GATE_UP_LANES <= 128 && 128 % DECODE_GATE_UP_LANES == 0);
const _: () = assert!(DECODE_DOWN_LANES <= 256 && 256 % DECODE_DOWN_LANES == 0);

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RouterParams {
    m: u32,
    hidden: u32,
    experts: u32,
    top_k: u32,
    eps: f32,
}

impl From<&Router> for RouterParams {
    fn from(p: &Router) -> Self {
        RouterParams {
            m: p.m as u32,
            hidden: p.hidden as u32,
            experts: p.experts as u32,
            top_k: p.top_k as u32,
            eps: p.eps,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct MoeParams {
    m: u32,
    hidden: u32,
    inter: u32,
    experts: u32,
    top_k: u32,
    direct: u32,
    nslots: u32,
    nrb: u32,
}

/// kernels/moe.wgsl's weight overrides for `w`.
fn with_tiled(w: &WgpuBuffer) -> [(&'static str, i64); 4] {
    let [wd, qbits, qgroup] = super::weight_constants(w.dtype);
    [wd, qbits, qgroup, ("TILED", w.tiled() as i64)]
}

/// The single binding of a weight; expert tensors split across bindings (a
/// device whose binding limit is below one layer's experts) are unsupported.
fn weight<'a>(gpu: &Gpu, w: &'a WgpuBuffer, op: &str) -> Result<&'a wgpu::Buffer> {
    w.single().ok_or_else(|| Error::Unsupported {
        backend: gpu.info.backend.clone(),
        op: op.into(),
        reason: format!(
            "weight of {} bytes is split across bindings (max_storage_buffer_binding_size {})",
            w.device_bytes(),
            gpu.max_binding()
        ),
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn router(
    gpu: &Gpu,
    x: &WgpuBuffer,
    s: &WgpuBuffer,
    proj: &WgpuBuffer,
    pes: &WgpuBuffer,
    ids: &WgpuBuffer,
    w: &WgpuBuffer,
    p: Router,
) -> Result<()> {
    let pb = weight(gpu, proj, "router")?;
    let logits = router_logits_buffer(gpu, &p)?;
    let params = RouterParams::from(&p);
    let constants = super::weight_constants(proj.dtype);
    // The first dispatch's bindings; its output is the logits, or for a
    // prefill batch the scaled input of the GEMM that writes them.
    let gemm = super::gemm::fits(p.m, p.hidden, proj.dtype);
    let first_out = if gemm {
        super::scratch_buffer(
            gpu,
            |s| &mut s.router_in,
            DType::F32,
            p.m * p.hidden,
            0,
            "router input",
        )?
    } else {
        logits.clone()
    };
    let (entry, groups) = if gemm {
        ("router_scale", ((p.m * p.hidden) as u32).div_ceil(256))
    } else {
        ("router_logits", (p.m * p.experts) as u32)
    };
    gpu.launch(Launch {
        kernel: "router",
        entry,
        constants: &constants,
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(x), true),
            (one(s), true),
            (pb, true),
            (one(pes), true),
            (one(&first_out), false),
        ],
        groups: gpu.grid(groups),
    })?;
    if gemm {
        let mm = turbospark::ops::Matmul {
            m: p.m,
            n: p.experts,
            k: p.hidden,
            // (never on the tensor cores, below)
            precision: turbospark::Precision::Exact,
        };
        // (on the f32 units: a 128-row output is too few tiles for the
        // tensor-core path, and top-k choices should not hinge on f16 x)
        super::gemm::dense(gpu, proj, one(&first_out), one(&logits), mm)?;
    }
    router_topk(gpu, x, s, proj, pes, (&logits, false), (ids, w), p)
}

/// The scratch the router's raw logits go through (`[m, experts]`, and 3
/// floats more: kernels/topk.wgsl's users read the last row as whole
/// vec4s).
pub(crate) fn router_logits_buffer(gpu: &Gpu, p: &Router) -> Result<WgpuBuffer> {
    super::scratch_buffer(
        gpu,
        |s| &mut s.router,
        DType::F32,
        p.m * p.experts + 3,
        4096,
        "router logits",
    )
}

/// The router's second dispatch: top-k of the raw `logits` of x's rows
/// (scaled by each row's RMS, unless `scaled`: the logits already are),
/// their softmax and per-expert scale, into `(ids, weights)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn router_topk(
    gpu: &Gpu,
    x: &WgpuBuffer,
    s: &WgpuBuffer,
    proj: &WgpuBuffer,
    pes: &WgpuBuffer,
    (logits, scaled): (&WgpuBuffer, bool),
    (ids, w): (&WgpuBuffer, &WgpuBuffer),
    p: Router,
) -> Result<()> {
    let params = RouterParams::from(&p);
    gpu.launch(Launch {
        kernel: "router",
        entry: "router_topk",
        constants: &[super::wdtype(proj.dtype)[0], ("SCALED", scaled as i64)],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(x), true),
            (one(s), true),
            (weight(gpu, proj, "router")?, true),
            (one(pes), true),
            (one(logits), false),
            (one(ids), false),
            (one(w), false),
        ],
        groups: gpu.grid(p.m as u32),
    })
}

/// Parameters of one phase, and the route scratch: built on the device
/// from `ids` when the batch has more than one token, by each phase that
/// reads it (a list kept from one op for the next would be state keyed by
/// buffer identity; building it costs one single-workgroup dispatch).
pub(crate) fn route(gpu: &Gpu, ids: &WgpuBuffer, p: &Moe) -> Result<(MoeParams, WgpuBuffer)> {
    let pairs = p.m * p.top_k;
    let direct = p.m == 1;
    let need = 1 + 3 * p.experts + pairs;
    let scratch =
        super::scratch_buffer(gpu, |s| &mut s.route, DType::U32, need, 1024, "moe route")?;
    let params = MoeParams {
        m: p.m as u32,
        hidden: p.hidden as u32,
        inter: p.inter as u32,
        experts: p.experts as u32,
        top_k: p.top_k as u32,
        direct: direct as u32,
        nslots: if direct { pairs } else { pairs.min(p.experts) } as u32,
        nrb: 0,
    };
    if direct {
        return Ok((params, scratch));
    }
    gpu.launch(Launch {
        kernel: "moe",
        entry: "moe_route",
        constants: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[(one(ids), true), (one(&scratch), false)],
        groups: [1, 1, 1],
    })?;
    Ok((params, scratch))
}

/// Parameters of a decode-kernel dispatch (kernels/moe_decode.wgsl): slot
/// `j` of token `t` is its `j`-th expert, no route list; `nrb` workgroups
/// per slot (phase 1; 0 for phase 2). Taken when the weights are 16-bit and
/// the reduced dimension is a multiple of 8 (weight rows start on 16-byte
/// boundaries, so they bind as `array<vec4<u32>>`): phase 1 for one token,
/// phase 2 for up to STREAM_MAX_M.
fn decode_params(p: &Moe, nrb: usize) -> MoeParams {
    MoeParams {
        m: p.m as u32,
        hidden: p.hidden as u32,
        inter: p.inter as u32,
        experts: p.experts as u32,
        top_k: p.top_k as u32,
        direct: 1,
        nslots: p.top_k as u32,
        nrb: nrb as u32,
    }
}

/// Most experts per token the decode kernels take (their `MAXK`).
const DECODE_MAX_TOP_K: usize = 16;

/// Whether a phase fits the decode kernels: 16-bit weights, a reduced
/// dimension `k` that is a multiple of 8 and at most 16 experts per token.
fn decode_fits(p: &Moe, k: usize, dtype: DType) -> bool {
    k.is_multiple_of(8) && p.top_k <= DECODE_MAX_TOP_K && matches!(dtype, DType::BF16 | DType::F16)
}

/// Whether a phase takes the decode kernel: one token, and it fits.
fn decode_path(p: &Moe, k: usize, dtype: DType) -> bool {
    p.m == 1 && decode_fits(p, k, dtype)
}

/// Pipeline constants of the decode gate_up kernels: weight dtype,
/// 16-byte blocks per row (`hidden / 8`) and whether each problem's
/// weights are in tile order (`tiled`: the first and, in a pair, the
/// second; expert_tiles.rs); the slot count is a parameter.
fn gate_up_constants(dtype: DType, hidden: usize, tiled: [bool; 2]) -> [(&'static str, i64); 5] {
    [
        super::wdtype(dtype)[0],
        ("BK", (hidden / 8) as i64),
        ("LANES", DECODE_GATE_UP_LANES as i64),
        ("TILED_A", tiled[0] as i64),
        ("TILED_B", tiled[1] as i64),
    ]
}

/// Activation rows (gate and up row pairs) per `moe_gate_up_decode`
/// workgroup (its `PAIRS`) and output rows per `moe_down_decode` workgroup
/// (its `ROWS`), from the lanes per weight row.
fn decode_pairs() -> usize {
    128 / DECODE_GATE_UP_LANES
}
fn decode_rows(m: usize) -> usize {
    256 / down_lanes(m)
}

/// Output rows per `moe_down_decode` workgroup on tile-ordered experts
/// (kernels/moe_decode.wgsl's TROWS), for any token count: a down pair's
/// two problems share one grid, so it equals a row-major one token's.
const TILED_DOWN_ROWS: usize = 4;
const _: () = assert!(256 / DECODE_DOWN_LANES == TILED_DOWN_ROWS);

/// Output rows per `moe_down_decode` workgroup for `m` tokens of `down`.
fn down_rows(m: usize, down: &WgpuBuffer) -> usize {
    if down.tiled() {
        TILED_DOWN_ROWS
    } else {
        decode_rows(m)
    }
}

/// Lanes per weight row of `moe_down_decode` for `m` tokens: a prefill
/// micro-batch keeps 32 (on the H200 at 16 tokens: 118.6 us at 32 lanes,
/// 132.2 at 64; 2026-11-30 at 3038701, run 8, and 2026-12-01 at 4968426,
/// run 10).
fn down_lanes(m: usize) -> usize {
    if m == 1 {
        DECODE_DOWN_LANES
    } else {
        32
    }
}

/// Pipeline constants of the decode down kernels for `m` tokens: weight
/// dtype, 16-byte blocks per row (`inter / 8`), experts per token (constant
/// trip counts), lanes per row and whether the weights are in tile order
/// (expert_tiles.rs).
fn down_constants(
    dtype: DType,
    inter: usize,
    top_k: usize,
    m: usize,
    tiled: bool,
) -> [(&'static str, i64); 5] {
    [
        super::wdtype(dtype)[0],
        ("BK", (inter / 8) as i64),
        ("TOPK", top_k as i64),
        ("LANES", down_lanes(m) as i64),
        ("TILED_A", tiled as i64),
    ]
}

pub(crate) fn moe_gate_up(
    gpu: &Gpu,
    x: &WgpuBuffer,
    gu: &WgpuBuffer,
    ids: &WgpuBuffer,
    act: &WgpuBuffer,
    p: Moe,
) -> Result<()> {
    let wb = weight(gpu, gu, "moe_gate_up")?;
    if super::affine::takes(gu, p.m) {
        return super::affine::gate_up(gpu, (x, wb, ids, act), (gu.dtype, gu.len), &p);
    }
    if decode_path(&p, p.hidden, gu.dtype) {
        let params = decode_params(&p, p.inter.div_ceil(decode_pairs()));
        let xb = one(x);
        return gpu.launch(Launch {
            kernel: "moe_decode",
            entry: "moe_gate_up_decode",
            constants: &gate_up_constants(gu.dtype, p.hidden, [gu.tiled(), false]),
            params: bytemuck::bytes_of(&params),
            buffers: &[
                (one(ids), true),
                (wb, true),
                (xb, true),
                // phase 1 has no routing weights: x stands in, never read
                (xb, true),
                (one(act), false),
            ],
            groups: gpu.grid(params.top_k * params.nrb),
        });
    }
    let (mut params, scratch) = route(gpu, ids, &p)?;
    if super::gemm::fits(p.m, p.hidden, gu.dtype) {
        let args = (one(x), (wb, gu.dtype, gu.tiled()), one(&scratch), one(act));
        if super::gemm_coop::takes(
            gpu,
            gu,
            p.hidden,
            super::gemm_coop::XRows::Grouped(&p),
            p.precision,
        ) {
            return super::gemm_coop::gate_up(gpu, args.0, args.1, args.2, args.3, &p);
        }
        return super::gemm::gate_up(gpu, args.0, args.1, args.2, args.3, &p);
    }
    params.nrb = p.inter.div_ceil(GATE_UP_ROWS) as u32;
    let xb = one(x);
    gpu.launch(Launch {
        kernel: "moe",
        entry: "moe_gate_up",
        constants: &with_tiled(gu),
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(ids), true),
            (one(&scratch), false),
            (wb, true),
            (xb, true),
            // phase 1 has no routing weights: x stands in, never read
            (xb, true),
            (one(act), false),
        ],
        groups: gpu.grid(params.nslots * params.nrb),
    })
}

/// Parameters of a pair launch: the first problem's decode parameters, then
/// the second's sizes (kernels/moe_decode.wgsl `Params`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct PairParams {
    a: MoeParams,
    inter2: u32,
    experts2: u32,
    top_k2: u32,
    nrb2: u32,
    groups_a: u32,
    /// `moe_gate_up_pair_slotted`: the experts the router ranks, and where
    /// the lookup's log begins (zero elsewhere).
    ranked: u32,
    log_at: u32,
    _pad: u32,
}

/// Storage bindings a pair launch needs (kernels/moe_decode.wgsl, 0-9).
const PAIR_BINDINGS: u32 = 10;

/// Whether two problems of a pair op run as one launch: both take the
/// decode kernels with the same weight dtype and hidden size, and the device
/// takes ten storage bindings per kernel (a weight split across bindings is
/// Unsupported either way).
/// Otherwise each runs on its own (the same results).
fn pair_fits(gpu: &Gpu, a: (&Moe, usize, &WgpuBuffer), b: (&Moe, usize, &WgpuBuffer)) -> bool {
    decode_path(a.0, a.1, a.2.dtype)
        && decode_path(b.0, b.1, b.2.dtype)
        && a.2.dtype == b.2.dtype
        && a.0.hidden == b.0.hidden
        && gpu.limits.max_storage_buffers_per_shader_stage >= PAIR_BINDINGS
}

fn pair_params(a: &Moe, b: &Moe, nrb: (usize, usize), groups_a: u32) -> PairParams {
    PairParams {
        a: decode_params(a, nrb.0),
        inter2: b.inter as u32,
        experts2: b.experts as u32,
        top_k2: b.top_k as u32,
        nrb2: nrb.1 as u32,
        groups_a,
        ranked: 0,
        log_at: 0,
        _pad: 0,
    }
}

pub(crate) fn moe_gate_up_pair(
    gpu: &Gpu,
    a: &GateUpArgs<'_, WgpuBuffer>,
    b: &GateUpArgs<'_, WgpuBuffer>,
) -> Result<()> {
    if super::affine::pair_takes(gpu, (&a.p, a.gate_up), (&b.p, b.gate_up)) {
        return super::affine::gate_up_pair(gpu, (a, b), None);
    }
    if !pair_fits(
        gpu,
        (&a.p, a.p.hidden, a.gate_up),
        (&b.p, b.p.hidden, b.gate_up),
    ) {
        moe_gate_up(gpu, a.x, a.gate_up, a.ids, a.act, a.p)?;
        return moe_gate_up(gpu, b.x, b.gate_up, b.ids, b.act, b.p);
    }
    gate_up_pair_launch(gpu, (a, b), None, None)
}

/// A gate_up pair launch: `moe_gate_up_pair_decode`, or with `routing =
/// Some((logits, pes, ids, weights))` `moe_gate_up_pair_routed` (b's
/// experts picked from the logits, the routing written for phase 2), and
/// with `slots` too `moe_gate_up_pair_slotted` (the picked experts looked
/// up in the slot table; their slots go to `slots.slot_ids`).
fn gate_up_pair_launch(
    gpu: &Gpu,
    (a, b): (&GateUpArgs<'_, WgpuBuffer>, &GateUpArgs<'_, WgpuBuffer>),
    routing: Option<[&WgpuBuffer; 4]>,
    slots: Option<&super::SlotRoute<'_>>,
) -> Result<()> {
    let nrb = (
        a.p.inter.div_ceil(decode_pairs()),
        b.p.inter.div_ceil(decode_pairs()),
    );
    let groups_a = (a.p.top_k * nrb.0) as u32;
    let mut params = pair_params(&a.p, &b.p, nrb, groups_a);
    if let Some(sr) = slots {
        params.ranked = sr.ranked as u32;
        params.log_at = sr.log_at as u32;
    }
    let (xa, xb) = (one(a.x), one(b.x));
    // (a fixed array, no allocation per decode layer: the plain launch
    // binds the first PAIR_BINDINGS)
    let [logits, pes, ids, wts] = routing.unwrap_or([b.x; 4]);
    let buffers = [
        (one(a.ids), true),
        (weight(gpu, a.gate_up, "moe_gate_up")?, true),
        (xa, true),
        // phase 1 has no routing weights: x stands in, never read
        (xa, true),
        (one(a.act), false),
        // (routed: b's ids are computed, x stands in, never read)
        (routing.map_or(one(b.ids), |_| xb), true),
        (weight(gpu, b.gate_up, "moe_gate_up")?, true),
        (xb, true),
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
        (Some(_), Some(_)) => (SLOTTED_PAIR_BINDINGS, "moe_gate_up_pair_slotted"),
        (Some(_), None) => (ROUTED_PAIR_BINDINGS, "moe_gate_up_pair_routed"),
        _ => (PAIR_BINDINGS, "moe_gate_up_pair_decode"),
    };
    gpu.launch(Launch {
        kernel: "moe_decode",
        entry,
        constants: &gate_up_constants(
            a.gate_up.dtype,
            a.p.hidden,
            [a.gate_up.tiled(), b.gate_up.tiled()],
        ),
        params: bytemuck::bytes_of(&params),
        buffers: &buffers[..bound as usize],
        groups: gpu.grid(groups_a + (b.p.top_k * nrb.1) as u32),
    })
}

// kernels/topk.wgsl's TOPK_MAXE and TOPK_MAXK.
const _: () = assert!(turbospark::ops::MAX_EXPERTS <= 256 && turbospark::ops::MAX_TOP_K <= 8);

/// Storage bindings of `moe_gate_up_pair_routed` (0-13), and of
/// `moe_gate_up_pair_slotted` (0-16).
pub(crate) const ROUTED_PAIR_BINDINGS: u32 = 14;
pub(crate) const SLOTTED_PAIR_BINDINGS: u32 = 17;

/// Whether [`moe_gate_up_pair_routed`] takes the pair `(a, b)`: the pair's
/// launch fits (one token) and the device binds its 14 buffers. The
/// router's shape is the routed problem's (`RouterArgs::check_routes`) and
/// within kernels/topk.wgsl's bounds (`Router::validate`: at most 256
/// experts, top-8).
pub(crate) fn routed_pair_fits(
    gpu: &Gpu,
    a: &GateUpArgs<'_, WgpuBuffer>,
    b: &GateUpArgs<'_, WgpuBuffer>,
) -> bool {
    pair_fits(
        gpu,
        (&a.p, a.p.hidden, a.gate_up),
        (&b.p, b.p.hidden, b.gate_up),
    ) && gpu.limits.max_storage_buffers_per_shader_stage >= ROUTED_PAIR_BINDINGS
}

/// Whether `moe_gate_up_pair_slotted` takes the pair: [`routed_pair_fits`]
/// and a device that binds its 17 buffers.
pub(crate) fn slotted_pair_fits(
    gpu: &Gpu,
    a: &GateUpArgs<'_, WgpuBuffer>,
    b: &GateUpArgs<'_, WgpuBuffer>,
) -> bool {
    routed_pair_fits(gpu, a, b)
        && gpu.limits.max_storage_buffers_per_shader_stage >= SLOTTED_PAIR_BINDINGS
}

/// The gate_up pair with `b`'s experts picked in the launch from the
/// router's scaled `logits` (kernels/moe_decode.wgsl's
/// `moe_gate_up_pair_routed`), which also writes the routing `(ids,
/// weights)` for phase 2: router_topk and the pair in one dispatch. The
/// caller checked [`routed_pair_fits`]; `b.ids` is `ids`. With `slots`
/// (the caller checked [`slotted_pair_fits`]) `b`'s weights are a slot
/// stack: the picked experts are looked up in its table, their slots
/// written to `slots.slot_ids` and the experts to the log
/// (`moe_gate_up_pair_slotted`).
pub(crate) fn moe_gate_up_pair_routed(
    gpu: &Gpu,
    (a, b): (&GateUpArgs<'_, WgpuBuffer>, &GateUpArgs<'_, WgpuBuffer>),
    (logits, pes): (&WgpuBuffer, &WgpuBuffer),
    (ids, wts): (&WgpuBuffer, &WgpuBuffer),
    slots: Option<&super::SlotRoute<'_>>,
) -> Result<()> {
    gate_up_pair_launch(gpu, (a, b), Some([logits, pes, ids, wts]), slots)
}

pub(crate) fn moe_down_pair(
    gpu: &Gpu,
    a: &DownArgs<'_, WgpuBuffer>,
    b: &DownArgs<'_, WgpuBuffer>,
) -> Result<()> {
    if super::affine::pair_takes(gpu, (&a.p, a.down), (&b.p, b.down)) {
        return super::affine::down_pair(gpu, a, b);
    }
    if !pair_fits(gpu, (&a.p, a.p.inter, a.down), (&b.p, b.p.inter, b.down)) {
        moe_down(gpu, a.act, a.down, a.ids, a.weights, a.out, a.p)?;
        return moe_down(gpu, b.act, b.down, b.ids, b.weights, b.out, b.p);
    }
    // (tiled or not, a's rows a workgroup are b's: TILED_DOWN_ROWS' assert)
    let groups_a = a.p.hidden.div_ceil(down_rows(1, a.down)) as u32;
    let params = pair_params(&a.p, &b.p, (0, 0), groups_a);
    gpu.launch(Launch {
        kernel: "moe_decode",
        entry: "moe_down_pair_decode",
        constants: &{
            let [w, bk, topk, lanes, ta] =
                down_constants(a.down.dtype, a.p.inter, a.p.top_k, 1, a.down.tiled());
            let [_, (_, bk2), (_, topk2), _, (_, tb)] =
                down_constants(b.down.dtype, b.p.inter, b.p.top_k, 1, b.down.tiled());
            [
                w,
                bk,
                topk,
                lanes,
                ta,
                ("BK2", bk2),
                ("TOPK2", topk2),
                ("TILED_B", tb),
            ]
        },
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(a.ids), true),
            (weight(gpu, a.down, "moe_down")?, true),
            (one(a.act), true),
            (one(a.weights), true),
            (one(a.out), false),
            (one(b.ids), true),
            (weight(gpu, b.down, "moe_down")?, true),
            (one(b.act), true),
            (one(b.weights), true),
            (one(b.out), false),
        ],
        groups: gpu.grid(2 * groups_a),
    })
}

pub(crate) fn moe_down(
    gpu: &Gpu,
    act: &WgpuBuffer,
    d: &WgpuBuffer,
    ids: &WgpuBuffer,
    w: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Moe,
) -> Result<()> {
    let wb = weight(gpu, d, "moe_down")?;
    if super::affine::takes(d, p.m) {
        return super::affine::down(gpu, (act, wb, ids, w, out), (d.dtype, d.len), &p);
    }
    // Phase 2 takes the decode kernel for prefill micro-batches too (one
    // token per row of workgroups; see kernels/moe_decode.wgsl).
    // (past STREAM_MAX_M tokens the prefill GEMM, or the route-list kernel
    // for shapes the GEMM does not take, reads each expert once)
    if p.m <= super::STREAM_MAX_M && decode_fits(&p, p.inter, d.dtype) {
        let params = decode_params(&p, 0);
        return gpu.launch(Launch {
            kernel: "moe_decode",
            entry: "moe_down_decode",
            constants: &down_constants(d.dtype, p.inter, p.top_k, p.m, d.tiled()),
            params: bytemuck::bytes_of(&params),
            buffers: &[
                (one(ids), true),
                (wb, true),
                (one(act), true),
                (one(w), true),
                (one(out), false),
            ],
            groups: gpu.grid((p.m * p.hidden.div_ceil(down_rows(p.m, d))) as u32),
        });
    }
    let (params, scratch) = route(gpu, ids, &p)?;
    // The GEMM keeps a row per (token, expert) pair in one binding.
    let pair_bytes = (p.m * p.top_k * p.hidden * 4) as u64;
    if super::gemm::fits(p.m, p.inter, d.dtype) && pair_bytes <= gpu.max_binding() {
        let lists = (one(&scratch), one(ids));
        let weights = (wb, d.dtype, d.tiled());
        if super::gemm_coop::takes(
            gpu,
            d,
            p.inter,
            super::gemm_coop::XRows::Grouped(&p),
            p.precision,
        ) {
            return super::gemm_coop::down(gpu, one(act), weights, lists, one(w), one(out), &p);
        }
        return super::gemm::down(gpu, one(act), weights, lists, one(w), one(out), &p);
    }
    route_list_down(gpu, (act, d, ids, w, out), (params, &scratch), &p)
}

/// Phase 2 through the route-list kernel (kernels/moe.wgsl's moe_down):
/// what `moe_down` falls back to where neither the decode kernel nor the
/// GEMM takes the problem (for tile-ordered experts only past one binding
/// of per-pair rows, which the tests cannot reach through `moe_down`).
fn route_list_down(
    gpu: &Gpu,
    (act, d, ids, w, out): (
        &WgpuBuffer,
        &WgpuBuffer,
        &WgpuBuffer,
        &WgpuBuffer,
        &WgpuBuffer,
    ),
    (mut params, scratch): (MoeParams, &WgpuBuffer),
    p: &Moe,
) -> Result<()> {
    let wb = weight(gpu, d, "moe_down")?;
    params.nrb = p.hidden.div_ceil(DOWN_ROWS) as u32;
    let groups = params.nrb * p.m.div_ceil(TOKENS_PER_GROUP) as u32;
    gpu.launch(Launch {
        kernel: "moe",
        entry: "moe_down",
        constants: &with_tiled(d),
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(ids), true),
            (one(scratch), false),
            (wb, true),
            (one(act), true),
            (one(w), true),
            (one(out), false),
        ],
        groups: gpu.grid(groups),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{backend, backend_with, upload_f32, upload_u32};
    use crate::WgpuBackend;
    use turbospark::ComputeBackend;

    /// The tiled down bodies' rows a workgroup are a WGSL constant (TROWS:
    /// it sizes their loops), the launcher's grid TILED_DOWN_ROWS.
    #[test]
    fn tiled_down_rows_are_the_kernels() {
        let src = crate::kernels::source("moe_decode", false, false).expect("moe_decode");
        let want = format!("const TROWS: u32 = {TILED_DOWN_ROWS}u;");
        assert!(
            src.contains(&want),
            "kernels/moe_decode.wgsl lacks `{want}`"
        );
    }

    /// Dispatches `f` records.
    fn dispatches(be: &WgpuBackend, f: impl FnOnce()) -> u64 {
        let before = be.counters().0;
        f();
        be.counters().0 - before
    }

    /// Each phase over a batch builds its own route list from the ids it is
    /// given: nothing is kept from one op for the next, so a host or device
    /// write to the ids in between can never leave a stale list.
    #[test]
    fn every_phase_builds_its_route_list() {
        let Some(be) = backend() else { return };
        let p = Moe {
            m: 20,
            hidden: 64,
            inter: 32,
            experts: 6,
            top_k: 2,
            precision: turbospark::Precision::Exact,
        };
        let ids: Vec<u32> = (0..40).map(|i| (i * 7 % 6) as u32).collect();
        let idb = upload_u32(&be, &ids, "ids");
        let build = || dispatches(&be, || drop(route(&be.gpu, &idb, &p).unwrap()));
        assert_eq!((build(), build()), (1, 1));
        let one = Moe { m: 1, ..p };
        let direct = dispatches(&be, || drop(route(&be.gpu, &idb, &one).unwrap()));
        assert_eq!(direct, 0, "one token reads its ids directly");
        be.sync().unwrap();
    }

    /// The route-list down kernel on tile-ordered experts gives the same
    /// bits as on the same experts row-major (the same products in the same
    /// order): `moe_down` reaches it with such experts only past one
    /// binding of per-pair rows.
    #[test]
    fn route_list_down_reads_tiled_experts() {
        let open = |tiles| {
            backend_with(&crate::WgpuOptions {
                expert_tiles: Some(tiles),
                ..Default::default()
            })
        };
        let (Some(row_major), Some(tiled)) = (open(false), open(true)) else {
            return;
        };
        let p = Moe {
            m: 20,
            hidden: 128,
            inter: 32,
            experts: 6,
            top_k: 2,
            precision: turbospark::Precision::Exact,
        };
        let mut rng = turbospark::rng::Rng::new(7);
        let wv = rng.vec_normal(p.experts * p.hidden * p.inter, 0.2);
        let bytes = turbospark::dtype::encode_f32(DType::BF16, &wv);
        let ids: Vec<u32> = (0..p.m * p.top_k)
            .map(|i| ((i * 5 + i / 2) % 6) as u32)
            .collect();
        let act = rng.vec_normal(p.m * p.top_k * p.inter, 1.0);
        let wts = rng.vec_range(p.m * p.top_k, 0.1, 1.0);
        let stack = turbospark::ExpertStack {
            experts: p.experts,
            gate_up: false,
        };
        let run = |be: &WgpuBackend| {
            let d = be
                .upload_experts(
                    DType::BF16,
                    stack,
                    (p.experts * p.hidden, p.inter),
                    turbospark::HostBytes::Slice(&bytes),
                    "down",
                )
                .unwrap();
            let (a, w) = (upload_f32(be, &act, "act"), upload_f32(be, &wts, "wts"));
            let out = upload_f32(be, &vec![f32::NAN; p.m * p.hidden], "out");
            let idb = upload_u32(be, &ids, "ids");
            let (params, scratch) = route(&be.gpu, &idb, &p).unwrap();
            route_list_down(&be.gpu, (&a, &d, &idb, &w, &out), (params, &scratch), &p).unwrap();
            (d.tiled(), be.download_f32(&out).unwrap())
        };
        let (was_tiled, want) = run(&row_major);
        let (is_tiled, got) = run(&tiled);
        assert!(!was_tiled && is_tiled, "one stack of each layout");
        assert!(got.iter().all(|v| v.is_finite()), "every output written");
        assert_eq!(got, want);
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
            ("router", "Params"),
            std::mem::size_of::<RouterParams>(),
            fields!(RouterParams; m, hidden, experts, top_k, eps),
            &[],
        );
        check(
            ("moe", "Params"),
            std::mem::size_of::<MoeParams>(),
            fields!(MoeParams; m, hidden, inter, experts, top_k, direct, nslots, nrb),
            &[],
        );
        // kernels/moe_decode.wgsl reads the pair block (a single problem's
        // launch binds a MoeParams, its prefix, and reads no more of it).
        let a: &[(&str, usize)] =
            fields!(MoeParams; m, hidden, inter, experts, top_k, direct, nslots, nrb);
        let b: &[(&str, usize)] =
            fields!(PairParams; inter2, experts2, top_k2, nrb2, groups_a, ranked, log_at, _pad);
        let base = std::mem::offset_of!(PairParams, a);
        let pair: Vec<(&str, usize)> = a
            .iter()
            .map(|&(n, o)| (n, base + o))
            .chain(b.iter().copied())
            .collect();
        check(
            ("moe_decode", "Params"),
            std::mem::size_of::<PairParams>(),
            &pair,
            &[],
        );
    }
}
