//! Kernel design lab: times decode-GEMV variants (examples/kernel_lab.wgsl)
//! and the backend's own GEMV and MoE decode kernels side by side at Gemma
//! 4 26B-A4B shapes, with and without wgpu's injected runtime checks. Each
//! figure is a chain of dependent dispatches in one compute pass (as in a
//! decode step), timed by GPU timestamps around the pass, weights rotated
//! over enough copies that they cannot sit in cache. What each case informs
//! (docs/decisions.md): `dispatch`, an empty dependent dispatch's fixed
//! cost (why decode fuses launches); the GEMVs checked and unchecked (why
//! kernels run without runtime checks, and `kc`: constant trip counts);
//! `w_pattern`, the MoE GEMM's weight reads row-major against tile by tile,
//! and `moe_tiled`, the tiled decode bodies against the row-major ones (why
//! experts are stored in tile order, and the measurement a device without
//! tensor cores still needs); `moe`, the MoE decode kernels at each lane
//! count. The GEMV variants are checked against an f64 host result on a
//! NaN-poisoned output before they are timed; `moe_tiled` checks the tiled
//! bodies against the row-major ones, `w_pattern` that each layout reads
//! every word once; `moe`'s and `dispatch`'s figures are timing only.
//!
//! `cargo run --release -p turbospark-wgpu --example kernel_lab [FILTER]`
//! (FILTER: a substring of `case/variant/checked`; `dispatch`, `w_pattern`
//! and `moe_tiled` select those cases). Every figure is taken after WARM
//! seconds of back-to-back passes. `LAB_MOE_SRC=file.wgsl` times another
//! version of kernels/moe_decode.wgsl. `LAB_LANES` (32, 64, 128) sets
//! moe_decode's threads per weight row (its LANES; the backend picks per
//! op, ops/moe.rs); the backend's gemv runs with the constants the backend
//! gives the shape (`gemv_constants`). `LAB_SMALL=1` runs small shapes of
//! the checked cases (lavapipe).

use std::time::Instant;

use turbospark_wgpu::kernels;
use wgpu::util::DeviceExt;

const LAB: &str = include_str!("kernel_lab.wgsl");

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
    if std::env::var("LAB_SMALL").is_ok() {
        gemv_case(&lab, "tiny", 64, 512, &filter);
        pattern_case(&lab, (3, 128, 256), &filter);
        tiled_moe_case(&lab, (256, 64, 8, 8), &filter);
        return;
    }
    dispatch_case(&lab, &filter);
    // 64 of the 128 gate_up experts (1 GB; a 512-token batch touches nearly all)
    pattern_case(&lab, (64, 2816, 2816), &filter);
    moe_case(&lab, &filter);
    tiled_moe_case(&lab, (2816, 704, 128, 8), &filter);
    gemv_case(&lab, "dense_gate_up", 4224, 2816, &filter);
    gemv_case(&lab, "q_proj", 4096, 2816, &filter);
    gemv_case(&lab, "o_proj", 2816, 4096, &filter);
    // The MoE phases' byte counts as plain GEMVs: the GEMV's rate against
    // its size.
    gemv_case(&lab, "rows_11264", 11264, 2816, &filter);
    gemv_case(&lab, "rows_5632", 5632, 2816, &filter);
    gemv_case(&lab, "lm_head", 262144, 2816, &filter);
}
