//! Adapter choice and device creation.

use turbospark::backend::{BackendInfo, Limits};

use crate::features::WgpuFeatures;
use turbospark::{DeviceType, Error, Result};

use crate::limits::LimitsProfile;

/// How to pick the adapter.
#[derive(Clone, Debug, Default)]
pub struct WgpuOptions {
    /// Case-insensitive substring of the adapter name (`"llvmpipe"`, `"H200"`).
    /// Defaults to the `TURBOSPARK_ADAPTER` environment variable.
    pub adapter: Option<String>,
    /// Leave subgroup operations off even where the adapter has them, so
    /// every reduction takes the workgroup-memory path (kernels/reduce.wgsl):
    /// for testing that path on devices that have subgroups. Also set by
    /// `TURBOSPARK_NO_SUBGROUPS=1` (`0` or `1`).
    pub no_subgroups: bool,
    /// Launches that finish in their last workgroup ("tails": attn_decode
    /// combining its splits, docs/decisions.md), which
    /// need coherent storage: `None` takes them on Vulkan where the adapter
    /// has it (measured and tested there: lavapipe, the H200) and not on
    /// Metal, DX12 or MoltenVK, where no device run has checked them yet;
    /// `Some(true)` wherever the adapter has coherent storage; `Some(false)`
    /// never (the dependent dispatches run instead). Defaults to the
    /// `TURBOSPARK_TAILS` environment variable (`0` or `1`).
    pub tails: Option<bool>,
    /// Tiles of the prefill GEMM (`kernels/gemm.wgsl`) in place of the
    /// shape-chosen defaults, `"tm,tn4,wn,bk;tm,tn4,wn,bk"` (dense; grouped;
    /// an empty half keeps its default): for tile sweeps and for testing
    /// every tile. Defaults to the `TURBOSPARK_GEMM_TILES` environment
    /// variable; a tile the kernel or device cannot hold is an error at the
    /// first launch that uses it.
    pub gemm_tiles: Option<String>,
    /// The prefill GEMM on cooperative matrices (tensor cores,
    /// `kernels/gemm_coop.wgsl`): `None` uses them where the adapter offers
    /// 16x16x16 f16 -> f32 matrices, `Some(false)` never, `Some(true)`
    /// requires them (an error where absent). Defaults to the
    /// `TURBOSPARK_TENSOR_CORES` environment variable (`0` or `1`).
    pub tensor_cores: Option<bool>,
    /// Tiles of the tensor-core GEMM (`kernels/gemm_coop.wgsl`) in place of
    /// the defaults, `"wm,wn,stage_x;...;..."` (dense; narrow dense;
    /// MoE; an empty part keeps its default): for tile sweeps. Defaults to
    /// the `TURBOSPARK_COOP_TILES` environment variable; a tile the kernel
    /// or device cannot hold is an error when the backend opens.
    pub coop_tiles: Option<String>,
    /// Store MoE expert stacks in tile order (common.wgsl's `expert_row`,
    /// docs/decisions.md) where their shape allows:
    /// `Some(true)` / `Some(false)`; `None` takes the
    /// `TURBOSPARK_EXPERT_TILES` environment variable (`0` or `1`), else
    /// on where the device has the tensor-core GEMM (measured there: the
    /// H200) and off elsewhere (not yet measured).
    pub expert_tiles: Option<bool>,
    /// The limits to ask the device for: the adapter's (`None` and
    /// [`LimitsProfile::Adapter`]), or the smaller of the adapter's and a
    /// smaller target's (`Apple7`, `WebGpu`), so the kernels are held to
    /// what that target allows. Defaults to the `TURBOSPARK_LIMITS`
    /// environment variable (`apple7`, `webgpu` or `adapter`).
    pub limits: Option<LimitsProfile>,
    /// Streamed experts' slot stacks mappable by the host, so a miss is
    /// copied from the checkpoint straight into its slot (no staging, no
    /// device copy; docs/decisions.md): `None` where the adapter offers
    /// mappable storage buffers and its memory is the host's (an integrated
    /// or software GPU) and the limits are not the WebGPU profile's;
    /// `Some(false)` never (the staging path); `Some(true)` wherever the
    /// adapter offers them (an error where absent or under the WebGPU
    /// profile). Defaults to the `TURBOSPARK_MAPPED_SLOTS` environment
    /// variable (`0` or `1`).
    pub mapped_slots: Option<bool>,
    /// Rows of x (2 ..= 17) from which a matmul of at most 16 rows takes the
    /// tiled GEMM (`kernels/gemm.wgsl`, one 16-row tile on the tensor cores
    /// or the f32 units) rather than the streaming GEMVs (each lane's sums
    /// held for every row, reduced a few a round); 17: never. `None` takes
    /// the `TURBOSPARK_GEMM_FROM_M` environment variable, else
    /// `gemm_tiles::GEMM_FROM_M` (measured on the H100: the GEMVs faster at
    /// 4 rows, the GEMM at 16).
    pub gemm_from_m: Option<usize>,
}

/// An on/off option, else its environment variable (`0` or `1`; unset or
/// empty: None).
fn switch_or_env(opt: Option<bool>, var: &str) -> Result<Option<bool>> {
    if opt.is_some() {
        return Ok(opt);
    }
    match std::env::var(var).as_deref() {
        Err(_) | Ok("") => Ok(None),
        Ok("0") => Ok(Some(false)),
        Ok("1") => Ok(Some(true)),
        Ok(v) => Err(Error::InvalidInput(format!("{var}={v:?}: expected 0 or 1"))),
    }
}

/// What an adapter is, for listings (`turbospark info`).
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    pub api: String,
    pub device_type: DeviceType,
    pub driver: String,
}

/// The cooperative-matrix configuration kernels/gemm_coop.wgsl uses.
const COOP_GEMM_CONFIG: &str = "16x16x16 f16->f32";

/// An option's text, else its environment variable's.
pub(crate) fn option_or_env(opt: &Option<String>, var: &str) -> Option<String> {
    opt.clone().or_else(|| std::env::var(var).ok())
}

/// The adapter's cooperative-matrix configurations, `"MxNxK ab->c"`.
fn coop_configs(adapter: &wgpu::Adapter, afeat: wgpu::Features) -> Vec<String> {
    if !afeat.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        return Vec::new();
    }
    adapter
        .cooperative_matrix_properties()
        .iter()
        .map(|p| {
            format!(
                "{}x{}x{} {:?}->{:?}{}",
                p.m_size,
                p.n_size,
                p.k_size,
                p.ab_type,
                p.cr_type,
                if p.saturating_accumulation {
                    " sat"
                } else {
                    ""
                }
            )
            .to_lowercase()
        })
        .collect()
}

fn device_type(t: wgpu::DeviceType) -> DeviceType {
    match t {
        wgpu::DeviceType::DiscreteGpu => DeviceType::DiscreteGpu,
        wgpu::DeviceType::IntegratedGpu => DeviceType::IntegratedGpu,
        wgpu::DeviceType::VirtualGpu => DeviceType::VirtualGpu,
        wgpu::DeviceType::Cpu => DeviceType::SoftwareGpu,
        wgpu::DeviceType::Other => DeviceType::Other,
    }
}

fn instance() -> wgpu::Instance {
    // WGPU_BACKEND (e.g. `vulkan`, `metal`) narrows the APIs searched.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    wgpu::Instance::new(desc)
}

fn summary(a: &wgpu::Adapter) -> AdapterSummary {
    let i = a.get_info();
    AdapterSummary {
        name: i.name.clone(),
        api: format!("{:?}", i.backend),
        device_type: device_type(i.device_type),
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
    }
}

/// Every adapter wgpu finds on this machine.
pub fn list_adapters() -> Vec<AdapterSummary> {
    pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(summary)
        .collect()
}

/// Preference among adapters: real GPUs first, then software ones; native
/// APIs over GL.
fn rank(a: &wgpu::Adapter) -> (u32, u32) {
    let i = a.get_info();
    let t = match i.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    };
    let api = match i.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (t, api)
}

/// Whether streamed experts' slot stacks are mappable (`WgpuOptions::mapped_slots`).
/// Only where the device reads host-visible memory at full speed: on a
/// discrete GPU such a buffer lives in host memory read across the bus by
/// every MoE launch, so there a miss takes the staging path. Not under the
/// WebGPU profile: WebGPU has no mappable storage buffers, and the profile
/// stands for what a browser runs. The Apple7 profile keeps the adapter's
/// rule: Apple GPUs share the host's memory and Metal offers the feature.
fn mapped_slots(
    opts: &WgpuOptions,
    ainfo: &wgpu::AdapterInfo,
    afeat: wgpu::Features,
    profile: LimitsProfile,
) -> Result<bool> {
    let has = afeat.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
    let webgpu = profile == LimitsProfile::WebGpu;
    Ok(
        match switch_or_env(opts.mapped_slots, "TURBOSPARK_MAPPED_SLOTS")? {
            Some(false) => false,
            Some(true) if has && !webgpu => true,
            Some(true) => {
                return Err(Error::Unsupported {
                    backend: "wgpu".into(),
                    op: "mapped expert slots".into(),
                    reason: if webgpu {
                        "the WebGPU limits profile has no mappable storage buffers".into()
                    } else {
                        format!("{} offers no mappable storage buffers", ainfo.name)
                    },
                })
            }
            None => {
                has && !webgpu
                    && matches!(
                        ainfo.device_type,
                        wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu
                    )
            }
        },
    )
}

pub(crate) struct Opened {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: BackendInfo,
    pub features: WgpuFeatures,
    pub limits: wgpu::Limits,
}

pub(crate) fn open(opts: &WgpuOptions) -> Result<Opened> {
    let inst = instance();
    let adapters = pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()));
    let wanted = option_or_env(&opts.adapter, "TURBOSPARK_ADAPTER");
    let mut candidates: Vec<&wgpu::Adapter> = adapters
        .iter()
        .filter(|a| {
            a.get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
        })
        .filter(|a| match &wanted {
            Some(w) => a.get_info().name.to_lowercase().contains(&w.to_lowercase()),
            None => true,
        })
        .collect();
    candidates.sort_by_key(|a| rank(a));
    let adapter = match candidates.first() {
        Some(a) => *a,
        None => {
            let seen: Vec<String> = adapters
                .iter()
                .map(|a| format!("{} ({:?})", a.get_info().name, a.get_info().backend))
                .collect();
            return Err(Error::NoAdapter(match wanted {
                Some(w) => format!("no compute-capable adapter matches {w:?}; found: [{}]", seen.join(", ")),
                None if seen.is_empty() => "wgpu found no adapter (on Linux without a GPU install Mesa's lavapipe: apt-get install mesa-vulkan-drivers libvulkan1)".into(),
                None => format!("no compute-capable adapter among [{}]", seen.join(", ")),
            }));
        }
    };
    let ainfo = adapter.get_info();
    let afeat = adapter.features();
    // Ask for what helps and the adapter has; kernels never require it.
    // (0 or 1 like the other switches; anything else is an error)
    let no_subgroups =
        opts.no_subgroups || switch_or_env(None, "TURBOSPARK_NO_SUBGROUPS")? == Some(true);
    let mut wanted_features =
        wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SHADER_F16;
    // kernels/reduce_subgroup.wgsl keeps up to two partials per subgroup of
    // 1024 threads in half of its 1024 slots: subgroups of at least 4.
    if no_subgroups || ainfo.subgroup_min_size < 4 {
        wanted_features.remove(wgpu::Features::SUBGROUP);
    }
    let coop = coop_configs(adapter, afeat);
    let tensor_cores = switch_or_env(opts.tensor_cores, "TURBOSPARK_TENSOR_CORES")?;
    // The kernel takes each 32 consecutive invocations for one subgroup
    // (a warp's fragments): only where subgroups are exactly 32 wide.
    let coop_gemm = tensor_cores != Some(false)
        && afeat.contains(wgpu::Features::SHADER_F16)
        && coop.iter().any(|c| c == COOP_GEMM_CONFIG)
        && ainfo.subgroup_min_size == 32
        && ainfo.subgroup_max_size == 32;
    // Expert stacks in tile order: as asked, else where the tensor-core GEMM
    // runs (measured there: on the H200 prefill 6665 -> 7314 tok/s, decode
    // 264 -> 268; other devices have no figure yet).
    let expert_tiles =
        switch_or_env(opts.expert_tiles, "TURBOSPARK_EXPERT_TILES")?.unwrap_or(coop_gemm);
    let affine_split = coop_gemm && switch_or_env(None, "TURBOSPARK_AFFINE_SPLIT")? == Some(true);
    if tensor_cores == Some(true) && !coop_gemm {
        return Err(Error::Unsupported {
            backend: "wgpu".into(),
            op: "tensor cores".into(),
            reason: format!(
                "{} offers no {COOP_GEMM_CONFIG} cooperative matrices with 32-wide \
                 subgroups (it has: [{}], subgroups {}..{})",
                ainfo.name,
                coop.join(", "),
                ainfo.subgroup_min_size,
                ainfo.subgroup_max_size
            ),
        });
    }
    if coop_gemm {
        wanted_features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    // (MoltenVK is Vulkan over Metal: Metal's rule)
    let tails = switch_or_env(opts.tails, "TURBOSPARK_TAILS")?
        .unwrap_or(ainfo.backend == wgpu::Backend::Vulkan && !ainfo.driver.contains("MoltenVK"));
    if tails {
        wanted_features |= wgpu::Features::MEMORY_DECORATION_COHERENT;
    }
    let profile = LimitsProfile::or_env(opts.limits)?;
    let mapped_slots = mapped_slots(opts, &ainfo, afeat, profile)?;
    // Host stores of streamed experts (host_experts.rs) are such buffers
    // too, mapped for reading so that wgpu places them in host memory: asked
    // for wherever the adapter offers them outside the WebGPU profile.
    let mappable = afeat.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
        && profile != LimitsProfile::WebGpu;
    if mapped_slots || mappable {
        wanted_features |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
    }
    let required_features = afeat & wanted_features;
    let limits = profile.request(&adapter.limits());
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("turbospark"),
        required_features,
        required_limits: limits.clone(),
        // SAFETY: the one experimental feature asked for is cooperative
        // matrices, used only by kernels/gemm_coop.wgsl, whose results the
        // parity suite checks on every device that has them.
        experimental_features: if coop_gemm {
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        ..Default::default()
    }))
    .map_err(|e| Error::Gpu(format!("request_device on {}: {e}", ainfo.name)))?;
    let features = WgpuFeatures {
        shader_f16: required_features.contains(wgpu::Features::SHADER_F16),
        subgroups: required_features.contains(wgpu::Features::SUBGROUP),
        subgroup_min_size: ainfo.subgroup_min_size,
        subgroup_max_size: ainfo.subgroup_max_size,
        timestamps: required_features.contains(wgpu::Features::TIMESTAMP_QUERY),
        cooperative_matrix: coop,
        tensor_core_gemm: coop_gemm,
        expert_tiles,
        affine_split,
        coherent_storage: required_features.contains(wgpu::Features::MEMORY_DECORATION_COHERENT),
        mapped_slots,
        host_store: !mapped_slots
            && required_features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
    };
    let info = BackendInfo {
        backend: "wgpu".into(),
        device_name: ainfo.name.clone(),
        api: format!("{:?}", ainfo.backend),
        device_type: device_type(ainfo.device_type),
        driver: format!("{} {}", ainfo.driver, ainfo.driver_info)
            .trim()
            .to_string(),
        capabilities: features.capabilities(),
        limits: Limits {
            max_binding_bytes: limits.max_storage_buffer_binding_size,
            max_buffer_bytes: limits.max_buffer_size,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
        },
    };
    Ok(Opened {
        device,
        queue,
        info,
        features,
        limits,
    })
}
