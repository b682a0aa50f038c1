//! Model checks of the pool's concurrency with loom.
//!
//! ```text
//! RUSTFLAGS="--cfg spyre_loom" cargo test -p spyre-stream --no-default-features --release --test loom
//! ```
//!
//! (or `bash ci/loom.sh`). The pool's lock and atomics come from a
//! cfg(spyre_loom) shim, so loom explores every interleaving of the scenarios
//! below (one model bounds preemptions, see its comment). The runtime is
//! flex-rt's no-op runtime, which counts creations and synchronizations, can
//! refuse creations, and here holds the default stream's `synchronize` or a
//! high-priority stream's creation behind a loom gate.
//!
//! | scenario | model |
//! |---|---|
//! | initialization racing an assignment and a resolve | `init_races_assignment_and_resolve` |
//! | initialization is published in one step | `initialization_is_published_atomically` |
//! | two threads assigning fresh ids | `concurrent_assignments_create_each_fresh_id_once` |
//! | two threads assigning across the wrap (31 ids handed out before) | `concurrent_assignments_across_the_wrap` |
//! | two threads assigning fresh ids while a creation fails (its id is handed out again first) | `a_failed_creation_hands_its_id_out_again_first` |
//! | a slow creation holds up only the callers of its id | `a_slow_creation_holds_up_only_its_own_id` |
//! | the same fresh id handed out again after a full round, while its creation is in flight | `the_same_fresh_id_handed_out_again_after_a_full_round` |
//! | a failed creation's id queued after another thread settled the cursor (every id created) | `a_failure_queued_after_the_cursor_settled_unsettles_it` |
//! | a resolve racing the first assignment of that id | `resolve_races_first_assignment_of_that_id` |
//! | device synchronization racing an assignment | `device_sync_races_assignment` |
//! | device synchronization waits holding no lock an assignment needs | `device_sync_waits_holding_no_lock` |
//! | a snapshot of the table racing initialization and an assignment | `snapshots_see_one_state_of_the_table` |
//!
//! Each model fails on a pool broken the way it guards against (see
//! RELIABILITY.md for the breakages tried).
#![cfg(spyre_loom)]

use std::sync::atomic::Ordering::SeqCst;

use flex_rt::noop::NoopRuntime;
use flex_rt::{Status, StreamPriority};
use loom::sync::{Arc, Condvar, Mutex};
use spyre_stream::{Error, PoolConfig, SpyreStream, StreamId, StreamPool};

const HOST_COMPUTE: usize = 1;

/// A one-shot latch: `wait` blocks until `open` has been called.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }
}

fn pool(runtime: &'static NoopRuntime) -> Arc<StreamPool<'static>> {
    Arc::new(StreamPool::new(runtime, PoolConfig::new(HOST_COMPUTE, false).unwrap()).unwrap())
}

fn leak_runtime() -> &'static NoopRuntime {
    Box::leak(Box::new(NoopRuntime::new(0)))
}

/// Runs `model` under loom with preemptions bounded to 3, on an initialized
/// pool over a fresh runtime: for the models whose full round of 32
/// assignments makes the whole interleaving space too large to enumerate.
fn check_with_three_preemptions(
    model: impl Fn(&'static NoopRuntime, Arc<StreamPool<'static>>) + Sync + Send + 'static,
) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(move || {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        pool.initialize().unwrap();
        model(runtime, pool);
    });
}

/// Streams the runtime has created (the default stream not counted).
fn created(runtime: &NoopRuntime) -> usize {
    runtime.calls().streams_created as usize
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
        assert_eq!(created(runtime), HOST_COMPUTE + 1);
        assert_eq!(handle_id(&pool, 0).unwrap(), 0);
    });
}

/// Two threads assigning at once: the atomic cursor moves once per
/// assignment, so they get ids 1 and 2, and each fresh id gets exactly
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
        assert_eq!(created(runtime), HOST_COMPUTE + 2);
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
        let syncs = |i: usize| runtime.synchronizes_of(i as u64).unwrap_or(0);
        assert_eq!(syncs(0), 1, "default stream");
        assert_eq!(syncs(1), 1, "host-compute stream 65");
        let assigned = handle_id(&pool, stream.id().get()).unwrap() as usize;
        assert!(syncs(assigned) <= 1);
    });
}

/// Initialization is published in one step: a thread that sees the default
/// stream mapped also sees the host-compute stream, and a failed or
/// unfinished initialization shows neither.
#[test]
fn initialization_is_published_atomically() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        let observer = {
            let pool = pool.clone();
            loom::thread::spawn(move || {
                let default = handle_id(&pool, 0).ok();
                let host_compute = handle_id(&pool, 65).ok();
                (default, host_compute)
            })
        };
        pool.initialize().unwrap();
        match observer.join().unwrap() {
            (None, _) => {}
            (Some(0), Some(1)) => {}
            seen => panic!("saw a partial initialization: {seen:?}"),
        }
        assert_eq!(created(runtime), HOST_COMPUTE);
    });
}

/// Two threads assigning with the cursor one short of the wrap (31 ids
/// handed out before): one gets the fresh id 32, the other wraps to id 1,
/// which keeps the handle it already had; only id 32 is created.
#[test]
fn concurrent_assignments_across_the_wrap() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        for expected in 1..=31 {
            assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(expected));
        }
        let id1_before = handle_id(&pool, 1).unwrap();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                loom::thread::spawn(move || pool.stream_from_pool(0).unwrap().id().get())
            })
            .collect();
        let mut ids: Vec<i64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 32]);
        assert_eq!(created(runtime), HOST_COMPUTE + 32);
        assert_eq!(handle_id(&pool, 1).unwrap(), id1_before);
    });
}

/// Two threads assigning fresh ids while the first creation fails: they
/// are handed ids 1 and 2, one creation fails with the runtime's error and
/// publishes nothing, the other succeeds. The next assignment is handed the
/// failed id again, without advancing the cursor, and creates it; the one
/// after goes on with id 3. Every id gets one handle.
#[test]
fn a_failed_creation_hands_its_id_out_again_first() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        pool.initialize().unwrap();
        runtime.fail_next_stream_creations(1);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                loom::thread::spawn(move || pool.stream_from_pool(0).map(|s| s.id().get()))
            })
            .collect();
        let mut results: Vec<Result<i64, Status>> = threads
            .into_iter()
            .map(|t| {
                t.join().unwrap().map_err(|e| match e {
                    Error::Flex(f) => f.status(),
                    other => panic!("unexpected {other:?}"),
                })
            })
            .collect();
        results.sort_by_key(|r| r.is_ok());
        let Ok(made) = results[1] else {
            panic!("one creation succeeds: {results:?}");
        };
        assert_eq!(results[0], Err(Status::RUNTIME_FAILED));
        assert!(made == 1 || made == 2, "handed a fresh id: {made}");
        assert!(
            handle_id(&pool, 3 - made).is_err(),
            "the failed id has no handle"
        );
        assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(3 - made));
        assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(3));
        assert_eq!(created(runtime), HOST_COMPUTE + 3);
    });
}

/// A slow stream creation holds up nobody who does not need that stream:
/// while one thread's assignment creates the first high-priority stream
/// (held inside the runtime's creation until the main thread opens a
/// gate), the main thread resolves the default stream and is handed a
/// normal id. Were the creation inside the exclusive section, the main
/// thread's assignment would wait for a creation that waits for it: loom
/// reports the deadlock.
#[test]
fn a_slow_creation_holds_up_only_its_own_id() {
    loom::model(|| {
        // Leaked like the runtime (loom checks that every loom Arc is freed).
        let gate: &'static Gate = Box::leak(Box::default());
        let armed: &'static std::sync::atomic::AtomicBool =
            Box::leak(Box::new(std::sync::atomic::AtomicBool::new(false)));
        let runtime: &'static NoopRuntime = Box::leak(Box::new(
            NoopRuntime::new(0).with_creation_hook(Box::new(|priority| {
                if priority == StreamPriority::High && armed.load(SeqCst) {
                    gate.wait();
                }
            })),
        ));
        let pool = pool(runtime);
        pool.initialize().unwrap();
        armed.store(true, SeqCst);
        let creator = {
            let pool = pool.clone();
            loom::thread::spawn(move || pool.stream_from_pool(-1).unwrap().id())
        };
        assert_eq!(handle_id(&pool, 0).unwrap(), 0);
        assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(1));
        gate.open();
        assert_eq!(creator.join().unwrap(), StreamId(33));
        assert_eq!(created(runtime), HOST_COMPUTE + 2);
    });
}

/// Two threads assigning the same fresh id by the round robin: while one
/// thread assigns id 1 (its first handout), the other hands out 32 ids and
/// so comes back to id 1. Whatever the interleaving, id 1 gets exactly one
/// handle and every id is created once.
///
/// The 33 assignments make the full interleaving space too large to
/// enumerate, so this model bounds preemptions to 3; a preempted creation
/// with the lock released (the bug this looks for) needs only one.
#[test]
fn the_same_fresh_id_handed_out_again_after_a_full_round() {
    check_with_three_preemptions(|runtime, pool| {
        let single = {
            let pool = pool.clone();
            loom::thread::spawn(move || {
                let stream = pool.stream_from_pool(0).unwrap();
                (
                    stream.id().get(),
                    handle_id(&pool, stream.id().get()).unwrap(),
                )
            })
        };
        let mut seen = Vec::new();
        for _ in 0..32 {
            let stream = pool.stream_from_pool(0).unwrap();
            seen.push((
                stream.id().get(),
                handle_id(&pool, stream.id().get()).unwrap(),
            ));
        }
        seen.push(single.join().unwrap());
        // 33 assignments: ids 1..=32 and one of them twice, always one handle per id.
        let mut ids: Vec<i64> = seen.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids, (1..=32).collect::<Vec<_>>());
        for (id, handle) in &seen {
            assert_eq!(
                handle_id(&pool, *id).unwrap(),
                *handle,
                "id {id} changed handle"
            );
        }
        assert_eq!(created(runtime), HOST_COMPUTE + 32);
    });
}

/// A failure queued after the cursor settled unsettles it. Thirty-one ids
/// are created first; then thread A assigns once while thread B assigns a
/// full round (32 times), and the first creation of id 32 fails. Whichever
/// thread's creation failed, and whatever the order of its retry entry and
/// the other thread creating id 32 (which settles the cursor), the next
/// assignment is handed id 32 again if the entry is still queued, or the
/// cursor's next id, 32, if B took the entry: 32 either way, then 1.
/// Were the entry queued without unsettling the cursor, an assignment after
/// B settled it would skip the entry and be handed id 1.
///
/// Bounded to 3 preemptions, as the full round above (the race needs one:
/// between the failed creation releasing its lock and queuing its id).
#[test]
fn a_failure_queued_after_the_cursor_settled_unsettles_it() {
    check_with_three_preemptions(|runtime, pool| {
        for id in 1..=31 {
            assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(id));
        }
        runtime.fail_next_stream_creations(1);
        let once = {
            let pool = pool.clone();
            loom::thread::spawn(move || pool.stream_from_pool(0).is_ok())
        };
        let round = {
            let pool = pool.clone();
            loom::thread::spawn(move || {
                (0..32).filter(|_| pool.stream_from_pool(0).is_ok()).count()
            })
        };
        let succeeded = usize::from(once.join().unwrap()) + round.join().unwrap();
        assert_eq!(succeeded, 32, "one of the 33 assignments failed");
        assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(32));
        assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(1));
        assert_eq!(created(runtime), HOST_COMPUTE + 32);
    });
}

/// Device synchronization holds no lock while it waits: while it waits on
/// a stream whose work is still running, an assignment goes through. Here
/// the stream's work finishes only after that assignment, so a
/// synchronization that waited holding a lock the assignment needs (as the
/// spec's read lock once was) would deadlock, which loom reports.
#[test]
fn device_sync_waits_holding_no_lock() {
    loom::model(|| {
        // Leaked like the runtime (loom checks that every loom Arc is freed).
        let gate: &'static Gate = Box::leak(Box::default());
        let runtime: &'static NoopRuntime =
            Box::leak(Box::new(NoopRuntime::with_synchronize_hook(
                0,
                Box::new(|id| {
                    if id == 0 {
                        gate.wait();
                    }
                }),
            )));
        let pool = pool(runtime);
        pool.initialize().unwrap();
        let syncer = {
            let pool = pool.clone();
            loom::thread::spawn(move || pool.synchronize_device().unwrap())
        };
        let stream = pool.stream_from_pool(0).unwrap();
        gate.open();
        syncer.join().unwrap();
        assert_eq!(stream.id(), StreamId(1));
        assert_eq!(runtime.synchronizes_of(0), Some(1));
    });
}

/// A snapshot of the table (`mapped_ids`, the same one `synchronize_device`
/// takes) racing initialization and the first assignment sees one state of
/// the table: nothing, or 0 and 65 together, and id 1 only with both.
#[test]
fn snapshots_see_one_state_of_the_table() {
    loom::model(|| {
        let runtime = leak_runtime();
        let pool = pool(runtime);
        let observer = {
            let pool = pool.clone();
            loom::thread::spawn(move || pool.mapped_ids())
        };
        pool.stream_from_pool(0).unwrap();
        let seen: Vec<i64> = observer.join().unwrap().iter().map(|id| id.get()).collect();
        assert!(
            seen.is_empty() || seen == [0, 65] || seen == [0, 1, 65],
            "saw a table in between two writes: {seen:?}"
        );
    });
}
