//! Model checks of the pool's concurrency with loom.
//!
//! ```text
//! RUSTFLAGS="--cfg spyre_loom" cargo test -p spyre-stream --no-default-features --release --test loom
//! ```
//!
//! The pool's lock and atomics come from a cfg(spyre_loom) shim, so loom explores
//! every interleaving of the scenarios below. The runtime is a small fake
//! whose streams live in a pre-allocated table and count their creation and
//! synchronization with loom atomics.
#![cfg(spyre_loom)]

use std::fmt;

use flex_rt::{
    CompositeAddress, DataFormat, FlexError, HostBuffer, HostCallback, LaunchOptions, Runtime,
    Stream, StreamMode, StreamPriority,
};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use spyre_stream::{Error, PoolConfig, SpyreStream, StreamId, StreamPool};

const HOST_COMPUTE: usize = 1;

struct FakeStream {
    id: u64,
    syncs: AtomicUsize,
}

impl fmt::Debug for FakeStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FakeStream({})", self.id)
    }
}

impl Stream for FakeStream {
    fn id(&self) -> u64 {
        self.id
    }
    fn priority(&self) -> StreamPriority {
        StreamPriority::Normal
    }
    fn query(&self) -> Result<bool, FlexError> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<(), FlexError> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn needs_shutdown(&self) -> Result<bool, FlexError> {
        Ok(false)
    }
    fn launch_h2d(
        &self,
        _: &HostBuffer,
        _: &CompositeAddress,
        _: LaunchOptions,
    ) -> Result<(), FlexError> {
        Ok(())
    }
    fn launch_d2h(
        &self,
        _: &CompositeAddress,
        _: &HostBuffer,
        _: LaunchOptions,
    ) -> Result<(), FlexError> {
        Ok(())
    }
    fn launch_compute(&self, _: &CompositeAddress, _: LaunchOptions) -> Result<(), FlexError> {
        Ok(())
    }
    fn launch_host_callback(&self, _: HostCallback, _: LaunchOptions) -> Result<(), FlexError> {
        Ok(())
    }
    fn launch_fill(
        &self,
        _: &CompositeAddress,
        _: f64,
        _: DataFormat,
        _: LaunchOptions,
    ) -> Result<(), FlexError> {
        Ok(())
    }
}

/// A runtime with stream 0 as default and a table of streams to hand out.
struct FakeRuntime {
    streams: Vec<FakeStream>,
    created: AtomicUsize,
}

impl FakeRuntime {
    fn new() -> Self {
        Self {
            streams: (0..8)
                .map(|id| FakeStream {
                    id,
                    syncs: AtomicUsize::new(0),
                })
                .collect(),
            created: AtomicUsize::new(0),
        }
    }
}

impl fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FakeRuntime")
    }
}

impl Runtime for FakeRuntime {
    fn logical_device(&self) -> u32 {
        0
    }
    fn default_stream(&self) -> &dyn Stream {
        &self.streams[0]
    }
    fn create_stream(
        &self,
        _: StreamPriority,
        _: StreamMode,
        _: bool,
    ) -> Result<&dyn Stream, FlexError> {
        let index = self.created.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(&self.streams[index])
    }
    fn has_stream_error(&self) -> Result<bool, FlexError> {
        Ok(false)
    }
    fn allocate(&self, _: u64) -> Result<CompositeAddress, FlexError> {
        unimplemented!("not used by the pool")
    }
    fn free(&self, _: &CompositeAddress) -> Result<(), FlexError> {
        unimplemented!("not used by the pool")
    }
}

fn pool(runtime: &'static FakeRuntime) -> Arc<StreamPool<'static>> {
    Arc::new(StreamPool::new(runtime, PoolConfig::new(HOST_COMPUTE, false).unwrap()).unwrap())
}

fn leak_runtime() -> &'static FakeRuntime {
    Box::leak(Box::new(FakeRuntime::new()))
}

fn handle_id(pool: &StreamPool<'_>, id: i64) -> Result<u64, Error> {
    pool.resolve(SpyreStream::from_parts(0, StreamId(id)))
        .map(|h| h.id())
}

/// Initialization racing an assignment and a resolve: the pool initializes
/// exactly once, the assignment gets id 1, and a resolve of id 0 either sees
/// no handle (before init) or the default stream, never anything else.
#[test]
fn init_races_assignment_and_resolve() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        let assigner = {
            let pool = pool.clone();
            loom::thread::spawn(move || pool.stream_from_pool(0).unwrap())
        };
        let resolver = {
            let pool = pool.clone();
            loom::thread::spawn(move || match handle_id(&pool, 0) {
                Ok(id) => assert_eq!(id, 0, "id 0 must resolve to the default stream"),
                Err(Error::NoHandle { .. }) => {}
                Err(other) => panic!("unexpected {other:?}"),
            })
        };
        pool.initialize().unwrap();
        let stream = assigner.join().unwrap();
        resolver.join().unwrap();
        assert_eq!(stream.id(), StreamId(1));
        // One host-compute stream at init, one for id 1: never more.
        assert_eq!(runtime.created.load(Ordering::SeqCst), HOST_COMPUTE + 1);
        assert_eq!(handle_id(&pool, 0).unwrap(), 0);
    });
}

/// Two threads assigning at once: the write lock makes the cursor move once
/// per assignment, so they get ids 1 and 2, and each fresh id gets exactly
/// one handle, created once.
#[test]
fn concurrent_assignments_create_each_fresh_id_once() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        pool.initialize().unwrap();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                loom::thread::spawn(move || pool.stream_from_pool(0).unwrap().id().get())
            })
            .collect();
        let mut ids: Vec<i64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(runtime.created.load(Ordering::SeqCst), HOST_COMPUTE + 2);
        let first = handle_id(&pool, 1).unwrap();
        let second = handle_id(&pool, 2).unwrap();
        assert_ne!(first, second);
    });
}

/// A resolve racing the first assignment of the same id sees either no
/// handle or exactly the handle the assignment inserted — never a different one.
#[test]
fn resolve_races_first_assignment_of_that_id() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        pool.initialize().unwrap();
        let resolver = {
            let pool = pool.clone();
            loom::thread::spawn(move || handle_id(&pool, 1).ok())
        };
        pool.stream_from_pool(0).unwrap();
        let seen = resolver.join().unwrap();
        let inserted = handle_id(&pool, 1).unwrap();
        if let Some(seen) = seen {
            assert_eq!(seen, inserted);
        }
    });
}

/// Device synchronization racing an assignment: it synchronizes the default
/// stream and the host-compute stream exactly once, and the new stream at
/// most once (only if its handle was published before the snapshot).
#[test]
fn device_sync_races_assignment() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        pool.initialize().unwrap();
        let syncer = {
            let pool = pool.clone();
            loom::thread::spawn(move || pool.synchronize_device().unwrap())
        };
        let stream = pool.stream_from_pool(0).unwrap();
        syncer.join().unwrap();
        let syncs = |i: usize| runtime.streams[i].syncs.load(Ordering::SeqCst);
        assert_eq!(syncs(0), 1, "default stream");
        assert_eq!(syncs(1), 1, "host-compute stream 65");
        let assigned = handle_id(&pool, stream.id().get()).unwrap() as usize;
        assert!(syncs(assigned) <= 1);
    });
}
