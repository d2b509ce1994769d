//! Enqueue overhead: N business transactions over a few connections, each
//! `UPDATE orders ... WHERE id = $1` plus (or not) the event write, committed one by one.
//!
//! The variants share everything but the event write, so the ratio of each to the baseline is
//! the cost of that write: the typed enqueue with and without its wake-up notification, a
//! hand-written `INSERT` of exactly the rows the typed enqueue writes (the event and its queue
//! row: the same columns and values, computed the same way), and the ceiling's minimal insert.
//! One more variant writes nothing and only adds a round trip (`SELECT 1`): the floor of any
//! event write that is a statement of its own. Each run also counts the WAL the variant wrote
//! per transaction, the server's side of the cost.

use std::time::Instant;

use outbox_runtime::Event;
use outbox_runtime::Producer;
use outbox_runtime::store::EnqueueOptions;
use outbox_runtime::store::enqueue::{event_id_for, payload_fingerprint};
use outbox_runtime::waker::Waker;
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, Transaction};

use crate::db::BenchDb;
use crate::event::{OrderPaid, OrderStep, PayloadShape};
use crate::{BenchResult, ceiling};

/// The business statement (the same text as in every peer of the harness).
const ORDERS_UPDATE: &str = "UPDATE orders SET status = 'paid', updated_at = now() WHERE id = $1";
/// The rows the typed enqueue writes, the event and its queue row, as plain INSERTs in one
/// statement (as the enqueue writes them): no conflict handling, no notification.
const RAW_INSERT: &str = "WITH event AS (INSERT INTO outbox (event_id, operation_key, \
    payload_fingerprint, event_type, event_version, payload, headers) \
    VALUES ($1, $2, $3, $4, $5, $6, '{}') RETURNING id, aggregate_type, aggregate_id) \
    INSERT INTO outbox_queue (id, aggregate_type, aggregate_id, max_attempts) \
    SELECT id, aggregate_type, aggregate_id, 10 FROM event";

/// What each business transaction writes besides its UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Nothing: the business transaction alone.
    Baseline,
    /// `OrderPaid::enqueue_with` with the wake-up notification (the default).
    TypedNotify,
    /// `OrderPaid::enqueue_with` with `notify: false`.
    TypedQuiet,
    /// `notify: false`, and a `Waker` woken after each commit (one coalesced NOTIFY at a time
    /// on a connection of its own).
    TypedWaker,
    /// The API a user reaches for first: a `Producer` transaction (`tx.enqueue`, then
    /// `tx.commit()`, which wakes the workers after the commit): one producer shared by the
    /// clients, as a service keeps one, on a pool with one connection more than clients, for
    /// the wake-ups.
    Producer,
    /// `OrderStep::enqueue_with`, `notify: false`: an event with an aggregate id, a different
    /// aggregate in every transaction, so the per-aggregate producer lock is taken (one more
    /// statement) but never waited for.
    TypedAggregate,
    /// Like `TypedAggregate`, but every transaction writes an event of the SAME aggregate: the
    /// producers take turns (each holds the aggregate's lock from its enqueue to its commit).
    TypedOneAggregate,
    /// No write, one more round trip (`SELECT 1`): what a statement of its own costs the
    /// business transaction before it writes anything.
    ExtraRoundTrip,
    /// A hand-written INSERT of the same outbox rows.
    RawSameRow,
    /// The ceiling's minimal insert (payload only).
    CeilingInsert,
}

impl Variant {
    /// Every variant, in the order they run.
    pub const ALL: [Variant; 10] = [
        Variant::Baseline,
        Variant::TypedNotify,
        Variant::TypedQuiet,
        Variant::TypedWaker,
        Variant::Producer,
        Variant::TypedAggregate,
        Variant::TypedOneAggregate,
        Variant::ExtraRoundTrip,
        Variant::RawSameRow,
        Variant::CeilingInsert,
    ];

    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Baseline => "baseline (UPDATE only)",
            Variant::TypedNotify => "typed enqueue, notify",
            Variant::TypedQuiet => "typed enqueue, no notify",
            Variant::TypedWaker => "typed enqueue, Waker after commit",
            Variant::Producer => "Producer transaction (wakes after commit)",
            Variant::TypedAggregate => "typed enqueue, no notify, aggregate id (lock, no wait)",
            Variant::TypedOneAggregate => "typed enqueue, no notify, one aggregate for all",
            Variant::ExtraRoundTrip => "no write, one more round trip (SELECT 1)",
            Variant::RawSameRow => "raw INSERT of the same rows",
            Variant::CeilingInsert => "ceiling INSERT (payload only)",
        }
    }

    async fn write(
        self,
        tx: &mut Transaction<'_, Postgres>,
        id: i64,
        shape: &PayloadShape,
    ) -> BenchResult<()> {
        let key = format!("pay-{id}");
        match self {
            Variant::Baseline => {}
            Variant::ExtraRoundTrip => {
                sqlx::query(ROUND_TRIP).execute(&mut **tx).await?;
            }
            Variant::TypedNotify => {
                shape
                    .event(id)
                    .enqueue_with(tx, &key, &EnqueueOptions::default())
                    .await?;
            }
            // The producer variant writes through its own transaction type (`client_loop`).
            Variant::TypedQuiet | Variant::TypedWaker | Variant::Producer => {
                let quiet = EnqueueOptions::without_notify();
                shape.event(id).enqueue_with(tx, &key, &quiet).await?;
            }
            Variant::TypedAggregate | Variant::TypedOneAggregate => {
                let quiet = EnqueueOptions::without_notify();
                let event = if self == Variant::TypedAggregate {
                    OrderStep {
                        order_id: id,
                        step: 1,
                    }
                } else {
                    OrderStep {
                        order_id: 0,
                        step: id,
                    }
                };
                event.enqueue_with(tx, &key, &quiet).await?;
            }
            Variant::RawSameRow => {
                let event = shape.event(id);
                let payload = serde_json::to_string(&event)?;
                let fingerprint = payload_fingerprint(
                    OrderPaid::NAME,
                    OrderPaid::VERSION,
                    &serde_json::to_value(&event)?,
                );
                let raw = serde_json::value::RawValue::from_string(payload)?;
                sqlx::query(RAW_INSERT)
                    .bind(event_id_for(OrderPaid::TABLE, &key))
                    .bind(&key)
                    .bind(&fingerprint[..])
                    .bind(OrderPaid::NAME)
                    .bind(OrderPaid::VERSION as i32)
                    .bind(Json(&raw))
                    .execute(&mut **tx)
                    .await?;
            }
            Variant::CeilingInsert => ceiling::insert(tx, &shape.json(id)).await?,
        }
        Ok(())
    }

    /// Rows this variant leaves in the outbox tables after `n` transactions.
    fn expected_rows(self, n: i64) -> i64 {
        if matches!(self, Variant::Baseline | Variant::ExtraRoundTrip) {
            0
        } else {
            n
        }
    }
}

/// The statement of [`Variant::ExtraRoundTrip`].
const ROUND_TRIP: &str = "SELECT 1";

/// Where the server's write-ahead log ends now, in bytes.
const WAL_POSITION: &str = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8";

/// What one run of a variant measured.
#[derive(Debug, Clone, Copy)]
pub struct EnqueueRun {
    /// Business transactions per second.
    pub rate: f64,
    /// WAL bytes written per business transaction (everything the server logged during the
    /// run, divided by the transactions: the variant's rows, the business row, commits, and
    /// a `Waker`'s notifications).
    pub wal_per_tx: f64,
}

const COUNT_EVENTS: &str =
    "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM ceiling_outbox)";

/// Run `n` transactions of `variant` over `clients` connections.
pub async fn run(
    db: &BenchDb,
    variant: Variant,
    n: i64,
    clients: usize,
    shape: &PayloadShape,
) -> BenchResult<EnqueueRun> {
    db.truncate_outboxes().await?;
    db.recreate_orders(n).await?;
    db.settle().await?;
    let connections = u32::try_from(clients).unwrap_or(4) + u32::from(variant == Variant::Producer);
    let pool = db.extra_pool(connections).await?;
    // The waker sends its notifications on a connection of the benchmark's main pool.
    let waker = match variant {
        Variant::TypedWaker => Some(Waker::new(db.pool().clone(), OrderPaid::TABLE)?),
        _ => None,
    };
    // One producer for every client, as a service keeps one (each producer has a waker of
    // its own, so one per client would send a notification stream each).
    let producer = (variant == Variant::Producer).then(|| Producer::new(pool.clone()));
    let wal_before: f64 = sqlx::query_scalar(WAL_POSITION)
        .fetch_one(db.pool())
        .await?;
    let started = Instant::now();
    let mut joins = Vec::with_capacity(clients);
    for client in 0..clients {
        let writer = match &producer {
            Some(producer) => Writer::Producer(producer.clone()),
            None => Writer::Transaction {
                pool: pool.clone(),
                variant,
                waker: waker.clone(),
            },
        };
        let shape = shape.clone();
        joins.push(tokio::spawn(async move {
            client_loop(writer, client, clients, n, shape).await
        }));
    }
    for join in joins {
        join.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    drop(producer);
    pool.close().await;
    let wal_after: f64 = sqlx::query_scalar(WAL_POSITION)
        .fetch_one(db.pool())
        .await?;
    let rows: i64 = sqlx::query_scalar(COUNT_EVENTS)
        .fetch_one(db.pool())
        .await?;
    if rows != variant.expected_rows(n) {
        return Err(format!(
            "{}: {rows} events written, expected {}",
            variant.label(),
            variant.expected_rows(n)
        )
        .into());
    }
    Ok(EnqueueRun {
        rate: n as f64 / secs,
        wal_per_tx: (wal_after - wal_before) / n as f64,
    })
}

/// How a client writes its business transactions.
enum Writer {
    /// Through the producer's transactions.
    Producer(Producer),
    /// On plain sqlx transactions of `pool`, writing what `variant` writes, then waking `waker`.
    Transaction {
        pool: PgPool,
        variant: Variant,
        waker: Option<Waker>,
    },
}

/// Client `k` of `clients` runs ids k+1, k+1+clients, ... (strided: no two clients touch a row).
async fn client_loop(
    writer: Writer,
    client: usize,
    clients: usize,
    n: i64,
    shape: PayloadShape,
) -> BenchResult<()> {
    let (pool, variant, waker) = match writer {
        Writer::Transaction {
            pool,
            variant,
            waker,
        } => (pool, variant, waker),
        Writer::Producer(producer) => {
            for id in (client as i64 + 1..=n).step_by(clients) {
                let mut tx = producer.begin().await?;
                sqlx::query(ORDERS_UPDATE)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.enqueue(&shape.event(id), &format!("pay-{id}")).await?;
                tx.commit().await?;
            }
            return Ok(());
        }
    };
    for id in (client as i64 + 1..=n).step_by(clients) {
        let mut tx = pool.begin().await?;
        sqlx::query(ORDERS_UPDATE)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        variant.write(&mut tx, id, &shape).await?;
        tx.commit().await?;
        if let Some(waker) = &waker {
            waker.wake();
        }
    }
    Ok(())
}
