//! How long a matmul run will take on the software device, said before it
//! starts.
//!
//! A matmul iteration costs n³ multiply-adds twice: once on the device (the
//! software device runs the kernel on the host's CPU) and once for the host
//! reference that checks it. The rate is measured here, on this machine and
//! build, by timing the reference on a small matrix; the estimate divides the
//! run's multiply-adds by that rate and by the host cores that can work at
//! once. It is an estimate, good to a small factor: enough to warn before a
//! run of many minutes.

use std::time::{Duration, Instant};

use crate::verify;

/// Runs estimated to take longer than this get a warning before they start.
pub(crate) const WARN_AFTER: Duration = Duration::from_secs(60);

/// The `--size` the warning suggests for a quick run, and the side of the
/// matrices it makes (the run's plan: the square root of a twelfth).
const QUICK_SIZE: &str = "64KiB";
const QUICK_SIDE: u64 = ((64 << 10) / 12_u64).isqrt();

/// Side of the matrix timed to measure the host's multiply-add rate.
const CALIBRATION_N: usize = 64;

/// The multiply-adds of `iterations` matmuls of n×n matrices, counting the
/// device's and the reference's.
pub(crate) fn matmul_work(n: u64, iterations: u64) -> f64 {
    2.0 * (n as f64).powi(3) * iterations as f64
}

/// Seconds that `work` multiply-adds take at `rate` per second per core on
/// `parallel` cores at once.
pub(crate) fn seconds(work: f64, rate: f64, parallel: usize) -> f64 {
    work / (rate * parallel.max(1) as f64)
}

/// Measures this host's multiply-add rate on the reference matmul (per
/// core, per second): the best of three timings of a 64×64 product.
pub(crate) fn measure_rate() -> f64 {
    let a = vec![1.0f32; CALIBRATION_N * CALIBRATION_N];
    let best = (0..3)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(verify::matmul_square(
                CALIBRATION_N,
                std::hint::black_box(&a),
                &a,
            ));
            started.elapsed()
        })
        .min()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_nanos(1));
    (CALIBRATION_N as f64).powi(3) / best.as_secs_f64()
}

/// The warning for a matmul run of `iterations` iterations of side `n` on
/// `threads` host threads, or `None` when it should take at most
/// [`WARN_AFTER`].
pub(crate) fn matmul_warning(n: u64, iterations: u64, threads: usize, rate: f64) -> Option<String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let work = matmul_work(n, iterations);
    let estimate = seconds(work, rate, threads.min(cores));
    (estimate > WARN_AFTER.as_secs_f64()).then(|| {
        // A size no larger than the one suggested is told only the rest.
        let advice = if n > QUICK_SIDE {
            format!("a smaller --size (e.g. {QUICK_SIZE}) or fewer --iterations")
        } else {
            "fewer --iterations".to_owned()
        };
        format!(
            "spyre run: matmul {n}×{n} × {iterations} iterations is {work:.2e} multiply-adds (device and host reference); at the {rate:.2e}/s per core measured here that is about {} on the software device. Use {advice} for a quick run.",
            human(estimate)
        )
    })
}

/// `95 s`, `12 min`, `3.4 h`, `3 days`, `5 years`, `1.0e5 years`.
fn human(seconds: f64) -> String {
    const DAY: f64 = 86_400.0;
    const YEAR: f64 = 365.25 * DAY;
    if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else if seconds < 7200.0 {
        format!("{:.0} min", seconds / 60.0)
    } else if seconds < 2.0 * DAY {
        format!("{:.1} h", seconds / 3600.0)
    } else if seconds < 2.0 * YEAR {
        format!("{:.0} days", seconds / DAY)
    } else if seconds < 1000.0 * YEAR {
        format!("{:.0} years", seconds / YEAR)
    } else {
        format!("{:.1e} years", seconds / YEAR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_and_time_by_hand() {
        // 100³ = 10^6 multiply-adds, twice, for 10 iterations.
        assert_eq!(matmul_work(100, 10), 2.0e7);
        // 2e7 at 1e6 per second on 2 cores: 10 s.
        assert_eq!(seconds(2.0e7, 1.0e6, 2), 10.0);
        assert_eq!(seconds(2.0e7, 1.0e6, 0), 20.0, "no cores counts as one");
    }

    #[test]
    fn only_runs_longer_than_a_minute_are_warned_about() {
        // 2 × 1000³ × 1 = 2e9 at 1e7/s on one thread: 200 s.
        let warning = matmul_warning(1000, 1, 1, 1.0e7).unwrap();
        assert!(warning.contains("about 3 min"), "{warning}");
        assert!(warning.contains("2.00e9 multiply-adds"), "{warning}");
        // 2 × 100³ = 2e6 at 1e7/s: 0.2 s.
        assert_eq!(matmul_warning(100, 1, 1, 1.0e7), None);
    }

    #[test]
    fn a_size_no_larger_than_the_suggested_one_is_told_only_fewer_iterations() {
        // 64 KiB holds operands of 5 461 elements (a twelfth of its bytes):
        // 73×73 matrices (73² = 5 329, 74² = 5 476).
        assert_eq!(QUICK_SIDE, 73);
        for (n, advice) in [
            (1, "Use fewer --iterations for a quick run."),
            (73, "Use fewer --iterations for a quick run."),
            (
                74,
                "Use a smaller --size (e.g. 64KiB) or fewer --iterations for a quick run.",
            ),
        ] {
            let warning = matmul_warning(n, u64::MAX, 1, 1.0e7).unwrap();
            assert!(warning.ends_with(advice), "{warning}");
        }
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human(95.0), "95 s");
        assert_eq!(human(720.0), "12 min");
        assert_eq!(human(12_240.0), "3.4 h");
        assert_eq!(human(259_200.0), "3 days");
        assert_eq!(human(1.57788e8), "5 years");
        assert_eq!(human(3.15576e12), "1.0e5 years");
    }

    #[test]
    fn the_measured_rate_is_positive_and_finite() {
        let rate = measure_rate();
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
    }
}
