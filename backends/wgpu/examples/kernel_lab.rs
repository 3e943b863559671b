//! Kernel design lab: times decode-GEMV variants (examples/kernel_lab.wgsl)
//! and the backend's MoE decode kernels side by side at Gemma 4 26B-A4B
//! shapes, with and without wgpu's injected runtime checks, and a row norm
//! before a GEMV as two dependent dispatches against one fused kernel
//! (`normed`: fusing post_ffn into the q|k|v GEMV, measured and not kept,
//! docs/decisions.md). Each figure is a chain of dependent dispatches in one
//! compute pass (as in a decode step), timed by GPU timestamps around the
//! pass, weights rotated over enough copies that they cannot sit in cache.
//! The GEMV variants are checked against an f64 host result on a
//! NaN-poisoned output before they are timed; `moe_tiled` checks the tiled
//! bodies against the row-major ones, `w_pattern` that each layout reads
//! every word once; `moe`'s and `dispatch`'s figures are timing only.
//! `grid_sync` times dependent GEMV steps as a dispatch each against one
//! dispatch of persistent workgroups with a grid-wide barrier between
//! steps (kernel_lab_sync.wgsl), each result checked against the chain's.
//!
//! `cargo run --release -p turbospark-wgpu --example kernel_lab [FILTER]`
//! (FILTER: a substring of `case/variant/checked`; `dispatch`, `grid_sync`,
//! `w_pattern` and `moe_tiled` select those cases), or one of two special
//! modes: `backend` (the backend's own LM head matmul against the lab's
//! pipeline on its buffers) and `slots` (a 23 MB GEMV: the backend's chain
//! against the lab's, one parameter binding or an arena slot per dispatch;
//! on the H200 all read 10.0-10.5 us once warm, which showed the bench's
//! slower figures were its clock warm-up, BENCHMARKS.md). Every figure is
//! taken after WARM seconds of back-to-back passes. `LAB_MOE_SRC=file.wgsl`
//! times another version of kernels/moe_decode.wgsl. `LAB_LANES` (32, 64,
//! 128) sets moe_decode's threads per weight row (its LANES; the backend
//! picks per op, ops/moe.rs); the backend's gemv runs with the constants
//! the backend gives the shape (`gemv_constants`).

use std::time::Instant;

use turbospark_wgpu::kernels;
use wgpu::util::DeviceExt;

const LAB: &str = include_str!("kernel_lab.wgsl");
const MOE_LAB: &str = include_str!("kernel_lab_moe.wgsl");

/// Dispatches per timed pass and timed passes per figure.
const CHAIN: u32 = 100;
const REPS: usize = 5;
/// Seconds of back-to-back passes before each figure (clock warm-up).
const WARM: f64 = 0.15;

struct Lab {
    device: wgpu::Device,
    queue: wgpu::Queue,
    qset: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    period_ns: f64,
    /// The device has subgroup operations (the backend's reduce helpers).
    subgroups: bool,
    /// ... in subgroups of exactly 32: the variants that sum a 32-lane row
    /// with one subgroupAdd need it (lavapipe's are 8 wide).
    lanes32: bool,
    /// The device has coherent storage (`@coherent`): the grid barrier's
    /// readers see other workgroups' writes past their own caches.
    coherent: bool,
}

fn rng(state: &mut u64) -> f32 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn bf16_bits(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

impl Lab {
    fn open() -> Lab {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
        let inst = wgpu::Instance::new(desc);
        let mut adapters = pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()));
        adapters.sort_by_key(|a| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::Cpu => 3,
            _ => 2,
        });
        let adapter = adapters.into_iter().next().expect("no adapter");
        let info = adapter.get_info();
        println!(
            "adapter: {} ({:?}, {} {})",
            info.name, info.backend, info.driver, info.driver_info
        );
        let feats = adapter.features()
            & (wgpu::Features::SUBGROUP
                | wgpu::Features::TIMESTAMP_QUERY
                | wgpu::Features::MEMORY_DECORATION_COHERENT);
        assert!(
            feats.contains(wgpu::Features::TIMESTAMP_QUERY),
            "lab needs timestamps"
        );
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: None,
            required_features: feats,
            required_limits: adapter.limits(),
            ..Default::default()
        }))
        .expect("device");
        let subgroups = feats.contains(wgpu::Features::SUBGROUP);
        Lab {
            lanes32: subgroups && info.subgroup_min_size == 32 && info.subgroup_max_size == 32,
            coherent: feats.contains(wgpu::Features::MEMORY_DECORATION_COHERENT),
            ..Lab::with_device(device, queue, subgroups)
        }
    }

    fn with_device(device: wgpu::Device, queue: wgpu::Queue, subgroups: bool) -> Lab {
        let qset = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: None,
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolve = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let period_ns = queue.get_timestamp_period() as f64;
        Lab {
            subgroups,
            lanes32: false,
            coherent: false,
            device,
            queue,
            qset,
            resolve,
            readback,
            period_ns,
        }
    }

    fn module(&self, src: &str, checked: bool) -> wgpu::ShaderModule {
        let desc = wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(src.into()),
        };
        if checked {
            self.device.create_shader_module(desc)
        } else {
            // SAFETY: lab kernels index only inside their bindings (each is
            // checked against the host result first).
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        }
    }

    /// A pipeline of group 0's uniform and `storage` storage bindings in
    /// group 1, all read-only but the last.
    fn pipeline(
        &self,
        module: &wgpu::ShaderModule,
        entry: &str,
        constants: &[(&str, f64)],
        storage: usize,
    ) -> wgpu::ComputePipeline {
        self.pipeline_rw(module, entry, constants, (storage - 1, storage))
    }

    /// [`Lab::pipeline`] with the first `read_only` of `storage` bindings
    /// read-only and the rest read-write.
    fn pipeline_rw(
        &self,
        module: &wgpu::ShaderModule,
        entry: &str,
        constants: &[(&str, f64)],
        (read_only, storage): (usize, usize),
    ) -> wgpu::ComputePipeline {
        let entry_of = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let g0 = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &[entry_of(0, wgpu::BufferBindingType::Uniform)],
            });
        let e1: Vec<_> = (0..storage)
            .map(|i| {
                entry_of(
                    i as u32,
                    wgpu::BufferBindingType::Storage {
                        read_only: i < read_only,
                    },
                )
            })
            .collect();
        let g1 = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &e1,
            });
        let layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&g0), Some(&g1)],
                immediate_size: 0,
            });
        self.device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&layout),
                module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
    }

    fn storage(&self, bytes: &[u8]) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            })
    }

    fn uniform(&self, words: &[u32]) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::cast_slice(words),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    fn bind(
        &self,
        p: &wgpu::ComputePipeline,
        params: &wgpu::Buffer,
        bufs: &[&wgpu::Buffer],
    ) -> (wgpu::BindGroup, wgpu::BindGroup) {
        let g0 = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &p.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: params.as_entire_binding(),
            }],
        });
        let entries: Vec<wgpu::BindGroupEntry> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let g1 = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &p.get_bind_group_layout(1),
            entries: &entries,
        });
        (g0, g1)
    }

    /// Median microseconds per dispatch over a chain of `CHAIN` dispatches,
    /// `groups[i % len]` bound for dispatch i.
    fn time(
        &self,
        p: &wgpu::ComputePipeline,
        groups: &[(wgpu::BindGroup, wgpu::BindGroup)],
        wgs: u32,
        chain: u32,
    ) -> f64 {
        self.time_stages(&[(p, groups, wgs)], chain)
    }

    /// Median microseconds per link of a chain of `chain` links, each link
    /// the stages' dispatches in order (stage s's `groups[i % len]` bound
    /// for link i): a pair of dependent dispatches against one fused.
    fn time_stages(&self, stages: &[Stage<'_>], chain: u32) -> f64 {
        // Keep the GPU busy for a while first: an H200 that idled (between
        // cases the host builds data) runs at low clocks, and a cold chain
        // reads 2-4x slow. Ten passes per wait, until WARM has passed.
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < WARM {
            let mut enc = self.device.create_command_encoder(&Default::default());
            for _ in 0..10 {
                let mut pass = enc.begin_compute_pass(&Default::default());
                record_chain(&mut pass, stages, chain);
            }
            self.queue.submit([enc.finish()]);
            self.device
                .poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                })
                .unwrap();
        }
        let mut per = Vec::new();
        for _ in 0..REPS {
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &self.qset,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
                });
                record_chain(&mut pass, stages, chain);
            }
            enc.resolve_query_set(&self.qset, 0..2, &self.resolve, 0);
            enc.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, 16);
            self.queue.submit([enc.finish()]);
            let slice = self.readback.slice(..);
            slice.map_async(wgpu::MapMode::Read, |_| {});
            self.device
                .poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                })
                .unwrap();
            let t: Vec<u64> = bytemuck::pod_collect_to_vec(&slice.get_mapped_range().unwrap());
            self.readback.unmap();
            per.push((t[1] - t[0]) as f64 * self.period_ns / 1e3 / chain as f64);
        }
        per.sort_by(|a, b| a.partial_cmp(b).unwrap());
        per[REPS / 2]
    }

    /// The first `n` f32 of `b` set to NaN: a check after a run then fails
    /// on what the kernel did not write.
    fn poison(&self, b: &wgpu::Buffer, n: usize) {
        self.queue
            .write_buffer(b, 0, bytemuck::cast_slice(&vec![f32::NAN; n]));
    }

    /// One run of `p` on `groups[0]` over `out` poisoned first, its first
    /// `want.len()` f32 against `want`: the relative error (infinite where
    /// the kernel left a NaN), then `time`'s chain over every group.
    fn checked(
        &self,
        p: &wgpu::ComputePipeline,
        groups: &[(wgpu::BindGroup, wgpu::BindGroup)],
        wgs: u32,
        (out, want): (&wgpu::Buffer, &[f64]),
    ) -> (f64, f64) {
        self.poison(out, want.len());
        self.time(p, &groups[..1], wgs, 1);
        let err = rel_err(&self.read_f32(out, want.len()), want);
        (err, self.time(p, groups, wgs, CHAIN))
    }

    fn read_f32(&self, b: &wgpu::Buffer, n: usize) -> Vec<f32> {
        let st = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (n * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(b, 0, &st, 0, (n * 4) as u64);
        self.queue.submit([enc.finish()]);
        st.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .unwrap();
        let v = bytemuck::pod_collect_to_vec(&st.slice(..).get_mapped_range().unwrap());
        v
    }
}

/// A pipeline, its bind groups (in rotation) and its workgroup count.
type Stage<'a> = (
    &'a wgpu::ComputePipeline,
    &'a [(wgpu::BindGroup, wgpu::BindGroup)],
    u32,
);

/// `chain` links in `pass`, each the stages' dispatches in order, the bind
/// groups in rotation.
fn record_chain(pass: &mut wgpu::ComputePass<'_>, stages: &[Stage<'_>], chain: u32) {
    for i in 0..chain as usize {
        for &(p, groups, wgs) in stages {
            let (g0, g1) = &groups[i % groups.len()];
            pass.set_pipeline(p);
            pass.set_bind_group(0, g0, &[]);
            pass.set_bind_group(1, g1, &[]);
            pass.dispatch_workgroups(wgs, 1, 1);
        }
    }
}

/// kernels/gemv.wgsl as the backend compiles it.
fn gemv_source(lab: &Lab) -> String {
    kernels::source("gemv", lab.subgroups, false).expect("gemv")
}

/// Max |got - want| / max |want|.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    // (f64::max drops a NaN: an unwritten or NaN output is infinitely wrong)
    if got.iter().any(|g| !g.is_finite()) {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max)
        / scale
}

/// Copies of a `bytes`-sized weight so the rotation spans >= 512 MB.
fn copies(bytes: usize) -> usize {
    (512usize << 20).div_ceil(bytes).clamp(1, 64)
}

/// `n` random bf16 weights (|w| < 0.05), as stored.
fn bf16_weights(s: &mut u64, n: usize) -> Vec<u16> {
    (0..n).map(|_| bf16_bits(rng(s) * 0.05)).collect()
}

/// `W . x` in f64 for the bf16 rows of `x.len()` in `wq`: a lab GEMV's
/// reference.
fn gemv_f64(wq: &[u16], x: &[f64]) -> Vec<f64> {
    wq.chunks(x.len())
        .map(|row| {
            row.iter()
                .zip(x)
                .map(|(w, x)| half::bf16::from_bits(*w).to_f64() * x)
                .sum()
        })
        .collect()
}

/// `wq` on the device [`copies`] times, for a rotation past the caches.
fn weight_copies(lab: &Lab, wq: &[u16]) -> Vec<wgpu::Buffer> {
    (0..copies(wq.len() * 2))
        .map(|_| lab.storage(bytemuck::cast_slice(wq)))
        .collect()
}

/// The lab's own GEMV variants (kernel_lab.wgsl entries): (entry, rows per
/// 256-thread workgroup, needs 32-wide subgroups).
const GEMV_VARIANTS: &[(&str, u32, bool)] = &[
    ("empty", 8, false),
    ("base", 8, false),
    ("u4", 8, false),
    ("kc", 8, true),
];

fn gemv_case(lab: &Lab, name: &str, rows: usize, k: usize, filter: &str) {
    // (no label of this case selected: skip building its weights)
    let selected = ["checked", "unchecked"].iter().any(|tag| {
        std::iter::once("real")
            .chain(GEMV_VARIANTS.iter().map(|v| v.0))
            .any(|e| format!("{name}/{e}/{tag}").contains(filter))
    });
    if !selected {
        return;
    }
    let blocks = k / 8;
    let mut s = 0x9e3779b97f4a7c15u64 ^ rows as u64;
    let x: Vec<f32> = (0..k).map(|_| rng(&mut s)).collect();
    let wq = bf16_weights(&mut s, rows * k);
    let want = gemv_f64(&wq, &x.iter().map(|v| *v as f64).collect::<Vec<_>>());
    let ws = weight_copies(lab, &wq);
    let n = ws.len();
    let xb = lab.storage(bytemuck::cast_slice(&x));
    let out = lab.storage(&vec![0u8; rows * 4 + 64]);
    // gemv.wgsl's Params: n, k, rows, row0.
    let params = lab.uniform(&[rows as u32, k as u32, rows as u32, 0]);
    let gb = rows as f64 * k as f64 * 2.0 / 1e9;
    println!(
        "\n{name}: {rows} x {k} bf16, {:.1} MB, {n} weight copies",
        gb * 1e3
    );
    let src = format!("{}\n{LAB}", gemv_source(lab));
    for checked in [true, false] {
        // The backend's own kernels/gemv.wgsl with the backend's constants
        // for this shape (lanes, and the compiled-in trip count of short
        // weights), bound as the lab binds.
        let tag = if checked { "checked" } else { "unchecked" };
        if format!("{name}/real/{tag}").contains(filter) && rows / 8 <= 65535 {
            let m = lab.module(&gemv_source(lab), checked);
            let [rl, gbk] = turbospark_wgpu::gemv_constants(rows, k);
            let lanes = rl.1 as u32;
            let consts = [("WDTYPE", 2.0), (rl.0, rl.1 as f64), (gbk.0, gbk.1 as f64)];
            let p = lab.pipeline(&m, "gemv", &consts, 3);
            let rp = lab.uniform(&[k as u32, k as u32, rows as u32, 0]);
            let groups: Vec<_> = ws
                .iter()
                .map(|w| lab.bind(&p, &rp, &[w, &xb, &out]))
                .collect();
            let wgs = rows.div_ceil(256 / lanes as usize) as u32;
            let (err, us) = lab.checked(&p, &groups, wgs, (&out, &want));
            println!(
                "  real gemv {tag:9} chain {us:8.2} us  {:7.0} GB/s  err {err:.1e}",
                gb / us * 1e6
            );
        }
        let module = lab.module(&src, checked);
        for &(entry, rpw, needs_sg) in GEMV_VARIANTS {
            let label = format!("{name}/{entry}/{tag}");
            if !label.contains(filter) || (needs_sg && !lab.lanes32) {
                continue;
            }
            let p = lab.pipeline(&module, entry, &[("WDTYPE", 2.0), ("BK", blocks as f64)], 3);
            let groups: Vec<_> = ws
                .iter()
                .map(|w| lab.bind(&p, &params, &[w, &xb, &out]))
                .collect();
            let wgs = rows.div_ceil(rpw as usize) as u32;
            if wgs > 65535 {
                continue;
            }
            let t0 = Instant::now();
            let (err, us) = if entry == "empty" {
                (0.0, lab.time(&p, &groups, wgs, CHAIN))
            } else {
                lab.checked(&p, &groups, wgs, (&out, &want))
            };
            let solo = lab.time(&p, &groups, wgs, 1);
            println!(
                "  {entry:8} {tag:9}  chain {us:8.2} us  {:7.0} GB/s  solo pass {solo:8.2} us  err {err:.1e}  ({:.1}s)",
                gb / us * 1e6,
                t0.elapsed().as_secs_f64()
            );
        }
    }
}

/// The MoE GEMM's weight access pattern alone (`w_pattern`, kernel_lab.wgsl):
/// `experts` experts of `rows` x `k` bf16 weights read 32 bytes of each of 64
/// rows a step (as the tensor-core GEMM's GROUPED tile does), 64 and 128
/// bytes a row a step, and the same bytes from a copy laid out step by step
/// (tile-contiguous). Both layouts are checked to read every word of every
/// row block once (the XOR of a block's words).
fn pattern_case(lab: &Lab, (experts, rows, k): (usize, usize, usize), filter: &str) {
    if !"w_pattern".contains(filter) {
        return;
    }
    let kq = k / 8;
    let n = experts * rows;
    assert!(
        n.is_multiple_of(64) && kq.is_multiple_of(8),
        "whole row blocks and steps"
    );
    let blocks = n / 64;
    // Random words (xorshift: 1 GB in well under a second).
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let words: Vec<u32> = (0..n * kq * 4)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u32
        })
        .collect();
    // Each block's XOR of its words, folded to 16 bits as the kernel does.
    let fold = |v: u32| (v ^ (v >> 16)) & 0xffff;
    let want: Vec<u32> = words
        .chunks(64 * kq * 4)
        .map(|b| fold(b.iter().fold(0, |a, w| a ^ w)))
        .collect();
    let row_major = lab.storage(bytemuck::cast_slice(&words));
    let gb = (n * k * 2) as f64 / 1e9;
    println!("\nweight access pattern: {experts} experts x {rows} x {k} bf16, {gb:.2} GB a pass");
    let x = lab.storage(&[0u8; 16]);
    let out = lab.storage(&vec![0u8; blocks * 32 * 4]);
    let params = lab.uniform(&[n as u32, k as u32, n as u32, 0]);
    let module = lab.module(&format!("{}\n{LAB}", gemv_source(lab)), false);
    for (pv, tiled) in [
        (2usize, false),
        (4, false),
        (8, false),
        (2, true),
        (8, true),
    ] {
        let steps = kq / pv;
        let w = if tiled {
            // vec4 (r, s * pv + q) of block b at ((b * steps + s) * 64 + r) * pv + q
            let mut t = vec![0u32; words.len()];
            for b in 0..blocks {
                for r in 0..64 {
                    for c in 0..kq {
                        let (st, q) = (c / pv, c % pv);
                        let src = ((b * 64 + r) * kq + c) * 4;
                        let dst = (((b * steps + st) * 64 + r) * pv + q) * 4;
                        t[dst..dst + 4].copy_from_slice(&words[src..src + 4]);
                    }
                }
            }
            lab.storage(bytemuck::cast_slice(&t))
        } else {
            row_major.clone()
        };
        let consts = [("PV", pv as f64), ("TILED", tiled as u32 as f64)];
        let p = lab.pipeline(&module, "w_pattern", &consts, 3);
        let groups = [lab.bind(&p, &params, &[&w, &x, &out])];
        lab.poison(&out, blocks * 32);
        lab.time(&p, &groups, blocks as u32, 1);
        let got = lab.read_f32(&out, blocks * 32);
        let bad = (0..blocks)
            .filter(|&b| {
                let x = got[b * 32..b * 32 + 32]
                    .iter()
                    .fold(0u32, |a, v| a ^ *v as u32);
                !got[b * 32..b * 32 + 32].iter().all(|v| v.is_finite()) || x != want[b]
            })
            .count();
        let us = lab.time(&p, &groups, blocks as u32, 10);
        println!(
            "  {:13} {:3} B a row a step  {us:9.1} us  {:7.0} GB/s  blocks wrong {bad}",
            if tiled { "tile-ordered" } else { "row-major" },
            pv * 16,
            gb / us * 1e6
        );
        assert_eq!(bad, 0, "w_pattern PV={pv} tiled={tiled}: blocks read wrong");
    }
}

/// The fixed cost of a dependent dispatch: a chain of empty kernels (one
/// workgroup, or as many as a GEMV launches) on one pipeline and bind
/// group, on two bind groups, and alternating two pipelines. A decode step
/// switches pipeline at nearly every dispatch; the lab's other chains
/// repeat one.
fn dispatch_case(lab: &Lab, filter: &str) {
    if !"dispatch".contains(filter) {
        return;
    }
    let module = lab.module(&format!("{}\n{LAB}", gemv_source(lab)), false);
    let a = lab.pipeline(&module, "empty", &[], 3);
    let b = lab.pipeline(&module, "empty_b", &[], 3);
    let params = lab.uniform(&[8, 8, 8, 0]);
    let bufs: Vec<wgpu::Buffer> = (0..4).map(|_| lab.storage(&[0u8; 256])).collect();
    // (every dispatch writes bufs[2], so each waits on the one before)
    let one = |p: &wgpu::ComputePipeline, w: &wgpu::Buffer| {
        vec![lab.bind(p, &params, &[w, &bufs[1], &bufs[2]])]
    };
    let (ga, ga2, gb) = (one(&a, &bufs[0]), one(&a, &bufs[3]), one(&b, &bufs[0]));
    println!("\ndependent dispatches of an empty kernel (us a dispatch)");
    for wgs in [1u32, 1024] {
        let same = lab.time_stages(&[(&a, &ga[..], wgs), (&a, &ga[..], wgs)], CHAIN) / 2.0;
        let groups = lab.time_stages(&[(&a, &ga[..], wgs), (&a, &ga2[..], wgs)], CHAIN) / 2.0;
        let switch = lab.time_stages(&[(&a, &ga[..], wgs), (&b, &gb[..], wgs)], CHAIN) / 2.0;
        println!(
            "  {wgs:5} workgroups: one pipeline {same:6.2}  two bind groups {groups:6.2}  two pipelines {switch:6.2}"
        );
    }
}

/// Dependent steps with a dispatch between them against one dispatch with
/// a grid-wide barrier between them (kernel_lab_sync.wgsl): `steps` square
/// GEMVs of `rows` (bf16), each reading the one before's output, as a
/// chain of dispatches and as persistent grids of each size in `grids`
/// (LAB_GRID, e.g. `132,264,352`: every workgroup must be resident at
/// once, or the barrier never opens), each with the three orders of weight
/// loads around the barrier (kernel_lab_sync.wgsl's `PRE`). Each persistent
/// result is checked bit for bit against the chain's (same code, same
/// order), and the chain's against an f64 host result; `rows = 0` times the
/// barrier alone against an empty dispatch. The decode step's dependent dispatches are its largest
/// fixed cost (docs/decisions.md): this measures what a barrier inside one
/// dispatch would cost instead.
fn grid_sync_case(lab: &Lab, rows: usize, steps: usize, grids: &[u32], filter: &str) {
    if !"grid_sync".contains(filter) {
        return;
    }
    let src = format!(
        "{}\n{}",
        kernels::COMMON,
        include_str!("kernel_lab_sync.wgsl")
    );
    let src = if lab.coherent {
        src.replace(kernels::COHERENT_MARK, "@coherent")
    } else {
        src
    };
    let module = lab.module(&src, true);
    let step = lab.pipeline_rw(&module, "chain_step", &[], (1, 4));
    let n = rows.max(8);
    let mut s = 0x5eed_0003u64 + rows as u64;
    let amp = (3.0 / n as f32).sqrt();
    let wq: Vec<u16> = (0..steps * n * n)
        .map(|_| bf16_bits(rng(&mut s) * amp))
        .collect();
    let x0: Vec<f32> = (0..n).map(|_| rng(&mut s)).collect();
    let w = lab.storage(bytemuck::cast_slice(&wq));
    let mut xb = x0.clone();
    xb.resize((steps + 1) * n, 0.0);
    let x = lab.storage(bytemuck::cast_slice(&xb));
    let sync = lab.storage(&[0u8; 16]);
    let uniform = |step: usize| lab.uniform(&[rows as u32, steps as u32, step as u32, 0]);
    let chain_groups: Vec<_> = (0..steps)
        .map(|i| vec![lab.bind(&step, &uniform(i), &[&w, &x, &sync, &x])])
        .collect();
    let persists = [0.0, 1.0, 2.0].map(|pre| {
        let p = lab.pipeline_rw(&module, "chain_persist", &[("PRE", pre)], (1, 4));
        let g = vec![lab.bind(&p, &uniform(0), &[&w, &x, &sync, &x])];
        (p, g)
    });
    let blocks = (n as u32).div_ceil(8);
    let chain: Vec<Stage<'_>> = chain_groups
        .iter()
        .map(|g| (&step, &g[..], blocks))
        .collect();
    let last = |lab: &Lab| {
        let all = lab.read_f32(&x, (steps + 1) * n);
        all[steps * n..].to_vec()
    };
    // (X[1..] poisoned before each checked run: a step that read an input
    // not yet written reads NaN, or the previous run's values)
    let poison = |lab: &Lab| {
        lab.queue.write_buffer(
            &x,
            (n * 4) as u64,
            bytemuck::cast_slice(&vec![f32::NAN; steps * n]),
        )
    };
    poison(lab);
    lab.time_stages(&chain, 1);
    let want = last(lab);
    let label = if rows == 0 {
        "the barrier alone (no rows)".to_string()
    } else {
        let mut xr: Vec<f64> = x0.iter().map(|v| *v as f64).collect();
        for m in wq.chunks(n * n) {
            xr = gemv_f64(m, &xr);
        }
        let err = rel_err(&want, &xr);
        assert!(
            err < 1e-4,
            "grid_sync: the chain's result is off by {err:e}"
        );
        format!(
            "{steps} GEMVs of {rows} x {rows} bf16 ({:.1} MB each; chain max rel err {err:.1e})",
            (n * n * 2) as f64 / 1e6
        )
    };
    println!(
        "\ndependent steps, {label}: us a step (coherent X: {})",
        lab.coherent
    );
    let per_chain = lab.time_stages(&chain, CHAIN / steps as u32) / steps as f64;
    println!("  a dispatch a step ({blocks} workgroups): {per_chain:7.2}");
    for &g in grids {
        for (pre, (persist, groups)) in persists.iter().enumerate() {
            // (a fresh count for each run: grid_sync's arithmetic holds
            // only while every dispatch on the counter has the same size)
            lab.queue.write_buffer(&sync, 0, &[0u8; 16]);
            poison(lab);
            lab.time(persist, groups, g, 1);
            let got = last(lab);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let per = lab.time(persist, groups, g, CHAIN / steps as u32) / steps as f64;
            let check = match (rows, same) {
                (0, _) => "",
                (_, true) => "  (result bit-identical to the chain's)",
                (_, false) => "  (result DIFFERS from the chain's)",
            };
            let how = [
                "waits, then loads",
                "loads, then waits",
                "loads the next step, then waits",
            ][pre];
            println!("  one dispatch, {g:4} persistent workgroups, {how}: {per:7.2}{check}");
        }
    }
}

/// A row norm before a GEMV (`rows` x `k`, bf16): the norm as its own
/// dispatch and then the backend's gemv, against `gemv_normed` doing both in
/// one (kernel_lab.wgsl). Each is checked against an f64 host result.
fn normed_gemv_case(lab: &Lab, name: &str, rows: usize, k: usize, filter: &str) {
    let label = format!("{name}/normed");
    if !label.contains(filter) || k > 4096 || !k.is_multiple_of(8) {
        return;
    }
    let blocks = k / 8;
    let lanes = 32usize;
    assert!(
        blocks.div_ceil(lanes) <= 16,
        "gemv_normed holds 16 blocks a lane"
    );
    let mut s = 0x5851_f42d_4c95_7f2du64 ^ rows as u64;
    let x: Vec<f32> = (0..k).map(|_| rng(&mut s) * 3.0).collect();
    let nw: Vec<f32> = (0..k).map(|_| 1.0 + 0.5 * rng(&mut s)).collect();
    let wq = bf16_weights(&mut s, rows * k);
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / k as f64;
    let inv = 1.0 / (ms + 1e-6).sqrt();
    let y: Vec<f64> = (0..k).map(|c| x[c] as f64 * inv * nw[c] as f64).collect();
    let want = gemv_f64(&wq, &y);
    let ws = weight_copies(lab, &wq);
    let n = ws.len();
    let xnw: Vec<f32> = x.iter().chain(&nw).copied().collect();
    let xb = lab.storage(bytemuck::cast_slice(&xnw));
    let yb = lab.storage(&vec![0u8; k * 4]);
    let out = lab.storage(&vec![0u8; rows * 4 + 64]);
    let params = lab.uniform(&[rows as u32, k as u32, rows as u32, 0]);
    let gb = rows as f64 * k as f64 * 2.0 / 1e9;
    println!(
        "\n{name} with its input norm: {rows} x {k} bf16, {:.1} MB, {n} weight copies",
        gb * 1e3
    );
    let wgs = rows.div_ceil(256 / lanes) as u32;
    let lab_src = format!("{}\n{LAB}", gemv_source(lab));
    for checked in [true, false] {
        let tag = if checked { "checked" } else { "unchecked" };
        let module = lab.module(&lab_src, checked);
        let consts = [("WDTYPE", 2.0), ("BK", blocks as f64)];
        // Two dispatches: lab_norm (x and its weight -> y), then gemv on y.
        let norm = lab.pipeline(&module, "lab_norm", &consts, 3);
        let norm_groups = [lab.bind(&norm, &params, &[&ws[0], &xb, &yb])];
        let gm = lab.module(&gemv_source(lab), checked);
        // (the backend's gemv with the constants the backend gives the shape)
        let [rl, gbk] = turbospark_wgpu::gemv_constants(rows, k);
        let gemv_consts = [("WDTYPE", 2.0), (rl.0, rl.1 as f64), (gbk.0, gbk.1 as f64)];
        let gemv = lab.pipeline(&gm, "gemv", &gemv_consts, 3);
        let gemv_wgs = rows.div_ceil(256 / rl.1 as usize) as u32;
        let gemv_groups: Vec<_> = ws
            .iter()
            .map(|w| lab.bind(&gemv, &params, &[w, &yb, &out]))
            .collect();
        let two = [
            (&norm, &norm_groups[..], 1),
            (&gemv, &gemv_groups[..], gemv_wgs),
        ];
        lab.poison(&out, rows);
        lab.time_stages(&two, 1);
        let err_two = rel_err(&lab.read_f32(&out, rows), &want);
        let us_two = lab.time_stages(&two, CHAIN);
        // The gemv's share of that chain: its own chain.
        let us_gemv = lab.time(&gemv, &gemv_groups, gemv_wgs, CHAIN);
        // One dispatch (a bind group a weight copy, x and its norm weight
        // read from xb).
        let bind_copies = |p: &wgpu::ComputePipeline| -> Vec<_> {
            ws.iter()
                .map(|w| lab.bind(p, &params, &[w, &xb, &out]))
                .collect()
        };
        let run = |p: &wgpu::ComputePipeline, groups: &[_], grid: u32| {
            lab.checked(p, groups, grid, (&out, &want))
        };
        let fused = lab.pipeline(&module, "gemv_normed", &consts, 3);
        let (err_one, us_one) = run(&fused, &bind_copies(&fused), wgs);
        println!(
            "  norm, then gemv {tag:9} chain {us_two:8.2} us  {:7.0} GB/s  err {err_two:.1e}",
            gb / us_two * 1e6
        );
        println!(
            "  gemv alone      {tag:9} chain {us_gemv:8.2} us  {:7.0} GB/s",
            gb / us_gemv * 1e6
        );
        println!(
            "  gemv_normed     {tag:9} chain {us_one:8.2} us  {:7.0} GB/s  err {err_one:.1e}",
            gb / us_one * 1e6
        );
        assert!(
            err_two < 1e-4 && err_one < 1e-4,
            "{name}: {err_two:e} / {err_one:e}"
        );
        // Persistent: fewer workgroups, each norming once (the H200 has
        // 132 SMs: one, two and four workgroups each; a third of the row
        // blocks walks the loop on small shapes too).
        let persist = lab.pipeline(&module, "gemv_normed_persist", &consts, 3);
        let persist_groups = bind_copies(&persist);
        let mut grids: Vec<u32> = [wgs.div_ceil(3), 132, 264, 528]
            .iter()
            .map(|g| (*g).min(wgs))
            .collect();
        grids.dedup();
        for grid in grids {
            let (err, us) = run(&persist, &persist_groups, grid);
            println!(
                "  persistent {grid:4} {tag:9} chain {us:8.2} us  {:7.0} GB/s  err {err:.1e}",
                gb / us * 1e6
            );
            assert!(err < 1e-4, "{name}: persistent {grid}: {err:e}");
        }
    }
}

/// 16 sets of `top_k` distinct random expert ids of `experts` (seeds
/// `seed`, `seed + 1`, ...), one buffer each.
fn random_id_sets(lab: &Lab, seed: u64, top_k: usize, experts: usize) -> Vec<wgpu::Buffer> {
    (0..16u64)
        .map(|i| {
            let mut v: Vec<u32> = Vec::new();
            let mut st = seed + i;
            while v.len() < top_k {
                let e = ((rng(&mut st) + 1.0) * 0.5 * experts as f32) as u32 % experts as u32;
                if !v.contains(&e) {
                    v.push(e);
                }
            }
            lab.storage(bytemuck::cast_slice(&v))
        })
        .collect()
}

/// The backend's MoE decode kernels (kernels/moe_decode.wgsl), top-8 of 128.
fn moe_case(lab: &Lab, filter: &str) {
    // (no label of this case selected: skip building 1.5 GB of weights)
    if !["moe/checked", "moe/unchecked"]
        .iter()
        .any(|l| l.contains(filter))
    {
        return;
    }
    let (hidden, inter, experts, top_k) = (2816usize, 704usize, 128usize, 8usize);
    let mut s = 0x1234_5678_9abcu64;
    let gu = bf16_weights(&mut s, experts * 2 * inter * hidden);
    let dn = bf16_weights(&mut s, experts * hidden * inter);
    let gub = lab.storage(bytemuck::cast_slice(&gu));
    let dnb = lab.storage(bytemuck::cast_slice(&dn));
    let x: Vec<f32> = (0..hidden).map(|_| rng(&mut s)).collect();
    let act: Vec<f32> = (0..top_k * inter).map(|_| rng(&mut s)).collect();
    let xb = lab.storage(bytemuck::cast_slice(&x));
    let actb = lab.storage(bytemuck::cast_slice(&act));
    let wts = lab.storage(bytemuck::cast_slice(&[0.125f32; 8]));
    let ids = random_id_sets(lab, 77, top_k, experts);
    let act_out = lab.storage(&vec![0u8; top_k * inter * 4]);
    let out = lab.storage(&vec![0u8; hidden * 4]);
    // Neighbouring experts (8 consecutive ids, rotating base): is the
    // random spread over the 1 GB tensor what costs?
    let near: Vec<wgpu::Buffer> = (0..16u32)
        .map(|i| {
            let v: Vec<u32> = (0..top_k as u32)
                .map(|k| (i * 8 + k) % experts as u32)
                .collect();
            lab.storage(bytemuck::cast_slice(&v))
        })
        .collect();
    // Threads per weight row (moe_decode.wgsl's LANES): LAB_LANES, else the
    // kernel's default 32 (the backend runs decode at 32 for gate_up and
    // 64 for down: backends/wgpu/src/ops/moe.rs; LAB_LANES=64 times down's).
    let lanes = lab_lanes();
    // Activation rows per gate_up workgroup (moe_decode.wgsl's PAIRS).
    let rb = (128 / lanes).max(1);
    let nrb = inter as u32 / rb;
    // moe_decode.wgsl's Params: 8 words, then the pair launches' 8 (unused).
    let params = lab.uniform(&[
        1,
        hidden as u32,
        inter as u32,
        experts as u32,
        top_k as u32,
        1,
        top_k as u32,
        nrb,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]);
    // moe_decode.wgsl's BK defaults to gate_up's hidden / 8: down's is inter / 8.
    let down_k = [
        ("WDTYPE", 2.0),
        ("BK", (inter / 8) as f64),
        ("LANES", lanes as f64),
    ];
    let gate_up_k = [("WDTYPE", 2.0), ("LANES", lanes as f64)];
    // LAB_MOE_SRC=file.wgsl times another version of kernels/moe_decode.wgsl
    // (same entry points and bindings) without rebuilding.
    let moe_src = match std::env::var("LAB_MOE_SRC") {
        Ok(path) => std::fs::read_to_string(&path).expect("LAB_MOE_SRC readable"),
        Err(_) => String::new(),
    };
    // The backend's own composition (common, reduce helpers, family) unless
    // a variant file is given.
    let src = if moe_src.is_empty() {
        kernels::source("moe_decode", lab.subgroups, false).expect("moe_decode")
    } else {
        // the backend's prelude, then the given file in moe_decode's place
        let reduce = if lab.subgroups {
            kernels::REDUCE_SUBGROUP
        } else {
            kernels::REDUCE
        };
        format!("{}\n{reduce}\n{moe_src}", kernels::COMMON)
    };
    println!(
        "\nmoe (backend kernels), top-{top_k} of {experts}, {hidden} x {inter}, {lanes} lanes a row"
    );
    for checked in [true, false] {
        let module = lab.module(&src, checked);
        let tag = if checked { "checked" } else { "unchecked" };
        let label = format!("moe/{tag}");
        if !label.contains(filter) {
            continue;
        }
        let p = lab.pipeline(&module, "moe_gate_up_decode", &gate_up_k, 5);
        let groups: Vec<_> = ids
            .iter()
            .map(|id| lab.bind(&p, &params, &[id, &gub, &xb, &wts, &act_out]))
            .collect();
        let us = lab.time(&p, &groups, top_k as u32 * nrb, CHAIN);
        let mb = (top_k * 2 * inter * hidden * 2) as f64 / 1e6;
        let ngroups: Vec<_> = near
            .iter()
            .map(|id| lab.bind(&p, &params, &[id, &gub, &xb, &wts, &act_out]))
            .collect();
        let nus = lab.time(&p, &ngroups, top_k as u32 * nrb, CHAIN);
        println!("  gate_up {tag:9} neighbouring experts: chain {nus:8.2} us");
        let one: Vec<_> = ids[..1]
            .iter()
            .map(|id| lab.bind(&p, &params, &[id, &gub, &xb, &wts, &act_out]))
            .collect();
        let ous = lab.time(&p, &one, top_k as u32 * nrb, CHAIN);
        println!("  gate_up {tag:9} same 8 experts every call (in L2): chain {ous:8.2} us");
        println!(
            "  gate_up {tag:9} chain {us:8.2} us  {:7.0} GB/s",
            mb / us * 1e3
        );
        let p = lab.pipeline(&module, "moe_down_decode", &down_k, 5);
        let groups: Vec<_> = ids
            .iter()
            .map(|id| lab.bind(&p, &params, &[id, &dnb, &actb, &wts, &out]))
            .collect();
        let us = lab.time(&p, &groups, (hidden as u32).div_ceil(256 / lanes), CHAIN);
        let mb = (top_k * inter * hidden * 2) as f64 / 1e6;
        println!(
            "  down    {tag:9} chain {us:8.2} us  {:7.0} GB/s",
            mb / us * 1e3
        );
        if !lab.lanes32 {
            continue;
        }
        // The layout probes (kernel_lab_moe.wgsl): gate_up as a flat GEMV
        // over the selected experts' rows, raw dots without the activation,
        // so there is no backend result to check them against.
        let lm = lab.module(&format!("{src}\n{MOE_LAB}"), checked);
        let gu_mb = (top_k * 2 * inter * hidden * 2) as f64 / 1e6;
        let wgs = (top_k * 2 * inter) as u32 / 8;
        for entry in ["gu_flat", "gu_flat_noid"] {
            let p = lab.pipeline(
                &lm,
                entry,
                &[("WDTYPE", 2.0), ("BK", (hidden / 8) as f64)],
                5,
            );
            let groups: Vec<_> = ids
                .iter()
                .map(|id| lab.bind(&p, &params, &[id, &gub, &xb, &wts, &act_out]))
                .collect();
            let us = lab.time(&p, &groups, wgs, CHAIN);
            println!(
                "  {entry:12} {tag:9} chain {us:8.2} us  {:7.0} GB/s  (raw dots, not checked)",
                gu_mb / us * 1e3
            );
        }
    }
}

/// `words` (vec4 units of 8 bf16) of `experts` matrices of `rows` x `k`,
/// row-major, in the backend's tile order (kernels/common.wgsl's
/// expert_row, backends/wgpu/src/expert_tiles.rs): blocks of 64 tile rows
/// (gate_up: 16 gate rows then the 16 up rows of the same features, twice,
/// as gemm_coop's weight_row orders them), chunks of 16 of k, a chunk its
/// 64 rows' 32 bytes one after another.
fn tile_order(words: &[u32], (experts, rows, k): (usize, usize, usize), gate_up: bool) -> Vec<u32> {
    let (kq, nch) = (k / 8, k / 16);
    let half = rows / 2;
    let mut out = Vec::with_capacity(words.len());
    for e in 0..experts {
        for b in 0..rows / 64 {
            for c in 0..nch {
                for jl in 0..64 {
                    let wr = if gate_up {
                        let f = 32 * b + 16 * (jl / 32) + jl % 16;
                        f + if jl % 32 >= 16 { half } else { 0 }
                    } else {
                        64 * b + jl
                    };
                    for h in 0..2 {
                        let v = ((e * rows + wr) * kq + 2 * c + h) * 4;
                        out.extend_from_slice(&words[v..v + 4]);
                    }
                }
            }
        }
    }
    out
}

/// The backend's decode MoE kernels (moe_decode.wgsl) on tile-ordered
/// expert weights (`moe_tiled`: TILED_A = 1, their tile-native bodies)
/// against the same kernels on row-major weights, at the lanes the backend
/// runs (32 gate_up, 64 down): the same selected experts (16 rotating
/// sets), each tiled result checked against the row-major one. The
/// permutation here is the lab's own, so the check also holds the kernels
/// to an independent statement of the layout. (H200 runs 05-07 of
/// 2026-12-01 at a94f43a timed the lab's first tiled kernels, whose 8 / 4
/// feature and 4 / 8 / 16 row geometries chose the backend's.)
fn tiled_moe_case(
    lab: &Lab,
    (hidden, inter, experts, top_k): (usize, usize, usize, usize),
    filter: &str,
) {
    if !"moe_tiled".contains(filter) {
        return;
    }
    assert!(hidden.is_multiple_of(64) && inter.is_multiple_of(32) && top_k == 8);
    let mut s = 0x005e_ed71_11e5_u64;
    let gu = bf16_weights(&mut s, experts * 2 * inter * hidden);
    let dn = bf16_weights(&mut s, experts * hidden * inter);
    let gu_t = tile_order(
        bytemuck::cast_slice(&gu),
        (experts, 2 * inter, hidden),
        true,
    );
    let dn_t = tile_order(bytemuck::cast_slice(&dn), (experts, hidden, inter), false);
    let (gub, dnb) = (
        lab.storage(bytemuck::cast_slice(&gu)),
        lab.storage(bytemuck::cast_slice(&dn)),
    );
    let (gutb, dntb) = (
        lab.storage(bytemuck::cast_slice(&gu_t)),
        lab.storage(bytemuck::cast_slice(&dn_t)),
    );
    drop((gu, dn, gu_t, dn_t));
    let x: Vec<f32> = (0..hidden).map(|_| rng(&mut s)).collect();
    let act: Vec<f32> = (0..top_k * inter).map(|_| rng(&mut s)).collect();
    let (xb, actb) = (
        lab.storage(bytemuck::cast_slice(&x)),
        lab.storage(bytemuck::cast_slice(&act)),
    );
    let wts: Vec<f32> = (0..top_k).map(|j| 0.05 + 0.02 * j as f32).collect();
    let wts = lab.storage(bytemuck::cast_slice(&wts));
    let ids = random_id_sets(lab, 91, top_k, experts);
    let act_out = lab.storage(&vec![0u8; top_k * inter * 4]);
    let out = lab.storage(&vec![0u8; hidden * 4]);
    // moe_decode.wgsl's Params (gate_up at the backend's 32 lanes: four
    // activation rows a workgroup, nrb = inter / 4), then the pair
    // launches' 8 words (unused).
    let mut words = vec![
        1,
        hidden as u32,
        inter as u32,
        experts as u32,
        top_k as u32,
        1,
        top_k as u32,
        inter as u32 / 4,
    ];
    words.resize(16, 0);
    let params = lab.uniform(&words);
    let src = kernels::source("moe_decode", lab.subgroups, false).expect("moe_decode");
    let module = lab.module(&src, false);
    let gu_mb = (top_k * 2 * inter * hidden * 2) as f64 / 1e6;
    let dn_mb = (top_k * inter * hidden * 2) as f64 / 1e6;
    println!("\nmoe decode on tile-ordered experts: top-{top_k} of {experts}, {hidden} x {inter}");
    // Times `entry` over the 16 id sets on `w` (a: x or act, into o), then
    // runs it once on the first set and reads o.
    let run = |entry: &str,
               consts: &[(&str, f64)],
               w: &wgpu::Buffer,
               a: &wgpu::Buffer,
               o: &wgpu::Buffer,
               n: usize,
               wgs: u32| {
        let p = lab.pipeline(&module, entry, consts, 5);
        let groups: Vec<_> = ids
            .iter()
            .map(|id| lab.bind(&p, &params, &[id, w, a, &wts, o]))
            .collect();
        let us = lab.time(&p, &groups, wgs, CHAIN);
        lab.poison(o, n);
        lab.time(&p, &groups[..1], wgs, 1);
        (us, lab.read_f32(o, n))
    };
    // Each phase on both layouts (TILED_A 0 on the row-major stack, 1 on
    // the tile-ordered one), the tiled result checked against the other.
    let both = |phase: &str,
                (entry, consts): (&str, &[(&str, f64)]),
                (row_major, tiled): (&wgpu::Buffer, &wgpu::Buffer),
                (a, o, n, wgs): (&wgpu::Buffer, &wgpu::Buffer, usize, u32),
                mb: f64| {
        let with = |t: f64| [consts, &[("TILED_A", t)]].concat();
        let (us, want) = run(entry, &with(0.0), row_major, a, o, n, wgs);
        println!(
            "  {phase:8} row-major     chain {us:8.2} us  {:7.0} GB/s",
            mb / us * 1e3
        );
        let (us, got) = run(entry, &with(1.0), tiled, a, o, n, wgs);
        let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        let err = rel_err(&got, &want);
        println!(
            "  {phase:8} tile-ordered  chain {us:8.2} us  {:7.0} GB/s  err {err:.1e}",
            mb / us * 1e3
        );
        assert!(err < 1e-5, "tiled {phase} against row-major: {err:e}");
    };
    let gate_up = [
        ("WDTYPE", 2.0),
        ("LANES", 32.0),
        ("BK", (hidden / 8) as f64),
    ];
    let gu_out = (&xb, &act_out, top_k * inter, (top_k * inter / 4) as u32);
    both(
        "gate_up",
        ("moe_gate_up_decode", &gate_up),
        (&gub, &gutb),
        gu_out,
        gu_mb,
    );
    let down = [("WDTYPE", 2.0), ("LANES", 64.0), ("BK", (inter / 8) as f64)];
    let dn_out = (&actb, &out, hidden, (hidden / 4) as u32);
    both(
        "down",
        ("moe_down_decode", &down),
        (&dnb, &dntb),
        dn_out,
        dn_mb,
    );
}

/// `LAB_LANES` (32, 64 or 128; default 32, the kernels' own default).
/// The persistent grids `grid_sync` runs: LAB_GRID (comma-separated
/// workgroup counts), else `default`.
fn lab_grids(default: &[u32]) -> Vec<u32> {
    std::env::var("LAB_GRID").map_or(default.to_vec(), |v| {
        v.split(',')
            .map(|g| {
                g.trim()
                    .parse()
                    .expect("LAB_GRID: workgroup counts, comma-separated")
            })
            .collect()
    })
}

fn lab_lanes() -> u32 {
    let lanes = std::env::var("LAB_LANES").map_or(32, |v| v.parse().expect("LAB_LANES: a number"));
    assert!(
        matches!(lanes, 32 | 64 | 128),
        "LAB_LANES must be 32, 64 or 128"
    );
    lanes
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let lab = Lab::open();
    let small = std::env::var("LAB_SMALL").is_ok();
    if small {
        gemv_case(&lab, "tiny", 64, 512, &filter);
        normed_gemv_case(&lab, "tiny", 64, 512, &filter);
        pattern_case(&lab, (3, 128, 256), &filter);
        tiled_moe_case(&lab, (256, 64, 8, 8), &filter);
        grid_sync_case(&lab, 64, 4, &lab_grids(&[1]), &filter);
        return;
    }
    if filter == "slots" {
        slots_case();
        return;
    }
    if filter == "backend" {
        backend_case(262144, 2816);
        return;
    }
    dispatch_case(&lab, &filter);
    // (352, one workgroup a block, is the fastest grid but hung the H200
    // in one compile of two: residency is the driver's register choice;
    // docs/decisions.md)
    let grids = lab_grids(&[132, 264]);
    grid_sync_case(&lab, 2816, 8, &grids, &filter);
    grid_sync_case(&lab, 0, 8, &grids, &filter);
    // 64 of the 128 gate_up experts (1 GB; a 512-token batch touches nearly all)
    pattern_case(&lab, (64, 2816, 2816), &filter);
    moe_case(&lab, &filter);
    tiled_moe_case(&lab, (2816, 704, 128, 8), &filter);
    gemv_case(&lab, "dense_gate_up", 4224, 2816, &filter);
    gemv_case(&lab, "q_proj", 4096, 2816, &filter);
    // q|k|v of a sliding layer behind the layer's input norm (post_ffn's
    // last step).
    normed_gemv_case(&lab, "qkv_sliding", 8192, 2816, &filter);
    gemv_case(&lab, "o_proj", 2816, 4096, &filter);
    // The MoE phases' byte counts as plain GEMVs: does the GEMV itself slow
    // down past ~24 MB, or is it the expert layout?
    gemv_case(&lab, "rows_11264", 11264, 2816, &filter);
    gemv_case(&lab, "rows_5632", 5632, 2816, &filter);
    gemv_case(&lab, "lm_head", 262144, 2816, &filter);
}

/// The backend's own `matmul` at one shape: timed by its `time_ops`, by the
/// wall clock, and the lab's copy of the kernel on the backend's device.
fn backend_case(rows: usize, k: usize) {
    use turbospark::ops::Matmul;
    use turbospark::{ComputeBackend, DType, HostBytes};
    let be = turbospark_wgpu::WgpuBackend::new(&Default::default()).unwrap();
    let mut s = 7u64;
    let wq = bf16_weights(&mut s, rows * k);
    let x: Vec<f32> = (0..k).map(|_| rng(&mut s)).collect();
    let w = be
        .upload_weight(
            DType::BF16,
            rows,
            k,
            HostBytes::Slice(bytemuck::cast_slice(&wq)),
            "w",
        )
        .unwrap();
    let xb = be
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&x)), "x")
        .unwrap();
    let out = be.alloc(DType::F32, rows, "out").unwrap();
    let p = Matmul { m: 1, n: rows, k };
    be.matmul(&w, &xb, &out, p).unwrap();
    be.sync().unwrap();
    let mut v = be
        .time_ops(100, |_| be.matmul(&w, &xb, &out, p))
        .unwrap()
        .unwrap();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let t = Instant::now();
    for _ in 0..20 {
        be.matmul(&w, &xb, &out, p).unwrap();
    }
    be.sync().unwrap();
    let wall = t.elapsed().as_secs_f64() / 20.0;
    println!(
        "backend matmul {rows} x {k}: time_ops median {:.2} us, wall {:.2} us",
        v[v.len() / 2] * 1e6,
        wall * 1e6
    );
    let lab = Lab::with_device(
        be.device().clone(),
        be.queue().clone(),
        be.info().features.subgroups,
    );
    // The lab's pipeline over the backend's own weight, x and out buffers.
    let m = lab.module(&gemv_source(&lab), false);
    let pl = lab.pipeline(&m, "gemv", &[("WDTYPE", 2.0)], 3);
    let rp = lab.uniform(&[k as u32, k as u32, rows as u32, 0]);
    let wbuf = w.wgpu_buffers().next().unwrap();
    let xbuf = xb.wgpu_buffers().next().unwrap();
    let obuf = out.wgpu_buffers().next().unwrap();
    let g = [lab.bind(&pl, &rp, &[wbuf, xbuf, obuf])];
    let us = lab.time(&pl, &g, rows.div_ceil(8) as u32, CHAIN);
    println!("lab pipeline on the backend's buffers: chain {us:.2} us");
    // The backend's own compiled pipeline, timed and bound by the lab.
    let bp = be
        .pipeline("gemv", "gemv", &[("WDTYPE", 2)], &[true, true, false])
        .unwrap();
    let g = [lab.bind(&bp, &rp, &[wbuf, xbuf, obuf])];
    let us = lab.time(&bp, &g, rows.div_ceil(8) as u32, CHAIN);
    println!("backend pipeline, lab binding and timing: chain {us:.2} us");
    // Parameters in a 1 MB arena (UNIFORM | COPY_DST) at slot 3, written
    // with queue.write_buffer, as the backend keeps them.
    let arena = lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 1 << 20,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    lab.queue.write_buffer(
        &arena,
        768,
        bytemuck::cast_slice(&[k as u32, k as u32, rows as u32, 0]),
    );
    let g0 = lab.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &bp.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &arena,
                offset: 768,
                size: wgpu::BufferSize::new(256),
            }),
        }],
    });
    let (_, g1) = lab.bind(&bp, &rp, &[wbuf, xbuf, obuf]);
    let us = lab.time(&bp, &[(g0, g1)], rows.div_ceil(8) as u32, CHAIN);
    println!("backend pipeline, params in an arena slot: chain {us:.2} us");
    // The backend itself, recording 100 calls in one batch, wall clock.
    be.sync().unwrap();
    let t = Instant::now();
    for _ in 0..100 {
        be.matmul(&w, &xb, &out, p).unwrap();
    }
    let rec = t.elapsed().as_secs_f64();
    be.sync().unwrap();
    println!(
        "backend, 100 calls in one batch: {:.2} us per call wall ({:.2} us recording)",
        t.elapsed().as_secs_f64() * 1e4,
        rec * 1e4
    );
    // The same on a weight the lab uploads itself (create_buffer_init).
    let own = lab.storage(bytemuck::cast_slice(&wq));
    let g = [lab.bind(&pl, &rp, &[&own, xbuf, obuf])];
    let us = lab.time(&pl, &g, rows.div_ceil(8) as u32, CHAIN);
    println!("lab pipeline on a lab-made weight: chain {us:.2} us");
    // A weight made like the backend's (create_buffer + write_buffer).
    let made = lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (wq.len() * 2) as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    lab.queue.write_buffer(&made, 0, bytemuck::cast_slice(&wq));
    let g = [lab.bind(&pl, &rp, &[&made, xbuf, obuf])];
    let us = lab.time(&pl, &g, rows.div_ceil(8) as u32, CHAIN);
    println!("lab pipeline on a write_buffer weight: chain {us:.2} us");
    gemv_case(&lab, "on-backend-device", rows, k, "base/unchecked");
}

/// The bench's chain against the lab's for a 23 MB GEMV on one device:
/// the backend's `time_ops` over rotated weights, and the backend's
/// pipeline timed by the lab with one parameter binding for every dispatch
/// or a different arena slot per dispatch (as the backend binds them).
fn slots_case() {
    use turbospark::ops::Matmul;
    use turbospark::{ComputeBackend, DType, HostBytes};
    let (rows, k) = (4224usize, 2816usize);
    let be = turbospark_wgpu::WgpuBackend::new(&Default::default()).unwrap();
    let mut s = 9u64;
    let wq = bf16_weights(&mut s, rows * k);
    let x: Vec<f32> = (0..k).map(|_| rng(&mut s)).collect();
    let ws: Vec<_> = (0..23)
        .map(|_| {
            be.upload_weight(
                DType::BF16,
                rows,
                k,
                HostBytes::Slice(bytemuck::cast_slice(&wq)),
                "w",
            )
            .unwrap()
        })
        .collect();
    let xb = be
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&x)), "x")
        .unwrap();
    let out = be.alloc(DType::F32, rows, "out").unwrap();
    let p = Matmul { m: 1, n: rows, k };
    let lab = Lab::with_device(
        be.device().clone(),
        be.queue().clone(),
        be.info().features.subgroups,
    );
    let bp = be
        .pipeline("gemv", "gemv", &[("WDTYPE", 2)], &[true, true, false])
        .unwrap();
    let rp = lab.uniform(&[k as u32, k as u32, rows as u32, 0]);
    let xbuf = xb.wgpu_buffers().next().unwrap();
    let obuf = out.wgpu_buffers().next().unwrap();
    let one: Vec<_> = ws
        .iter()
        .map(|w| lab.bind(&bp, &rp, &[w.wgpu_buffers().next().unwrap(), xbuf, obuf]))
        .collect();
    // Warm the clocks: ~0.5 s of chains.
    for _ in 0..50 {
        lab.time(&bp, &one, (rows / 8) as u32, CHAIN);
    }
    let us = lab.time(&bp, &one, (rows / 8) as u32, CHAIN);
    println!("lab chain, one parameter binding: {us:.2} us");
    let arena = lab.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 1 << 20,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut groups = Vec::new();
    for i in 0..CHAIN as usize {
        let off = (i * 256) as u64;
        lab.queue.write_buffer(
            &arena,
            off,
            bytemuck::cast_slice(&[k as u32, k as u32, rows as u32, 0]),
        );
        let g0 = lab.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &bp.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &arena,
                    offset: off,
                    size: wgpu::BufferSize::new(256),
                }),
            }],
        });
        let w = ws[i % ws.len()].wgpu_buffers().next().unwrap();
        let (_, g1) = lab.bind(&bp, &rp, &[w, xbuf, obuf]);
        groups.push((g0, g1));
    }
    let us = lab.time(&bp, &groups, (rows / 8) as u32, CHAIN);
    println!("lab chain, an arena slot per dispatch: {us:.2} us");
    let mut v = be
        .time_ops(200, |i| be.matmul(&ws[i % ws.len()], &xb, &out, p))
        .unwrap()
        .unwrap();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("backend time_ops chain: {:.2} us", v[v.len() / 2] * 1e6);
    // What the bench does differently: many more calls per sample, and x
    // rotating with the weights (its input sets).
    let mut v = be
        .time_ops(2000, |i| be.matmul(&ws[i % ws.len()], &xb, &out, p))
        .unwrap()
        .unwrap();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "backend time_ops, 2000 calls: {:.2} us",
        v[v.len() / 2] * 1e6
    );
    let xs: Vec<_> = (0..ws.len())
        .map(|_| {
            be.upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&x)), "x")
                .unwrap()
        })
        .collect();
    let mut v = be
        .time_ops(200, |i| {
            be.matmul(&ws[i % ws.len()], &xs[i % ws.len()], &out, p)
        })
        .unwrap()
        .unwrap();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "backend time_ops, x rotating too: {:.2} us",
        v[v.len() / 2] * 1e6
    );
    let t = Instant::now();
    for i in 0..2000 {
        be.matmul(&ws[i % ws.len()], &xb, &out, p).unwrap();
    }
    be.sync().unwrap();
    println!(
        "backend, 2000 calls, wall: {:.2} us per call",
        t.elapsed().as_secs_f64() * 1e6 / 2000.0
    );
}
