//! The test kit (`outbox_runtime::testing`) against a real PostgreSQL: assertions over a
//! transaction and a pool, synchronous draining, every fault kind of a `Faults` plan, the
//! idempotency check, and a `#[sqlx::test]` pool.

mod testing_kit_support;

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;
use outbox_runtime::store::EnqueueOptions;
use outbox_runtime::store::enqueue::enqueue_event;
use outbox_runtime::testing::{
    Drain, Failure, Faults, IdempotencyError, Injected, Outcome, Pick, TestDatabase, TestEvent,
    assert_enqueued, assert_not_enqueued, check_idempotent, deliver_one, drain, enqueued,
};
use outbox_runtime::{Delivery, Dispatcher, Event, HandlerError};
use sqlx::PgPool;
use testing_kit_support::*;

/// The panic message of a future that must panic.
async fn panic_of(future: impl std::future::Future<Output = ()>) -> String {
    let panic = AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .expect_err("the assertion should have failed");
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => (*s).to_owned(),
        _ => panic!("a panic without a message"),
    }
}

fn order(order: u32, total_cents: i64) -> OrderPlaced {
    OrderPlaced {
        order,
        total_cents,
        currency: "CHF".into(),
    }
}

// ---- assertions ----

#[tokio::test]
async fn enqueued_reads_a_transactions_own_events_and_upcasts_old_versions() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    order(1, 500).enqueue(&mut tx, "place/1").await.unwrap();
    let old = OrderPlacedV1 {
        order: 2,
        total_cents: 700,
    };
    enqueue_event(&mut tx, &old, "place/2", &EnqueueOptions::default())
        .await
        .unwrap();
    Ping { n: 1 }.enqueue(&mut tx, "ping/1").await.unwrap();

    let seen = enqueued::<OrderPlaced>(&mut *tx).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].1, order(1, 500));
    assert_eq!(
        seen[1].1,
        OrderPlaced {
            order: 2,
            total_cents: 700,
            currency: "EUR".into()
        },
        "version 1 is upcast as a worker would"
    );
    assert_eq!(
        (seen[1].0.stored_version, seen[1].0.operation_key.as_str()),
        (1, "place/2")
    );
    assert_eq!(seen[1].0.aggregate.as_ref().unwrap().id, "2");
    assert_eq!(
        (seen[0].0.status.as_str(), seen[0].0.attempts),
        ("pending", Some(0)),
        "an event not delivered shows its queue row's attempts"
    );
    assert!(
        enqueued::<OrderPlaced>(db.pool()).await.is_empty(),
        "the pool does not see the open transaction's events"
    );
    let (meta, _) = assert_enqueued::<OrderPlaced>(&mut *tx, |e| e.total_cents == 700).await;
    assert_eq!(meta.operation_key, "place/2");
    tx.commit().await.unwrap();
    assert_eq!(enqueued::<OrderPlaced>(db.pool()).await.len(), 2);
    assert_eq!(enqueued::<Ping>(db.pool()).await.len(), 1);
}

#[tokio::test]
async fn a_failed_assertion_lists_what_was_enqueued_instead() {
    let db = TestDatabase::new().await;
    enqueue(db.pool(), order(7, 1_250), "place/7").await;
    enqueue(db.pool(), Ping { n: 3 }, "ping/3").await;

    let message = panic_of(async {
        assert_enqueued::<OrderPlaced>(db.pool(), |e| e.total_cents == 9_999).await;
    })
    .await;
    assert!(
        message.contains("no enqueued `order.placed` event matched the predicate"),
        "{message}"
    );
    assert!(
        message.contains("testing_kit_support::OrderPlaced"),
        "{message}"
    );
    assert!(message.contains("key `place/7`"), "{message}");
    assert!(message.contains(r#""total_cents":1250"#), "{message}");
    assert!(
        message.contains("`ping` v1") && message.contains("key `ping/3`"),
        "events of other types are listed too: {message}"
    );

    let message = panic_of(async {
        assert_enqueued::<OrderPlaced>(TestDatabase::new().await.pool(), |_| true).await;
    })
    .await;
    assert!(
        message.contains("Outbox table `outbox` holds no events"),
        "{message}"
    );

    assert_not_enqueued::<OrderPlaced>(db.pool(), |e| e.order == 8).await;
    let message = panic_of(async {
        assert_not_enqueued::<OrderPlaced>(db.pool(), |e| e.order == 7).await;
    })
    .await;
    assert!(
        message.contains("1 enqueued `order.placed` event(s) matched")
            && message.contains("place/7"),
        "{message}"
    );
}

// ---- draining ----

#[tokio::test]
async fn drain_delivers_everything_ready_in_id_order_and_reports_each_delivery() {
    let db = TestDatabase::new().await;
    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(enqueue(db.pool(), Ping { n }, &format!("ping/{n}")).await);
    }
    let sink = Recorder::default();
    let report = drain(db.pool(), &sink).await.unwrap();
    assert_eq!(report.completed(), 12, "{report}");
    assert_eq!(
        report.completed_order(),
        ids,
        "id order, across claim batches"
    );
    assert_eq!(
        sink.calls().iter().map(|c| c.event_id).collect::<Vec<_>>(),
        ids
    );
    assert!(
        report
            .records
            .iter()
            .all(|r| r.attempt == 1 && r.injected.is_empty())
    );
    assert_eq!(report.seed, None);
    for id in &ids {
        assert_eq!(row(db.pool(), *id).await.status, "delivered");
    }
    let again = drain(db.pool(), &sink).await.unwrap();
    assert!(again.records.is_empty(), "nothing is ready: {again}");
    assert!(
        report.to_string().contains("12 deliveries, 12 completed"),
        "{report}"
    );
}

#[tokio::test]
async fn drain_goes_through_a_dispatcher_and_its_upcasts() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    let old = OrderPlacedV1 {
        order: 4,
        total_cents: 300,
    };
    enqueue_event(&mut tx, &old, "place/4", &EnqueueOptions::default())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let dispatcher = Dispatcher::builder()
        .handler(move |e: OrderPlaced, _ctx: Delivery| {
            record.lock().unwrap().push(e);
            async { Ok(()) }
        })
        .build()
        .unwrap();
    let report = drain(db.pool(), &dispatcher).await.unwrap();
    assert_eq!(report.completed(), 1, "{report}");
    assert_eq!(seen.lock().unwrap()[0].currency, "EUR");
    assert_eq!(report.records[0].stored_version, 1);
}

#[tokio::test]
async fn delayed_events_wait_unless_included_and_stop_after_limits_a_drain() {
    let db = TestDatabase::new().await;
    let mut tx = db.pool().begin().await.unwrap();
    let later = EnqueueOptions {
        delay: Duration::from_secs(3600),
        ..EnqueueOptions::default()
    };
    let delayed = Ping { n: 0 }
        .enqueue_with(&mut tx, "ping/later", &later)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for n in 1..=4 {
        enqueue(db.pool(), Ping { n }, &format!("ping/{n}")).await;
    }
    let sink = Recorder::default();

    let first = Drain::new()
        .stop_after(2)
        .run(db.pool(), &sink)
        .await
        .unwrap();
    assert_eq!(
        (first.records.len(), first.stopped_at_limit),
        (2, true),
        "{first}"
    );
    let one = deliver_one(db.pool(), &sink).await.unwrap().unwrap();
    assert_eq!(one.outcome, Outcome::Completed);
    let rest = drain(db.pool(), &sink).await.unwrap();
    assert_eq!(
        (rest.records.len(), rest.stopped_at_limit),
        (1, false),
        "{rest}"
    );
    assert_eq!(sink.calls_of(delayed), 0, "the delayed event is not due");
    assert_eq!(deliver_one(db.pool(), &sink).await.unwrap(), None);

    let zero = Drain::new()
        .lease(Duration::ZERO)
        .run(db.pool(), &sink)
        .await;
    assert!(
        zero.unwrap_err()
            .to_string()
            .contains("Drain::lease must be longer than zero"),
        "a zero lease is refused, not looped on"
    );
    let included = Drain::new()
        .include_delayed()
        .run(db.pool(), &sink)
        .await
        .unwrap();
    assert_eq!(included.completed_order(), vec![delayed], "{included}");
}

#[tokio::test]
async fn a_handlers_retry_after_is_honoured_and_include_delayed_brings_it_forward() {
    let db = TestDatabase::new().await;
    let id = enqueue(db.pool(), Ping { n: 1 }, "ping/1").await;
    let dispatcher = Dispatcher::builder()
        .handler(|_: Ping, ctx: Delivery| async move {
            if ctx.attempt() == 1 {
                Err(HandlerError::retry_after("busy", Duration::from_secs(3600)))
            } else {
                Ok(())
            }
        })
        .build()
        .unwrap();
    let report = drain(db.pool(), &dispatcher).await.unwrap();
    assert_eq!(report.records.len(), 1, "{report}");
    assert!(matches!(
        &report.records[0].outcome,
        Outcome::Retrying { after, .. } if *after == Duration::from_secs(3600)
    ));
    assert_eq!(row(db.pool(), id).await.status, "pending");
    let report = Drain::new()
        .include_delayed()
        .run(db.pool(), &dispatcher)
        .await
        .unwrap();
    assert_eq!(report.completed(), 1, "{report}");
    assert_eq!(report.records[0].attempt, 2);
}

// ---- faults, one kind each ----

#[tokio::test]
async fn deliver_twice_hands_each_event_to_the_sink_twice_and_completes_it_once() {
    let db = TestDatabase::new().await;
    let a = enqueue(db.pool(), Ping { n: 1 }, "ping/1").await;
    let b = enqueue(db.pool(), Ping { n: 2 }, "ping/2").await;
    let sink = Recorder::default();
    let faulty = Faults::seeded(1)
        .deliver_twice(Pick::Every)
        .wrap(sink.clone());
    let report = drain(db.pool(), &faulty).await.unwrap();
    assert_eq!((sink.calls_of(a), sink.calls_of(b)), (2, 2));
    assert_eq!(report.records.len(), 2, "{report}");
    for r in &report.records {
        assert_eq!(r.injected, vec![Injected::DeliveredTwice]);
        assert_eq!(r.outcome, Outcome::Completed);
    }
    let calls = sink.calls();
    assert_eq!(
        calls[0].attempt, calls[1].attempt,
        "the same delivery, twice"
    );
    // One claim each: a delivered event keeps no claim count (its queue row is gone), so the
    // report's attempts say it.
    assert!(
        report.records.iter().all(|r| r.attempt == 1),
        "one claim each: {report}"
    );
    assert_eq!(row(db.pool(), a).await.status, "delivered");
}

#[tokio::test]
async fn fail_first_fails_attempts_without_calling_the_sink() {
    let db = TestDatabase::new().await;
    let retried = enqueue(db.pool(), Ping { n: 1 }, "ping/1").await;
    let sink = Recorder::default();
    let faulty = Faults::seeded(2)
        .fail_first(2, Failure::Retryable, Pick::Every)
        .wrap(sink.clone());
    // The two failures first: what the outbox records of them is on the queue row, which the
    // completion deletes, so it is read before the third delivery.
    let failed = Drain::new()
        .stop_after(2)
        .run(db.pool(), &faulty)
        .await
        .unwrap();
    let outcomes: Vec<&Outcome> = failed.records.iter().map(|r| &r.outcome).collect();
    assert!(
        matches!(
            outcomes[..],
            [Outcome::Retrying { .. }, Outcome::Retrying { .. }]
        ),
        "{failed}"
    );
    assert_eq!(
        failed.records[1].injected,
        vec![Injected::Failure {
            failure: Failure::Retryable,
            number: 2,
            of: 2
        }]
    );
    let stored = row(db.pool(), retried).await;
    assert_eq!(
        (
            stored.status.as_str(),
            stored.attempts,
            stored.handler_failures
        ),
        ("pending", Some(2), Some(2))
    );
    let report = drain(db.pool(), &faulty).await.unwrap();
    assert!(
        matches!(&report.records[..], [r] if r.outcome == Outcome::Completed && r.attempt == 3),
        "{report}"
    );
    assert_eq!(
        sink.calls().iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![3]
    );
    assert_eq!(row(db.pool(), retried).await.status, "delivered");

    let exhausted = enqueue(db.pool(), Ping { n: 2 }, "ping/2").await;
    let faulty = Faults::seeded(2)
        .fail_first(1, Failure::Permanent, Pick::Every)
        .wrap(sink.clone());
    let report = drain(db.pool(), &faulty).await.unwrap();
    assert!(
        matches!(&report.records[..], [r] if matches!(&r.outcome, Outcome::Exhausted { error } if error.contains("injected permanent failure 1 of 1"))),
        "{report}"
    );
    assert_eq!(sink.calls_of(exhausted), 0);
    assert_eq!(row(db.pool(), exhausted).await.status, "exhausted");
}

#[tokio::test]
async fn a_lost_response_leaves_the_row_claimed_until_recovery_hands_it_back() {
    let db = TestDatabase::new().await;
    let id = enqueue(db.pool(), Ping { n: 1 }, "ping/1").await;
    let sink = Recorder::default();
    let faulty = Faults::seeded(3)
        .lose_response(Pick::Every)
        .wrap(sink.clone());
    // The lost response alone first: how the event came back is recorded on its queue row,
    // which the completion of the redelivery deletes.
    let lost = Drain::new()
        .stop_after(1)
        .run(db.pool(), &faulty)
        .await
        .unwrap();
    assert_eq!(lost.records.len(), 1, "{lost}");
    assert_eq!(lost.records[0].injected, vec![Injected::ResponseLost]);
    assert_eq!(
        lost.records[0].outcome,
        Outcome::ResponseLost { requeued: true }
    );
    let stored = row(db.pool(), id).await;
    assert_eq!(stored.status, "pending");
    assert_eq!(
        (
            stored.lease_expiries,
            stored.handler_failures,
            stored.claim_version
        ),
        (Some(1), Some(0), Some(1)),
        "came back through lease expiry and recovery, not as a failure"
    );
    assert!(
        stored.last_error.unwrap().contains("lease expired"),
        "the recovery statement's reason"
    );
    let report = drain(db.pool(), &faulty).await.unwrap();
    assert_eq!(report.records.len(), 1, "{report}");
    assert_eq!(
        (report.records[0].attempt, &report.records[0].outcome),
        (2, &Outcome::Completed)
    );
    assert_eq!(
        sink.calls_of(id),
        2,
        "the effect happened twice: the sink must deduplicate"
    );
    assert_eq!(row(db.pool(), id).await.status, "delivered");
}

#[tokio::test]
async fn a_lost_lease_cancels_the_delivery_and_the_fence_refuses_its_completion() {
    let db = TestDatabase::new().await;
    let id = enqueue(db.pool(), Ping { n: 1 }, "ping/1").await;
    let sink = Recorder {
        wait_for_lease_loss: true,
        ..Recorder::default()
    };
    let faulty = Faults::seeded(4).lose_lease(Pick::Every).wrap(sink.clone());
    // The lost lease alone first: its expiry is recorded on the queue row, which the
    // completion of the redelivery deletes.
    let lost = Drain::new()
        .stop_after(1)
        .run(db.pool(), &faulty)
        .await
        .unwrap();
    assert_eq!(lost.records.len(), 1, "{lost}");
    assert_eq!(lost.records[0].injected, vec![Injected::LeaseLost]);
    assert_eq!(
        lost.records[0].outcome,
        Outcome::ClaimLost {
            sink_result: Ok(())
        }
    );
    let calls = sink.calls();
    assert!(
        calls[0].saw_lease_lost,
        "lease_lost was cancelled while the sink ran"
    );
    let stored = row(db.pool(), id).await;
    assert_eq!(
        (
            stored.status.as_str(),
            stored.lease_expiries,
            stored.claim_version
        ),
        ("pending", Some(1), Some(1))
    );
    let report = drain(db.pool(), &faulty).await.unwrap();
    assert_eq!(
        (report.records.len(), report.records[0].attempt),
        (1, 2),
        "{report}"
    );
    assert_eq!(report.records[0].outcome, Outcome::Completed);
    assert_eq!(row(db.pool(), id).await.status, "delivered");
}

#[tokio::test]
async fn an_injected_panic_exhausts_its_event_like_a_worker_and_spares_the_others() {
    let db = TestDatabase::new().await;
    let poisoned = enqueue(db.pool(), order(1, 100), "place/1").await;
    let fine = enqueue(db.pool(), Ping { n: 1 }, "ping/1").await;
    let sink = Recorder::default();
    let faulty = Faults::seeded(5)
        .panic(Pick::EventType("order.placed".into()))
        .wrap(sink.clone());
    let report = drain(db.pool(), &faulty).await.unwrap();
    let of_poisoned = report.of(poisoned);
    assert_eq!(of_poisoned.len(), 1, "{report}");
    assert_eq!(of_poisoned[0].injected, vec![Injected::Panic]);
    assert!(
        matches!(&of_poisoned[0].outcome, Outcome::Exhausted { error } if error.contains("handler panicked: injected panic")),
        "{report}"
    );
    assert_eq!(report.of(fine)[0].outcome, Outcome::Completed);
    assert_eq!((sink.calls_of(poisoned), sink.calls_of(fine)), (0, 1));
    assert_eq!(row(db.pool(), poisoned).await.status, "exhausted");
}

#[tokio::test]
async fn a_delay_holds_the_call_back() {
    let db = TestDatabase::new().await;
    enqueue(db.pool(), Ping { n: 1 }, "ping/1").await;
    let faulty = Faults::seeded(6)
        .delay(Duration::from_millis(300), Pick::Every)
        .wrap(Recorder::default());
    let started = Instant::now();
    let report = drain(db.pool(), &faulty).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        report.records[0].injected,
        vec![Injected::Delay(Duration::from_millis(300))]
    );
    assert_eq!(report.records[0].outcome, Outcome::Completed);
}

/// Three orders of three events each, and three pings, in one claim batch.
async fn mixed_batch(pool: &PgPool) {
    for step in 0..3 {
        for order_id in 1..=3 {
            enqueue(
                pool,
                order(order_id, i64::from(step)),
                &format!("o{order_id}/{step}"),
            )
            .await;
        }
        enqueue(pool, Ping { n: step as u32 }, &format!("ping/{step}")).await;
    }
}

async fn reordered_run(seed: u64) -> (Vec<(String, Option<String>, serde_json::Value)>, usize) {
    let db = TestDatabase::new().await;
    mixed_batch(db.pool()).await;
    let sink = Recorder::default();
    let faulty = Faults::seeded(seed).reorder().wrap(sink.clone());
    let report = Drain::new()
        .batch(100)
        .run(db.pool(), &faulty)
        .await
        .unwrap();
    assert_eq!(report.completed(), 12, "{report}");
    assert_eq!(report.seed, Some(seed));
    let moved = report
        .records
        .iter()
        .filter(|r| matches!(r.injected[..], [Injected::Reordered { .. }]))
        .count();
    let calls = sink
        .calls()
        .into_iter()
        .map(|c| (c.event_type, c.aggregate, c.payload))
        .collect();
    (calls, moved)
}

#[tokio::test]
async fn reorder_shuffles_aggregates_but_keeps_each_aggregates_order_and_replays_by_seed() {
    let (calls, moved) = reordered_run(42).await;
    assert!(moved > 0, "a shuffle of 12 events moved none: {calls:?}");
    for order_id in ["1", "2", "3"] {
        let steps: Vec<i64> = calls
            .iter()
            .filter(|(_, aggregate, _)| aggregate.as_deref() == Some(order_id))
            .map(|(_, _, payload)| payload["total_cents"].as_i64().unwrap())
            .collect();
        assert_eq!(
            steps,
            vec![0, 1, 2],
            "order {order_id} kept its order: {calls:?}"
        );
    }
    let (replayed, _) = reordered_run(42).await;
    assert_eq!(replayed, calls, "the same seed replays the same order");
}

#[tokio::test]
async fn a_chance_picks_the_same_events_for_the_same_seed() {
    async fn picked(seed: u64) -> Vec<u32> {
        let db = TestDatabase::new().await;
        for n in 0..20 {
            enqueue(db.pool(), Ping { n }, &format!("ping/{n}")).await;
        }
        let sink = Recorder::default();
        let faulty = Faults::seeded(seed)
            .deliver_twice(Pick::Chance(0.5))
            .wrap(sink.clone());
        let report = drain(db.pool(), &faulty).await.unwrap();
        assert_eq!(report.completed(), 20, "{report}");
        let mut twice: Vec<u32> = (0..20)
            .filter(|n| sink.calls().iter().filter(|c| c.payload["n"] == *n).count() == 2)
            .collect();
        twice.sort_unstable();
        twice
    }
    let first = picked(7).await;
    assert!(
        !first.is_empty() && first.len() < 20,
        "a chance of 0.5 picked {first:?}"
    );
    assert_eq!(picked(7).await, first);
}

#[tokio::test]
async fn faults_combine_and_the_report_names_the_seed_and_each_injection() {
    let db = TestDatabase::new().await;
    mixed_batch(db.pool()).await;
    let sink = Recorder::default();
    let faulty = Faults::seeded(99)
        .deliver_twice(Pick::Chance(0.3))
        .fail_first(1, Failure::Retryable, Pick::EventType("ping".into()))
        .lose_response(Pick::Chance(0.3))
        .reorder()
        .wrap(sink.clone());
    let report = Drain::new()
        .batch(100)
        .run(db.pool(), &faulty)
        .await
        .unwrap();
    assert_eq!(delivered(db.pool()).await, 12, "{report}");
    let text = report.to_string();
    assert!(
        text.contains("faults seeded 99 (replay: Faults::seeded(99))"),
        "{text}"
    );
    assert!(text.contains("retryable failure 1 of 1"), "{text}");
}

// ---- the idempotency check ----

fn effect_handler(pool: &PgPool, dedupe: bool) -> Dispatcher {
    let (orders, pings) = (pool.clone(), pool.clone());
    Dispatcher::builder()
        .handler(move |e: OrderPlaced, ctx: Delivery| {
            let pool = orders.clone();
            async move {
                apply_effect(&pool, ctx.event_id(), &format!("order {}", e.order), dedupe).await
            }
        })
        // Pings are always deduplicated: only orders differ between the two handlers.
        .handler(move |e: Ping, ctx: Delivery| {
            let pool = pings.clone();
            async move { apply_effect(&pool, ctx.event_id(), &format!("ping {}", e.n), true).await }
        })
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_idempotent_handler_passes_the_check() {
    let db = TestDatabase::new().await;
    create_effects(db.pool()).await;
    let handler = effect_handler(db.pool(), true);
    let events = [
        TestEvent::new(order(1, 100), "place/1"),
        TestEvent::new(Ping { n: 1 }, "ping/1"),
    ];
    let report = check_idempotent(db.pool(), &handler, events, async || {
        effects(db.pool()).await
    })
    .await
    .unwrap();
    assert_eq!(
        (report.events, report.sink_calls, report.comparisons),
        (2, 8, 6)
    );
    assert_eq!(
        effects(db.pool()).await,
        vec![("order 1".to_owned(), 1), ("ping 1".to_owned(), 1)]
    );
    // Both delivered in the end. How many claims each took is not kept once delivered (the
    // completion deletes the queue row with its counters): the four sink calls an event are in
    // `sink_calls` above.
    let orders = enqueued::<OrderPlaced>(db.pool()).await.into_iter();
    let pings = enqueued::<Ping>(db.pool()).await.into_iter();
    for stored in orders
        .map(|(meta, _)| meta)
        .chain(pings.map(|(meta, _)| meta))
    {
        assert_eq!(
            (stored.status.as_str(), stored.attempts, stored.last_error),
            ("delivered", None, None),
            "a delivered event keeps no delivery state"
        );
    }
    assert_eq!(delivered(db.pool()).await, 2);
}

#[tokio::test]
async fn the_check_names_the_first_event_whose_redelivery_changed_the_state() {
    let db = TestDatabase::new().await;
    create_effects(db.pool()).await;
    let handler = effect_handler(db.pool(), false);
    let events = [
        TestEvent::new(Ping { n: 1 }, "ping/1"),
        TestEvent::new(order(5, 100), "place/5"),
        TestEvent::new(order(6, 100), "place/6"),
    ];
    let error = check_idempotent(db.pool(), &handler, events, async || {
        effects(db.pool()).await
    })
    .await
    .unwrap_err();
    let IdempotencyError::NotIdempotent {
        index,
        of,
        event,
        fault,
        baseline,
        observed,
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!((*index, *of), (2, 3));
    assert!(
        event.contains("`order.placed` v2") && event.contains("key `place/5`"),
        "{event}"
    );
    assert!(
        fault.starts_with("attempt 2, delivered again after the response to attempt 1 was lost"),
        "{fault}"
    );
    assert_eq!(baseline, r#"[("order 5", 1), ("ping 1", 1)]"#);
    assert_eq!(observed, r#"[("order 5", 2), ("ping 1", 1)]"#);
    let message = format!("{error:?}");
    assert!(
        message.starts_with("not idempotent: event 2 of 3"),
        "{message}"
    );
    assert!(message.contains("Delivery::idempotency_key()"), "{message}");
}

#[tokio::test]
async fn a_sink_that_refuses_a_redelivery_fails_the_check() {
    let db = TestDatabase::new().await;
    let refusing = Dispatcher::builder()
        .handler(|_: Ping, ctx: Delivery| async move {
            if ctx.attempt() == 1 {
                Ok(())
            } else {
                Err(HandlerError::permanent("already shipped"))
            }
        })
        .build()
        .unwrap();
    let error = check_idempotent(
        db.pool(),
        &refusing,
        [TestEvent::new(Ping { n: 1 }, "ping/1")],
        async || (),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, IdempotencyError::DeliveryFailed { delivery, error, .. }
        if delivery.starts_with("attempt 3") && error == "already shipped"),
        "{error}"
    );
}

#[tokio::test]
async fn the_check_refuses_an_outbox_with_other_open_events() {
    let db = TestDatabase::new().await;
    enqueue(db.pool(), Ping { n: 9 }, "ping/9").await;
    let error = check_idempotent(
        db.pool(),
        &Recorder::default(),
        [TestEvent::new(Ping { n: 1 }, "ping/1")],
        async || (),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, IdempotencyError::Setup(ref why) if why.contains("1 pending")),
        "{error}"
    );
}

// ---- #[sqlx::test] pools ----

/// `#[sqlx::test]` creates a database per test on `DATABASE_URL` (the repository's `.env` names
/// the local server when the environment does not); the kit works on its pool like on any other.
#[sqlx::test(migrations = false)]
async fn the_kit_works_on_a_sqlx_test_pool(pool: PgPool) {
    outbox_runtime::migrate(&pool).await.unwrap();
    create_effects(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    order(3, 900).enqueue(&mut tx, "place/3").await.unwrap();
    assert_enqueued::<OrderPlaced>(&mut *tx, |e| e.order == 3).await;
    tx.commit().await.unwrap();
    let handler = effect_handler(&pool, true);
    let report = drain(&pool, &handler).await.unwrap();
    assert_eq!(report.completed(), 1, "{report}");
    check_idempotent(
        &pool,
        &handler,
        [TestEvent::new(order(4, 1), "place/4")],
        async || effects(&pool).await,
    )
    .await
    .unwrap();
    assert_eq!(effects(&pool).await.len(), 2);
}
