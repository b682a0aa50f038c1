//! Tests of the whole device through its public API.
mod batches;
mod events;
mod faults;
mod kernels;
mod memory;
mod raw_calls;
mod streams;
mod system;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use flex_rt::{
    CompositeAddress, FlexError, HostBuffer, LaunchOptions, Runtime, Stream, StreamMode,
    StreamPriority, SyncPolicy,
};
use parking_lot::Mutex;

use crate::config::MockSystemBuilder;
use crate::op::Op;
use crate::runtime::MockRuntime;
use crate::stream::MockStream;
use crate::system::MockSystem;

/// Generous bound for waits that only end if the device works; reaching it
/// means a deadlock or lost wakeup.
pub(crate) const DEADLOCK: Duration = Duration::from_secs(20);

/// The settings of [`system`].
fn builder(engines: u32) -> MockSystemBuilder {
    MockSystem::builder()
        .memory_bytes(1 << 20)
        .region_bytes(1 << 18)
        .engines(engines)
}

/// A system with 1 MiB of memory in 256 KiB regions and `engines` engines.
pub(crate) fn system(engines: u32) -> MockSystem {
    builder(engines).build().unwrap()
}

/// A runtime on device 0 of [`system`].
pub(crate) fn runtime(engines: u32) -> MockRuntime {
    system(engines).create_mock_runtime(0).unwrap()
}

/// A runtime on device 0 of [`system`] whose `synchronize` and idle
/// engines wait as `policy` says.
pub(crate) fn runtime_with_policy(engines: u32, policy: SyncPolicy) -> MockRuntime {
    builder(engines)
        .sync_policy(policy)
        .build()
        .unwrap()
        .create_mock_runtime(0)
        .unwrap()
}

/// A new normal-priority stream.
pub(crate) fn stream(rt: &MockRuntime) -> &MockStream {
    rt.create_mock_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
        .unwrap()
}

/// An ordered record of events, shared with callbacks.
#[derive(Clone, Default)]
pub(crate) struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub(crate) fn push(&self, event: impl Into<String>) {
        self.0.lock().push(event.into());
    }

    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// Launches a host function on `stream` that adds one to `count` when it
/// runs.
pub(crate) fn launch_counted(stream: &MockStream, count: &Arc<AtomicUsize>) {
    let count = Arc::clone(count);
    stream
        .launch_host_callback(
            Box::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            }),
            LaunchOptions::new(),
        )
        .unwrap();
}

/// Enqueues a host function on `stream` that reports when it starts and then
/// holds the stream (and its engine) until the returned sender is used or
/// dropped. Returns once the function is running.
pub(crate) fn block(stream: &MockStream) -> mpsc::Sender<()> {
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    stream
        .enqueue(
            Op::host_fn(move || {
                let _ = started_tx.send(());
                let _ = release_rx.recv_timeout(DEADLOCK);
                Ok(())
            }),
            LaunchOptions::new(),
        )
        .unwrap();
    started_rx
        .recv_timeout(DEADLOCK)
        .expect("the blocking host function never started");
    release_tx
}

/// Counts completion calls and drops of completion closures.
#[derive(Clone, Default)]
pub(crate) struct Counters {
    pub(crate) calls: Arc<AtomicUsize>,
    pub(crate) drops: Arc<AtomicUsize>,
    pub(crate) results: Arc<Mutex<Vec<Result<(), FlexError>>>>,
}

struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counters {
    /// Launch options whose completion counts itself and records its result.
    pub(crate) fn options(&self) -> LaunchOptions {
        let calls = Arc::clone(&self.calls);
        let results = Arc::clone(&self.results);
        let guard = DropCount(Arc::clone(&self.drops));
        LaunchOptions::new().on_complete(move |result| {
            let _guard = &guard;
            calls.fetch_add(1, Ordering::SeqCst);
            results.lock().push(result);
        })
    }

    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub(crate) fn drops(&self) -> usize {
        self.drops.load(Ordering::SeqCst)
    }

    pub(crate) fn statuses(&self) -> Vec<flex_rt::Status> {
        self.results
            .lock()
            .iter()
            .map(|r| {
                r.as_ref()
                    .err()
                    .map_or(flex_rt::Status::SUCCESS, |e| e.status())
            })
            .collect()
    }
}

/// Copies `bytes` to a new allocation and returns its address.
pub(crate) fn upload(rt: &MockRuntime, stream: &dyn Stream, bytes: Vec<u8>) -> CompositeAddress {
    let address = rt.allocate(bytes.len() as u64).unwrap();
    stream
        .launch_h2d(&HostBuffer::from_vec(bytes), &address, LaunchOptions::new())
        .unwrap();
    address
}

/// Reads `address` back (synchronizing `stream`).
pub(crate) fn download(
    stream: &dyn Stream,
    address: &CompositeAddress,
) -> Result<Vec<u8>, FlexError> {
    let out = HostBuffer::zeroed(address.total_size() as usize);
    stream.launch_d2h(address, &out, LaunchOptions::new())?;
    stream.synchronize()?;
    Ok(out.to_vec())
}
