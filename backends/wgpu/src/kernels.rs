//! The WGSL kernels, embedded at build time, and the compiled-pipeline cache.
//!
//! Every kernel file is compiled with `kernels/common.wgsl` prepended (shared
//! helpers: weight decoding, gelu, grid indexing), then the workgroup
//! reduction helpers: `kernels/reduce_subgroup.wgsl` where the device has
//! subgroup operations, else `kernels/reduce.wgsl` (same functions). Bindings follow one
//! convention: `@group(0) @binding(0)` is the op's uniform parameter block
//! (a 256-byte slot of a per-batch arena, one bind group per slot), `@group(1)
//! @binding(i)` are the storage buffers in the launcher's order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use turbospark::{DType, Error, Result};

pub const COMMON: &str = turbospark::kernels::COMMON;
/// Reduction helpers without and with subgroup operations (same functions).
pub const REDUCE: &str = turbospark::kernels::REDUCE;
pub const REDUCE_SUBGROUP: &str = turbospark::kernels::REDUCE_SUBGROUP;
/// The prefill GEMMs' parameter block and token tiles over the route list,
/// appended to the GEMM families.
pub const GEMM_TILES: &str = turbospark::kernels::GEMM_TILES;
/// The router's top-k and softmax over a token's logits, appended to the
/// families that pick experts.
pub const TOPK: &str = turbospark::kernels::TOPK;
/// The routed and slotted gate_up pairs' bindings, ranking, routing writes
/// and slot lookup, appended to the families that have those pairs.
pub const ROUTED_PAIR: &str = turbospark::kernels::ROUTED_PAIR;
/// RoPE's rotation of a pair (`turn_pair`) and its angle arithmetic,
/// appended to the families that turn by RoPE (rope, and the attention_qkv
/// variant).
pub const ROPE_ANGLE: &str = turbospark::kernels::ROPE_ANGLE;
/// f32 -> f16 rounding that every device does alike, appended to the
/// families that round inputs for tensor cores.
pub const F16_ROUND: &str = turbospark::kernels::F16_ROUND;
/// The last-workgroup count of the launches that finish in one
/// (`tail_last`), appended to the attention families.
pub const TAIL: &str = turbospark::kernels::TAIL;
/// The keys a query row sees (`key_range`), appended to the attention
/// families.
pub const ATTENTION_KEYS: &str = turbospark::kernels::ATTENTION_KEYS;

/// MLX affine-quantized weight reads (`affine_pair`, `affine_elem`),
/// appended to the families whose weights may be quantized
/// ([`AFFINE_FAMILIES`]).
pub const AFFINE: &str = turbospark::kernels::AFFINE;

/// The quantized MoE pair entries, appended to kernels/affine_gemv.wgsl in
/// its `affine_gemv_pair` build ([`VARIANTS`]).
pub const AFFINE_PAIR: &str = turbospark::kernels::AFFINE_PAIR;

/// The families that read quantized weights (they define `wword`, and
/// declare `QBITS` and `QGROUP` through [`AFFINE`]).
pub const AFFINE_FAMILIES: &[&str] = &[
    "matmul",
    "router",
    "moe",
    "embed",
    "affine_gemv",
    "gemm",
    "gemm_coop",
    "fused",
];

/// The KV caches' element type and the conversion a write goes through,
/// appended to the families that read or write the caches
/// ([`CACHE_FAMILIES`]): f32 in their own builds, f16 in their `_f16`
/// builds ([`F16_CACHE_BUILDS`]).
pub const KV_F32: &str = turbospark::kernels::KV_F32;
pub const KV_F16: &str = turbospark::kernels::KV_F16;

/// The families (files and variants) that read or write the KV caches.
pub const CACHE_FAMILIES: &[&str] = &[
    "kv_cache",
    "rope",
    "attention",
    "attention_qkv",
    "attention_coop",
];

/// `(name, family)`: each cache family built for f16 caches. The family's
/// text is the same; `CacheT` is f16 (kernels/kv_f16.wgsl) and `enable
/// f16;` leads.
pub const F16_CACHE_BUILDS: &[(&str, &str)] = &[
    ("kv_cache_f16", "kv_cache"),
    ("rope_f16", "rope"),
    ("attention_f16", "attention"),
    ("attention_qkv_f16", "attention_qkv"),
    ("attention_coop_f16", "attention_coop"),
];

/// The build of cache family `family` for caches of `cache` (f32 or f16).
pub fn for_caches(family: &'static str, cache: DType) -> &'static str {
    if cache != DType::F16 {
        return family;
    }
    F16_CACHE_BUILDS
        .iter()
        .find(|(_, f)| *f == family)
        .map_or(family, |(n, _)| *n)
}

/// `(name, source)` of every kernel family file in `kernels/`.
pub const KERNELS: &[(&str, &str)] = &[
    ("rmsnorm", turbospark::kernels::RMSNORM),
    ("elementwise", turbospark::kernels::ELEMENTWISE),
    ("embed", turbospark::kernels::EMBED),
    ("argmax", turbospark::kernels::ARGMAX),
    ("slots", turbospark::kernels::SLOTS),
    ("matmul", turbospark::kernels::MATMUL),
    ("gemv", turbospark::kernels::GEMV),
    ("affine_gemv", turbospark::kernels::AFFINE_GEMV),
    ("gemm", turbospark::kernels::GEMM),
    ("gemm_coop", turbospark::kernels::GEMM_COOP),
    ("gemm_prep", turbospark::kernels::GEMM_PREP),
    ("router", turbospark::kernels::ROUTER),
    ("moe", turbospark::kernels::MOE),
    ("moe_decode", turbospark::kernels::MOE_DECODE),
    ("rope", turbospark::kernels::ROPE),
    ("kv_cache", turbospark::kernels::KV_CACHE),
    ("attention", turbospark::kernels::ATTENTION),
    ("attention_coop", turbospark::kernels::ATTENTION_COOP),
    ("fused", turbospark::kernels::FUSED),
    ("bench", turbospark::kernels::BENCH),
];

/// A family built from another family's text: some declarations changed
/// and more code appended.
pub struct Variant {
    pub name: &'static str,
    pub base: &'static str,
    /// `(from, to)`: each `from` occurs once in the base's text.
    pub changes: &'static [(&'static str, &'static str)],
    pub appendix: &'static [&'static str],
}

/// `attention_qkv`: kernels/attention.wgsl with its caches writable, and
/// kernels/attention_qkv.wgsl's `attn_decode_qkv`, which appends the
/// token's key and value (with kernels/rope_angle.wgsl). The other attention
/// kernels keep the caches read-only, which lets the driver read them
/// through its read-only cache path (on the H200, a 6-layer cut of the 26B
/// shape prefilled 3.7% slower with every attention kernel binding them
/// writable).
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "attention_qkv",
        base: "attention",
        changes: &[
            ("var<storage, read> KC:", "var<storage, read_write> KC:"),
            ("var<storage, read> VC:", "var<storage, read_write> VC:"),
        ],
        appendix: &[turbospark::kernels::ATTENTION_QKV, ROPE_ANGLE],
    },
    // `affine_gemv_pair`: kernels/affine_gemv.wgsl with its binding
    // accessors renamed `_a` and kernels/affine_pair.wgsl's, which read
    // either problem's bindings: the quantized MoE phases of two problems
    // in one launch (with kernels/topk.wgsl and kernels/routed_pair.wgsl for
    // the routed and slotted gate_up pairs).
    // The single-problem entries keep their own build, which binds five
    // buffers, not ten.
    Variant {
        name: "affine_gemv_pair",
        base: "affine_gemv",
        changes: &[
            ("fn wword(i: u32) -> u32 {", "fn wword_a(i: u32) -> u32 {"),
            ("fn wvec(i: u32)", "fn wvec_a(i: u32)"),
            ("fn xvec(i: u32)", "fn xvec_a(i: u32)"),
            ("fn id_at(i: u32)", "fn id_at_a(i: u32)"),
            ("fn wt_at(i: u32)", "fn wt_at_a(i: u32)"),
            ("fn out_set(i: u32, v: f32)", "fn out_set_a(i: u32, v: f32)"),
        ],
        appendix: &[AFFINE_PAIR, TOPK, ROUTED_PAIR],
    },
];

/// Every family's name: the files', the variants', then the f16 cache
/// builds'.
pub fn families() -> impl Iterator<Item = &'static str> {
    KERNELS
        .iter()
        .map(|(n, _)| *n)
        .chain(VARIANTS.iter().map(|v| v.name))
        .chain(F16_CACHE_BUILDS.iter().map(|(n, _)| *n))
}

/// The full WGSL text of a kernel family: the file's `enable` directives
/// (WGSL wants them first), the common prelude, the reduction helpers (the
/// subgroup ones when `subgroups`), then the rest of the file; a variant
/// ([`VARIANTS`]) is its base's text with each change made once. With
/// `coherent` (the device has coherent storage) every [`COHERENT_MARK`]
/// becomes `@coherent`; without, it stays a comment.
pub fn source(name: &str, subgroups: bool, coherent: bool) -> Option<String> {
    let text = match F16_CACHE_BUILDS.iter().find(|(n, _)| *n == name) {
        Some((_, family)) => build(family, subgroups, true),
        None => build(name, subgroups, false),
    }?;
    Some(if coherent {
        text.replace(COHERENT_MARK, "@coherent")
    } else {
        text
    })
}

/// One module the backend may compile: a family ([`families`]) with or
/// without the subgroup reduction helpers, with or without its
/// [`COHERENT_MARK`]s turned on. [`builds`] lists every one; the pipeline
/// cache compiles exactly [`Build::source`], and `turbospark kernels --emit`
/// writes the same text, so what a kernel author reads is what runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Build {
    pub family: &'static str,
    pub subgroups: bool,
    pub coherent: bool,
}

impl Build {
    /// The module's WGSL text, as the backend hands it to wgpu.
    pub fn source(&self) -> String {
        source(self.family, self.subgroups, self.coherent)
            .expect("a Build names a registered family")
    }

    /// A file name that says the build: `FAMILY[.subgroups][.coherent].wgsl`.
    pub fn file_name(&self) -> String {
        let mut n = self.family.to_string();
        if self.subgroups {
            n.push_str(".subgroups");
        }
        if self.coherent {
            n.push_str(".coherent");
        }
        n + ".wgsl"
    }

    /// The WebGPU features (their WebGPU names) a device needs to compile
    /// the module: `shader-f16` where it enables f16, `subgroups` for the
    /// subgroup build.
    pub fn features(&self) -> Vec<&'static str> {
        let mut f = Vec::new();
        if self.source().lines().any(|l| l.trim() == "enable f16;") {
            f.push("shader-f16");
        }
        if self.subgroups {
            f.push("subgroups");
        }
        f
    }

    /// What the module uses that only wgpu offers, with no WebGPU
    /// equivalent yet (None: it is WebGPU throughout): cooperative matrices
    /// (`enable wgpu_cooperative_matrix;`) and coherent storage
    /// (`@coherent`).
    pub fn wgpu_only(&self) -> Option<&'static str> {
        let src = self.source();
        if src.contains("enable wgpu_cooperative_matrix;") {
            Some("cooperative matrices (wgpu_cooperative_matrix)")
        } else if self.coherent {
            Some("coherent storage (@coherent, wgpu's MEMORY_DECORATION_COHERENT)")
        } else {
            None
        }
    }
}

/// Every module the backend may compile: each family ([`families`]) without
/// and with subgroups, and, for the families that mark a declaration
/// coherent, each of those again with coherent storage.
pub fn builds() -> Vec<Build> {
    let mut all = Vec::new();
    for family in families() {
        let marked = source(family, false, false).is_some_and(|s| s.contains(COHERENT_MARK));
        for subgroups in [false, true] {
            for coherent in [false, true] {
                if coherent && !marked {
                    continue;
                }
                all.push(Build {
                    family,
                    subgroups,
                    coherent,
                });
            }
        }
    }
    all
}

/// Where the pipeline cache appends a line for each pipeline it creates
/// (`TURBOSPARK_PIPELINE_LOG`): a JSON object with the module's file name
/// ([`Build::file_name`]) and family, the entry point and the override
/// constants set.
/// For `turbospark kernels --emit --pipelines`, which lists these override
/// sets in its manifest so a second compiler sees the pipelines a run made.
pub const PIPELINE_LOG: &str = "TURBOSPARK_PIPELINE_LOG";

/// One line of the [`PIPELINE_LOG`].
fn log_line(build: &Build, key: &PipelineKey) -> String {
    let constants: Vec<String> = key
        .constants
        .iter()
        .map(|(n, v)| format!("\"{n}\":{v}"))
        .collect();
    format!(
        "{{\"family\":\"{}\",\"module\":\"{}\",\"entry\":\"{}\",\"constants\":{{{}}}}}\n",
        build.family,
        build.file_name(),
        key.entry,
        constants.join(",")
    )
}

/// Append `line` to the [`PIPELINE_LOG`] file, when one is named. One
/// `write` of a short line on a file opened for appending: lines from
/// processes that log at once do not interleave.
fn log_pipeline(line: &str) {
    let Some(path) = std::env::var_os(PIPELINE_LOG) else {
        return;
    };
    use std::io::Write;
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = appended {
        eprintln!("turbospark: cannot append to {PIPELINE_LOG} file {path:?}: {e}");
    }
}

/// Written before a storage declaration that a launch's last workgroup reads
/// after the others wrote it (a tail: `WgpuFeatures::coherent_storage`).
pub const COHERENT_MARK: &str = "/* @coherent */";

/// [`source`] of a family with f32 or f16 (`f16_caches`) KV caches.
fn build(name: &str, subgroups: bool, f16_caches: bool) -> Option<String> {
    if let Some(v) = VARIANTS.iter().find(|v| v.name == name) {
        let mut text = build(v.base, subgroups, f16_caches)?;
        for (from, to) in v.changes {
            if text.matches(from).count() != 1 {
                return None;
            }
            text = text.replacen(from, to, 1);
        }
        for a in v.appendix {
            text.push('\n');
            text.push_str(a);
        }
        return Some(text);
    }
    let reduce = if subgroups { REDUCE_SUBGROUP } else { REDUCE };
    KERNELS.iter().find(|(n, _)| *n == name).map(|(_, s)| {
        let (mut enables, body): (Vec<&str>, Vec<&str>) =
            s.lines().partition(|l| l.starts_with("enable "));
        if f16_caches && !enables.contains(&"enable f16;") {
            enables.push("enable f16;");
        }
        let mut appendix = match name {
            "gemm" => GEMM_TILES.to_string(),
            "gemm_prep" | "gemm_coop" => format!("{GEMM_TILES}\n{F16_ROUND}"),
            "attention" => format!("{ATTENTION_KEYS}\n{TAIL}"),
            "attention_coop" => format!("{ATTENTION_KEYS}\n{F16_ROUND}"),
            "router" => TOPK.to_string(),
            "moe_decode" => format!("{TOPK}\n{ROUTED_PAIR}"),
            "rope" => ROPE_ANGLE.to_string(),
            _ => String::new(),
        };
        if AFFINE_FAMILIES.contains(&name) {
            appendix.push('\n');
            appendix.push_str(AFFINE);
        }
        if CACHE_FAMILIES.contains(&name) {
            appendix.push('\n');
            appendix.push_str(if f16_caches { KV_F16 } else { KV_F32 });
        }
        format!(
            "{}\n{COMMON}\n{reduce}\n{}\n{appendix}",
            enables.join("\n"),
            body.join("\n")
        )
    })
}

/// Kernel families that need a device feature beyond WebGPU's baseline
/// (`gemm_coop`, `attention_coop`: f16 and cooperative matrices;
/// `gemm_prep` and the `_f16` cache builds: f16). The backend compiles a
/// family on its first launch, and launches this one only where the device
/// has the feature; the WGSL validation test gives them the capability.
pub const OPTIONAL: &[&str] = &[
    "gemm_coop",
    "gemm_prep",
    "attention_coop",
    "kv_cache_f16",
    "rope_f16",
    "attention_f16",
    "attention_qkv_f16",
    "attention_coop_f16",
];

/// Whether to compile kernels with wgpu's injected runtime checks (index
/// clamping, loop bounding, division guards): `TURBOSPARK_SHADER_CHECKS=1`.
/// Off by default: on the H200 the checks made the LM head GEMV 2.6x slower
/// (888 us against 337 us, docs/decisions.md).
pub fn shader_checks() -> bool {
    std::env::var("TURBOSPARK_SHADER_CHECKS").is_ok_and(|v| v == "1")
}

/// Value of the `WDTYPE` override constant for a weight dtype.
pub fn wdtype_code(d: DType) -> f64 {
    match d {
        DType::F32 => 0.0,
        DType::F16 => 1.0,
        DType::BF16 => 2.0,
        DType::U32 => 3.0,
        // A quantized weight's kernels decode its scales (kernels/affine.wgsl).
        DType::Affine(a) => wdtype_code(a.scales.dtype()),
    }
}

/// Identifies one compiled pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    pub kernel: &'static str,
    pub entry: &'static str,
    /// Override constants, as (name, value) with value in integer form.
    pub constants: Vec<(&'static str, i64)>,
    /// Access of each group-1 binding: true = read-only.
    pub access: Vec<bool>,
}

impl PipelineKey {
    pub fn new(
        kernel: &'static str,
        entry: &'static str,
        constants: &[(&'static str, i64)],
        read_only: impl IntoIterator<Item = bool>,
    ) -> Self {
        PipelineKey {
            kernel,
            entry,
            constants: constants.to_vec(),
            access: read_only.into_iter().collect(),
        }
    }
}

pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub storage_layout: wgpu::BindGroupLayout,
}

/// Compiled modules by family and pipelines by key, built on first use and
/// kept (Metal has no pipeline cache object in wgpu).
#[derive(Default)]
pub(crate) struct Cache {
    modules: Mutex<HashMap<&'static str, Arc<wgpu::ShaderModule>>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Pipeline>>>,
    /// Whether the device has subgroup operations (picks the reduce helpers).
    subgroups: bool,
    /// Whether the device has coherent storage (turns [`COHERENT_MARK`]s on).
    coherent: bool,
}

impl Cache {
    /// An empty cache for a device with (`subgroups`) or without subgroup
    /// operations, with or without (`coherent`) coherent storage.
    pub fn new(subgroups: bool, coherent: bool) -> Cache {
        Cache {
            subgroups,
            coherent,
            ..Default::default()
        }
    }

    /// The [`Build`] of `family` this device compiles.
    fn build(&self, family: &'static str) -> Build {
        let marked = source(family, false, false).is_some_and(|s| s.contains(COHERENT_MARK));
        Build {
            family,
            subgroups: self.subgroups,
            coherent: self.coherent && marked,
        }
    }

    pub fn get(
        &self,
        device: &wgpu::Device,
        params_layout: &wgpu::BindGroupLayout,
        key: &PipelineKey,
    ) -> Result<Arc<Pipeline>> {
        if let Some(p) = self
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return Ok(p.clone());
        }
        let module = self.module(device, key.kernel)?;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let entries: Vec<wgpu::BindGroupLayoutEntry> = key
            .access
            .iter()
            .enumerate()
            .map(|(i, &read_only)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let label = format!("{}::{}", key.kernel, key.entry);
        let storage_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
        let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[Some(params_layout), Some(&storage_layout)],
            immediate_size: 0,
        });
        let constants: Vec<(&str, f64)> =
            key.constants.iter().map(|(n, v)| (*n, *v as f64)).collect();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("pipeline {label}: {e}")));
        }
        log_pipeline(&log_line(&self.build(key.kernel), key));
        let p = Arc::new(Pipeline {
            pipeline,
            storage_layout,
        });
        self.pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), p.clone());
        Ok(p)
    }

    fn module(
        &self,
        device: &wgpu::Device,
        kernel: &'static str,
    ) -> Result<Arc<wgpu::ShaderModule>> {
        if let Some(m) = self
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(kernel)
        {
            return Ok(m.clone());
        }
        let src = source(kernel, self.subgroups, self.coherent)
            .ok_or_else(|| Error::Gpu(format!("no kernel family named {kernel}")))?;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(kernel),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        };
        let m = if shader_checks() {
            device.create_shader_module(desc)
        } else {
            // SAFETY: these are the project's own kernels, not user input.
            // Every index they form is bounded by a shape the host validated
            // (src/ops/) before the launch, every loop has a uniform or
            // constant bound, and every divisor is a validated non-zero size;
            // the parity suite runs them in this mode with poisoned guard
            // regions after every output. On Vulkan the driver's robust
            // buffer access still applies. See docs/decisions.md.
            unsafe {
                device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        };
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("kernels/{kernel}.wgsl: {e}")));
        }
        let m = Arc::new(m);
        self.modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kernel, m.clone());
        Ok(m)
    }
}

/// Most cached bind groups before the cache starts over (a decode step of a
/// 30-layer model uses under a thousand).
const MAX_BIND_GROUPS: usize = 8192;

/// Bind groups keyed by (pipeline address, buffers, the bindings over a
/// byte range). `wgpu::Buffer` hashes and compares by identity, which its
/// interior state never changes (hence the `mutable_key_type` allowances).
type BindGroups = HashMap<(usize, Vec<wgpu::Buffer>, Vec<(u32, u64, u64)>), wgpu::BindGroup>;

/// Storage bind groups by (pipeline, buffers): creating one costs about
/// 2.5 us of CPU in wgpu, and a decode step binds the same weights and
/// activations every token. Entries whose buffers were dropped are removed
/// before the next lookup (see [`crate::buffer::Chunk`]).
#[derive(Default)]
pub(crate) struct BindCache {
    groups: Mutex<BindGroups>,
    dropped: crate::buffer::Reaper,
}

impl BindCache {
    /// Bind groups held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.groups.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn reaper(&self) -> crate::buffer::Reaper {
        self.dropped.clone()
    }

    /// Drop the bind groups of buffers dropped since the last call, so their
    /// device memory is freed (called before every lookup and allocation).
    pub fn purge(&self) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        Self::forget_dropped(&mut groups, &self.dropped);
    }

    #[allow(clippy::mutable_key_type)]
    fn forget_dropped(groups: &mut BindGroups, dropped: &crate::buffer::Reaper) {
        let dead = std::mem::take(&mut *dropped.lock().unwrap_or_else(|e| e.into_inner()));
        if !dead.is_empty() {
            groups.retain(|(_, bufs, _), _| !bufs.iter().any(|b| dead.contains(b)));
        }
    }

    pub fn get(
        &self,
        device: &wgpu::Device,
        pipe: &Arc<Pipeline>,
        label: &str,
        buffers: &[(&wgpu::Buffer, bool)],
        ranges: &[(u32, u64, u64)],
    ) -> wgpu::BindGroup {
        let key = (
            Arc::as_ptr(pipe) as usize,
            buffers
                .iter()
                .map(|(b, _)| (*b).clone())
                .collect::<Vec<_>>(),
            ranges.to_vec(),
        );
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        Self::forget_dropped(&mut groups, &self.dropped);
        if let Some(g) = groups.get(&key) {
            return g.clone();
        }
        if groups.len() >= MAX_BIND_GROUPS {
            groups.clear();
        }
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, (b, _))| {
                let binding = i as u32;
                let resource = match ranges.iter().find(|r| r.0 == binding) {
                    Some(&(_, offset, size)) => {
                        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: b,
                            offset,
                            size: wgpu::BufferSize::new(size),
                        })
                    }
                    None => b.as_entire_binding(),
                };
                wgpu::BindGroupEntry { binding, resource }
            })
            .collect();
        let g = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipe.storage_layout,
            entries: &entries,
        });
        groups.insert(key, g.clone());
        g
    }
}
