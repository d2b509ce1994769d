//! Soak: four worker processes deliver while events are being enqueued, and a random worker is
//! SIGKILLed and restarted every second or two. Zero events may be lost; duplicates (at least
//! once) are counted and printed.
//!
//! Size: `OUTBOX_SOAK_EVENTS` (default 50,000, about two minutes on 2 cores; smaller values
//! make a quick local run).

mod worker_support;

use std::time::{Duration, Instant};

use rand::Rng;
use worker_support::*;

fn worker_args() -> Vec<&'static str> {
    vec![
        "--concurrency",
        "16",
        "--batch",
        "16",
        "--lease-ms",
        "2000",
        "--poll-ms",
        "500",
        "--maintenance-ms",
        "500",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_four_workers_with_random_sigkills_loses_nothing() {
    let total: i64 = std::env::var("OUTBOX_SOAK_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let db = database().await;
    let pool = db.pool().clone();
    let url = db.url();
    let started = Instant::now();

    let enqueue_pool = pool.clone();
    let enqueuer = tokio::spawn(async move { enqueue_jobs(&enqueue_pool, 0, total, true).await });

    let mut generation = [0u32; 4];
    let mut workers: Vec<WorkerProcess> = (0..4)
        .map(|i| WorkerProcess::spawn(&url, &format!("soak-{i}-0"), &worker_args()))
        .collect();
    let mut kills = 0u32;
    const MAX_KILLS: u32 = 60;
    loop {
        let delivered = count_status(&pool, "delivered").await;
        if delivered >= total || kills >= MAX_KILLS {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(400),
            "soak did not finish killing within 400 s ({delivered} delivered)"
        );
        let (pause_ms, victim) = {
            let mut rng = rand::rng();
            (rng.random_range(800..2500u64), rng.random_range(0..4usize))
        };
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        workers[victim].kill();
        kills += 1;
        generation[victim] += 1;
        workers[victim] = WorkerProcess::spawn(
            &url,
            &format!("soak-{victim}-{}", generation[victim]),
            &worker_args(),
        );
    }
    enqueuer.await.unwrap();
    wait_until(
        Duration::from_secs(300),
        "every event is delivered",
        || async { count_status(&pool, "delivered").await == total },
    )
    .await;
    let elapsed = started.elapsed();
    for w in &mut workers {
        w.wait_line("ready", Duration::from_secs(60)).await;
        w.terminate();
    }
    for w in &mut workers {
        assert!(
            w.wait_exit(Duration::from_secs(60)).await,
            "{} shuts down cleanly",
            w.name
        );
    }

    // An event that is not delivered keeps its queue row.
    let not_delivered: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_queue")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(not_delivered, 0);
    let (ok_deliveries, distinct_ok): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT event_id) FROM receiver_log WHERE outcome = 'ok'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let lost: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox o WHERE NOT EXISTS (SELECT 1 FROM receiver_effects e WHERE e.event_id = o.event_id)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    // Delivered events keep no state: what their delivering claims had, the receiver logged.
    let (recovered, max_attempts): (i64, i32) = sqlx::query_as(
        "SELECT count(DISTINCT event_id) FILTER (WHERE lease_expiries > 0), coalesce(max(attempt), 0)
         FROM receiver_log WHERE outcome = 'ok'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let duplicates = ok_deliveries - distinct_ok;
    println!(
        "soak: {total} events, 4 workers, {kills} SIGKILLs, {elapsed:.1?}: lost {lost}, duplicate deliveries {duplicates}, \
         events recovered after a lease {recovered}, most attempts of one event {max_attempts}"
    );
    assert_eq!(lost, 0, "every event reached the receiver");
    assert_eq!(distinct_ok, total);
    assert_eq!(effects(&pool).await, total, "one effect per event");
    assert!(kills > 0);
}
