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
