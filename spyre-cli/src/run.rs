//! `spyre run`: the verified workload.
//!
//! `--threads` host threads each run `--iterations` iterations, keeping up to
//! `--in-flight` of them outstanding. An iteration takes a stream from the
//! pool (priority 0 and -1 alternate, so both pools and all their streams are
//! used), allocates its operands and a 128-byte kernel descriptor in device
//! memory, and enqueues on that stream, in order:
//!
//! 1. H2D of the first input (`x` or `A`),
//! 2. H2D of the second input (`y` or `B`),
//! 3. H2D of the kernel descriptor,
//! 4. compute,
//! 5. D2H of the result, whose completion signals the thread.
//!
//! While the device works the thread computes the expected result on the
//! host ([`crate::verify`]). When the thread waits for the iteration, it
//! frees the device memory and compares the result bit for bit. The first
//! failure stops every thread and is reported with its thread, iteration and
//! stream.

use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use spyre_stream::program::{DESCRIPTOR_SIZE, KernelDescriptor};
use spyre_stream::{
    ADDRESS_ALIGNMENT, CompositeAddress, Device, DeviceSource, FlexError, HostBuffer,
    LaunchOptions, LogicalAddress, MemoryLayout, SpyreStream, Status,
};
use spyre_testkit::SplitMix64;

use crate::cli::{KernelArg, RunArgs};
use crate::error::{CliError, FailureKind, IterationFailure, IterationPlace};
use crate::estimate;
use crate::size::format_size;
use crate::verify;

/// Launches per iteration: three H2D copies, one compute, one D2H copy.
pub const LAUNCHES_PER_ITERATION: u64 = 5;
/// H2D copies per iteration.
pub const H2D_PER_ITERATION: u64 = 3;

/// Size of the kernel descriptor in bytes, as a `u64`.
const DESCRIPTOR_BYTES: u64 = DESCRIPTOR_SIZE as u64;
/// Device allocations per iteration, each of [`Plan::block_bytes`].
const BLOCKS_PER_ITERATION: u64 = 3;

/// The shape of one iteration, derived from `--kernel` and `--size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The kernel.
    pub kernel: KernelArg,
    /// axpy: elements per vector; matmul: the side of each square matrix.
    pub n: u64,
    /// `f32` elements in each operand.
    pub elements: usize,
    /// Bytes of each operand (two inputs and the output are the same size).
    pub operand_bytes: u64,
    /// [`Plan::operand_bytes`] as a host length.
    pub operand_len: usize,
}

impl Plan {
    /// The plan for `kernel` with `size` bytes of operands per iteration:
    /// axpy gets three vectors of `size / 12` elements, matmul three n×n
    /// matrices with `n = floor(sqrt(size / 12))`.
    ///
    /// # Errors
    /// [`CliError::Usage`] naming the size when it is below 12 bytes (one
    /// `f32` per operand) or too large for this host.
    pub fn new(kernel: KernelArg, size: u64) -> Result<Self, CliError> {
        let per_operand = size / 12;
        if per_operand == 0 {
            return Err(CliError::Usage(format!(
                "--size {size} is too small for {}: expected at least 12 bytes (one f32 in each of the two inputs and the output)",
                kernel.name()
            )));
        }
        let n = match kernel {
            KernelArg::Axpy => per_operand,
            KernelArg::Matmul => per_operand.isqrt(),
        };
        let elements_u64 = match kernel {
            KernelArg::Axpy => n,
            KernelArg::Matmul => n * n,
        };
        let too_large = || {
            CliError::Usage(format!(
                "--size {size} ({}) is too large for this host",
                format_size(size)
            ))
        };
        let elements = usize::try_from(elements_u64).map_err(|_| too_large())?;
        let operand_bytes = elements_u64.checked_mul(4).ok_or_else(too_large)?;
        let operand_len = usize::try_from(operand_bytes).map_err(|_| too_large())?;
        Ok(Self {
            kernel,
            n,
            elements,
            operand_bytes,
            operand_len,
        })
    }

    /// The kernel's dims as the descriptor takes them: `[n]` or `[m, k, n]`.
    pub fn dims(&self) -> Vec<u64> {
        match self.kernel {
            KernelArg::Axpy => vec![self.n],
            KernelArg::Matmul => vec![self.n; 3],
        }
    }

    /// Bytes copied host to device per iteration: two inputs and the descriptor.
    pub fn h2d_bytes(&self) -> u64 {
        2 * self.operand_bytes + DESCRIPTOR_BYTES
    }

    /// Bytes copied device to host per iteration: the output.
    pub fn d2h_bytes(&self) -> u64 {
        self.operand_bytes
    }

    /// Bytes of one device block: an operand rounded up to the 128-byte
    /// address alignment, plus 128 bytes. An iteration allocates three
    /// blocks of this one size (the two inputs and the output; the program
    /// lives in the tail of the first), so that every allocation of a run has
    /// the same size: the device's first-fit allocator then never fragments,
    /// and how many iterations fit in memory can be computed exactly
    /// ([`MemoryLayout::blocks_held`]).
    pub fn block_bytes(&self) -> u64 {
        self.operand_bytes
            .checked_next_multiple_of(ADDRESS_ALIGNMENT)
            .and_then(|operand| operand.checked_add(DESCRIPTOR_BYTES))
            .unwrap_or(u64::MAX)
    }

    /// The 128-byte program for operands at `a`, `b` and `out`.
    fn descriptor(
        &self,
        alpha: f32,
        a: &CompositeAddress,
        b: &CompositeAddress,
        out: &CompositeAddress,
    ) -> [u8; DESCRIPTOR_SIZE] {
        match self.kernel {
            KernelArg::Axpy => {
                KernelDescriptor::axpy(self.n, alpha, a.start(), b.start(), out.start())
            }
            KernelArg::Matmul => {
                KernelDescriptor::matmul(self.n, self.n, self.n, a.start(), b.start(), out.start())
            }
        }
        .to_bytes()
    }
}

/// What a finished run measured; see [`crate::report::RunReport`].
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// The backend's name.
    pub backend: &'static str,
    /// The logical device the process ran on.
    pub device: u8,
    /// What chose that device.
    pub device_source: DeviceSource,
    /// The plan every iteration followed.
    pub plan: Plan,
    /// Iterations whose result matched the reference.
    pub verified: u64,
    /// Launches by stream id.
    pub launches_by_stream: BTreeMap<i64, u64>,
    /// Time from the first submission to the last check.
    pub wall: Duration,
}

/// Runs the workload.
///
/// # Errors
/// [`CliError::Usage`] for sizes the device cannot hold; the stream layer's
/// start error; [`CliError::Iteration`] for the first iteration that failed.
pub fn run(args: &RunArgs) -> Result<RunOutcome, CliError> {
    let plan = Plan::new(args.kernel, args.size)?;
    let total = (args.threads as u64)
        .checked_mul(args.iterations)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--threads {} × --iterations {} is more iterations than can be counted",
                args.threads, args.iterations
            ))
        })?;
    spyre_stream::start_runtime().map_err(|e| CliError::stream("starting the Spyre runtime", e))?;
    let info = spyre_stream::runtime_info()
        .ok_or_else(|| CliError::Failed("the Spyre runtime did not start".into()))?;
    let layout = spyre_stream::memory_layout(Device::CURRENT)
        .map_err(|e| CliError::stream("reading the device's memory layout", e))?;
    if let Some(layout) = layout {
        check_capacity(&plan, args, layout)?;
    }
    if plan.kernel == KernelArg::Matmul
        && info.backend == "mock"
        && let Some(warning) =
            estimate::matmul_warning(plan.n, total, args.threads, estimate::measure_rate())
    {
        eprintln!("{warning}");
    }
    tracing::info!(
        backend = info.backend,
        kernel = plan.kernel.name(),
        n = plan.n,
        operand_bytes = plan.operand_bytes,
        "spyre run starting"
    );

    let progress = progress_bar(total);
    let shared = Shared {
        plan,
        args,
        stop: AtomicBool::new(false),
        failures: Mutex::new(Vec::new()),
        progress: progress.clone(),
    };
    let start = Instant::now();
    let results: Vec<Option<ThreadStats>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(args.threads);
        for thread in 0..args.threads {
            let shared = &shared;
            let spawned = std::thread::Builder::new()
                .name(format!("spyre-run-{thread}"))
                .spawn_scoped(scope, move || shared.worker(thread));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    shared.fail_with(CliError::Failed(format!(
                        "cannot start host thread {thread}: {e}"
                    )));
                    break;
                }
            }
        }
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(stats) => stats,
                Err(_) => {
                    shared.fail_with(CliError::Failed("a host thread panicked".into()));
                    None
                }
            })
            .collect()
    });
    let wall = start.elapsed();
    progress.finish_and_clear();

    let mut failures = shared
        .failures
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !failures.is_empty() {
        let others = failures.len() - 1;
        if others > 0 {
            tracing::warn!("{others} more iteration(s) failed after the first");
        }
        return Err(failures.swap_remove(0));
    }
    let mut launches_by_stream = BTreeMap::new();
    let mut verified = 0;
    for stats in results.into_iter().flatten() {
        verified += stats.verified;
        for (id, launches) in stats.launches_by_stream {
            *launches_by_stream.entry(id).or_insert(0) += launches;
        }
    }
    Ok(RunOutcome {
        backend: info.backend,
        device: info.device,
        device_source: info.device_source,
        plan,
        verified,
        launches_by_stream,
        wall,
    })
}
/// Refuses a run that the software device's memory cannot hold, before any
/// work starts: an operand larger than a region, or more iterations in
/// flight than the device holds blocks for. With the memory layout known
/// (the software device reports it), an accepted run never runs out of
/// device memory.
fn check_capacity(plan: &Plan, args: &RunArgs, layout: MemoryLayout) -> Result<(), CliError> {
    let MemoryLayout {
        total_bytes: memory,
        region_bytes: region,
    } = layout;
    let block = plan.block_bytes();
    if block > region {
        let largest_operand = (region - DESCRIPTOR_BYTES) / ADDRESS_ALIGNMENT * ADDRESS_ALIGNMENT;
        return Err(CliError::Usage(format!(
            "--size {} needs operands of {} bytes ({}), but one memory region of the device holds {} bytes ({}) and a kernel operand must lie in one region; use a --size of at most {}",
            args.size,
            plan.operand_bytes,
            format_size(plan.operand_bytes),
            region,
            format_size(region),
            largest_operand.saturating_mul(3)
        )));
    }
    let blocks_held = layout.blocks_held(block);
    let iterations_held = blocks_held / BLOCKS_PER_ITERATION;
    if iterations_held == 0 {
        return Err(CliError::Usage(format!(
            "--size {} needs {BLOCKS_PER_ITERATION} blocks of {block} bytes per iteration, each in one memory region, but the device has {memory} bytes ({}) in regions of {region} bytes, which hold {blocks_held} such blocks; use a smaller --size",
            args.size,
            format_size(memory)
        )));
    }
    let in_flight = (args.threads as u64).saturating_mul(args.in_flight as u64);
    if in_flight > iterations_held {
        return Err(CliError::Usage(format!(
            "--size {} with --threads {} and --in-flight {} keeps {in_flight} iterations in flight, each in {BLOCKS_PER_ITERATION} blocks of {block} bytes that must each lie in one memory region, but the device has {memory} bytes ({}) in regions of {region} bytes, which hold {iterations_held} such iterations at once; lower --in-flight, --threads or --size",
            args.size,
            args.threads,
            args.in_flight,
            format_size(memory)
        )));
    }
    Ok(())
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} iterations verified ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar
}

/// What every worker thread shares.
struct Shared<'a> {
    plan: Plan,
    args: &'a RunArgs,
    /// Set when any iteration fails: the others stop submitting.
    stop: AtomicBool,
    /// Failures in the order they were found.
    failures: Mutex<Vec<CliError>>,
    progress: ProgressBar,
}

/// What one worker thread did.
#[derive(Default)]
struct ThreadStats {
    verified: u64,
    launches_by_stream: BTreeMap<i64, u64>,
}

/// An iteration whose work is enqueued.
struct Pending {
    place: IterationPlace,
    stream: SpyreStream,
    memory: DeviceMemory,
    output: HostBuffer,
    expected: Vec<f32>,
    done: mpsc::Receiver<Result<(), FlexError>>,
}

/// The device allocations of one iteration, freed explicitly once the
/// stream no longer uses them.
struct DeviceMemory {
    addresses: Vec<CompositeAddress>,
}

impl DeviceMemory {
    /// Frees every allocation; all are attempted, the first error is returned.
    fn free(self) -> Result<(), spyre_stream::Error> {
        let mut first = Ok(());
        for address in &self.addresses {
            if let Err(e) = spyre_stream::free(Device::CURRENT, address)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

impl Shared<'_> {
    fn fail_with(&self, error: CliError) {
        self.stop.store(true, Ordering::Release);
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(error);
    }

    fn fail(&self, failure: IterationFailure) {
        self.fail_with(CliError::Iteration(Box::new(failure)));
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// One host thread: submit, keep `in_flight` outstanding, check the
    /// oldest. Returns `None` if anything failed (the failure is recorded).
    fn worker(&self, thread: usize) -> Option<ThreadStats> {
        let mut stats = ThreadStats::default();
        let mut pending: VecDeque<Pending> = VecDeque::with_capacity(self.args.in_flight);
        let mut ok = true;
        for iteration in 0..self.args.iterations {
            if self.stopped() {
                ok = false;
                break;
            }
            if pending.len() == self.args.in_flight
                && let Some(oldest) = pending.pop_front()
                && let Err(failure) = self.finish(oldest, &mut stats)
            {
                self.fail(failure);
                ok = false;
                break;
            }
            match self.submit(thread, iteration) {
                Ok(p) => {
                    *stats
                        .launches_by_stream
                        .entry(p.stream.id().get())
                        .or_insert(0) += LAUNCHES_PER_ITERATION;
                    pending.push_back(p);
                }
                Err(failure) => {
                    self.fail(failure);
                    ok = false;
                    break;
                }
            }
        }
        while let Some(oldest) = pending.pop_front() {
            if ok {
                if let Err(failure) = self.finish(oldest, &mut stats) {
                    self.fail(failure);
                    ok = false;
                }
            } else {
                self.discard(oldest);
            }
        }
        ok.then_some(stats)
    }

    /// Takes a stream, allocates, launches the five operations and computes
    /// the expected result.
    fn submit(&self, thread: usize, iteration: u64) -> Result<Pending, IterationFailure> {
        let mut place = IterationPlace {
            thread,
            iteration,
            stream_id: None,
        };
        let priority = if (thread as u64 + iteration).is_multiple_of(2) {
            0
        } else {
            -1
        };
        let stream =
            spyre_stream::stream_from_pool(Device::CURRENT, priority).map_err(|source| {
                IterationFailure {
                    place,
                    kind: FailureKind::Device {
                        step: format!("taking a stream of priority {priority} from the pool"),
                        source,
                    },
                }
            })?;
        place.stream_id = Some(stream.id().get());

        let mut memory = DeviceMemory {
            addresses: Vec::with_capacity(4),
        };
        let operands = match self.allocate_operands(&mut memory, place) {
            Ok(operands) => operands,
            Err(failure) => {
                if let Err(e) = memory.free() {
                    tracing::warn!(error = %e, "freeing device memory failed");
                }
                return Err(failure);
            }
        };

        let plan = &self.plan;
        let mut rng = SplitMix64::new(verify::iteration_seed(self.args.seed, thread, iteration));
        let alpha = match plan.kernel {
            KernelArg::Axpy => rng.next_f32(),
            KernelArg::Matmul => 0.0,
        };
        let a = rng.f32s(plan.elements);
        let b = rng.f32s(plan.elements);
        let output = HostBuffer::zeroed(plan.operand_len);
        let (tx, done) = mpsc::channel();
        let inputs = [
            HostBuffer::from_vec(verify::to_le_bytes(&a)),
            HostBuffer::from_vec(verify::to_le_bytes(&b)),
        ];
        let completion = LaunchOptions::new().on_complete(move |result| {
            // The receiver is gone only when the thread has given up.
            let _ = tx.send(result);
        });
        if let Err((step, source)) =
            self.launch(stream, &operands, &inputs, alpha, &output, completion)
        {
            self.release(stream, memory);
            return Err(IterationFailure {
                place,
                kind: FailureKind::Device { step, source },
            });
        }

        // Computed while the device works.
        let expected = match plan.kernel {
            KernelArg::Axpy => verify::axpy(alpha, &a, &b),
            KernelArg::Matmul => {
                // n ≤ n², which fits `usize`.
                verify::matmul_square(plan.n as usize, &a, &b).unwrap_or_default()
            }
        };
        Ok(Pending {
            place,
            stream,
            memory,
            output,
            expected,
            done,
        })
    }

    /// Allocates the iteration's three blocks (see [`Plan::block_bytes`]),
    /// each recorded in `memory` as soon as it is made, and returns the
    /// addresses of the two inputs, the output and the program (in the tail
    /// of the first block).
    fn allocate_operands(
        &self,
        memory: &mut DeviceMemory,
        place: IterationPlace,
    ) -> Result<[CompositeAddress; 4], IterationFailure> {
        let block = self.plan.block_bytes();
        let mut take = || {
            let address = self.allocate(block, place)?;
            memory.addresses.push(address.clone());
            Ok(address.start())
        };
        let [a, b, out] = [take()?, take()?, take()?];
        let operand = self.plan.operand_bytes;
        let program_offset = block - DESCRIPTOR_BYTES;
        let at = |start: LogicalAddress, offset: u64, size: u64| {
            CompositeAddress::single(
                LogicalAddress {
                    region_id: start.region_id,
                    offset: start.offset + offset,
                },
                size,
            )
            .map_err(|source| IterationFailure {
                place,
                kind: FailureKind::Device {
                    step: "addressing an operand".into(),
                    source: source.into(),
                },
            })
        };
        Ok([
            at(a, 0, operand)?,
            at(b, 0, operand)?,
            at(out, 0, operand)?,
            at(a, program_offset, DESCRIPTOR_BYTES)?,
        ])
    }

    /// Enqueues the iteration's five operations on `stream`; `completion`
    /// goes with the final D2H. On error, returns the step that failed.
    fn launch(
        &self,
        stream: SpyreStream,
        [a_dev, b_dev, out_dev, program]: &[CompositeAddress; 4],
        [a, b]: &[HostBuffer; 2],
        alpha: f32,
        output: &HostBuffer,
        completion: LaunchOptions,
    ) -> Result<(), (String, spyre_stream::Error)> {
        let plan = &self.plan;
        let (a_name, b_name, out_name) = match plan.kernel {
            KernelArg::Axpy => ("x", "y", "out"),
            KernelArg::Matmul => ("A", "B", "C"),
        };
        let at = |step: String| move |source| (step, source);
        let descriptor =
            HostBuffer::from_vec(plan.descriptor(alpha, a_dev, b_dev, out_dev).to_vec());
        stream
            .launch_h2d(a, a_dev, LaunchOptions::new())
            .map_err(at(format!("H2D of {a_name}")))?;
        stream
            .launch_h2d(b, b_dev, LaunchOptions::new())
            .map_err(at(format!("H2D of {b_name}")))?;
        stream
            .launch_h2d(&descriptor, program, LaunchOptions::new())
            .map_err(at("H2D of the kernel descriptor".into()))?;
        stream
            .launch_compute(program, LaunchOptions::new())
            .map_err(at(format!("compute ({})", plan.kernel.name())))?;
        stream
            .launch_d2h(out_dev, output, completion)
            .map_err(at(format!("D2H of {out_name}")))
    }

    /// Allocates `bytes` of device memory in one chunk (a kernel operand
    /// must lie in one chunk).
    fn allocate(
        &self,
        bytes: u64,
        place: IterationPlace,
    ) -> Result<CompositeAddress, IterationFailure> {
        let address =
            spyre_stream::allocate(Device::CURRENT, bytes).map_err(|error| IterationFailure {
                place,
                kind: match error {
                    spyre_stream::Error::Flex(source)
                        if source.status() == Status::OUT_OF_MEMORY =>
                    {
                        FailureKind::OutOfMemory { bytes, source }
                    }
                    source => FailureKind::Device {
                        step: format!("allocating {bytes} bytes of device memory"),
                        source,
                    },
                },
            })?;
        if address.chunks().len() == 1 {
            return Ok(address);
        }
        let chunks = address.chunks().len();
        if let Err(e) = spyre_stream::free(Device::CURRENT, &address) {
            tracing::warn!(error = %e, "freeing a split allocation failed");
        }
        Err(IterationFailure {
            place,
            kind: FailureKind::OutOfMemory {
                bytes,
                source: FlexError::new(
                    Status::OUT_OF_MEMORY,
                    "allocate",
                    format!(
                        "no free range holds {bytes} bytes in one piece (the allocation came back in {chunks} chunks, and a kernel operand must lie in one)"
                    ),
                ),
            },
        })
    }

    /// After a failure: waits for the stream (errors ignored; the failure is
    /// already recorded) and frees the memory.
    fn release(&self, stream: SpyreStream, memory: DeviceMemory) {
        if let Err(e) = stream.synchronize() {
            tracing::debug!(stream = stream.id().get(), error = %e, "stream failed while releasing an iteration");
        }
        if let Err(e) = memory.free() {
            tracing::warn!(error = %e, "freeing device memory failed");
        }
    }

    /// Waits for an iteration whose results are not needed any more.
    fn discard(&self, pending: Pending) {
        let _ = pending.done.recv();
        self.release(pending.stream, pending.memory);
    }

    /// Waits for the oldest iteration, frees its memory and checks its result.
    fn finish(&self, pending: Pending, stats: &mut ThreadStats) -> Result<(), IterationFailure> {
        let Pending {
            place,
            stream,
            memory,
            output,
            expected,
            done,
        } = pending;
        let device_error = |step: &str, source: spyre_stream::Error| IterationFailure {
            place,
            kind: FailureKind::Device {
                step: step.to_owned(),
                source,
            },
        };
        let completion = done.recv();
        if !matches!(completion, Ok(Ok(()))) {
            // The stream's first error says more than the D2H's
            // STREAM_FAILED; synchronize returns it (errors are sticky).
            let first = stream.synchronize().err();
            if let Err(e) = memory.free() {
                tracing::warn!(error = %e, "freeing device memory failed");
            }
            let source = match (first, completion) {
                (Some(first), _) => first,
                (None, Ok(Err(e))) => e.into(),
                (None, _) => spyre_stream::Error::Flex(FlexError::new(
                    Status::INTERNAL,
                    "launch_d2h",
                    "the completion was dropped without being called",
                )),
            };
            return Err(device_error("running the iteration", source));
        }
        memory
            .free()
            .map_err(|e| device_error("freeing device memory", e))?;
        verify::check_bitwise(&expected, &output.read()).map_err(|mismatch| IterationFailure {
            place,
            kind: FailureKind::Mismatch(mismatch),
        })?;
        stats.verified += 1;
        self.progress.inc(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axpy_plan() {
        let plan = Plan::new(KernelArg::Axpy, 1 << 20).unwrap();
        assert_eq!(plan.n, 87_381);
        assert_eq!(plan.elements, 87_381);
        assert_eq!(plan.operand_bytes, 349_524);
        assert_eq!(plan.dims(), vec![87_381]);
        assert_eq!(plan.h2d_bytes(), 2 * 349_524 + 128);
        assert_eq!(plan.d2h_bytes(), 349_524);
        // 349_524 rounded up to 128 is 349_568; plus the 128-byte tail.
        assert_eq!(plan.block_bytes(), 349_696);
        let tiny = Plan::new(KernelArg::Axpy, 12).unwrap();
        assert_eq!((tiny.n, tiny.operand_bytes), (1, 4));
    }

    #[test]
    fn matmul_plan() {
        let plan = Plan::new(KernelArg::Matmul, 4096).unwrap();
        assert_eq!(plan.n, 18); // 4096 / 12 = 341; floor(sqrt(341)) = 18
        assert_eq!(plan.elements, 324);
        assert_eq!(plan.operand_bytes, 1296);
        assert_eq!(plan.dims(), vec![18, 18, 18]);
        let plan = Plan::new(KernelArg::Matmul, 1 << 20).unwrap();
        assert_eq!(plan.n, 295);
    }

    #[test]
    fn too_small_sizes_name_the_value() {
        for kernel in [KernelArg::Axpy, KernelArg::Matmul] {
            let err = Plan::new(kernel, 11).unwrap_err();
            assert_eq!(err.exit_code(), crate::error::EXIT_USAGE);
            let message = err.to_string();
            assert!(message.contains("--size 11 is too small"), "{message}");
            assert!(message.contains("at least 12 bytes"), "{message}");
        }
    }

    #[test]
    fn descriptors_match_the_device_format() {
        let plan = Plan::new(KernelArg::Matmul, 4096).unwrap();
        let at = |offset| {
            CompositeAddress::single(
                LogicalAddress {
                    region_id: 1,
                    offset,
                },
                1296,
            )
            .unwrap()
        };
        let bytes = plan.descriptor(0.0, &at(0), &at(1408), &at(2816));
        let parsed = KernelDescriptor::parse(&bytes).unwrap();
        assert_eq!(parsed.dims, [18, 18, 18]);
    }
}
