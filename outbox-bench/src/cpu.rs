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

    /// The table's note: `worker 4.1 + server 30.2 CPU µs/event`.
    pub fn note(&self, events: i64, who: &str) -> String {
        let (process, rest) = self.per_event(events);
        format!("CPU µs/event: {who} {process:.1}, rest of the machine {rest:.1}")
    }
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

/// utime + stime of this process (`/proc/self/stat` fields 14 and 15).
fn process_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: count from after it.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3, so field k is at index k - 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Busy ticks of all CPUs (`/proc/stat`'s first line minus idle and iowait).
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4)?;
    Some(total - idle)
}
