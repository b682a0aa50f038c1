//! A trace of what the device did: every operation launched through the
//! pool's streams while tracing is on, with its stream, kind, bytes and
//! times (Nsight Systems' timeline, for Spyre).
//!
//! Off (the default; the counters too) it costs one relaxed atomic load per
//! launch. On, each
//! launch appends an entry under a mutex and carries a completion that
//! stamps the time the runtime reported it finished. When it started on
//! the device is derived as for a stream that runs its operations one at
//! a time in order: an operation starts when it was enqueued or when the one
//! before it on its stream finished, whichever is later (an operation held
//! by a wait on an event counts from then too; the wait itself is an entry
//! of its own, linked to the record it waits for).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use flex_rt::sync::Mutex;
use flex_rt::{Completion, FlexError, LaunchOptions};

use crate::stream::SpyreStream;
use crate::{instrument, runtime};

/// What an operation was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperationKind {
    /// A host-to-device copy.
    H2d,
    /// A device-to-host copy.
    D2h,
    /// A compute program.
    Compute,
    /// A host callback run in stream order.
    HostCallback,
    /// A fill.
    Fill,
    /// An event recorded on the stream.
    EventRecord,
    /// The stream made to wait for an event.
    EventWait,
    /// A launch the runtime refused: it never ran.
    Refused,
}

impl OperationKind {
    /// A short name: `H2D`, `D2H`, `compute`, `host callback`, `fill`,
    /// `event record`, `event wait`, `refused launch`.
    pub fn name(self) -> &'static str {
        match self {
            Self::H2d => "H2D",
            Self::D2h => "D2H",
            Self::Compute => "compute",
            Self::HostCallback => "host callback",
            Self::Fill => "fill",
            Self::EventRecord => "event record",
            Self::EventWait => "event wait",
            Self::Refused => "refused launch",
        }
    }
}

/// One operation of a [`Trace`]. Times are from the start of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEntry {
    /// The stream it was launched on.
    pub stream: SpyreStream,
    /// What it was.
    pub kind: OperationKind,
    /// Bytes copied or filled (0 for the other kinds).
    pub bytes: u64,
    /// Whether it was launched with a pipeline barrier: asked for by the
    /// caller ([`crate::LaunchOptions::pipeline_barrier`]), or added to the
    /// stream's launches after memory was reused on it until one of them
    /// has been enqueued (see [`crate::DeviceBuffer`]; a refused launch
    /// shows it too, and launches made at the same time may each carry it).
    pub pipeline_barrier: bool,
    /// When the host enqueued it.
    pub enqueued: Duration,
    /// When it started on the device, derived as for a stream that runs
    /// its operations one at a time in order (as the software device's
    /// do; a card may overlap those without a pipeline barrier, which the
    /// trace cannot see): an operation starts when it
    /// was enqueued or when the one before it on its stream finished,
    /// whichever is later. So time it waited for a free engine (behind
    /// other streams' work) counts as running. `None` until it finished.
    pub started: Option<Duration>,
    /// When the runtime reported it finished (`None`: not by the time the
    /// trace stopped). An event wait finishes, as [`stop_trace`] derives
    /// it, when its stream has reached it (it was enqueued and the
    /// operation before it finished) and the record it waits for has
    /// finished, whichever is later. An event record is reported as its waiters are released, by a
    /// notification that may run a scheduling delay after them: an
    /// operation after a wait on it can show a finish a little before the
    /// record's.
    pub finished: Option<Duration>,
    /// Whether it failed.
    pub failed: bool,
    /// For an event record, the link its waits name; for an event wait,
    /// the link of the record it waits for (`None`: a wait on an event
    /// never recorded while tracing, or, where a wait blocks the host (no
    /// device-side waits), one during which another thread recorded the
    /// event again: which of the two records it waited for is not known).
    pub link: Option<u64>,
}

/// What [`stop_trace`] returns: every operation traced, in the order the
/// launching threads recorded them, each just before its launch (for
/// launches racing on one stream, this can differ from the stream's own
/// order; the derived times follow the stream's order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The operations, in the order the launching threads recorded them
    /// (see [`Trace`]).
    pub entries: Vec<TraceEntry>,
    /// The instant the entries' times count from: when [`start_trace`]
    /// began this trace. `None` only for the empty trace [`stop_trace`]
    /// returns in a forked child.
    pub origin: Option<Instant>,
}

struct Log {
    origin: Instant,
    entries: Chunked<TraceEntry>,
    /// Indices of `entries` in the order their completions stamped them: a
    /// stream calls its completions one at a time in stream order, so this
    /// is each stream's true order, which `entries` (in the order the
    /// launching threads appended them) need not be when several threads
    /// launch on one stream.
    finish_order: Chunked<usize>,
}

impl Log {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            entries: Chunked::new(),
            finish_order: Chunked::new(),
        }
    }
}

/// Items a [`Chunked`] list allocates at once: 384 KiB of trace entries.
const CHUNK: usize = 4096;

/// A list that grows by chunks of [`CHUNK`] items, each allocated once at
/// its full size. A push never moves what is there (a `Vec` doubling
/// copies the whole trace, under the log's lock that launches take), and
/// while the trace is recorded the memory reserved is what is held and at
/// most one chunk more (a `Vec` reserves up to twice what it holds, which a
/// process's address-space limit, `ulimit -v`, counts in full). The copy
/// into one `Vec` when the trace stops ([`Chunked::into_vec`]) takes as
/// much again, once.
struct Chunked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Chunked<T> {
    fn new() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// Appends `item`; its index.
    fn push(&mut self, item: T) -> usize {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(item),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(item);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
        self.len - 1
    }

    fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        self.chunks.get_mut(index / CHUNK)?.get_mut(index % CHUNK)
    }

    /// The items in order, in a `Vec` of exactly their number, each chunk
    /// freed once moved.
    fn into_vec(self) -> Vec<T> {
        let mut all = Vec::with_capacity(self.len);
        for chunk in self.chunks {
            all.extend(chunk);
        }
        all
    }
}

/// The log of the current (or last) trace; `Arc`ed into completions, so
/// that one finishing after a new trace started writes to its own log.
static LOG: OnceLock<Mutex<Arc<Mutex<Log>>>> = OnceLock::new();
static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

fn log_slot() -> &'static Mutex<Arc<Mutex<Log>>> {
    LOG.get_or_init(|| Mutex::new(Arc::new(Mutex::new(Log::new()))))
}

/// Whether tracing is on: one relaxed load (event records and waits ask
/// it; a launch reads the flags of the trace and the counters at once).
#[inline]
pub(crate) fn is_on() -> bool {
    instrument::flags() & instrument::TRACE != 0
}

/// Starts a trace of every operation launched through the pool's streams
/// from now on, in every thread, dropping what an earlier trace recorded.
/// Operations already in flight are not in it.
///
/// Thread-safety: any thread; launches racing the start may or may not be
/// traced.
///
/// In a child forked after the runtime started, where nothing can be
/// launched ([`crate::Error::ForkedProcess`]), it does nothing: it does not
/// touch the parent's trace, whose lock a parent thread may have held at
/// the fork.
pub fn start_trace() {
    if runtime::check_not_forked().is_err() {
        return;
    }
    let mut slot = log_slot().lock();
    *slot = Arc::new(Mutex::new(Log::new()));
    instrument::set(instrument::TRACE, true);
}

/// Stops tracing and returns what was recorded. Operations still in flight
/// have no finish time; wait for them (synchronize) before stopping to
/// have all of them.
///
/// Thread-safety: any thread. A stop and a start racing each other take
/// effect in one order or the other, whole: either this stop returns the
/// trace that start began and tracing ends off, or it returns the earlier
/// trace and the start's trace goes on.
///
/// In a child forked after the runtime started it returns an empty trace
/// and stops nothing of the parent's (see [`start_trace`]).
pub fn stop_trace() -> Trace {
    if runtime::check_not_forked().is_err() {
        return Trace::default();
    }
    // The flag is cleared and the log replaced under the slot's lock, so
    // that a start racing this stop is wholly before it (its log is the
    // one returned, and tracing ends off) or wholly after it (tracing is
    // on, in a log of its own). A launch that read the flag just before
    // the stop appends to the log returned or to the spare one put in its
    // place, which the next start replaces: never to the next trace.
    let log = {
        let mut slot = log_slot().lock();
        instrument::set(instrument::TRACE, false);
        std::mem::replace(&mut *slot, Arc::new(Mutex::new(Log::new())))
    };
    let (entries, finish_order, origin) = {
        let mut guard = log.lock();
        (
            std::mem::replace(&mut guard.entries, Chunked::new()),
            std::mem::replace(&mut guard.finish_order, Chunked::new()),
            guard.origin,
        )
    };
    let mut entries = entries.into_vec();
    let finish_order = finish_order.into_vec();
    derive_starts(&mut entries, &finish_order);
    Trace {
        entries,
        origin: Some(origin),
    }
}

/// Sets `started` of every finished entry: the later of its enqueue and
/// the finish of the operation before it on its stream. A wait is passed
/// when its stream got to it and the record it waits for had finished: the
/// device holds the stream's later work until then.
///
/// A stream's operations are taken in the order they finished
/// (`finish_order`, indices into `entries`), in the places its finished
/// operations have among its entries: launches from several threads may
/// have been appended in another order than the stream ran them. Waits,
/// operations that did not finish, and those stamped out of their
/// stream's finish order ([`Traced::finished`]) keep their places.
fn derive_starts(entries: &mut [TraceEntry], finish_order: &[usize]) {
    let records: HashMap<u64, Duration> = entries
        .iter()
        .filter(|e| e.kind == OperationKind::EventRecord)
        .filter_map(|e| Some((e.link?, e.finished?)))
        .collect();
    let ordered: HashSet<usize> = finish_order.iter().copied().collect();
    // Whether each entry takes its place from `finish_order`.
    let in_order: Vec<bool> = entries
        .iter()
        .enumerate()
        .map(|(index, e)| {
            e.kind != OperationKind::EventWait && e.finished.is_some() && ordered.contains(&index)
        })
        .collect();
    let stamped = |index: usize| in_order.get(index).copied().unwrap_or(false);
    let mut places: HashMap<SpyreStream, Vec<usize>> = HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        places.entry(entry.stream).or_default().push(index);
    }
    let mut finished: HashMap<SpyreStream, Vec<usize>> = HashMap::new();
    for &index in finish_order {
        if stamped(index) {
            finished
                .entry(entries[index].stream)
                .or_default()
                .push(index);
        }
    }
    for (stream, places) in places {
        let mut in_finish_order = finished.remove(&stream).unwrap_or_default().into_iter();
        let order: Vec<usize> = places
            .into_iter()
            .map(|place| {
                if stamped(place) {
                    in_finish_order.next().unwrap_or(place)
                } else {
                    place
                }
            })
            .collect();
        let mut previous = Duration::ZERO;
        for index in order {
            let entry = &mut entries[index];
            if entry.kind == OperationKind::EventWait {
                let record = entry.link.and_then(|link| records.get(&link).copied());
                entry.finished = Some(entry.enqueued.max(previous).max(record.unwrap_or_default()));
            }
            if let Some(finished) = entry.finished {
                entry.started = Some(entry.enqueued.max(previous).min(finished));
                previous = finished.max(previous);
            }
        }
    }
}

/// An entry of the trace, for its launch to report a refusal.
pub(crate) struct Traced {
    log: Arc<Mutex<Log>>,
    index: usize,
    /// The entry's link (an event record's).
    pub(crate) link: u64,
}

impl Traced {
    /// The launch was refused: the operation never ran; its entry goes.
    /// An entry its completion stamped finished stays as it is (a backend
    /// that completes inside the launch, whose caller's completion then
    /// unwound out of it).
    pub(crate) fn refused(self) {
        let mut guard = self.log.lock();
        if let Some(entry) = guard
            .entries
            .get_mut(self.index)
            .filter(|entry| entry.finished.is_none())
        {
            // Kept in place (later entries' indices are in completions),
            // marked as not launched.
            entry.failed = true;
            entry.kind = OperationKind::Refused;
        }
    }

    /// The operation had finished (failed if `failed`) when the caller
    /// learned it, which was not through the entry's completion: stamps
    /// it finished now, out of its stream's finish order (the completions
    /// of the operations before it may not have been called yet), so it
    /// keeps its place among its stream's entries.
    pub(crate) fn finished(&self, failed: bool) {
        finish(&self.log, self.index, failed, false);
    }
}

/// Records an operation about to be launched, and returns the options with
/// a completion that stamps its finish (then calls the caller's), and the
/// entry. Call only when [`is_on`].
pub(crate) fn traced(
    stream: SpyreStream,
    kind: OperationKind,
    bytes: u64,
    options: LaunchOptions,
) -> (LaunchOptions, Traced) {
    let LaunchOptions {
        pipeline_barrier,
        completion,
    } = options;
    let (completion, entry) = record(stream, kind, bytes, pipeline_barrier, completion);
    (
        LaunchOptions {
            pipeline_barrier,
            completion: Some(completion),
        },
        entry,
    )
}

/// Appends an entry and returns the completion that finishes it (then
/// calls `then`), and the entry.
pub(crate) fn record(
    stream: SpyreStream,
    kind: OperationKind,
    bytes: u64,
    pipeline_barrier: bool,
    then: Option<Completion>,
) -> (Completion, Traced) {
    let log = Arc::clone(&log_slot().lock());
    let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    let index = {
        let mut guard = log.lock();
        let enqueued = guard.origin.elapsed();
        guard.entries.push(TraceEntry {
            stream,
            kind,
            bytes,
            pipeline_barrier,
            enqueued,
            started: None,
            finished: None,
            failed: false,
            link: (kind == OperationKind::EventRecord).then_some(link),
        })
    };
    let entry = Traced {
        log: Arc::clone(&log),
        index,
        link,
    };
    let completion: Completion = Box::new(move |outcome: Result<(), FlexError>| {
        finish(&log, index, outcome.is_err(), true);
        if let Some(then) = then {
            then(outcome);
        }
    });
    (completion, entry)
}

/// Stamps entry `index` of `log` finished now (failed if `failed`); with
/// `in_stream_order`, as the latest of its stream's operations to finish
/// (see [`derive_starts`]).
fn finish(log: &Mutex<Log>, index: usize, failed: bool, in_stream_order: bool) {
    // The time first: the lock may be busy with launches.
    let now = Instant::now();
    let mut guard = log.lock();
    let finished = now.saturating_duration_since(guard.origin);
    if let Some(entry) = guard.entries.get_mut(index) {
        entry.finished = Some(finished);
        entry.failed = failed;
        if in_stream_order {
            guard.finish_order.push(index);
        }
    }
}

/// Records a wait of `stream` on the record with `link` (finished when
/// enqueued: the device holds the stream's later work, which the entries
/// after it show).
pub(crate) fn record_wait(stream: SpyreStream, link: Option<u64>) {
    let log = Arc::clone(&log_slot().lock());
    let mut guard = log.lock();
    let now = guard.origin.elapsed();
    guard.entries.push(TraceEntry {
        stream,
        kind: OperationKind::EventWait,
        bytes: 0,
        pipeline_barrier: false,
        enqueued: now,
        started: None,
        finished: Some(now),
        failed: false,
        link,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::StreamId;

    /// Across chunks, each item keeps its index, and the list comes out
    /// whole and in order, in a `Vec` of exactly its length.
    #[test]
    fn a_chunked_list_keeps_indices_and_order_across_chunks() {
        let mut list = Chunked::new();
        let len = 2 * CHUNK + 1;
        for item in 0..len {
            assert_eq!(list.push(item), item);
        }
        for index in [0, CHUNK - 1, CHUNK, 2 * CHUNK] {
            *list.get_mut(index).unwrap() += len;
        }
        assert!(list.get_mut(len).is_none());
        let all = list.into_vec();
        assert_eq!(all.capacity(), len);
        let expected: Vec<usize> = (0..len)
            .map(|item| {
                if [0, CHUNK - 1, CHUNK, 2 * CHUNK].contains(&item) {
                    item + len
                } else {
                    item
                }
            })
            .collect();
        assert_eq!(all, expected);
    }

    fn entry(id: i64, enqueued: u64, finished: u64) -> TraceEntry {
        TraceEntry {
            stream: SpyreStream::from_parts(0, StreamId(id)),
            kind: OperationKind::H2d,
            bytes: 0,
            pipeline_barrier: false,
            enqueued: Duration::from_micros(enqueued),
            started: None,
            finished: Some(Duration::from_micros(finished)),
            failed: false,
            link: None,
        }
    }

    /// A record on stream 1 (enqueued at 0, finished at `record_finished`)
    /// and a wait on stream 2 enqueued at `wait_at`, linked by `link`.
    fn record_and_wait(link: u64, record_finished: u64, wait_at: u64) -> [TraceEntry; 2] {
        let mut record = entry(1, 0, record_finished);
        record.kind = OperationKind::EventRecord;
        record.link = Some(link);
        let mut wait = entry(2, wait_at, wait_at);
        wait.kind = OperationKind::EventWait;
        wait.link = Some(link);
        [record, wait]
    }

    /// `derive_starts` with every stream's operations finished in the
    /// order they were appended.
    fn derive_in_log_order(entries: &mut [TraceEntry]) {
        let order: Vec<usize> = (0..entries.len()).collect();
        derive_starts(entries, &order);
    }

    /// A record stamped when the trace learned it had completed, not by a
    /// completion ([`Traced::finished`]), is not in the finish order: it
    /// keeps its place among its stream's entries, and the operations
    /// that are take theirs. Before, it took a finished operation's place
    /// and that operation was placed twice (the record never started).
    #[test]
    fn a_record_stamped_out_of_the_finish_order_keeps_its_place() {
        let mut record = entry(1, 5, 10);
        record.kind = OperationKind::EventRecord;
        let mut entries = vec![record, entry(1, 12, 50)];
        derive_starts(&mut entries, &[1]);
        assert_eq!(entries[0].started, Some(Duration::from_micros(5)));
        assert_eq!(entries[1].started, Some(Duration::from_micros(12)));
    }

    #[test]
    fn operations_appended_out_of_stream_order_take_the_order_they_finished_in() {
        // Two threads launch on stream 1: the one enqueued at 2 was
        // appended first, but the stream ran the one enqueued at 1 first
        // (1..10, then 10..20). Appended order would start the second at
        // 20, its own finish, and show it as taking no time.
        let mut entries = vec![entry(1, 2, 20), entry(1, 1, 10), entry(2, 0, 5)];
        derive_starts(&mut entries, &[2, 1, 0]);
        let starts: Vec<u64> = entries
            .iter()
            .map(|e| e.started.unwrap().as_micros() as u64)
            .collect();
        assert_eq!(starts, [10, 1, 0]);
    }

    #[test]
    fn an_operation_starts_when_enqueued_or_when_its_predecessor_finished() {
        // Stream 1: enqueued at 0, 1, 50; finished at 10, 20, 60. Stream 2
        // is independent.
        let mut entries = vec![
            entry(1, 0, 10),
            entry(1, 1, 20),
            entry(2, 2, 5),
            entry(1, 50, 60),
        ];
        derive_in_log_order(&mut entries);
        let starts: Vec<u64> = entries
            .iter()
            .map(|e| e.started.unwrap().as_micros() as u64)
            .collect();
        assert_eq!(starts, [0, 10, 2, 50]);
    }

    #[test]
    fn a_wait_holds_its_stream_until_the_record_finished() {
        // Stream 1 records at 0, finished at 30; stream 2 waits at 5 and
        // then copies (enqueued at 6, finished at 40): the copy starts at 30.
        let [record, wait] = record_and_wait(7, 30, 5);
        let mut entries = vec![record, wait, entry(2, 6, 40)];
        derive_in_log_order(&mut entries);
        assert_eq!(entries[1].finished, Some(Duration::from_micros(30)));
        assert_eq!(entries[2].started, Some(Duration::from_micros(30)));
    }

    #[test]
    fn a_wait_is_passed_only_after_its_streams_earlier_work() {
        // Stream 2 runs a copy 0..50; a wait enqueued at 5 on a record that
        // finished at 30 is passed at 50, and the next copy starts then.
        let [record, wait] = record_and_wait(3, 30, 5);
        let mut entries = vec![record, entry(2, 0, 50), wait, entry(2, 6, 60)];
        derive_in_log_order(&mut entries);
        assert_eq!(entries[2].finished, Some(Duration::from_micros(50)));
        assert_eq!(entries[3].started, Some(Duration::from_micros(50)));
    }
}
