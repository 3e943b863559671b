use bytemuck::{Pod, Zeroable};
use turbospark::ops::{Embed, SlotLookup};
use turbospark::{DType, Result};

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::WgpuBuffer;

/// Parameter block shared by the elementwise, embed and argmax kernels.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    rows: u32,
    s: f32,
    /// embed: the vocabulary size; gelu_mul: the row length; argmax: chunks
    /// per row; else unused.
    count: u32,
}

fn flat(
    gpu: &Gpu,
    entry: &'static str,
    a: &WgpuBuffer,
    b: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Params,
) -> Result<()> {
    gpu.launch(Launch {
        kernel: "elementwise",
        entry,
        constants: &[],
        params: bytemuck::bytes_of(&p),
        buffers: &[(one(a), true), (one(b), true), (one(out), false)],
        groups: gpu.grid(p.n.div_ceil(256)),
    })
}

pub(crate) fn add(
    gpu: &Gpu,
    a: &WgpuBuffer,
    b: &WgpuBuffer,
    out: &WgpuBuffer,
    n: usize,
) -> Result<()> {
    flat(
        gpu,
        "add",
        a,
        b,
        out,
        Params {
            n: n as u32,
            rows: 1,
            s: 0.0,
            count: 0,
        },
    )
}

pub(crate) fn scale(gpu: &Gpu, x: &WgpuBuffer, out: &WgpuBuffer, n: usize, s: f32) -> Result<()> {
    flat(
        gpu,
        "scale",
        x,
        x,
        out,
        Params {
            n: n as u32,
            rows: 1,
            s,
            count: 0,
        },
    )
}

pub(crate) fn gelu_mul(
    gpu: &Gpu,
    x: &WgpuBuffer,
    out: &WgpuBuffer,
    rows: usize,
    n: usize,
) -> Result<()> {
    flat(
        gpu,
        "gelu_mul",
        x,
        x,
        out,
        Params {
            n: (rows * n) as u32,
            rows: rows as u32,
            s: 0.0,
            count: n as u32,
        },
    )
}

pub(crate) fn softcap(
    gpu: &Gpu,
    x: &WgpuBuffer,
    out: &WgpuBuffer,
    n: usize,
    cap: f32,
) -> Result<()> {
    flat(
        gpu,
        "softcap",
        x,
        x,
        out,
        Params {
            n: n as u32,
            rows: 1,
            s: cap,
            count: 0,
        },
    )
}

pub(crate) fn embed(
    gpu: &Gpu,
    ids: &WgpuBuffer,
    table: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Embed,
) -> Result<()> {
    let t = table.single().ok_or_else(|| {
        turbospark::Error::shape(
            "embed",
            "embedding table is split across bindings; the gather reads one binding",
        )
    })?;
    let params = Params {
        n: p.hidden as u32,
        rows: p.m as u32,
        s: p.scale,
        count: p.vocab as u32,
    };
    gpu.launch(Launch {
        kernel: "embed",
        entry: "embed",
        constants: &super::weight_constants(table.dtype),
        params: bytemuck::bytes_of(&params),
        buffers: &[(one(ids), true), (t, true), (one(out), false)],
        groups: gpu.grid(p.m as u32),
    })
}

/// kernels/slots.wgsl's parameter block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SlotParams {
    n: u32,
    experts: u32,
    slots: u32,
    at: u32,
}

pub(crate) fn slot_lookup(
    gpu: &Gpu,
    ids: &WgpuBuffer,
    table: &WgpuBuffer,
    slot_ids: &WgpuBuffer,
    log: &WgpuBuffer,
    p: SlotLookup,
) -> Result<()> {
    let params = SlotParams {
        n: p.n as u32,
        experts: p.experts as u32,
        slots: p.slots as u32,
        at: p.at as u32,
    };
    gpu.launch(Launch {
        kernel: "slots",
        entry: "slot_lookup",
        constants: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(ids), true),
            (one(table), true),
            (one(slot_ids), false),
            (one(log), false),
        ],
        groups: gpu.grid((p.n as u32).div_ceil(64)),
    })
}

/// Elements per workgroup of `argmax_partial` to aim for, and most chunks
/// per row (`argmax_final` reduces them with one workgroup).
const ARGMAX_CHUNK: usize = 2048;
const ARGMAX_MAX_CHUNKS: usize = 256;

/// Two dispatches (kernels/argmax.wgsl): chunks of each row reduced by many
/// workgroups, then one workgroup per row over the chunks' winners.
pub(crate) fn argmax(
    gpu: &Gpu,
    x: &WgpuBuffer,
    out: &WgpuBuffer,
    rows: usize,
    n: usize,
) -> Result<()> {
    let chunks = n.div_ceil(ARGMAX_CHUNK).clamp(1, ARGMAX_MAX_CHUNKS);
    let part = super::scratch_buffer(
        gpu,
        |s| &mut s.argmax,
        DType::U32,
        rows * chunks * 2,
        ARGMAX_MAX_CHUNKS * 2,
        "argmax partials",
    )?;
    let params = Params {
        n: n as u32,
        rows: rows as u32,
        s: 0.0,
        count: chunks as u32,
    };
    gpu.launch(Launch {
        kernel: "argmax",
        entry: "argmax_partial",
        constants: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[(one(x), true), (one(&part), false)],
        groups: gpu.grid((rows * chunks) as u32),
    })?;
    gpu.launch(Launch {
        kernel: "argmax",
        entry: "argmax_final",
        constants: &[],
        params: bytemuck::bytes_of(&params),
        buffers: &[(one(&part), true), (one(out), false)],
        groups: gpu.grid(rows as u32),
    })
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use crate::ops::layout::{check, fields};

    /// The parameter blocks as the kernels read them (ops::layout).
    #[test]
    fn params_match_wgsl() {
        check(
            ("elementwise", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; n, rows, s, count),
            &[],
        );
        check(
            ("embed", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; n, rows, s, count),
            &[("count", "vocab")],
        );
        check(
            ("argmax", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; n, rows, s, count),
            &[("count", "chunks")],
        );
        check(
            ("slots", "Params"),
            std::mem::size_of::<SlotParams>(),
            fields!(SlotParams; n, experts, slots, at),
            &[],
        );
    }
}
