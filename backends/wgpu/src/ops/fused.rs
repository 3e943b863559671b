//! Fused decoder steps (`kernels/fused.wgsl`): one workgroup per row.

use bytemuck::{Pod, Zeroable};
use turbospark::ops::PostAttention;
use turbospark::{DType, GateUpArgs, PostAttentionArgs, PostFfnArgs, Result, RouterArgs};

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::kernels::wdtype_code;
use crate::WgpuBuffer;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scale: f32,
    flags: u32,
    /// post_attention_logits: the router's expert count.
    experts: u32,
    _pad: [u32; 2],
}

/// A one-element buffer bound where an optional output is absent (the
/// kernel's flags keep it from being touched). An absent input binds one
/// of the op's own read-only inputs instead, as rms_norm does.
fn unused_out(gpu: &Gpu) -> Result<WgpuBuffer> {
    super::scratch_buffer(
        gpu,
        |s| &mut s.unused_out,
        DType::F32,
        1,
        1,
        "unused output",
    )
}

/// Threads per row (the kernels' `WG`): 1024 where the device allows it
/// (a one-workgroup kernel is latency-bound: fewer columns per thread, fewer
/// loads waited on in turn), else 256. A thread keeps up to `MAXPER` = 32
/// columns in registers.
fn threads(gpu: &Gpu) -> usize {
    if gpu.limits.max_compute_invocations_per_workgroup >= 1024 {
        1024
    } else {
        256
    }
}

const MAXPER: usize = 32;

/// Widest row the fused kernels take on this device.
pub(crate) fn max_dim(gpu: &Gpu) -> usize {
    threads(gpu) * MAXPER
}

/// Pipeline constants: `WDn` dtype codes of up to four norm weights (absent
/// ones: f32), `WG` threads per row and `PER` columns per thread.
fn constants(gpu: &Gpu, ws: [Option<&WgpuBuffer>; 4], dim: usize) -> [(&'static str, i64); 6] {
    let code = |w: Option<&WgpuBuffer>| w.map_or(0, |w| wdtype_code(w.dtype) as i64);
    let wg = threads(gpu);
    [
        ("WD0", code(ws[0])),
        ("WD1", code(ws[1])),
        ("WD2", code(ws[2])),
        ("WD3", code(ws[3])),
        ("WG", wg as i64),
        ("PER", dim.div_ceil(wg) as i64),
    ]
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn post_attention(
    gpu: &Gpu,
    o: &WgpuBuffer,
    x: &WgpuBuffer,
    w_post: &WgpuBuffer,
    w_ff: &WgpuBuffer,
    r: &WgpuBuffer,
    ff: &WgpuBuffer,
    moe: Option<(&WgpuBuffer, &WgpuBuffer)>,
    p: PostAttention,
) -> Result<()> {
    let pad;
    let (w_moe, moe_out) = match moe {
        Some(m) => m,
        None => {
            pad = unused_out(gpu)?;
            (o, &pad)
        }
    };
    let params = Params {
        rows: p.rows as u32,
        dim: p.dim as u32,
        eps: p.eps,
        scale: 1.0,
        flags: moe.is_some() as u32,
        experts: 0,
        _pad: [0; 2],
    };
    gpu.launch(Launch {
        kernel: "fused",
        entry: "post_attention",
        constants: &constants(
            gpu,
            [Some(w_post), Some(w_ff), moe.map(|m| m.0), None],
            p.dim,
        ),
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(o), true),
            (one(x), true),
            (one(w_post), true),
            (one(w_ff), true),
            (one(w_moe), true),
            (one(r), false),
            (one(ff), false),
            (one(moe_out), false),
        ],
        groups: gpu.grid(p.rows as u32),
    })
}

/// Storage bindings of `post_attention_logits` (kernels/fused.wgsl, 0-10).
const LOGITS_BINDINGS: u32 = 11;

/// Whether `post_attention_logits` takes this call: one row, a single
/// binding of 16-bit or MLX affine router weights, a row the kernel takes,
/// and the device's binding limit.
fn logits_fit(
    gpu: &Gpu,
    pa: &PostAttentionArgs<'_, WgpuBuffer>,
    r: &RouterArgs<'_, WgpuBuffer>,
) -> bool {
    pa.p.rows == 1
        && r.p.m == 1
        // one RMS of r serves post_attention's norms and the router's
        && pa.p.eps == r.p.eps
        && matches!(
            r.proj.dtype,
            DType::BF16 | DType::F16 | DType::Affine(_)
        )
        && r.proj.single().is_some()
        && pa.p.dim <= max_dim(gpu)
        && gpu.limits.max_storage_buffers_per_shader_stage >= LOGITS_BINDINGS
}

/// [`turbospark::ComputeBackend::post_attention_router`] in two dispatches
/// where it fits (`post_attention_logits`, then the router's top-k), else
/// false: the caller runs the two ops in turn. Arguments checked by the
/// caller.
pub(crate) fn post_attention_router(
    gpu: &Gpu,
    pa: &PostAttentionArgs<'_, WgpuBuffer>,
    router: &RouterArgs<'_, WgpuBuffer>,
) -> Result<bool> {
    if !logits_fit(gpu, pa, router) {
        return Ok(false);
    }
    let logits = post_attention_logits(gpu, pa, router)?;
    super::moe::router_topk(
        gpu,
        pa.r,
        router.eff_scale,
        router.proj,
        router.per_expert_scale,
        (&logits, true),
        (router.ids, router.weights),
        router.p,
    )?;
    Ok(true)
}

/// [`turbospark::ComputeBackend::post_attention_gate_up`] in two
/// dispatches where it fits (`post_attention_logits`, then the gate_up
/// pair picking its experts from the logits, `moe_gate_up_pair_routed`),
/// else false: the caller runs the ops in turn. Arguments checked by the
/// caller.
pub(crate) fn post_attention_gate_up(
    gpu: &Gpu,
    (pa, router): (
        &PostAttentionArgs<'_, WgpuBuffer>,
        &RouterArgs<'_, WgpuBuffer>,
    ),
    dense: &GateUpArgs<'_, WgpuBuffer>,
    routed: &GateUpArgs<'_, WgpuBuffer>,
) -> Result<bool> {
    // (quantized experts: kernels/affine_pair.wgsl's routed pair)
    let affine = super::affine::routed_pair_takes(gpu, dense, routed);
    if !logits_fit(gpu, pa, router) || !(affine || super::moe::routed_pair_fits(gpu, dense, routed))
    {
        return Ok(false);
    }
    let logits = post_attention_logits(gpu, pa, router)?;
    if affine {
        let routing = [&logits, router.per_expert_scale, router.ids, router.weights];
        return super::affine::gate_up_pair(gpu, (dense, routed), Some(routing)).map(|()| true);
    }
    super::moe::moe_gate_up_pair_routed(
        gpu,
        (dense, routed),
        (&logits, router.per_expert_scale),
        (router.ids, router.weights),
        None,
    )?;
    Ok(true)
}

/// post_attention_gate_up with the routed experts in a slot stack
/// (`lookup`: the layer's table, the pass's log and `routed.ids`, which
/// receives the slots) as two launches: `post_attention_logits`, then the slotted
/// pair, the lookup inside it. False (nothing recorded) where they do not
/// fit; the caller then runs the ops one by one.
pub(crate) fn post_attention_gate_up_slotted(
    gpu: &Gpu,
    (pa, router): (
        &PostAttentionArgs<'_, WgpuBuffer>,
        &RouterArgs<'_, WgpuBuffer>,
    ),
    dense: &GateUpArgs<'_, WgpuBuffer>,
    routed: &GateUpArgs<'_, WgpuBuffer>,
    lookup: &super::SlotRoute<'_>,
) -> Result<bool> {
    let affine = super::affine::slotted_pair_takes(gpu, dense, routed);
    if !logits_fit(gpu, pa, router)
        || !(affine || super::moe::slotted_pair_fits(gpu, dense, routed))
    {
        return Ok(false);
    }
    let logits = post_attention_logits(gpu, pa, router)?;
    let routing = [&logits, router.per_expert_scale, router.ids, router.weights];
    if affine {
        super::affine::gate_up_pair_on(gpu, (dense, routed), Some(routing), Some(lookup))?;
    } else {
        super::moe::moe_gate_up_pair_routed(
            gpu,
            (dense, routed),
            (&logits, router.per_expert_scale),
            (router.ids, router.weights),
            Some(lookup),
        )?;
    }
    Ok(true)
}

/// The `post_attention_logits` launch (the caller checked [`logits_fit`]):
/// post_attention, and the router's scaled logits into the returned
/// scratch.
fn post_attention_logits(
    gpu: &Gpu,
    pa: &PostAttentionArgs<'_, WgpuBuffer>,
    router: &RouterArgs<'_, WgpuBuffer>,
) -> Result<WgpuBuffer> {
    let p = router.p;
    let logits = super::moe::router_logits_buffer(gpu, &p)?;
    let params = Params {
        rows: 1,
        dim: pa.p.dim as u32,
        eps: pa.p.eps,
        scale: 1.0,
        flags: 1,
        experts: p.experts as u32,
        _pad: [0; 2],
    };
    // (a fixed array: no allocation per decode layer)
    let [c0, c1, c2, c3, c4, c5] = constants(
        gpu,
        [Some(pa.w_post), Some(pa.w_ff), Some(pa.moe.0), None],
        pa.p.dim,
    );
    let [wd, qbits, qgroup] = super::weight_constants(router.proj.dtype);
    gpu.launch(Launch {
        kernel: "fused",
        entry: "post_attention_logits",
        constants: &[c0, c1, c2, c3, c4, c5, wd, qbits, qgroup],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(pa.o), true),
            (one(pa.x), true),
            (one(pa.w_post), true),
            (one(pa.w_ff), true),
            (one(pa.moe.0), true),
            (one(pa.r), false),
            (one(pa.ff), false),
            (one(pa.moe.1), false),
            (one(router.eff_scale), true),
            (one(router.proj), true),
            (one(&logits), false),
        ],
        groups: gpu.grid(1 + p.experts as u32),
    })?;
    Ok(logits)
}

pub(crate) fn post_ffn(gpu: &Gpu, a: &PostFfnArgs<'_, WgpuBuffer>) -> Result<()> {
    let p = a.p;
    // Absent weights bind the dense branch's weight and an absent output
    // `pad`; the flags keep the kernel from touching them.
    let pad = unused_out(gpu)?;
    let (e, w_moe, w_sum) = a.moe.unwrap_or((a.dense, a.w_dense, a.w_dense));
    let (w_next, normed) = a.next.unwrap_or((a.w_dense, &pad));
    let params = Params {
        rows: p.rows as u32,
        dim: p.dim as u32,
        eps: p.eps,
        scale: p.scale,
        flags: a.moe.is_some() as u32 | (a.next.is_some() as u32) << 1,
        experts: 0,
        _pad: [0; 2],
    };
    let weights = [
        Some(a.w_dense),
        a.moe.map(|m| m.1),
        a.moe.map(|m| m.2),
        a.next.map(|n| n.0),
    ];
    gpu.launch(Launch {
        kernel: "fused",
        entry: "post_ffn",
        constants: &constants(gpu, weights, p.dim),
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(a.dense), true),
            (one(e), true),
            (one(a.r), true),
            (one(a.w_dense), true),
            (one(w_moe), true),
            (one(w_sum), true),
            (one(w_next), true),
            (one(a.x), false),
            (one(normed), false),
        ],
        groups: gpu.grid(p.rows as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{backend, upload_f32};
    use crate::WgpuBackend;
    use turbospark::ops::Router;
    use turbospark::{ComputeBackend, HostBytes};

    /// One decode row's buffers for post_attention and the router (64 wide,
    /// 5 experts, top-2), and both branches' gate_up (8 activation rows
    /// each), bf16 weights.
    struct Row {
        f32s: Vec<WgpuBuffer>,
        proj: WgpuBuffer,
        gate_up: [WgpuBuffer; 2],
        zero_id: WgpuBuffer,
        ids: WgpuBuffer,
        wts: WgpuBuffer,
        p: PostAttention,
        rp: Router,
    }

    const DIM: usize = 64;
    const EXPERTS: usize = 5;
    const INTER: usize = 8;

    fn row(be: &WgpuBackend) -> Row {
        let v: Vec<f32> = (0..DIM).map(|i| 0.5 + i as f32 / 64.0).collect();
        let bf16 = |rows: usize, label| {
            let w: Vec<f32> = (0..rows * DIM).map(|i| (i % 7) as f32 - 3.0).collect();
            let b = turbospark::dtype::encode_f32(DType::BF16, &w);
            be.upload(DType::BF16, HostBytes::Slice(&b), label).unwrap()
        };
        let mut f32s: Vec<WgpuBuffer> = ["o", "x", "p", "f", "m", "s"]
            .into_iter()
            .map(|l| upload_f32(be, &v, l))
            .collect();
        f32s.push(upload_f32(be, &[1.0; EXPERTS], "pes"));
        for l in ["r", "ff", "moe_in", "act", "moe_act"] {
            f32s.push(be.alloc(DType::F32, DIM * 2, l).unwrap());
        }
        Row {
            f32s,
            proj: bf16(EXPERTS, "proj"),
            gate_up: [bf16(2 * INTER, "mlp"), bf16(EXPERTS * 2 * INTER, "experts")],
            zero_id: be
                .upload(DType::U32, HostBytes::Slice(&[0; 4]), "zero")
                .unwrap(),
            ids: be.alloc(DType::U32, 2, "ids").unwrap(),
            wts: be.alloc(DType::F32, 2, "wts").unwrap(),
            p: PostAttention {
                rows: 1,
                dim: DIM,
                eps: 1e-6,
            },
            rp: Router {
                m: 1,
                hidden: DIM,
                experts: EXPERTS,
                top_k: 2,
                eps: 1e-6,
            },
        }
    }

    impl Row {
        fn args(
            &self,
        ) -> (
            PostAttentionArgs<'_, WgpuBuffer>,
            RouterArgs<'_, WgpuBuffer>,
        ) {
            let f = &self.f32s;
            (
                PostAttentionArgs {
                    o: &f[0],
                    x: &f[1],
                    w_post: &f[2],
                    w_ff: &f[3],
                    r: &f[7],
                    ff: &f[8],
                    moe: (&f[4], &f[9]),
                    p: self.p,
                },
                RouterArgs {
                    eff_scale: &f[5],
                    proj: &self.proj,
                    per_expert_scale: &f[6],
                    ids: &self.ids,
                    weights: &self.wts,
                    p: self.rp,
                },
            )
        }

        fn gate_up(&self) -> [GateUpArgs<'_, WgpuBuffer>; 2] {
            let f = &self.f32s;
            let moe = |experts, top_k| turbospark::ops::Moe {
                m: 1,
                hidden: DIM,
                inter: INTER,
                experts,
                top_k,
                precision: turbospark::Precision::Exact,
            };
            [
                GateUpArgs {
                    x: &f[8],
                    gate_up: &self.gate_up[0],
                    ids: &self.zero_id,
                    act: &f[10],
                    p: moe(1, 1),
                },
                GateUpArgs {
                    x: &f[9],
                    gate_up: &self.gate_up[1],
                    ids: &self.ids,
                    act: &f[11],
                    p: moe(EXPERTS, 2),
                },
            ]
        }
    }

    /// Dispatches `run` records.
    fn dispatches(be: &WgpuBackend, run: impl FnOnce()) -> u64 {
        let before = be.counters().0;
        run();
        be.counters().0 - before
    }

    /// One decode row with experts takes two dispatches (post_attention
    /// with the router's logits, then top-k) where the device binds 11
    /// storage buffers, as lavapipe and the H200 do; else three.
    #[test]
    fn post_attention_router_fuses_the_logits_where_it_fits() {
        let Some(be) = backend() else { return };
        let row = row(&be);
        let (pa, router) = row.args();
        let n = dispatches(&be, || be.post_attention_router(pa, router).unwrap());
        let limit = be.gpu.limits.max_storage_buffers_per_shader_stage;
        eprintln!("{limit} storage buffers a stage: {n} dispatches");
        assert_eq!(n, if limit >= LOGITS_BINDINGS { 2 } else { 3 });
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            assert_eq!(n, 2, "CI's lavapipe runs the fused kernel");
        }
    }

    /// With both branches' gate_up, two dispatches (the logits, then the
    /// pair picking its experts) where the device binds 14 storage buffers;
    /// the routing it writes for phase 2 is router_topk's.
    #[test]
    fn post_attention_gate_up_picks_the_experts_in_the_pair_launch() {
        let Some(be) = backend() else { return };
        let row = row(&be);
        let [dense, routed] = row.gate_up();
        let n = dispatches(&be, || {
            be.post_attention_gate_up(row.args(), dense, routed)
                .unwrap()
        });
        let fused = (
            be.download_u32(&row.ids).unwrap(),
            be.download_f32(&row.wts).unwrap(),
        );
        let (pa, router) = row.args();
        be.post_attention_router(pa, router).unwrap();
        let apart = (
            be.download_u32(&row.ids).unwrap(),
            be.download_f32(&row.wts).unwrap(),
        );
        assert_eq!(fused.0, apart.0, "ids");
        for (a, b) in fused.1.iter().zip(&apart.1) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs(),
                "weights {:?} against {:?}",
                fused.1,
                apart.1
            );
        }
        let limit = be.gpu.limits.max_storage_buffers_per_shader_stage;
        eprintln!("{limit} storage buffers a stage: {n} dispatches");
        if limit >= super::super::moe::ROUTED_PAIR_BINDINGS {
            assert_eq!(n, 2);
        }
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            assert_eq!(n, 2, "CI's lavapipe runs the fused kernels");
        }
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
            ("fused", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; rows, dim, eps, scale, flags, experts, _pad),
            &[],
        );
    }
}
