//! Streamed experts the device copies from host memory
//! (`ComputeBackend::host_experts`, `copy_experts`): every expert of a
//! layer's stack copied once, at load, into buffers in host memory that the
//! device reads (`MAP_READ | COPY_SRC`, written through the mapping made at
//! creation; wgpu's `MAPPABLE_PRIMARY_BUFFERS` allows the pair),
//! each expert as `write_experts` lays it into a slot (tile order for a
//! tiled stack; an affine expert's words, scales and biases, each part
//! padded to whole words). A miss is then a device copy a part, on the
//! device's copy engine at the link's speed, and no host copy; the price is
//! host memory for every expert, besides the file's pages.

use std::sync::Arc;

use turbospark::{DType, Error, ExpertBytes, ExpertStack, Result};

use crate::buffer::{HostStore, MemoryUse, WgpuBuffer};
use crate::expert_slots::{on_threads, slot_copies, Piece};
use crate::expert_tiles;
use crate::gpu::Gpu;

const OP: &str = "copy_experts";

/// The store of `experts` (each `expert` = (rows, cols) of `dtype`) for
/// slot stacks like `stack`, tiled where such a stack is (`tiled`).
pub(crate) fn host_experts(
    gpu: &Gpu,
    dtype: DType,
    (stack, tiled): (ExpertStack, bool),
    (rows, cols): (usize, usize),
    experts: &[ExpertBytes<'_>],
    label: &str,
) -> Result<WgpuBuffer> {
    let Some(first) = experts.first() else {
        return Err(Error::shape("host_experts", "no experts".to_string()));
    };
    let lens = [0, 1, 2].map(|i| first.part_len(i));
    if let Some(e) = experts
        .iter()
        .position(|x| [0, 1, 2].map(|i| x.part_len(i)) != lens)
    {
        return Err(Error::shape(
            "host_experts",
            format!("expert {e}'s parts are not expert 0's sizes"),
        ));
    }
    let padded = lens.map(|n| n.div_ceil(4) * 4);
    let part_at = [0, padded[0], padded[0] + padded[1]];
    let expert_bytes: usize = padded.iter().sum();
    let max = gpu.limits.max_buffer_size as usize;
    if expert_bytes > max {
        return Err(Error::DeviceLimit {
            what: format!("one expert of `{label}`"),
            bytes: expert_bytes as u64,
            limit: max as u64,
            limit_name: "max_buffer_size",
        });
    }
    let per_chunk = (max / expert_bytes).min(experts.len());
    let one = ExpertStack {
        experts: 1,
        gate_up: stack.gate_up,
    };
    let mut chunks = Vec::new();
    // (host memory: not the device's count)
    let memory = Arc::new(MemoryUse::default());
    for (ci, group) in experts.chunks(per_chunk).enumerate() {
        let name = format!("{label} (host, experts {}..)", ci * per_chunk);
        let size = (group.len() * expert_bytes) as u64;
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(&name),
            size,
            // Mapped for reading, never read: wgpu's Vulkan allocator puts
            // a buffer the host reads in host-cached system memory, where
            // one it writes would go to device memory the host can reach
            // (a resizable BAR) when there is some, which would hold the
            // very experts streaming keeps off the device. Written through
            // the mapping made at creation.
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::OutOfMemory(format!(
                "host buffer `{name}` of {size} bytes: {e}"
            )));
        }
        {
            let mut view = buffer
                .get_mapped_range_mut(..)
                .map_err(|e| Error::Gpu(format!("host_experts: mapping `{name}`: {e}")))?;
            // (each expert its own piece of the view, for the threads)
            let mut pieces = Vec::with_capacity(group.len());
            let mut rest = view.slice(..);
            for _ in group {
                let (head, tail) = rest.split_at(expert_bytes);
                pieces.push(Piece(head));
                rest = tail;
            }
            on_threads(&mut pieces, group, size as usize, |dst, x| {
                if tiled {
                    let mut src = Vec::new();
                    x.gather(0, &mut src);
                    let t = expert_tiles::tile_order(&src, one, rows, cols);
                    dst.0.slice(..t.len()).copy_from_slice(&t);
                    return;
                }
                // (each part's slices straight from the mapping)
                for (part, &start) in x.parts.iter().zip(&part_at) {
                    let mut at = start;
                    for piece in part {
                        dst.0.slice(at..at + piece.len()).copy_from_slice(piece);
                        at += piece.len();
                    }
                }
            });
        }
        buffer.unmap();
        chunks.push(crate::buffer::Chunk::new(
            buffer,
            (ci * per_chunk, group.len()),
            gpu.binds.reaper(),
            memory.clone(),
        ));
    }
    Ok(WgpuBuffer {
        chunks: Arc::new(chunks),
        dtype,
        len: experts.len() * rows * cols,
        fits_f16: false,
        tiles: None,
        host: Some(HostStore {
            experts: experts.len(),
            expert: (rows, cols),
            gate_up: stack.gate_up,
            tiled,
            expert_bytes,
            part_at,
            per_chunk,
        }),
    })
}

/// Each `(slot, expert)` of `copies` from `store` into its slot of `buf`
/// (a slot stack of `dtype`, `stack`, whole-stack `(rows, cols)`),
/// recorded on the batch as copies.
pub(crate) fn copy_experts(
    gpu: &Gpu,
    store: &WgpuBuffer,
    buf: &WgpuBuffer,
    dtype: DType,
    stack: ExpertStack,
    (rows, cols): (usize, usize),
    copies: &[(usize, usize)],
) -> Result<()> {
    let Some(h) = store.host else {
        return Err(Error::shape(
            OP,
            "the store is not a host_experts store".to_string(),
        ));
    };
    let bad = |detail: String| Err(Error::shape(OP, detail));
    if buf.host.is_some() || buf.dtype != dtype || store.dtype != dtype || buf.len != rows * cols {
        return bad(format!(
            "a {} stack of {} elements from a {} store: not a {dtype} stack of {rows} x {cols}",
            buf.dtype, buf.len, store.dtype
        ));
    }
    if stack.experts == 0 || rows % stack.experts != 0 {
        return bad(format!("{rows} rows are not {} slots", stack.experts));
    }
    let per = rows / stack.experts;
    if h.expert != (per, cols) || h.gate_up != stack.gate_up || h.tiled != buf.tiled() {
        return bad(format!(
            "the store's experts ({:?}, gate_up {}, tiled {}) are not the slots' ({:?}, {}, {})",
            h.expert,
            h.gate_up,
            h.tiled,
            (per, cols),
            stack.gate_up,
            buf.tiled()
        ));
    }
    if buf.tiles.is_some_and(|t| t != stack) {
        return bad(format!(
            "a tile-ordered stack of {:?} is not {stack:?}",
            buf.tiles
        ));
    }
    let mut slots = Vec::with_capacity(copies.len());
    for (i, &(slot, e)) in copies.iter().enumerate() {
        if e >= h.experts || copies[..i].iter().any(|c| c.0 == slot) {
            return bad(format!(
                "copy {i}: expert {e} into slot {slot} (a store of {} experts, each slot once)",
                h.experts
            ));
        }
        slots.push((
            slot,
            stack.part_ranges(dtype, (rows, cols), slot)?[0].clone(),
        ));
    }
    let plan = slot_copies(OP, buf, dtype, (per, cols), &slots)?;
    let mut from = Vec::with_capacity(plan.len());
    for c in &plan {
        let e = copies[c.w].1;
        let at = (e % h.per_chunk) * h.expert_bytes + h.part_at[c.part] + c.lo;
        // (a slot cut across chunks at an odd row of 2-byte scales)
        if !at.is_multiple_of(4) {
            return Err(Error::Unsupported {
                backend: "wgpu".into(),
                op: format!("{OP} ({dtype})"),
                reason: format!(
                    "part {} of expert {e} from byte {at}: copies take whole words",
                    c.part
                ),
            });
        }
        from.push((&store.chunks[e / h.per_chunk].buffer, at as u64));
    }
    let submit = gpu.submit();
    let mut batch = gpu.batch_lock();
    for (c, (src, at)) in plan.iter().zip(from) {
        batch.copy(&submit, (src, c.buffer), (at, c.at, c.len as u64));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{WgpuBackend, WgpuBuffer, WgpuOptions};
    use turbospark::quant::{Affine, ScaleType};
    use turbospark::rng::Rng;
    use turbospark::{ComputeBackend, DType, ExpertBytes, ExpertStack, HostBytes};

    fn device_bytes(be: &WgpuBackend, b: &WgpuBuffer) -> Vec<u8> {
        let t = be.gpu.begin_read(b, "test").unwrap();
        be.gpu.finish_read_bytes(t).unwrap()
    }

    /// A backend whose slots are not mapped, with expert tiles `tiles`:
    /// where the adapter grants mappable buffers, it offers host stores.
    fn unmapped(tiles: bool) -> Option<WgpuBackend> {
        crate::tests::backend_with(&WgpuOptions {
            mapped_slots: Some(false),
            expert_tiles: Some(tiles),
            ..Default::default()
        })
    }

    /// Random experts copied into slots from a host store, in two rounds
    /// (the second overwriting a slot, its slots out of order), land byte
    /// for byte as an upload of the same experts does: float, affine and
    /// tile-ordered stacks; a store of other experts is refused, nothing
    /// recorded; the store's host memory is not the device's count.
    #[test]
    fn copies_from_a_host_store_land_as_an_upload() {
        let q4 = DType::Affine(Affine::new(4, 32, ScaleType::BF16).unwrap());
        let cases = [
            ("f16", DType::F16, false, (6, 40), false),
            ("q4 gate_up", q4, true, (8, 64), false),
            ("f16 tiled gate_up", DType::F16, true, (64, 32), true),
        ];
        let seed = turbospark::parity::seed_from_env();
        for (name, dtype, gate_up, (rows, cols), tiles) in cases {
            let Some(be) = unmapped(tiles) else { return };
            if !be.features().host_store {
                // (lavapipe grants them: CI runs this path)
                let software = be.info().device_type == turbospark::DeviceType::SoftwareGpu;
                let ci = std::env::var("CI").is_ok_and(|v| v == "true");
                assert!(!(ci && software), "CI: lavapipe must offer host stores");
                eprintln!(
                    "skipping: {} grants no mappable buffers",
                    be.info().device_name
                );
                return;
            }
            let what = format!("{name} (seed {seed})");
            let (experts, slots) = (6, 4);
            let one = ExpertStack {
                experts: 1,
                gate_up,
            };
            let mut rng = Rng::new(seed);
            let bytes: Vec<[Vec<u8>; 3]> = (0..experts)
                .map(|_| {
                    let r = one.part_ranges(dtype, (rows, cols), 0).unwrap();
                    r.map(|r| (0..r.len()).map(|_| rng.below(256) as u8).collect())
                })
                .collect();
            let views: Vec<ExpertBytes<'_>> = bytes
                .iter()
                .map(|p| ExpertBytes {
                    parts: [vec![&p[0][..]], vec![&p[1][..]], vec![&p[2][..]]],
                })
                .collect();
            let stack = ExpertStack {
                experts: slots,
                gate_up,
            };
            let shape = (slots * rows, cols);
            let held = be.memory().0;
            let store = be
                .host_experts(dtype, stack, (rows, cols), &views, "store")
                .unwrap()
                .expect("a host store");
            assert_eq!(
                be.memory().0,
                held,
                "{what}: the store counted as device memory"
            );
            let buf = be.alloc_experts(dtype, stack, shape, "slots").unwrap();
            assert_eq!(buf.tiles.is_some(), tiles, "{what}");
            let mut host = vec![0u8; dtype.bytes_for(shape.0 * shape.1)];
            for round in [&[(0usize, 5usize), (2, 1)][..], &[(3, 0), (2, 4), (1, 2)]] {
                be.copy_experts(&store, &buf, dtype, stack, shape, round)
                    .unwrap();
                for &(slot, e) in round {
                    let r = stack.part_ranges(dtype, shape, slot).unwrap();
                    for (r, p) in r.into_iter().zip(&bytes[e]) {
                        host[r].copy_from_slice(p);
                    }
                }
                let want = be
                    .upload_experts(dtype, stack, shape, HostBytes::Slice(&host), "want")
                    .unwrap();
                assert!(
                    device_bytes(&be, &buf) == device_bytes(&be, &want),
                    "{what}: round {round:?}"
                );
            }
            // A store of experts of another shape: refused by name.
            let other = ExpertStack {
                experts: slots,
                gate_up: !gate_up,
            };
            let e = be
                .copy_experts(&store, &buf, dtype, other, shape, &[(0, 0)])
                .unwrap_err()
                .to_string();
            assert!(e.contains("are not the slots'"), "{what}: {e}");
        }
    }
}
