// attention kernels: see the family's launcher in backends/wgpu/src/ops/.
