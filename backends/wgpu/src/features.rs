//! What the adapter offers that the backend's kernels use: the wgpu
//! backend's own record ([`WgpuBackend::features`](crate::WgpuBackend::features)),
//! shown to everyone else as [`turbospark::BackendInfo::capabilities`].

/// The features the backend asked of its adapter and what it does with them.
#[derive(Clone, Debug, Default)]
pub struct WgpuFeatures {
    pub shader_f16: bool,
    pub subgroups: bool,
    /// Smallest and largest subgroup size the adapter may use (0 when unknown).
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub timestamps: bool,
    /// The cooperative-matrix shapes the adapter offers through wgpu's
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` (tensor cores), as
    /// `"MxNxK ab->c"` (e.g. `"16x16x16 f16->f32"`); empty when it has none.
    pub cooperative_matrix: Vec<String>,
    /// The prefill GEMMs (matmul and the MoE phases from a backend's
    /// prefill batch size) run on cooperative matrices with x rounded to f16
    /// after a per-row power-of-two scale (11 significant bits, no overflow)
    /// and f32 accumulation: their results differ from f32 arithmetic by
    /// that rounding (see `parity::F16_INPUT_NMSE`).
    pub tensor_core_gemm: bool,
    /// Expert stacks uploaded with `upload_experts` are stored in the
    /// backend's tile order where their shape allows; false: as uploaded.
    pub expert_tiles: bool,
    /// MLX affine weights take the tensor-core GEMM at `Precision::Exact`
    /// too, split in two f16 parts (`WSPLIT`): only when asked
    /// (`TURBOSPARK_AFFINE_SPLIT=1`) until the split has passed the
    /// quantized parity families on a device with tensor cores.
    pub affine_split: bool,
    /// Storage buffers are declared coherent (wgpu's
    /// `MEMORY_DECORATION_COHERENT`: Vulkan, DX12, Metal 3.2; the backend
    /// asks for it on Vulkan unless told otherwise): one workgroup's writes,
    /// published by a storage barrier, are visible to another that has seen
    /// them counted on an atomic. A launch's last workgroup can then finish
    /// work that took a dependent dispatch (a "tail", docs/decisions.md).
    pub coherent_storage: bool,
    /// Streamed experts' slot stacks are storage buffers the host maps
    /// (wgpu's `MAPPABLE_PRIMARY_BUFFERS`, asked for on integrated and
    /// software GPUs, `WgpuOptions::mapped_slots`): a miss is copied from
    /// the checkpoint straight into its slot rather than through staging.
    pub mapped_slots: bool,
    /// Streamed experts may come from a host store (`host_experts.rs`):
    /// where the slots are not mapped and wgpu grants mappable buffers
    /// beyond staging, which a store needs to sit in host memory.
    pub host_store: bool,
}

impl WgpuFeatures {
    /// These features as `BackendInfo::capabilities`' name/value pairs.
    pub fn capabilities(&self) -> Vec<(String, String)> {
        let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
        let coop = if self.cooperative_matrix.is_empty() {
            "none".to_string()
        } else {
            self.cooperative_matrix.join(", ")
        };
        [
            ("shader_f16", yes(self.shader_f16)),
            ("subgroups", yes(self.subgroups)),
            (
                "subgroup_sizes",
                format!("{}..{}", self.subgroup_min_size, self.subgroup_max_size),
            ),
            ("timestamps", yes(self.timestamps)),
            ("cooperative_matrix", coop),
            ("tensor_core_gemm", yes(self.tensor_core_gemm)),
            ("expert_tiles", yes(self.expert_tiles)),
            ("affine_split", yes(self.affine_split)),
            ("coherent_storage", yes(self.coherent_storage)),
            ("mapped_slots", yes(self.mapped_slots)),
            ("host_store", yes(self.host_store)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}
