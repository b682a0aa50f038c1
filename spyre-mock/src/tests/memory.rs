//! Device memory through the runtime: allocation, multi-chunk copies,
//! exhaustion, free and use after free.

use flex_rt::{
    AddressChunk, CompositeAddress, HostBuffer, LaunchOptions, LogicalAddress, Runtime, Status,
    Stream,
};

use super::*;

fn small(memory: u64, region: u64) -> MockRuntime {
    MockSystem::builder()
        .memory_bytes(memory)
        .region_bytes(region)
        .build()
        .unwrap()
        .create_mock_runtime(0)
        .unwrap()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 256) as u8).collect()
}

#[test]
fn allocations_are_aligned_with_exact_sizes() {
    let rt = small(8192, 2048);
    for size in [1, 127, 128, 129, 1000] {
        let address = rt.allocate(size).unwrap();
        assert_eq!(address.total_size(), size);
        for chunk in address.chunks() {
            assert_eq!(chunk.address.offset % 128, 0);
        }
    }
    let err = rt.allocate(0).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
}

#[test]
fn multi_chunk_allocations_round_trip() {
    let rt = small(4096, 512);
    let s = rt.default_mock_stream();
    // Fill all eight regions, then free regions 0 and 2: a 1000-byte
    // allocation must take two chunks that are not adjacent.
    let blocks: Vec<_> = (0..8).map(|_| rt.allocate(512).unwrap()).collect();
    rt.free(&blocks[0]).unwrap();
    rt.free(&blocks[2]).unwrap();
    let spread = rt.allocate(1000).unwrap();
    let layout: Vec<(u32, u64, u64)> = spread
        .chunks()
        .iter()
        .map(|c| (c.address.region_id, c.address.offset, c.size))
        .collect();
    assert_eq!(layout, vec![(0, 0, 512), (2, 0, 488)]);

    let data = pattern(1000);
    let out = HostBuffer::zeroed(1000);
    s.launch_h2d(
        &HostBuffer::from_vec(data.clone()),
        &spread,
        LaunchOptions::new(),
    )
    .unwrap();
    s.launch_d2h(&spread, &out, LaunchOptions::new()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(out.to_vec(), data);
    // The neighbours were not touched.
    assert_eq!(download(s, &blocks[1]).unwrap(), vec![0; 512]);
}

#[test]
fn allocations_larger_than_a_region_get_one_chunk_per_region() {
    let rt = small(4096, 1024);
    let s = rt.default_mock_stream();
    let address = rt.allocate(3000).unwrap();
    let sizes: Vec<u64> = address.chunks().iter().map(|c| c.size).collect();
    assert_eq!(sizes, vec![1024, 1024, 952]);
    let data = pattern(3000);
    let back = {
        s.launch_h2d(
            &HostBuffer::from_vec(data.clone()),
            &address,
            LaunchOptions::new(),
        )
        .unwrap();
        download(s, &address).unwrap()
    };
    assert_eq!(back, data);
    // A hand-made address over the same bytes, cut differently, reads them too.
    let first = address.chunks()[0];
    let cut = CompositeAddress::new(vec![
        AddressChunk {
            address: first.address,
            size: 512,
        },
        AddressChunk {
            address: LogicalAddress {
                offset: first.address.offset + 512,
                ..first.address
            },
            size: 512,
        },
    ])
    .unwrap();
    assert_eq!(download(s, &cut).unwrap(), data[..1024]);
}

#[test]
fn memory_is_backed_on_first_write() {
    let rt = small(4096, 1024);
    let s = rt.default_mock_stream();
    let address = rt.allocate(2048).unwrap();
    assert_eq!(rt.backed_regions(), 0);
    assert_eq!(
        download(s, &address).unwrap(),
        vec![0; 2048],
        "unbacked memory reads as zeros"
    );
    assert_eq!(rt.backed_regions(), 0);
    let first = CompositeAddress::new(address.chunks()[..1].to_vec()).unwrap();
    s.launch_fill(
        &first,
        1.0,
        flex_rt::DataFormat::Uint8,
        LaunchOptions::new(),
    )
    .unwrap();
    s.synchronize().unwrap();
    assert_eq!(rt.backed_regions(), 1);
}

#[test]
fn exhaustion_is_out_of_memory_naming_requested_and_free_bytes() {
    let rt = small(4096, 1024);
    let _held = rt.allocate(3000).unwrap();
    let err = rt.allocate(2000).unwrap_err();
    assert_eq!(err.status(), Status::OUT_OF_MEMORY);
    assert!(err.message().contains("2000 bytes"), "{err}");
    assert!(err.message().contains("1024 of 4096 bytes"), "{err}");
    assert_eq!(rt.free_memory_bytes(), 1024);
    assert!(rt.allocate(1024).is_ok());
    assert_eq!(rt.free_memory_bytes(), 0);
    assert_eq!(rt.allocate(1).unwrap_err().status(), Status::OUT_OF_MEMORY);
}

#[test]
fn freed_memory_is_reusable_and_use_after_free_fails() {
    let rt = small(4096, 1024);
    let s = rt.default_mock_stream();
    let address = upload(&rt, s, vec![5; 256]);
    s.synchronize().unwrap();
    rt.free(&address).unwrap();
    assert_eq!(rt.free_memory_bytes(), 4096);

    let counters = Counters::default();
    s.launch_d2h(&address, &HostBuffer::zeroed(256), counters.options())
        .unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::EXECUTION_FAILED);
    assert_eq!(err.call(), "launch_d2h");
    assert!(
        err.message().contains("not inside a live allocation"),
        "{err}"
    );
    assert_eq!(counters.statuses(), vec![Status::EXECUTION_FAILED]);

    // Double free and foreign addresses are refused; nothing is freed.
    assert_eq!(
        rt.free(&address).unwrap_err().status(),
        Status::INVALID_ARGUMENT
    );
    let again = rt.allocate(256).unwrap();
    assert_eq!(again, address, "first fit reuses the freed range");
    let foreign = CompositeAddress::single(
        LogicalAddress {
            region_id: 2,
            offset: 0,
        },
        256,
    )
    .unwrap();
    assert_eq!(
        rt.free(&foreign).unwrap_err().status(),
        Status::INVALID_ARGUMENT
    );
    assert_eq!(rt.free_memory_bytes(), 4096 - 256);
}

#[test]
fn addresses_outside_allocations_fail_without_writing() {
    let rt = small(4096, 1024);
    let s = stream(&rt);
    let address = rt.allocate(256).unwrap();
    // Reaches 128 bytes past the end of the allocation.
    let too_long = CompositeAddress::single(address.start(), 384).unwrap();
    s.launch_h2d(
        &HostBuffer::from_vec(vec![1; 384]),
        &too_long,
        LaunchOptions::new(),
    )
    .unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::EXECUTION_FAILED);
    assert!(err.message().contains("chunk 0 of device address"), "{err}");
    // Nothing was written, not even the part inside the allocation.
    let other = stream(&rt);
    assert_eq!(download(other, &address).unwrap(), vec![0; 256]);
    // Region ids that do not exist, huge offsets.
    for at in [
        LogicalAddress {
            region_id: 77,
            offset: 0,
        },
        LogicalAddress {
            region_id: 0,
            offset: u64::MAX - 127,
        },
    ] {
        let s = stream(&rt);
        let bogus = CompositeAddress::single(at, 100).unwrap();
        s.launch_fill(
            &bogus,
            0.0,
            flex_rt::DataFormat::Uint8,
            LaunchOptions::new(),
        )
        .unwrap();
        assert_eq!(
            s.synchronize().unwrap_err().status(),
            Status::EXECUTION_FAILED
        );
    }
}

#[test]
fn memory_freed_under_queued_work_fails_that_work() {
    let rt = small(4096, 1024);
    let s = stream(&rt);
    let address = rt.allocate(128).unwrap();
    let release = block(s);
    s.launch_fill(
        &address,
        1.0,
        flex_rt::DataFormat::Uint8,
        LaunchOptions::new(),
    )
    .unwrap();
    // Freed while the fill is still queued: the fill fails when it runs.
    rt.free(&address).unwrap();
    release.send(()).unwrap();
    assert_eq!(
        s.synchronize().unwrap_err().status(),
        Status::EXECUTION_FAILED
    );
}

/// A copy's host source and sink are called with no lock of the device
/// held, so they may allocate and free device memory on the runtime
/// themselves (a C layer releasing a staging block, say). Before, they ran
/// inside the device memory's read lock, and an allocation there waited
/// for that lock on the same thread for ever.
#[test]
fn a_copys_host_source_and_sink_may_allocate_device_memory() {
    struct Allocating(std::sync::Arc<MockRuntime>, Vec<u8>);
    impl Allocating {
        fn churn(&self) {
            let address = self.0.allocate(128).expect("allocate inside the copy");
            self.0.free(&address).expect("free inside the copy");
        }
    }
    impl crate::HostSource for Allocating {
        fn bytes(&self) -> &[u8] {
            self.churn();
            &self.1
        }
    }
    impl crate::HostSink for Allocating {
        fn bytes_mut(&mut self) -> &mut [u8] {
            self.churn();
            &mut self.1
        }
        fn len(&self) -> usize {
            self.1.len()
        }
    }
    let rt = std::sync::Arc::new(small(8192, 2048));
    let address = rt.allocate(256).unwrap();
    let s = stream(&rt);
    s.enqueue(
        crate::Op::h2d(
            Allocating(std::sync::Arc::clone(&rt), pattern(256)),
            address.clone(),
        ),
        LaunchOptions::new(),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    s.enqueue(
        crate::Op::d2h(
            address.clone(),
            Allocating(std::sync::Arc::clone(&rt), vec![0; 256]),
        ),
        LaunchOptions::new().on_complete(move |result| tx.send(result).unwrap()),
    )
    .unwrap();
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the copies ran")
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(rt.memory_info().unwrap().free_bytes, 8192 - 256);
}
