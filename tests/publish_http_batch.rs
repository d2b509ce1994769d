//! HTTP batch mode against a real receiver with a batch API: per-item results decide each
//! event's fate, and only the accepted items count as delivered.

mod adapters_support;

use std::time::Duration;

use adapters_support::{
    LEASE, Receiver, Settled, Step, UrlSecrets, captured_logs, claim, closed_port, enqueue,
    exhaust_with_a_worker, row, settle, status, wait_until,
};
use outbox_runtime::delivery::FailureKind;
use outbox_runtime::publish::http::{HttpConfig, HttpPublisher};
use outbox_runtime::testing::TestDatabase;
use outbox_runtime::{Sink, Store};

fn batch_publisher(url: &str, max: usize) -> HttpPublisher {
    let config = HttpConfig {
        batch: Some(max),
        timeout: Duration::from_secs(5),
        ..HttpConfig::default()
    };
    let publisher = HttpPublisher::new(url, config).unwrap();
    publisher.check_lease(LEASE).unwrap();
    publisher
}

#[tokio::test]
async fn only_the_items_the_receiver_accepted_are_delivered() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(db.pool(), vec![]).await;
    let sink = batch_publisher(&receiver.url("/batch"), 10);
    assert_eq!(sink.max_batch(), 10);
    let (ok, _) = enqueue(db.pool(), "ok", 10).await;
    let (reject, _) = enqueue(db.pool(), "reject", 10).await;
    let (busy, _) = enqueue(db.pool(), "busy", 10).await;
    let (omit, _) = enqueue(db.pool(), "omit", 10).await;

    let items = claim(&store, 4).await;
    let results = sink.deliver_batch(&items).await;
    assert_eq!(results.len(), 4);
    for ((event, _), result) in items.iter().zip(&results) {
        let expected_settle = match event.event_id {
            id if id == ok => {
                assert_eq!(result, &Ok(()));
                Settled::Delivered
            }
            id if id == reject => {
                let err = result.as_ref().unwrap_err();
                assert!(err.is_permanent());
                assert!(
                    err.stored_reason().contains("HTTP 422")
                        && err.stored_reason().contains("total_cents must be positive"),
                    "{err}"
                );
                Settled::Exhausted
            }
            id if id == busy => {
                let err = result.as_ref().unwrap_err();
                assert_eq!(
                    err.kind,
                    FailureKind::Retry {
                        after: Some(Duration::from_secs(5))
                    }
                );
                Settled::Rescheduled
            }
            id if id == omit => {
                let err = result.as_ref().unwrap_err();
                assert!(
                    !err.is_permanent()
                        && err.stored_reason().contains("has no result for this event"),
                    "{err}"
                );
                Settled::Rescheduled
            }
            other => panic!("unexpected event {other}"),
        };
        assert_eq!(settle(&store, event, result).await, expected_settle);
    }

    assert_eq!(status(db.pool(), ok).await, "delivered");
    assert_eq!(row(db.pool(), reject).await.status, "exhausted");
    let busy_row = row(db.pool(), busy).await;
    assert_eq!(
        (busy_row.status.as_str(), busy_row.scheduled_delay_ms),
        ("pending", 5000),
        "waits for the item's retry_after"
    );
    let omit_row = row(db.pool(), omit).await;
    assert_eq!(
        (omit_row.status.as_str(), omit_row.ready),
        ("pending", true)
    );

    // What the receiver recorded: one request carrying all four, one effect (the accepted one).
    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    let mut sent: Vec<_> = seen[0].batch.iter().map(|e| e.id).collect();
    let mut expected = vec![ok, reject, busy, omit];
    sent.sort();
    expected.sort();
    assert_eq!(sent, expected);
    assert_eq!(receiver.effects(ok).await, 1);
    assert_eq!(receiver.total_effects().await, 1);
}

/// The receiver applied a whole batch, but the publisher could not record it (say the worker
/// lost the answer): the batch is sent again and the receiver's inbox applies nothing twice.
#[tokio::test]
async fn a_redelivered_batch_applies_each_effect_once() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(db.pool(), vec![]).await;
    let sink = batch_publisher(&receiver.url("/batch"), 10);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(enqueue(db.pool(), "ok", 10).await.0);
    }

    let items = claim(&store, 3).await;
    assert!(sink.deliver_batch(&items).await.iter().all(Result::is_ok));
    for (event, _) in &items {
        let lost = Err(outbox_runtime::HandlerError::retry("answer lost"));
        assert_eq!(settle(&store, event, &lost).await, Settled::Rescheduled);
    }

    let items = claim(&store, 3).await;
    // A delivered event keeps no attempts: the claim that delivers them says which it was.
    assert!(items.iter().all(|(event, _)| event.attempts == 2));
    let results = sink.deliver_batch(&items).await;
    assert!(
        results.iter().all(Result::is_ok),
        "409 per item counts as delivered: {results:?}"
    );
    for ((event, _), result) in items.iter().zip(&results) {
        assert_eq!(settle(&store, event, result).await, Settled::Delivered);
    }

    assert_eq!(receiver.seen().len(), 2);
    for id in ids {
        assert_eq!(receiver.effects(id).await, 1);
        assert_eq!(status(db.pool(), id).await, "delivered");
    }
}

#[tokio::test]
async fn batches_are_split_at_max_batch_and_a_failed_request_fails_every_item() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let maintenance = Step::Respond {
        status: 503,
        body: "maintenance".into(),
        retry_after: Some("2".into()),
    };
    let receiver = Receiver::start(db.pool(), vec![Step::Apply, maintenance]).await;
    let sink = batch_publisher(&receiver.url("/batch"), 2);
    for _ in 0..3 {
        enqueue(db.pool(), "ok", 10).await;
    }

    let items = claim(&store, 3).await;
    let results = sink.deliver_batch(&items).await;

    // First request (two items) applied; the second (one item) hit the maintenance answer.
    assert_eq!(results[0], Ok(()));
    assert_eq!(results[1], Ok(()));
    let err = results[2].as_ref().unwrap_err();
    assert_eq!(
        err.kind,
        FailureKind::Retry {
            after: Some(Duration::from_secs(2))
        }
    );
    assert!(
        err.stored_reason().contains("HTTP 503 Service Unavailable")
            && err.stored_reason().contains("maintenance"),
        "{err}"
    );
    let sizes: Vec<usize> = receiver.seen().iter().map(|s| s.batch.len()).collect();
    assert_eq!(sizes, vec![2, 1]);
    assert_eq!(receiver.total_effects().await, 2);
    for ((event, _), result) in items.iter().zip(&results) {
        settle(&store, event, result).await;
    }
    assert_eq!(row(db.pool(), items[2].0.event_id).await.status, "pending");
}

#[tokio::test]
async fn deliver_in_batch_mode_sends_a_batch_of_one() {
    let db = TestDatabase::new().await;
    let store = Store::new(db.pool().clone());
    let receiver = Receiver::start(db.pool(), vec![]).await;
    let sink = batch_publisher(&receiver.url("/batch"), 10);
    let (rejected, _) = enqueue(db.pool(), "reject", 10).await;

    let (outcome, settled) = adapters_support::attempt(&store, &sink).await;

    assert!(outcome.unwrap_err().is_permanent());
    assert_eq!(settled, Settled::Exhausted);
    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].batch.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![rejected]
    );
    assert_eq!(receiver.total_effects().await, 0);
}

/// Behind a worker, the batch publisher sends chunks of events per request (not one request
/// per event), and the receiver applies each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sends_batches_through_the_batch_publisher() {
    const EVENTS: usize = 25;
    let db = TestDatabase::new().await;
    let receiver = Receiver::start(db.pool(), vec![]).await;
    let sink = batch_publisher(&receiver.url("/batch"), 10);
    let mut ids = Vec::new();
    for _ in 0..EVENTS {
        ids.push(enqueue(db.pool(), "ok", 10).await.0);
    }
    let worker = outbox_runtime::worker::Worker::builder(db.pool().clone(), sink)
        .lease(LEASE)
        .start()
        .await
        .unwrap();
    wait_until(
        "the receiver applied every event",
        Duration::from_secs(60),
        || async { receiver.total_effects().await == EVENTS as i64 },
    )
    .await;
    wait_until("every row delivered", Duration::from_secs(60), || async {
        let mut delivered = 0;
        for id in &ids {
            if status(db.pool(), *id).await == "delivered" {
                delivered += 1;
            }
        }
        delivered == EVENTS
    })
    .await;
    worker.shutdown().await;

    let requests = receiver.seen();
    let items: usize = requests.iter().map(|s| s.batch.len()).sum();
    assert!(
        requests.len() < EVENTS && requests.iter().all(|s| s.batch.len() <= 10),
        "{} requests with sizes {:?}",
        requests.len(),
        requests.iter().map(|s| s.batch.len()).collect::<Vec<_>>()
    );
    assert_eq!(items, EVENTS, "each event sent once");
    for id in &ids {
        assert_eq!(receiver.effects(*id).await, 1, "event {id} applied once");
    }
}

/// In batch mode too: a whole-request error page and an item's `error` that repeat the URL and
/// its secrets (raw and percent-encoded) leave none in `last_error`, the `Debug` output or the
/// logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_answers_repeating_the_url_leak_no_credentials() {
    let logs = captured_logs();
    let db = TestDatabase::new().await;
    let secrets = UrlSecrets::new();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], closed_port()));
    let url = secrets.url("http", &addr.to_string(), "/batch");
    let marker = format!("page-{}", uuid::Uuid::new_v4().simple());
    let body = secrets.body(&url, &marker);
    let _receiver =
        Receiver::start_on(addr.port(), db.pool(), vec![Step::respond(307, &body)]).await;
    let sink = batch_publisher(&url, 10);
    secrets.assert_absent(&format!("{sink:?}"), "Debug of the publisher");

    // The whole request answered with a redirect page.
    let (paged, _) = enqueue(db.pool(), "ok", 1).await;
    let reasons = exhaust_with_a_worker(db.pool(), sink.clone(), &[paged]).await;
    // One item's error repeating the page.
    let (echoed, _) = enqueue(db.pool(), &format!("echo:{body}"), 1).await;
    let reasons2 = exhaust_with_a_worker(db.pool(), sink, &[echoed]).await;

    assert!(
        reasons[0].starts_with("HTTP 307 Temporary Redirect"),
        "{}",
        reasons[0]
    );
    assert!(
        reasons2[0].starts_with("HTTP 422 Unprocessable Entity"),
        "{}",
        reasons2[0]
    );
    for reason in reasons.iter().chain(&reasons2) {
        secrets.assert_absent(reason, "last_error");
        assert!(
            reason.contains(&marker) && reason.contains("[redacted]"),
            "{reason}"
        );
    }
    secrets.assert_absent(&logs.text(), "the log");
}
