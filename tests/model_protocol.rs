//! The protocol, checked exhaustively: every interleaving of producers, workers, maintenance
//! and the clock within small bounds (tests/model_support, documented in
//! docs/protocol-model.md). The safety properties are checked by stateright's breadth-first
//! checker, liveness by a backward walk of the whole state graph; the last tests break the
//! protocol on purpose and require the checker to find the counterexample (printed: run with
//! `--nocapture`).

mod model_support;

use std::time::Instant;

use model_support::{Claiming, Config, Mutation, Protocol, check_liveness, render_trace};
use stateright::{Checker, HasDiscoveries, Model};

/// Run the safety properties to completion and assert them; print the state counts.
fn check_safety(config: Config) -> usize {
    let label = format!("{:?}/{:?}", config.claiming, config.mutation);
    let started = Instant::now();
    let checker = Protocol::new(config).checker().spawn_bfs().join();
    println!(
        "{label}: {} states ({} unique), max depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
    checker.unique_state_count()
}

fn check_live(config: Config) {
    let label = format!("{:?}/{:?}", config.claiming, config.mutation);
    let started = Instant::now();
    let model = Protocol::new(config);
    let liveness = check_liveness(&model);
    println!(
        "{label}: liveness over {} states and {} transitions, {:.1?}",
        liveness.states,
        liveness.edges,
        started.elapsed()
    );
    if let Some(path) = liveness.stuck {
        panic!(
            "a reachable state from which no path delivers or exhausts every event:\n{}",
            render_trace(&model, &path)
        );
    }
}

#[test]
fn plain_claims_keep_every_safety_property() {
    let states = check_safety(Config::small(Claiming::Plain));
    assert!(states > 1_000, "the model explored only {states} states");
}

#[test]
fn ordered_claims_keep_every_safety_property() {
    let states = check_safety(Config::small(Claiming::Ordered));
    assert!(states > 1_000, "the model explored only {states} states");
}

#[test]
fn plain_claims_deliver_or_exhaust_every_committed_event() {
    check_live(Config::small(Claiming::Plain));
}

#[test]
fn ordered_claims_deliver_or_exhaust_every_committed_event() {
    check_live(Config::small(Claiming::Ordered));
}

/// Check `config` until the first property fails; return that property and its trace.
fn first_counterexample(mut config: Config) -> (&'static str, String) {
    config.symmetric_workers = false;
    let model = Protocol::new(config);
    let checker = model
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let failing: Vec<&'static str> = model
        .properties()
        .into_iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .map(|p| p.name)
        .filter(|name| checker.discovery(name).is_some())
        .collect();
    let name = *failing
        .first()
        .unwrap_or_else(|| panic!("no property failed for {:?}", model.config));
    let mut path = checker.discovery(name).expect("just found").into_vec();
    // End the trace at the first state that breaks the property.
    let property = model.property(name);
    if let Some(first_bad) = path
        .iter()
        .position(|(state, _)| !(property.condition)(&model, state))
    {
        path.truncate(first_bad + 1);
    }
    (name, render_trace(&model, &path))
}

#[test]
fn ordered_claims_by_id_without_the_producer_lock_deliver_out_of_commit_order() {
    let (property, trace) =
        first_counterexample(Config::small(Claiming::Ordered).with(Mutation::ProducersWithoutLock));
    println!("counterexample to \"{property}\":\n{trace}");
    assert!(
        property.starts_with("ordered:"),
        "expected an ordering property to fail, got \"{property}\""
    );
}

#[test]
fn a_completion_without_its_lease_guard_applies_a_claim_that_is_not_current() {
    let (property, trace) =
        first_counterexample(Config::small(Claiming::Plain).with(Mutation::CompleteWithoutLease));
    println!("counterexample to \"{property}\":\n{trace}");
    assert_eq!(
        property,
        "a completion, renewal, failure or release applies only for the current claim"
    );
    assert!(trace.contains("Complete"), "{trace}");
}

/// The purge's retention counts from the enqueue, so an event past it may well be undelivered:
/// only the purge's check for a queue row keeps a pending, processing or exhausted event.
#[test]
fn a_purge_without_its_queue_check_deletes_an_undelivered_event() {
    let (property, trace) =
        first_counterexample(Config::small(Claiming::Plain).with(Mutation::PurgeWithoutQueueCheck));
    println!("counterexample to \"{property}\":\n{trace}");
    assert_eq!(property, "purge removes only delivered rows");
    assert!(trace.contains("Purge"), "{trace}");
}

#[test]
fn without_recovery_a_crashed_claim_strands_its_event() {
    let mut config = Config::small(Claiming::Plain).with(Mutation::NoRecovery);
    config.symmetric_workers = false;
    let model = Protocol::new(config);
    let liveness = check_liveness(&model);
    let path = liveness
        .stuck
        .expect("the liveness check must notice that nothing recovers an expired lease");
    let trace = render_trace(&model, &path);
    println!("stuck without recovery:\n{trace}");
    let last = trace.lines().last().unwrap_or_default();
    assert!(last.contains("Processing"), "{trace}");
}
