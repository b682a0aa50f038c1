//! Interleaved timing: several contenders measured round by round.

use std::time::{Duration, Instant};

/// The order members run in round `round` of a group of `members`: from
/// member `round % members` on, wrapping, so no member always runs right
/// after the same other one.
fn round_order(round: u64, members: usize) -> impl Iterator<Item = usize> {
    let first = (round % members.max(1) as u64) as usize;
    (first..members).chain(0..first)
}

/// Times `iters` runs of `ops[me]`. Each round runs every op of `ops` once
/// and times only `ops[me]`, so that all members of a group are measured
/// over the same stretch of time (this machine class drifts 2–3× within
/// minutes; medians of separate runs would compare different machines).
/// Round `r` starts at op `r % ops.len()`, so no member always runs right
/// after the same other one (which would hand it, say, a device left
/// asleep or warm by its predecessor). A `me` that is not an index of
/// `ops` times nothing: zero.
pub fn interleaved(iters: u64, me: usize, ops: &[&dyn Fn()]) -> Duration {
    let mut total = Duration::ZERO;
    for round in 0..iters {
        for index in round_order(round, ops.len()) {
            let op = ops[index];
            if index == me {
                let start = Instant::now();
                op();
                total += start.elapsed();
            } else {
                op();
            }
        }
    }
    total
}

/// Times `iters` calls of `launch` in batches of at most `batch`, calling
/// `drain` untimed after each batch (for asynchronous work that must be
/// waited for, such as launches on a stream, without timing the wait).
pub fn batched(
    iters: u64,
    batch: u64,
    mut launch: impl FnMut(),
    mut drain: impl FnMut(),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(batch.max(1));
        let start = Instant::now();
        for _ in 0..n {
            launch();
        }
        total += start.elapsed();
        drain();
        left -= n;
    }
    total
}

/// A member of [`interleaved_batched`]: its launch, and the drain that
/// waits for its launches.
pub type BatchedMember<'a> = (&'a dyn Fn(), &'a dyn Fn());

/// [`interleaved`] for asynchronous work: times `iters` calls of member
/// `me`'s launch, in batches of at most `batch`. Every round runs a batch
/// of each member's launch, timing only `me`'s, and calls that member's
/// drain untimed after it; each round starts one member later than the one
/// before. Members are `(launch, drain)` pairs.
pub fn interleaved_batched(
    iters: u64,
    batch: u64,
    me: usize,
    members: &[BatchedMember<'_>],
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    let mut round = 0;
    while left > 0 {
        let n = left.min(batch.max(1));
        for index in round_order(round, members.len()) {
            let (launch, drain) = members[index];
            let start = Instant::now();
            for _ in 0..n {
                launch();
            }
            if index == me {
                total += start.elapsed();
            }
            drain();
        }
        round += 1;
        left -= n;
    }
    total
}

/// A member of [`interleaved_prepared`]: what sets up its run, untimed,
/// and the run, timed.
pub type PreparedMember<'a> = (&'a dyn Fn(), &'a dyn Fn());

/// [`interleaved`] for runs that need an untimed set-up first (work queued
/// behind held engines, to time how fast it drains): every round calls
/// each member's set-up and then its run, timing only member `me`'s run;
/// each round starts one member later than the one before. Members are
/// `(prepare, run)` pairs. A `me` that is not an index of `members` times
/// nothing: zero.
pub fn interleaved_prepared(iters: u64, me: usize, members: &[PreparedMember<'_>]) -> Duration {
    let mut total = Duration::ZERO;
    for round in 0..iters {
        for index in round_order(round, members.len()) {
            let (prepare, run) = members[index];
            prepare();
            let start = Instant::now();
            run();
            if index == me {
                total += start.elapsed();
            }
        }
    }
    total
}

/// Benchmarks every `(name, op)` of `members` in `group`, each timed with
/// [`interleaved`] against all the others.
#[cfg(feature = "criterion")]
pub fn bench_interleaved<M: criterion::measurement::Measurement<Value = Duration>>(
    group: &mut criterion::BenchmarkGroup<'_, M>,
    members: &[(&str, &dyn Fn())],
) {
    let ops: Vec<&dyn Fn()> = members.iter().map(|&(_, op)| op).collect();
    for (me, &(name, _)) in members.iter().enumerate() {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| interleaved(iters, me, &ops))
        });
    }
}

/// Benchmarks member `i` of `members` as `names[i]` in `group`, each timed
/// with [`interleaved_batched`] in batches of at most `batch` against all
/// the others.
///
/// # Panics
/// If `names` and `members` differ in length.
#[cfg(feature = "criterion")]
pub fn bench_interleaved_batched<M: criterion::measurement::Measurement<Value = Duration>>(
    group: &mut criterion::BenchmarkGroup<'_, M>,
    batch: u64,
    names: &[&str],
    members: &[BatchedMember<'_>],
) {
    assert_eq!(names.len(), members.len(), "one name per member");
    for (me, name) in names.iter().enumerate() {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| interleaved_batched(iters, batch, me, members))
        });
    }
}

/// Benchmarks member `i` of `members` as `names[i]` in `group`, each timed
/// with [`interleaved_prepared`] against all the others.
///
/// # Panics
/// If `names` and `members` differ in length.
#[cfg(feature = "criterion")]
pub fn bench_interleaved_prepared<M: criterion::measurement::Measurement<Value = Duration>>(
    group: &mut criterion::BenchmarkGroup<'_, M>,
    names: &[&str],
    members: &[PreparedMember<'_>],
) {
    assert_eq!(names.len(), members.len(), "one name per member");
    for (me, name) in names.iter().enumerate() {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| interleaved_prepared(iters, me, members))
        });
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn interleaved_batches_run_every_member_and_drain_after_each_batch() {
        let counts: [Cell<u64>; 4] = Default::default();
        let (a, b) = (
            || counts[0].set(counts[0].get() + 1),
            || counts[1].set(counts[1].get() + 1),
        );
        let (da, db) = (
            || counts[2].set(counts[2].get() + 1),
            || counts[3].set(counts[3].get() + 1),
        );
        let members: [BatchedMember<'_>; 2] = [(&a, &da), (&b, &db)];
        interleaved_batched(10, 4, 1, &members);
        // 4 + 4 + 2 launches of each member, a drain after each batch.
        assert_eq!(counts.each_ref().map(Cell::get), [10, 10, 3, 3]);
    }

    #[test]
    fn prepared_members_set_up_untimed_before_every_run() {
        let order = std::cell::RefCell::new(Vec::new());
        let slow_prepare = || {
            order.borrow_mut().push("prepare a");
            std::thread::sleep(Duration::from_millis(5));
        };
        let run_a = || order.borrow_mut().push("run a");
        let prepare_b = || order.borrow_mut().push("prepare b");
        let slow_run = || {
            order.borrow_mut().push("run b");
            std::thread::sleep(Duration::from_millis(2));
        };
        let members: [PreparedMember<'_>; 2] = [(&slow_prepare, &run_a), (&prepare_b, &slow_run)];
        let timed_a = interleaved_prepared(2, 0, &members);
        // Round 0 starts at a, round 1 at b; a's 5 ms set-up is not timed.
        assert_eq!(
            *order.borrow(),
            [
                "prepare a",
                "run a",
                "prepare b",
                "run b", //
                "prepare b",
                "run b",
                "prepare a",
                "run a",
            ]
        );
        // Both of a's 5 ms set-ups timed would make 10 ms.
        assert!(timed_a < Duration::from_millis(10), "{timed_a:?}");
        let timed_b = interleaved_prepared(3, 1, &members);
        assert!(timed_b >= Duration::from_millis(6), "{timed_b:?}");
        assert_eq!(interleaved_prepared(2, 7, &members), Duration::ZERO);
    }

    #[test]
    fn batches_launch_everything_and_drain_after_each() {
        let (launched, drained) = (Cell::new(0), Cell::new(0));
        batched(
            10,
            4,
            || launched.set(launched.get() + 1),
            || drained.set(drained.get() + 1),
        );
        assert_eq!((launched.get(), drained.get()), (10, 3), "4 + 4 + 2");
    }

    #[test]
    fn every_op_runs_every_round_and_only_one_is_timed() {
        let (a, b) = (Cell::new(0), Cell::new(0));
        let slow = || {
            a.set(a.get() + 1);
            std::thread::sleep(Duration::from_millis(2));
        };
        let fast = || b.set(b.get() + 1);
        let ops: [&dyn Fn(); 2] = [&slow, &fast];
        let timed_fast = interleaved(5, 1, &ops);
        assert_eq!((a.get(), b.get()), (5, 5));
        assert!(timed_fast < Duration::from_millis(10), "{timed_fast:?}");
        let timed_slow = interleaved(3, 0, &ops);
        assert!(timed_slow >= Duration::from_millis(6), "{timed_slow:?}");
        assert_eq!(interleaved(2, 9, &ops), Duration::ZERO);
    }
}
