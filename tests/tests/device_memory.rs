//! Device memory with an owner: `DeviceBuffer` over the caching allocator,
//! on the software device through the process-wide pool. Each test runs in
//! a fresh process (the runtime and its allocator start once per process),
//! so the statistics each test asserts are its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use half::f16;
use spyre_mock::MockSystem;
use spyre_stream::{
    DataFormat, Device, DeviceBuffer, Error, HostBuffer, LaunchOptions, MIN_BLOCK, MemoryStats,
    OutOfMemory, SMALL_REQUEST, SMALL_SEGMENT, SpyreStream, empty_cache, memory_allocated,
    memory_reserved, memory_stats, stream_from_pool,
};
use spyre_tests::conformance::Gate;
use spyre_tests::isolated;
use spyre_tests::reliability::SpyBackend;

const MOCK: (&str, &str) = ("SPYRE_BACKEND", "mock");
const MIB: u64 = 1 << 20;
/// A device of 4 MiB in one region.
const FOUR_MIB_DEVICE: [(&str, &str); 3] = [
    MOCK,
    ("SPYRE_MOCK_MEMORY_BYTES", "4194304"),
    ("SPYRE_MOCK_REGION_BYTES", "4194304"),
];

fn pool_stream() -> SpyreStream {
    stream_from_pool(Device::CURRENT, 0).expect("stream_from_pool")
}

fn stats() -> MemoryStats {
    memory_stats(Device::CURRENT).expect("memory_stats")
}

/// Holds `stream` until the returned gate opens.
fn hold(stream: SpyreStream) -> Arc<Gate> {
    Gate::hold_pool_stream(stream)
}

static_assertions::assert_impl_all!(DeviceBuffer<f32>: Send, Sync);
static_assertions::assert_impl_all!(DeviceBuffer<u8>: Send, Sync);

#[test]
fn every_format_round_trips_and_fills() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let floats = DeviceBuffer::from_host(stream, &[1.5f32, -2.0, 3.25]).unwrap();
        assert_eq!((floats.len(), floats.size_bytes()), (3, 12));
        assert_eq!(floats.data_format(), DataFormat::Fp32);
        assert_eq!(floats.to_vec(stream).unwrap(), [1.5, -2.0, 3.25]);

        let mut halves = DeviceBuffer::<f16>::zeros(stream, 4).unwrap();
        assert_eq!(halves.to_vec(stream).unwrap(), [f16::ZERO; 4]);
        halves.fill(stream, f16::from_f32(0.5)).unwrap();
        assert_eq!(halves.to_vec(stream).unwrap(), [f16::from_f32(0.5); 4]);
        assert_eq!(halves.size_bytes(), 8);

        let mut ints = DeviceBuffer::from_host(stream, &[i32::MIN, -1, 7]).unwrap();
        assert_eq!(ints.to_vec(stream).unwrap(), [i32::MIN, -1, 7]);
        ints.fill(stream, -3).unwrap();
        assert_eq!(ints.to_vec(stream).unwrap(), [-3, -3, -3]);

        // Untyped bytes, through host buffers.
        let mut bytes = DeviceBuffer::<u8>::new(stream, 5).unwrap();
        bytes
            .copy_from_host_buffer(stream, &HostBuffer::from_vec(vec![9, 8, 7, 6, 5]))
            .unwrap();
        let out = HostBuffer::zeroed(5);
        bytes.copy_to_host_buffer(stream, &out).unwrap();
        assert_eq!(out.read()[..], [9, 8, 7, 6, 5]);
    });
}

/// Through a flex library, which does not tell the region size, buffers
/// that fit one region still lie in one chunk each (kernel operands), as
/// on the in-process device: 3 MiB buffers on 4 MiB regions, where a
/// standard 20 MiB segment crosses regions' ends.
#[test]
fn through_a_flex_library_buffers_that_fit_a_region_are_operands() {
    let library = spyre_tests::mock_cdylib().to_str().unwrap().to_owned();
    isolated!(
        &[
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", &library),
            ("SPYRE_MOCK_REGION_BYTES", "4194304"),
        ],
        || {
            assert_eq!(
                spyre_stream::memory_layout(Device::CURRENT).unwrap(),
                None,
                "the library does not tell the region size"
            );
            let stream = pool_stream();
            let elements = (3 * MIB / 4) as usize;
            let buffers: Vec<_> = (0..6)
                .map(|_| DeviceBuffer::<f32>::new(stream, elements).unwrap())
                .collect();
            for (i, buffer) in buffers.iter().enumerate() {
                assert_eq!(buffer.address().chunks().len(), 1, "buffer {i}");
                buffer.operand().unwrap();
            }
        }
    );
}

/// A free of a cached segment that fails (here with a status flex.h does
/// not define, through the flex library) may have freed some of it, and
/// no status of a failed free says the memory is still the caller's
/// (`INVALID_ARGUMENT` says it is not an allocation of the runtime): the
/// segment is forgotten, never handed out again, and no longer counted as
/// reserved.
#[test]
fn a_segment_whose_free_fails_is_forgotten() {
    let library = spyre_tests::mock_cdylib().to_str().unwrap().to_owned();
    isolated!(
        &[
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", &library),
            ("SPYRE_MOCK_UNDEFINED_STATUS", "flex_memory_free"),
        ],
        || {
            let stream = pool_stream();
            let address = DeviceBuffer::<u8>::new(stream, 1 << 20)
                .unwrap()
                .address()
                .clone();
            stream.synchronize().unwrap();
            assert!(stats().reserved_bytes >= MIB);
            assert_eq!(empty_cache(Device::CURRENT).unwrap(), 0, "nothing freed");
            let after = stats();
            assert_eq!((after.reserved_bytes, after.device_frees), (0, 0));
            let again = DeviceBuffer::<u8>::new(stream, 1 << 20).unwrap();
            assert_ne!(again.address(), &address, "a forgotten segment served");
            assert_eq!(stats().device_allocations, 2);
        }
    );
}

#[test]
fn statistics_follow_allocations_and_drops() {
    isolated!(&[MOCK], || {
        assert_eq!(stats(), MemoryStats::default(), "nothing before the start");
        let stream = pool_stream();
        // 1000 f32 = 4000 bytes, rounded to 8 blocks of 512 = 4096, from one
        // small segment of 2 MiB.
        let buffer = DeviceBuffer::<f32>::new(stream, 1000).unwrap();
        let s = stats();
        assert_eq!(s.allocated_bytes, 4096);
        assert_eq!(s.requested_bytes, 4000);
        assert_eq!(s.reserved_bytes, SMALL_SEGMENT);
        assert_eq!((s.allocations, s.device_allocations), (1, 1));
        drop(buffer);
        let s = stats();
        assert_eq!((s.allocated_bytes, s.requested_bytes), (0, 0));
        assert_eq!(s.peak_allocated_bytes, 4096);
        assert_eq!(s.reserved_bytes, SMALL_SEGMENT, "cached, not returned");
        assert_eq!(s.frees, 1);
        assert_eq!(memory_allocated(Device::CURRENT).unwrap(), 0);
        assert_eq!(memory_reserved(Device::CURRENT).unwrap(), SMALL_SEGMENT);
        assert_eq!(empty_cache(Device::CURRENT).unwrap(), SMALL_SEGMENT);
        let s = stats();
        assert_eq!((s.reserved_bytes, s.device_frees), (0, 1));
        assert_eq!(s.peak_reserved_bytes, SMALL_SEGMENT);
    });
}

#[test]
fn a_dropped_block_is_reused_on_its_stream_without_a_device_call() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let first = DeviceBuffer::<u8>::new(stream, 1000).unwrap();
        let address = first.address().clone();
        drop(first);
        for _ in 0..100 {
            let again = DeviceBuffer::<u8>::new(stream, 1000).unwrap();
            assert_eq!(again.address(), &address, "the cached block");
        }
        assert_eq!(stats().device_allocations, 1);
    });
}

/// A block reused on its own stream makes the stream's next launch carry
/// a pipeline barrier, whoever makes it, so that on a card that overlaps a
/// stream's operations the new owner's work waits for the previous
/// owner's; a launch that fails leaves the request for the next one, and
/// the launches after the covering one, other streams' and memory new
/// from the device ask for none. (A block split from a cached segment
/// counts as reused, whether or not its bytes were used before.)
#[test]
fn the_first_launch_after_a_reuse_on_its_stream_carries_a_pipeline_barrier() {
    isolated!(&[MOCK], || {
        let (stream, other) = (pool_stream(), pool_stream());
        spyre_stream::start_trace();
        let mut first = DeviceBuffer::<u8>::new(stream, 1000).unwrap();
        first.fill(stream, 1).unwrap();
        let address = first.address().clone();
        drop(first);
        let mut again = DeviceBuffer::<u8>::new(stream, 1000).unwrap();
        assert_eq!(again.address(), &address, "the cached block");
        other
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        let short = HostBuffer::zeroed(8);
        let refused = stream.launch_h2d(&short, again.address(), LaunchOptions::new());
        assert!(refused.is_err(), "8 bytes into 1000: {refused:?}");
        again.fill(stream, 2).unwrap();
        again.fill(stream, 3).unwrap();
        assert_eq!(again.to_vec(stream).unwrap(), [3; 1000]);
        drop(again);
        // A smaller size: split from the merged cache, not a recent block.
        let mut split = DeviceBuffer::<u8>::new(stream, 512).unwrap();
        assert_eq!(split.address(), &address.slice(0, 512).unwrap());
        split.fill(stream, 4).unwrap();
        // Larger than a small request: a new segment, not the cache.
        let fresh = DeviceBuffer::<u8>::new(stream, 2 * SMALL_REQUEST as usize).unwrap();
        assert_eq!(stats().device_allocations, 2);
        stream
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        stream.synchronize().unwrap();
        let barriers: Vec<_> = spyre_stream::stop_trace()
            .entries
            .iter()
            .map(|entry| (entry.stream, entry.kind, entry.pipeline_barrier))
            .collect();
        use spyre_stream::OperationKind::{D2h, Fill, HostCallback, Refused};
        assert_eq!(
            barriers,
            [
                (stream, Fill, false),
                (other, HostCallback, false),
                (stream, Refused, true),
                (stream, Fill, true),
                (stream, Fill, false),
                (stream, D2h, false),
                (stream, Fill, true),
                (stream, HostCallback, false),
            ]
        );
        drop((fresh, split));
    });
}

#[test]
fn a_freed_block_serves_its_size_again_whole_and_a_smaller_size_split() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let first = DeviceBuffer::<u8>::new(stream, 4096).unwrap();
        let at = first.operand().unwrap();
        drop(first);
        // 4000 bytes round up to the same 4096: the freed block, whole.
        let same = DeviceBuffer::<u8>::new(stream, 4000).unwrap();
        assert_eq!(same.operand().unwrap(), at);
        assert_eq!(same.size_bytes(), 4000);
        assert_eq!(memory_allocated(Device::CURRENT).unwrap(), 4096);
        drop(same);
        // 512 bytes: split off the start of the merged segment, not the
        // whole 4096-byte block.
        let small = DeviceBuffer::<u8>::new(stream, 512).unwrap();
        assert_eq!(small.operand().unwrap(), at);
        assert_eq!(memory_allocated(Device::CURRENT).unwrap(), 512);
        assert_eq!(stats().device_allocations, 1);
    });
}

/// A recent block (freed on its own stream) is taken before a better fit:
/// the documented trade of the allocator's recent blocks. In one 20 MiB
/// segment, `b` (2 MiB) goes back merged after `other` passes its drop,
/// `a` (3 MiB) is freed on its own stream; a 2 MiB request then takes `a`
/// whole (its 1 MiB rest is not worth a split) instead of the exact `b`.
#[test]
fn a_recent_block_is_taken_before_a_better_fit() {
    isolated!(&[MOCK], || {
        const MIB: usize = 1 << 20;
        let (owner, other) = (pool_stream(), pool_stream());
        let a = DeviceBuffer::<u8>::new(owner, 3 * MIB).unwrap();
        let b = DeviceBuffer::<u8>::new(owner, 2 * MIB).unwrap();
        let c = DeviceBuffer::<u8>::new(owner, 2 * MIB).unwrap();
        let a_at = a.operand().unwrap();
        b.record_stream(other).unwrap();
        drop(b);
        other.synchronize().unwrap();
        drop(a);
        let d = DeviceBuffer::<u8>::new(owner, 2 * MIB).unwrap();
        assert_eq!(d.operand().unwrap(), a_at);
        // `a`'s 3 MiB and `c`'s 2 MiB (with `b` taken instead: 2 + 2).
        assert_eq!(memory_allocated(Device::CURRENT).unwrap(), 5 * MIB as u64);
        assert_eq!(stats().device_allocations, 1);
        drop((c, d));
    });
}

#[test]
fn blocks_split_and_merge_within_a_segment() {
    isolated!(&[MOCK], || {
        const HALF: usize = SMALL_REQUEST as usize / 2;
        let stream = pool_stream();
        let a = DeviceBuffer::<u8>::new(stream, HALF).unwrap();
        let b = DeviceBuffer::<u8>::new(stream, HALF).unwrap();
        let (a_at, b_at) = (a.operand().unwrap(), b.operand().unwrap());
        assert_eq!(a_at.region_id, b_at.region_id);
        assert_eq!(
            b_at.offset,
            a_at.offset + HALF as u64,
            "split from one segment"
        );
        // The rest of the 2 MiB segment: 1 MiB, no block larger is free.
        let rest = DeviceBuffer::<u8>::new(stream, SMALL_REQUEST as usize).unwrap();
        assert_eq!(SMALL_SEGMENT, 2 * SMALL_REQUEST);
        drop(a);
        drop(b);
        // Only `a` and `b` merged hold 1 MiB now; each alone would leave a
        // request of 1 MiB to a new segment.
        let merged = DeviceBuffer::<u8>::new(stream, SMALL_REQUEST as usize).unwrap();
        assert_eq!(merged.operand().unwrap(), a_at);
        assert_eq!(stats().device_allocations, 1);
        drop((rest, merged));
    });
}

/// A small request is not cut from a large segment (PyTorch's small and
/// large pools): a 512-byte buffer made after a 100 MiB one was dropped
/// takes a 2 MiB segment of its own, the 100 MiB segment serves the next
/// 100 MiB buffer, and once that is dropped `empty_cache` gives the whole
/// 100 MiB back. Cut from it, the small buffer would pin it: a second
/// 100 MiB segment, and 100 MiB kept after `empty_cache`.
#[test]
fn a_small_buffer_is_not_cut_from_a_large_segment() {
    isolated!(&[MOCK], || {
        const BIG: usize = 100 << 20;
        let stream = pool_stream();
        drop(DeviceBuffer::<u8>::new(stream, BIG).unwrap());
        let small = DeviceBuffer::<u8>::new(stream, 512).unwrap();
        let big = DeviceBuffer::<u8>::new(stream, BIG).unwrap();
        assert_eq!(
            stats().device_allocations,
            2,
            "the 100 MiB segment, then 2 MiB"
        );
        assert_eq!(
            memory_reserved(Device::CURRENT).unwrap(),
            BIG as u64 + SMALL_SEGMENT
        );
        drop(big);
        empty_cache(Device::CURRENT).unwrap();
        assert_eq!(memory_reserved(Device::CURRENT).unwrap(), SMALL_SEGMENT);
        drop(small);
    });
}

#[test]
fn a_block_is_cached_for_its_own_stream_only() {
    isolated!(&[MOCK], || {
        let (a, b) = (pool_stream(), pool_stream());
        drop(DeviceBuffer::<u8>::new(a, 100).unwrap());
        let on_b = DeviceBuffer::<u8>::new(b, 100).unwrap();
        assert_eq!(stats().device_allocations, 2, "b took a segment of its own");
        drop(on_b);
    });
}

#[test]
fn memory_used_on_another_stream_is_reused_only_after_that_stream_passes_the_drop() {
    isolated!(&[MOCK], || {
        let (owner, other) = (pool_stream(), pool_stream());
        // 2 MiB: the first block of a 20 MiB segment, the rest cached.
        let buffer = DeviceBuffer::<u8>::new(owner, 2 << 20).unwrap();
        let address = buffer.address().clone();
        let gate = hold(other);
        buffer.record_stream(other).unwrap();
        drop(buffer);
        assert_eq!(stats().pending_frees, 1, "waits for `other`");
        assert_eq!(stats().allocated_bytes, 0);
        let meanwhile = DeviceBuffer::<u8>::new(owner, 2 << 20).unwrap();
        assert_ne!(
            meanwhile.address(),
            &address,
            "not reused while `other` is held"
        );
        gate.open();
        other.synchronize().unwrap();
        assert_eq!(stats().pending_frees, 0);
        // Best fit (with `meanwhile` still held): the 2 MiB block at the
        // start, not the 16 MiB after `meanwhile`.
        let later = DeviceBuffer::<u8>::new(owner, 2 << 20).unwrap();
        assert_eq!(later.address(), &address);
        assert_eq!(stats().device_allocations, 1);
        drop(meanwhile);
    });
}

#[test]
fn a_full_device_empties_the_cache_and_retries_once() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (a, b) = (pool_stream(), pool_stream());
        // 3 MiB: the 20 MiB segment does not fit, the request itself does.
        drop(DeviceBuffer::<u8>::new(a, 3 << 20).unwrap());
        assert_eq!(stats().reserved_bytes, 3 * MIB);
        // `b` cannot use `a`'s cache; 1 MiB is free on the device. The
        // allocator returns `a`'s segment and tries again.
        let on_b = DeviceBuffer::<u8>::new(b, 2 << 20).unwrap();
        let s = stats();
        assert_eq!((s.alloc_retries, s.device_frees), (1, 1));
        assert_eq!(s.reserved_bytes, 2 * MIB);

        let error = DeviceBuffer::<u8>::new(a, 3 << 20).unwrap_err();
        let Error::OutOfMemory(details) = &error else {
            panic!("expected OutOfMemory, got {error:?}");
        };
        let OutOfMemory {
            requested,
            device_free,
            cached,
            largest_cached,
            ..
        } = **details;
        assert_eq!(requested, 3 * MIB);
        assert_eq!(device_free, Some(2 * MIB));
        assert_eq!((cached, largest_cached), (0, 0));
        let message = error.to_string();
        assert!(
            message.contains("3145728 bytes") && message.contains("2097152 bytes free"),
            "{message}"
        );
        assert_eq!(stats().out_of_memory, 1);
        drop(on_b);
    });
}

/// A request no retry could serve fails at once: the cache stays, no
/// stream is waited for. Before, the stream's cached segment went back to
/// the device (a retry and a device free counted) before the same error.
#[test]
fn a_request_larger_than_the_device_fails_at_once_and_keeps_the_cache() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let stream = pool_stream();
        drop(DeviceBuffer::<u8>::new(stream, 3 << 20).unwrap());
        let before = stats();
        assert_eq!(before.reserved_bytes, 3 * MIB);

        let error = DeviceBuffer::<u8>::new(stream, (4 << 20) + 1).unwrap_err();
        let Error::OutOfMemory(details) = &error else {
            panic!("expected OutOfMemory, got {error:?}");
        };
        assert_eq!(
            (details.requested, details.device_total),
            ((4 << 20) + 1, Some(4 * MIB))
        );
        let message = error.to_string();
        assert!(
            message.starts_with(
                "out of device memory: cannot allocate 4194305 bytes, more than the device's \
                 4194304 bytes in all; allocate at most 4194304 bytes"
            ),
            "{message}"
        );
        let after = stats();
        assert_eq!(
            (
                after.alloc_retries,
                after.device_frees,
                after.reserved_bytes
            ),
            (before.alloc_retries, before.device_frees, 3 * MIB),
            "the cache was returned for a request that cannot fit"
        );
        assert_eq!(after.out_of_memory, before.out_of_memory + 1);
        // Memory the device has is still given.
        drop(DeviceBuffer::<u8>::new(stream, 4 << 20).unwrap());
    });
}

/// The same where only the request's whole blocks exceed the device: 4 MiB
/// less 128 bytes of memory, asked for whole, is 4 MiB in blocks of 512.
#[test]
fn a_request_whose_blocks_exceed_the_device_fails_at_once_naming_them() {
    isolated!(
        &[
            MOCK,
            ("SPYRE_MOCK_MEMORY_BYTES", "4194176"),
            ("SPYRE_MOCK_REGION_BYTES", "4194176"),
        ],
        || {
            let error = DeviceBuffer::<u8>::new(pool_stream(), 4_194_176).unwrap_err();
            let message = error.to_string();
            assert!(
                message.starts_with(
                    "out of device memory: cannot allocate 4194176 bytes (4194304 in the \
                     allocator's blocks of 512), more than the device's 4194176 bytes in all; \
                     allocate at most 4193792 bytes"
                ),
                "{message}"
            );
            assert_eq!(stats().alloc_retries, 0, "no retry for what cannot fit");
        }
    );
}

/// Out of memory while the runtime's memory query fails: the message says
/// the query failed, with its error, not "flex ABI 1.0" (the library is
/// 1.1). Before, every unknown amount was put down to ABI 1.0.
#[test]
fn out_of_memory_names_a_failed_memory_query() {
    let library = spyre_tests::mock_cdylib().to_str().unwrap().to_owned();
    isolated!(
        &[
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", &library),
            ("SPYRE_MOCK_MEMORY_BYTES", "4194304"),
            (
                "SPYRE_MOCK_UNDEFINED_STATUS",
                "flex_runtime_get_memory_info"
            ),
        ],
        || {
            let error = DeviceBuffer::<u8>::new(pool_stream(), 16 << 20).unwrap_err();
            let Error::OutOfMemory(details) = &error else {
                panic!("expected OutOfMemory, got {error:?}");
            };
            assert_eq!((details.device_free, details.device_total), (None, None));
            let message = error.to_string();
            assert!(
                message.contains("the device has an unknown amount (its memory query failed: ")
                    && message.contains("977")
                    && !message.contains("ABI 1.0"),
                "{message}"
            );
        }
    );
}

#[test]
fn a_raw_free_of_a_buffers_segment_is_refused_and_frees_nothing() {
    // A buffer above LARGE_SEGMENT_LIMIT has a segment of its own, so its
    // address is a live device allocation: the runtime alone would free
    // it, and the next allocate would hand the buffer's memory out again.
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let mut buffer = DeviceBuffer::<u8>::zeros(stream, 20 << 20).unwrap();
        buffer.fill(stream, 7).unwrap();
        let before = stats();
        let err = spyre_stream::free(Device::CURRENT, buffer.address()).unwrap_err();
        assert!(
            matches!(&err, Error::Flex(e) if e.status() == spyre_stream::Status::INVALID_ARGUMENT),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&format!(
                "{} is memory of the caching allocator",
                buffer.address()
            )) && message.contains("drop the DeviceBuffer instead"),
            "{message}"
        );
        assert_eq!(stats(), before);
        // Still the buffer's: a raw allocation of the same size gets other
        // memory, and writing it leaves the buffer as it was.
        let raw = spyre_stream::allocate(Device::CURRENT, 20 << 20).unwrap();
        assert_ne!(&raw, buffer.address());
        stream
            .launch_fill(&raw, 9.0, DataFormat::Uint8, LaunchOptions::new())
            .unwrap();
        assert!(buffer.to_vec(stream).unwrap().iter().all(|&b| b == 7));
        spyre_stream::free(Device::CURRENT, &raw).unwrap();
        // A small buffer's address, a part of a segment: refused as memory
        // of the allocator too (the device's message, "not a live
        // allocation", did not say whose it was), nothing freed.
        let small = DeviceBuffer::<f32>::new(stream, 10).unwrap();
        let before = stats();
        let err = spyre_stream::free(Device::CURRENT, small.address()).unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "{} is memory of the caching allocator",
                small.address()
            )),
            "{err}"
        );
        assert_eq!(stats(), before);
    },);
}

#[test]
fn a_raw_free_of_a_segment_on_its_way_back_to_the_device_is_refused() {
    // `empty_cache` takes a stream's wholly free segments out of its table,
    // then waits for the stream (held here) before it frees them. A raw
    // free of such a segment in between would free it, the device could
    // hand it to the next `allocate`, and `empty_cache` would then free
    // that caller's memory.
    isolated!(&[], || {
        let backend = SpyBackend::new(MockSystem::default());
        spyre_stream::set_backend(Box::new(backend.clone())).unwrap();
        let stream = pool_stream();
        // A segment of its own, cached once the buffer is dropped.
        let address = DeviceBuffer::<u8>::zeros(stream, 20 << 20)
            .unwrap()
            .address()
            .clone();
        let gate = hold(stream);
        let runtime = backend.runtime().unwrap();
        let id = spyre_stream::global_pool()
            .unwrap()
            .resolve(stream)
            .unwrap()
            .id();
        std::thread::scope(|scope| {
            let emptying = scope.spawn(|| empty_cache(Device::CURRENT).unwrap());
            // `empty_cache` waits for the held stream: the segment is out
            // of the table and not yet freed.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !runtime.synchronize_log().contains(&id) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "empty_cache never waited"
                );
                std::thread::yield_now();
            }
            let err = spyre_stream::free(Device::CURRENT, &address).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("{address} is memory of the caching allocator")),
                "{err}"
            );
            gate.open();
            assert_eq!(emptying.join().unwrap(), 20 << 20);
        });
        assert_eq!(stats().reserved_bytes, 0);
    },);
}

#[test]
fn bad_lengths_are_named_errors() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let zero = DeviceBuffer::<f32>::new(stream, 0).unwrap_err();
        assert!(
            zero.to_string().contains("at least one element, got 0"),
            "{zero}"
        );
        let overflow = DeviceBuffer::<f32>::new(stream, usize::MAX).unwrap_err();
        assert!(overflow.to_string().contains("overflow"), "{overflow}");
        let huge = DeviceBuffer::<u8>::new(stream, 1 << 40).unwrap_err();
        assert!(
            matches!(&huge, Error::OutOfMemory(d) if d.requested == 1 << 40),
            "{huge:?}"
        );

        let mut buffer = DeviceBuffer::<f32>::new(stream, 4).unwrap();
        let short = buffer.copy_from_host(stream, &[1.0; 3]).unwrap_err();
        assert!(
            matches!(
                short,
                Error::LengthMismatch {
                    buffer: 4,
                    host: 3,
                    unit: "elements",
                    ..
                }
            ),
            "{short:?}"
        );
        assert_eq!(
            short.to_string(),
            "copy_from_host: the device buffer holds 4 elements but the host side has 3; the lengths must be equal"
        );
        let bytes = buffer
            .copy_to_host_buffer(stream, &HostBuffer::zeroed(15))
            .unwrap_err();
        assert!(
            matches!(
                bytes,
                Error::LengthMismatch {
                    buffer: 16,
                    host: 15,
                    unit: "bytes",
                    ..
                }
            ),
            "{bytes:?}"
        );
        let mut out = [0f32; 5];
        assert!(buffer.copy_to_host(stream, &mut out).is_err());
        assert_eq!(
            stats().allocated_bytes,
            MIN_BLOCK,
            "the failures leaked nothing"
        );
    });
}

/// The classic mistake: a buffer read on another stream without declaring
/// it (`record_stream`), dropped, and its memory handed out again while
/// that read is still queued.
fn reuse_behind_an_undeclared_read(declare: bool) -> (spyre_stream::Result<()>, bool, [u64; 2]) {
    let (owner, other) = (pool_stream(), pool_stream());
    let mut buffer = DeviceBuffer::<u8>::new(owner, 4096).unwrap();
    buffer.fill(owner, 1).unwrap();
    owner.synchronize().unwrap();
    let gate = hold(other);
    let host = HostBuffer::zeroed(4096);
    // Operation 2 of `other`, after the held callback.
    other
        .launch_d2h(buffer.address(), &host, LaunchOptions::new())
        .unwrap();
    if declare {
        buffer.record_stream(other).unwrap();
    }
    let address = buffer.address().clone();
    drop(buffer);
    let mut again = DeviceBuffer::<u8>::new(owner, 4096).unwrap();
    let reused = again.address() == &address;
    // Operation 2 of `owner`: runs at once, while the read waits.
    again.fill(owner, 7).unwrap();
    let outcome = owner.synchronize();
    gate.open();
    let _ = other.synchronize();
    let pool = spyre_stream::global_pool().unwrap();
    let ids = [owner, other].map(|s| pool.resolve(s).unwrap().id());
    (outcome, reused, ids)
}

#[test]
fn the_device_reports_memory_reused_while_another_stream_still_reads_it() {
    isolated!(&[MOCK, ("SPYRE_MOCK_CHECK_REUSE", "1")], || {
        let (outcome, reused, [owner, other]) = reuse_behind_an_undeclared_read(false);
        assert!(
            reused,
            "undeclared: the block went straight back to its stream"
        );
        let error = outcome.unwrap_err().to_string();
        assert!(
            error.contains(&format!(
                "use after free: launch_fill (operation 2 of stream {owner}) touches region"
            )) && error.contains(&format!(
                "while launch_d2h (operation 2 of stream {other}), enqueued before that, had not completed"
            )),
            "{error}"
        );
    });
}

#[test]
fn the_device_reports_raw_memory_handed_out_again_under_a_queued_read() {
    isolated!(&[MOCK, ("SPYRE_MOCK_CHECK_REUSE", "1")], || {
        let (reader, writer) = (pool_stream(), pool_stream());
        let size = 256 << 10;
        let first = spyre_stream::allocate(Device::CURRENT, size).unwrap();
        let gate = hold(reader);
        let host = HostBuffer::zeroed(size as usize);
        reader
            .launch_d2h(&first, &host, LaunchOptions::new())
            .unwrap();
        // Freed while the D2H is queued: the caller's mistake.
        spyre_stream::free(Device::CURRENT, &first).unwrap();
        let second = spyre_stream::allocate(Device::CURRENT, size).unwrap();
        assert_eq!(second, first, "the same memory handed out again");
        writer
            .launch_fill(&second, 1.0, DataFormat::Fp32, LaunchOptions::new())
            .unwrap();
        let error = writer.synchronize().unwrap_err().to_string();
        assert!(
            error.contains("use after free: launch_fill") && error.contains("while launch_d2h"),
            "{error}"
        );
        gate.open();
        reader.synchronize().unwrap();
    });
}

#[test]
fn a_declared_use_defers_the_reuse_and_the_device_finds_nothing() {
    isolated!(&[MOCK, ("SPYRE_MOCK_CHECK_REUSE", "1")], || {
        let (outcome, reused, _) = reuse_behind_an_undeclared_read(true);
        assert!(!reused, "declared: the block waits for the other stream");
        outcome.unwrap();
    });
}

#[test]
fn without_the_detector_the_same_mistake_goes_unseen() {
    isolated!(&[MOCK], || {
        let (outcome, reused, _) = reuse_behind_an_undeclared_read(false);
        assert!(reused);
        outcome.unwrap();
    });
}

/// Device of 8 MiB in regions of 2 MiB for the sizes property.
const SMALL_DEVICE: [(&str, &str); 3] = [
    MOCK,
    ("SPYRE_MOCK_MEMORY_BYTES", "8388608"),
    ("SPYRE_MOCK_REGION_BYTES", "2097152"),
];

fn any_len() -> impl proptest::strategy::Strategy<Value = usize> {
    use proptest::prelude::*;
    const MEMORY: usize = 8 << 20;
    const REGION: usize = 2 << 20;
    prop_oneof![
        Just(0),
        Just(1),
        (0..5_000usize).prop_map(|k| 2 * k + 1),
        Just(REGION - 1),
        Just(REGION),
        Just(REGION + 1),
        Just(MEMORY),
        Just(MEMORY + 1),
        (MEMORY + 1..=usize::MAX),
        Just(usize::MAX),
    ]
}

#[test]
fn every_size_is_a_buffer_or_a_named_error() {
    use proptest::prelude::*;
    isolated!(&SMALL_DEVICE, || {
        let stream = pool_stream();
        let memory = 8u64 << 20;
        proptest!(ProptestConfig::with_cases(64), |(len in any_len())| {
            match DeviceBuffer::<u8>::new(stream, len) {
                Ok(buffer) => {
                    // Anything up to the whole device fits: the allocator
                    // returns its cache to the device when it must.
                    prop_assert!(len >= 1 && len as u64 <= memory, "{len}");
                    prop_assert_eq!(buffer.len(), len);
                    prop_assert_eq!(buffer.size_bytes(), len as u64);
                    prop_assert_eq!(buffer.address().total_size(), len as u64);
                }
                Err(Error::Flex(error)) if len == 0 => {
                    prop_assert!(error.to_string().contains("at least one element, got 0"), "{}", error);
                }
                Err(Error::Flex(error)) => {
                    // Only sizes that overflow when rounded to a block.
                    prop_assert!(len as u64 > u64::MAX - MIN_BLOCK, "{len}: {error}");
                    prop_assert!(error.to_string().contains("overflows when rounded"), "{}", error);
                }
                Err(Error::OutOfMemory(details)) => {
                    prop_assert!(len as u64 > memory, "{len}: {details}");
                    prop_assert_eq!(details.requested, len as u64);
                    let expected = format!("cannot allocate {len} bytes");
                    prop_assert!(details.to_string().contains(&expected), "{}", details);
                }
                Err(other) => prop_assert!(false, "{len}: unexpected {other:?}"),
            }
            prop_assert_eq!(memory_allocated(Device::CURRENT).unwrap(), 0);
        });
        // f32: a length whose byte size overflows is named as such.
        let overflow = DeviceBuffer::<f32>::new(stream, usize::MAX / 2).unwrap_err();
        assert!(overflow.to_string().contains("overflow u64"), "{overflow}");
    });
}

#[test]
fn empty_cache_returns_blocks_whose_other_streams_have_passed() {
    isolated!(&[MOCK], || {
        let (owner, other) = (pool_stream(), pool_stream());
        let buffer = DeviceBuffer::<u8>::new(owner, 4096).unwrap();
        let gate = hold(other);
        buffer.record_stream(other).unwrap();
        drop(buffer);
        gate.open();
        other.synchronize().unwrap();
        // The block waited for `other`, which has passed: its segment is
        // whole again and goes back to the device.
        assert_eq!(empty_cache(Device::CURRENT).unwrap(), SMALL_SEGMENT);
        assert_eq!(stats().reserved_bytes, 0);
    });
}

/// Without events (a flex library of ABI 1.0) a block freed in another
/// stream's order waits until that stream is idle. `empty_cache`
/// synchronizes that stream, and so returns the block's segment even when
/// the stream was given more work once the synchronize had begun: the
/// work before the drop has ended, which is all the block waited for.
#[test]
fn without_events_empty_cache_returns_a_block_whose_other_stream_it_waited_for() {
    let library = spyre_tests::mock_cdylib().to_str().unwrap().to_owned();
    isolated!(
        &[
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", &library),
            ("SPYRE_MOCK_ABI_VERSION", "1.0"),
        ],
        || {
            let (owner, other) = (pool_stream(), pool_stream());
            // The case needs `empty_cache`'s synchronize of `other` to have
            // begun when `other` is given more work (200 ms after the call);
            // on a loaded machine it may not have, and then the more work is
            // waited for too (released after 2 s) and `other` is idle after:
            // that attempt tells nothing, and is made again.
            for _ in 0..3 {
                let buffer = DeviceBuffer::<u8>::new(owner, 4096).unwrap();
                buffer.record_stream(other).unwrap();
                let (gate, later) = (Gate::new(), Gate::new());
                let (waiter, held) = (Arc::clone(&gate), Arc::clone(&later));
                other
                    .launch_host_callback(
                        move || {
                            waiter.wait();
                            other
                                .launch_host_callback(move || held.wait(), LaunchOptions::new())
                                .expect("launch");
                        },
                        LaunchOptions::new(),
                    )
                    .unwrap();
                drop(buffer);
                assert_eq!(stats().pending_frees, 1, "`other` is busy");
                let (_, opener) = open_later(gate, std::time::Duration::from_millis(200));
                // Not joined: it opens an open gate in the case that tells.
                let _fallback = open_later(Arc::clone(&later), std::time::Duration::from_secs(2));
                let returned = empty_cache(Device::CURRENT).unwrap();
                let busy_again = !other.query().unwrap();
                let after = (stats().pending_frees, stats().reserved_bytes);
                later.open();
                other.synchronize().unwrap();
                opener.join().unwrap();
                if busy_again {
                    assert_eq!(returned, SMALL_SEGMENT);
                    assert_eq!(after, (0, 0));
                    return;
                }
                // The segment went back as `other` was idle: start again.
                assert_eq!(after, (0, 0));
            }
            panic!("empty_cache's synchronize never began before `other` was given more work");
        }
    );
}

/// Opens `gate` from another thread after `delay`, setting `opened` first:
/// what a test checks the allocation waited for.
fn open_later(
    gate: Arc<Gate>,
    delay: std::time::Duration,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let opened = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&opened);
    let opener = std::thread::spawn(move || {
        std::thread::sleep(delay);
        flag.store(true, Ordering::SeqCst);
        gate.open();
    });
    (opened, opener)
}

#[test]
fn threads_retrying_on_a_full_device_at_once_each_get_the_memory_they_return() {
    // Seven threads each keep four buffers live, each on the next pool
    // stream of both priorities in turn (64 streams): 28 segments of the
    // device's 32 (a segment is 1/32 of the device, 128 KiB, and holds one
    // buffer), the rest cached for idle streams. With 64 streams taking
    // turns, a stream's cached segment is mostly gone by its next turn, so
    // new segments need the retry whatever the threads' timing. Memory one
    // thread returns must not go to another thread's new segment before
    // its own request, or both can fail although four segments' worth is
    // spare.
    isolated!(&FOUR_MIB_DEVICE, || {
        const THREADS: usize = 7;
        const LIVE: usize = 4;
        const ROUNDS: usize = 400;
        on_threads_no_allocation_fails(THREADS, |thread| {
            let mut live = std::collections::VecDeque::new();
            for round in 0..ROUNDS {
                if live.len() == LIVE {
                    live.pop_front();
                }
                let priority = -i32::from(round % 2 == 1);
                let stream = stream_from_pool(Device::CURRENT, priority).unwrap();
                match DeviceBuffer::<u8>::new(stream, 100 << 10) {
                    Ok(buffer) => live.push_back(buffer),
                    Err(error) => panic!("thread {thread}, round {round}: {error}"),
                }
            }
        });
    });
}

/// Runs `work(thread)` on `threads` threads at once, then checks that the
/// device was full at some point (the allocator retried) and that no
/// allocation failed.
fn on_threads_no_allocation_fails(threads: usize, work: fn(usize)) {
    let workers: Vec<_> = (0..threads)
        .map(|thread| std::thread::spawn(move || work(thread)))
        .collect();
    for worker in workers {
        worker.join().expect("no allocation failed");
    }
    let s = stats();
    assert_eq!(s.out_of_memory, 0);
    assert!(s.alloc_retries > 0, "the device was full: {s:?}");
}

#[test]
fn a_waiting_retry_gets_the_memory_its_wait_frees_while_other_threads_allocate() {
    // Four threads each hold one 3 MiB buffer at a time on a 16 MiB device
    // (five 3 MiB segments fit), each iteration on the next pool stream,
    // dropping the buffer behind 300 µs of queued work (a host callback):
    // the cache is then
    // mostly segments of busy streams, and a full device's retry must wait
    // for them. At most 12 MiB is ever in use, so no allocation may fail;
    // before, the memory one retry's wait freed went to other threads'
    // retries meanwhile, and their buffers, dropped on busy streams again,
    // left it nothing.
    let device = [MOCK, ("SPYRE_MOCK_MEMORY_BYTES", "16777216")];
    isolated!(&device, || {
        const THREADS: usize = 4;
        const ROUNDS: usize = 60;
        on_threads_no_allocation_fails(THREADS, |thread| {
            for round in 0..ROUNDS {
                let priority = -i32::from((thread + round) % 2 == 1);
                let stream = stream_from_pool(Device::CURRENT, priority).unwrap();
                let buffer = match DeviceBuffer::<u8>::new(stream, 3 << 20) {
                    Ok(buffer) => buffer,
                    Err(error) => panic!("thread {thread}, round {round}: {error}"),
                };
                stream
                    .launch_host_callback(
                        || std::thread::sleep(std::time::Duration::from_micros(300)),
                        LaunchOptions::new(),
                    )
                    .unwrap();
                drop(buffer);
            }
        });
    });
}

#[test]
fn a_host_callback_allocating_while_a_retry_waits_for_its_stream_neither_blocks_nor_loses_its_cache()
 {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (s, x, t, u) = (pool_stream(), pool_stream(), pool_stream(), pool_stream());
        // The device is full: 2 MiB live on `x`, 2 MiB cached for `s`.
        let live = DeviceBuffer::<u8>::new(x, 2 << 20).unwrap();
        drop(DeviceBuffer::<u8>::new(s, 2 << 20).unwrap());
        let gate = hold(s);
        let results = Arc::new(std::sync::Mutex::new(Vec::new()));
        for (name, on) in [("own stream", s), ("other stream", u)] {
            let results = Arc::clone(&results);
            s.launch_host_callback(
                move || {
                    let outcome = DeviceBuffer::<u8>::new(on, 1 << 20).map(drop);
                    results.lock().unwrap().push((name, outcome));
                },
                LaunchOptions::new(),
            )
            .unwrap();
        }
        // A retry on `t` finds `s` busy and waits for it, holding its
        // cached segment.
        let (done, finished) = std::sync::mpsc::channel();
        let retry = std::thread::spawn(move || {
            let outcome = DeviceBuffer::<u8>::new(t, 2 << 20).map(drop);
            done.send(outcome).unwrap();
        });
        // The retry has begun (it counts itself first) and, `s` held
        // busy, can only be waiting for `s` when the gate opens.
        while stats().alloc_retries == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            finished.try_recv().is_err(),
            "the retry ended before `s` was released"
        );
        gate.open();
        let outcome = finished
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the retry ends: no callback waits for it");
        assert!(outcome.is_ok(), "{outcome:?}");
        retry.join().unwrap();
        let results = results.lock().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0].0, "own stream");
        assert!(results[0].1.is_ok(), "{:?}", results[0].1);
        assert_eq!(results[1].0, "other stream");
        assert!(
            matches!(results[1].1, Err(Error::OutOfMemory(_))),
            "{:?}",
            results[1].1
        );
        drop(live);
    });
}

#[test]
fn a_full_device_waits_for_a_busy_stream_whose_cached_memory_it_needs() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (a, b) = (pool_stream(), pool_stream());
        drop(DeviceBuffer::<u8>::new(a, 3 << 20).unwrap());
        // `a` is busy: its cached segment can go back to the device only
        // once its work has ended, and only that makes room for `b`.
        let (opened, opener) = open_later(hold(a), std::time::Duration::from_millis(200));
        let on_b = DeviceBuffer::<u8>::new(b, 2 << 20).unwrap();
        assert!(
            opened.load(Ordering::SeqCst),
            "`a`'s memory went back to the device while `a` was still busy"
        );
        let s = stats();
        assert_eq!((s.alloc_retries, s.device_frees), (1, 1));
        assert_eq!(s.reserved_bytes, 2 * MIB);
        drop(on_b);
        opener.join().unwrap();
    });
}

#[test]
fn memory_freed_before_the_wait_goes_back_though_the_stream_was_given_more_work() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (a, b) = (pool_stream(), pool_stream());
        drop(DeviceBuffer::<u8>::new(a, 3 << 20).unwrap());
        let first = hold(a);
        // While the allocation below waits for `a`, `a` is given more work
        // (held again) before its first hold ends: `a` is never idle, but
        // its segment was freed before the wait began, so nothing after
        // the wait can use it.
        let opener = std::thread::spawn(move || {
            // Long enough for the allocation to be waiting by then.
            std::thread::sleep(std::time::Duration::from_millis(500));
            let second = hold(a);
            first.open();
            second
        });
        let on_b = DeviceBuffer::<u8>::new(b, 2 << 20).unwrap();
        let second = opener.join().unwrap();
        assert!(!a.query().unwrap(), "`a` still runs its second hold");
        assert_eq!(stats().device_frees, 1);
        second.open();
        drop(on_b);
    });
}

#[test]
fn a_full_device_gives_back_the_callers_own_busy_streams_cache() {
    // The attack's case: the caller's only stream still has copies queued
    // behind a host callback; the buffers are dropped (cached for it) and
    // a larger buffer is asked for on the same stream.
    isolated!(&FOUR_MIB_DEVICE, || {
        let stream = pool_stream();
        let (opened, opener) = open_later(hold(stream), std::time::Duration::from_millis(200));
        let hosts: Vec<HostBuffer> = (0..3).map(|_| HostBuffer::zeroed(1 << 20)).collect();
        {
            let buffers: Vec<DeviceBuffer<u8>> = (0..3)
                .map(|_| DeviceBuffer::<u8>::new(stream, 1 << 20).unwrap())
                .collect();
            for (buffer, host) in buffers.iter().zip(&hosts) {
                buffer.copy_to_host_buffer(stream, host).unwrap();
            }
        }
        assert_eq!(stats().reserved_bytes, 3 * MIB);
        let large = DeviceBuffer::<u8>::new(stream, (3 << 20) + 1).unwrap();
        assert!(opened.load(Ordering::SeqCst), "returned while busy");
        assert_eq!(large.address().chunks().len(), 1, "one chunk, an operand");
        assert_eq!(stats().device_frees, 3);
        drop(large);
        opener.join().unwrap();
    });
}

#[test]
fn a_full_device_does_not_wait_when_idle_streams_give_back_enough() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (busy, idle, b) = (pool_stream(), pool_stream(), pool_stream());
        drop(DeviceBuffer::<u8>::new(busy, 2 << 20).unwrap());
        drop(DeviceBuffer::<u8>::new(idle, 2 << 20).unwrap());
        idle.synchronize().unwrap();
        let gate = hold(busy);
        // The idle stream's 2 MiB is enough: `busy` (held until the gate
        // opens, or 20 s) is not waited for and keeps its segment.
        let on_b = DeviceBuffer::<u8>::new(b, 2 << 20).unwrap();
        let s = stats();
        assert_eq!((s.alloc_retries, s.device_frees), (1, 1));
        assert_eq!(s.reserved_bytes, 4 * MIB, "`busy`'s 2 MiB and `b`'s 2 MiB");
        gate.open();
        drop(on_b);
        assert_eq!(empty_cache(Device::CURRENT).unwrap(), 4 * MIB);
    });
}

/// Fills the rest of the device (the default 1 GiB in 256 MiB regions)
/// with one raw allocation, returned to be freed.
/// Whether each of two empty launches on `stream` carried a pipeline
/// barrier, read from a trace of them.
fn next_launch_barriers(stream: SpyreStream) -> Vec<bool> {
    spyre_stream::start_trace();
    for _ in 0..2 {
        stream
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
    }
    stream.synchronize().unwrap();
    let trace = spyre_stream::stop_trace();
    trace.entries.iter().map(|e| e.pipeline_barrier).collect()
}

fn fill_the_device() -> spyre_stream::CompositeAddress {
    let free = spyre_stream::memory_info(Device::CURRENT)
        .unwrap()
        .free_bytes;
    spyre_stream::allocate(Device::CURRENT, free).unwrap()
}

/// On a full device, a small request takes a cached block of its stream's
/// large pool in a segment a buffer still uses (a 2 MiB buffer of a 20 MiB
/// segment leaves 18 MiB free there), at once: no retry, nothing returned
/// to the device. Before, it waited for the retry and took the block only
/// as the last resort (counted as a retry).
#[test]
fn a_full_device_serves_a_small_request_from_a_large_segment_in_use() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let big = DeviceBuffer::<u8>::new(stream, 2 << 20).unwrap();
        let filled = fill_the_device();
        let small = DeviceBuffer::<u8>::new(stream, 512).unwrap();
        let (at, big_at) = (small.operand().unwrap(), big.operand().unwrap());
        assert_eq!(
            (at.region_id, at.offset),
            (big_at.region_id, big_at.offset + (2 << 20)),
            "right after the 2 MiB buffer"
        );
        let s = stats();
        assert_eq!(
            (s.alloc_retries, s.device_frees, s.device_allocations),
            (0, 0, 1)
        );
        // A block of the stream's own cache: its next launch carries a
        // pipeline barrier.
        assert_eq!(next_launch_barriers(stream), [true, false]);
        drop((small, big));
        spyre_stream::free(Device::CURRENT, &filled).unwrap();
    });
}

/// On a full device, a small request does not cut a large segment that
/// is one free block (a dropped 2 MiB buffer's 20 MiB segment): the retry
/// returns it to the device and takes a 2 MiB small segment. Cut, it would
/// stay pinned by 512 bytes (20 MiB reserved, nothing returned).
#[test]
fn a_full_device_returns_a_free_large_segment_rather_than_cut_it() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        drop(DeviceBuffer::<u8>::new(stream, 2 << 20).unwrap());
        let filled = fill_the_device();
        let small = DeviceBuffer::<u8>::new(stream, 512).unwrap();
        let s = stats();
        assert_eq!((s.alloc_retries, s.device_frees), (1, 1));
        assert_eq!(s.reserved_bytes, SMALL_SEGMENT);
        drop(small);
        spyre_stream::free(Device::CURRENT, &filled).unwrap();
    });
}

/// On the 4 MiB device: `owner`'s 128 KiB segment holds a live 64 KiB
/// buffer and a cached 64 KiB block (returned as its address), and a
/// buffer on `filler` takes the rest of the device.
fn a_full_device_with_a_block_cached_for(
    owner: SpyreStream,
    filler: SpyreStream,
) -> (
    DeviceBuffer<u8>,
    DeviceBuffer<u8>,
    flex_rt::CompositeAddress,
) {
    let live = DeviceBuffer::<u8>::new(owner, 64 << 10).unwrap();
    let cached = DeviceBuffer::<u8>::new(owner, 64 << 10).unwrap();
    let address = cached.address().clone();
    drop(cached);
    let rest = DeviceBuffer::<u8>::new(filler, (4 << 20) - (128 << 10)).unwrap();
    let s = stats();
    assert_eq!(s.reserved_bytes, 4 * MIB, "the device is full: {s:?}");
    assert_eq!(s.device_allocations, 2, "{s:?}");
    (live, rest, address)
}

/// On the device [`a_full_device_with_a_block_cached_for`] fills: still
/// its 2 device allocations, `out_of_memory` failed allocations, and
/// every byte of the device in a buffer.
fn assert_full_in_buffers(out_of_memory: u64) {
    let s = stats();
    assert_eq!(
        (s.device_allocations, s.out_of_memory),
        (2, out_of_memory),
        "{s:?}"
    );
    assert_eq!(
        s.allocated_bytes,
        4 * MIB,
        "every byte of the device in a buffer"
    );
}

/// [`FOUR_MIB_DEVICE`] with waits that block the host, like today's
/// Spyre card.
const FOUR_MIB_DEVICE_HOST_WAIT: [(&str, &str); 4] = [
    MOCK,
    ("SPYRE_MOCK_MEMORY_BYTES", "4194304"),
    ("SPYRE_MOCK_REGION_BYTES", "4194304"),
    ("SPYRE_MOCK_DEVICE_SIDE_WAIT", "0"),
];

#[test]
fn a_full_device_lends_a_finished_streams_cached_block_to_another_stream() {
    isolated!(&FOUR_MIB_DEVICE_HOST_WAIT, || {
        let (owner, filler, borrower) = (pool_stream(), pool_stream(), pool_stream());
        let (live, rest, address) = a_full_device_with_a_block_cached_for(owner, filler);
        // While `owner` has work queued, its cached block may still be
        // read by it, and the borrower could wait for that work only by
        // blocking this thread: not lent.
        let gate = hold(owner);
        let error = DeviceBuffer::<u8>::new(borrower, 64 << 10).unwrap_err();
        assert!(matches!(error, Error::OutOfMemory(_)), "{error:?}");
        gate.open();
        owner.synchronize().unwrap();
        // `owner` has finished: its cached block serves `borrower`, with
        // no device call.
        let lent = DeviceBuffer::<u8>::new(borrower, 64 << 10).unwrap();
        assert_eq!(lent.address(), &address);
        // Lent only once its owner had finished: no barrier asked.
        assert_eq!(next_launch_barriers(borrower), [false, false]);
        assert_full_in_buffers(1);
        drop((lent, live, rest));
    });
}

/// Where the device waits on the device side, a full device lends a
/// cached block of a stream with work left, once the borrowing stream
/// waits for that work (CUDA's inserted dependencies): the allocation
/// blocks no thread, and the borrower's later work runs only after the
/// owner's. Before, it failed with `OutOfMemory` while the block lay
/// cached (a run whose threads share busy streams ran out of memory with
/// a fifth of the device cached).
#[test]
fn a_full_device_lends_a_busy_streams_cached_block_behind_its_work() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (owner, filler, borrower) = (pool_stream(), pool_stream(), pool_stream());
        let (live, rest, address) = a_full_device_with_a_block_cached_for(owner, filler);
        let gate = hold(owner);
        let lent = DeviceBuffer::<u8>::new(borrower, 64 << 10).unwrap();
        assert_eq!(lent.address(), &address);
        // A callback on `borrower` that ran before the gate opened would
        // find the flag clear: given 100 ms to do so.
        let opened = Arc::new(AtomicBool::new(false));
        let ran_after_owner = Arc::new(AtomicBool::new(false));
        borrower
            .launch_host_callback(
                {
                    let (opened, ran) = (Arc::clone(&opened), Arc::clone(&ran_after_owner));
                    move || ran.store(opened.load(Ordering::SeqCst), Ordering::SeqCst)
                },
                LaunchOptions::new(),
            )
            .unwrap();
        assert!(!borrower.query().unwrap(), "`borrower` waits for `owner`");
        std::thread::sleep(std::time::Duration::from_millis(100));
        opened.store(true, Ordering::SeqCst);
        gate.open();
        borrower.synchronize().unwrap();
        assert!(
            ran_after_owner.load(Ordering::SeqCst),
            "`borrower`'s work ran before `owner`'s had ended"
        );
        assert_full_in_buffers(0);
        drop((lent, live, rest));
    });
}

/// A block that needs no wait is lent before one of a stream with work
/// left, even where the busy stream's block fits better: the borrower is
/// then tied to no other stream's work. Before, the best fit over every
/// stream was taken, and the borrower waited behind the busy stream.
#[test]
fn a_full_device_lends_an_idle_streams_block_before_a_busy_ones() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (busy, idle, filler, borrower) =
            (pool_stream(), pool_stream(), pool_stream(), pool_stream());
        // Segments of 128 KiB (1/32 of the device): `busy`'s caches 64
        // KiB beside a live 64 KiB, `idle`'s 96 KiB beside a live 32 KiB,
        // and `filler` takes the rest of the device.
        let busy_live = DeviceBuffer::<u8>::new(busy, 64 << 10).unwrap();
        drop(DeviceBuffer::<u8>::new(busy, 64 << 10).unwrap());
        let idle_live = DeviceBuffer::<u8>::new(idle, 32 << 10).unwrap();
        let cached = DeviceBuffer::<u8>::new(idle, 96 << 10).unwrap();
        let idle_block = cached.address().chunks()[0].address;
        drop(cached);
        let rest = DeviceBuffer::<u8>::new(filler, (4 << 20) - (256 << 10)).unwrap();
        let s = stats();
        assert_eq!(
            (s.reserved_bytes, s.device_allocations),
            (4 * MIB, 3),
            "{s:?}"
        );
        let gate = hold(busy);
        let lent = DeviceBuffer::<u8>::new(borrower, 64 << 10).unwrap();
        assert_eq!(lent.address().chunks()[0].address, idle_block);
        assert!(borrower.query().unwrap(), "`borrower` waits for no stream");
        gate.open();
        drop((lent, busy_live, idle_live, rest));
    });
}

/// Makes the process-wide backend a [`SpyBackend`] over a 4 MiB device of
/// one region (as `FOUR_MIB_DEVICE`), and returns it.
fn spy_on_a_four_mib_device() -> SpyBackend {
    let system = MockSystem::builder()
        .memory_bytes(4 << 20)
        .region_bytes(4 << 20)
        .build()
        .unwrap();
    let backend = SpyBackend::new(system);
    spyre_stream::set_backend(Box::new(backend.clone())).unwrap();
    backend
}

/// A failed stream's cached block is lent once a synchronize, made after
/// its query reported the failure, has returned the failure too: the
/// stream took no work after the query, and the synchronize waited for
/// any it had begun (a card may overlap a stream's operations; the query
/// alone does not say they ended). Before, with the query's word no
/// longer taken, the allocation failed with the block cached.
#[test]
fn a_full_device_lends_a_failed_streams_cached_block_once_a_synchronize_saw_the_failure() {
    isolated!(&[], || {
        let backend = spy_on_a_four_mib_device();
        let (owner, filler, borrower) = (pool_stream(), pool_stream(), pool_stream());
        let (live, rest, address) = a_full_device_with_a_block_cached_for(owner, filler);
        fail(owner);
        let pool = spyre_stream::global_pool().unwrap();
        let owner_id = pool.resolve(owner).unwrap().id();
        let synchronizes = || {
            let log = backend.runtime().unwrap().synchronize_log();
            log.iter().filter(|&&id| id == owner_id).count()
        };
        let before = synchronizes();
        let lent = DeviceBuffer::<u8>::new(borrower, 64 << 10).unwrap();
        assert_eq!(lent.address(), &address);
        assert_eq!(synchronizes(), before + 1, "one synchronize of the owner");
        assert_eq!(next_launch_barriers(borrower), [false, false]);
        drop((lent, live, rest));
    });
}

#[test]
fn a_lent_block_goes_back_to_its_owner_only_once_the_borrower_passes_the_drop() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (owner, filler, borrower) = (pool_stream(), pool_stream(), pool_stream());
        let (live, rest, address) = a_full_device_with_a_block_cached_for(owner, filler);
        owner.synchronize().unwrap();
        let lent = DeviceBuffer::<u8>::new(borrower, 64 << 10).unwrap();
        assert_eq!(lent.address(), &address);
        // Dropped while `borrower` may still use it: the block waits for
        // `borrower`, and `owner`'s next allocation, finding the device
        // full, waits for it too before it takes the block back.
        let held = hold(borrower);
        drop(lent);
        assert_eq!(stats().pending_frees, 1, "waits for `borrower`");
        let (opened, opener) = open_later(held, std::time::Duration::from_millis(200));
        let again = DeviceBuffer::<u8>::new(owner, 64 << 10).unwrap();
        assert!(
            opened.load(Ordering::SeqCst),
            "the block went back to `owner` while `borrower` was busy"
        );
        assert_eq!(again.address(), &address);
        assert_eq!(stats().pending_frees, 0);
        drop((again, live, rest));
        opener.join().unwrap();
    });
}

#[test]
fn a_full_device_waits_for_the_streams_a_pending_free_waits_for() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (a, user, b) = (pool_stream(), pool_stream(), pool_stream());
        let buffer = DeviceBuffer::<u8>::new(a, 3 << 20).unwrap();
        // Used on `user`, and both held: the block is cached again only
        // once `user` passes the point of the drop, and its segment goes
        // back only once its own stream `a` has ended its work too.
        buffer.record_stream(user).unwrap();
        let (held_a, held_user) = (hold(a), hold(user));
        drop(buffer);
        assert_eq!(stats().pending_frees, 1);
        let (a_opened, a_opener) = open_later(held_a, std::time::Duration::from_millis(200));
        let (opened, opener) = open_later(held_user, std::time::Duration::from_millis(200));
        let on_b = DeviceBuffer::<u8>::new(b, 2 << 20).unwrap();
        assert!(
            opened.load(Ordering::SeqCst),
            "returned before `user` passed the drop"
        );
        assert!(
            a_opened.load(Ordering::SeqCst),
            "returned while `a` was busy"
        );
        a_opener.join().unwrap();
        let s = stats();
        assert_eq!(
            (s.pending_frees, s.device_frees, s.reserved_bytes),
            (0, 1, 2 * MIB)
        );
        drop(on_b);
        opener.join().unwrap();
    });
}

#[test]
fn a_full_device_from_a_host_callback_fails_instead_of_waiting_for_itself() {
    isolated!(&FOUR_MIB_DEVICE_HOST_WAIT, || {
        let (a, b) = (pool_stream(), pool_stream());
        drop(DeviceBuffer::<u8>::new(a, 3 << 20).unwrap());
        // Inside `a`'s host callback `a` is busy until the callback returns:
        // its cache cannot be waited for, and the device refuses the wait
        // (its waits would block the host).
        let (tx, rx) = std::sync::mpsc::channel();
        a.launch_host_callback(
            move || {
                let _ = tx.send(DeviceBuffer::<u8>::new(b, 2 << 20).map(drop));
            },
            LaunchOptions::new(),
        )
        .unwrap();
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the allocation returned");
        let Err(Error::OutOfMemory(details)) = &result else {
            panic!("expected OutOfMemory, got {result:?}");
        };
        assert_eq!((details.cached, details.largest_cached), (3 * MIB, 3 * MIB));
        a.synchronize().unwrap();
        // From an ordinary thread the same allocation waits and succeeds.
        drop(DeviceBuffer::<u8>::new(b, 2 << 20).unwrap());
    });
}

/// Where the device waits on the device side, the same allocation from
/// `a`'s host callback is served at once by `a`'s cached block, lent
/// behind `a`'s work (the callback included): nothing blocks, and `b`'s
/// later work runs after the callback.
#[test]
fn a_full_device_from_a_host_callback_lends_behind_the_callback() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (a, b) = (pool_stream(), pool_stream());
        drop(DeviceBuffer::<u8>::new(a, 3 << 20).unwrap());
        let callback_ended = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        a.launch_host_callback(
            {
                let ended = Arc::clone(&callback_ended);
                move || {
                    let lent = DeviceBuffer::<u8>::new(b, 2 << 20);
                    let after_callback = lent.as_ref().ok().map(|_| {
                        let ran = Arc::new(AtomicBool::new(false));
                        let (ran_flag, ended) = (Arc::clone(&ran), Arc::clone(&ended));
                        b.launch_host_callback(
                            move || ran_flag.store(ended.load(Ordering::SeqCst), Ordering::SeqCst),
                            LaunchOptions::new(),
                        )
                        .unwrap();
                        ran
                    });
                    // Let `b` run now, if it could: it must not.
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    ended.store(true, Ordering::SeqCst);
                    let _ = tx.send((lent.map(drop), after_callback));
                }
            },
            LaunchOptions::new(),
        )
        .unwrap();
        let (result, after_callback) = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the allocation returned");
        result.expect("lent behind the callback");
        b.synchronize().unwrap();
        assert!(
            after_callback.unwrap().load(Ordering::SeqCst),
            "`b`'s work ran during `a`'s callback"
        );
        assert_eq!(stats().out_of_memory, 0);
    });
}

#[test]
fn segments_stay_within_a_region_so_buffers_can_be_operands() {
    let env = [
        MOCK,
        ("SPYRE_MOCK_MEMORY_BYTES", "67108864"),
        ("SPYRE_MOCK_REGION_BYTES", "1048576"),
    ];
    isolated!(&env, || {
        let stream = pool_stream();
        // 600 000 bytes: two do not fit one 1 MiB region, and the small
        // segment (2 MiB) would cross a region boundary: each buffer gets
        // a segment of at most one region, and lies in one chunk.
        let buffers: Vec<_> = (0..4)
            .map(|_| DeviceBuffer::<u8>::new(stream, 600_000).unwrap())
            .collect();
        for buffer in &buffers {
            assert_eq!(buffer.address().chunks().len(), 1, "{buffer:?}");
            buffer.operand().unwrap();
        }
        assert_eq!(stats().reserved_bytes, 4 * MIB, "4 segments of one region");
    });
}

/// Waits (polling `query`, at most 20 s) until `stream` has no work left:
/// for tests whose library answers `synchronize` with an undefined status.
fn wait_idle(stream: SpyreStream) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !stream.query().unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream never went idle"
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_failed_fence_query_keeps_a_block_from_its_next_owner() {
    // The other stream's read of the dropped buffer waits behind a held
    // callback; the drop's fence is a record on that stream, and the flex
    // library answers every event query with a status flex.h does not
    // define. That says nothing of where the stream is, so the block must
    // wait. (Before the fix it was handed out again at once, and the read
    // saw the new owner's 2.0s.)
    isolated!(mock_cdylib; &[("SPYRE_MOCK_UNDEFINED_STATUS", "flex_event_query")], || {
        spyre_stream::set_backend(Box::new(spyre_tests::ffi::backend())).unwrap();
        let (own, other) = (pool_stream(), pool_stream());
        let gate = hold(other);
        let old = DeviceBuffer::from_host(own, &[1.0f32; 1024]).unwrap();
        let first = old.address().clone();
        old.record_stream(other).unwrap();
        other.wait_stream(own).unwrap();
        let read = HostBuffer::zeroed(4096);
        other
            .launch_d2h(old.address(), &read, LaunchOptions::new())
            .unwrap();
        drop(old);
        let new = DeviceBuffer::from_host(own, &[2.0f32; 1024]).unwrap();
        assert_ne!(new.address(), &first, "handed out while the other stream may read it");
        gate.open();
        other.synchronize().unwrap();
        assert_eq!(f32s(&read), [1.0; 1024]);
        assert_eq!(new.to_vec(own).unwrap(), [2.0; 1024]);
        drop(new);
        // The fence's query never answers, but `empty_cache`'s synchronize
        // of `other`, made after the drop, sees its point pass: the block
        // is cached and its segment goes back. (Before, it stayed a pending
        // free for the life of the process.)
        assert_eq!(stats().pending_frees, 1);
        empty_cache(Device::CURRENT).unwrap();
        let s = stats();
        assert_eq!((s.pending_frees, s.reserved_bytes), (0, 0));
    });
}

#[test]
fn a_completion_panic_keeps_a_block_from_its_next_owner_while_the_library_runs_on() {
    // A completion that panics after its operation succeeded fails the
    // stream on flex-rt's side only: the flex library is not told, and runs
    // the work queued behind it, here a read of the dropped buffer held
    // behind a gate. The drop's fence is refused (the stream accepts no
    // more work), so the block must wait for the stream to run out of
    // work. (Before the fix the stream's query reported the failure at
    // once, the block was cached again at once, and the read saw the new
    // owner's 2.0s.)
    isolated!(mock_cdylib; &[], || {
        spyre_stream::set_backend(Box::new(spyre_tests::ffi::backend())).unwrap();
        let (own, other) = (pool_stream(), pool_stream());
        let old = DeviceBuffer::from_host(own, &[1.0f32; 1024]).unwrap();
        let first = old.address().clone();
        other.wait_stream(own).unwrap();
        let start = hold(other);
        other
            .launch_host_callback(
                || {},
                LaunchOptions::new().on_complete(|_| panic!("deliberate completion panic")),
            )
            .unwrap();
        let behind = hold(other);
        let read = HostBuffer::zeroed(4096);
        old.copy_to_host_buffer(other, &read).unwrap();
        start.open();
        // The stream refuses work once the panic is noted.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while other.launch_host_callback(|| {}, LaunchOptions::new()).is_ok() {
            assert!(std::time::Instant::now() < deadline, "the panic was never noted");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!other.query().unwrap(), "the library still holds the read");
        drop(old);
        assert_eq!(stats().pending_frees, 1, "the read is still queued in the library");
        let new = DeviceBuffer::from_host(own, &[2.0f32; 1024]).unwrap();
        assert_ne!(new.address(), &first, "handed out while the other stream may read it");
        own.synchronize().unwrap();
        behind.open();
        let err = other.synchronize().unwrap_err();
        assert!(err.to_string().contains("deliberate completion panic"), "{err}");
        assert_eq!(f32s(&read), [1.0; 1024]);
        assert!(other.query().is_err(), "failed once its work has run");
    });
}

#[test]
fn a_failed_synchronize_keeps_empty_cache_from_returning_memory_in_use() {
    // A buffer with a segment of its own, dropped on its stream while a
    // read of it waits there behind a held callback: cached at once (its
    // stream's later work is ordered after the drop). `empty_cache` waits
    // for the stream before returning the segment, and the library answers
    // every `synchronize` with a status flex.h does not define: the
    // segment stays. (Before the fix it went back to the device, a raw
    // allocation got it, and its fill reached the pending read.)
    isolated!(mock_cdylib; &[("SPYRE_MOCK_UNDEFINED_STATUS", "flex_stream_synchronize")], || {
        spyre_stream::set_backend(Box::new(spyre_tests::ffi::backend())).unwrap();
        let (stream, other) = (pool_stream(), pool_stream());
        let gate = hold(stream);
        let buffer = DeviceBuffer::<u8>::zeros(stream, 20 << 20).unwrap();
        let first = buffer.address().clone();
        let read = HostBuffer::zeroed(20 << 20);
        stream
            .launch_d2h(buffer.address(), &read, LaunchOptions::new())
            .unwrap();
        drop(buffer);
        assert_eq!(empty_cache(Device::CURRENT).unwrap(), 0, "its stream may still use it");
        assert_eq!(memory_reserved(Device::CURRENT).unwrap(), 20 << 20);
        let raw = spyre_stream::allocate(Device::CURRENT, 20 << 20).unwrap();
        assert_ne!(raw, first);
        other
            .launch_fill(&raw, 7.0, DataFormat::Uint8, LaunchOptions::new())
            .unwrap();
        gate.open();
        wait_idle(stream);
        wait_idle(other);
        assert!(read.to_vec().iter().all(|&b| b == 0));
        spyre_stream::free(Device::CURRENT, &raw).unwrap();
    });
}

/// The bytes of `buffer` as little-endian `f32`s.
fn f32s(buffer: &HostBuffer) -> Vec<f32> {
    buffer
        .to_vec()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Fails `stream` (a host callback that panics) and waits until it has.
fn fail(stream: SpyreStream) {
    stream
        .launch_host_callback(
            || panic!("failing the stream on purpose"),
            LaunchOptions::new(),
        )
        .unwrap();
    assert!(stream.synchronize().is_err());
}

/// `empty_cache` waits for a stream whose host callback itself empties the
/// cache, and then allocates on a full device (whose retry empties the
/// cache too): both return. Before, the first call held the allocator's
/// return lock while it waited for the stream, and the callback waited for
/// that lock: a deadlock, every time.
#[test]
fn a_host_callback_may_empty_the_cache_and_retry_while_another_thread_empties_it() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let stream = pool_stream();
        drop(DeviceBuffer::<u8>::new(stream, 4096).unwrap());
        let (sent, received) = std::sync::mpsc::channel();
        stream
            .launch_host_callback(
                move || {
                    // The other thread is waiting for this stream in
                    // `empty_cache` by now.
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    let emptied = empty_cache(Device::CURRENT).map_err(|e| e.to_string());
                    // More than the device has: the retry empties the cache.
                    let allocated = DeviceBuffer::<u8>::new(stream, 8 << 20)
                        .map(drop)
                        .map_err(|e| e.to_string());
                    sent.send((emptied, allocated)).unwrap();
                },
                LaunchOptions::new(),
            )
            .unwrap();
        let emptier = std::thread::spawn(|| empty_cache(Device::CURRENT).unwrap());
        let (emptied, allocated) = received
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the callback's calls returned");
        // Called from the stream's own callback, its memory stays cached.
        assert_eq!(emptied, Ok(0));
        assert!(
            allocated
                .as_ref()
                .is_err_and(|e| e.contains("out of device memory")),
            "{allocated:?}"
        );
        // The stream's one segment: 1/32 of the 4 MiB device.
        assert_eq!(emptier.join().unwrap(), 4 * MIB / 32);
        assert_eq!(stats().reserved_bytes, 0);
    });
}

/// A buffer used on a stream that had already failed: a query reporting
/// the failure does not say that the stream's work has ended (flex.h does
/// not promise it; a card may overlap a stream's operations), so the block
/// stays a pending free until `empty_cache`'s synchronize has seen the
/// stream fail, and then goes back to the device. Before, it was cached
/// again at once on the query's word; and before that, its fence (the
/// stream idle, as the record on it was refused) never passed: the memory
/// was lost for the life of the process.
#[test]
fn memory_used_on_a_failed_stream_is_returned_once_a_synchronize_saw_the_failure() {
    isolated!(&[MOCK], || {
        let (owner, failed) = (pool_stream(), pool_stream());
        fail(failed);
        let buffer = DeviceBuffer::<f32>::zeros(owner, 1024).unwrap();
        buffer.record_stream(failed).unwrap();
        drop(buffer);
        assert_eq!(stats().pending_frees, 1, "not on the query's word");
        assert_eq!(empty_cache(Device::CURRENT).unwrap(), SMALL_SEGMENT);
        let s = stats();
        assert_eq!((s.pending_frees, s.reserved_bytes), (0, 0));
    });
}

/// A block whose fence is an event recorded on another stream that fails
/// before it reaches the event: the failed record does not say that the
/// work begun before the failure has ended either, so the block stays a
/// pending free until `empty_cache`'s synchronize has seen the stream fail.
/// Before, the event's failure passed the fence at once.
#[test]
fn a_fence_whose_event_failed_waits_for_a_synchronize() {
    isolated!(&[MOCK], || {
        let (owner, other) = (pool_stream(), pool_stream());
        let (release, _) = hold_running(other);
        other
            .launch_host_callback(
                || panic!("failing the stream on purpose"),
                LaunchOptions::new(),
            )
            .unwrap();
        let buffer = DeviceBuffer::<f32>::zeros(owner, 1024).unwrap();
        buffer.record_stream(other).unwrap();
        // Its fence: an event recorded on `other` behind the failing callback.
        drop(buffer);
        drop(release);
        assert!(other.synchronize().is_err());
        assert_eq!(stats().pending_frees, 1, "not on the event's failure");
        assert_eq!(empty_cache(Device::CURRENT).unwrap(), SMALL_SEGMENT);
        let s = stats();
        assert_eq!((s.pending_frees, s.reserved_bytes), (0, 0));
    });
}

/// A full device returns the cache of a failed stream before it retries, as
/// `empty_cache` does, once its synchronize has seen the stream fail (a
/// failed stream takes no more work). Before, only idle streams' cache went
/// back, and the allocation failed with the failed stream's 3 MiB cached.
#[test]
fn a_full_device_returns_a_failed_streams_cache() {
    isolated!(&FOUR_MIB_DEVICE, || {
        let (a, failed) = (pool_stream(), pool_stream());
        drop(DeviceBuffer::<u8>::new(failed, 3 << 20).unwrap());
        fail(failed);
        let on_a = DeviceBuffer::<u8>::new(a, 2 << 20)
            .expect("the retry returns the failed stream's cache");
        let s = stats();
        assert_eq!(
            (s.alloc_retries, s.device_frees, s.reserved_bytes),
            (1, 1, 2 * MIB)
        );
        drop(on_a);
    });
}

/// A buffer is not carved across two regions of a cached segment larger
/// than one region (a buffer of two regions got one): it lies in one chunk
/// and is a kernel operand, from a segment of its own when no cached block
/// holds it in one piece. On 4 MiB regions, an 8 MiB segment cached whole
/// is cut for 4 MiB − 512 bytes; the rest starts 512 bytes before the
/// boundary, so 1.5 MiB from it would straddle it. Before, the 1.5 MiB
/// buffer came in two chunks and `operand` failed with most of the device
/// free.
#[test]
fn a_buffer_is_never_carved_across_regions() {
    let env = [
        MOCK,
        ("SPYRE_MOCK_MEMORY_BYTES", "67108864"),
        ("SPYRE_MOCK_REGION_BYTES", "4194304"),
    ];
    isolated!(&env, || {
        let stream = pool_stream();
        drop(DeviceBuffer::<u8>::new(stream, 8 << 20).unwrap());
        let front = DeviceBuffer::<u8>::new(stream, (4 << 20) - 512).unwrap();
        assert_eq!(front.address().chunks().len(), 1);
        assert_eq!(stats().device_allocations, 1, "cut from the cached segment");
        let buffer = DeviceBuffer::<f32>::new(stream, (3 << 20) / 8).unwrap();
        assert_eq!(buffer.address().chunks().len(), 1, "{buffer:?}");
        buffer.operand().unwrap();
        assert_eq!(stats().device_allocations, 2, "a segment of its own");
    });
}

/// On a fragmented device (1 MiB holes), a buffer that fits a hole gets a
/// segment of its own size in one piece rather than a standard segment in
/// pieces: each lies in one chunk and is an operand, and the allocator
/// holds only what they need. Before, the first took a 2 MiB segment in two
/// pieces and the second straddled them.
#[test]
fn a_fragmented_device_gives_buffers_one_piece_each() {
    isolated!(&[MOCK, ("SPYRE_MOCK_MEMORY_BYTES", "67108864")], || {
        let stream = pool_stream();
        let raw: Vec<_> = (0..64)
            .map(|_| spyre_stream::allocate(Device::CURRENT, MIB).unwrap())
            .collect();
        for hole in raw.iter().skip(1).step_by(2) {
            spyre_stream::free(Device::CURRENT, hole).unwrap();
        }
        let first = DeviceBuffer::<u8>::new(stream, 768 << 10).unwrap();
        let second = DeviceBuffer::<u8>::new(stream, 512 << 10).unwrap();
        for buffer in [&first, &second] {
            assert_eq!(buffer.address().chunks().len(), 1, "{buffer:?}");
            buffer.operand().unwrap();
        }
        let s = stats();
        assert_eq!((s.reserved_bytes, s.alloc_retries), ((768 + 512) << 10, 0));
    });
}

/// Holds `stream` in a host callback until the returned sender is used or
/// dropped; the flag says whether the callback still runs.
fn hold_running(
    stream: SpyreStream,
) -> (
    std::sync::mpsc::Sender<()>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = Arc::clone(&running);
    stream
        .launch_host_callback(
            move || {
                entered_tx.send(()).unwrap();
                let _ = released.recv();
                flag.store(false, std::sync::atomic::Ordering::SeqCst);
            },
            LaunchOptions::new(),
        )
        .unwrap();
    entered.recv().unwrap();
    (release, running)
}

/// A stream that needs shutdown reports it at once while its running
/// operation goes on (the device's rule): a full device's retry does not
/// return its cached segment, and a block used on it is not cached again,
/// until that operation has ended, and `empty_cache` then returns them.
/// Before the fix (found by review) both went to another owner while the
/// operation still ran; with the first fix the block stayed pending for
/// good.
#[test]
fn a_stream_that_needs_shutdown_keeps_its_memory_until_its_operation_ends() {
    isolated!(&[], || {
        let backend = spy_on_a_four_mib_device();
        let (a, b, c) = (pool_stream(), pool_stream(), pool_stream());
        let pool = spyre_stream::global_pool().unwrap();
        let needs_shutdown = |stream: SpyreStream| {
            backend
                .runtime()
                .unwrap()
                .mock_stream(pool.resolve(stream).unwrap().id())
                .unwrap()
                .set_needs_shutdown();
        };

        // `c`'s 4 KiB block, used on `b`, dropped while `b` runs and needs
        // shutdown: not handed out again on `c`.
        let used = DeviceBuffer::<u8>::new(c, 4096).unwrap();
        let used_at = used.address().clone();
        used.record_stream(b).unwrap();
        let (release_b, b_running) = hold_running(b);
        needs_shutdown(b);
        drop(used);
        assert_eq!(stats().pending_frees, 1);
        let next = DeviceBuffer::<u8>::new(c, 4096).unwrap();
        assert!(b_running.load(std::sync::atomic::Ordering::SeqCst));
        assert_ne!(
            *next.address(),
            used_at,
            "handed out while `b`'s operation ran"
        );
        drop(release_b);

        // `a`'s 3 MiB segment, cached while `a` runs and needs shutdown:
        // the full device's retry waits for that operation to end before
        // the segment goes back to the device.
        drop(DeviceBuffer::<u8>::new(a, 3 << 20).unwrap());
        let (release_a, a_running) = hold_running(a);
        needs_shutdown(a);
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(release_a);
        });
        let on_a_segment = DeviceBuffer::<u8>::new(c, 2 << 20).unwrap();
        assert!(
            !a_running.load(std::sync::atomic::Ordering::SeqCst),
            "given `a`'s segment while its operation ran"
        );
        releaser.join().unwrap();
        drop(on_a_segment);
        // Both operations have ended: the block used on `b` is cached
        // again, and `empty_cache` returns `c`'s two segments (2 MiB, and
        // 1/32 of the device); `a`'s went back in the retry.
        drop(next);
        assert_eq!(stats().device_frees, 1, "`a`'s segment");
        assert_eq!(
            empty_cache(Device::CURRENT).unwrap(),
            2 * MIB + 4 * MIB / 32
        );
        let s = stats();
        assert_eq!((s.pending_frees, s.reserved_bytes), (0, 0));
    });
}

/// `empty_cache` and a stream that fails (needing shutdown) while it runs
/// work launched after `empty_cache` began to wait for it: the memory that
/// work uses is not returned while it runs. When the stream's first
/// synchronize sees the failure (as the work before the call ends: a race
/// the test cannot force), it covers only that work; only a second one,
/// made once the stream could take no more work, covers the rest.
/// Before (found by review), an 8 MiB buffer of that work went back to the
/// device while it ran, and the next allocation got it.
#[test]
fn empty_cache_never_returns_memory_of_work_a_failed_stream_still_runs() {
    isolated!(&[], || {
        let backend = SpyBackend::new(MockSystem::default());
        spyre_stream::set_backend(Box::new(backend.clone())).unwrap();
        let (s, p, c) = (pool_stream(), pool_stream(), pool_stream());
        let pool = spyre_stream::global_pool().unwrap();
        let mock = backend.runtime().unwrap();
        let s_id = pool.resolve(s).unwrap().id();
        // `s` and `p` each own a wholly free segment: `empty_cache`
        // synchronizes both, `s` first, while both are held.
        drop(DeviceBuffer::<u8>::new(s, 4096).unwrap());
        drop(DeviceBuffer::<u8>::new(p, 4096).unwrap());
        let used = DeviceBuffer::<u8>::new(s, 8 << 20).unwrap();
        let used_at = used.address().clone();
        let (release_x, _) = hold_running(s);
        let (release_p, _) = hold_running(p);
        let emptier = std::thread::spawn(|| empty_cache(Device::CURRENT).unwrap());
        while !mock.synchronize_log().contains(&s_id) {
            std::thread::yield_now();
        }
        // (The log is written as the call begins: let it take its count.)
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Launched after that synchronize began: makes `s` need shutdown,
        // then holds it until released.
        let (started, has_started) = std::sync::mpsc::channel();
        let (release_y, released) = std::sync::mpsc::channel::<()>();
        let y_running = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = Arc::clone(&y_running);
        let spy = backend.clone();
        s.launch_host_callback(
            move || {
                spy.runtime()
                    .unwrap()
                    .mock_stream(s_id)
                    .unwrap()
                    .set_needs_shutdown();
                started.send(()).unwrap();
                let _ = released.recv();
                flag.store(false, std::sync::atomic::Ordering::SeqCst);
            },
            LaunchOptions::new(),
        )
        .unwrap();
        drop(release_x);
        has_started.recv().unwrap();
        // The work ends 300 ms from now.
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(release_y);
        });
        // Once `empty_cache` is on to `p`, the buffer the work uses is
        // dropped (its segment whole, on `s`), and `p` goes on.
        while mock.synchronize_log().iter().all(|&id| id == s_id) {
            std::thread::yield_now();
        }
        drop(used);
        drop(release_p);
        emptier.join().unwrap();
        let running_when_returned = y_running.load(std::sync::atomic::Ordering::SeqCst);
        let again = DeviceBuffer::<u8>::new(c, 8 << 20).unwrap();
        let overlaps = again.address().chunks().iter().any(|a| {
            used_at.chunks().iter().any(|u| {
                a.address.region_id == u.address.region_id
                    && a.address.offset < u.address.offset + u.size
                    && u.address.offset < a.address.offset + a.size
            })
        });
        assert!(
            !(running_when_returned && overlaps),
            "memory of work `s` still ran went to another buffer: {again:?} over {used_at:?}"
        );
        releaser.join().unwrap();
    });
}
