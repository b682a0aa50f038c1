//! Compute on the device: every kernel's numbers, bad descriptors, fill.

use flex_rt::{
    CompositeAddress, DataFormat, HostBuffer, LaunchOptions, LogicalAddress, Runtime, Status,
    Stream,
};
use spyre_testkit::{f32_le_bytes, f32s_from_le};

use super::*;
use crate::reference;
use flex_rt::program::KernelDescriptor;

/// Loads `descriptor`, runs it on `s`, and synchronizes.
fn run(rt: &MockRuntime, s: &dyn Stream, descriptor: &KernelDescriptor) -> Result<(), FlexError> {
    run_bytes(rt, s, descriptor.to_bytes().to_vec())
}

fn run_bytes(rt: &MockRuntime, s: &dyn Stream, program: Vec<u8>) -> Result<(), FlexError> {
    let program = upload(rt, s, program);
    s.launch_compute(&program, LaunchOptions::new())?;
    s.synchronize()
}

fn put(rt: &MockRuntime, s: &dyn Stream, values: &[f32]) -> CompositeAddress {
    upload(rt, s, f32_le_bytes(values))
}

fn get(s: &dyn Stream, address: &CompositeAddress) -> Vec<f32> {
    f32s_from_le(&download(s, address).unwrap())
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Deterministic awkward floats (not exactly representable sums/products).
fn awkward(n: usize, seed: u32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / 65_536.0 - 100.0 + 0.1
        })
        .collect()
}

#[test]
fn elementwise_kernels_by_hand() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    let a = put(&rt, s, &[1.0, 2.0, 3.0, -4.0]);
    let b = put(&rt, s, &[10.0, 20.0, 30.0, 0.5]);
    let out = rt.allocate(16).unwrap();

    run(&rt, s, &KernelDescriptor::copy(4, a.start(), out.start())).unwrap();
    assert_eq!(get(s, &out), vec![1.0, 2.0, 3.0, -4.0]);

    run(&rt, s, &KernelDescriptor::fill(4, 2.5, out.start())).unwrap();
    assert_eq!(get(s, &out), vec![2.5; 4]);

    run(
        &rt,
        s,
        &KernelDescriptor::add(4, a.start(), b.start(), out.start()),
    )
    .unwrap();
    assert_eq!(get(s, &out), vec![11.0, 22.0, 33.0, -3.5]);

    run(
        &rt,
        s,
        &KernelDescriptor::mul(4, a.start(), b.start(), out.start()),
    )
    .unwrap();
    assert_eq!(get(s, &out), vec![10.0, 40.0, 90.0, -2.0]);

    // 2 * [1 2 3 -4] + [10 20 30 0.5] = [12 24 36 -7.5]
    run(
        &rt,
        s,
        &KernelDescriptor::axpy(4, 2.0, a.start(), b.start(), out.start()),
    )
    .unwrap();
    assert_eq!(get(s, &out), vec![12.0, 24.0, 36.0, -7.5]);
}

#[test]
fn matmul_by_hand() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    // [1 2] [5 6]   [19 22]
    // [3 4] [7 8] = [43 50]
    let a = put(&rt, s, &[1.0, 2.0, 3.0, 4.0]);
    let b = put(&rt, s, &[5.0, 6.0, 7.0, 8.0]);
    let c = rt.allocate(16).unwrap();
    run(
        &rt,
        s,
        &KernelDescriptor::matmul(2, 2, 2, a.start(), b.start(), c.start()),
    )
    .unwrap();
    assert_eq!(get(s, &c), vec![19.0, 22.0, 43.0, 50.0]);

    // [1 2 3]   [1 2]
    // [4 5 6] · [3 4] = [1+6+15 2+8+18] = [22 28]
    //           [5 6]   [4+15+30 8+20+36]  [49 64]
    let a = put(&rt, s, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = put(&rt, s, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let c = rt.allocate(16).unwrap();
    run(
        &rt,
        s,
        &KernelDescriptor::matmul(2, 3, 2, a.start(), b.start(), c.start()),
    )
    .unwrap();
    assert_eq!(get(s, &c), vec![22.0, 28.0, 49.0, 64.0]);
}

#[test]
fn device_results_equal_the_reference_bit_for_bit() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    let n = 300;
    let (xs, ys) = (awkward(n, 1), awkward(n, 2));
    let x = put(&rt, s, &xs);
    let y = put(&rt, s, &ys);
    let out = rt.allocate(4 * n as u64).unwrap();
    let alpha = 0.1f32;
    let count = n as u64;

    let cases: Vec<(KernelDescriptor, Vec<f32>)> = vec![
        (
            KernelDescriptor::copy(count, x.start(), out.start()),
            reference::copy(&xs),
        ),
        (
            KernelDescriptor::fill(count, alpha, out.start()),
            reference::fill(n, alpha),
        ),
        (
            KernelDescriptor::add(count, x.start(), y.start(), out.start()),
            reference::add(&xs, &ys),
        ),
        (
            KernelDescriptor::mul(count, x.start(), y.start(), out.start()),
            reference::mul(&xs, &ys),
        ),
        (
            KernelDescriptor::axpy(count, alpha, x.start(), y.start(), out.start()),
            reference::axpy(alpha, &xs, &ys),
        ),
    ];
    for (descriptor, expected) in cases {
        run(&rt, s, &descriptor).unwrap();
        assert_eq!(
            bits(&get(s, &out)),
            bits(&expected),
            "{:?}",
            descriptor.kernel
        );
    }

    let (m, k, nn) = (7, 13, 5);
    let (am, bm) = (awkward(m * k, 3), awkward(k * nn, 4));
    let a = put(&rt, s, &am);
    let b = put(&rt, s, &bm);
    let c = rt.allocate(4 * (m * nn) as u64).unwrap();
    run(
        &rt,
        s,
        &KernelDescriptor::matmul(
            m as u64,
            k as u64,
            nn as u64,
            a.start(),
            b.start(),
            c.start(),
        ),
    )
    .unwrap();
    let expected = reference::matmul(m, k, nn, &am, &bm).unwrap();
    assert_eq!(bits(&get(s, &c)), bits(&expected));
}

#[test]
fn operands_may_alias() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    let y = put(&rt, s, &[1.0, 2.0]);
    let x = put(&rt, s, &[10.0, 20.0]);
    // y = 3 * x + y, in place.
    run(
        &rt,
        s,
        &KernelDescriptor::axpy(2, 3.0, x.start(), y.start(), y.start()),
    )
    .unwrap();
    assert_eq!(get(s, &y), vec![31.0, 62.0]);
    // a = a * a
    run(
        &rt,
        s,
        &KernelDescriptor::mul(2, x.start(), x.start(), x.start()),
    )
    .unwrap();
    assert_eq!(get(s, &x), vec![100.0, 400.0]);
    // C = A · A with C = A (2x2).
    let a = put(&rt, s, &[1.0, 2.0, 3.0, 4.0]);
    run(
        &rt,
        s,
        &KernelDescriptor::matmul(2, 2, 2, a.start(), a.start(), a.start()),
    )
    .unwrap();
    assert_eq!(get(s, &a), vec![7.0, 10.0, 15.0, 22.0]);
}

#[test]
fn operands_at_an_offset_inside_an_allocation() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    let buffer = put(&rt, s, &[0.0; 64]);
    let at = |element: u64| LogicalAddress {
        offset: buffer.start().offset + 4 * element,
        ..buffer.start()
    };
    run(&rt, s, &KernelDescriptor::fill(4, 9.0, at(60))).unwrap();
    let values = get(s, &buffer);
    assert_eq!(&values[56..], &[0.0, 0.0, 0.0, 0.0, 9.0, 9.0, 9.0, 9.0]);
    // One element past the end of the allocation is refused.
    let err = run(&rt, s, &KernelDescriptor::fill(5, 9.0, at(60))).unwrap_err();
    assert_eq!(err.status(), Status::EXECUTION_FAILED);
}

/// Runs `program` on a fresh stream and returns its error message.
fn failure(rt: &MockRuntime, program: Vec<u8>) -> String {
    let s = stream(rt);
    let err = run_bytes(rt, s, program).unwrap_err();
    assert_eq!(err.status(), Status::EXECUTION_FAILED, "{err}");
    assert_eq!(err.call(), "launch_compute");
    err.message().to_string()
}

#[test]
fn bad_descriptors_fail_the_operation_with_a_named_problem() {
    let rt = runtime(1);
    let s = rt.default_mock_stream();
    let a = put(&rt, s, &[1.0; 8]);
    let out = rt.allocate(32).unwrap();
    let good = KernelDescriptor::copy(8, a.start(), out.start());
    let patched = |f: &dyn Fn(&mut [u8; 128])| {
        let mut bytes = good.to_bytes();
        f(&mut bytes);
        bytes.to_vec()
    };

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (patched(&|b| b[1] = 0), "bad magic"),
        (patched(&|b| b[4] = 9), "unsupported descriptor version 9"),
        (patched(&|b| b[6] = 42), "unknown kernel id 42"),
        (
            patched(&|b| b[8] = 3),
            "kernel copy takes 2 argument(s), but num_args is 3",
        ),
        (patched(&|b| b[120] = 1), "reserved byte 120"),
        (patched(&|b| b[16] = 0), "dims[0] (n) of at least 1"),
        (patched(&|b| b[32] = 4), "unused dims[2] is 4"),
        (patched(&|b| b[80] = 4), "unused argument slot 2"),
        (
            KernelDescriptor::copy(9, a.start(), out.start())
                .to_bytes()
                .to_vec(),
            "argument 0 (a) of kernel copy",
        ),
        (
            KernelDescriptor::copy(
                8,
                a.start(),
                LogicalAddress {
                    region_id: 3,
                    offset: 0,
                },
            )
            .to_bytes()
            .to_vec(),
            "argument 1 (out) of kernel copy (region 3 +0, 32 bytes) is not inside a live allocation",
        ),
        (
            KernelDescriptor::copy(
                8,
                a.start(),
                LogicalAddress {
                    region_id: 4000,
                    offset: 0,
                },
            )
            .to_bytes()
            .to_vec(),
            "not inside a live allocation",
        ),
        (
            KernelDescriptor::copy(u64::MAX / 4 + 1, a.start(), out.start())
                .to_bytes()
                .to_vec(),
            "size of argument a overflows",
        ),
        (
            KernelDescriptor::matmul(1 << 33, 1 << 33, 1, a.start(), a.start(), out.start())
                .to_bytes()
                .to_vec(),
            "size of argument a overflows",
        ),
        (
            KernelDescriptor::matmul(2, 3, 3, a.start(), a.start(), out.start())
                .to_bytes()
                .to_vec(),
            "argument 1 (b) of kernel matmul",
        ),
        (vec![0; 64], "has 64 bytes; a kernel descriptor needs 128"),
    ];
    for (program, needle) in cases {
        let message = failure(&rt, program);
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
    // Nothing was written by any failed kernel, and the engine still runs.
    let out_bytes = download(s, &out).unwrap();
    assert!(out_bytes.iter().all(|&b| b == 0));
    run(&rt, s, &good).unwrap();
    assert_eq!(get(s, &out), vec![1.0; 8]);
}

#[test]
fn a_program_in_freed_memory_fails() {
    let rt = runtime(1);
    let s = rt.default_mock_stream();
    let out = rt.allocate(4).unwrap();
    let program = upload(
        &rt,
        s,
        KernelDescriptor::fill(1, 1.0, out.start())
            .to_bytes()
            .to_vec(),
    );
    s.synchronize().unwrap();
    rt.free(&program).unwrap();
    s.launch_compute(&program, LaunchOptions::new()).unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::EXECUTION_FAILED);
    assert!(
        err.message().contains("not inside a live allocation"),
        "{err}"
    );
}

#[test]
fn an_operand_may_not_span_chunks() {
    let rt = MockSystem::builder()
        .memory_bytes(1024)
        .region_bytes(512)
        .build()
        .unwrap()
        .create_mock_runtime(0)
        .unwrap();
    let s = rt.default_mock_stream();
    let program = rt.allocate(128).unwrap();
    let spread = rt.allocate(600).unwrap();
    assert_eq!(spread.chunks().len(), 2);
    s.launch_fill(&spread, 1.0, DataFormat::Fp32, LaunchOptions::new())
        .unwrap();
    s.launch_h2d(
        &HostBuffer::from_vec(
            KernelDescriptor::fill(150, 2.0, spread.start())
                .to_bytes()
                .to_vec(),
        ),
        &program,
        LaunchOptions::new(),
    )
    .unwrap();
    s.launch_compute(&program, LaunchOptions::new()).unwrap();
    let err = s.synchronize().unwrap_err();
    assert!(
        err.message()
            .contains("past the end of one allocated chunk"),
        "{err}"
    );
}

#[test]
fn fill_converts_to_every_format() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    let dst = rt.allocate(8).unwrap();
    let fill = |value: f64, format: DataFormat| {
        s.launch_fill(&dst, value, format, LaunchOptions::new())
            .unwrap();
        download(s, &dst).unwrap()
    };
    assert_eq!(
        fill(0.1, DataFormat::Fp32),
        [0.1f32.to_le_bytes(); 2].concat()
    );
    assert_eq!(fill(-1.5, DataFormat::Fp16), [0x00, 0xBE].repeat(4));
    assert_eq!(fill(65504.0, DataFormat::Fp16), [0xFF, 0x7B].repeat(4));
    assert_eq!(
        fill(-7.9, DataFormat::Int32),
        [(-7i32).to_le_bytes(); 2].concat()
    );
    assert_eq!(
        fill(3e9, DataFormat::Int32),
        [i32::MAX.to_le_bytes(); 2].concat()
    );
    assert_eq!(fill(255.9, DataFormat::Uint8), vec![255; 8]);
    assert_eq!(fill(1e3, DataFormat::Uint8), vec![255; 8]);
    assert_eq!(fill(-0.5, DataFormat::Uint8), vec![0; 8]);
}

#[test]
fn fill_spans_chunks_and_checks_element_size() {
    let rt = MockSystem::builder()
        .memory_bytes(1024)
        .region_bytes(256)
        .build()
        .unwrap()
        .create_mock_runtime(0)
        .unwrap();
    let s = rt.default_mock_stream();
    let dst = rt.allocate(602).unwrap();
    assert_eq!(dst.chunks().len(), 3);
    s.launch_fill(&dst, 3.0, DataFormat::Fp16, LaunchOptions::new())
        .unwrap();
    assert_eq!(download(s, &dst).unwrap(), [0x00, 0x42].repeat(301));
    let err = s
        .launch_fill(&dst, 3.0, DataFormat::Fp32, LaunchOptions::new())
        .unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(err.message().contains("602 bytes"), "{err}");
}

/// A compute whose output is the first write to a region the host cannot
/// back fails with `OUT_OF_MEMORY`, as a copy or fill there does (the
/// crate's memory rule), naming the region. Before, it failed with
/// `EXECUTION_FAILED` (found by attack).
#[test]
#[cfg_attr(miri, ignore = "Miri cannot read the host's available memory")]
fn a_compute_into_a_region_the_host_cannot_back_is_out_of_memory() {
    let rt = MockSystem::builder()
        .memory_bytes((1 << 61) + 4096)
        .region_bytes(1 << 61)
        .build()
        .unwrap()
        .create_mock_runtime(0)
        .unwrap();
    let s = rt.default_mock_stream();
    let huge = rt.allocate(1 << 61).unwrap();
    let x = put(&rt, s, &[1.0; 4]);
    let descriptor = KernelDescriptor::axpy(4, 1.0, x.start(), x.start(), huge.start());
    let err = run(&rt, s, &descriptor).unwrap_err();
    assert_eq!(err.status(), Status::OUT_OF_MEMORY, "{err}");
    assert!(err.message().contains("memory region 0"), "{err}");
}
