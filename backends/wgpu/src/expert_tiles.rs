//! Expert stacks in tile order: the layout kernels/common.wgsl's
//! `expert_row` reads (docs/decisions.md).
//!
//! Each expert's matrix is cut into blocks of 64 rows and each block into
//! chunks of 16 of k; a chunk holds its 64 rows' 32 bytes (16 weights) one
//! after another, so the prefill GEMM's tile, which reads 16 or 32 of k of
//! 64 rows a step, reads whole runs of memory instead of 64 runs 32 bytes
//! long (on the H200: 2368 -> 4460 GB/s for that read pattern alone, the
//! MoE GEMMs 17% / 11% faster at 512 tokens). A gate_up block holds 16
//! gate rows, then the up rows of the same 16 features, twice: the order
//! the GEMMs' tiles pair them in.

use turbospark::{DType, ExpertStack};

/// Bytes of one 16-byte unit (8 weights of 16 bits): the kernels' vec4.
const UNIT: usize = 16;

/// Whether a stack of `rows x cols` (all experts) can be stored in tile
/// order: 16-bit weights, each expert a whole number of 64-row blocks, k a
/// whole number of 16-wide chunks.
pub(crate) fn fits(dtype: DType, stack: ExpertStack, rows: usize, cols: usize) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
        && stack.experts > 0
        && rows > 0
        && cols > 0
        && rows.is_multiple_of(stack.experts)
        && (rows / stack.experts).is_multiple_of(64)
        && cols.is_multiple_of(16)
}

/// The row of an expert's row-major matrix that tile row `jl` of block `b`
/// holds (gate_up with `rows / 2` features: 16 gate rows, their 16 up rows,
/// twice).
fn source_row(b: usize, jl: usize, gate_up: bool, rows: usize) -> usize {
    if !gate_up {
        return 64 * b + jl;
    }
    let f = 32 * b + 16 * (jl / 32) + jl % 16;
    if jl % 32 >= 16 {
        rows / 2 + f
    } else {
        f
    }
}

/// `bytes` (a row-major stack that [`fits`]) in tile order, the experts
/// spread over the host's threads (a full-size Gemma 4 layer is 1.5 GB).
pub(crate) fn tile_order(bytes: &[u8], stack: ExpertStack, rows: usize, cols: usize) -> Vec<u8> {
    let per = rows / stack.experts;
    let expert_bytes = per * cols * 2;
    let mut out = vec![0u8; bytes.len()];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let experts_each = stack.experts.div_ceil(threads);
    std::thread::scope(|s| {
        for (src, dst) in bytes
            .chunks(experts_each * expert_bytes)
            .zip(out.chunks_mut(experts_each * expert_bytes))
        {
            s.spawn(move || {
                for (e, t) in src
                    .chunks_exact(expert_bytes)
                    .zip(dst.chunks_exact_mut(expert_bytes))
                {
                    tile_expert(e, t, stack.gate_up, (per, cols));
                }
            });
        }
    });
    out
}

/// One expert's row-major `src` into `dst` in tile order.
fn tile_expert(src: &[u8], dst: &mut [u8], gate_up: bool, (rows, cols): (usize, usize)) {
    let row_bytes = cols * 2;
    let mut out = dst.chunks_exact_mut(2 * UNIT);
    for b in 0..rows / 64 {
        for c in 0..cols / 16 {
            for jl in 0..64 {
                let at = source_row(b, jl, gate_up, rows) * row_bytes + c * 2 * UNIT;
                out.next()
                    .expect("dst is as long as src")
                    .copy_from_slice(&src[at..at + 2 * UNIT]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// common.wgsl's expert_row and expert_step, as arithmetic on units.
    fn kernel_unit(r: usize, q: usize, kq: usize, gate_up: bool, n: usize) -> usize {
        let (mut b, mut jl) = (r / 64, r % 64);
        if gate_up {
            let up = r >= n;
            let f = if up { r - n } else { r };
            b = f / 32;
            jl = 32 * ((f % 32) / 16) + f % 16 + if up { 16 } else { 0 };
        }
        (b * (kq / 2) * 64 + jl) * 2 + (q / 2) * 128 + q % 2
    }

    /// Every unit lands where the kernels' index looks for it, for both
    /// kinds of matrix, and nothing is lost or repeated.
    #[test]
    fn tile_order_is_where_the_kernels_read() {
        for gate_up in [false, true] {
            let (experts, per, cols) = (3, 128, 48);
            let stack = ExpertStack { experts, gate_up };
            let rows = experts * per;
            // Each unit's bytes name its (row, unit) position.
            let units = cols / 8;
            let mut bytes = Vec::with_capacity(rows * cols * 2);
            for r in 0..rows {
                for q in 0..units {
                    let tag = ((r * units + q) as u64).to_le_bytes();
                    bytes.extend_from_slice(&tag);
                    bytes.extend_from_slice(&tag);
                }
            }
            assert!(fits(DType::BF16, stack, rows, cols));
            let t = tile_order(&bytes, stack, rows, cols);
            assert_eq!(t.len(), bytes.len());
            for e in 0..experts {
                for r in 0..per {
                    for q in 0..units {
                        let at = e * per * units + kernel_unit(r, q, units, gate_up, per / 2);
                        let want = (((e * per + r) * units + q) as u64).to_le_bytes();
                        assert_eq!(
                            &t[at * UNIT..at * UNIT + 8],
                            &want,
                            "gate_up {gate_up}: expert {e} row {r} unit {q}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn only_whole_blocks_and_chunks_fit() {
        let s = |experts| ExpertStack {
            experts,
            gate_up: true,
        };
        assert!(fits(DType::F16, s(2), 256, 32));
        assert!(!fits(DType::F32, s(2), 256, 32));
        assert!(!fits(DType::BF16, s(2), 2 * 96, 32));
        assert!(!fits(DType::BF16, s(2), 256, 40));
        assert!(!fits(DType::BF16, s(3), 256, 32));
        assert!(!fits(DType::BF16, s(0), 256, 32));
        // (empty: upload_weight's shape error, not a tiling of nothing)
        assert!(!fits(DType::BF16, s(2), 0, 32));
        assert!(!fits(DType::BF16, s(2), 256, 0));
    }
}
