//! One host thread of `spyre run`: its iterations, each on a pool stream,
//! with up to `--in-flight` outstanding, checked against the host
//! reference as they complete.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use indicatif::ProgressBar;
use spyre_stream::{
    CompositeAddress, Device, FlexError, HostBuffer, LaunchOptions, LogicalAddress, SpyreStream,
    Status,
};
use spyre_testkit::SplitMix64;

use super::plan::{DESCRIPTOR_BYTES, LAUNCHES_PER_ITERATION, Plan};
use crate::cli::{KernelArg, RunArgs};
use crate::error::{CliError, FailureKind, IterationFailure, IterationPlace};
use crate::verify;

/// What every worker thread shares.
pub(super) struct Shared<'a> {
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
pub(super) struct ThreadStats {
    /// Iterations whose result matched the reference.
    pub(super) verified: u64,
    /// Launches by stream id.
    pub(super) launches_by_stream: BTreeMap<i64, u64>,
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

impl<'a> Shared<'a> {
    /// The state of a run of `plan` with `args`, reporting to `progress`.
    pub(super) fn new(plan: Plan, args: &'a RunArgs, progress: ProgressBar) -> Self {
        Self {
            plan,
            args,
            stop: AtomicBool::new(false),
            failures: Mutex::new(Vec::new()),
            progress,
        }
    }

    /// The failures, in the order they were found.
    pub(super) fn into_failures(self) -> Vec<CliError> {
        self.failures
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Shared<'_> {
    pub(super) fn fail_with(&self, error: CliError) {
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
    pub(super) fn worker(&self, thread: usize) -> Option<ThreadStats> {
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
