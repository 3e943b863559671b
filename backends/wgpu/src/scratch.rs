//! The ops' scratch that the device context keeps across calls (a leaf:
//! the context holds it, the launchers fill it through
//! `ops::scratch_buffer`).

use crate::buffer::WgpuBuffer;

/// Backend-owned scratch, created on first use and grown as needed.
#[derive(Default)]
pub(crate) struct Scratch {
    pub attention: Option<WgpuBuffer>,
    /// RoPE inverse-frequency tables by (theta bits, head_dim, rot_pairs).
    pub rope_freq: std::collections::HashMap<(u32, usize, usize), WgpuBuffer>,
    pub route: Option<WgpuBuffer>,
    /// The prefill GEMM's split-k partial planes `[splits, m, n]`.
    pub gemm_partial: Option<WgpuBuffer>,
    /// The tensor-core GEMM's f16 rows of x by tile and their inverse
    /// scales (`kernels/gemm_coop.wgsl`).
    pub coop_x16: Option<WgpuBuffer>,
    pub coop_xs: Option<WgpuBuffer>,
    /// The tensor-core prefill attention's f16 queries, keys and values and
    /// their row scales (`kernels/attention_coop.wgsl`).
    pub attn_q16: Option<WgpuBuffer>,
    pub attn_k16: Option<WgpuBuffer>,
    pub attn_v16: Option<WgpuBuffer>,
    pub attn_scales: Option<WgpuBuffer>,
    /// The prefill MoE down phase's per-pair rows `[m * top_k, hidden]`.
    pub moe_pairs: Option<WgpuBuffer>,
    /// Bound where an optional output of a fused kernel is absent.
    pub unused_out: Option<WgpuBuffer>,
    /// Argmax chunk winners `[rows, chunks]` between its two dispatches.
    pub argmax: Option<WgpuBuffer>,
    /// The tails' counters (`ops::tail_counters`).
    pub tail_counters: Option<WgpuBuffer>,
    /// Router logits `[m, E]` between its two dispatches.
    pub router: Option<WgpuBuffer>,
    /// A prefill batch's router input `x * eff_scale`, `[m, hidden]`.
    pub router_in: Option<WgpuBuffer>,
}
