//! Interleaved timing: several contenders measured round by round.

use std::time::{Duration, Instant};

/// Times `iters` runs of `ops[me]`. Each round runs every op of `ops` once,
/// in order, and times only `ops[me]`, so that all members of a group are
/// measured over the same stretch of time (this machine class drifts 2–3×
/// within minutes; medians of separate runs would compare different
/// machines). A `me` that is not an index of `ops` times nothing: zero.
pub fn interleaved(iters: u64, me: usize, ops: &[&dyn Fn()]) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        for (index, op) in ops.iter().enumerate() {
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

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
