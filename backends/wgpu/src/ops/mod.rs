//! Launchers: one module per kernel family, each recording into the device
//! context (`crate::gpu::Gpu`). Each binds buffers, fills the
//! parameter block and dispatches; shape checks happened in the trait impl.

pub(crate) mod affine;
pub(crate) mod attention;
pub(crate) mod attention_coop;
pub(crate) mod elementwise;
pub(crate) mod fused;
pub(crate) mod gemm;
pub(crate) mod gemm_coop;
pub(crate) mod matmul;
pub(crate) mod moe;
pub(crate) mod norm;

use turbospark::ops::OpKind;
use turbospark::{DType, Support};

use crate::gpu::Gpu;
use crate::scratch::Scratch;

/// Most rows of x the streaming kernels take: `gemv_rows` (its `MAXT`) and
/// the MoE decode kernels' token dimension read each weight row once for
/// all of them. From one more row a pass is a prefill batch for the kernels
/// that have one (the tiled GEMM, attn_prefill). 16 was the seed's
/// micro-batch; the crossover between the two was not measured.
pub(crate) const STREAM_MAX_M: usize = crate::gemm_tiles::STREAM_MAX_M;
/// Fewest rows of x (tokens) that take the prefill kernels.
pub const PREFILL_MIN_M: usize = STREAM_MAX_M + 1;

/// The scratch buffer in `slot`, grown to at least `need` elements (at least
/// `min` when first made). Scratch is created on first use, so a feature that
/// is not used allocates nothing.
pub(crate) fn scratch_buffer(
    gpu: &Gpu,
    slot: impl FnOnce(&mut Scratch) -> &mut Option<crate::WgpuBuffer>,
    dtype: DType,
    need: usize,
    min: usize,
    label: &str,
) -> turbospark::Result<crate::WgpuBuffer> {
    let mut sc = gpu.scratch.lock().unwrap_or_else(|e| e.into_inner());
    let slot = slot(&mut sc);
    match slot {
        Some(b) if b.len >= need => Ok(b.clone()),
        _ => {
            let b = gpu.single_buffer(dtype, need.max(min), label)?;
            *slot = Some(b.clone());
            Ok(b)
        }
    }
}

/// Entries of [`tail_counters`].
pub(crate) const TAIL_COUNTERS: usize = 1024;

/// The counters of the launches that finish in their last workgroup (a
/// "tail": attn_decode's combine), zero between
/// launches: each tail resets its count for the next. One buffer for all:
/// every launch binds it writable, so the launches that use it run one
/// after another.
pub(crate) fn tail_counters(gpu: &Gpu) -> turbospark::Result<crate::WgpuBuffer> {
    scratch_buffer(
        gpu,
        |s| &mut s.tail_counters,
        DType::U32,
        TAIL_COUNTERS,
        0,
        "tail counters",
    )
}

/// `(first output row, rows)` of weight chunk `c` of `w` in an `n`-row
/// matmul: a weight uploaded as one plain buffer is a single chunk of all
/// `n` rows; a weight split across bindings has each chunk's own span.
pub(crate) fn chunk_rows(
    w: &crate::WgpuBuffer,
    c: &crate::buffer::Chunk,
    n: usize,
) -> (usize, usize) {
    if w.chunks.len() == 1 {
        (0, n)
    } else {
        (c.row_start, c.rows)
    }
}

/// A streamed layer's slot lookup inside its routed gate_up pair
/// (`*_gate_up_pair_slotted`): the layer's slot table, the pass's log, the
/// experts the router ranks (the table's length) and where the layer's
/// entries of the log begin. The routed problem's weights are the slot
/// stack and its `experts` the stack's slots.
pub(crate) struct SlotRoute<'a> {
    pub table: &'a crate::WgpuBuffer,
    pub log: &'a crate::WgpuBuffer,
    /// The routed problem's ids: the slots it reads.
    pub slot_ids: &'a crate::WgpuBuffer,
    pub ranked: usize,
    pub log_at: usize,
}

/// The one binding of an activation, cache, id or norm-weight buffer: every
/// argument but a weight is one (the trait's checked ops run
/// `bindings::check` on each op's arguments by role before any launcher).
pub(crate) fn one(b: &crate::WgpuBuffer) -> &wgpu::Buffer {
    b.single()
        .expect("checked by bindings::check before the launch")
}

pub(crate) fn supports(gpu: &Gpu, op: &OpKind) -> Support {
    match op {
        OpKind::Matmul { w }
        | OpKind::Router { w }
        | OpKind::MoeGateUp { w }
        | OpKind::MoeDown { w }
        | OpKind::Embed { w }
            if *w == DType::U32 =>
        {
            Support::No("weights must be f32, f16 or bf16".into())
        }
        OpKind::Attention { head_dim } if *head_dim as usize > turbospark::ops::MAX_HEAD_DIM => {
            Support::No(format!(
                "head_dim {head_dim} over {}",
                turbospark::ops::MAX_HEAD_DIM
            ))
        }
        OpKind::PostAttention { dim } | OpKind::PostFfn { dim }
            if *dim as usize > fused::max_dim(gpu) =>
        {
            Support::No(format!(
                "rows of {dim} over {} (a workgroup keeps a row in registers)",
                fused::max_dim(gpu)
            ))
        }
        // post_ffn binds 9 storage buffers (kernels/fused.wgsl); WebGPU's
        // baseline guarantees 8. A device below it gets this, not a
        // pipeline error.
        OpKind::PostFfn { .. } if gpu.limits.max_storage_buffers_per_shader_stage < 9 => {
            Support::No(format!(
                "post_ffn binds 9 storage buffers; the device allows {} per kernel",
                gpu.limits.max_storage_buffers_per_shader_stage
            ))
        }
        OpKind::QkvPost { head_dim } if *head_dim as usize > 2 * 256 => Support::No(format!(
            "head_dim {head_dim} over 512 (one workgroup of 256 turns a head's pairs)"
        )),
        OpKind::Attention { head_dim } if head_dim % 4 != 0 => Support::No(format!(
            "head_dim {head_dim} is not a multiple of 4 (K/V rows are read as vec4)"
        )),
        OpKind::KvCache { dtype } if !turbospark::ops::CACHES.contains(dtype) => {
            Support::No(format!("KV caches of {dtype} (f32 or f16 only)"))
        }
        OpKind::KvCache { dtype: DType::F16 } if !gpu.features.shader_f16 => {
            Support::No("f16 KV caches need the shader-f16 feature, which the device lacks".into())
        }
        _ => Support::Yes,
    }
}

/// `WDTYPE` override for a weight buffer.
pub(crate) fn wdtype(d: DType) -> [(&'static str, i64); 1] {
    [("WDTYPE", crate::kernels::wdtype_code(d) as i64)]
}

/// The weight overrides of a family that may read quantized weights
/// (`kernels::AFFINE_FAMILIES`): `WDTYPE` (a quantized weight's scale
/// dtype), `QBITS` (0 for a plain weight) and `QGROUP`.
pub(crate) fn weight_constants(d: DType) -> [(&'static str, i64); 3] {
    let (bits, group) = match d {
        DType::Affine(a) => (a.bits as i64, a.group as i64),
        _ => (0, 64),
    };
    [wdtype(d)[0], ("QBITS", bits), ("QGROUP", group)]
}

/// The check that a Rust parameter block and the WGSL struct a kernel
/// family reads it as agree (each launcher module's `params_match_wgsl`
/// test): the same members in the same order, each at the same offset, the
/// WGSL struct no larger than the Rust one. Members named `_...` (either
/// side) are padding; `renames` are `(rust, wgsl)` where one Rust block serves
/// families that name a member their own way.
#[cfg(test)]
pub(crate) mod layout {
    /// `(name, offset)` of each listed field of `$t`.
    macro_rules! fields {
        ($t:ty; $($f:ident),* $(,)?) => {
            &[$((stringify!($f), std::mem::offset_of!($t, $f))),*]
        };
    }
    pub(crate) use fields;

    pub(crate) fn check(
        (family, name): (&str, &str),
        rust_size: usize,
        fields: &[(&str, usize)],
        renames: &[(&str, &str)],
    ) {
        let src = crate::kernels::source(family, false, false).expect("a kernel family");
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("kernels/{family}: {}", e.emit_to_string(&src)));
        let (members, span) = module
            .types
            .iter()
            .find_map(|(_, t)| match (&t.name, &t.inner) {
                (Some(n), naga::TypeInner::Struct { members, span }) if n == name => {
                    Some((members.clone(), *span))
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("kernels/{family} has no struct {name}"));
        let rust: Vec<(&str, usize)> = fields
            .iter()
            .copied()
            .filter(|(n, _)| !n.starts_with('_'))
            .collect();
        let wgsl: Vec<(String, usize)> = members
            .iter()
            .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
            .filter(|(n, _)| !n.starts_with('_'))
            .collect();
        let want: Vec<(String, usize)> = rust
            .iter()
            .map(|&(n, o)| {
                let w = renames.iter().find(|(r, _)| *r == n).map_or(n, |(_, w)| *w);
                (w.to_string(), o)
            })
            .collect();
        assert_eq!(
            wgsl, want,
            "kernels/{family}'s {name} against its Rust block"
        );
        assert!(
            span as usize <= rust_size,
            "kernels/{family}'s {name} is {span} bytes, the Rust block {rust_size}"
        );
    }
}

#[cfg(test)]
mod tests {
    /// `gemv_rows` takes up to `MAXT` rows of x (a WGSL constant: it sizes
    /// the workgroup array of row sums, and the kernel's named sums cover
    /// 16 rows); the launchers hand it at most [`super::STREAM_MAX_M`].
    #[test]
    fn stream_max_m_is_gemv_rows_maxt() {
        let src = crate::kernels::source("gemv", false, false).expect("gemv");
        let want = format!("const MAXT: u32 = {}u;", super::STREAM_MAX_M);
        assert!(src.contains(&want), "kernels/gemv.wgsl lacks `{want}`");
    }
}
