//! The WGSL kernels' sources, owned by this crate so that every backend
//! crate that compiles them (turbospark-wgpu) packages and builds on its own:
//! one constant per file of `kernels/`, named for the file.

pub const AFFINE: &str = include_str!("../kernels/affine.wgsl");
pub const AFFINE_GEMV: &str = include_str!("../kernels/affine_gemv.wgsl");
pub const AFFINE_PAIR: &str = include_str!("../kernels/affine_pair.wgsl");
pub const ARGMAX: &str = include_str!("../kernels/argmax.wgsl");
pub const ATTENTION: &str = include_str!("../kernels/attention.wgsl");
pub const ATTENTION_COOP: &str = include_str!("../kernels/attention_coop.wgsl");
pub const ATTENTION_KEYS: &str = include_str!("../kernels/attention_keys.wgsl");
pub const ATTENTION_QKV: &str = include_str!("../kernels/attention_qkv.wgsl");
pub const BENCH: &str = include_str!("../kernels/bench.wgsl");
pub const COMMON: &str = include_str!("../kernels/common.wgsl");
pub const ELEMENTWISE: &str = include_str!("../kernels/elementwise.wgsl");
pub const EMBED: &str = include_str!("../kernels/embed.wgsl");
pub const F16_ROUND: &str = include_str!("../kernels/f16_round.wgsl");
pub const FUSED: &str = include_str!("../kernels/fused.wgsl");
pub const GEMM: &str = include_str!("../kernels/gemm.wgsl");
pub const GEMM_COOP: &str = include_str!("../kernels/gemm_coop.wgsl");
pub const GEMM_PREP: &str = include_str!("../kernels/gemm_prep.wgsl");
pub const GEMM_TILES: &str = include_str!("../kernels/gemm_tiles.wgsl");
pub const GEMV: &str = include_str!("../kernels/gemv.wgsl");
pub const KV_CACHE: &str = include_str!("../kernels/kv_cache.wgsl");
pub const KV_F16: &str = include_str!("../kernels/kv_f16.wgsl");
pub const KV_F32: &str = include_str!("../kernels/kv_f32.wgsl");
pub const MATMUL: &str = include_str!("../kernels/matmul.wgsl");
pub const MOE: &str = include_str!("../kernels/moe.wgsl");
pub const MOE_DECODE: &str = include_str!("../kernels/moe_decode.wgsl");
pub const REDUCE: &str = include_str!("../kernels/reduce.wgsl");
pub const REDUCE_SUBGROUP: &str = include_str!("../kernels/reduce_subgroup.wgsl");
pub const RMSNORM: &str = include_str!("../kernels/rmsnorm.wgsl");
pub const ROPE: &str = include_str!("../kernels/rope.wgsl");
pub const ROPE_ANGLE: &str = include_str!("../kernels/rope_angle.wgsl");
pub const ROUTED_PAIR: &str = include_str!("../kernels/routed_pair.wgsl");
pub const ROUTER: &str = include_str!("../kernels/router.wgsl");
pub const SLOTS: &str = include_str!("../kernels/slots.wgsl");
pub const TAIL: &str = include_str!("../kernels/tail.wgsl");
pub const TOPK: &str = include_str!("../kernels/topk.wgsl");
