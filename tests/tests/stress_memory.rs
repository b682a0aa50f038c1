//! Stress of device memory: eight threads allocating buffers of random
//! sizes on random pool streams, filling them on their own stream, reading
//! them on other streams (ordered after the fill by `wait_stream`, declared
//! by the copy), dropping them at random, through the process-wide pool on
//! the software device with its use-after-free detector on
//! (`SPYRE_MOCK_CHECK_REUSE=1`). Then checking:
//!
//! - 0 reports: the detector fails the stream of any operation that
//!   touches memory handed out again too early, so every stream must end
//!   without an error;
//! - 0 corrupted reads: every read-back holds the value its buffer was
//!   last filled with (memory reused too early would hold another
//!   buffer's);
//! - allocated memory back to 0 once every buffer is dropped, and no block
//!   left waiting for a stream once the streams are idle;
//! - 0 hangs: the workers finish within 60 s.
//!
//! Deterministic per seed: `SPYRE_STRESS_SEED`, `SPYRE_STRESS_OPS`
//! (operations per worker, default 1 500).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spyre_stream::{Device, DeviceBuffer, HostBuffer, SpyreStream, memory_stats, stream_from_pool};
use spyre_testkit::SplitMix64;
use spyre_tests::isolated;
use spyre_tests::reliability::{ops_per_worker, run_bounded, seed};

const WORKERS: usize = 8;
const STREAMS: usize = 6;
/// Live buffers a worker keeps at most.
const LIVE: usize = 6;
const LIMIT: Duration = Duration::from_secs(60);

/// A worker's buffer: its value, and the stream that last read it.
struct Live {
    buffer: DeviceBuffer<u8>,
    value: u8,
    last_reader: Option<SpyreStream>,
}

fn worker(
    streams: Arc<Vec<SpyreStream>>,
    index: usize,
    seed: u64,
    ops: usize,
    bad: Arc<AtomicU64>,
) {
    let mut rng = SplitMix64::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut live: Vec<Live> = Vec::new();
    let pick = |rng: &mut SplitMix64| streams[rng.below(STREAMS as u64) as usize];
    for _ in 0..ops {
        match rng.below(6) {
            0 | 1 if live.len() < LIVE => {
                let owner = pick(&mut rng);
                // Sizes from 1 byte to 96 KiB: small blocks, splits, merges.
                let len = 1 + rng.below(96 << 10) as usize;
                let value = rng.below(256) as u8;
                let mut buffer = DeviceBuffer::<u8>::new(owner, len).expect("allocate");
                buffer.fill(owner, value).expect("fill");
                live.push(Live {
                    buffer,
                    value,
                    last_reader: None,
                });
            }
            2 if !live.is_empty() => {
                // Read on another stream, after the buffer's last write.
                let at = rng.below(live.len() as u64) as usize;
                let item = &mut live[at];
                let reader = pick(&mut rng);
                reader
                    .wait_stream(item.buffer.stream())
                    .expect("wait_stream");
                let host = HostBuffer::zeroed(item.buffer.len());
                item.buffer.copy_to_host_buffer(reader, &host).expect("D2H");
                item.last_reader = Some(reader);
                if rng.below(4) == 0 && host.read().iter().any(|&b| b != item.value) {
                    bad.fetch_add(1, Ordering::SeqCst);
                }
            }
            3 if !live.is_empty() => {
                // Write again on the owner, after the last read.
                let at = rng.below(live.len() as u64) as usize;
                let item = &mut live[at];
                let owner = item.buffer.stream();
                if let Some(reader) = item.last_reader.take() {
                    owner.wait_stream(reader).expect("wait_stream");
                }
                item.value = rng.below(256) as u8;
                item.buffer.fill(owner, item.value).expect("fill");
            }
            4 if !live.is_empty() => {
                // Drop: never blocks, whatever is pending.
                live.swap_remove(rng.below(live.len() as u64) as usize);
            }
            _ => {
                if let Some(item) = live.first() {
                    let got = item.buffer.to_vec(item.buffer.stream()).expect("read back");
                    if got.iter().any(|&b| b != item.value) {
                        bad.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
    }
}

#[test]
fn random_buffers_across_threads_and_streams_with_the_detector_on() {
    isolated!(
        &[("SPYRE_BACKEND", "mock"), ("SPYRE_MOCK_CHECK_REUSE", "1")],
        || {
            let seed = seed();
            let ops = ops_per_worker(1_500);
            let streams: Arc<Vec<SpyreStream>> = Arc::new(
                (0..STREAMS)
                    .map(|i| stream_from_pool(Device::CURRENT, -(i as i32 % 2)).expect("stream"))
                    .collect(),
            );
            let bad = Arc::new(AtomicU64::new(0));
            let started = Instant::now();
            let workers: Vec<Box<dyn FnOnce() + Send>> = (0..WORKERS)
                .map(|index| {
                    let (streams, bad) = (Arc::clone(&streams), Arc::clone(&bad));
                    Box::new(move || worker(streams, index, seed, ops, bad))
                        as Box<dyn FnOnce() + Send>
                })
                .collect();
            run_bounded("memory", LIMIT, workers);
            for stream in streams.iter() {
                stream
                    .synchronize()
                    .expect("no stream failed: the detector reported nothing");
            }
            let stats = memory_stats(Device::CURRENT).unwrap();
            eprintln!(
                "memory: {WORKERS} workers x {ops} ops, seed {seed:#x}, {:?}: {stats:?}",
                started.elapsed()
            );
            assert_eq!(bad.load(Ordering::SeqCst), 0, "corrupted reads");
            assert_eq!(stats.allocated_bytes, 0);
            assert_eq!(stats.requested_bytes, 0);
            assert_eq!(stats.pending_frees, 0, "every stream is idle");
            assert_eq!(stats.allocations, stats.frees);
            assert!(stats.allocations > 0);
        }
    );
}
