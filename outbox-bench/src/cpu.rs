//! Where a drain's CPU went: this process (the worker, or the ceiling's client) against the
//! rest of the machine (PostgreSQL, on a machine that runs nothing else).
//!
//! Read from `/proc` (Linux): this process's user and system time and the machine's busy time,
//! both in clock ticks (10 ms each), so a drain of a second is resolved to about 1 %. Elsewhere
//! the split is unknown and nothing is printed.

use std::time::Duration;

/// Clock ticks per second of `/proc`'s counters (`USER_HZ`, 100 on every Linux that matters
/// here).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU counters at one moment.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    /// This process: user + system ticks.
    process: u64,
    /// The whole machine: every CPU's ticks that were not idle or waiting for I/O.
    machine: u64,
}

/// CPU spent between two samples.
#[derive(Debug, Clone, Copy)]
pub struct CpuSplit {
    /// By this process.
    pub process: Duration,
    /// By everything else (PostgreSQL, when nothing else runs).
    pub rest: Duration,
}

impl CpuSplit {
    /// `(process, rest)` in microseconds per event.
    pub fn per_event(&self, events: i64) -> (f64, f64) {
        let n = events.max(1) as f64;
        (
            self.process.as_secs_f64() * 1e6 / n,
            self.rest.as_secs_f64() * 1e6 / n,
        )
    }

    /// `CPU µs/event: worker 4.1, rest of the machine 30.2` for `events` delivered.
    pub fn note(&self, events: i64, who: &str) -> String {
        let (process, rest) = self.per_event(events);
        per_event_note(who, process, rest)
    }
}

/// `CPU µs/event: worker 4.1, rest of the machine 30.2`: the one wording of a run's note and of
/// the table's medians.
pub fn per_event_note(who: &str, process: f64, rest: f64) -> String {
    format!("CPU µs/event: {who} {process:.1}, rest of the machine {rest:.1}")
}

impl CpuSample {
    /// Now, or `None` where `/proc` cannot be read.
    pub fn now() -> Option<CpuSample> {
        Some(CpuSample {
            process: process_ticks()?,
            machine: machine_busy_ticks()?,
        })
    }

    /// The CPU spent since `self`.
    pub fn since(self) -> Option<CpuSplit> {
        let now = CpuSample::now()?;
        let process = now.process.saturating_sub(self.process);
        let machine = now.machine.saturating_sub(self.machine);
        let ticks = |t: u64| Duration::from_secs_f64(t as f64 / TICKS_PER_SECOND);
        Some(CpuSplit {
            process: ticks(process),
            rest: ticks(machine.saturating_sub(process)),
        })
    }
}

/// utime + stime of this process.
fn process_ticks() -> Option<u64> {
    process_ticks_in(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
fn process_ticks_in(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces and parentheses
    // itself: count the fields from after its last `)`.
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3, so field k is at index k - 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Busy ticks of all CPUs.
fn machine_busy_ticks() -> Option<u64> {
    machine_busy_ticks_in(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// `/proc/stat`'s first line (all CPUs) minus idle and iowait.
fn machine_busy_ticks_in(stat: &str) -> Option<u64> {
    let line = stat.lines().next()?;
    if !line.starts_with("cpu ") {
        return None;
    }
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4)?;
    total.checked_sub(idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        // Fields 3.. of a real line; utime (14) = 1234, stime (15) = 56.
        let rest = "S 1 2 3 4 5 6 7 8 9 10 1234 56 0 0 20 0 4 0 100 2000 300";
        let line = format!("4242 (tokio (rt) worker) {rest}");
        assert_eq!(process_ticks_in(&line), Some(1290));
        assert_eq!(process_ticks_in("4242 (cut short) S 1 2"), None);
        assert_eq!(process_ticks_in("no name at all"), None);
    }

    #[test]
    fn busy_ticks_leave_out_idle_and_iowait_and_guest_time() {
        let stat = "cpu  100 5 50 1000 20 3 2 1 40 0\ncpu0 50 2 25 500 10 1 1 0 20 0\n";
        // user + nice + system + irq + softirq + steal; guest (40) is already in user.
        assert_eq!(machine_busy_ticks_in(stat), Some(100 + 5 + 50 + 3 + 2 + 1));
        assert_eq!(machine_busy_ticks_in("intr 1 2 3\n"), None);
        assert_eq!(machine_busy_ticks_in("cpu  1 x 3 4 5\n"), None);
    }

    #[test]
    fn this_process_is_charged_for_the_cpu_it_burns() {
        let before = CpuSample::now().expect("/proc is readable on Linux");
        let started = std::time::Instant::now();
        let mut spin = 0_u64;
        // Spin until two ticks (20 ms) are charged; a counter that never moves fails at 10 s.
        let charged = loop {
            for _ in 0..100_000 {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
            let split = before.since().expect("/proc is readable on Linux");
            if split.process >= Duration::from_millis(20) {
                break split.process;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "10 s of spinning charged only {:?} to this process",
                split.process
            );
        };
        // The process cannot be charged more than its threads could burn in the elapsed time.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        assert!(charged <= started.elapsed() * cpus + Duration::from_millis(20));
    }
}
