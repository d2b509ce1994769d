//! The producer side made fast by default: transactions that wake the workers after their own
//! commit.
//!
//! [`Event::enqueue`](crate::Event::enqueue) on a plain `sqlx::Transaction` queues a `NOTIFY` inside the business
//! transaction. That is always correct, but PostgreSQL makes every notifying commit hold a
//! database-wide lock until it is flushed, so notifying transactions commit one at a time. A
//! [`Waker`] moves the notification after the commit, but only for the service that remembers to
//! call it. A [`Producer`] does it for you: its transactions enqueue without the in-transaction
//! notification and, once [`ProducerTransaction::commit`] has committed, wake the workers of
//! every table they wrote to. A transaction that rolls back (or is dropped) wakes nobody.
//!
//! The wake-up is sent by a background task after `commit` returns, so it needs the runtime to
//! keep running for a moment. Before a process ends (the end of `main`, after the server's
//! graceful shutdown; a command-line tool or batch job after its last commit), call
//! [`Producer::close`]: it waits until the wake-ups asked for have gone out. Without it the
//! last commits are found by the workers' polling instead, a poll interval later, and each
//! wake-up not sent is counted (`outbox_wake_ups_unsent_total`, reason `abandoned`; see
//! [`crate::waker`]).
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool, event: impl outbox_runtime::event::CurrentEvent) -> outbox_runtime::error::Result<()> {
//! use outbox_runtime::producer::Producer;
//!
//! let producer = Producer::new(pool); // once, at start-up; clone it freely
//! let mut tx = producer.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'confirmed' WHERE id = $1")
//!     .bind(42_i64)
//!     .execute(&mut *tx) // the business change, as on a sqlx transaction
//!     .await?;
//! tx.enqueue(&event, "confirm-order/42").await?;
//! tx.commit().await?; // commits, then wakes the workers
//!
//! producer.close().await; // at the end of the process: the last wake-ups go out
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::error::Result;
use crate::event::{CurrentEvent, enqueue_typed};
use crate::store::EnqueueOptions;
use crate::waker::Waker;

/// Begins business transactions whose enqueued events wake the workers after commit. Cheap to
/// clone; keep one per service and pool.
#[derive(Clone)]
pub struct Producer {
    pool: PgPool,
    /// One waker per outbox table written to, created on first use (its background task lives
    /// as long as the last clone of this producer).
    wakers: Arc<Mutex<HashMap<&'static str, Waker>>>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tables: Vec<&str> = self
            .wakers
            .lock()
            .map(|w| w.keys().copied().collect())
            .unwrap_or_default();
        f.debug_struct("Producer")
            .field("tables_woken", &tables)
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// A producer over `pool`: the business transactions are begun on it, and the wake-ups go
    /// out on one session per table opened with its settings (see [`crate::waker`]).
    pub fn new(pool: PgPool) -> Self {
        Producer {
            pool,
            wakers: Arc::default(),
        }
    }

    /// The pool the transactions are begun on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Begin a business transaction on the producer's pool.
    pub async fn begin(&self) -> Result<ProducerTransaction> {
        let tx = self.pool.begin().await?;
        Ok(self.adopt(tx))
    }

    /// Take over a transaction begun elsewhere (another isolation level, a `SET LOCAL`, a
    /// transaction a framework opened), so that its events wake the workers after its commit.
    pub fn adopt(&self, tx: Transaction<'static, Postgres>) -> ProducerTransaction {
        ProducerTransaction {
            tx,
            producer: self.clone(),
            tables: Vec::new(),
        }
    }

    /// Send the wake-ups asked for so far and wait until each has been answered (sent, or
    /// given up and counted: see [`Waker::flush`]), then let go of this handle. Call it when
    /// the service is done committing, before its runtime ends: a process that exits right
    /// after its last `commit` otherwise ends the waker's task before the notification is out,
    /// and the workers see that commit only at their next poll.
    ///
    /// It waits at most the pool's acquire timeout (the time the service allows for reaching
    /// the database); a wake-up still unsent then is counted when the runtime ends
    /// (`outbox_wake_ups_unsent_total`, reason `abandoned`). Clones of this producer stay
    /// usable: it answers every wake-up asked for before the call, whichever clone asked.
    pub async fn close(self) {
        let wakers: Vec<(&'static str, Waker)> = self
            .wakers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(table, waker)| (*table, waker.clone()))
            .collect();
        let timeout = self.pool.options().get_acquire_timeout();
        let flushed = futures::future::join_all(
            wakers
                .iter()
                .map(|(table, waker)| async move { (*table, waker.flush(timeout).await) }),
        )
        .await;
        for (table, answered) in flushed {
            if !answered {
                tracing::warn!(
                    table,
                    ?timeout,
                    "the producer closed before its last wake-up was answered; the workers' polling picks the events up"
                );
            }
        }
    }

    fn waker_for(&self, table: &'static str) -> Result<Waker> {
        let mut wakers = self
            .wakers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(waker) = wakers.get(table) {
            return Ok(waker.clone());
        }
        let waker = Waker::new(self.pool.clone(), table)?;
        wakers.insert(table, waker.clone());
        Ok(waker)
    }
}

/// A business transaction of a [`Producer`]. It dereferences to the connection, so business SQL
/// runs on it exactly as on a `sqlx::Transaction` (`.execute(&mut *tx)`); events go in with
/// [`enqueue`](Self::enqueue), and [`commit`](Self::commit) wakes the workers afterwards.
/// Dropping it without committing rolls back, like a `sqlx::Transaction`.
pub struct ProducerTransaction {
    tx: Transaction<'static, Postgres>,
    producer: Producer,
    /// The outbox tables this transaction enqueued into (few: a linear scan is fine).
    tables: Vec<&'static str>,
}

impl std::fmt::Debug for ProducerTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerTransaction")
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

impl ProducerTransaction {
    /// Write `event` in this transaction under `operation_key` (see [`Event::enqueue`] for keys,
    /// idempotency and errors) without an in-transaction notification; the workers are woken
    /// after [`commit`](Self::commit).
    ///
    /// [`Event::enqueue`]: crate::Event::enqueue
    pub async fn enqueue<E: CurrentEvent>(
        &mut self,
        event: &E,
        operation_key: &str,
    ) -> Result<Uuid> {
        self.enqueue_with(event, operation_key, &EnqueueOptions::default())
            .await
    }

    /// [`enqueue`](Self::enqueue) with options (limits, headers, delay, `trace_baggage`). The
    /// options' `notify` is ignored: the wake-up is always sent after commit instead. The
    /// current trace context is stored with the event as by
    /// [`Event::enqueue_with`](crate::Event::enqueue_with) (feature `opentelemetry`).
    pub async fn enqueue_with<E: CurrentEvent>(
        &mut self,
        event: &E,
        operation_key: &str,
        options: &EnqueueOptions,
    ) -> Result<Uuid> {
        let options = EnqueueOptions {
            notify: false,
            ..options.clone()
        };
        // The typed path: the trace context is captured as by `Event::enqueue`.
        let id = enqueue_typed(&mut self.tx, event, operation_key, &options).await?;
        if !self.tables.contains(&E::TABLE) {
            // Validates the table name once and starts its waker before the commit, so the
            // commit itself cannot fail for a reason that has nothing to do with the database.
            self.producer.waker_for(E::TABLE)?;
            self.tables.push(E::TABLE);
        }
        Ok(id)
    }

    /// The underlying sqlx transaction, for code that takes `&mut Transaction` (an
    /// [`Event::enqueue`](crate::Event::enqueue) made here notifies inside the transaction, as it
    /// does anywhere else).
    pub fn transaction(&mut self) -> &mut Transaction<'static, Postgres> {
        &mut self.tx
    }

    /// Commit, then wake the workers of every table this transaction enqueued into. The wake-up
    /// never blocks and never fails (see [`Waker::wake`]); a failed commit wakes nobody.
    pub async fn commit(self) -> Result<()> {
        let ProducerTransaction {
            tx,
            producer,
            tables,
        } = self;
        tx.commit().await?;
        for table in tables {
            // Created at enqueue: the lookup cannot fail here.
            if let Ok(waker) = producer.waker_for(table) {
                waker.wake();
            }
        }
        Ok(())
    }

    /// Roll back: nothing enqueued here is stored, and no worker is woken.
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await?;
        Ok(())
    }
}

impl Deref for ProducerTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for ProducerTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}
