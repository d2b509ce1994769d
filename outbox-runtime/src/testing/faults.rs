//! A seeded plan of delivery faults, applied by the drain ([`mod@crate::testing::drain`]) to any
//! [`Sink`]: handlers behind a [`crate::Dispatcher`], publishers, fan-outs.
//!
//! Faults that concern the sink alone (a delay, a panic, failed attempts, a second call) are
//! made around the sink's call. Faults that concern the outbox (a lost response, a lost lease)
//! go through the store's own statements, so the event really comes back the way it would in
//! production: the lease is ended early with the fenced renewal (a lease of zero), the
//! maintenance's recovery statement returns the row to pending, and a completion written after
//! that is refused by the fence.
//!
//! Every random choice (which events a [`Pick::Chance`] picks, the order of a reordered batch)
//! is drawn from one generator seeded with [`Faults::seed`], in delivery order. The drain is
//! deterministic, so a run replays from its seed (with the same kit version: the generator is
//! `rand`'s `StdRng`, pinned by `Cargo.lock`). The report names the seed and every fault
//! injected, delivery by delivery.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

use crate::sink::Sink;
use crate::store::ClaimedEvent;

/// Which events a fault hits. Each event is picked (or not) once, when the drain first delivers
/// it.
#[derive(Debug, Clone, PartialEq)]
pub enum Pick {
    /// Every event.
    Every,
    /// Each event with this probability (between 0 and 1), drawn from the plan's seed.
    Chance(f64),
    /// Every event of this name.
    EventType(String),
}

/// The kind of failure [`Faults::fail_first`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Retryable: the event goes back to pending and is delivered again.
    Retryable,
    /// Permanent: the event is exhausted.
    Permanent,
}

/// One fault of the plan.
#[derive(Debug, Clone, PartialEq)]
enum Fault {
    DeliverTwice,
    FailFirst(u32, Failure),
    LoseResponse,
    LoseLease,
    Panic,
    Delay(Duration),
}

/// What was injected into one delivery, as listed by the drain's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injected {
    /// The call waited this long before reaching the sink.
    Delay(Duration),
    /// The sink's call panicked (the kit panicked in place of the sink).
    Panic,
    /// The attempt failed without reaching the sink: failure `number` of `of`.
    Failure {
        /// Retryable or permanent.
        failure: Failure,
        /// Which of the planned failures this is (1-based).
        number: u32,
        /// How many failures were planned for the event.
        of: u32,
    },
    /// The sink was handed the same delivery twice in a row.
    DeliveredTwice,
    /// The lease was lost while the sink ran: ended early and recovered, and `lease_lost`
    /// cancelled; the outcome that followed was refused by the fence.
    LeaseLost,
    /// The sink succeeded but its completion was never written; the lease ran out and recovery
    /// handed the event back.
    ResponseLost,
    /// Delivered at `position` (0-based) of its claimed batch, where id order had it at
    /// `by_id`; the order of each aggregate's own events was kept.
    Reordered {
        /// Its place in the delivered order.
        position: usize,
        /// Its place in id order.
        by_id: usize,
    },
}

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Injected::Delay(d) => write!(f, "delayed {d:?}"),
            Injected::Panic => write!(f, "panic"),
            Injected::Failure {
                failure,
                number,
                of,
            } => {
                let kind = match failure {
                    Failure::Retryable => "retryable",
                    Failure::Permanent => "permanent",
                };
                write!(f, "{kind} failure {number} of {of}")
            }
            Injected::DeliveredTwice => write!(f, "delivered twice"),
            Injected::LeaseLost => write!(f, "lease lost mid-delivery"),
            Injected::ResponseLost => write!(f, "response lost"),
            Injected::Reordered { position, by_id } => {
                write!(f, "reordered ({by_id} by id, delivered {position})")
            }
        }
    }
}

/// A plan of faults: built with the methods below, then [`Faults::wrap`]ped around a sink and
/// handed to the drain.
///
/// Each fault hits each picked event once, at the first delivery where it can happen (a lost
/// response needs a delivery the sink accepted), except [`Faults::fail_first`], which fails the
/// event's first `n` deliveries. When several faults hit one delivery they apply in this order:
/// delay, panic, failure (neither reaches the sink), then the call with the lease lost in its
/// middle, the second call, and the lost response (not on a delivery whose lease was lost, whose
/// completion is refused anyway).
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    seed: u64,
    rules: Vec<(Fault, Pick)>,
    reorder: bool,
}

impl Faults {
    /// An empty plan whose random choices are drawn from `seed`.
    pub fn seeded(seed: u64) -> Faults {
        Faults {
            seed,
            rules: Vec::new(),
            reorder: false,
        }
    }

    /// An empty plan with a random seed (shown in the drain's report, to replay a failure with
    /// [`Faults::seeded`]).
    pub fn random() -> Faults {
        Faults::seeded(rand::random())
    }

    /// The seed of the plan's random choices.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Hand the picked events' first accepted delivery to the sink a second time, at once, with
    /// the same delivery (same event id, idempotency key and attempt): what a receiver sees when
    /// a broker or a proxy repeats a request.
    pub fn deliver_twice(self, pick: Pick) -> Faults {
        self.rule(Fault::DeliverTwice, pick)
    }

    /// Fail the picked events' first `attempts` deliveries without calling the sink. Retryable
    /// failures send the event back to pending (the drain retries at once, unless its retry
    /// policy says otherwise); a permanent one exhausts it.
    pub fn fail_first(self, attempts: u32, failure: Failure, pick: Pick) -> Faults {
        self.rule(Fault::FailFirst(attempts, failure), pick)
    }

    /// After the sink accepted a picked event, write no completion: the lease ends, the
    /// recovery statement hands the event back, and it is delivered again.
    pub fn lose_response(self, pick: Pick) -> Faults {
        self.rule(Fault::LoseResponse, pick)
    }

    /// While the sink runs a picked event, lose the lease: end it, let recovery take the row
    /// back, and cancel the delivery's [`crate::Delivery::lease_lost`] token. Whatever the sink
    /// then returns is refused by the fence, and the event is delivered again.
    pub fn lose_lease(self, pick: Pick) -> Faults {
        self.rule(Fault::LoseLease, pick)
    }

    /// Panic in place of the sink on a picked event's first delivery. Like a worker, the drain
    /// catches the panic and fails the event permanently.
    pub fn panic(self, pick: Pick) -> Faults {
        self.rule(Fault::Panic, pick)
    }

    /// Wait `by` before a picked event's first delivery reaches the sink.
    pub fn delay(self, by: Duration, pick: Pick) -> Faults {
        self.rule(Fault::Delay(by), pick)
    }

    /// Deliver each claimed batch in a random order that keeps the order of each aggregate's
    /// own events (events without an aggregate move freely).
    pub fn reorder(mut self) -> Faults {
        self.reorder = true;
        self
    }

    /// The plan applied to `sink`, for [`crate::testing::drain()`] and [`crate::testing::Drain`].
    pub fn wrap(self, sink: impl Sink) -> Faulty {
        let rng = StdRng::seed_from_u64(self.seed);
        Faulty {
            sink: Box::new(sink),
            plan: self,
            state: Mutex::new(State {
                rng,
                events: HashMap::new(),
            }),
        }
    }

    /// # Panics
    ///
    /// On a [`Pick::Chance`] outside 0..=1: the plan is test code, and a wrong probability is a
    /// mistake in it.
    fn rule(mut self, fault: Fault, pick: Pick) -> Faults {
        if let Pick::Chance(p) = pick {
            assert!(
                (0.0..=1.0).contains(&p),
                "Pick::Chance({p}): a probability is between 0 and 1"
            );
        }
        self.rules.push((fault, pick));
        self
    }
}

/// A sink with a fault plan, made by [`Faults::wrap`]. The drain delivers to the wrapped sink
/// and injects the plan's faults; it is not itself a [`Sink`], since half of the faults are
/// made in the outbox, which only the drain touches.
pub struct Faulty {
    sink: Box<dyn Sink>,
    plan: Faults,
    state: Mutex<State>,
}

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faulty")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

struct State {
    rng: StdRng,
    events: HashMap<Uuid, EventState>,
}

/// What the plan did to one event so far.
struct EventState {
    /// Per rule: whether it picked this event.
    picked: Vec<bool>,
    /// Deliveries planned so far.
    deliveries: u32,
    delayed: bool,
    panicked: bool,
    lease_lost: bool,
    delivered_twice: bool,
    response_lost: bool,
}

/// The faults of one delivery, decided before it starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DeliveryPlan {
    pub(crate) delay: Option<Duration>,
    pub(crate) panic: bool,
    pub(crate) fail: Option<Injected>,
    pub(crate) lose_lease: bool,
    pub(crate) deliver_twice: bool,
    pub(crate) lose_response: bool,
}

impl Faulty {
    /// The plan.
    pub fn plan(&self) -> &Faults {
        &self.plan
    }

    /// The wrapped sink.
    pub fn sink(&self) -> &dyn Sink {
        self.sink.as_ref()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The lock is never held across an await or a call into user code; a poisoned lock can
        // only come from a panic inside this module, and its state is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decide the faults of the next delivery of `event`.
    pub(crate) fn plan_delivery(&self, event: &ClaimedEvent) -> DeliveryPlan {
        let mut guard = self.state();
        let state = &mut *guard;
        let rules = &self.plan.rules;
        let entry = state.events.entry(event.event_id).or_insert_with(|| {
            let picked = rules
                .iter()
                .map(|(_, pick)| match pick {
                    Pick::Every => true,
                    Pick::Chance(p) => state.rng.random_bool(*p),
                    Pick::EventType(name) => *name == event.event_type,
                })
                .collect();
            EventState {
                picked,
                deliveries: 0,
                delayed: false,
                panicked: false,
                lease_lost: false,
                delivered_twice: false,
                response_lost: false,
            }
        });
        let n = entry.deliveries;
        entry.deliveries += 1;
        let mut plan = DeliveryPlan::default();
        for (rule, (fault, _)) in rules.iter().enumerate() {
            if !entry.picked[rule] {
                continue;
            }
            match fault {
                Fault::Delay(by) if !entry.delayed => {
                    entry.delayed = true;
                    plan.delay = Some(*by);
                }
                Fault::Panic if !entry.panicked => {
                    entry.panicked = true;
                    plan.panic = true;
                }
                Fault::FailFirst(attempts, failure) if n < *attempts && plan.fail.is_none() => {
                    plan.fail = Some(Injected::Failure {
                        failure: *failure,
                        number: n + 1,
                        of: *attempts,
                    });
                }
                _ => {}
            }
        }
        let reaches_sink = !plan.panic && plan.fail.is_none();
        for (rule, (fault, _)) in rules.iter().enumerate() {
            if !entry.picked[rule] || !reaches_sink {
                continue;
            }
            match fault {
                Fault::LoseLease if !entry.lease_lost => {
                    entry.lease_lost = true;
                    plan.lose_lease = true;
                }
                // Spent only once applied (see `applied`): they need an accepted call.
                Fault::DeliverTwice if !entry.delivered_twice => plan.deliver_twice = true,
                Fault::LoseResponse if !entry.response_lost => plan.lose_response = true,
                _ => {}
            }
        }
        if plan.lose_lease {
            // Its completion is refused anyway; the lost response waits for a later delivery.
            plan.lose_response = false;
        }
        plan
    }

    /// Record the faults that needed an accepted call and happened.
    pub(crate) fn applied(&self, event_id: Uuid, delivered_twice: bool, response_lost: bool) {
        let mut state = self.state();
        if let Some(entry) = state.events.get_mut(&event_id) {
            entry.delivered_twice |= delivered_twice;
            entry.response_lost |= response_lost;
        }
    }

    /// The delivery order of a claimed batch (given in id order), with the `Reordered` note of
    /// each event that moved. Without [`Faults::reorder`], id order.
    pub(crate) fn order(&self, batch: Vec<ClaimedEvent>) -> Vec<(ClaimedEvent, Option<Injected>)> {
        if !self.plan.reorder {
            return batch.into_iter().map(|e| (e, None)).collect();
        }
        // One queue per aggregate, in id order; an event without an aggregate is a queue alone.
        let mut queues: Vec<VecDeque<(usize, ClaimedEvent)>> = Vec::new();
        let mut by_aggregate: HashMap<(String, String), usize> = HashMap::new();
        for (by_id, event) in batch.into_iter().enumerate() {
            let key = match (&event.aggregate_type, &event.aggregate_id) {
                (Some(t), Some(id)) => Some((t.clone(), id.clone())),
                _ => None,
            };
            let queue = match key {
                Some(key) => *by_aggregate.entry(key).or_insert_with(|| {
                    queues.push(VecDeque::new());
                    queues.len() - 1
                }),
                None => {
                    queues.push(VecDeque::new());
                    queues.len() - 1
                }
            };
            queues[queue].push_back((by_id, event));
        }
        let mut state = self.state();
        let mut ordered = Vec::new();
        loop {
            let open: Vec<usize> = (0..queues.len())
                .filter(|&q| !queues[q].is_empty())
                .collect();
            if open.is_empty() {
                break;
            }
            let q = open[state.rng.random_range(0..open.len())];
            if let Some((by_id, event)) = queues[q].pop_front() {
                let position = ordered.len();
                let note = (position != by_id).then_some(Injected::Reordered { position, by_id });
                ordered.push((event, note));
            }
        }
        ordered
    }
}
