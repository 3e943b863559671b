//! Prefill attention on cooperative matrices (`kernels/attention_coop.wgsl`):
//! from [`super::PREFILL_MIN_M`] query rows, head_dim 128, 256 or 512, on a
//! device where the tensor-core GEMM runs ([`super::gemm_coop::usable`]).
//! Two dispatches: `attn_coop_prep` (the queries, keys and values to f16
//! scratch with per-row power-of-two scales) and `attn_prefill_coop`. The
//! inputs are rounded as [`rounds_inputs`] says, which the CPU reference
//! models (`turbospark::GemmRounding` names attention too): once
//! (`Precision::Fast`) or split in two f16 parts, three products each
//! (`Precision::Exact`).

use bytemuck::{Pod, Zeroable};
use turbospark::ops::Attention;
use turbospark::{DType, Result};

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::kernels::for_caches;
use crate::WgpuBuffer;

/// Query rows a workgroup takes (a fragment's rows).
const ROWS: usize = 16;
/// Rows past the cache's slots in the K / V scratch, which mirrors the
/// cache slot for slot: row r holds slot r % capacity (slots 0-15 again, or
/// a cache under 16 slots several times), so that a step of 16 keys that
/// wraps round the ring reads contiguous rows.
const MIRROR_ROWS: usize = 16;
/// Rows `attn_coop_prep` converts per workgroup (a warp each).
const PREP_ROWS: usize = 8;

/// `(DW, ND, NSG)` for the head sizes the kernel takes: head dims a warp
/// holds (its queries and output, `DW / 16` fragments each), warps along
/// head_dim and query heads per workgroup; 4 warps at 128 dims a warp, 8 at
/// 64. On the H200 at 512 tokens (run 04): head_dim 256 211.1 us at 64
/// dims a warp against 215.9 at 128; head_dim 512 260.5 us at 128 against
/// 268.1 at 64. With `split` 64 for every size: the lo parts' fragments
/// (queries, keys, values: twelve more) leave no registers for 128.
fn shape(head_dim: usize, split: bool) -> Option<(usize, usize, usize)> {
    let dw = match head_dim {
        128 | 256 => 64,
        512 if split => 64,
        512 => 128,
        _ => return None,
    };
    let warps = 512 / dw;
    Some((dw, head_dim / dw, warps * dw / head_dim))
}

/// Whether an attention of `m` query rows with heads of `head_dim` runs from
/// f16-rounded inputs where the tensor cores are usable: the part of
/// [`takes`] that depends on the op (the GEMM rule's attention arm).
pub(crate) fn rounds_inputs(m: usize, head_dim: usize) -> bool {
    m >= super::PREFILL_MIN_M && shape(head_dim, false).is_some()
}

/// Whether `p` runs here rather than on `attn_prefill`.
pub(crate) fn takes(gpu: &Gpu, p: &Attention) -> bool {
    rounds_inputs(p.m, p.head_dim) && super::gemm_coop::usable(gpu)
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    m: u32,
    heads: u32,
    kv_heads: u32,
    group: u32,
    d: u32,
    capacity: u32,
    window: u32,
    scale: f32,
    qrows: u32,
    kvrows: u32,
    nrb: u32,
    nhb: u32,
}

/// The two dispatches over `p` (which [`takes`]).
pub(crate) fn attention(
    gpu: &Gpu,
    q: &WgpuBuffer,
    kc: &WgpuBuffer,
    vc: &WgpuBuffer,
    pos: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Attention,
) -> Result<()> {
    let split = p.precision == turbospark::Precision::Exact;
    let (dw, nd, nsg) = shape(p.head_dim, split).expect("takes() checked the head size");
    // (with the split, every f16 scratch holds the lo parts after the hi)
    let parts = 1 + split as usize;
    let d = p.head_dim;
    let group = p.heads / p.kv_heads;
    let nrb = p.m.div_ceil(ROWS);
    let qrows = nrb * ROWS * p.heads;
    // Indexed by cache slot, so bounded by the cache whatever the positions
    // (the batch's keys may span more than the cache when they are not
    // consecutive: such keys share slots, as they do in the cache).
    let kvrows = p.capacity + MIRROR_ROWS;
    let kv_elems = p.kv_heads * kvrows * d;
    // Scratch rows, Q's then K's and V's: each has its scale, and the prep
    // converts each.
    let rows = qrows + 2 * p.kv_heads * kvrows;
    // (a scratch past the device's binding is `Error::DeviceLimit`, naming
    // it, before anything is recorded: the rounding rule promised the
    // rounding, so there is no fallback; f16 indices stay within u32, as a
    // binding is at most 4 GiB)
    let scratch = |slot: fn(&mut super::Scratch) -> &mut Option<WgpuBuffer>, dtype, n, label| {
        super::scratch_buffer(gpu, slot, dtype, n, 0, label)
    };
    let q16 = scratch(
        |s| &mut s.attn_q16,
        DType::F16,
        parts * qrows * d,
        "tensor-core attention f16 queries",
    )?;
    let k16 = scratch(
        |s| &mut s.attn_k16,
        DType::F16,
        parts * kv_elems,
        "tensor-core attention f16 keys",
    )?;
    let v16 = scratch(
        |s| &mut s.attn_v16,
        DType::F16,
        parts * kv_elems,
        "tensor-core attention f16 values",
    )?;
    let sc = scratch(
        |s| &mut s.attn_scales,
        DType::F32,
        rows,
        "tensor-core attention row scales",
    )?;
    let nhb = group.div_ceil(nsg);
    let params = Params {
        m: p.m as u32,
        heads: p.heads as u32,
        kv_heads: p.kv_heads as u32,
        group: group as u32,
        d: d as u32,
        capacity: p.capacity as u32,
        window: p.window as u32,
        scale: p.scale,
        qrows: qrows as u32,
        kvrows: kvrows as u32,
        nrb: nrb as u32,
        nhb: nhb as u32,
    };
    let buffers = [
        (one(pos), true),
        (one(q), true),
        (one(kc), true),
        (one(vc), true),
        (one(&q16), false),
        (one(&k16), false),
        (one(&v16), false),
        (one(&sc), false),
        (one(out), false),
    ];
    gpu.launch(Launch {
        kernel: for_caches("attention_coop", kc.dtype),
        entry: "attn_coop_prep",
        constants: &[("SPLIT", split as i64)],
        params: bytemuck::bytes_of(&params),
        buffers: &buffers,
        groups: gpu.grid(rows.div_ceil(PREP_ROWS) as u32),
    })?;
    gpu.launch(Launch {
        kernel: for_caches("attention_coop", kc.dtype),
        entry: "attn_prefill_coop",
        constants: &[
            ("DW", dw as i64),
            ("ND", nd as i64),
            ("NSG", nsg as i64),
            ("WG", (32 * nd * nsg) as i64),
            ("SPLIT", split as i64),
        ],
        params: bytemuck::bytes_of(&params),
        buffers: &buffers,
        groups: gpu.grid((nrb * p.kv_heads * nhb) as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The warps cover every head size taken (ND x NSG of them, at most 4
    /// query heads: the kernel's per-slot arrays), and nothing below
    /// prefill sizes or of another head size is rounded.
    #[test]
    fn shapes_fill_the_warps_and_the_rule_matches_them() {
        for (hd, split) in [128, 256, 512]
            .into_iter()
            .flat_map(|h| [(h, false), (h, true)])
        {
            let (dw, nd, nsg) = shape(hd, split).unwrap();
            assert!(dw == 64 || (dw == 128 && !split));
            assert_eq!(nd * dw, hd);
            assert_eq!(nd * nsg * dw, 512);
            assert!(nsg <= 4 && nd <= 8, "csp holds 8 warps' partials");
            assert!(rounds_inputs(super::super::PREFILL_MIN_M, hd));
            assert!(!rounds_inputs(super::super::PREFILL_MIN_M - 1, hd));
        }
        for hd in [64, 96, 192, 384, 1024] {
            assert!(shape(hd, false).is_none() && shape(hd, true).is_none());
            assert!(!rounds_inputs(4096, hd));
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
            ("attention_coop", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; m, heads, kv_heads, group, d, capacity, window, scale, qrows, kvrows, nrb, nhb),
            &[],
        );
    }
}
