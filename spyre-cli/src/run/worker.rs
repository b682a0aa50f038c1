//! One host thread of `spyre run`: its iterations, on pool streams as
//! `--mode` says ([`Lane`]), with up to `--in-flight` outstanding, checked
//! against the host reference as they complete.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use indicatif::ProgressBar;
use spyre_stream::{Device, FlexError, HostBuffer, LaunchOptions, SpyreEvent, SpyreStream, Status};
use spyre_testkit::SplitMix64;

use super::buffers::IterationBuffers;
use super::capacity::lowerable;
use super::lane::{Lane, Overlap, Pipeline, Slot, StageEvents, pool_stream, release_pipeline};
use super::plan::Plan;
use crate::cli::{KernelArg, ModeArg, RunArgs};
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
    /// Threads that have checked their first window of iterations (the
    /// first `--in-flight`).
    warmed_up: AtomicUsize,
    /// The allocator's device allocations when every thread had checked
    /// its first window.
    allocations_at_warm_up: OnceLock<u64>,
}

/// What one worker thread did.
#[derive(Default)]
pub(super) struct ThreadStats {
    /// Iterations whose result matched the reference.
    pub(super) verified: u64,
    /// Launches by stream id.
    pub(super) launches_by_stream: BTreeMap<i64, u64>,
    /// Pipelined mode: the device time of the stages and their span.
    pub(super) overlap: Option<Overlap>,
}

/// The measurement of a pipelined thread, as its iterations are checked.
///
/// Iterations on different streams may run in any order on the device (an
/// iteration can finish before an earlier one starts), so the span runs from
/// the earliest stage start to the latest stage end, each measured as an
/// offset from the first iteration's start.
#[derive(Default)]
struct StageClock {
    stage_time: [std::time::Duration; 3],
    /// The first iteration's events; offsets are measured from its start.
    origin: Option<Arc<StageEvents>>,
    /// Earliest start and latest end seen, in seconds from the origin.
    earliest_start: f64,
    latest_end: f64,
}

/// Device time from `from` to `to` in seconds, negative when `to` completed
/// first.
fn offset(from: &SpyreEvent, to: &SpyreEvent) -> spyre_stream::Result<f64> {
    match from.elapsed_time(to) {
        Ok(forward) => Ok(forward.as_secs_f64()),
        Err(spyre_stream::Error::EventsOutOfOrder { by }) => Ok(-by.as_secs_f64()),
        Err(other) => Err(other),
    }
}

impl StageClock {
    fn add(&mut self, events: Arc<StageEvents>) -> spyre_stream::Result<()> {
        for (sum, time) in self.stage_time.iter_mut().zip(events.stage_times()?) {
            *sum += time;
        }
        let origin = self.origin.get_or_insert_with(|| Arc::clone(&events));
        let start = offset(&origin.bounds[0].0, &events.bounds[0].0)?;
        let end = offset(&origin.bounds[0].0, events.copied_out())?;
        self.earliest_start = self.earliest_start.min(start);
        self.latest_end = self.latest_end.max(end);
        Ok(())
    }

    /// The thread's overlap, once at least one iteration was checked.
    fn overlap(&self) -> Option<Overlap> {
        self.origin.as_ref()?;
        Some(Overlap {
            stage_time: self.stage_time,
            span: std::time::Duration::from_secs_f64(
                (self.latest_end - self.earliest_start).max(0.0),
            ),
        })
    }
}

/// An iteration whose work is enqueued.
struct Pending {
    place: IterationPlace,
    /// The streams it was launched on, with their launch counts.
    launches: Vec<(SpyreStream, u64)>,
    /// Its own device buffers; `None` in the pipelined mode (slots).
    memory: Option<IterationBuffers>,
    /// Pipelined mode: its stage events.
    stages: Option<Arc<StageEvents>>,
    output: HostBuffer,
    expected: Vec<f32>,
    done: mpsc::Receiver<Result<(), FlexError>>,
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
            warmed_up: AtomicUsize::new(0),
            allocations_at_warm_up: OnceLock::new(),
        }
    }

    /// The allocator's device allocations when every thread had checked
    /// its first window of `--in-flight` iterations (`None` if some thread
    /// ran no more than that).
    pub(super) fn allocations_at_warm_up(&self) -> Option<u64> {
        self.allocations_at_warm_up.get().copied()
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
        let mut lane = match self.lane(thread) {
            Ok(lane) => lane,
            Err(failure) => {
                self.fail(failure);
                return None;
            }
        };
        let mut stats = ThreadStats::default();
        let mut clock = StageClock::default();
        let mut pending: VecDeque<Pending> = VecDeque::with_capacity(self.args.in_flight);
        let mut ok = true;
        for iteration in 0..self.args.iterations {
            if self.stopped() {
                ok = false;
                break;
            }
            if pending.len() == self.args.in_flight
                && let Some(oldest) = pending.pop_front()
                && let Err(failure) = self.finish(oldest, &mut stats, &mut clock)
            {
                self.fail(failure);
                ok = false;
                break;
            }
            match self.submit(thread, iteration, &mut lane) {
                Ok(p) => {
                    for (stream, launches) in &p.launches {
                        *stats
                            .launches_by_stream
                            .entry(stream.id().get())
                            .or_insert(0) += launches;
                    }
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
                if let Err(failure) = self.finish(oldest, &mut stats, &mut clock) {
                    self.fail(failure);
                    ok = false;
                }
            } else {
                self.discard(oldest);
            }
        }
        if let Lane::Pipelined(pipeline) = lane {
            release_pipeline(pipeline);
        }
        if ok {
            stats.overlap = clock.overlap();
        }
        ok.then_some(stats)
    }

    /// The priority of `thread`'s `iteration`: 0 and -1 alternate, so both
    /// pools and all their streams are used.
    fn priority(thread: usize, iteration: u64) -> i32 {
        if (thread as u64 + iteration).is_multiple_of(2) {
            0
        } else {
            -1
        }
    }

    /// The thread's [`Lane`] for `--mode`: its one stream (serialized), or
    /// its two memory slots (pipelined).
    fn lane(&self, thread: usize) -> Result<Lane, IterationFailure> {
        let place = IterationPlace {
            thread,
            iteration: 0,
            stream_id: None,
        };
        match self.args.mode {
            ModeArg::PerIteration => Ok(Lane::PerIteration),
            ModeArg::Serialized => {
                let priority = Self::priority(thread, 0);
                pool_stream(priority)
                    .map(Lane::Serialized)
                    .map_err(|source| IterationFailure {
                        place,
                        kind: FailureKind::Device {
                            step: format!(
                                concat!(
                                    "taking a stream of priority {} from the pool",
                                    first_take!()
                                ),
                                priority
                            ),
                            source,
                        },
                    })
            }
            ModeArg::Pipelined => {
                // The slots belong to the default stream; every pool stream
                // that uses them is declared, so dropping them waits for it.
                let owner = spyre_stream::default_stream(Device::CURRENT).map_err(|source| {
                    IterationFailure {
                        place,
                        kind: FailureKind::Device {
                            step: concat!("taking the default stream", first_take!()).into(),
                            source,
                        },
                    }
                })?;
                let count = self.args.iterations.min(2) as usize;
                let mut slots = Vec::with_capacity(count);
                for _ in 0..count {
                    slots.push(Slot {
                        buffers: self.buffers(owner, place)?,
                    });
                }
                Ok(Lane::Pipelined(Pipeline {
                    slots,
                    last: [None, None],
                }))
            }
        }
    }

    /// Submits one iteration in the thread's lane and computes its expected
    /// result while the device works.
    fn submit(
        &self,
        thread: usize,
        iteration: u64,
        lane: &mut Lane,
    ) -> Result<Pending, IterationFailure> {
        let mut place = IterationPlace {
            thread,
            iteration,
            stream_id: None,
        };
        let priority = Self::priority(thread, iteration);
        let take_stream = |place: IterationPlace| {
            pool_stream(priority).map_err(|source| IterationFailure {
                place,
                kind: FailureKind::Device {
                    step: format!(
                        concat!(
                            "taking a stream of priority {} from the pool",
                            first_take!()
                        ),
                        priority
                    ),
                    source,
                },
            })
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

        let (launches, memory, stages) = match lane {
            Lane::PerIteration | Lane::Serialized(_) => {
                let stream = match lane {
                    Lane::Serialized(stream) => *stream,
                    _ => take_stream(place)?,
                };
                place.stream_id = Some(stream.id().get());
                let mut memory = self.buffers(stream, place)?;
                let streams = [stream; 3];
                if let Err((step, source)) = self.launch(
                    streams,
                    &mut memory,
                    &inputs,
                    alpha,
                    &output,
                    completion,
                    None,
                ) {
                    self.release(&[stream], Some(memory));
                    return Err(IterationFailure {
                        place,
                        kind: FailureKind::Device { step, source },
                    });
                }
                (vec![(stream, 5)], Some(memory), None)
            }
            Lane::Pipelined(pipeline) => {
                let streams = [
                    take_stream(place)?,
                    take_stream(place)?,
                    take_stream(place)?,
                ];
                place.stream_id = Some(streams[0].id().get());
                let slot = (iteration % pipeline.slots.len() as u64) as usize;
                let stages =
                    StageEvents::new()
                        .map(Arc::new)
                        .map_err(|source| IterationFailure {
                            place,
                            kind: FailureKind::Device {
                                step: "creating the stage events".into(),
                                source,
                            },
                        })?;
                let previous = pipeline.last[slot].take();
                let ordering = StageOrder {
                    stages: &stages,
                    previous: previous.as_deref(),
                };
                if let Err((step, source)) = self.launch(
                    streams,
                    &mut pipeline.slots[slot].buffers,
                    &inputs,
                    alpha,
                    &output,
                    completion,
                    Some(ordering),
                ) {
                    // Keep the slot's ordering: the next user of the slot waits
                    // for whatever of this iteration was enqueued.
                    pipeline.last[slot] = previous;
                    self.release(&streams, None);
                    return Err(IterationFailure {
                        place,
                        kind: FailureKind::Device { step, source },
                    });
                }
                pipeline.last[slot] = Some(Arc::clone(&stages));
                let launches = streams
                    .iter()
                    .zip([2, 2, 1])
                    .map(|(s, n)| (*s, n))
                    .collect();
                (launches, None, Some(stages))
            }
        };

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
            launches,
            memory,
            stages,
            output,
            expected,
            done,
        })
    }

    /// The buffers of an iteration (or slot) on `stream`.
    fn buffers(
        &self,
        stream: SpyreStream,
        place: IterationPlace,
    ) -> Result<IterationBuffers, IterationFailure> {
        IterationBuffers::allocate(stream, &self.plan).map_err(|(bytes, source)| {
            let out_of_memory = match &source {
                spyre_stream::Error::OutOfMemory(_) => true,
                spyre_stream::Error::Flex(e) => e.status() == Status::OUT_OF_MEMORY,
                _ => false,
            };
            IterationFailure {
                place,
                kind: if out_of_memory {
                    FailureKind::OutOfMemory {
                        bytes,
                        source,
                        lowerable: lowerable(self.args, &self.plan),
                    }
                } else {
                    FailureKind::Device {
                        step: format!("allocating {bytes} bytes of device memory"),
                        source,
                    }
                },
            }
        })
    }

    /// Enqueues the iteration's five operations: copy-in (H2D of both
    /// inputs) on `streams[0]`, the program's H2D and the compute on
    /// `streams[1]`, the D2H of the output on `streams[2]`, whose
    /// `completion` signals the thread. With `ordering` (pipelined), the
    /// stages are ordered by events, each bracketed by timed events; without
    /// it the three streams are one and its FIFO orders them. On error,
    /// returns the step that failed.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        [copy_in, compute, copy_out]: [SpyreStream; 3],
        buffers: &mut IterationBuffers,
        [a, b]: &[HostBuffer; 2],
        alpha: f32,
        output: &HostBuffer,
        completion: LaunchOptions,
        ordering: Option<StageOrder<'_>>,
    ) -> Result<(), (String, spyre_stream::Error)> {
        let plan = &self.plan;
        let (a_name, b_name, out_name) = match plan.kernel {
            KernelArg::Axpy => ("x", "y", "out"),
            KernelArg::Matmul => ("A", "B", "C"),
        };
        let at = |step: String| move |source| (step, source);
        let event_step =
            |what: &str, stream: SpyreStream| format!("{what} on stream {}", stream.id());
        // Each stage: the waits, then its start event, its work, its end event.
        let begin = |stage: usize, stream: SpyreStream, waits: &[Option<&SpyreEvent>]| {
            let Some(ordering) = &ordering else {
                return Ok(());
            };
            for event in waits.iter().flatten() {
                event
                    .wait(stream)
                    .map_err(at(event_step("waiting for an event", stream)))?;
            }
            ordering.stages.bounds[stage]
                .0
                .record(stream)
                .map_err(at(event_step("recording an event", stream)))
        };
        let end = |stage: usize, stream: SpyreStream| match &ordering {
            None => Ok(()),
            Some(ordering) => ordering.stages.bounds[stage]
                .1
                .record(stream)
                .map_err(at(event_step("recording an event", stream))),
        };
        let previous = ordering.as_ref().and_then(|o| o.previous);

        begin(0, copy_in, &[previous.map(StageEvents::computed)])?;
        buffers
            .a
            .copy_from_host_buffer(copy_in, a)
            .map_err(at(format!("H2D of {a_name}")))?;
        buffers
            .b
            .copy_from_host_buffer(copy_in, b)
            .map_err(at(format!("H2D of {b_name}")))?;
        end(0, copy_in)?;

        let copied_in = ordering.as_ref().map(|o| &o.stages.bounds[0].1);
        begin(
            1,
            compute,
            &[copied_in, previous.map(StageEvents::copied_out)],
        )?;
        let descriptor = plan.descriptor(
            alpha,
            buffers.a.address(),
            buffers.b.address(),
            buffers.out.address(),
        );
        // The compute reaches the operands through its program.
        buffers
            .record_stream(compute)
            .map_err(at(event_step("declaring the buffers' use", compute)))?;
        buffers
            .program
            .copy_from_host_buffer(compute, &HostBuffer::from_vec(descriptor.to_vec()))
            .map_err(at("H2D of the kernel descriptor".into()))?;
        compute
            .launch_compute(buffers.program.address(), LaunchOptions::new())
            .map_err(at(format!("compute ({})", plan.kernel.name())))?;
        end(1, compute)?;

        let computed = ordering.as_ref().map(|o| o.stages.computed());
        begin(2, copy_out, &[computed])?;
        // A launch of its own, for the completion that signals the thread.
        buffers
            .out
            .record_stream(copy_out)
            .map_err(at(event_step("declaring the buffers' use", copy_out)))?;
        copy_out
            .launch_d2h(buffers.out.address(), output, completion)
            .map_err(at(format!("D2H of {out_name}")))?;
        end(2, copy_out)
    }

    /// After a failure: waits for the streams (errors ignored; the failure
    /// is already recorded) and drops the buffers.
    fn release(&self, streams: &[SpyreStream], memory: Option<IterationBuffers>) {
        for stream in streams {
            if let Err(e) = stream.synchronize() {
                tracing::debug!(stream = stream.id().get(), error = %e, "stream failed while releasing an iteration");
            }
        }
        drop(memory);
    }

    /// Waits for an iteration whose results are not needed any more.
    fn discard(&self, pending: Pending) {
        let _ = pending.done.recv();
        let streams: Vec<SpyreStream> = pending.launches.iter().map(|(s, _)| *s).collect();
        self.release(&streams, pending.memory);
    }

    /// Waits for the oldest iteration, frees its memory, checks its result
    /// and (pipelined) times its stages.
    fn finish(
        &self,
        pending: Pending,
        stats: &mut ThreadStats,
        clock: &mut StageClock,
    ) -> Result<(), IterationFailure> {
        let Pending {
            place,
            launches,
            memory,
            stages,
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
            // The first stream error says more than the D2H's
            // STREAM_FAILED; synchronize returns it (errors are sticky).
            let first = launches
                .iter()
                .find_map(|(stream, _)| stream.synchronize().err());
            drop(memory);
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
        drop(memory);
        verify::check_bitwise(&expected, &output.read()).map_err(|mismatch| IterationFailure {
            place,
            kind: FailureKind::Mismatch(mismatch),
        })?;
        if let Some(stages) = stages {
            clock
                .add(stages)
                .map_err(|e| device_error("timing the pipeline's stages", e))?;
        }
        stats.verified += 1;
        // The first window: the iterations in flight before any could
        // reuse the memory of one checked (a thread that runs no more than
        // that never reaches a steady state).
        let window = self.args.in_flight as u64;
        if place.iteration + 1 == window
            && self.args.iterations > window
            && self.warmed_up.fetch_add(1, Ordering::AcqRel) + 1 == self.args.threads
            && let Ok(memory) = spyre_stream::memory_stats(Device::CURRENT)
        {
            let _ = self.allocations_at_warm_up.set(memory.device_allocations);
        }
        self.progress.inc(1);
        Ok(())
    }
}

/// The events that order a pipelined iteration: its own stage events, and
/// those of the iteration that used its memory slot before it.
struct StageOrder<'a> {
    stages: &'a StageEvents,
    previous: Option<&'a StageEvents>,
}
