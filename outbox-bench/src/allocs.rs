//! Heap allocations per event of a drain, in this process (the worker, or the ceiling's
//! client). Built with the `alloc-count` feature, the bench runs on std's system allocator
//! behind `stats_alloc`'s counters; without it nothing is counted or printed.
//!
//! Unlike CPU time, the count does not move with the machine's load: two builds compared on a
//! noisy machine differ here exactly by what one of them allocates more per delivery. The
//! counters are shared atomics, so the feature costs every allocation a little: compare rates
//! only between builds with the same features.

#[cfg(feature = "alloc-count")]
#[global_allocator]
static COUNTING: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// The allocation counter at one moment.
#[derive(Debug, Clone, Copy)]
pub struct AllocSample(usize);

impl AllocSample {
    /// Now, or `None` when the bench was built without `alloc-count`.
    pub fn now() -> Option<AllocSample> {
        #[cfg(feature = "alloc-count")]
        {
            let stats = COUNTING.stats();
            Some(AllocSample(stats.allocations + stats.reallocations))
        }
        #[cfg(not(feature = "alloc-count"))]
        None
    }

    /// Allocations (reallocations included) since this sample.
    pub fn since(self) -> Option<u64> {
        let now = AllocSample::now()?;
        Some(now.0.saturating_sub(self.0) as u64)
    }
}

/// `heap allocations/event: 31.0`: the one wording of a run's note and of the table's medians.
pub fn per_event_note(per_event: f64) -> String {
    format!("heap allocations/event: {per_event:.1}")
}
