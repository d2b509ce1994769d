//! Wakes the claimer when an enqueue commits: LISTEN on the table's channel, with reconnection
//! when the connection drops. A notification is only a hint (polling still runs): after every
//! (re)connect the claimer is woken at once, because notifications sent while disconnected are
//! gone.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{PgPool, Postgres};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::events::WorkerEvent;
use super::sessions::SessionRole;

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The `application_name` of a worker's LISTEN session, so operators (and tests) can find it
/// in `pg_stat_activity` (see [`super::sessions`]).
pub fn application_name(worker: &str) -> String {
    super::sessions::application_name(SessionRole::Listener, worker)
}

pub(crate) struct Listener {
    pub(crate) shared: Arc<Shared>,
}

impl Listener {
    pub(crate) async fn run(self, stop: CancellationToken) {
        let shared = &self.shared;
        let channel = crate::store::notify_channel(&shared.config.table);
        // A pool of one connection of its own, named for pg_stat_activity; it never takes a
        // connection from the worker's pool.
        let options = shared.sessions.connect_options(SessionRole::Listener);
        let pool: PgPool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        let mut backoff = Duration::from_millis(100);
        'reconnect: loop {
            let mut listener = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                connected = connect(&pool, &channel) => match connected {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "LISTEN connection failed; polling meanwhile");
                        tokio::select! {
                            () = stop.cancelled() => break,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue 'reconnect;
                    }
                },
            };
            backoff = Duration::from_millis(100);
            tracing::debug!(%channel, "listening for enqueue notifications");
            shared.hook.emit(|| WorkerEvent::ListenerConnected);
            shared.wake.notify_one();
            loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => break 'reconnect,
                    received = listener.try_recv() => match received {
                        Ok(Some(_)) => shared.wake.notify_one(),
                        Ok(None) => {
                            tracing::warn!("LISTEN connection lost; reconnecting");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                            break;
                        }
                    }
                }
            }
            shared.hook.emit(|| WorkerEvent::ListenerLost);
            drop(listener);
            // Poll at once: whatever was enqueued while we were deaf would otherwise wait.
            shared.wake.notify_one();
        }
        pool.close().await;
    }
}

async fn connect(pool: &sqlx::Pool<Postgres>, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // Reconnection is ours (so we know it happened and can poll right after).
    listener.eager_reconnect(false);
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_listen_session_is_named_like_every_other_session_of_the_worker() {
        assert_eq!(
            super::application_name("billing-1"),
            "outbox-listener billing-1"
        );
    }
}
