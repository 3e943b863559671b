use std::time::Instant;
use turbospark::ops::Matmul;
use turbospark::{ComputeBackend, DType};
use turbospark_wgpu::{WgpuBackend, WgpuOptions};

fn main() {
    let be = WgpuBackend::new(&WgpuOptions::default()).unwrap();
    let w = be.alloc(DType::BF16, 64 * 512, "w").unwrap();
    let x = be.alloc(DType::F32, 512, "x").unwrap();
    let o = be.alloc(DType::F32, 64, "o").unwrap();
    let p = Matmul {
        m: 1,
        n: 64,
        k: 512,
    };
    for _ in 0..10 {
        be.matmul(&w, &x, &o, p).unwrap();
    }
    be.sync().unwrap();
    {
        let d = be.device();
        let lay = d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &(0..3)
                .map(|i| wgpu::BindGroupLayoutEntry {
                    binding: i,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: i < 2 },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect::<Vec<_>>(),
        });
        let bufs: Vec<wgpu::Buffer> = (0..3)
            .map(|_| {
                d.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: 1024,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                })
            })
            .collect();
        let t = Instant::now();
        let mut v = Vec::new();
        for _ in 0..1000 {
            v.push(
                d.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("x"),
                    layout: &lay,
                    entries: &bufs
                        .iter()
                        .enumerate()
                        .map(|(i, b)| wgpu::BindGroupEntry {
                            binding: i as u32,
                            resource: b.as_entire_binding(),
                        })
                        .collect::<Vec<_>>(),
                }),
            );
        }
        println!(
            "create_bind_group: {:.2} us each",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    for n in [100, 1000] {
        let t = Instant::now();
        for _ in 0..n {
            be.matmul(&w, &x, &o, p).unwrap();
        }
        let rec = t.elapsed();
        be.flush().unwrap();
        let sub = t.elapsed();
        be.sync().unwrap();
        println!("{n} launches: record {:.1} us/launch, +submit {:.1} us/launch, total incl gpu {:.1} us/launch",
            rec.as_secs_f64()*1e6/n as f64, sub.as_secs_f64()*1e6/n as f64, t.elapsed().as_secs_f64()*1e6/n as f64);
    }
}

#[allow(dead_code)]
fn unused() {}
