//! RoPE, KV-cache append and split-K attention (`kernels/rope.wgsl`,
//! `kernels/kv_cache.wgsl`, `kernels/attention.wgsl`).

use bytemuck::{Pod, Zeroable};
use turbospark::ops::{rope_inv_freq, Attention, KvAppend, QkvPost, Rope};
use turbospark::{DType, Error, Result};

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::kernels::{for_caches, wdtype_code};
use crate::WgpuBuffer;

/// The RoPE frequency table `rope_inv_freq(theta, head_dim, rot_pairs)` on
/// the device, uploaded on first use and kept in the backend's scratch.
fn freq_table(gpu: &Gpu, theta: f32, head_dim: usize, rot_pairs: usize) -> Result<WgpuBuffer> {
    let key = (theta.to_bits(), head_dim, rot_pairs);
    let mut s = gpu.scratch.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = s.rope_freq.get(&key) {
        return Ok(f.clone());
    }
    let table = rope_inv_freq(theta, head_dim, rot_pairs);
    let f = gpu.single_buffer(DType::F32, table.len(), "rope inv_freq")?;
    gpu.write_bytes(one(&f), 0, bytemuck::cast_slice(&table));
    s.rope_freq.insert(key, f.clone());
    Ok(f)
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct QkvParams {
    m: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rot_pairs: u32,
    capacity: u32,
    eps: f32,
    v_from_k: u32,
}

/// Per-head norms, RoPE and the cache append in one dispatch
/// (`kernels/rope.wgsl`): a workgroup per (token, head slot) item, or from
/// [`QKV_WARPS_MIN_ITEMS`] items a warp per item (`qkv_post_warps`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_post(
    gpu: &Gpu,
    raw: &WgpuBuffer,
    w_q: &WgpuBuffer,
    w_k: &WgpuBuffer,
    pos: &WgpuBuffer,
    q: &WgpuBuffer,
    kc: &WgpuBuffer,
    vc: &WgpuBuffer,
    p: QkvPost,
) -> Result<()> {
    qkv_post_from(gpu, (raw, None), (w_q, w_k), pos, q, (kc, vc), p)
}

/// [`qkv_post`] reading `raw`, or (`Some((offset, size))`) that byte range
/// of it as its rows.
fn qkv_post_from(
    gpu: &Gpu,
    (raw, range): (&WgpuBuffer, Option<(u64, u64)>),
    (w_q, w_k): (&WgpuBuffer, &WgpuBuffer),
    pos: &WgpuBuffer,
    q: &WgpuBuffer,
    (kc, vc): (&WgpuBuffer, &WgpuBuffer),
    p: QkvPost,
) -> Result<()> {
    let freq = freq_table(gpu, p.theta, p.head_dim, p.rot_pairs)?;
    let params = QkvParams {
        m: p.m as u32,
        heads: p.heads as u32,
        kv_heads: p.kv_heads as u32,
        head_dim: p.head_dim as u32,
        rot_pairs: p.rot_pairs as u32,
        capacity: p.capacity as u32,
        eps: p.eps,
        v_from_k: p.v_from_k as u32,
    };
    let items = p.m * (p.heads + 2 * p.kv_heads);
    let warps = items >= QKV_WARPS_MIN_ITEMS;
    let ranges: Vec<_> = range.map(|(o, n)| (0, o, n)).into_iter().collect();
    gpu.launch_ranged(
        Launch {
            kernel: for_caches("rope", kc.dtype),
            entry: if warps { "qkv_post_warps" } else { "qkv_post" },
            constants: &[
                ("WQD", wdtype_code(w_q.dtype) as i64),
                ("WKD", wdtype_code(w_k.dtype) as i64),
            ],
            params: bytemuck::bytes_of(&params),
            buffers: &[
                (one(raw), true),
                (one(w_q), true),
                (one(w_k), true),
                (one(pos), true),
                (one(&freq), true),
                (one(q), false),
                (one(kc), false),
                (one(vc), false),
            ],
            groups: gpu.grid(if warps {
                items.div_ceil(QKV_WARPS)
            } else {
                items
            } as u32),
        },
        &ranges,
    )
}

/// Items (tokens x head slots) from which qkv_post takes a warp per item.
/// On the H200 a workgroup per item cost about 2.55 ns an item once the
/// GPU was full (41.8 us at 16384) over a 3.8 us floor, a warp per item 1.3
/// ns an item over 5.8 us (runs 08 / 09: 512 and 16384 items): the lines
/// cross near 2300 items. Between 512 and 16384 items neither was measured.
const QKV_WARPS_MIN_ITEMS: usize = 2048;
/// Warps (items) per `qkv_post_warps` workgroup (kernels/rope.wgsl).
const QKV_WARPS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RopeParams {
    m: u32,
    heads: u32,
    head_dim: u32,
    rot_pairs: u32,
}

/// NeoX RoPE in place, one invocation per rotated pair. The frequencies are
/// the host table `rope_inv_freq`, uploaded once per (theta, head_dim,
/// rot_pairs) and kept in the backend's scratch.
pub(crate) fn rope(gpu: &Gpu, x: &WgpuBuffer, pos: &WgpuBuffer, p: Rope) -> Result<()> {
    if p.rot_pairs == 0 {
        return Ok(());
    }
    let freq = freq_table(gpu, p.theta, p.head_dim, p.rot_pairs)?;
    let params = RopeParams {
        m: p.m as u32,
        heads: p.heads as u32,
        head_dim: p.head_dim as u32,
        rot_pairs: p.rot_pairs as u32,
    };
    let n = (p.m * p.heads * p.rot_pairs) as u32;
    gpu.launch(Launch {
        kernel: "rope",
        entry: "rope",
        constants: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[(one(x), false), (one(pos), true), (one(&freq), true)],
        groups: gpu.grid(n.div_ceil(256)),
    })
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct KvParams {
    m: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
}

/// K and V rows into their cache slots, one dispatch for both.
pub(crate) fn kv_append(
    gpu: &Gpu,
    k: &WgpuBuffer,
    v: &WgpuBuffer,
    kc: &WgpuBuffer,
    vc: &WgpuBuffer,
    pos: &WgpuBuffer,
    p: KvAppend,
) -> Result<()> {
    let params = KvParams {
        m: p.m as u32,
        kv_heads: p.kv_heads as u32,
        head_dim: p.head_dim as u32,
        capacity: p.capacity as u32,
    };
    let n = (p.m * p.kv_heads * p.head_dim) as u32;
    gpu.launch(Launch {
        kernel: for_caches("kv_cache", kc.dtype),
        entry: "kv_append",
        constants: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(k), true),
            (one(v), true),
            (one(kc), false),
            (one(vc), false),
            (one(pos), true),
        ],
        groups: gpu.grid(n.div_ceil(256)),
    })
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttnParams {
    m: u32,
    heads: u32,
    kv_heads: u32,
    group: u32,
    d4: u32,
    capacity: u32,
    window: u32,
    scale: f32,
    nsplit: u32,
    min_chunk: u32,
    nslots: u32,
    ntiles: u32,
    // attn_decode_qkv only: qkv_post's rot_pairs, eps and v_from_k.
    rot_pairs: u32,
    eps: f32,
    v_from_k: u32,
    _pad: u32,
}

impl AttnParams {
    /// The parameters of `p` with `nsplit` key splits of at least
    /// `min_chunk` keys and `ntiles` query tiles (the kernels' query slot
    /// `s` is row `s / group`, head `g * group + s % group`).
    fn new(p: &Attention, nsplit: usize, min_chunk: usize, ntiles: usize) -> Self {
        let group = p.heads / p.kv_heads;
        AttnParams {
            m: p.m as u32,
            heads: p.heads as u32,
            kv_heads: p.kv_heads as u32,
            group: group as u32,
            d4: (p.head_dim / 4) as u32,
            capacity: p.capacity as u32,
            window: p.window as u32,
            scale: p.scale,
            nsplit: nsplit as u32,
            min_chunk: min_chunk as u32,
            nslots: (p.m * group) as u32,
            ntiles: ntiles as u32,
            rot_pairs: 0,
            eps: 0.0,
            v_from_k: 0,
            _pad: 0,
        }
    }
}

/// Keys per step of `attn_split` (its `KR`).
const KEYS_PER_STEP: usize = 8;
/// Most query slots per workgroup (`QMAX`).
const MAX_TILE: usize = 8;
/// Most key splits (`attn_combine` keeps one weight per split in 256 slots).
const MAX_SPLIT: usize = 256;
/// Phase-1 workgroups to aim for: enough to fill a large GPU.
const TARGET_GROUPS: usize = 2048;
/// Largest split-K scratch (bytes).
const MAX_SCRATCH: u64 = 64 << 20;

/// Keys per chunk of `attn_decode` (its `KD`), and the least a split takes:
/// one chunk per split gives decode contexts of a few hundred keys the most
/// workgroups (the chunk loop is a serial chain of barriers).
const DECODE_KEYS: usize = 32;
/// Decode workgroups to aim for: a few per compute unit of a large GPU,
/// without making the partials a noticeable share of the K/V read.
const DECODE_GROUPS: usize = 512;
/// The same for wide groups (at least [`DECODE_STAGE_QUERY`] query vec4 a
/// kv head: 8 heads of 512), about one per compute unit of a large GPU. A
/// split of theirs carries 16 KB of queries and writes 16.5 KB of partials
/// that attn_combine reads again, next to 128 KB of K/V a chunk of keys, so
/// fewer splits of several chunks each win (H200, 8 heads of 512 at 8K
/// keys: 45.6 us at 512 workgroups, 35.8 at 128, 53.3 at 64; at 32K 111.4,
/// 96.1, 171.2; 2026-12-01 at fa0b043, run 03), where the narrow groups lost
/// (2 heads of 256 at 1K keys: 14.5 us at 256 workgroups, 15.9 at 128).
const DECODE_GROUPS_WIDE: usize = 128;
/// Most split workgroups `attn_decode_qkv` runs in one launch: each builds
/// its group's queries itself, which at 512 of them (full layers at 8K
/// keys) cost more than the qkv_post dispatch it saves, and at 256
/// (sliding layers at 1K) less (H200, 2026-12-01 at f16691c, run 09, at
/// [`qkv_attention`]).
const FUSED_MAX_GROUPS: usize = 256;
/// Row blocks of `attn_decode` (a workgroup's rows: one, or
/// [`decode_rows`]) that share one [`decode_target`].
const DECODE_ROWS_PER_TARGET: usize = 4;
/// Most query heads per kv head `attn_decode` keeps in registers (its
/// per-head arrays; with head_dim <= 512 (`ops::MAX_HEAD_DIM`) its staged
/// queries, group * head_dim / 4 vec4, fit its 1024).
const DECODE_MAX_GROUP: usize = 8;
/// Query vec4 per kv head from which `attn_decode` stages the queries in
/// workgroup memory (its `DQN` > 1): 8 heads of 512 take it, 2 of 256 do
/// not.
const DECODE_STAGE_QUERY: usize = 512;

/// `attn_decode`'s workgroup memory without the staged queries: dred
/// (2048 f32), dmax / dsum / dalpha / dmnew (8 f32 each), sacc (256 vec4),
/// dp (256 f32), dsg (32 f32).
const DECODE_SMEM: u32 = 2048 * 4 + 4 * 8 * 4 + 256 * 16 + 256 * 4 + 32 * 4;

/// `attn_decode`'s `SGW`: the device's subgroup width where its subgroups
/// have one width that divides the kernel's 32 keys a chunk (NVIDIA and
/// Apple: 32; lavapipe: 8), so that a query slot's keys are whole
/// subgroups and the chunk's softmax runs by subgroup; else 0, the
/// softmax through workgroup memory (devices without subgroups, or whose
/// width varies). On the H200 (2026-12-01 at 3b6d936, run 05, medians of two
/// rounds) the subgroup softmax took full layers at 8K keys 36.5 -> 32.8
/// us, at 32K 97.6 -> 90.8, qkv_post + attention at 8K 40.8 -> 38.1,
/// sliding layers at 1K 14.7 -> 14.0; 16 rows of the sliding layers (four
/// a workgroup) 39.5 -> 40.1, and as much slower with the workgroup-memory
/// softmax kept for them (run 06: 40.4), so every launch takes it.
fn decode_sgw(gpu: &Gpu) -> u32 {
    let f = &gpu.features;
    let w = f.subgroup_max_size;
    if f.subgroups && f.subgroup_min_size == w && matches!(w, 8 | 16 | 32) {
        w
    } else {
        0
    }
}

/// Whether `group` query heads of `d4` vec4 a kv head are a wide group (at
/// least [`DECODE_STAGE_QUERY`] query vec4: 8 heads of 512, not 2 of 256):
/// attn_decode stages one row's queries, aims for fewer workgroups and
/// takes a row a workgroup.
fn wide_group(group: usize, d4: usize) -> bool {
    group * d4 >= DECODE_STAGE_QUERY
}

/// Decode workgroups to aim for with `group` query heads of `d4` vec4 a kv
/// head.
fn decode_target(group: usize, d4: usize) -> usize {
    if wide_group(group, d4) {
        DECODE_GROUPS_WIDE
    } else {
        DECODE_GROUPS
    }
}

/// Whether `attn_decode` stages a group's queries in workgroup memory (its
/// `DQN`, else 1): for large groups (8 heads of 512), and only where the staged
/// array (16 bytes a query vec4) fits the device's workgroup memory with
/// the kernel's own (WebGPU's baseline is 16 KB: 8 heads of 512 need 28.8).
fn decode_stages_queries(group: usize, d4: usize, smem_limit: u32) -> bool {
    wide_group(group, d4) && staged_queries_fit(group * d4, 0, smem_limit)
}

/// Whether `q` staged query vec4s (16 bytes each) fit the device's
/// workgroup memory beside attn_decode's own and `extra` bytes more.
fn staged_queries_fit(q: usize, extra: usize, smem_limit: u32) -> bool {
    DECODE_SMEM as usize + extra + 16 * q <= smem_limit as usize
}

/// attn_decode_qkv's workgroup memory past attn_decode's: `qinv`, 16 f32.
const QKV_SMEM: usize = 16 * 4;

/// Most bytes of value partials one group's tail combines: one workgroup
/// reads them all, where attn_combine spreads them over a workgroup per
/// (slot, 32 vec4). Gemma 4's sliding layers (2 slots of 64 vec4, 16-32
/// splits) take the tail; its full layers (8 slots of 128, at least 288 KB
/// from 18 splits) keep attn_combine. docs/decisions.md.
const TAIL_MAX_BYTES: usize = 64 << 10;
/// Most (slot, split) pairs a tail stages (`tail_combine`'s dred rows).
const TAIL_MAX_PAIRS: usize = 256;

/// Whether an attn_decode launch over `nsplit` splits of `slots` query
/// slots a group, in `groups` groups of `d4` vec4 rows, combines in its
/// last workgroup (its `TAIL`) instead of an attn_combine launch after it:
/// where the device has coherent storage and the partials are small.
fn takes_tail(gpu: &Gpu, slots: usize, nsplit: usize, groups: usize, d4: usize) -> bool {
    gpu.features.coherent_storage && tail_fits(slots, nsplit, groups, d4)
}

/// [`takes_tail`]'s rule on the shape: the pairs a tail stages, the bytes
/// one workgroup reads, the counters.
fn tail_fits(slots: usize, nsplit: usize, groups: usize, d4: usize) -> bool {
    slots * nsplit <= TAIL_MAX_PAIRS
        && slots * nsplit * d4 * 16 <= TAIL_MAX_BYTES
        && groups <= crate::ops::TAIL_COUNTERS
}

/// Query slots per `attn_prefill` workgroup (its `PB`).
const PREFILL_SLOTS: usize = 32;

/// Attention: where the tensor cores take the call (`attention_coop::takes`,
/// from [`super::PREFILL_MIN_M`] rows) their prep and kernel; else from
/// that many rows one `attn_prefill` dispatch; below, two dispatches: a
/// split phase (per key split and kv head: partial softmax into scratch)
/// and `attn_combine` (merge). The split phase is `attn_decode` where
/// [`decode_takes`] it (one kv head's query heads of one row, or of a few
/// rows, per workgroup), else `attn_split` (query tiles of up to MAX_TILE
/// slots).
pub(crate) fn attention(
    gpu: &Gpu,
    q: &WgpuBuffer,
    kc: &WgpuBuffer,
    vc: &WgpuBuffer,
    pos: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Attention,
) -> Result<()> {
    if !p.head_dim.is_multiple_of(4) {
        return Err(Error::Unsupported {
            backend: gpu.info.backend.clone(),
            op: "attention".into(),
            reason: format!("head_dim {} is not a multiple of 4", p.head_dim),
        });
    }
    if super::attention_coop::takes(gpu, &p) {
        return super::attention_coop::attention(gpu, q, kc, vc, pos, out, p);
    }
    let kv = (q, kc, vc, pos);
    if p.m >= super::PREFILL_MIN_M {
        // One dispatch: a workgroup per (block of query slots, kv head)
        // walks all of its keys, so there are no partials to combine.
        // (a workgroup takes a light and a heavy block, attn_prefill)
        let blocks = (p.m * (p.heads / p.kv_heads))
            .div_ceil(PREFILL_SLOTS)
            .div_ceil(2);
        let params = AttnParams::new(&p, 1, 0, blocks);
        let nv = [("NV", lanes_vec4(&p) as i64)];
        return read_qkv(
            gpu,
            kv,
            ("attn_prefill", &nv),
            &params,
            out,
            blocks * p.kv_heads,
        );
    }
    let split = split_plan(gpu, &p)?;
    split_phase(gpu, kv, out, &p, &split)
}

/// vec4 per lane of a K row in attn_split (and of a V row in
/// attn_prefill): 32 lanes cover 128-512 dims.
fn lanes_vec4(p: &Attention) -> usize {
    (p.head_dim / 4).div_ceil(32).next_power_of_two()
}

/// The first (or only) dispatch of an attention: `entry` reads q, K, V and
/// positions into `dst`.
fn read_qkv(
    gpu: &Gpu,
    (q, kc, vc, pos): (&WgpuBuffer, &WgpuBuffer, &WgpuBuffer, &WgpuBuffer),
    (entry, constants): (&'static str, &[(&'static str, i64)]),
    params: &AttnParams,
    dst: &WgpuBuffer,
    groups: usize,
) -> Result<()> {
    gpu.launch(Launch {
        kernel: for_caches("attention", kc.dtype),
        entry,
        constants,
        params: bytemuck::bytes_of(params),
        buffers: &[
            (one(q), true),
            (one(kc), true),
            (one(vc), true),
            (one(pos), true),
            (one(dst), false),
        ],
        groups: gpu.grid(groups as u32),
    })
}

/// The split phase over `split`'s plan (made by [`split_plan`] for `p`),
/// then `attn_combine` into `out`.
fn split_phase(
    gpu: &Gpu,
    kv: (&WgpuBuffer, &WgpuBuffer, &WgpuBuffer, &WgpuBuffer),
    out: &WgpuBuffer,
    p: &Attention,
    split: &SplitPlan,
) -> Result<()> {
    split_phase_into(gpu, kv, (out, None), p, split)
}

/// [`split_phase`] writing `out`, or (`Some((offset, size))`) that byte
/// range of it as its rows.
fn split_phase_into(
    gpu: &Gpu,
    kv: (&WgpuBuffer, &WgpuBuffer, &WgpuBuffer, &WgpuBuffer),
    (out, range): (&WgpuBuffer, Option<(u64, u64)>),
    p: &Attention,
    split: &SplitPlan,
) -> Result<()> {
    let d4 = p.head_dim / 4;
    let group = p.heads / p.kv_heads;
    let (entry, constants) = if split.decode {
        let rows = split.rows;
        // (several rows a workgroup read their queries from dq only)
        let stage = rows > 1
            || decode_stages_queries(group, d4, gpu.limits.max_compute_workgroup_storage_size);
        let dqn = if stage { group * rows * d4 } else { 1 };
        (
            "attn_decode",
            &[
                ("GD", group as i64),
                ("D4", d4 as i64),
                ("DQN", dqn as i64),
                ("PIPE", split.pipe as i64),
                ("MROWS", (p.m > 1) as i64),
                ("RPW", rows as i64),
                ("SGW", decode_sgw(gpu) as i64),
                ("TAIL", split.tail as i64),
            ][..],
        )
    } else {
        let qt = (p.m * group).min(MAX_TILE);
        (
            "attn_split",
            &[("NV", lanes_vec4(p) as i64), ("QT", qt as i64)][..],
        )
    };
    if !split.decode {
        read_qkv(
            gpu,
            kv,
            (entry, constants),
            &split.params,
            &split.part,
            split.groups,
        )?;
        return combine(gpu, split, (out, range), p);
    }
    let (q, kc, vc, pos) = kv;
    let counters = super::tail_counters(gpu)?;
    // (the tail writes the rows at binding 5)
    let ranges: Vec<_> = range.map(|(o, n)| (5, o, n)).into_iter().collect();
    gpu.launch_ranged(
        Launch {
            kernel: for_caches("attention", kc.dtype),
            entry,
            constants,
            params: bytemuck::bytes_of(&split.params),
            buffers: &[
                (one(q), true),
                (one(kc), true),
                (one(vc), true),
                (one(pos), true),
                (one(&split.part), false),
                (one(out), false),
                (one(&counters), false),
            ],
            groups: gpu.grid(split.groups as u32),
        },
        &ranges,
    )?;
    combine(gpu, split, (out, range), p)
}

/// A split phase's plan: its kernel (attn_decode where `decode`, else
/// attn_split), its parameters, the scratch for its partials and its
/// workgroup count.
struct SplitPlan {
    decode: bool,
    params: AttnParams,
    part: WgpuBuffer,
    groups: usize,
    /// attn_decode's `PIPE`: a split may take more than one chunk of keys.
    pipe: bool,
    /// attn_decode's `RPW`: query rows a workgroup takes ([`decode_rows`];
    /// the plan's tiles are blocks of them).
    rows: usize,
    /// attn_decode's `TAIL` ([`takes_tail`]): its last workgroups combine,
    /// and no attn_combine follows.
    tail: bool,
}

/// The key splits of `p`'s split phase and its scratch.
fn split_plan(gpu: &Gpu, p: &Attention) -> Result<SplitPlan> {
    let decode = decode_takes(p, gpu.limits.max_compute_workgroup_storage_size);
    let rows = if decode { decode_rows(p) } else { 1 };
    let d4 = p.head_dim / 4;
    let group = p.heads / p.kv_heads;
    let nslots = p.m * group;
    // Query slots per workgroup, the fewest keys a split takes (attn_split:
    // 16 per query of its tile, so its partials stay small next to the K/V
    // it reads) and the workgroups to aim for.
    let (qt, min_chunk, target) = if decode {
        (group * rows, DECODE_KEYS, decode_target(group, d4))
    } else {
        let qt = nslots.min(MAX_TILE);
        (qt, (16 * qt).max(KEYS_PER_STEP), TARGET_GROUPS)
    };
    let ntiles = nslots.div_ceil(qt);
    // attn_split aims for its target over all its tiles; attn_decode's row
    // blocks (its tiles) share no K / V load, and take its target four to a
    // share: at 16 rows, 8 heads of 512 at 8K keys on the H200, 390 us with
    // the target per row (2048 workgroups), 345 with four rows to it (512);
    // 2026-12-01 at fa0b043, run 05.
    let tiles_per_target = if decode {
        ntiles.div_ceil(DECODE_ROWS_PER_TARGET)
    } else {
        ntiles
    };
    // Keys one query can see.
    let keys = if p.window > 0 {
        p.window.min(p.capacity)
    } else {
        p.capacity
    };
    let nq = p.m * p.heads;
    let split_bytes = (nq * (d4 + 1) * 16) as u64;
    let max_by_scratch = (MAX_SCRATCH.min(gpu.max_binding()) / split_bytes).max(1) as usize;
    let nsplit = keys
        .div_ceil(min_chunk)
        .min(MAX_SPLIT)
        .min((target / (p.kv_heads * tiles_per_target)).max(1))
        .min(max_by_scratch)
        .max(1);
    let part = super::scratch_buffer(
        gpu,
        |s| &mut s.attention,
        DType::F32,
        nsplit * nq * (d4 + 1) * 4,
        0,
        "attention split-K scratch",
    )?;
    Ok(SplitPlan {
        decode,
        params: AttnParams::new(p, nsplit, min_chunk, ntiles),
        part,
        groups: nsplit * p.kv_heads * ntiles,
        pipe: decode && keys.div_ceil(nsplit) > DECODE_KEYS,
        rows,
        tail: decode && takes_tail(gpu, qt, nsplit, p.kv_heads * ntiles, d4),
    })
}

/// `attn_combine`: the split phase's partials into `out`, or into its byte
/// range `(offset, size)` (nothing where the split phase's tail combined
/// them).
fn combine(
    gpu: &Gpu,
    split: &SplitPlan,
    (out, range): (&WgpuBuffer, Option<(u64, u64)>),
    p: &Attention,
) -> Result<()> {
    if split.tail {
        return Ok(());
    }
    let nq = p.m * p.heads;
    let ranges: Vec<_> = range.map(|(o, n)| (1, o, n)).into_iter().collect();
    gpu.launch_ranged(
        Launch {
            kernel: "attention",
            entry: "attn_combine",
            constants: &[],
            params: bytemuck::bytes_of(&split.params),
            buffers: &[(one(&split.part), true), (one(out), false)],
            groups: gpu.grid((nq * (p.head_dim / 4).div_ceil(32)) as u32),
        },
        &ranges,
    )
}

/// Whether `attn_decode` takes the split phase: a kv head's query heads
/// fit its registers, below prefill sizes, and one row, or rows of wide
/// groups (at least [`DECODE_STAGE_QUERY`] query vec4 a kv head: a row a
/// workgroup), or rows of narrow groups whose [`decode_rows`] queries fit
/// workgroup memory. attn_split takes the rest: it shares each K / V load
/// among a tile's 8 query slots but walks 8 keys a step with a serial
/// softmax. On the H200 at 16 rows against attn_split: 8 heads of 512 a
/// row a workgroup, 8K keys 671 -> 345 us, 32K 2.36 -> 1.30 ms, 1K 82 ->
/// 62 (2026-12-01 at fa0b043, run 05); 2 heads of 256 four rows a workgroup, 1K
/// keys 57.6 -> 39.7 us, 8K 59.7 -> 42.5 (run 07; a row a workgroup was
/// slower than attn_split there, 86 us at 1K).
fn decode_takes(p: &Attention, smem_limit: u32) -> bool {
    let group = p.heads / p.kv_heads;
    let d4 = p.head_dim / 4;
    if group > DECODE_MAX_GROUP || p.m >= super::PREFILL_MIN_M {
        return false;
    }
    let rows = decode_rows(p);
    p.m == 1
        || wide_group(group, d4)
        || (rows > 1 && staged_queries_fit(group * rows * d4, 0, smem_limit))
}

/// Query rows an `attn_decode` workgroup takes together (its `RPW`): one
/// for a single row or wide groups, else as many as fill its 8 query slots
/// with their heads of one kv head (2 heads of 256: 4 rows).
fn decode_rows(p: &Attention) -> usize {
    let group = p.heads / p.kv_heads;
    if p.m == 1 || wide_group(group, p.head_dim / 4) {
        1
    } else {
        (DECODE_MAX_GROUP / group).max(1)
    }
}

/// Storage bindings of `attn_decode_qkv` (0-11).
const QKV_BINDINGS: u32 = 12;

/// Whether [`qkv_attention`] takes a decode row in one launch: attn_decode
/// takes it, head_dim is a multiple of 8 (the kernel's units are 4 pairs),
/// the device binds the kernel's 10 buffers and the group's queries fit
/// workgroup memory beside the kernel's own.
fn qkv_attention_fits(gpu: &Gpu, p: &Attention) -> bool {
    let group = p.heads / p.kv_heads;
    p.m == 1
        && decode_takes(p, gpu.limits.max_compute_workgroup_storage_size)
        && p.head_dim.is_multiple_of(8)
        && gpu.limits.max_storage_buffers_per_shader_stage >= QKV_BINDINGS
        && staged_queries_fit(
            group * (p.head_dim / 4),
            QKV_SMEM,
            gpu.limits.max_compute_workgroup_storage_size,
        )
}

/// [`qkv_post`] then [`attention`] on its output. One decode row that
/// [`qkv_attention_fits`] takes `attn_decode_qkv` (the norms, RoPE and
/// cache append inside the split phase) and attn_combine: one dependent
/// dispatch fewer. Else, and where the split phase has more than
/// [`FUSED_MAX_GROUPS`] workgroups (a long context), the two ops: every
/// workgroup of attn_decode_qkv builds its group's queries itself, which
/// costs more than the dispatch it saves once there are that many (on the
/// H200, full layers at 8K keys, 512 workgroups: 62.0 us fused against
/// 45.5 for the split phase and combine after a 3.8 us qkv_post; sliding
/// layers at 1K, 256 workgroups, 15.8 fused against 14.5 + 3.8; 2026-12-01
/// at f16691c, run 09; at 128 workgroups, full layers at 8K: 40.5 fused
/// against 35.8 + 3.8, 2026-12-01 at fa0b043, run 03). The caller checked
/// both ops' shapes.
pub(crate) fn qkv_attention(gpu: &Gpu, d: &DecodeStep<'_>) -> Result<()> {
    if !qkv_attention_fits(gpu, &d.p) {
        let (kc, vc) = d.kv;
        qkv_post(gpu, d.raw, d.w.0, d.w.1, d.pos, d.q, kc, vc, d.qp)?;
        return attention(gpu, d.q, kc, vc, d.pos, d.out, d.p);
    }
    // (qkv_attention_fits: the plan is attn_decode's)
    decode_launches(gpu, d, split_plan(gpu, &d.p)?, None)
}

/// One decode step's buffers and parameters, as [`qkv_attention`] takes
/// them: the raw q|k|v rows, the norms' weights, positions, the queries'
/// scratch, the caches and the heads.
pub(crate) struct DecodeStep<'a> {
    pub raw: &'a WgpuBuffer,
    pub w: (&'a WgpuBuffer, &'a WgpuBuffer),
    pub pos: &'a WgpuBuffer,
    pub q: &'a WgpuBuffer,
    pub kv: (&'a WgpuBuffer, &'a WgpuBuffer),
    pub out: &'a WgpuBuffer,
    pub qp: QkvPost,
    pub p: Attention,
}

/// A decode step's launches over `split` (an attn_decode plan), on the
/// whole of `raw` and `out` or (`rows`) one row's byte range of each: the
/// fused launch (and its combine), or, where it does not take the plan
/// (past its workgroups: a long context), qkv_post then the split phase.
fn decode_launches(
    gpu: &Gpu,
    d: &DecodeStep<'_>,
    split: SplitPlan,
    rows: Option<((u64, u64), (u64, u64))>,
) -> Result<()> {
    if qkv_attention_fits(gpu, &d.p) && split.groups <= FUSED_MAX_GROUPS {
        return fused(gpu, d, split, rows);
    }
    let (kc, vc) = d.kv;
    qkv_post_from(gpu, (d.raw, rows.map(|r| r.0)), d.w, d.pos, d.q, d.kv, d.qp)?;
    split_phase_into(
        gpu,
        (d.q, kc, vc, d.pos),
        (d.out, rows.map(|r| r.1)),
        &d.p,
        &split,
    )
}

/// `qkv_post_attention_row` with `raw` and `out` bound over row `row` (a
/// byte range each), so the row is read and written in place: as
/// [`qkv_attention`] records one row, the fused launch (and attn_combine
/// where it has no tail), or qkv_post then attention's split phase. False,
/// having recorded nothing, where a row's offset is not one the device
/// binds at (its `min_storage_buffer_offset_alignment`) or the attention
/// would not take its split phase: the caller copies the row instead.
pub(crate) fn qkv_attention_row(gpu: &Gpu, row: usize, d: &DecodeStep<'_>) -> Result<bool> {
    let (qp, p) = (&d.qp, &d.p);
    let align = u64::from(gpu.limits.min_storage_buffer_offset_alignment.max(1));
    let raw_bytes = (qp.raw_row() * 4) as u64;
    let out_bytes = (p.heads * p.head_dim * 4) as u64;
    let (raw_at, out_at) = (row as u64 * raw_bytes, row as u64 * out_bytes);
    if raw_at % align != 0 || out_at % align != 0 || !p.head_dim.is_multiple_of(4) {
        return Ok(false);
    }
    let (raw_row, out_row) = ((raw_at, raw_bytes), (out_at, out_bytes));
    // (one row is never a prefill batch: the fused launch, or qkv_post and
    // attention's split phase)
    if super::attention_coop::takes(gpu, p) {
        return Ok(false);
    }
    let split = split_plan(gpu, p)?;
    decode_launches(gpu, d, split, Some((raw_row, out_row)))?;
    Ok(true)
}

/// The fused decode launch of [`qkv_attention`] and its combine, on the
/// whole of `raw` and `out`, or (`rows`) on the byte ranges of one row of
/// each: `((raw offset, size), (out offset, size))`.
fn fused(
    gpu: &Gpu,
    d: &DecodeStep<'_>,
    mut split: SplitPlan,
    rows: Option<((u64, u64), (u64, u64))>,
) -> Result<()> {
    let (p, qp) = (&d.p, &d.qp);
    let ((w_q, w_k), (kc, vc), (raw, out)) = (d.w, d.kv, (d.raw, d.out));
    let (pos, q) = (d.pos, d.q);
    let group = p.heads / p.kv_heads;
    let d4 = p.head_dim / 4;
    let freq = freq_table(gpu, qp.theta, qp.head_dim, qp.rot_pairs)?;
    let counters = super::tail_counters(gpu)?;
    split.params.rot_pairs = qp.rot_pairs as u32;
    split.params.eps = qp.eps;
    split.params.v_from_k = qp.v_from_k as u32;
    // (the raw row at binding 7, the heads at 5: the tail writes them)
    let ranges: Vec<(u32, u64, u64)> = rows
        .map(|((ro, rn), (oo, on))| [(7, ro, rn), (5, oo, on)])
        .into_iter()
        .flatten()
        .collect();
    gpu.launch_ranged(
        Launch {
            // (the build with writable caches, kernels::VARIANTS)
            kernel: for_caches("attention_qkv", kc.dtype),
            entry: "attn_decode_qkv",
            constants: &[
                ("GD", group as i64),
                ("D4", d4 as i64),
                // (the queries are built in workgroup memory)
                ("DQN", (group * d4) as i64),
                ("WQD", wdtype_code(w_q.dtype) as i64),
                ("WKD", wdtype_code(w_k.dtype) as i64),
                ("PIPE", split.pipe as i64),
                ("SGW", decode_sgw(gpu) as i64),
                ("TAIL", split.tail as i64),
            ],
            params: bytemuck::bytes_of(&split.params),
            buffers: &[
                // (Q: attn_decode's query binding, not read here)
                (one(raw), true),
                (one(kc), false),
                (one(vc), false),
                (one(pos), true),
                (one(&split.part), false),
                (one(out), false),
                (one(&counters), false),
                (one(raw), true),
                (one(w_q), true),
                (one(w_k), true),
                (one(&freq), true),
                (one(q), false),
            ],
            groups: gpu.grid(split.groups as u32),
        },
        &ranges,
    )?;
    combine(gpu, &split, (out, rows.map(|r| r.1)), p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{backend, upload_f32, upload_u32};
    use crate::WgpuBackend;
    use turbospark::ComputeBackend;

    /// Dispatches `qkv_post_attention` records for `m` rows of a small
    /// layer (4 query heads over 2 kv heads) from position 40 over a
    /// 64-slot cache, or (`long`) over a cache of that many slots, at its
    /// end.
    fn qkv_attention_dispatches(be: &WgpuBackend, m: usize, head_dim: usize) -> u64 {
        qkv_attention_dispatches_at(be, m, head_dim, None)
    }

    fn qkv_attention_dispatches_at(
        be: &WgpuBackend,
        m: usize,
        head_dim: usize,
        long: Option<usize>,
    ) -> u64 {
        let (heads, kv_heads) = (4, 2);
        let (start, capacity) = match long {
            Some(c) => ((c - m - 1) as u32, c),
            None => (40, 64),
        };
        let qp = QkvPost {
            m,
            heads,
            kv_heads,
            head_dim,
            rot_pairs: head_dim / 2,
            theta: 10_000.0,
            eps: 1e-6,
            capacity,
            v_from_k: false,
        };
        let ap = qp.attention(0, 1.0, turbospark::Precision::Exact);
        let f = |n: usize, label| upload_f32(be, &vec![0.5; n], label);
        let raw = f(m * qp.raw_row(), "raw");
        let (wq, wk) = (f(head_dim, "wq"), f(head_dim, "wk"));
        let pos = upload_u32(be, &(start..start + m as u32).collect::<Vec<_>>(), "pos");
        let q = f(m * heads * head_dim, "q");
        let cache = capacity * kv_heads * head_dim;
        let (kc, vc) = (f(cache, "kc"), f(cache, "vc"));
        let out = f(m * heads * head_dim, "out");
        let before = be.counters().0;
        be.qkv_post_attention(&raw, &wq, &wk, &pos, &q, &kc, &vc, &out, qp, ap)
            .unwrap();
        be.flush().unwrap();
        be.counters().0 - before
    }

    #[test]
    fn qkv_post_attention_is_one_split_launch_for_a_decode_row() {
        let opts = crate::WgpuOptions {
            tails: Some(false),
            ..Default::default()
        };
        let Some(be) = crate::tests::backend_with(&opts) else {
            return;
        };
        assert!(!be.features().coherent_storage);
        // attn_decode_qkv and attn_combine.
        assert_eq!(qkv_attention_dispatches(&be, 1, 64), 2);
        // head_dim not a multiple of 8, or two rows: qkv_post, the split
        // phase and attn_combine.
        assert_eq!(qkv_attention_dispatches(&be, 1, 12), 3);
        assert_eq!(qkv_attention_dispatches(&be, 2, 64), 3);
        // A context long enough for more than FUSED_MAX_GROUPS split
        // workgroups (2 kv heads: 129 splits of 32 keys): the two ops
        // again; one split short of it, still one launch.
        let full = (FUSED_MAX_GROUPS / 2 + 1) * DECODE_KEYS;
        assert!(full / DECODE_KEYS * 2 <= decode_target(2, 16));
        assert_eq!(qkv_attention_dispatches_at(&be, 1, 64, Some(full)), 3);
        let short = full - DECODE_KEYS;
        assert_eq!(qkv_attention_dispatches_at(&be, 1, 64, Some(short)), 2);
    }

    #[test]
    fn decode_combines_in_its_tail_where_storage_is_coherent() {
        let Some(be) = backend() else { return };
        // (on Vulkan the backend takes tails by default, and wgpu offers
        // coherent storage on every Vulkan device: lavapipe, the H200)
        if be.info().api != "Vulkan" && !be.features().coherent_storage {
            eprintln!(
                "skipping: {} has no coherent storage",
                be.info().device_name
            );
            return;
        }
        assert!(be.features().coherent_storage);
        // attn_decode_qkv alone: its last split workgroups combine.
        assert_eq!(qkv_attention_dispatches(&be, 1, 64), 1);
        // qkv_post, then the split phase with its tail.
        assert_eq!(qkv_attention_dispatches(&be, 1, 12), 2);
        assert_eq!(qkv_attention_dispatches(&be, 2, 64), 2);
        // 2 slots of 128 splits: the most (slot, split) pairs a tail stages;
        // one split more (and past FUSED_MAX_GROUPS): qkv_post, attn_decode
        // and attn_combine.
        let full = (FUSED_MAX_GROUPS / 2 + 1) * DECODE_KEYS;
        assert_eq!(qkv_attention_dispatches_at(&be, 1, 64, Some(full)), 3);
        let short = full - DECODE_KEYS;
        assert_eq!(qkv_attention_dispatches_at(&be, 1, 64, Some(short)), 1);
    }

    #[test]
    fn tails_take_small_partials_only() {
        // Gemma 4's sliding layers at a 1K window: 2 slots of 64 vec4, 32
        // splits (64 KB); its full layers: 8 slots of 128 vec4 (288 KB at
        // 18 splits).
        assert!(tail_fits(2, 32, 8, 64));
        assert!(!tail_fits(8, 18, 2, 128));
        // Past the staged pairs, or the counters.
        assert!(!tail_fits(2, 129, 8, 4));
        assert!(!tail_fits(2, 16, crate::ops::TAIL_COUNTERS + 1, 4));
    }

    #[test]
    fn decode_stages_queries_only_where_they_fit() {
        // Gemma 4's full layers, 8 heads of 512: 12.4 + 16 KB.
        assert!(decode_stages_queries(8, 128, 32 * 1024));
        assert!(!decode_stages_queries(8, 128, 16 * 1024));
        assert!(decode_stages_queries(8, 128, DECODE_SMEM + 16 * 1024));
        assert!(!decode_stages_queries(8, 128, DECODE_SMEM + 16 * 1024 - 1));
        // Sliding layers, 2 heads of 256: never (read from memory).
        assert!(!decode_stages_queries(2, 64, 1 << 20));
    }

    #[test]
    fn decode_takes_one_row_and_short_batches_where_their_queries_fit() {
        let at = |m, heads, kv_heads, head_dim| Attention {
            m,
            heads,
            kv_heads,
            head_dim,
            capacity: 8192,
            window: 0,
            scale: 1.0,
            precision: turbospark::Precision::Exact,
        };
        // Gemma 4's full layers (8 heads of 512 a kv head) up to 16 rows,
        // a row a workgroup; its sliding layers (2 of 256) four rows a
        // workgroup where their 8 queries fit beside the kernel's memory
        // (not in WebGPU's 16 KB floor: attn_split there).
        assert!(decode_takes(&at(1, 16, 2, 512), 48 << 10));
        assert!(decode_takes(&at(16, 16, 2, 512), 48 << 10));
        assert!(!decode_takes(&at(17, 16, 2, 512), 48 << 10));
        assert_eq!(decode_rows(&at(16, 16, 2, 512)), 1);
        assert!(decode_takes(&at(1, 16, 8, 256), 48 << 10));
        assert!(decode_takes(&at(2, 16, 8, 256), 48 << 10));
        assert!(!decode_takes(&at(2, 16, 8, 256), 16 << 10));
        assert_eq!(decode_rows(&at(2, 16, 8, 256)), 4);
        assert_eq!(decode_rows(&at(1, 16, 8, 256)), 1);
        // Past 8 heads a kv head: attn_split at any row count.
        assert!(!decode_takes(&at(1, 16, 1, 512), 48 << 10));
    }

    #[test]
    fn wide_groups_aim_for_fewer_decode_workgroups() {
        // Gemma 4's full layers (8 heads of 512) and sliding ones (2 of 256).
        assert_eq!(decode_target(8, 128), DECODE_GROUPS_WIDE);
        assert_eq!(decode_target(2, 64), DECODE_GROUPS);
        assert_eq!(decode_target(4, 128), DECODE_GROUPS_WIDE);
        assert_eq!(decode_target(4, 127), DECODE_GROUPS);
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
            ("rope", "QkvParams"),
            std::mem::size_of::<QkvParams>(),
            fields!(QkvParams; m, heads, kv_heads, head_dim, rot_pairs, capacity, eps, v_from_k),
            &[],
        );
        check(
            ("rope", "Params"),
            std::mem::size_of::<RopeParams>(),
            fields!(RopeParams; m, heads, head_dim, rot_pairs),
            &[],
        );
        check(
            ("kv_cache", "Params"),
            std::mem::size_of::<KvParams>(),
            fields!(KvParams; m, kv_heads, head_dim, capacity),
            &[],
        );
        check(
            ("attention", "Params"),
            std::mem::size_of::<AttnParams>(),
            fields!(AttnParams; m, heads, kv_heads, group, d4, capacity, window, scale, nsplit, min_chunk, nslots, ntiles, rot_pairs, eps, v_from_k, _pad),
            &[],
        );
    }
}
