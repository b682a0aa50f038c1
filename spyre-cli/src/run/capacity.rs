//! The up-front check that the device's memory holds a run.

use spyre_stream::{
    MIN_BLOCK, MemoryLayout, SMALL_REQUEST, STREAMS_PER_POOL, allocations_held, segment_bytes,
};

use super::plan::{BLOCKS_PER_ITERATION, DESCRIPTOR_BYTES, Plan};
use crate::cli::{ModeArg, RunArgs};
use crate::error::{CliError, Lowerable};
use crate::size::format_size;

/// Iterations whose memory one thread holds on the device at once: never
/// more than it runs; pipelined, its two memory slots however many are in
/// flight.
fn per_thread_on_device(args: &RunArgs) -> u64 {
    match args.mode {
        ModeArg::Pipelined => args.iterations.min(2),
        ModeArg::PerIteration | ModeArg::Serialized => (args.in_flight as u64).min(args.iterations),
    }
}

/// Pool streams that hold the device memory of `n` iterations in flight at
/// once, each in segments of its own (the caching allocator keeps segments
/// per stream): pipelined, the default stream, which owns every thread's
/// slots; serialized, each thread's stream (those of the threads the `n`
/// iterations are spread over); per iteration, a new stream each
/// iteration, round robin through both pools.
fn streams_holding(args: &RunArgs, n: u64) -> u64 {
    let pool_streams = 2 * STREAMS_PER_POOL as u64;
    match args.mode {
        ModeArg::Pipelined => 1,
        ModeArg::Serialized => (args.threads as u64).min(n).min(pool_streams),
        ModeArg::PerIteration => n.min(pool_streams),
    }
    .max(1)
}

/// The most operand blocks `programs` program segments of `program_segment`
/// bytes can cost where the device may place them: a region holds the
/// operand blocks that fit beside the program segments in it (blocks of
/// `block` bytes packed into segments of `operand_segment`, as
/// [`allocations_held`] counts them), and a program lands where memory is
/// being filled when it is taken, so in any region. (Counting the
/// programs' bytes together, or room at the regions' ends, passed runs
/// whose programs, one to a region, each cost a block there.) The worst
/// placement is found over the whole regions and the last part of one;
/// for more than [`PLACED_PROGRAMS`] programs, a bound: their bytes' worth
/// of segments and one more segment's blocks for every region they may
/// reach.
fn program_loss(
    layout: MemoryLayout,
    operand_segment: u64,
    block: u64,
    program_segment: u64,
    programs: u64,
) -> u64 {
    let MemoryLayout {
        total_bytes: total,
        region_bytes: region,
    } = layout;
    let per_segment = operand_segment / block;
    let held = |bytes: u64| bytes / operand_segment * per_segment + bytes % operand_segment / block;
    let (whole, part) = (total / region, total % region);
    if programs > PLACED_PROGRAMS {
        let regions = (whole + u64::from(part > 0)).min(programs);
        return programs
            .saturating_mul(program_segment)
            .div_ceil(operand_segment)
            .saturating_add(regions)
            .saturating_mul(per_segment);
    }
    // What `p` programs cost in a region of `size` bytes; `None` where
    // they do not fit in it.
    let loss = |size: u64, p: u64| {
        let taken = p
            .checked_mul(program_segment)
            .filter(|&taken| taken <= size)?;
        Some(held(size) - held(size - taken))
    };
    // `worst[k]`: the most `k` programs cost in the whole regions looked
    // at so far (`None`: they cannot be placed there). Whole regions are
    // alike, so `programs` of them are as many as can matter.
    let count = programs as usize;
    let mut worst: Vec<Option<u64>> = vec![None; count + 1];
    worst[0] = Some(0);
    for _ in 0..whole.min(programs) {
        let mut next = worst.clone();
        for (have, cost) in worst.iter().enumerate() {
            let Some(cost) = *cost else { continue };
            for p in 1..=count - have {
                let Some(more) = loss(region, p as u64) else {
                    break;
                };
                let slot = &mut next[have + p];
                *slot = Some(slot.map_or(cost + more, |best| best.max(cost + more)));
            }
        }
        worst = next;
    }
    (0..=count)
        .filter_map(|in_part| {
            let rest = worst[count - in_part]?;
            Some(rest + loss(part, in_part as u64)?)
        })
        .max()
        // Programs that fit nowhere leave no operand block.
        .unwrap_or(u64::MAX)
}

/// Programs whose worst placement [`program_loss`] finds exactly; above,
/// it bounds it.
const PLACED_PROGRAMS: u64 = 128;

/// Host memory the software device backs a run's device memory with: it
/// backs a region whole when it is first written, so the regions the
/// operand blocks of the iterations held on the device reach (packed into
/// the caching allocator's segments, whole segments into each region), at
/// least one, and never more than the device's memory.
pub(super) fn backed_bytes(plan: &Plan, args: &RunArgs, layout: MemoryLayout) -> u64 {
    let MemoryLayout {
        total_bytes: memory,
        region_bytes: region,
    } = layout;
    let block = plan.block_bytes().max(1);
    let segment = segment_bytes(layout, plan.operand_bytes).max(block);
    let blocks = (args.threads as u64)
        .saturating_mul(per_thread_on_device(args))
        .saturating_mul(BLOCKS_PER_ITERATION);
    let segments = blocks.div_ceil((segment / block).max(1));
    // A segment lies whole in one region (one larger than a region, in as
    // many as it covers), and a region holds as many whole segments as fit.
    let regions = if segment >= region {
        segments.saturating_mul(segment.div_ceil(region.max(1)))
    } else {
        segments.div_ceil((region / segment).max(1))
    };
    regions.max(1).saturating_mul(region).min(memory)
}

/// Why [`check_capacity`] refused a run, and what of `spyre run`'s to
/// change.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// What does not fit, and why.
    pub(crate) reason: String,
    /// The flags to change.
    pub(crate) advice: String,
}

impl From<Refusal> for CliError {
    fn from(Refusal { reason, advice }: Refusal) -> Self {
        CliError::Usage(format!("{reason}; {advice}"))
    }
}

/// Refuses a run that the software device's memory cannot hold, before any
/// work starts: an operand larger than a region, or more iterations in
/// flight than the caching allocator holds operand blocks for (each block
/// the size it rounds an operand to, packed into its segments, each in one
/// region: [`allocations_held`]) beside the iterations' programs (in
/// segments of their own: one at least on each stream that holds
/// iterations ([`streams_holding`]) where an operand's segment leaves its
/// stream no room for a program, else packed; or, for small operands that
/// fill their segments, one operand block each). The allocator keeps
/// segments per stream, so a run close to the limit may still need it to
/// return its cache and retry, or fail with a named out-of-memory error.
/// The advice names only changes that pass this check with the run's other
/// flags: a smaller `--size`, fewer threads or iterations in flight,
/// another mode.
pub(crate) fn check_capacity(
    plan: &Plan,
    args: &RunArgs,
    layout: MemoryLayout,
) -> Result<(), Refusal> {
    let Err(misfit) = assess(plan, args, layout) else {
        return Ok(());
    };
    let MemoryLayout {
        total_bytes: memory,
        region_bytes: region,
    } = layout;
    let block = plan.block_bytes();
    let smaller_size = || smaller_size_that_fits(args, layout);
    Err(match misfit {
        Misfit::BlockOverRegion => {
            let advice = match smaller_size() {
                Some((size, plan)) => format!(
                    "use a smaller --size: {size} fits with these flags (operands of {} bytes)",
                    plan.operand_bytes
                ),
                None if region < MIN_BLOCK => format!(
                    "no operand fits a region of {region} bytes; make the device's regions larger (SPYRE_MOCK_REGION_BYTES of at least {MIN_BLOCK}, with SPYRE_MOCK_MEMORY_BYTES at least as large)"
                ),
                None => nothing_fits(args, layout),
            };
            Refusal {
                reason: format!(
                    "--size {} needs operands of {} bytes ({}), each in a block of {block} bytes (the allocator rounds to {MIN_BLOCK}), but one memory region of the device holds {} bytes ({}) and a block must lie in one region",
                    args.size,
                    plan.operand_bytes,
                    format_size(plan.operand_bytes),
                    region,
                    format_size(region),
                ),
                advice,
            }
        }
        Misfit::NoIteration { blocks_held } => Refusal {
            reason: format!(
                "--size {} needs {BLOCKS_PER_ITERATION} blocks of {block} bytes per iteration, each in one memory region, but the device has {memory} bytes ({}) in regions of {region} bytes, where the caching allocator's segments hold {blocks_held} such block{} beside the programs",
                args.size,
                format_size(memory),
                if blocks_held == 1 { "" } else { "s" }
            ),
            advice: smaller_size().map_or_else(
                || nothing_fits(args, layout),
                |(size, _)| format!("use a smaller --size: {size} fits with these flags"),
            ),
        },
        Misfit::TooManyInFlight {
            in_flight,
            per_thread,
            iterations_held,
        } => Refusal {
            reason: format!(
                "--size {} with --threads {} and --in-flight {} (--mode {}) keeps {in_flight} iterations' memory on the device, each in {BLOCKS_PER_ITERATION} blocks of {block} bytes that must each lie in one memory region, but the device has {memory} bytes ({}) in regions of {region} bytes, where the caching allocator's segments hold at most {iterations_held} of them at once beside their programs",
                args.size,
                args.threads,
                args.in_flight,
                args.mode.name(),
                format_size(memory)
            ),
            advice: capacity_advice(plan, args, layout, per_thread, smaller_size().is_some()),
        },
    })
}

/// The advice when not even the smallest `--size` fits with `args`' other
/// flags: fewer threads or iterations in flight where that makes it fit,
/// else a device with more memory.
fn nothing_fits(args: &RunArgs, layout: MemoryLayout) -> String {
    let smallest = Plan::new(args.kernel, MIN_SIZE).ok();
    match smallest.map(|plan| assess(&plan, args, layout)) {
        Some(Err(Misfit::TooManyInFlight { per_thread, .. })) => format!(
            "no --size fits with these flags, not even operands of one f32 (--size {MIN_SIZE}); with --size {MIN_SIZE}, {}",
            capacity_advice(
                &smallest.expect("assessed above"),
                args,
                layout,
                per_thread,
                false
            )
        ),
        _ => format!(
            "no --size fits this device, not even operands of one f32 (--size {MIN_SIZE}): one iteration's three blocks of {MIN_BLOCK} bytes and its program do not fit its memory; use a device with more memory (SPYRE_MOCK_MEMORY_BYTES)"
        ),
    }
}

/// Why a run does not fit ([`assess`]), with what its refusal names.
enum Misfit {
    /// An operand's block is larger than a memory region.
    BlockOverRegion,
    /// Not one iteration fits beside its program; the device holds
    /// `blocks_held` operand blocks beside one program.
    NoIteration { blocks_held: u64 },
    /// `in_flight` iterations' memory (`per_thread` a thread) is more
    /// than the `iterations_held` that fit beside their programs.
    TooManyInFlight {
        in_flight: u64,
        per_thread: u64,
        iterations_held: u64,
    },
}

/// Whether the run of `plan` with `args` (whose `--size` is not read: the
/// plan says what it asks) fits the device's memory (see
/// [`check_capacity`]).
fn assess(plan: &Plan, args: &RunArgs, layout: MemoryLayout) -> Result<(), Misfit> {
    let block = plan.block_bytes();
    if block > layout.region_bytes {
        return Err(Misfit::BlockOverRegion);
    }
    let per_thread = per_thread_on_device(args);
    let in_flight = (args.threads as u64).saturating_mul(per_thread);
    // Each iteration in flight also holds its program, a small block. So
    // what fits depends on how many are in flight: `held(n)` iterations
    // fit beside the programs of `n`.
    let program_segment = segment_bytes(layout, DESCRIPTOR_BYTES).max(MIN_BLOCK);
    let operand_segment = segment_bytes(layout, plan.operand_bytes).max(block);
    let operand_blocks = allocations_held(layout, plan.operand_bytes);
    // Operands of the allocator's small pool, several to a segment with no
    // room left beside them, share their segments with the programs: a
    // program may then be cut from a free operand block, whose rest no
    // operand fits. Counted as one operand block per program (measured:
    // 2 MiB in regions of 1 MiB, operands of 32 KiB, 32 to a segment:
    // 16 iterations in flight on one thread ran, 17 ran out of memory).
    let program_block = DESCRIPTOR_BYTES.next_multiple_of(MIN_BLOCK);
    let cut_from_operands = block <= SMALL_REQUEST
        && operand_segment / block > 1
        && operand_segment % block < program_block;
    let blocks_beside = |n: u64| {
        if cut_from_operands {
            // Counted in what the iterations need (below).
            return operand_blocks;
        }
        // Else the programs take segments of their own, each costing the
        // operands the segments it covers. Where an operand's segment has room beside its blocks for
        // a program (small operands, whose pool the programs share), they
        // are counted packed, as if on one stream: a program is cut from
        // what is left of its stream's operand segment, and a full device
        // lends one stream's cached rest to another (measured, 30
        // serialized threads of operands of 33 KiB took one 2 MiB segment
        // each, operands and program). Beside operands of the large pool,
        // or small ones whose segment is their own block (a small
        // device's segments are capped), every stream that holds
        // iterations takes a program segment of its own: it is taken
        // while the device still has room, and its free rest is smaller
        // than an operand's block. (Measured before those were counted per
        // stream: 64 MiB, operands of 5 161 984 bytes, four iterations in
        // flight on four streams passed the check and ran out of memory,
        // their four programs taking a 2 MiB segment each; 8 MiB, operands
        // of 262 144 bytes, nine in flight passed and ran out at the
        // eighth.)
        let streams = if block > SMALL_REQUEST || operand_segment % block < program_block {
            streams_holding(args, n)
        } else {
            1
        };
        let programs =
            streams.saturating_mul(n.div_ceil(streams).div_ceil(program_segment / MIN_BLOCK));
        operand_blocks.saturating_sub(program_loss(
            layout,
            operand_segment,
            block,
            program_segment,
            programs,
        ))
    };
    // The operand blocks `n` iterations in flight take: on one stream,
    // their own; on several, whole segments of each stream's. A stream's
    // blocks are cut from its own segments, and a full device takes a new
    // segment in pieces where its free memory is scattered before it lends
    // another stream's cached blocks, so the rest of other streams'
    // segments does not serve an operand, which needs one chunk. (Measured
    // while blocks were counted as if on one stream: on the default device,
    // `--size 10MiB --threads 16 --mode per-iteration` passed and ran out
    // of memory, an operand coming back in pieces, in 5 runs of 5.)
    let per_segment = (operand_segment / block).max(1);
    // A program cut from an operand block takes that block: one more per
    // iteration, in its stream's segments.
    let blocks_per_iteration = BLOCKS_PER_ITERATION + u64::from(cut_from_operands);
    let needed = |n: u64| {
        let streams = streams_holding(args, n);
        if streams > 1 && per_segment > 1 {
            let per_stream = n.div_ceil(streams).saturating_mul(blocks_per_iteration);
            streams
                .saturating_mul(per_stream.div_ceil(per_segment))
                .saturating_mul(per_segment)
        } else {
            n.saturating_mul(blocks_per_iteration)
        }
    };
    let fits = |n: u64| needed(n) <= blocks_beside(n);
    // The most iterations that fit beside their own programs: what they
    // need never shrinks and what is held beside their programs never
    // grows with `n`, so the `n` that fit are 1 up to that.
    let iterations_held = last_fitting(0, operand_blocks / blocks_per_iteration + 1, fits);
    if iterations_held == 0 {
        return Err(Misfit::NoIteration {
            blocks_held: blocks_beside(1).saturating_sub(u64::from(cut_from_operands)),
        });
    }
    if !fits(in_flight) {
        return Err(Misfit::TooManyInFlight {
            in_flight,
            per_thread,
            iterations_held,
        });
    }
    Ok(())
}

/// A `--size` below `args.size` that fits with the run's other flags, and
/// its plan; `None` when not even [`MIN_SIZE`] fits. Found by bisection,
/// every size tried checked whole ([`assess`]): so the size found fits,
/// and it is the largest that does where a larger size never needs less
/// memory. The allocator's pools make that not so everywhere (operands
/// just over [`SMALL_REQUEST`] go to larger segments, where more may fit
/// than of ones just under it), so a larger size may fit too.
fn smaller_size_that_fits(args: &RunArgs, layout: MemoryLayout) -> Option<(u64, Plan)> {
    let fits = |size: u64| {
        let plan = Plan::new(args.kernel, size).ok()?;
        assess(&plan, args, layout).is_ok().then_some(plan)
    };
    fits(MIN_SIZE)?;
    let size = last_fitting(MIN_SIZE, args.size, |size| fits(size).is_some());
    Some((size, fits(size)?))
}

/// The largest value from `fit` up to below `over` for which `fits` holds,
/// found by bisection, where `fits` holds for every value below one that it
/// holds for and is taken to hold for `fit` (not asked of it).
fn last_fitting(mut fit: u64, mut over: u64, fits: impl Fn(u64) -> bool) -> u64 {
    while over.saturating_sub(fit) > 1 {
        let mid = fit + (over - fit) / 2;
        if fits(mid) {
            fit = mid;
        } else {
            over = mid;
        }
    }
    fit
}

/// The smallest `--size`: one `f32` in each operand.
const MIN_SIZE: u64 = 12;

/// Which of `args`' flags can still lower the device memory the run of
/// `plan` holds, when the device runs out of it during the run: `--size`
/// where a smaller one gives smaller operand blocks, `--in-flight` where it
/// keeps several iterations' memory per thread, `--threads` above 1, and a
/// pipelined thread's two iterations.
pub(super) fn lowerable(args: &RunArgs, plan: &Plan) -> Lowerable {
    // Operands of up to 512 bytes all take a block of 512.
    let smallest = Plan::new(args.kernel, MIN_SIZE).map_or(0, |smallest| smallest.block_bytes());
    let several = per_thread_on_device(args) > 1;
    Lowerable {
        size: plan.block_bytes() > smallest,
        in_flight: args.mode != ModeArg::Pipelined && several,
        threads: args.threads > 1,
        one_per_thread: args.mode == ModeArg::Pipelined && several,
    }
}

/// What to change when `args`' threads, each keeping `per_thread`
/// iterations' memory, keep more than the device holds with `plan`: only
/// changes that fit are named, each checked whole ([`assess`]) with the
/// run's other flags (so counted on the streams that mode uses), a
/// smaller `--size` only where one fits (`size_fits`).
fn capacity_advice(
    plan: &Plan,
    args: &RunArgs,
    layout: MemoryLayout,
    per_thread: u64,
    size_fits: bool,
) -> String {
    let fits_with = |change: &dyn Fn(&mut RunArgs)| {
        let mut changed = args.clone();
        change(&mut changed);
        assess(plan, &changed, layout).is_ok()
    };
    // The most threads below `args.threads` that fit in `mode` with
    // `in_flight` each.
    let threads_fitting = |mode: ModeArg, in_flight: usize| {
        largest_fitting(args.threads, |threads| {
            fits_with(&|run| {
                run.mode = mode;
                run.in_flight = in_flight;
                run.threads = threads;
            })
        })
    };
    let size = if size_fits {
        ", or use a smaller --size"
    } else {
        ""
    };
    match args.mode {
        ModeArg::Pipelined => {
            let holds = if per_thread == 1 {
                "one iteration's".to_owned()
            } else {
                format!("{per_thread} iterations'")
            };
            let pipelined = threads_fitting(ModeArg::Pipelined, args.in_flight).map_or_else(
                || "no pipelined thread fits".to_owned(),
                |fit| format!("lower --threads to at most {fit}"),
            );
            let one_each = if fits_with(&|run| {
                run.mode = ModeArg::PerIteration;
                run.in_flight = 1;
            }) {
                Some(
                    "use --mode per-iteration --in-flight 1 (one iteration's memory per thread), which fits"
                        .to_owned(),
                )
            } else {
                threads_fitting(ModeArg::PerIteration, 1).map(|fit| {
                    format!("use --mode per-iteration --in-flight 1 with --threads at most {fit}")
                })
            };
            let one_each = one_each.map_or_else(String::new, |one_each| format!(", or {one_each}"));
            format!(
                "a pipelined thread keeps {holds} memory however many are in flight: {pipelined}{one_each}{size}"
            )
        }
        ModeArg::PerIteration | ModeArg::Serialized => {
            let fewer_in_flight = largest_fitting(args.in_flight, |in_flight| {
                fits_with(&|run| run.in_flight = in_flight)
            });
            match fewer_in_flight {
                Some(in_flight) => {
                    // Fewer threads, each keeping as many: only where one fits.
                    let threads_fit = threads_fitting(args.mode, args.in_flight)
                        .map(|fit| format!("or --threads to at most {fit}"));
                    let others: Vec<String> = threads_fit
                        .into_iter()
                        .chain(size_fits.then(|| "or --size".to_owned()))
                        .collect();
                    let others = if others.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", others.join(", "))
                    };
                    format!("lower --in-flight to at most {in_flight}{others}")
                }
                None => {
                    let threads = threads_fitting(args.mode, 1).map_or_else(
                        || "no thread fits".to_owned(),
                        |fit| format!("lower --threads to at most {fit}"),
                    );
                    let with_one = if per_thread > 1 {
                        ", with --in-flight 1"
                    } else {
                        ""
                    };
                    format!("even one iteration per thread does not fit: {threads}{with_one}{size}")
                }
            }
        }
    }
}

/// The largest value below `current` for which `fits` holds, where it
/// holds for every value below one that it holds for; `None` when it does
/// not hold for 1.
fn largest_fitting(current: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    if current <= 1 || !fits(1) {
        return None;
    }
    let fit = last_fitting(1, current as u64, |value| fits(value as usize));
    Some(fit as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::KernelArg;

    const MIB: u64 = 1 << 20;
    /// The software device's default memory: 1 GiB in regions of 256 MiB.
    const DEFAULT: MemoryLayout = MemoryLayout {
        total_bytes: 1 << 30,
        region_bytes: 256 * MIB,
    };

    fn args(size: u64, threads: usize, in_flight: usize, mode: ModeArg) -> RunArgs {
        RunArgs {
            threads,
            iterations: 100,
            size,
            kernel: KernelArg::Axpy,
            mode,
            in_flight,
            seed: 1,
            json: false,
            trace: None,
            timeline: None,
            exit_when_stdin_closes: false,
        }
    }

    fn backed(size: u64, threads: usize, in_flight: usize, mode: ModeArg) -> u64 {
        let plan = Plan::new(KernelArg::Axpy, size).unwrap();
        backed_bytes(&plan, &args(size, threads, in_flight, mode), DEFAULT)
    }

    /// The `--size` `check_capacity`'s advice names for `size` on `layout`.
    fn advised_size(size: u64, threads: usize, layout: MemoryLayout) -> Option<u64> {
        let run = args(size, threads, 1, ModeArg::PerIteration);
        let plan = Plan::new(KernelArg::Axpy, size).unwrap();
        let refusal = check_capacity(&plan, &run, layout).unwrap_err();
        let (_, rest) = refusal.advice.split_once("use a smaller --size: ")?;
        Some(rest.split(' ').next().unwrap().parse().unwrap())
    }

    /// Whether a run of `size` fits `layout`.
    fn fits(size: u64, threads: usize, layout: MemoryLayout) -> bool {
        let plan = Plan::new(KernelArg::Axpy, size).unwrap();
        check_capacity(
            &plan,
            &args(size, threads, 1, ModeArg::PerIteration),
            layout,
        )
        .is_ok()
    }

    #[test]
    fn the_advised_size_fits_with_the_other_flags() {
        // 512 MiB in two regions of 256 MiB, one iteration: three operand
        // blocks and a program. Blocks of 128 MiB go two to a region, four
        // in all, and the program's segment costs one: three, one
        // iteration. One of 128 MiB + 512 B goes one to a region. So the
        // largest operand is 128 MiB, 33 554 432 elements, the plan of
        // sizes 402 653 184 to 402 653 195. (Before, the advice was 768
        // MiB, three operands of a whole region, which the check refused
        // again.)
        let half_gib = MemoryLayout {
            total_bytes: 512 * MIB,
            region_bytes: 256 * MIB,
        };
        for size in [1 << 30, 512 * MIB, 402_653_196] {
            assert_eq!(advised_size(size, 1, half_gib), Some(402_653_195), "{size}");
        }
        assert!(fits(402_653_195, 1, half_gib));
        assert!(!fits(402_653_196, 1, half_gib));
        // Where a block fits a region but not one iteration fits, the
        // advice names a size too (before, "use a smaller --size" alone):
        // one that fits, where the next size up, a larger operand, does
        // not.
        let tiny = MemoryLayout {
            total_bytes: 4096,
            region_bytes: 4096,
        };
        let advised = advised_size(64 << 10, 1, tiny).expect("a bound");
        assert!(
            fits(advised, 1, tiny) && !fits(advised + 1, 1, tiny),
            "{advised}"
        );
        // With more threads than the device holds an iteration for, no
        // size fits, and the advice says what else to change.
        let run = args(64 << 10, 64, 1, ModeArg::PerIteration);
        let plan = Plan::new(KernelArg::Axpy, 64 << 10).unwrap();
        let advice = check_capacity(&plan, &run, tiny).unwrap_err().advice;
        // At 12 bytes, a block each of 512 bytes: 4 KiB holds 8, and each
        // iteration's program takes a segment of its own (512 bytes, a
        // block's worth): n iterations leave 8 - n blocks, 3 to an
        // iteration, so 2 fit (2 ≤ 6 / 3), 3 do not (5 / 3 = 1).
        assert_eq!(
            advice,
            "no --size fits with these flags, not even operands of one f32 (--size 12); with --size 12, even one iteration per thread does not fit: lower --threads to at most 2"
        );
        // Keeping 3 each, fewer threads alone would not fit: named with
        // --in-flight 1.
        let run = args(64 << 10, 64, 3, ModeArg::PerIteration);
        assert_eq!(
            check_capacity(&plan, &run, tiny).unwrap_err().advice,
            "no --size fits with these flags, not even operands of one f32 (--size 12); with --size 12, even one iteration per thread does not fit: lower --threads to at most 2, with --in-flight 1"
        );
        // Where not one iteration of the smallest size fits (three blocks
        // of 512 bytes fill 1 536 bytes, with no room for the program),
        // fewer threads cannot help: only more memory.
        let no_room = MemoryLayout {
            total_bytes: 1536,
            region_bytes: 1536,
        };
        let run = args(12, 1, 1, ModeArg::PerIteration);
        let plan = Plan::new(KernelArg::Axpy, 12).unwrap();
        assert_eq!(
            check_capacity(&plan, &run, no_room).unwrap_err().advice,
            "no --size fits this device, not even operands of one f32 (--size 12): one iteration's three blocks of 512 bytes and its program do not fit its memory; use a device with more memory (SPYRE_MOCK_MEMORY_BYTES)"
        );
        // Where too many are in flight and no smaller size would fit (12
        // bytes is the smallest), none is suggested (before, "or --size").
        let run = args(12, 1, 3, ModeArg::PerIteration);
        let plan = Plan::new(KernelArg::Axpy, 12).unwrap();
        let advice = check_capacity(&plan, &run, tiny).unwrap_err().advice;
        assert!(!advice.contains("--size"), "{advice}");
        // In pipelined mode --in-flight changes nothing: the advice is a
        // pipelined thread's.
        let run = args(1 << 20, 64, 4, ModeArg::Pipelined);
        let plan = Plan::new(KernelArg::Axpy, 1 << 20).unwrap();
        let advice = check_capacity(&plan, &run, tiny).unwrap_err().advice;
        assert!(
            advice.starts_with("no --size fits with these flags, not even operands of one f32 (--size 12); with --size 12, a pipelined thread keeps 2 iterations' memory however many are in flight: lower --threads to at most 1, "),
            "{advice}"
        );
    }

    #[test]
    fn programs_take_a_segment_on_each_stream_that_holds_iterations() {
        // 64 MiB in one region; segments at most 2 MiB (1/32), so an
        // operand of about 5 MiB takes a segment of its own size, and each
        // program a 2 MiB segment of its stream's.
        let layout = MemoryLayout {
            total_bytes: 64 * MIB,
            region_bytes: 64 * MIB,
        };
        let fits = |size, mode| {
            let plan = Plan::new(KernelArg::Axpy, size).unwrap();
            check_capacity(&plan, &args(size, 1, 4, mode), layout).is_ok()
        };
        // Operands of 5 161 984 bytes: 13 to the device. Per iteration,
        // four in flight are on four streams, whose four program segments
        // (8 MiB) cost 2 blocks: 11 left, four iterations need 12. (This
        // passed the check while the programs were counted as sharing one
        // segment, and ran out of memory at the fourth iteration.)
        assert_eq!(
            Plan::new(KernelArg::Axpy, 15_485_963)
                .unwrap()
                .operand_bytes,
            5_161_984
        );
        assert!(!fits(15_485_963, ModeArg::PerIteration));
        // Serialized, the four are on one stream: one program segment
        // costs 1 block, 12 left.
        assert!(fits(15_485_963, ModeArg::Serialized));
        // Operands of 4 893 184 bytes: 13 in the region; the four program
        // segments (8 MiB) leave 56 MiB, which holds 12: four iterations
        // fit (the size the advice names; run 12 of 12 iterations, twice).
        assert_eq!(
            Plan::new(KernelArg::Axpy, 14_679_563)
                .unwrap()
                .operand_bytes,
            4_893_184
        );
        assert!(fits(14_679_563, ModeArg::PerIteration));
        // Operands of 4 893 356 bytes, blocks of 4 893 696: the 56 MiB
        // left beside the programs hold 11, and twelve with the programs
        // would need 67 112 960 bytes, more than the device.
        assert!(!fits(14_680_068, ModeArg::PerIteration));
        // Small operands share their segments with the programs: 31
        // serialized threads of operands of 33 332 bytes, four in flight
        // each, fit (before the small pool was told apart, this was
        // refused; it ran 1 922 of 1 922 iterations).
        let plan = Plan::new(KernelArg::Axpy, 100_000).unwrap();
        let serialized = args(100_000, 31, 4, ModeArg::Serialized);
        assert!(check_capacity(&plan, &serialized, layout).is_ok());
        // Small operands whose segment is their own block (8 MiB in one
        // region: segments capped at 256 KiB, operands of 262 144 bytes):
        // no room beside them, so every stream's program takes a segment
        // of 256 KiB. Of the 32 blocks, nine in flight per iteration lose
        // nine (23 < 27); eight lose eight (24). Nine passed the check
        // while such programs were counted packed, and ran out of memory
        // at the eighth iteration; eight ran 16 of 16.
        let small = MemoryLayout {
            total_bytes: 8 * MIB,
            region_bytes: 8 * MIB,
        };
        let plan = Plan::new(KernelArg::Axpy, 786_432).unwrap();
        let in_flight = |n| {
            let mut run = args(786_432, 1, n, ModeArg::PerIteration);
            run.iterations = 16;
            check_capacity(&plan, &run, small).is_ok()
        };
        assert!(in_flight(8) && !in_flight(9));
        // The ends of regions give programs no room: the device places a
        // program after its iteration's operands, in the region being
        // filled. 68 MiB in regions of 32 MiB, operands of 11 184 640
        // bytes: three to a whole region (512 bytes left), none in the last
        // 4 MiB; two pipelined iterations need the six, and their program
        // segment costs one. This passed while the last region's 4 MiB
        // counted as room, and failed its first iteration (an operand came
        // back in three chunks).
        let partial = MemoryLayout {
            total_bytes: 68 * MIB,
            region_bytes: 32 * MIB,
        };
        let plan = Plan::new(KernelArg::Axpy, 33_553_920).unwrap();
        assert_eq!(plan.block_bytes(), 11_184_640);
        let mut pipelined = args(33_553_920, 1, 4, ModeArg::Pipelined);
        pipelined.iterations = 4;
        assert!(check_capacity(&plan, &pipelined, partial).is_err());
    }

    #[test]
    fn programs_cost_blocks_in_the_regions_they_land_in() {
        // 64 MiB in regions of 16 MiB; operands of 3 267 936 bytes, five
        // to a region (436 736 bytes left): 20 blocks. Three serialized
        // threads, two in flight each, need 18 and take three program
        // segments of 2 MiB, which may land one to a region, each costing
        // a block there: 17. Counted by their bytes together (6 MiB, two
        // blocks) this passed and failed its first iteration, 2 runs of 2.
        let layout = MemoryLayout {
            total_bytes: 64 * MIB,
            region_bytes: 16 * MIB,
        };
        let plan = Plan::new(KernelArg::Axpy, 9_803_808).unwrap();
        assert_eq!(plan.block_bytes(), 3_268_096);
        let serialized = |threads| args(9_803_808, threads, 2, ModeArg::Serialized);
        assert!(check_capacity(&plan, &serialized(3), layout).is_err());
        // Two threads need 12 beside two programs: fits (ran 24 of 24).
        assert!(check_capacity(&plan, &serialized(2), layout).is_ok());
        // A program where a region has room costs nothing: on the default
        // device, operands of 66.7 MiB go three to a 256 MiB region (56 MiB
        // left), and the default run's 12 blocks fit beside its program
        // (ran 8 of 8; before, the program was counted as a block).
        let plan = Plan::new(KernelArg::Axpy, 200 * MIB).unwrap();
        let default_run = args(200 * MIB, 2, 4, ModeArg::Pipelined);
        assert!(check_capacity(&plan, &default_run, DEFAULT).is_ok());
    }

    #[test]
    fn operands_on_several_streams_take_whole_segments_of_each() {
        // The default device: 1 GiB in regions of 256 MiB. `--size 10MiB`
        // makes blocks of 3 495 424 bytes, five to a 20 MiB segment; a
        // region holds 12 segments and 4 blocks in its last 16 MiB: 256
        // blocks. Per iteration, 16 threads keep 64 in flight on 64
        // streams, each cutting its 3 blocks from a segment of its own (5
        // blocks): 320, beside 64 program segments (128 MiB, 35 blocks).
        // Counted as if on one stream (192 blocks) this passed, and ran
        // out of memory, an operand coming back in pieces, in 5 runs of 5.
        let plan = Plan::new(KernelArg::Axpy, 10 << 20).unwrap();
        assert_eq!(plan.block_bytes(), 3_495_424);
        let mut run = args(10 << 20, 16, 4, ModeArg::PerIteration);
        run.iterations = 12;
        assert!(check_capacity(&plan, &run, DEFAULT).is_err());
        // One stream (pipelined) keeps counting the blocks themselves: the
        // default run fits.
        let plan = Plan::new(KernelArg::Axpy, MIB).unwrap();
        assert!(check_capacity(&plan, &args(MIB, 2, 4, ModeArg::Pipelined), DEFAULT).is_ok());
    }

    #[test]
    fn only_flags_that_can_lower_the_memory_are_lowerable() {
        let of = |size, threads, in_flight, mode| {
            let plan = Plan::new(KernelArg::Axpy, size).unwrap();
            lowerable(&args(size, threads, in_flight, mode), &plan)
        };
        let none = Lowerable {
            size: false,
            in_flight: false,
            threads: false,
            one_per_thread: false,
        };
        assert_eq!(of(12, 1, 1, ModeArg::PerIteration), none);
        // 23 bytes give the same operands as 12 (one f32 each), and 1 536
        // bytes operands of 512 bytes, the same block.
        assert_eq!(of(23, 1, 1, ModeArg::PerIteration), none);
        assert_eq!(of(1536, 1, 1, ModeArg::PerIteration), none);
        assert!(of(1548, 1, 1, ModeArg::PerIteration).size);
        // Pipelined, --in-flight changes nothing held on the device; one
        // iteration per thread per iteration does.
        assert_eq!(
            of(1 << 20, 1, 4, ModeArg::Pipelined),
            Lowerable {
                size: true,
                one_per_thread: true,
                ..none
            }
        );
        assert_eq!(
            of(12, 2, 4, ModeArg::Serialized),
            Lowerable {
                in_flight: true,
                threads: true,
                ..none
            }
        );
    }

    #[test]
    fn the_backed_memory_is_the_regions_the_held_blocks_reach() {
        // The default run: 2 threads × 2 slots × 3 blocks of 341.5 KiB,
        // packed 5 to a 2 MiB segment: 3 segments, in one region.
        assert_eq!(backed(MIB, 2, 4, ModeArg::Pipelined), 256 * MIB);
        // Operands of 256 MiB, each a segment and a region of its own: one
        // iteration holds three regions.
        assert_eq!(backed(768 * MIB, 1, 1, ModeArg::PerIteration), 768 * MIB);
        // Operands of 64 MiB: 2 threads × 2 iterations × 3 blocks, four
        // segments to a region: three regions.
        assert_eq!(backed(192 * MIB, 2, 2, ModeArg::PerIteration), 768 * MIB);
        // Operands of 130 MiB: one segment to a region (two do not fit),
        // so three regions, not the two their bytes would fill.
        assert_eq!(backed(390 * MIB, 1, 1, ModeArg::PerIteration), 768 * MIB);
        // Never more than the device's memory.
        assert_eq!(backed(768 * MIB, 4, 4, ModeArg::PerIteration), 1 << 30);
    }
}
