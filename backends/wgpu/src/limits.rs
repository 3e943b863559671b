//! Limits profiles: the device is asked for the smaller of the adapter's
//! limits and a profile's, so a run on a large GPU (or lavapipe) can hold the
//! kernels to what a smaller target allows: Apple7-class Metal GPUs, or any
//! WebGPU device.

use turbospark::{Error, Result};

/// Which limits the backend asks the device for (`WgpuOptions::limits`,
/// `TURBOSPARK_LIMITS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LimitsProfile {
    /// The adapter's own limits, all of them (the default).
    #[default]
    Adapter,
    /// What wgpu's Metal backend reports on an Apple7-class GPU (M1, A14),
    /// where the adapter's are larger: see `apple7` (limits.rs).
    Apple7,
    /// The WebGPU specification's default limits, which every WebGPU device
    /// offers (16 KiB of workgroup memory, 256 invocations a workgroup, 8
    /// storage buffers a stage, 128 MiB a binding).
    WebGpu,
}

impl LimitsProfile {
    /// `apple7`, `webgpu` or `adapter`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "adapter" => Ok(LimitsProfile::Adapter),
            "apple7" => Ok(LimitsProfile::Apple7),
            "webgpu" => Ok(LimitsProfile::WebGpu),
            _ => Err(Error::InvalidInput(format!(
                "limits profile {s:?}: expected apple7, webgpu or adapter"
            ))),
        }
    }

    /// The option, else `TURBOSPARK_LIMITS` (unset or empty: the adapter's).
    pub fn or_env(opt: Option<LimitsProfile>) -> Result<Self> {
        if let Some(p) = opt {
            return Ok(p);
        }
        match std::env::var("TURBOSPARK_LIMITS").as_deref() {
            Err(_) | Ok("") => Ok(LimitsProfile::Adapter),
            Ok(v) => Self::parse(v).map_err(|_| {
                Error::InvalidInput(format!(
                    "TURBOSPARK_LIMITS={v:?}: expected apple7, webgpu or adapter"
                ))
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LimitsProfile::Adapter => "adapter",
            LimitsProfile::Apple7 => "apple7",
            LimitsProfile::WebGpu => "webgpu",
        }
    }

    /// The limits to request of an adapter that offers `adapter`: each the
    /// worse of the adapter's and the profile's (the smaller maximum, the
    /// larger alignment).
    pub fn request(self, adapter: &wgpu::Limits) -> wgpu::Limits {
        match self {
            LimitsProfile::Adapter => adapter.clone(),
            LimitsProfile::Apple7 => adapter.clone().or_worse_values_from(&apple7()),
            LimitsProfile::WebGpu => adapter
                .clone()
                .or_worse_values_from(&wgpu::Limits::defaults()),
        }
    }
}

/// The compute limits wgpu's Metal backend reports for an Apple7-class GPU
/// (wgpu-hal 30.0.2, src/metal/adapter.rs); the rest are left unlimited
/// here, so the adapter's apply:
/// - workgroup memory 32 KiB and 1024 invocations (each workgroup dimension
///   up to 1024): `max_total_threadgroup_memory` and
///   `max_threads_per_group` for the iOS GPU family 4 / macOS family 1
///   feature sets and later, from Apple's Metal feature set tables
///   ("Maximum total threadgroup memory allocation", "Maximum threads per
///   threadgroup");
/// - 29 storage buffers a stage: Metal's 31 buffer-argument-table entries
///   (`MAX_BUFFERS`) less the 2 wgpu keeps for immediates and buffer sizes
///   (9 under wgpu's strict WebGPU compliance, which the backend does not
///   ask for);
/// - 1 GiB a binding and a buffer: wgpu reports the device's
///   `maxBufferLength` for both (`max_buffer_size`,
///   `max_storage_buffer_binding_size`), which depends on the machine's
///   memory; 1 GiB is the figure wgpu gives macOS where it cannot ask, the
///   least a Mac reports, so a kernel that fits it fits every M1;
/// - 65535 workgroups a dimension (wgpu's figure for Metal).
pub fn apple7() -> wgpu::Limits {
    wgpu::Limits {
        max_compute_workgroup_storage_size: 32 << 10,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroup_size_x: 1024,
        max_compute_workgroup_size_y: 1024,
        max_compute_workgroup_size_z: 1024,
        max_storage_buffers_per_shader_stage: 29,
        max_dynamic_storage_buffers_per_pipeline_layout: 29,
        max_storage_buffer_binding_size: 1 << 30,
        max_buffer_size: 1 << 30,
        max_compute_workgroups_per_dimension: 0xFFFF,
        ..wgpu::Limits::unlimited()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_never_asks_for_more_than_the_adapter_offers() {
        let small = wgpu::Limits {
            max_compute_workgroup_storage_size: 8 << 10,
            ..wgpu::Limits::defaults()
        };
        for p in [
            LimitsProfile::Adapter,
            LimitsProfile::Apple7,
            LimitsProfile::WebGpu,
        ] {
            assert!(p.request(&small).check_limits(&small), "{p:?}");
        }
        let big = wgpu::Limits {
            max_compute_workgroup_storage_size: 48 << 10,
            max_compute_invocations_per_workgroup: 1024,
            max_storage_buffers_per_shader_stage: 64,
            max_storage_buffer_binding_size: 2 << 30,
            max_buffer_size: 4 << 30,
            ..wgpu::Limits::defaults()
        };
        let a = LimitsProfile::Apple7.request(&big);
        assert_eq!(a.max_compute_workgroup_storage_size, 32 << 10);
        assert_eq!(a.max_storage_buffers_per_shader_stage, 29);
        assert_eq!(a.max_storage_buffer_binding_size, 1 << 30);
        assert_eq!(a.max_compute_invocations_per_workgroup, 1024);
        let w = LimitsProfile::WebGpu.request(&big);
        assert_eq!(w.max_compute_workgroup_storage_size, 16 << 10);
        assert_eq!(w.max_compute_invocations_per_workgroup, 256);
        assert_eq!(w.max_storage_buffers_per_shader_stage, 8);
        assert_eq!(w.max_storage_buffer_binding_size, 128 << 20);
        assert_eq!(LimitsProfile::Adapter.request(&big), big);
    }

    #[test]
    fn profile_names_parse_and_others_are_errors() {
        assert_eq!(
            LimitsProfile::parse("Apple7").ok(),
            Some(LimitsProfile::Apple7)
        );
        assert_eq!(
            LimitsProfile::parse("webgpu").ok(),
            Some(LimitsProfile::WebGpu)
        );
        assert_eq!(
            LimitsProfile::parse("adapter").ok(),
            Some(LimitsProfile::Adapter)
        );
        let e = LimitsProfile::parse("apple9").unwrap_err().to_string();
        assert!(e.contains("apple7, webgpu or adapter"), "{e}");
    }
}
