//! `testbed task`: a synthetic container workload with a configurable profile — hold M MiB of
//! touched (really resident) memory and burn a fraction F of one core for D ms of wall time,
//! then exit with code C. Containers started by experiments run this so their CPU and memory
//! use is known and reproducible (DESIGN.md "Containers are real").

use std::time::{Duration, Instant};

use anyhow::Context;

/// Length of one busy/idle duty cycle.
const DUTY_PERIOD: Duration = Duration::from_millis(10);
const MIB: u64 = 1 << 20;

/// Arguments of `testbed task`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct TaskArgs {
    /// Wall-clock run time in milliseconds.
    #[arg(long)]
    pub duration_ms: u64,
    /// MiB of memory to allocate and touch before running (held until exit).
    #[arg(long, default_value_t = 0)]
    pub memory_mib: u64,
    /// Fraction of one core to keep busy, 0..=1 (duty cycle over 10 ms periods).
    #[arg(long, default_value_t = 0.0, value_parser = parse_cpu_fraction)]
    pub cpu_fraction: f64,
    /// Exit code to return when done, 0..=255.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=255))]
    pub exit_code: i32,
    /// Memory use over time instead of a constant --memory-mib: `MS:MIB,MS:MIB,...`, times in
    /// ms from the profile's start, increasing; linear between points (a ramp), constant after
    /// the last (a plateau); two points close in time make a burst. E.g. `0:40,5000:40,6000:180`.
    #[arg(long, value_parser = parse_memory_profile)]
    pub memory_profile: Option<MemoryProfile>,
    /// The memory profile's clock starts when this file exists (its first point is held until
    /// then), so a test can trigger a burst on an event instead of a guessed time.
    #[arg(long)]
    pub profile_start_file: Option<std::path::PathBuf>,
}

/// A piecewise-linear memory profile: (ms from start, MiB), times strictly increasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryProfile(Vec<(u64, u64)>);

impl MemoryProfile {
    pub fn new(points: Vec<(u64, u64)>) -> Result<MemoryProfile, String> {
        if points.is_empty() {
            return Err("--memory-profile needs at least one MS:MIB point".into());
        }
        if points.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err("--memory-profile times must increase strictly".into());
        }
        if let Some((_, mib)) = points
            .iter()
            .find(|(_, mib)| mib.checked_mul(MIB).is_none())
        {
            return Err(format!("--memory-profile {mib} MiB is too large"));
        }
        Ok(MemoryProfile(points))
    }

    /// MiB wanted `elapsed_ms` after the start.
    pub fn at(&self, elapsed_ms: u64) -> u64 {
        let points = &self.0;
        if elapsed_ms <= points[0].0 {
            return points[0].1;
        }
        for w in points.windows(2) {
            let ((t0, m0), (t1, m1)) = (w[0], w[1]);
            if elapsed_ms <= t1 {
                let f = (elapsed_ms - t0) as f64 / (t1 - t0) as f64;
                return (m0 as f64 + f * (m1 as f64 - m0 as f64)).round() as u64;
            }
        }
        points[points.len() - 1].1
    }

    pub fn peak(&self) -> u64 {
        self.0.iter().map(|p| p.1).max().unwrap_or(0)
    }
}

fn parse_memory_profile(raw: &str) -> Result<MemoryProfile, String> {
    let points = raw
        .split(',')
        .map(|p| {
            let (ms, mib) = p
                .split_once(':')
                .ok_or_else(|| format!("`{p}` is not MS:MIB"))?;
            let ms: u64 = ms
                .trim()
                .parse()
                .map_err(|_| format!("`{ms}` is not a time in ms"))?;
            let mib: u64 = mib
                .trim()
                .parse()
                .map_err(|_| format!("`{mib}` is not MiB"))?;
            Ok((ms, mib))
        })
        .collect::<Result<Vec<_>, String>>()?;
    MemoryProfile::new(points)
}

/// An argument of `testbed task` outside its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskArgError {
    #[error("--cpu-fraction must be a number in 0..=1, got {0}")]
    CpuFraction(f64),
    #[error("--exit-code must be in 0..=255, got {0}")]
    ExitCode(i32),
    #[error("--memory-mib {0} is larger than this machine can address")]
    MemoryTooLarge(u64),
}

fn parse_cpu_fraction(raw: &str) -> Result<f64, String> {
    let value: f64 = raw
        .parse()
        .map_err(|_| format!("`{raw}` is not a number"))?;
    check_cpu_fraction(value).map_err(|e| e.to_string())
}

fn check_cpu_fraction(value: f64) -> Result<f64, TaskArgError> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(TaskArgError::CpuFraction(value))
    }
}

impl TaskArgs {
    /// Checks every argument (clap already does for the command line; this covers arguments
    /// built in code) and returns the memory size in bytes.
    pub fn validate(&self) -> Result<usize, TaskArgError> {
        check_cpu_fraction(self.cpu_fraction)?;
        if !(0..=255).contains(&self.exit_code) {
            return Err(TaskArgError::ExitCode(self.exit_code));
        }
        self.memory_mib
            .checked_mul(MIB)
            .and_then(|bytes| usize::try_from(bytes).ok())
            .filter(|bytes| isize::try_from(*bytes).is_ok())
            .ok_or(TaskArgError::MemoryTooLarge(self.memory_mib))
    }
}

/// Runs the task and returns the exit code the process should exit with.
pub fn run(args: &TaskArgs) -> anyhow::Result<i32> {
    let memory_bytes = args.validate()?;
    let start = Instant::now();
    let deadline = start + Duration::from_millis(args.duration_ms);
    let Some(profile) = &args.memory_profile else {
        let held = allocate_touched(memory_bytes)
            .with_context(|| format!("allocating --memory-mib {}", args.memory_mib))?;
        burn(args.cpu_fraction, deadline, &mut || Ok(()))?;
        std::hint::black_box(&held);
        return Ok(args.exit_code);
    };
    // 1-MiB touched chunks, added and dropped as the profile moves.
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut profile_start: Option<Instant> = None;
    let mut follow = || -> anyhow::Result<()> {
        let now = Instant::now();
        if profile_start.is_none() && args.profile_start_file.as_ref().is_none_or(|f| f.exists()) {
            profile_start = Some(now);
        }
        let elapsed_ms = profile_start.map_or(0, |s| now.duration_since(s).as_millis() as u64);
        let want = profile.at(elapsed_ms) as usize;
        while held.len() < want {
            held.push(allocate_touched(MIB as usize).context("following --memory-profile")?);
        }
        held.truncate(want);
        Ok(())
    };
    follow()?;
    burn(args.cpu_fraction, deadline, &mut follow)?;
    std::hint::black_box(&held);
    Ok(args.exit_code)
}

/// Allocates `bytes` and writes every byte, so the pages are resident rather than merely
/// reserved (a zeroed allocation would be backed lazily by the shared zero page).
fn allocate_touched(bytes: usize) -> anyhow::Result<Vec<u8>> {
    let mut buffer: Vec<u8> = Vec::new();
    buffer
        .try_reserve_exact(bytes)
        .map_err(|e| anyhow::anyhow!("cannot allocate {} MiB: {e}", bytes as u64 / MIB))?;
    // One memset rather than `resize`, whose per-element loop costs seconds of CPU per GiB in
    // unoptimised builds and would distort the task's CPU profile.
    // SAFETY: try_reserve_exact guaranteed capacity for `bytes` bytes; write_bytes initialises
    // exactly those bytes before set_len makes them part of the vector.
    unsafe {
        buffer.as_mut_ptr().write_bytes(0xA5, bytes);
        buffer.set_len(bytes);
    }
    Ok(buffer)
}

/// Until `deadline`: in each 10 ms period call `each_period`, spin for `fraction` of the period
/// and sleep for the rest.
fn burn(
    fraction: f64,
    deadline: Instant,
    each_period: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let busy = DUTY_PERIOD.mul_f64(fraction);
    let mut counter = 0u64;
    loop {
        let period_start = Instant::now();
        if period_start >= deadline {
            break;
        }
        each_period()?;
        let busy_until = (period_start + busy).min(deadline);
        while Instant::now() < busy_until {
            counter = std::hint::black_box(counter.wrapping_add(1));
        }
        let period_end = (period_start + DUTY_PERIOD).min(deadline);
        let now = Instant::now();
        if period_end > now {
            std::thread::sleep(period_end - now);
        }
    }
    std::hint::black_box(counter);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        task: TaskArgs,
    }

    fn parse(args: &[&str]) -> Result<TaskArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("task").chain(args.iter().copied())).map(|cli| cli.task)
    }

    #[test]
    fn defaults_apply_to_everything_but_the_duration() {
        let args = parse(&["--duration-ms", "250"]).expect("valid");
        assert_eq!(
            args,
            TaskArgs {
                duration_ms: 250,
                memory_mib: 0,
                cpu_fraction: 0.0,
                exit_code: 0,
                memory_profile: None,
                profile_start_file: None,
            }
        );
        assert!(parse(&[]).is_err(), "duration is required");
    }

    #[test]
    fn command_line_rejects_out_of_range_values_by_name() {
        for (flag, value) in [
            ("--cpu-fraction", "1.5"),
            ("--cpu-fraction", "-0.1"),
            ("--cpu-fraction", "NaN"),
            ("--cpu-fraction", "half"),
            ("--exit-code", "256"),
            ("--exit-code", "-1"),
            ("--memory-mib", "-3"),
        ] {
            let err = parse(&["--duration-ms", "1", &format!("{flag}={value}")]).expect_err(value);
            let message = err.to_string();
            assert!(message.contains(flag), "{flag} {value}: {message}");
        }
        let args = parse(&[
            "--duration-ms",
            "1",
            "--cpu-fraction",
            "1",
            "--exit-code",
            "255",
        ])
        .expect("bounds are inclusive");
        assert_eq!((args.cpu_fraction, args.exit_code), (1.0, 255));
    }

    #[test]
    fn validate_rejects_arguments_built_in_code() {
        let good = TaskArgs {
            duration_ms: 0,
            memory_mib: 1,
            cpu_fraction: 0.5,
            exit_code: 3,
            memory_profile: None,
            profile_start_file: None,
        };
        assert_eq!(good.validate(), Ok(1 << 20));
        let fraction = TaskArgs {
            cpu_fraction: f64::NAN,
            ..good.clone()
        };
        assert!(matches!(
            fraction.validate(),
            Err(TaskArgError::CpuFraction(_))
        ));
        let code = TaskArgs {
            exit_code: 300,
            ..good.clone()
        };
        assert_eq!(code.validate(), Err(TaskArgError::ExitCode(300)));
        let memory = TaskArgs {
            memory_mib: u64::MAX,
            ..good
        };
        assert_eq!(
            memory.validate(),
            Err(TaskArgError::MemoryTooLarge(u64::MAX))
        );
        let err = run(&memory).expect_err("too large");
        assert!(err.to_string().contains("--memory-mib"), "{err}");
    }

    #[test]
    fn run_returns_the_requested_exit_code() {
        let args = TaskArgs {
            duration_ms: 0,
            memory_mib: 2,
            cpu_fraction: 1.0,
            exit_code: 7,
            memory_profile: None,
            profile_start_file: None,
        };
        assert_eq!(run(&args).expect("runs"), 7);
    }

    #[test]
    fn a_memory_profile_ramps_holds_and_bursts() {
        let args = parse(&[
            "--duration-ms",
            "1",
            "--memory-profile",
            "0:10,1000:20,3000:20,3100:120",
        ])
        .expect("valid");
        let p = args.memory_profile.expect("profile");
        assert_eq!(
            [p.at(0), p.at(500), p.at(2000), p.at(3050), p.at(9000)],
            [10, 15, 20, 70, 120]
        );
        assert_eq!(p.peak(), 120);
        for bad in ["", "10", "5:1,5:2", "a:1", "1:b", "3:1,2:1"] {
            let err = parse(&["--duration-ms", "1", "--memory-profile", bad]).expect_err(bad);
            assert!(err.to_string().contains("--memory-profile"), "{bad}: {err}");
        }
        let args = TaskArgs {
            duration_ms: 30,
            memory_mib: 0,
            cpu_fraction: 0.0,
            exit_code: 0,
            memory_profile: Some(MemoryProfile::new(vec![(0, 2), (10, 4)]).unwrap()),
            profile_start_file: None,
        };
        assert_eq!(run(&args).expect("runs"), 0);
    }

    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("resident field");
        pages * 4096
    }

    #[test]
    fn allocated_memory_is_resident() {
        let before = resident_bytes();
        let held = allocate_touched(64 << 20).expect("64 MiB");
        let after = resident_bytes();
        assert!(held.iter().step_by(4096).all(|b| *b == 0xA5));
        // Other tests in this process may free a little memory meanwhile, hence the margin.
        assert!(
            after >= before + (48 << 20),
            "RSS grew by only {} MiB",
            (after.saturating_sub(before)) >> 20
        );
    }
}
