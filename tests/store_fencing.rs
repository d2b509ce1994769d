//! Leases and fencing: a stale worker is refused everywhere, recovery and a late completion
//! never both win, attempts are bounded, and the operator statements do what they say.

mod store_support;

use std::time::Duration;

use futures::future::join_all;
use outbox_runtime::Event;
use outbox_runtime::Store;
use outbox_runtime::store::enqueue::event_id_for;
use outbox_runtime::store::{
    EnqueueOptions, FailOutcome, Ownership, RecoveryBackoff, RecoveryCounts,
};
use outbox_runtime::testing::TestDatabase;
use sqlx::Row;
use store_support::{Note, all_rows, count_status, enqueue_notes, row_state};

const LONG_LEASE: Duration = Duration::from_secs(60);
const SHORT_LEASE: Duration = Duration::from_millis(200);

async fn enqueue_one(db: &TestDatabase, key: &str, max_attempts: i32) -> uuid::Uuid {
    let options = EnqueueOptions {
        max_attempts,
        notify: false,
        ..Default::default()
    };
    let mut tx = db.pool().begin().await.unwrap();
    let id = Note { text: key.into() }
        .enqueue_with(&mut tx, key, &options)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    id
}

#[tokio::test]
async fn a_worker_whose_lease_was_recovered_cannot_complete_or_renew() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_one(&db, "stale", 10).await;

    let first = store
        .claim_batch("worker-a", 10, SHORT_LEASE, false)
        .await
        .unwrap()
        .remove(0);
    assert_eq!((first.claim_version, first.attempts), (1, 1));
    wait_until_lease_ended(db.pool(), first.id).await;

    // The lease ran out: even before recovery, the first worker is refused.
    assert_eq!(
        store.complete_if_owned(first.claim()).await.unwrap(),
        Ownership::Lost
    );
    assert_eq!(
        store
            .renew_if_owned(first.claim(), LONG_LEASE)
            .await
            .unwrap(),
        Ownership::Lost
    );
    let unchanged = row_state(db.pool(), first.id).await;
    assert_eq!(
        (
            unchanged.status.as_str(),
            unchanged.claim_version,
            unchanged.lease_live
        ),
        ("processing", Some(1), Some(false))
    );

    assert_eq!(
        store
            .recover_expired(100, RecoveryBackoff::NONE)
            .await
            .unwrap(),
        RecoveryCounts {
            requeued: 1,
            exhausted: 0
        }
    );
    let recovered = row_state(db.pool(), first.id).await;
    assert_eq!(
        (
            recovered.status.as_str(),
            recovered.lease_expiries,
            recovered.handler_failures
        ),
        ("pending", Some(1), Some(0))
    );
    let reason = recovered.last_error.unwrap();
    assert!(
        reason.contains("lease expired") && reason.contains("worker-a"),
        "{reason}"
    );

    let second = store
        .claim_batch("worker-b", 10, LONG_LEASE, false)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (second.id, second.claim_version, second.attempts),
        (first.id, 2, 2)
    );

    // Every fenced statement of the first claim is refused and changes nothing.
    assert_eq!(
        store.complete_if_owned(first.claim()).await.unwrap(),
        Ownership::Lost
    );
    assert_eq!(
        store
            .renew_if_owned(first.claim(), LONG_LEASE)
            .await
            .unwrap(),
        Ownership::Lost
    );
    assert_eq!(
        store
            .fail_if_owned(first.claim(), "late", Duration::ZERO, false)
            .await
            .unwrap(),
        FailOutcome::Lost
    );
    assert_eq!(
        store.release_if_owned(first.claim()).await.unwrap(),
        Ownership::Lost
    );
    assert_eq!(
        store
            .complete_many_if_owned(&[first.claim()])
            .await
            .unwrap(),
        vec![first.claim()]
    );
    assert_eq!(
        store
            .renew_many_if_owned(&[first.claim()], LONG_LEASE)
            .await
            .unwrap(),
        vec![first.claim()]
    );
    let held = row_state(db.pool(), first.id).await;
    assert_eq!(
        (
            held.status.as_str(),
            held.claim_version,
            held.claimed_by.as_deref(),
            held.attempts,
            held.lease_live
        ),
        ("processing", Some(2), Some("worker-b"), Some(2), Some(true)),
        "the row keeps the second claim"
    );
    assert_eq!(held.handler_failures, Some(0));

    assert_eq!(
        store.complete_if_owned(second.claim()).await.unwrap(),
        Ownership::Owned
    );
    // Delivered: the queue row is gone, and the event keeps no delivery state (which claim
    // completed it is the completion's answer above, not a column any more).
    let done = row_state(db.pool(), first.id).await;
    assert_eq!(
        (
            done.status.as_str(),
            done.claim_version,
            done.claimed_by.as_deref()
        ),
        ("delivered", None, None)
    );
    // Completing twice is refused too: the queue row is gone.
    assert_eq!(
        store.complete_if_owned(second.claim()).await.unwrap(),
        Ownership::Lost
    );
}

#[tokio::test]
async fn renewal_extends_a_live_lease_and_batches_report_only_the_lost_claims() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "renew", 3).await;
    let claimed = store
        .claim_batch("w", 3, Duration::from_secs(30), false)
        .await
        .unwrap();
    let claims: Vec<_> = claimed.iter().map(|e| e.claim()).collect();

    assert_eq!(
        store
            .renew_if_owned(claims[0], Duration::from_secs(600))
            .await
            .unwrap(),
        Ownership::Owned
    );
    let left: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM lease_until - now())::float8 FROM outbox_queue WHERE id = $1",
    )
    .bind(claims[0].id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        (595.0..=600.0).contains(&left),
        "renewed lease left: {left}"
    );

    let stale = outbox_runtime::store::Claim {
        id: claims[1].id,
        claim_version: 99,
    };
    let lost = store
        .renew_many_if_owned(&[claims[0], stale, claims[2]], Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(lost, vec![stale]);
    let lost = store
        .complete_many_if_owned(&[claims[0], stale, claims[2]])
        .await
        .unwrap();
    assert_eq!(lost, vec![stale]);
    let states: Vec<_> = all_rows(db.pool())
        .await
        .into_iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(states, ["delivered", "processing", "delivered"]);
    assert!(store.complete_many_if_owned(&[]).await.unwrap().is_empty());
}

/// A renewal that skips held rows renews the free ones of its batch at once, reports the held
/// one as held (neither renewed nor lost), and a stale claim or a row that is gone as lost;
/// once the row is free it renews it as usual. It never waits for the held row: a renewal that
/// did would not return before the holder ends, which the test does only after both renewals.
#[tokio::test]
async fn a_renewal_skips_a_held_row_and_renews_the_rest() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "renew-held", 4).await;
    let claims: Vec<_> = store
        .claim_batch("w", 4, Duration::from_secs(30), false)
        .await
        .unwrap()
        .iter()
        .map(|e| e.claim())
        .collect();
    let (free, held, gone) = (claims[0], claims[1], claims[3]);
    let stale = outbox_runtime::store::Claim {
        id: claims[2].id,
        claim_version: claims[2].claim_version - 1,
    };
    // Gone: another claim completed it (its queue row deleted; the event stays, delivered).
    sqlx::query("DELETE FROM outbox_queue WHERE id = $1")
        .bind(gone.id)
        .execute(db.pool())
        .await
        .unwrap();
    let leases = |db: &TestDatabase| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_as::<_, (i64, chrono::DateTime<chrono::Utc>)>(
                "SELECT id, lease_until FROM outbox_queue ORDER BY id",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let lease_of = |all: &[(i64, chrono::DateTime<chrono::Utc>)], id: i64| {
        all.iter().find(|(i, _)| *i == id).unwrap().1
    };
    let before = leases(&db).await;
    let batch = [free, held, stale, gone];
    let renew = || {
        tokio::time::timeout(
            Duration::from_secs(30),
            store.renew_many_if_owned_skipping_held(&batch, Duration::from_secs(600)),
        )
    };

    // Another transaction holds the second queue row (as an operator's SELECT ... FOR UPDATE
    // does).
    let mut holder = db.connect().await;
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_queue WHERE id = $1 FOR UPDATE")
        .bind(held.id)
        .execute(&mut holder)
        .await
        .unwrap();
    let renewal = renew()
        .await
        .expect("the renewal waited for the held row")
        .unwrap();
    assert_eq!(renewal.held, [held]);
    assert_eq!(renewal.lost, [stale, gone]);
    let during = leases(&db).await;
    assert!(lease_of(&during, free.id) > lease_of(&before, free.id));
    assert_eq!(lease_of(&during, held.id), lease_of(&before, held.id));
    assert_eq!(
        lease_of(&during, stale.id),
        lease_of(&before, stale.id),
        "a stale claim renewed a lease"
    );

    // Held no more: renewed like the others.
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    let renewal = renew().await.unwrap().unwrap();
    assert!(renewal.held.is_empty(), "{renewal:?}");
    assert_eq!(renewal.lost, [stale, gone]);
    let after = leases(&db).await;
    assert!(lease_of(&after, held.id) > lease_of(&before, held.id));
    let nothing = store
        .renew_many_if_owned_skipping_held(&[], Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(nothing, outbox_runtime::store::Renewal::default());
}

#[tokio::test]
async fn completing_by_deleting_is_fenced_like_marking_delivered() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "delete", 4).await;
    let claimed = store
        .claim_batch("w", 4, Duration::from_secs(30), false)
        .await
        .unwrap();
    let claims: Vec<_> = claimed.iter().map(|e| e.claim()).collect();

    // A claim from an older claim_version, and one whose lease ran out and was recovered:
    // neither may delete its row.
    let stale = outbox_runtime::store::Claim {
        id: claims[1].id,
        claim_version: claims[1].claim_version - 1,
    };
    sqlx::query("UPDATE outbox_queue SET lease_until = now() - interval '1 second' WHERE id = $1")
        .bind(claims[3].id)
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(
        store
            .recover_expired(100, RecoveryBackoff::NONE)
            .await
            .unwrap(),
        RecoveryCounts {
            requeued: 1,
            exhausted: 0
        }
    );

    let lost = store
        .complete_many_by_deleting_if_owned(&[claims[0], stale, claims[2], claims[3]])
        .await
        .unwrap();
    assert_eq!(lost, vec![stale, claims[3]]);
    let left: Vec<(i64, String)> = all_rows(db.pool())
        .await
        .into_iter()
        .map(|r| (r.id, r.status))
        .collect();
    assert_eq!(
        left,
        [
            (claims[1].id, "processing".to_owned()),
            (claims[3].id, "pending".to_owned())
        ],
        "only the owned claims deleted their events; the stale and the recovered rows are untouched"
    );
    // The live claim of row 1 can still complete (by deleting), exactly once.
    assert!(
        store
            .complete_many_by_deleting_if_owned(&[claims[1]])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .complete_many_by_deleting_if_owned(&[claims[1]])
            .await
            .unwrap(),
        vec![claims[1]]
    );
    assert!(
        store
            .complete_many_by_deleting_if_owned(&[])
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn handler_failures_retry_with_backoff_then_exhaust_and_are_never_claimed_again() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let event_id = enqueue_one(&db, "flaky", 3).await;

    for attempt in 1..=3 {
        let e = store
            .claim_batch("w", 10, LONG_LEASE, false)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(e.attempts, attempt);
        let outcome = store
            .fail_if_owned(
                e.claim(),
                &format!("receiver said 503 on {attempt}"),
                Duration::ZERO,
                false,
            )
            .await;
        let expected = if attempt < 3 {
            FailOutcome::Rescheduled
        } else {
            FailOutcome::Exhausted
        };
        assert_eq!(outcome.unwrap(), expected);
    }
    let row = row_state(db.pool(), 1).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.attempts,
            row.handler_failures,
            row.lease_expiries
        ),
        ("exhausted", Some(3), Some(3), Some(0))
    );
    assert_eq!(row.last_error.as_deref(), Some("receiver said 503 on 3"));
    assert!(
        store
            .claim_batch("w", 10, LONG_LEASE, false)
            .await
            .unwrap()
            .is_empty(),
        "exhausted is never claimed"
    );
    assert!(
        store
            .recover_expired(100, RecoveryBackoff::NONE)
            .await
            .unwrap()
            == RecoveryCounts::default()
    );

    let listed = store.exhausted_events(10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].event_id,
            listed[0].event_type.as_str(),
            listed[0].attempts
        ),
        (event_id, "note", 3)
    );
    assert_eq!(
        (listed[0].handler_failures, listed[0].lease_expiries),
        (3, 0)
    );

    // The operator brings it back with fresh attempts.
    assert!(!store.retry_exhausted(uuid::Uuid::nil()).await.unwrap());
    assert!(store.retry_exhausted(event_id).await.unwrap());
    assert!(
        !store.retry_exhausted(event_id).await.unwrap(),
        "only an exhausted event is retried"
    );
    let back = row_state(db.pool(), 1).await;
    assert_eq!((back.status.as_str(), back.attempts), ("pending", Some(0)));
    let again = store.claim_batch("w", 10, LONG_LEASE, false).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].attempts, again[0].claim_version), (1, 4));
    assert_eq!(
        store.complete_if_owned(again[0].claim()).await.unwrap(),
        Ownership::Owned
    );
    assert!(store.exhausted_events(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_backoff_is_honoured_and_a_permanent_failure_exhausts_at_once() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_one(&db, "later", 10).await;
    enqueue_one(&db, "poison", 10).await;
    let claimed = store.claim_batch("w", 10, LONG_LEASE, false).await.unwrap();

    let outcome = store
        .fail_if_owned(
            claimed[0].claim(),
            "try later",
            Duration::from_secs(3600),
            false,
        )
        .await
        .unwrap();
    assert_eq!(outcome, FailOutcome::Rescheduled);
    let wait: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM available_at - now())::float8 FROM outbox_queue WHERE id = $1",
    )
    .bind(claimed[0].id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        (3590.0..=3600.0).contains(&wait),
        "available again in {wait}s"
    );

    let outcome = store
        .fail_if_owned(claimed[1].claim(), "cannot decode", Duration::ZERO, true)
        .await
        .unwrap();
    assert_eq!(outcome, FailOutcome::Exhausted);
    let poison = row_state(db.pool(), claimed[1].id).await;
    assert_eq!(
        (
            poison.status.as_str(),
            poison.attempts,
            poison.handler_failures
        ),
        ("exhausted", Some(1), Some(1))
    );

    assert!(
        store
            .claim_batch("w", 10, LONG_LEASE, false)
            .await
            .unwrap()
            .is_empty(),
        "the retry waits for its backoff"
    );
    assert_eq!(store.retry_exhausted_of_type("note").await.unwrap(), 1);
    assert_eq!(
        store
            .claim_batch("w", 10, LONG_LEASE, false)
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn expired_leases_use_up_attempts_and_end_exhausted() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let event_id = enqueue_one(&db, "crashes-the-worker", 2).await;

    for (round, expected) in [
        (
            1,
            RecoveryCounts {
                requeued: 1,
                exhausted: 0,
            },
        ),
        (
            2,
            RecoveryCounts {
                requeued: 0,
                exhausted: 1,
            },
        ),
    ] {
        let e = store
            .claim_batch(
                &format!("worker-{round}"),
                10,
                Duration::from_millis(100),
                false,
            )
            .await
            .unwrap();
        assert_eq!(e.len(), 1, "round {round}");
        // The worker "crashes": it never completes, and its lease runs out.
        wait_until_lease_ended(db.pool(), e[0].id).await;
        assert_eq!(
            store
                .recover_expired(100, RecoveryBackoff::NONE)
                .await
                .unwrap(),
            expected
        );
    }
    let row = row_state(db.pool(), 1).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.attempts,
            row.lease_expiries,
            row.handler_failures
        ),
        ("exhausted", Some(2), Some(2), Some(0))
    );
    assert!(row.last_error.as_deref().unwrap().contains("worker-2"));
    let listed = store.exhausted_events(10).await.unwrap();
    assert_eq!(
        (
            listed[0].event_id,
            listed[0].lease_expiries,
            listed[0].handler_failures
        ),
        (event_id, 2, 0)
    );
    assert!(
        store
            .claim_batch("w", 10, LONG_LEASE, false)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn recovery_is_bounded_and_leaves_live_leases_alone() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "bounded", 5).await;
    let short = store
        .claim_batch("w", 3, Duration::from_millis(50), false)
        .await
        .unwrap();
    store.claim_batch("w", 2, LONG_LEASE, false).await.unwrap();
    for e in &short {
        wait_until_lease_ended(db.pool(), e.id).await;
    }
    // Each pass recovers at most its limit: 2, then the last one, then nothing.
    let mut requeued = Vec::new();
    for limit in [2, 100, 100] {
        let counts = store.recover_expired(limit, RecoveryBackoff::NONE).await;
        requeued.push(counts.unwrap().requeued);
    }
    assert_eq!(requeued, [2, 1, 0]);
    assert_eq!(count_status(db.pool(), "pending").await, 3);
    assert_eq!(count_status(db.pool(), "processing").await, 2);
}

#[tokio::test]
async fn release_hands_back_without_charging_the_attempt() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_one(&db, "unstarted", 1).await;
    let e = store
        .claim_batch("w", 10, LONG_LEASE, false)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        store.release_if_owned(e.claim()).await.unwrap(),
        Ownership::Owned
    );
    let row = row_state(db.pool(), e.id).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.attempts,
            row.claim_version,
            row.lease_live
        ),
        ("pending", Some(0), Some(1), None)
    );
    // With max_attempts = 1 the event can still be delivered: the release did not use it up.
    let again = store
        .claim_batch("w", 10, LONG_LEASE, false)
        .await
        .unwrap()
        .remove(0);
    assert_eq!((again.attempts, again.claim_version), (1, 2));
    assert_eq!(
        store.release_if_owned(e.claim()).await.unwrap(),
        Ownership::Lost,
        "the old claim cannot release"
    );
    assert_eq!(
        store.complete_if_owned(again.claim()).await.unwrap(),
        Ownership::Owned
    );
}

/// Recovery and a late completion race on rows whose leases run out right now. Whichever wins,
/// each row ends in one consistent state, and exactly one side was told it won.
#[tokio::test]
async fn recovery_racing_a_late_completion_has_exactly_one_winner_per_row() {
    const ROUNDS: usize = 20;
    const ROWS_PER_ROUND: usize = 10;
    let db = TestDatabase::with_pool_size(16).await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "race", ROUNDS * ROWS_PER_ROUND).await;

    let (mut completed_wins, mut recovery_wins) = (0_u64, 0_u64);
    let mut completion_results = Vec::new();
    for round in 0..ROUNDS {
        let lease = Duration::from_millis(40);
        let claimed = store
            .claim_batch("late-worker", ROWS_PER_ROUND as i64, lease, false)
            .await
            .unwrap();
        assert_eq!(claimed.len(), ROWS_PER_ROUND);
        // Start both sides around the moment the leases end, staggered a little per round. A
        // fixed sleep on purpose: the subject is timing both sides against the lease's end, not
        // waiting for a condition (the lease may or may not have ended when they run).
        tokio::time::sleep(Duration::from_millis(22 + (round as u64 % 5) * 5)).await;
        let completions = join_all(claimed.iter().map(|e| {
            let store = store.clone();
            let claim = e.claim();
            async move { (claim, store.complete_if_owned(claim).await.unwrap()) }
        }));
        let recovery = async {
            let mut counts = RecoveryCounts::default();
            for _ in 0..5 {
                let c = store
                    .recover_expired(1000, RecoveryBackoff::NONE)
                    .await
                    .unwrap();
                counts.requeued += c.requeued;
                counts.exhausted += c.exhausted;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            counts
        };
        let (results, mut recovered) = tokio::join!(completions, recovery);
        // Rows whose completion lost because the lease had just expired are recovered now, so
        // every row ends settled.
        let late = store
            .recover_expired(1000, RecoveryBackoff::NONE)
            .await
            .unwrap();
        recovered.requeued += late.requeued;
        assert_eq!(recovered.exhausted, 0);

        let owned = results
            .iter()
            .filter(|(_, o)| *o == Ownership::Owned)
            .count() as u64;
        assert_eq!(
            owned + recovered.requeued,
            ROWS_PER_ROUND as u64,
            "each row has exactly one winner (round {round})"
        );
        completed_wins += owned;
        recovery_wins += recovered.requeued;
        completion_results.extend(results);
        // Send the recovered rows out of the way for the next round.
        sqlx::query("UPDATE outbox_queue SET status = 'exhausted', exhausted_at = now() WHERE status = 'pending' AND lease_expiries > 0")
            .execute(db.pool())
            .await
            .unwrap();
    }
    println!(
        "recovery vs late completion: completion won {completed_wins}, recovery won {recovery_wins}"
    );

    for (claim, outcome) in completion_results {
        let row = row_state(db.pool(), claim.id).await;
        match outcome {
            // Delivered: the completion deleted the queue row while the claim was current, so
            // recovery cannot have requeued it first (the completion would have been lost)
            // nor after (there is no row left to recover).
            Ownership::Owned => assert_eq!(
                (row.status.as_str(), row.lease_expiries, row.claim_version),
                ("delivered", None, None),
                "completion won row {}, so recovery must not have touched it",
                claim.id
            ),
            Ownership::Lost => assert_eq!(
                (row.status.as_str(), row.lease_expiries, row.claim_version),
                ("exhausted", Some(1), Some(1)),
                "recovery won row {} (moved aside above), so it must not be delivered",
                claim.id
            ),
        }
    }
    assert_eq!(count_status(db.pool(), "processing").await, 0);
    assert_eq!(count_status(db.pool(), "pending").await, 0);
}

/// The purge deletes delivered events enqueued more than the retention ago (the retention counts
/// from the enqueue: the event table keeps no delivery time), at most its limit at a time, and
/// never an event that still has its queue row (pending, processing, exhausted), however old.
#[tokio::test]
async fn purge_deletes_only_delivered_rows_past_retention_in_bounded_batches() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "purge", 9).await;
    let claimed = store.claim_batch("w", 7, LONG_LEASE, false).await.unwrap();
    let claims: Vec<_> = claimed.iter().map(|e| e.claim()).collect();
    assert!(
        store
            .complete_many_if_owned(&claims[..5])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .fail_if_owned(claims[5], "poison", Duration::ZERO, true)
            .await
            .unwrap(),
        FailOutcome::Exhausted
    );
    // Enqueued two hours ago: three of the delivered events, and every event not delivered.
    sqlx::query(
        "UPDATE outbox SET created_at = now() - interval '2 hours'
         WHERE id IN (SELECT e.id FROM outbox e
                      WHERE NOT EXISTS (SELECT 1 FROM outbox_queue q WHERE q.id = e.id)
                      ORDER BY e.id LIMIT 3)
            OR id IN (SELECT id FROM outbox_queue)",
    )
    .execute(db.pool())
    .await
    .unwrap();

    assert_eq!(
        store
            .purge_delivered(Duration::from_secs(3600), 2)
            .await
            .unwrap(),
        2,
        "bounded by the limit"
    );
    assert_eq!(
        store
            .purge_delivered(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .purge_delivered(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0,
        "younger delivered events stay, and so do the open and exhausted ones, however old"
    );
    let counts = sqlx::query(
        "SELECT coalesce(q.status, 'delivered') AS status, count(*) AS n
         FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get::<String, _>("status"), r.get::<i64, _>("n")))
    .collect::<Vec<_>>();
    assert_eq!(
        counts,
        [
            ("delivered".to_owned(), 2),
            ("exhausted".to_owned(), 1),
            ("pending".to_owned(), 2),
            ("processing".to_owned(), 1)
        ]
    );
    assert_eq!(
        all_rows(db.pool()).await.len(),
        6,
        "no queue row lost its event"
    );

    // A purged key is free again: the event id is the same, since it is derived from the key.
    let purged_key: Option<String> =
        sqlx::query_scalar("SELECT 'purge-' || g FROM generate_series(0, 8) g WHERE NOT EXISTS (SELECT 1 FROM outbox WHERE operation_key = 'purge-' || g) LIMIT 1")
            .fetch_optional(db.pool())
            .await
            .unwrap();
    let key = purged_key.expect("a purged key");
    let mut tx = db.pool().begin().await.unwrap();
    let id = Note {
        text: "again".into(),
    }
    .enqueue(&mut tx, &key)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(id, event_id_for("outbox", &key));
    assert_eq!(count_status(db.pool(), "pending").await, 3);
}

#[tokio::test]
async fn stats_count_each_status_and_age_the_oldest_pending_event() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let empty = store.stats().await.unwrap();
    assert_eq!(
        (
            empty.pending,
            empty.processing,
            empty.delivered,
            empty.exhausted,
            empty.oldest_pending_age
        ),
        (0, 0, 0, 0, None)
    );

    enqueue_notes(db.pool(), "stats", 10).await;
    let claimed = store.claim_batch("w", 6, LONG_LEASE, false).await.unwrap();
    store.complete_if_owned(claimed[0].claim()).await.unwrap();
    store.complete_if_owned(claimed[1].claim()).await.unwrap();
    store
        .fail_if_owned(claimed[2].claim(), "bad", Duration::ZERO, true)
        .await
        .unwrap();
    sqlx::query("UPDATE outbox_queue SET available_at = now() - interval '1 hour' WHERE id = (SELECT min(id) FROM outbox_queue WHERE status = 'pending')")
        .execute(db.pool())
        .await
        .unwrap();

    let stats = store.stats().await.unwrap();
    assert_eq!(
        (
            stats.pending,
            stats.processing,
            stats.delivered,
            stats.exhausted
        ),
        (4, 3, 2, 1)
    );
    let age = stats.oldest_pending_age.unwrap().as_secs_f64();
    assert!((3600.0..3660.0).contains(&age), "oldest pending age {age}s");

    // Pending only in the future: nothing is late.
    sqlx::query(
        "UPDATE outbox_queue SET available_at = now() + interval '1 hour' WHERE status = 'pending'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(
        store.stats().await.unwrap().oldest_pending_age,
        Some(Duration::ZERO)
    );
}

/// Wait until the lease of row `id` has ended by the database clock (the subject of the tests
/// that use it is what happens after a lease ends, and only the database's `now()` decides that).
async fn wait_until_lease_ended(pool: &sqlx::PgPool, id: i64) {
    const BOUND: Duration = Duration::from_secs(30);
    let started = std::time::Instant::now();
    loop {
        let ended: bool = sqlx::query_scalar(
            "SELECT coalesce(lease_until <= now(), true) FROM outbox_queue WHERE id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
        if ended {
            return;
        }
        assert!(
            started.elapsed() < BOUND,
            "the lease of row {id} did not end within {BOUND:?} by the database clock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One worker's claim of a row (v1) ran out and was recovered, and the same worker claimed the
/// row again (v2). A batch holding both claims must answer per (id, claim_version): v1 is lost,
/// v2 is owned. Deciding by row id alone reports v1 owned, and its handler is never told.
#[tokio::test]
async fn a_batch_holding_a_stale_and_a_fresh_claim_of_one_row_answers_per_claim() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "reclaimed", 2).await;

    // Both rows: claimed as v1 with a short lease, recovered, re-claimed as v2 by the same worker.
    let v1 = store
        .claim_batch("same-worker", 2, Duration::from_millis(100), false)
        .await
        .unwrap();
    for e in &v1 {
        wait_until_lease_ended(db.pool(), e.id).await;
    }
    assert_eq!(
        store
            .recover_expired(100, RecoveryBackoff::NONE)
            .await
            .unwrap()
            .requeued,
        2
    );
    let v2 = store
        .claim_batch("same-worker", 2, LONG_LEASE, false)
        .await
        .unwrap();
    let pairs: Vec<_> = v1.iter().zip(&v2).collect();
    for (old, new) in &pairs {
        assert_eq!(
            (new.id, old.claim_version, new.claim_version),
            (old.id, 1, 2)
        );
    }
    let (row_a, row_b) = (pairs[0], pairs[1]);

    // Renewal: the fresh claim is renewed, the stale one reported lost, whichever order.
    for batch in [
        [row_a.0.claim(), row_a.1.claim()],
        [row_a.1.claim(), row_a.0.claim()],
    ] {
        assert_eq!(
            store.renew_many_if_owned(&batch, LONG_LEASE).await.unwrap(),
            vec![row_a.0.claim()],
            "renew_many: the v1 claim is lost, the v2 claim owned"
        );
    }

    // Completion by marking delivered.
    assert_eq!(
        store
            .complete_many_if_owned(&[row_a.0.claim(), row_a.1.claim()])
            .await
            .unwrap(),
        vec![row_a.0.claim()],
        "complete_many: the v1 claim is lost, the v2 claim completed"
    );
    let done = row_state(db.pool(), row_a.0.id).await;
    assert_eq!(
        (done.status.as_str(), done.claim_version),
        ("delivered", None)
    );

    // Completion by deleting.
    assert_eq!(
        store
            .complete_many_by_deleting_if_owned(&[row_b.1.claim(), row_b.0.claim()])
            .await
            .unwrap(),
        vec![row_b.0.claim()],
        "complete_many_delete: the v1 claim is lost, the v2 claim completed"
    );
    assert_eq!(
        all_rows(db.pool()).await.len(),
        1,
        "row b was deleted by its v2 claim"
    );
}

/// A completion whose answer was lost is retried; the retry finds nothing left to complete and
/// reports the claim lost. `completed_earlier` tells that case apart from a real loss: the
/// event's queue row is gone (the event kept, or with retention zero deleted too), so the event
/// is delivered. Which claim delivered it cannot be told any more (the event keeps no claim
/// version): a stale claim of a delivered event is reported settled too, while a claim whose
/// queue row is still there (running under a later claim, pending again, exhausted) is not.
#[tokio::test]
async fn a_completion_run_twice_is_recognised_as_completed_earlier() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    enqueue_notes(db.pool(), "twice", 4).await;
    let claims: Vec<_> = store
        .claim_batch("w", 4, LONG_LEASE, false)
        .await
        .unwrap()
        .iter()
        .map(|e| e.claim())
        .collect();
    let (marked, deleted, running, failed) = (claims[0], claims[1], claims[2], claims[3]);

    // Completing, twice: the second run finds no queue row.
    assert!(
        store
            .complete_many_if_owned(&[marked])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.complete_many_if_owned(&[marked]).await.unwrap(),
        vec![marked]
    );
    // Deleting, twice: the second run finds neither row.
    assert!(
        store
            .complete_many_by_deleting_if_owned(&[deleted])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .complete_many_by_deleting_if_owned(&[deleted])
            .await
            .unwrap(),
        vec![deleted]
    );
    assert_eq!(
        store
            .fail_if_owned(failed, "poison", Duration::ZERO, true)
            .await
            .unwrap(),
        FailOutcome::Exhausted
    );

    let older = |c: outbox_runtime::store::Claim| outbox_runtime::store::Claim {
        id: c.id,
        claim_version: c.claim_version - 1,
    };
    assert_eq!(
        store
            .completed_earlier(&[
                marked,
                deleted,
                running,
                older(running),
                failed,
                older(marked)
            ])
            .await
            .unwrap(),
        vec![marked, deleted, older(marked)],
        "settled: the queue row is gone (kept or deleted event); not settled: a running row, \
         under this claim or a later one, or an exhausted one"
    );
    assert!(store.completed_earlier(&[]).await.unwrap().is_empty());
}
