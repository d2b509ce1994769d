//! How far ahead of the sink the claimer claims: the prefetch window.
//!
//! A claimer that claims only into free delivery slots leaves every slot that frees during a
//! claim's round trip idle until the next claim returns; with a fast sink that is most of the
//! time (a 1 ms claim against 20 µs deliveries). So the claimer may hold up to
//! [`crate::worker::WorkerConfig::prefetch`] claimed events beyond the running ones, which wait
//! for a free slot. Holding more than needed has a price: a claimed event waits,
//! keeps its lease renewed, and is invisible to every other worker. So the window is sized from
//! what this worker measured: enough events to keep every slot busy for two claim round trips,
//!
//! ```text
//! window = min(prefetch, ceil(2 * concurrency * claim_time / handler_time))
//! ```
//!
//! where both times are moving averages. With a slow sink (a 50 ms HTTP call) the window is
//! one or two events and claims stay close to the free slots; with a fast one it grows to the
//! configured bound. Until both times have been measured the window is zero, so an idle worker
//! claims as it did without prefetch and its wake-up latency is unchanged.

use std::sync::Mutex;
use std::time::Duration;

/// Weight of a new sample in the moving averages: about the last ten samples count.
const WEIGHT: f64 = 0.1;

/// Shortest handler time a sample counts as: a sink that returns at once would otherwise make
/// the window infinite before the bound applies.
const SHORTEST_HANDLER: Duration = Duration::from_micros(1);

/// The claimer's measured pace, shared by the claimer (claim times) and the delivery tasks
/// (handler times).
#[derive(Debug, Default)]
pub(crate) struct Pace {
    averages: Mutex<Averages>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Averages {
    /// Seconds per claim statement, once measured.
    claim: Option<f64>,
    /// Seconds per sink call, once measured.
    handler: Option<f64>,
}

fn mix(average: Option<f64>, sample: f64) -> Option<f64> {
    Some(match average {
        None => sample,
        Some(a) => a + WEIGHT * (sample - a),
    })
}

impl Pace {
    /// Record one claim statement's round trip.
    pub(crate) fn claimed(&self, took: Duration) {
        let mut averages = self.averages.lock().unwrap_or_else(|p| p.into_inner());
        averages.claim = mix(averages.claim, took.as_secs_f64());
    }

    /// Record one sink call (one event, or one batch call: either way the call holds its slots
    /// for this long).
    pub(crate) fn delivered(&self, took: Duration) {
        let took = took.max(SHORTEST_HANDLER).as_secs_f64();
        let mut averages = self.averages.lock().unwrap_or_else(|p| p.into_inner());
        averages.handler = mix(averages.handler, took);
    }

    /// How many claimed events may wait for a slot beyond `concurrency` running ones, at most
    /// `prefetch`.
    pub(crate) fn window(&self, concurrency: usize, prefetch: usize) -> usize {
        if prefetch == 0 {
            return 0;
        }
        let averages = *self.averages.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(claim), Some(handler)) = (averages.claim, averages.handler) else {
            return 0;
        };
        let wanted = (2.0 * concurrency as f64 * claim / handler).ceil();
        if wanted >= prefetch as f64 {
            prefetch
        } else {
            // Non-negative and below `prefetch`, so the cast is exact.
            wanted as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_window_until_both_times_are_measured() {
        let pace = Pace::default();
        assert_eq!(pace.window(64, 512), 0);
        pace.claimed(Duration::from_millis(1));
        assert_eq!(pace.window(64, 512), 0);
        pace.delivered(Duration::from_millis(1));
        assert_eq!(pace.window(64, 512), 128);
    }

    #[test]
    fn a_fast_sink_reaches_the_bound_and_a_slow_one_stays_near_the_slots() {
        let fast = Pace::default();
        fast.claimed(Duration::from_millis(1));
        fast.delivered(Duration::ZERO);
        assert_eq!(fast.window(64, 512), 512);
        let slow = Pace::default();
        slow.claimed(Duration::from_millis(1));
        slow.delivered(Duration::from_millis(200));
        assert_eq!(slow.window(64, 512), 1);
        assert_eq!(slow.window(64, 0), 0);
    }

    #[test]
    fn averages_follow_a_change_of_pace() {
        let pace = Pace::default();
        pace.claimed(Duration::from_millis(1));
        pace.delivered(Duration::from_micros(10));
        assert_eq!(pace.window(64, 512), 512);
        for _ in 0..100 {
            pace.delivered(Duration::from_millis(100));
        }
        assert!(pace.window(64, 512) <= 2, "{}", pace.window(64, 512));
        // And back: once the sink is fast again, the window grows back to the bound.
        for _ in 0..200 {
            pace.delivered(Duration::from_micros(10));
        }
        assert_eq!(pace.window(64, 512), 512);
    }

    #[test]
    fn a_sample_moves_the_average_a_tenth_of_the_way() {
        assert_eq!(mix(None, 4.0), Some(4.0));
        let moved = mix(Some(10.0), 20.0).unwrap();
        assert!((moved - 11.0).abs() < 1e-9, "{moved}");
        let moved = mix(Some(10.0), 0.0).unwrap();
        assert!((moved - 9.0).abs() < 1e-9, "{moved}");
    }
}
