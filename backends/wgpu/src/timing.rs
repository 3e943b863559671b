//! Timestamp queries around compute passes, the GPU time that `turbospark
//! bench` reports per op (crate::bench) and that a timed batch records
//! (crate::batch).

use std::sync::Mutex;

/// Queries per query set (wgpu's maximum); two per timed pass.
const QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// Timestamp state of a timed batch.
pub(crate) struct Timing {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Queries written in the batch being recorded.
    next: u32,
    /// Raw ticks of the batches already submitted, in query order.
    pub(crate) ticks: Vec<u64>,
    /// Profiling ([`crate::WgpuBackend::profile_start`]): every dispatch gets a pass
    /// of its own, and its entry point is kept here in dispatch order.
    pub labels: Option<Vec<&'static str>>,
}

impl Timing {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        let bytes = QUERIES as u64 * wgpu::QUERY_SIZE as u64;
        Timing {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: QUERIES,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench timestamps resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench timestamps readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            next: 0,
            ticks: Vec::new(),
            labels: None,
        }
    }

    /// No room for another pass's pair of queries.
    pub fn full(&self) -> bool {
        self.next + 2 > QUERIES
    }

    /// Timestamp writes for the next pass (a sample of `time_ops`, or one
    /// dispatch when profiling).
    pub fn next_pass(&mut self) -> wgpu::ComputePassTimestampWrites<'_> {
        let i = self.next;
        self.next += 2;
        wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: Some(i + 1),
        }
    }

    /// Global index of the next query (over all batches of this timing).
    pub fn position(&self) -> usize {
        self.ticks.len() + self.next as usize
    }

    /// Append the resolve of this batch's queries to `enc` (after its passes
    /// ended); false when it wrote none.
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) -> bool {
        if self.next == 0 {
            return false;
        }
        enc.resolve_query_set(&self.set, 0..self.next, &self.resolve, 0);
        enc.copy_buffer_to_buffer(
            &self.resolve,
            0,
            &self.readback,
            0,
            self.next as u64 * wgpu::QUERY_SIZE as u64,
        );
        true
    }

    /// After the submit that resolved them: wait, read the ticks, start over.
    /// Errors surface through the backend's error sink, `errors`.
    pub fn collect(&mut self, device: &wgpu::Device, errors: &Mutex<Vec<String>>) {
        let n = self.next as usize;
        self.next = 0;
        let slice = self.readback.slice(..(n * 8) as u64);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let polled = crate::wait::wait_for(device, None);
        let mapped = polled.is_ok() && matches!(rx.recv(), Ok(Ok(())));
        let got: Vec<u64> = match mapped.then(|| slice.get_mapped_range()) {
            Some(Ok(view)) => bytemuck::pod_collect_to_vec(&view),
            _ => {
                let why = polled.err().map_or(String::new(), |e| format!(": {e}"));
                errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("timestamp readback failed{why}"));
                vec![0; n]
            }
        };
        if mapped {
            self.readback.unmap();
        }
        self.ticks.extend(got);
    }
}
