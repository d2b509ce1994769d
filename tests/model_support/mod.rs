//! A model of the outbox protocol for the `stateright` model checker: producers, workers,
//! maintenance and the database clock, with the transition guards of the SQL files.
//!
//! One state struct ([`State`]), one enum of steps ([`Action`]); every guard is a function
//! named after the statement it copies, and docs/protocol-model.md maps each WHERE clause to it.
//!
//! Abstractions (each keeps every comparison the SQL can make):
//! * Time is discrete. A row keeps, instead of timestamps, the ticks left until each one is
//!   passed: `lease_left > 0` is `lease_until > now()`, `available_in == 0` is
//!   `available_at <= now()`, `purge_in == 0` is `created_at < now() - retention` (the retention
//!   counts from the enqueue: the event keeps no delivery time). A [`Action::Tick`]
//!   moves them all one step, so the state space is finite while the clock runs forever.
//! * Claim versions only ever grow and the guards only compare them for equality, so after each
//!   step they are renumbered per row: the row's version becomes 2 (once it was claimed twice),
//!   a worker's copy of it 2, every older copy 1 ([`canonical`]).
//! * A batch claim is a sequence of single claims: every candidate's guard reads rows the claim
//!   does not change (their status and order), so claiming one row never changes whether another
//!   is a candidate. `ORDER BY available_at, id LIMIT` and `SKIP LOCKED` decide which candidates a
//!   worker gets; the model lets a worker take any of them, which covers every such choice.
//! * A stalled worker is one that takes no step while the clock and everyone else move on; it
//!   comes back by acting on the claims it still holds. A crashed worker forgets its claims
//!   (the process restarts with empty hands); the rows stay processing until recovery.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};

use stateright::{Model, Property};

/// How workers claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claiming {
    /// claim_batch.sql
    Plain,
    /// claim_batch_ordered.sql
    Ordered,
}

/// A deliberate defect, to show the checker finds what it must.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    None,
    /// Producers draw ids without first taking the per-aggregate transaction lock: the ordered
    /// claim's id order is then not commit order (the ordered mode before issue 12).
    ProducersWithoutLock,
    /// complete.sql without `lease_until > now()`.
    CompleteWithoutLease,
    /// purge_delivered.sql without `NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id =
    /// e.id)`: an event past the retention is purged whether or not it was delivered.
    PurgeWithoutQueueCheck,
    /// No maintenance recovers expired leases (the liveness check must notice).
    NoRecovery,
}

/// An aggregate (`aggregate_type`, `aggregate_id`), by index.
pub type Aggregate = u8;

/// The bounds and settings of one model.
#[derive(Clone, Debug)]
pub struct Config {
    pub claiming: Claiming,
    pub mutation: Mutation,
    /// The producer transactions: each inserts events of these aggregates in this order.
    pub transactions: Vec<Vec<Aggregate>>,
    pub aggregates: usize,
    pub workers: usize,
    /// Claims one worker holds at most (its concurrency limit).
    pub capacity: usize,
    pub max_attempts: u8,
    /// Lease, backoff and retention, in ticks.
    pub lease: u8,
    pub backoff: u8,
    pub retention: u8,
    /// Merge states that differ only by which worker holds what (workers are interchangeable:
    /// no guard reads `claimed_by`). Halves the states; off for printed traces, where a worker
    /// should keep its name from step to step.
    pub symmetric_workers: bool,
}

impl Config {
    /// 2 workers, 3 events of 2 aggregates in 2 transactions (the first writes aggregate 0;
    /// the second writes aggregate 0, then 1), max_attempts 2, lease 2 ticks, backoff 1,
    /// retention 0. Ordered workers hold 2 claims at once (so batched completions happen);
    /// plain workers 1, which keeps the plain model, where every pending event is a candidate,
    /// within the time of a debug test (a batch is per-row fenced, so the ordered model covers it).
    pub fn small(claiming: Claiming) -> Config {
        let capacity = match claiming {
            Claiming::Ordered => 2,
            Claiming::Plain => 1,
        };
        Config {
            claiming,
            mutation: Mutation::None,
            transactions: vec![vec![0], vec![0, 1]],
            aggregates: 2,
            workers: 2,
            capacity,
            max_attempts: 2,
            lease: 2,
            backoff: 1,
            retention: 0,
            symmetric_workers: true,
        }
    }

    pub fn with(mut self, mutation: Mutation) -> Config {
        self.mutation = mutation;
        self
    }

    /// (transaction, aggregate) of each event, events numbered in transaction order.
    fn events(&self) -> Vec<(usize, Aggregate)> {
        self.transactions
            .iter()
            .enumerate()
            .flat_map(|(tx, aggs)| aggs.iter().map(move |&agg| (tx, agg)))
            .collect()
    }
}

/// Where an event stands: its queue row's `status` (pending, processing, exhausted), Delivered
/// for an event without a queue row, plus the two states before its rows are visible and its
/// deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Its transaction has not inserted it yet.
    Absent,
    /// Inserted (id drawn), its transaction not committed: no statement sees it.
    Uncommitted,
    Pending,
    Processing,
    Delivered,
    Exhausted,
    /// Deleted by purge or by complete_many_delete.
    Deleted,
}

/// One event: its event row and its queue row, as one (the queue row is gone once Delivered).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub status: Status,
    /// `id` (identity), 0 until drawn.
    pub id: u8,
    /// Position of its transaction's commit (1 = first), 0 until committed.
    pub commit: u8,
    pub available_in: u8,
    pub lease_left: u8,
    pub claim_version: u8,
    pub attempts: u8,
    pub purge_in: u8,
}

/// A claim as a worker holds it: (event, claim_version).
pub type Held = (usize, u8);

/// A broken property, recorded by the step that broke it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Violation {
    /// A completion, renewal, failure or release applied for a claim that was not current.
    StaleEffect(&'static str, usize),
    /// An event delivered before an event of its aggregate that committed earlier.
    OutOfCommitOrder(usize),
    /// Purge deleted a row that was not delivered.
    PurgedUndelivered(usize),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// One row per event (index = event number).
    pub rows: Vec<Row>,
    /// The identity sequence: the next id drawn.
    pub next_id: u8,
    /// Per producer transaction: committed?
    pub committed: Vec<bool>,
    /// Per aggregate: the transaction holding its transaction-scoped lock.
    pub locks: Vec<Option<u8>>,
    pub commits: u8,
    /// Per worker: the claims it believes it holds, sorted.
    pub held: Vec<Vec<Held>>,
    pub violation: Option<Violation>,
}

/// Every step any actor can take.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Producer transaction `tx` inserts its next event: takes the aggregate's lock (waits while
    /// another transaction holds it), then draws the id.
    Insert(usize),
    /// Producer transaction `tx` commits: its rows become visible; its locks are released.
    Commit(usize),
    /// The database clock advances.
    Tick,
    Claim {
        worker: usize,
        event: usize,
    },
    Renew {
        worker: usize,
        held: Held,
    },
    Complete {
        worker: usize,
        held: Held,
    },
    /// Every claim the worker holds, in one statement (complete_many or complete_many_delete).
    CompleteMany {
        worker: usize,
        delete: bool,
    },
    Fail {
        worker: usize,
        held: Held,
        permanent: bool,
    },
    /// Shutdown hands an unstarted claim back.
    Release {
        worker: usize,
        held: Held,
    },
    /// The worker process dies and restarts with no claims.
    Crash {
        worker: usize,
    },
    /// Maintenance: recover_expired.sql for one row.
    Recover(usize),
    /// Maintenance: purge_delivered.sql for one row.
    Purge(usize),
}

/// The protocol model for one configuration.
#[derive(Clone, Debug)]
pub struct Protocol {
    pub config: Config,
    /// (transaction, aggregate) per event.
    events: Vec<(usize, Aggregate)>,
}

impl Protocol {
    pub fn new(config: Config) -> Protocol {
        let events = config.events();
        Protocol { config, events }
    }

    fn aggregate(&self, event: usize) -> Aggregate {
        self.events[event].1
    }

    // ---- guards: one per statement, the same predicates as its WHERE clause ----

    /// Committed rows are the only ones a statement sees (READ COMMITTED).
    fn visible(row: &Row) -> bool {
        !matches!(row.status, Status::Absent | Status::Uncommitted)
    }

    /// Open: a queue row with `exhausted_at IS NULL` (pending or processing).
    fn open(row: &Row) -> bool {
        matches!(row.status, Status::Pending | Status::Processing)
    }

    /// claim_batch.sql candidates (queue rows): `exhausted_at IS NULL AND available_at <= now()
    /// AND status = 'pending'`; claim_batch_ordered.sql adds
    /// `aggregate_id IS NULL OR NOT EXISTS (earlier open event of the aggregate)`.
    fn claimable(&self, state: &State, event: usize) -> bool {
        let row = &state.rows[event];
        let candidate =
            Self::visible(row) && row.status == Status::Pending && row.available_in == 0;
        candidate && (self.config.claiming == Claiming::Plain || self.no_earlier_open(state, event))
    }

    /// `NOT EXISTS (SELECT 1 FROM outbox_queue e WHERE e.aggregate_type = o.aggregate_type AND
    /// e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.exhausted_at IS NULL)`: a delivered
    /// event has no queue row, so only open ones block. (Every event of the model has an
    /// aggregate.)
    fn no_earlier_open(&self, state: &State, event: usize) -> bool {
        let me = &state.rows[event];
        (0..state.rows.len()).all(|other| {
            let e = &state.rows[other];
            !(Self::visible(e)
                && self.aggregate(other) == self.aggregate(event)
                && e.id < me.id
                && Self::open(e))
        })
    }

    /// complete.sql, renew.sql, fail.sql, release.sql and their batched forms: `id = $1 AND
    /// claim_version = $2 AND status = 'processing' AND lease_until > now()`.
    fn fenced(&self, state: &State, (event, version): Held, lease_checked: bool) -> bool {
        let row = &state.rows[event];
        row.claim_version == version
            && row.status == Status::Processing
            && (!lease_checked || row.lease_left > 0)
    }

    /// recover_expired.sql (queue rows): `exhausted_at IS NULL AND status = 'processing' AND
    /// lease_until <= now()`.
    fn expired(row: &Row) -> bool {
        row.status == Status::Processing && row.lease_left == 0
    }

    /// purge_delivered.sql (events): `created_at < now() - retention AND NOT EXISTS (its queue
    /// row)`.
    fn purgeable(&self, row: &Row) -> bool {
        let delivered = match self.config.mutation {
            Mutation::PurgeWithoutQueueCheck => Self::visible(row) && row.status != Status::Deleted,
            _ => row.status == Status::Delivered,
        };
        delivered && row.purge_in == 0
    }

    // ---- the specification's own notions, independent of the guards ----

    /// The claim is the row's current one: the worker's version is the row's, the row is
    /// processing and the lease has not run out. Only such a claim may change the row.
    pub fn is_current(state: &State, (event, version): Held) -> bool {
        let row = &state.rows[event];
        row.status == Status::Processing && row.claim_version == version && row.lease_left > 0
    }

    fn finished(row: &Row) -> bool {
        matches!(
            row.status,
            Status::Delivered | Status::Exhausted | Status::Deleted
        )
    }

    /// Every transaction committed and every event delivered (or purged) or exhausted.
    pub fn all_done(&self, state: &State) -> bool {
        state.committed.iter().all(|c| *c) && state.rows.iter().all(Self::finished)
    }

    /// An event delivered now: every event of its aggregate that committed before it (or
    /// earlier in the same transaction) must be finished.
    fn delivered_in_order(&self, state: &State, event: usize) -> bool {
        let me = &state.rows[event];
        (0..state.rows.len()).all(|other| {
            let e = &state.rows[other];
            other == event
                || self.aggregate(other) != self.aggregate(event)
                || !Self::visible(e)
                || (e.commit, e.id) > (me.commit, me.id)
                || Self::finished(e)
        })
    }

    // ---- effects ----

    fn deliver(&self, state: &mut State, event: usize, delete: bool) {
        if self.config.claiming == Claiming::Ordered && !self.delivered_in_order(state, event) {
            state
                .violation
                .get_or_insert(Violation::OutOfCommitOrder(event));
        }
        let row = &mut state.rows[event];
        row.status = if delete {
            Status::Deleted
        } else {
            Status::Delivered
        };
        row.lease_left = 0;
    }

    /// Apply a fenced statement's effect if its guard passes; record a stale effect if the
    /// guard let a claim through that was not current. The worker drops the claim unless a
    /// renewal kept it.
    fn fenced_step(
        &self,
        state: &mut State,
        worker: usize,
        held: Held,
        statement: &'static str,
        lease_checked: bool,
        effect: impl FnOnce(&Protocol, &mut State),
    ) {
        let renewal = statement == "renew";
        if self.fenced(state, held, lease_checked) {
            if !Self::is_current(state, held) {
                state
                    .violation
                    .get_or_insert(Violation::StaleEffect(statement, held.0));
            }
            effect(self, state);
            if renewal {
                return;
            }
        }
        // Not renewed, or finished: the claim is gone from the worker's hands (a failed
        // renewal cancels the handler; a lost completion is reported as stale).
        state.held[worker].retain(|h| *h != held);
    }

    fn fail_or_recover_to(&self, row: &mut Row, exhaust: bool) {
        row.lease_left = 0;
        if exhaust || row.attempts >= self.config.max_attempts {
            row.status = Status::Exhausted;
        } else {
            row.status = Status::Pending;
            row.available_in = self.config.backoff;
        }
    }
}

/// Renumber claim versions (see the module comment): per row, the current version becomes 2
/// once it is 2 or more, a worker's copy of it 2, and every older copy 1. Then order the
/// workers.
fn canonical(mut state: State, symmetric_workers: bool) -> State {
    for event in 0..state.rows.len() {
        let version = state.rows[event].claim_version;
        if version >= 2 {
            state.rows[event].claim_version = 2;
            for held in &mut state.held {
                for h in held.iter_mut().filter(|h| h.0 == event) {
                    h.1 = if h.1 == version { 2 } else { 1 };
                }
            }
        }
    }
    for held in &mut state.held {
        held.sort_unstable();
        held.dedup();
    }
    // Workers are interchangeable (no guard reads which worker holds a claim): keep them in a
    // canonical order, so two states that differ only by naming the workers are one state.
    if symmetric_workers {
        state.held.sort_unstable();
    }
    state
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let row = Row {
            status: Status::Absent,
            id: 0,
            commit: 0,
            available_in: 0,
            lease_left: 0,
            claim_version: 0,
            attempts: 0,
            purge_in: 0,
        };
        vec![State {
            rows: vec![row; self.events.len()],
            next_id: 1,
            committed: vec![false; self.config.transactions.len()],
            locks: vec![None; self.config.aggregates],
            commits: 0,
            held: vec![Vec::new(); self.config.workers],
            violation: None,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        // Producers.
        for tx in 0..self.config.transactions.len() {
            if state.committed[tx] {
                continue;
            }
            let next = (0..self.events.len())
                .find(|&e| self.events[e].0 == tx && state.rows[e].status == Status::Absent);
            match next {
                Some(event) => {
                    let lock = state.locks[usize::from(self.aggregate(event))];
                    let locked_out = self.config.mutation != Mutation::ProducersWithoutLock
                        && lock.is_some_and(|holder| usize::from(holder) != tx);
                    if !locked_out {
                        actions.push(Action::Insert(tx));
                    }
                }
                None => actions.push(Action::Commit(tx)),
            }
        }
        // The clock, when moving it changes anything.
        if state
            .rows
            .iter()
            .any(|r| r.available_in > 0 || r.lease_left > 0 || r.purge_in > 0)
        {
            actions.push(Action::Tick);
        }
        // Workers.
        for worker in 0..self.config.workers {
            let held = &state.held[worker];
            if held.len() < self.config.capacity {
                for event in 0..state.rows.len() {
                    if self.claimable(state, event) {
                        actions.push(Action::Claim { worker, event });
                    }
                }
            }
            for &h in held {
                // A renewal that would succeed with the lease already full changes nothing.
                if !(self.fenced(state, h, true) && state.rows[h.0].lease_left == self.config.lease)
                {
                    actions.push(Action::Renew { worker, held: h });
                }
                actions.push(Action::Complete { worker, held: h });
                for permanent in [false, true] {
                    actions.push(Action::Fail {
                        worker,
                        held: h,
                        permanent,
                    });
                }
                actions.push(Action::Release { worker, held: h });
            }
            if held.len() >= 2 {
                for delete in [false, true] {
                    actions.push(Action::CompleteMany { worker, delete });
                }
            }
            if !held.is_empty() {
                actions.push(Action::Crash { worker });
            }
        }
        // Maintenance.
        for event in 0..state.rows.len() {
            let row = &state.rows[event];
            if self.config.mutation != Mutation::NoRecovery
                && Self::visible(row)
                && Self::expired(row)
            {
                actions.push(Action::Recover(event));
            }
            if self.purgeable(row) {
                actions.push(Action::Purge(event));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let lease = self.config.lease;
        match action {
            Action::Insert(tx) => {
                let event = (0..self.events.len())
                    .find(|&e| self.events[e].0 == tx && s.rows[e].status == Status::Absent)?;
                if self.config.mutation != Mutation::ProducersWithoutLock {
                    s.locks[usize::from(self.aggregate(event))] = Some(tx as u8);
                }
                let row = &mut s.rows[event];
                row.status = Status::Uncommitted;
                row.id = s.next_id;
                s.next_id += 1;
                // `created_at < now() - retention` holds once retention + 1 ticks have passed
                // (created_at is the inserting transaction's now(): the retention counts from the
                // enqueue, whenever the event is delivered).
                row.purge_in = self.config.retention + 1;
            }
            Action::Commit(tx) => {
                s.commits += 1;
                for event in (0..self.events.len()).filter(|&e| self.events[e].0 == tx) {
                    s.rows[event].status = Status::Pending;
                    s.rows[event].commit = s.commits;
                }
                for lock in &mut s.locks {
                    if *lock == Some(tx as u8) {
                        *lock = None;
                    }
                }
                s.committed[tx] = true;
            }
            Action::Tick => {
                for row in &mut s.rows {
                    row.available_in = row.available_in.saturating_sub(1);
                    row.lease_left = row.lease_left.saturating_sub(1);
                    row.purge_in = row.purge_in.saturating_sub(1);
                }
            }
            Action::Claim { worker, event } => {
                let row = &mut s.rows[event];
                row.status = Status::Processing;
                row.lease_left = lease;
                row.claim_version += 1;
                row.attempts += 1;
                let version = row.claim_version;
                s.held[worker].push((event, version));
            }
            Action::Renew { worker, held } => {
                self.fenced_step(&mut s, worker, held, "renew", true, |_, s: &mut State| {
                    s.rows[held.0].lease_left = lease;
                });
            }
            Action::Complete { worker, held } => {
                let lease_checked = self.config.mutation != Mutation::CompleteWithoutLease;
                self.fenced_step(&mut s, worker, held, "complete", lease_checked, |p, s| {
                    p.deliver(s, held.0, false);
                });
            }
            Action::CompleteMany { worker, delete } => {
                let statement = if delete {
                    "complete_many_delete"
                } else {
                    "complete_many"
                };
                for held in last.held[worker].clone() {
                    self.fenced_step(&mut s, worker, held, statement, true, |p, s| {
                        p.deliver(s, held.0, delete);
                    });
                }
            }
            Action::Fail {
                worker,
                held,
                permanent,
            } => {
                self.fenced_step(&mut s, worker, held, "fail", true, |p, s| {
                    p.fail_or_recover_to(&mut s.rows[held.0], permanent);
                });
            }
            Action::Release { worker, held } => {
                self.fenced_step(&mut s, worker, held, "release", true, |_, s: &mut State| {
                    let row = &mut s.rows[held.0];
                    row.status = Status::Pending;
                    row.attempts -= 1;
                    row.available_in = 0;
                    row.lease_left = 0;
                });
            }
            Action::Crash { worker } => s.held[worker].clear(),
            Action::Recover(event) => {
                let row = &mut s.rows[event];
                // The lease ran out: back to pending after the backoff, or exhausted.
                self.fail_or_recover_to(row, false);
            }
            Action::Purge(event) => {
                if s.rows[event].status != Status::Delivered {
                    s.violation
                        .get_or_insert(Violation::PurgedUndelivered(event));
                }
                s.rows[event].status = Status::Deleted;
            }
        }
        Some(canonical(s, self.config.symmetric_workers))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one live owner per row", |_, s: &State| {
                (0..s.rows.len()).all(|event| {
                    s.held
                        .iter()
                        .flatten()
                        .filter(|h| h.0 == event && Protocol::is_current(s, **h))
                        .count()
                        <= 1
                })
            }),
            Property::always(
                "a completion, renewal, failure or release applies only for the current claim",
                |_, s: &State| !matches!(s.violation, Some(Violation::StaleEffect(..))),
            ),
            Property::always(
                "attempts never exceed max_attempts",
                |m: &Protocol, s: &State| {
                    s.rows.iter().all(|r| r.attempts <= m.config.max_attempts)
                },
            ),
            Property::always("purge removes only delivered rows", |_, s: &State| {
                !matches!(s.violation, Some(Violation::PurgedUndelivered(_)))
            }),
            Property::always(
                "ordered: never two events of one aggregate in flight",
                |m: &Protocol, s: &State| {
                    m.config.claiming == Claiming::Plain
                        || (0..m.config.aggregates).all(|agg| {
                            (0..s.rows.len())
                                .filter(|&e| {
                                    usize::from(m.aggregate(e)) == agg
                                        && s.rows[e].status == Status::Processing
                                })
                                .count()
                                <= 1
                        })
                },
            ),
            Property::always("ordered: delivery in commit order", |_, s: &State| {
                !matches!(s.violation, Some(Violation::OutOfCommitOrder(_)))
            }),
            // The model is not vacuous: everything can be delivered, and a lease can run out
            // under a live worker.
            Property::sometimes("every event delivered", |_, s: &State| {
                s.rows
                    .iter()
                    .all(|r| matches!(r.status, Status::Delivered | Status::Deleted))
            }),
            Property::sometimes(
                "a claim is held by a worker past its lease",
                |_, s: &State| {
                    s.held.iter().flatten().any(|h| {
                        s.rows[h.0].status == Status::Processing && s.rows[h.0].lease_left == 0
                    })
                },
            ),
        ]
    }
}

/// The result of the liveness check.
#[derive(Debug)]
pub struct Liveness {
    pub states: usize,
    pub edges: usize,
    /// A path from the initial state to a state from which no path finishes every event.
    pub stuck: Option<Vec<(State, Option<Action>)>>,
}

/// "Every committed event is eventually delivered or exhausted", checked as: from every
/// reachable state there is a path to a state where every event is finished (AG EF done).
///
/// Stateright's `eventually` only judges paths that end (its docs: a path that closes a cycle
/// is not seen as ending there), and this model never ends: the clock ticks, workers crash
/// and claim again, leases run out and are recovered. On a finite graph, AG EF done is what
/// liveness means under strong fairness: a scheduler that does not starve a step that is
/// enabled again and again takes such a path eventually. So this builds the whole graph and
/// walks it backwards from the finished states.
pub fn check_liveness(model: &Protocol) -> Liveness {
    // States are told apart by a 64-bit fingerprint, as stateright's own checker does.
    let fingerprint = |state: &State| {
        let mut hasher = DefaultHasher::new();
        state.hash(&mut hasher);
        hasher.finish()
    };
    let mut index: HashMap<u64, usize> = HashMap::new();
    let mut states: Vec<State> = Vec::new();
    let mut parent: Vec<Option<(usize, Action)>> = Vec::new();
    let mut reverse: Vec<Vec<usize>> = Vec::new();
    let mut queue = VecDeque::new();
    let mut edges = 0;
    for init in model.init_states() {
        index.insert(fingerprint(&init), states.len());
        queue.push_back(states.len());
        states.push(init);
        parent.push(None);
        reverse.push(Vec::new());
    }
    let mut actions = Vec::new();
    while let Some(at) = queue.pop_front() {
        actions.clear();
        model.actions(&states[at], &mut actions);
        for action in actions.drain(..) {
            let Some(next) = model.next_state(&states[at], action.clone()) else {
                continue;
            };
            edges += 1;
            let key = fingerprint(&next);
            let to = match index.get(&key) {
                Some(&to) => to,
                None => {
                    let to = states.len();
                    index.insert(key, to);
                    states.push(next);
                    parent.push(Some((at, action)));
                    reverse.push(Vec::new());
                    queue.push_back(to);
                    to
                }
            };
            reverse[to].push(at);
        }
    }
    let mut reaches = vec![false; states.len()];
    let mut back: VecDeque<usize> = (0..states.len())
        .filter(|&i| model.all_done(&states[i]))
        .collect();
    for &i in &back {
        reaches[i] = true;
    }
    while let Some(at) = back.pop_front() {
        for &from in &reverse[at] {
            if !reaches[from] {
                reaches[from] = true;
                back.push_back(from);
            }
        }
    }
    // The first stuck state in BFS order has a shortest path from the start.
    let stuck = (0..states.len()).find(|&i| !reaches[i]).map(|mut at| {
        // (state, the action taken from it), built backwards.
        let mut path = vec![(states[at].clone(), None)];
        while let Some((from, action)) = parent[at].clone() {
            path.push((states[from].clone(), Some(action)));
            at = from;
        }
        path.reverse();
        path
    });
    Liveness {
        states: states.len(),
        edges,
        stuck,
    }
}

/// One line per row and worker: what a trace step left behind.
pub fn describe(model: &Protocol, state: &State) -> String {
    let mut out = String::new();
    for (event, row) in state.rows.iter().enumerate() {
        let _ = write!(out, "e{event}(agg {}", model.aggregate(event));
        if row.id > 0 {
            let _ = write!(out, ", id {}", row.id);
        }
        let _ = write!(out, "): {:?}", row.status);
        if row.status == Status::Processing {
            let lease = if row.lease_left > 0 {
                "live"
            } else {
                "expired"
            };
            let _ = write!(out, " v{} lease {lease}", row.claim_version);
        }
        if row.attempts > 0 {
            let _ = write!(out, " attempt {}", row.attempts);
        }
        out.push_str("; ");
    }
    for (worker, held) in state.held.iter().enumerate() {
        let claims: Vec<String> = held.iter().map(|(e, v)| format!("e{e}@v{v}")).collect();
        let _ = write!(out, "W{worker} holds [{}]; ", claims.join(", "));
    }
    if let Some(v) = state.violation {
        let _ = write!(out, "VIOLATION {v:?}");
    }
    out.trim_end_matches("; ").to_owned()
}

/// A trace as numbered lines: each step's action and the state it left.
pub fn render_trace(model: &Protocol, path: &[(State, Option<Action>)]) -> String {
    let mut out = String::new();
    if let Some((first, _)) = path.first() {
        let _ = writeln!(out, "   start: {}", describe(model, first));
    }
    for (i, window) in path.windows(2).enumerate() {
        let action = window[0]
            .1
            .as_ref()
            .map(|a| format!("{a:?}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:>3}. {action}\n     -> {}",
            i + 1,
            describe(model, &window[1].0)
        );
    }
    out
}
