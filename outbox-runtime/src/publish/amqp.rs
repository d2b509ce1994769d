//! A [`Sink`] that publishes events to a RabbitMQ exchange (AMQP 0-9-1) with publisher
//! confirms.
//!
//! Each event is one message to the configured exchange, routed by the event name (see
//! [`RoutingKey`]), with:
//!
//! - the [`Envelope`] as a JSON body (`content_type` `application/json`);
//! - `delivery_mode` 2 (persistent): a durable queue keeps it across a broker restart;
//! - the event id as `message_id`, the same on every attempt, so a consumer can drop a
//!   redelivery (for example with [`crate::inbox`]);
//! - the event name as the `type` property, and the metadata of [`metadata_headers`] as AMQP
//!   headers (long strings);
//! - `mandatory` set: a message no queue is bound for comes back instead of vanishing.
//!
//! The channel is in confirm mode. An event counts as delivered only once the broker
//! confirmed it (`basic.ack`): for a persistent message on a durable queue, RabbitMQ confirms
//! after writing it to disk. Everything else is a retry:
//!
//! | what happens | outcome |
//! | --- | --- |
//! | `basic.ack` | delivered |
//! | `basic.ack` after `basic.return` (no queue bound for the routing key) | retry, or permanent with [`Unroutable::Permanent`] |
//! | `basic.nack` (the broker could not take the message) | retry |
//! | no confirm within [`AmqpConfig::confirm_timeout`]; the connection or channel closed; the exchange does not exist | retry |
//!
//! A retry can duplicate a message: the broker may have routed it and lost only the confirm
//! (a connection that died in between). The duplicate has the same `message_id`.
//!
//! # Recovery
//!
//! The publisher holds one connection with one confirm-mode channel, shared by every delivery.
//! When a publish fails on it (a closed connection, a closed channel, a missing confirm), the
//! channel is discarded (and the connection, unless it is still open), the deliveries that were
//! waiting on it fail as retries, and the next delivery opens a new one. An event is never
//! reported delivered without its confirm, so nothing is lost: what was in flight comes back
//! through the worker's retry.
//!
//! While the broker cannot be reached, the publisher does not connect once per delivery: one
//! delivery at a time tries, and after `n` failed attempts in a row the next waits
//! [`AmqpConfig::reconnect`]'s backoff (capped, with jitter; see [`super::reconnect`]).
//! Deliveries that arrive meanwhile fail at once as retries, with the last connection error
//! as their reason, and come back after the worker's own backoff.
//!
//! # Credentials
//!
//! The URL's user and password never appear in an error, a failure reason or this publisher's
//! `Debug` output: the server is shown as `amqp://host:port/vhost`, and client error texts go
//! through a [`Redactor`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::time::Instant;

use super::reconnect::{Reconnect, ReconnectBackoff, Waiting};
use super::redact::{self, Redactor};
use super::{Envelope, metadata_headers, unless_lease_lost};
use crate::delivery::{Delivery, HandlerError};
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::store::ClaimedEvent;

/// The longest exchange name, routing key or message property AMQP carries (a short string).
const MAX_SHORT_STRING: usize = 255;
/// AMQP `delivery_mode` of a message the broker writes to disk on a durable queue.
const PERSISTENT: u8 = 2;
/// The reply code of a message returned because no queue is bound for it.
const NO_ROUTE: u16 = 312;

/// How a message's routing key is made from the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingKey {
    /// The event name (`order.confirmed`): a topic exchange routes on its dot-separated words.
    EventType,
    /// `<prefix>.<event name>` (`acme.order.confirmed`).
    Prefixed(String),
    /// The same key for every event (a fanout or direct exchange, one queue).
    Fixed(String),
}

/// What a message that no queue is bound for (returned as unroutable) means for its event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unroutable {
    /// Retry (the default): a binding is missing, and an operator adds it; meanwhile the
    /// event waits in the outbox instead of vanishing.
    #[default]
    Retry,
    /// The event is exhausted with the reason kept: for exchanges where an unbound routing
    /// key is a mistake of the event, not of the broker's set-up.
    Permanent,
}

/// Settings of an [`AmqpPublisher`].
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    /// The exchange every event is published to (default `outbox`). Letters, digits, `-`, `_`,
    /// `.` and `:`, at most 255 bytes; the empty name is the default exchange (the routing key
    /// then names a queue).
    pub exchange: String,
    /// How the routing key is made (default: the event name).
    pub routing_key: RoutingKey,
    /// How long one delivery may take in all, from (re)connecting to the broker's confirm
    /// (default 5 s). Must be shorter than the worker's lease ([`AmqpPublisher::check_lease`]).
    pub confirm_timeout: Duration,
    /// What an unroutable message means (default: retry).
    pub unroutable: Unroutable,
    /// `Some(kind)`: [`AmqpPublisher::connect`] declares the exchange (durable) with this kind.
    /// `None` (the default): it checks that the exchange exists and fails if not.
    pub declare_exchange: Option<ExchangeKind>,
    /// `Some(n)`: batch mode, up to `n` events published back to back before their confirms
    /// are awaited ([`Sink::deliver_batch`]), each with its own result. `None` (the default):
    /// one event per call.
    pub batch: Option<usize>,
    /// How attempts to reconnect to a broker that went away are spaced (default: 100 ms after
    /// the first failed attempt, doubling up to 5 s, with jitter).
    pub reconnect: ReconnectBackoff,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        AmqpConfig {
            exchange: "outbox".to_owned(),
            routing_key: RoutingKey::EventType,
            confirm_timeout: Duration::from_secs(5),
            unroutable: Unroutable::Retry,
            declare_exchange: None,
            batch: None,
            reconnect: ReconnectBackoff::default(),
        }
    }
}

/// Counts of what a [`AmqpPublisher`] was told by the broker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AmqpStats {
    /// Messages the broker confirmed (`basic.ack`) and routed.
    pub confirmed: u64,
    /// Messages the broker refused (`basic.nack`).
    pub nacked: u64,
    /// Messages returned as unroutable (confirmed, but no queue took them).
    pub returned: u64,
    /// Connections (and channels) opened, the first included.
    pub links_opened: u64,
}

#[derive(Debug, Default)]
struct Counts {
    confirmed: AtomicU64,
    nacked: AtomicU64,
    returned: AtomicU64,
    links_opened: AtomicU64,
}

/// One connection and its confirm-mode channel.
struct Link {
    connection: Connection,
    channel: Channel,
    /// Which link this is: a failure discards the link only if it is still the current one.
    generation: u64,
}

struct Shared {
    /// The server URL with its credentials, to connect with: never shown.
    uri: AMQPUri,
    /// The server URL without credentials.
    shown_server: String,
    /// Removes the URL's credentials from error texts of the client.
    redactor: Redactor,
    config: AmqpConfig,
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
    /// When the next attempt to connect may be made, shared by every delivery.
    reconnect: Reconnect,
    counts: Counts,
}

/// Publishes claimed events to a RabbitMQ exchange; see the [module docs](self).
#[derive(Clone)]
pub struct AmqpPublisher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the URI: only what is safe to log.
        f.debug_struct("AmqpPublisher")
            .field("server", &self.shared.shown_server)
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl AmqpPublisher {
    /// Connect to `url` (for example `amqp://guest:guest@127.0.0.1:5672/%2f`; the vhost is
    /// `/` when the URL has none), open a confirm-mode channel, and check (or, with
    /// [`AmqpConfig::declare_exchange`], declare) the exchange. Fails when the settings are
    /// invalid, no broker answers within the confirm timeout, or the exchange is missing.
    pub async fn connect(url: &str, config: AmqpConfig) -> Result<AmqpPublisher> {
        validate(&config)?;
        let redactor = Redactor::for_url(url);
        let shown_server = redact::shown_url(url);
        let mut uri: AMQPUri = url.parse().map_err(|e: String| {
            Error::Config(format!(
                "`{shown_server}` is not a valid AMQP URL ({}); write it as amqp://user:password@host:5672/vhost",
                redactor.redact(&e)
            ))
        })?;
        // amq-protocol-uri 8 reads the host with `Url::domain`, which is empty for an IPv6
        // address, and then falls back to `localhost`: `amqp://[fd00::5]` would connect to
        // this machine. Take an IP address host as written.
        if let Some(host) = literal_ip_host(url) {
            uri.authority.host = host;
        }
        // The connection attempt itself must not outlast a delivery either.
        if uri.query.connection_timeout.is_none() {
            uri.query.connection_timeout =
                Some(u64::try_from(config.confirm_timeout.as_millis()).unwrap_or(u64::MAX));
        }
        let publisher = AmqpPublisher {
            shared: Arc::new(Shared {
                uri,
                shown_server,
                redactor,
                reconnect: Reconnect::new(config.reconnect),
                config,
                link: tokio::sync::Mutex::new(None),
                counts: Counts::default(),
            }),
        };
        let deadline = Instant::now() + publisher.shared.config.confirm_timeout;
        let link = publisher.link(deadline).await.map_err(|e| {
            Error::Config(format!(
                "{}; start RabbitMQ (`rabbitmq-server`) or fix the URL",
                e.message
            ))
        })?;
        publisher.prepare_exchange(&link.connection).await?;
        Ok(publisher)
    }

    /// The settings of this publisher.
    pub fn config(&self) -> &AmqpConfig {
        &self.shared.config
    }

    /// The server URL without credentials.
    pub fn server(&self) -> &str {
        &self.shared.shown_server
    }

    /// What the broker answered so far.
    pub fn stats(&self) -> AmqpStats {
        let c = &self.shared.counts;
        AmqpStats {
            confirmed: c.confirmed.load(Ordering::Relaxed),
            nacked: c.nacked.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            links_opened: c.links_opened.load(Ordering::Relaxed),
        }
    }

    /// The routing key of an event of this name.
    pub fn routing_key_for(&self, event_type: &str) -> String {
        match &self.shared.config.routing_key {
            RoutingKey::EventType => event_type.to_owned(),
            RoutingKey::Prefixed(prefix) => format!("{prefix}.{event_type}"),
            RoutingKey::Fixed(key) => key.clone(),
        }
    }

    /// Check at start-up that a delivery (reconnecting included) fits in the worker's lease: a
    /// confirm still awaited when the lease ends may be published again by another worker
    /// meanwhile.
    pub fn check_lease(&self, lease: Duration) -> Result<()> {
        let timeout = self.shared.config.confirm_timeout;
        if timeout >= lease {
            return Err(Error::Config(format!(
                "the AMQP confirm timeout ({timeout:?}) must be shorter than the worker's lease ({lease:?}); \
                 lower AmqpConfig::confirm_timeout or lengthen the lease"
            )));
        }
        Ok(())
    }

    /// Close the connection (waiting for the broker's answer at most the confirm timeout).
    /// Deliveries after this open a new one. Call it before the tokio runtime shuts down: the
    /// connection's I/O runs on the runtime, and a connection still open then ends with an
    /// error in the log instead of a clean close.
    pub async fn close(&self) {
        let link = self.shared.link.lock().await.take();
        if let Some(link) = link {
            let close = link.connection.close(200, "publisher closed");
            let _ = tokio::time::timeout(self.shared.config.confirm_timeout, close).await;
        }
    }

    /// Check or declare the exchange, on a channel of its own (a failed passive declare closes
    /// its channel).
    async fn prepare_exchange(&self, connection: &Connection) -> Result<()> {
        let config = &self.shared.config;
        if config.exchange.is_empty() {
            return Ok(()); // the default exchange always exists
        }
        let channel = connection.create_channel().await.map_err(|e| {
            Error::Config(format!(
                "cannot open a channel on {}: {}",
                self.shared.shown_server,
                self.shared.redactor.redact(&e.to_string())
            ))
        })?;
        let (kind, options) = match &config.declare_exchange {
            Some(kind) => (
                kind.clone(),
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
            ),
            None => (
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
            ),
        };
        let declared = channel
            .exchange_declare(&config.exchange, kind, options, FieldTable::default())
            .await;
        let _ = channel.close(200, "exchange checked").await;
        declared.map_err(|e| {
            let text = self.shared.redactor.redact(&e.to_string());
            if config.declare_exchange.is_none() && is_soft(&e, AMQPSoftError::NOTFOUND) {
                Error::Config(format!(
                    "exchange `{}` does not exist on {}; declare it (for example `rabbitmqadmin declare exchange \
                     name={} type=topic durable=true`) or set AmqpConfig::declare_exchange",
                    config.exchange, self.shared.shown_server, config.exchange
                ))
            } else {
                Error::Config(format!(
                    "cannot declare exchange `{}` on {}: {text}",
                    config.exchange, self.shared.shown_server
                ))
            }
        })
    }

    /// The current link, or a new one when there is none or its channel is closed. Waits at
    /// most until `deadline`. Opening one holds the slot's lock, so one attempt is under way
    /// at a time; while the reconnect backoff runs, fails at once without connecting.
    async fn link(&self, deadline: Instant) -> Result<Arc<Link>, HandlerError> {
        let mut slot = tokio::time::timeout_at(deadline, self.shared.link.lock())
            .await
            .map_err(|_| self.no_link_in_time())?;
        if let Some(link) = slot.as_ref() {
            if link.channel.status().connected() {
                return Ok(Arc::clone(link));
            }
        }
        let attempt = self
            .shared
            .reconnect
            .begin()
            .map_err(|waiting| self.backing_off(&waiting))?;
        let previous = slot.take();
        let generation = self.shared.counts.links_opened.load(Ordering::Relaxed) + 1;
        let open = async {
            // Keep a connection that is still open: only its channel was closed (by an error
            // the broker reported on it, such as a missing exchange).
            let connection = match previous {
                Some(link) if link.connection.status().connected() => {
                    match Arc::try_unwrap(link) {
                        Ok(link) => Some(link.connection),
                        // Deliveries still hold the old link; they will fail on their own.
                        Err(_) => None,
                    }
                }
                _ => None,
            };
            let connection = match connection {
                Some(connection) => connection,
                None => Connection::connect_uri(self.shared.uri.clone(), connection_properties())
                    .await
                    .map_err(|e| self.cannot_connect(&e))?,
            };
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| self.cannot_connect(&e))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| self.cannot_connect(&e))?;
            Ok::<_, HandlerError>(Link {
                connection,
                channel,
                generation,
            })
        };
        let opened = tokio::time::timeout_at(deadline, open)
            .await
            .unwrap_or_else(|_| Err(self.no_link_in_time()));
        let link = match opened {
            Ok(link) => {
                attempt.succeeded();
                link
            }
            Err(e) => {
                attempt.failed(&e.message);
                return Err(e);
            }
        };
        self.shared
            .counts
            .links_opened
            .fetch_add(1, Ordering::Relaxed);
        let link = Arc::new(link);
        *slot = Some(Arc::clone(&link));
        Ok(link)
    }

    /// Forget `link` after a failure on it (unless a newer link already replaced it), so the
    /// next delivery opens a new one.
    async fn discard(&self, link: &Link) {
        let mut slot = self.shared.link.lock().await;
        if slot
            .as_ref()
            .is_some_and(|l| l.generation == link.generation)
        {
            *slot = None;
        }
    }

    fn properties(&self, event: &ClaimedEvent, delivery: &Delivery) -> BasicProperties {
        let mut headers = FieldTable::default();
        for (name, value) in metadata_headers(event, delivery) {
            if steers_the_broker(&name) {
                tracing::warn!(event_id = %event.event_id, header = %name,
                    "event header has a name RabbitMQ acts on; not forwarded");
                continue;
            }
            // `metadata_headers` yields names of at most 64 bytes.
            headers.insert(
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(value)),
            );
        }
        let mut properties = BasicProperties::default()
            .with_message_id(ShortString::from(delivery.idempotency_key()))
            .with_delivery_mode(PERSISTENT)
            .with_content_type(ShortString::from("application/json".to_owned()))
            .with_headers(headers);
        if event.event_type.len() <= MAX_SHORT_STRING {
            properties = properties.with_type(ShortString::from(event.event_type.clone()));
        }
        properties
    }

    /// What one message is: its routing key and body, or why it can never be published.
    fn message(&self, event: &ClaimedEvent) -> Result<(String, Vec<u8>), HandlerError> {
        let routing_key = self.routing_key_for(&event.event_type);
        if routing_key.len() > MAX_SHORT_STRING {
            return Err(HandlerError::permanent(format!(
                "the routing key for event `{}` is {} bytes, over AMQP's limit of {MAX_SHORT_STRING}; \
                 use a shorter event name or AmqpConfig::routing_key = RoutingKey::Fixed",
                event.event_type,
                routing_key.len()
            )));
        }
        let body = serde_json::to_vec(&Envelope::of(event)).map_err(|e| {
            HandlerError::permanent(format!("event cannot be encoded as JSON: {e}"))
        })?;
        Ok((routing_key, body))
    }

    /// Publish `items` back to back on one channel, then await each confirm: one result per
    /// item, in order. The whole call ends by `deadline`.
    async fn publish_all(
        &self,
        items: &[(&ClaimedEvent, &Delivery)],
    ) -> Vec<Result<(), HandlerError>> {
        let deadline = Instant::now() + self.shared.config.confirm_timeout;
        let mut results: Vec<Option<Result<(), HandlerError>>> = vec![None; items.len()];
        let mut messages = Vec::with_capacity(items.len());
        for (i, (event, _)) in items.iter().enumerate() {
            match self.message(event) {
                Ok(message) => messages.push(Some(message)),
                Err(e) => {
                    results[i] = Some(Err(e));
                    messages.push(None);
                }
            }
        }
        if messages.iter().all(Option::is_none) {
            return results.into_iter().flatten().collect();
        }
        let link = match self.link(deadline).await {
            Ok(link) => link,
            Err(e) => {
                return results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(e.clone())))
                    .collect();
            }
        };
        let exchange = &self.shared.config.exchange;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        // Publish every message first (pipelined), then collect the confirms.
        let mut pending = Vec::with_capacity(items.len());
        let mut broken = false;
        for (i, ((event, delivery), message)) in items.iter().zip(&messages).enumerate() {
            let Some((routing_key, body)) = message else {
                continue;
            };
            if broken || delivery.lease_lost().is_cancelled() {
                results[i] = Some(Err(if broken {
                    HandlerError::retry(format!(
                        "not published: the channel to {} failed earlier in this batch",
                        self.shared.shown_server
                    ))
                } else {
                    lease_lost()
                }));
                continue;
            }
            let publish = link.channel.basic_publish(
                exchange,
                routing_key,
                options,
                body,
                self.properties(event, delivery),
            );
            match tokio::time::timeout_at(deadline, publish).await {
                Ok(Ok(confirm)) => pending.push((i, routing_key.as_str(), confirm)),
                Ok(Err(e)) => {
                    broken = true;
                    results[i] = Some(Err(self.publish_failure(routing_key, &e)));
                }
                Err(_) => {
                    broken = true;
                    results[i] = Some(Err(self.no_confirm(routing_key)));
                }
            }
        }
        for (i, routing_key, confirm) in pending {
            let outcome = match tokio::time::timeout_at(deadline, confirm).await {
                Err(_) => {
                    broken = true;
                    Err(self.no_confirm(routing_key))
                }
                Ok(Err(e)) => {
                    broken = true;
                    Err(self.publish_failure(routing_key, &e))
                }
                Ok(Ok(confirmation)) => self.confirmed(routing_key, confirmation),
            };
            results[i] = Some(outcome);
        }
        if broken {
            // A channel that missed a confirm or failed is not trusted again.
            self.discard(&link).await;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(HandlerError::retry("no result for this event"))))
            .collect()
    }

    /// The outcome of a confirm that arrived.
    fn confirmed(&self, routing_key: &str, confirmation: Confirmation) -> Result<(), HandlerError> {
        let counts = &self.shared.counts;
        let exchange = &self.shared.config.exchange;
        match confirmation {
            Confirmation::Ack(None) => {
                counts.confirmed.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                counts.returned.fetch_add(1, Ordering::Relaxed);
                let reason = format!(
                    "RabbitMQ returned the message: {} {} (exchange `{exchange}`, routing key `{routing_key}`)",
                    returned.reply_code, returned.reply_text
                );
                if returned.reply_code != NO_ROUTE {
                    return Err(HandlerError::retry(reason));
                }
                let reason = format!("{reason}; no queue is bound for it: bind one");
                Err(match self.shared.config.unroutable {
                    Unroutable::Retry => HandlerError::retry(reason),
                    Unroutable::Permanent => HandlerError::permanent(reason),
                })
            }
            Confirmation::Nack(None) => {
                counts.nacked.fetch_add(1, Ordering::Relaxed);
                Err(HandlerError::retry(format!(
                    "RabbitMQ refused the message (basic.nack) on exchange `{exchange}`, routing key \
                     `{routing_key}`: it could not take it (a queue at its length limit with \
                     reject-publish, or an internal error)"
                )))
            }
            Confirmation::NotRequested => Err(HandlerError::retry(
                "the channel is not in confirm mode; the message may or may not have been routed",
            )),
        }
    }

    fn publish_failure(&self, routing_key: &str, e: &lapin::Error) -> HandlerError {
        let exchange = &self.shared.config.exchange;
        if is_soft(e, AMQPSoftError::NOTFOUND) {
            return HandlerError::retry(format!(
                "exchange `{exchange}` does not exist on {}; declare it (the event waits meanwhile)",
                self.shared.shown_server
            ));
        }
        HandlerError::retry(format!(
            "publishing to exchange `{exchange}` with routing key `{routing_key}` on {} failed: {}; \
             the broker may have routed it, and the retry carries the same message_id",
            self.shared.shown_server,
            self.shared.redactor.redact(&e.to_string())
        ))
    }

    fn no_confirm(&self, routing_key: &str) -> HandlerError {
        HandlerError::retry(format!(
            "no confirm from {} for exchange `{}`, routing key `{routing_key}`, within {:?}; the broker \
             may have routed it, and the retry carries the same message_id",
            self.shared.shown_server,
            self.shared.config.exchange,
            self.shared.config.confirm_timeout
        ))
    }

    fn cannot_connect(&self, e: &lapin::Error) -> HandlerError {
        HandlerError::retry(format!(
            "cannot connect to RabbitMQ at {}: {}",
            self.shared.shown_server,
            self.shared.redactor.redact(&e.to_string())
        ))
    }

    /// A delivery that came while the reconnect backoff runs: the last attempt's reason (it
    /// names the server), how many failed, and when the next is due.
    fn backing_off(&self, waiting: &Waiting) -> HandlerError {
        HandlerError::retry(waiting.describe())
    }

    fn no_link_in_time(&self) -> HandlerError {
        HandlerError::retry(format!(
            "cannot connect to RabbitMQ at {} within {:?}",
            self.shared.shown_server, self.shared.config.confirm_timeout
        ))
    }
}

impl Sink for AmqpPublisher {
    fn check_lease(&self, lease: Duration) -> Result<()> {
        AmqpPublisher::check_lease(self, lease)
    }

    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(unless_lease_lost(delivery, async move {
            self.publish_all(&[(event, delivery)])
                .await
                .pop()
                .unwrap_or_else(|| Err(HandlerError::retry("no result for this event")))
        }))
    }

    fn max_batch(&self) -> usize {
        self.shared.config.batch.unwrap_or(1)
    }

    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        Box::pin(async move {
            let refs: Vec<(&ClaimedEvent, &Delivery)> = items.iter().map(|(e, d)| (e, d)).collect();
            let chunk = self.shared.config.batch.unwrap_or(1);
            let mut results = Vec::with_capacity(items.len());
            for part in refs.chunks(chunk) {
                results.extend(self.publish_all(part).await);
            }
            results
        })
    }
}

/// lapin connection settings whose tasks run on the current tokio runtime (lapin's own
/// default runtime is not compiled in): use them for consumers' connections too.
pub fn connection_properties() -> ConnectionProperties {
    ConnectionProperties::default()
        .with_connection_name(LongString::from("outbox publisher".to_owned()))
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio)
}

fn lease_lost() -> HandlerError {
    HandlerError::retry(
        "the lease was lost before the message was published; the event will be delivered again",
    )
}

/// Whether `e` is the broker's soft (channel-level) error `kind`.
fn is_soft(e: &lapin::Error, kind: AMQPSoftError) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if *amqp.kind() == AMQPErrorKind::Soft(kind))
}

fn validate(config: &AmqpConfig) -> Result<()> {
    let exchange = &config.exchange;
    if exchange.len() > MAX_SHORT_STRING || !exchange.bytes().all(is_name_byte) {
        return Err(Error::Config(format!(
            "`{exchange}` is not a valid exchange name: use at most {MAX_SHORT_STRING} letters, digits, \
             `-`, `_`, `.` and `:` (for example `outbox` or `acme.events`)"
        )));
    }
    match &config.routing_key {
        RoutingKey::EventType => {}
        RoutingKey::Prefixed(prefix) => {
            if prefix.is_empty()
                || prefix.len() > MAX_SHORT_STRING / 2
                || !prefix.bytes().all(is_name_byte)
            {
                return Err(Error::Config(format!(
                    "`{prefix}` is not a valid routing key prefix: use 1 to {} letters, digits, `-`, `_`, `.` and `:`",
                    MAX_SHORT_STRING / 2
                )));
            }
        }
        RoutingKey::Fixed(key) => {
            if key.len() > MAX_SHORT_STRING || key.bytes().any(|b| b.is_ascii_control()) {
                return Err(Error::Config(format!(
                    "`{key}` is not a valid routing key: at most {MAX_SHORT_STRING} bytes without control characters"
                )));
            }
        }
    }
    if config.confirm_timeout.is_zero() {
        return Err(Error::Config(
            "AmqpConfig::confirm_timeout must be greater than zero".into(),
        ));
    }
    if config.batch == Some(0) {
        return Err(Error::Config(
            "AmqpConfig::batch must be at least 1 (or None for one event per call)".into(),
        ));
    }
    config.reconnect.validate("AmqpConfig::reconnect")
}

/// The host of `url` when it is an IP address (`127.0.0.1`, `[::1]`), as written.
fn literal_ip_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']')?.0,
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    host.parse::<std::net::IpAddr>()
        .ok()
        .map(|ip| ip.to_string())
}

/// Whether RabbitMQ acts on a header of this name: `CC` and `BCC` route the message to more
/// queues, `x-*` headers drive plugins and policies (`x-delay`, `x-match`, ...). A stored
/// header must not change where an event goes.
fn steers_the_broker(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "cc" || lower == "bcc" || lower.starts_with("x-")
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_validated() {
        assert!(validate(&AmqpConfig::default()).is_ok());
        let with = |f: fn(&mut AmqpConfig)| {
            let mut c = AmqpConfig::default();
            f(&mut c);
            validate(&c)
        };
        assert!(
            with(|c| c.exchange = String::new()).is_ok(),
            "the default exchange"
        );
        assert!(with(|c| c.exchange = "acme.events:v2".into()).is_ok());
        for bad in ["a b", "x/y", "é"] {
            let c = AmqpConfig {
                exchange: bad.into(),
                ..AmqpConfig::default()
            };
            let err = validate(&c).unwrap_err().to_string();
            assert!(err.contains("not a valid exchange name"), "{bad}: {err}");
        }
        assert!(with(|c| c.exchange = "x".repeat(256)).is_err());
        assert!(with(|c| c.routing_key = RoutingKey::Prefixed(String::new())).is_err());
        assert!(with(|c| c.routing_key = RoutingKey::Prefixed("acme".into())).is_ok());
        assert!(with(|c| c.routing_key = RoutingKey::Fixed("a\nb".into())).is_err());
        assert!(with(|c| c.routing_key = RoutingKey::Fixed(String::new())).is_ok());
        assert!(with(|c| c.confirm_timeout = Duration::ZERO).is_err());
        assert!(with(|c| c.batch = Some(0)).is_err());
    }

    #[test]
    fn an_ip_address_host_is_kept() {
        assert_eq!(
            literal_ip_host("amqp://u:p@10.0.0.5:5672/%2f").as_deref(),
            Some("10.0.0.5")
        );
        assert_eq!(literal_ip_host("amqp://[::1]:5672").as_deref(), Some("::1"));
        assert_eq!(
            literal_ip_host("amqp://127.0.0.1").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(literal_ip_host("amqp://rabbit:5672/vh"), None);
        // What the client's own parser makes of an IPv6 host, which this works around.
        let parsed: AMQPUri = "amqp://[fd00::5]:5672/%2f".parse().unwrap();
        assert_eq!(parsed.authority.host, "localhost");
        assert_eq!(
            literal_ip_host("amqp://[fd00::5]:5672/%2f").as_deref(),
            Some("fd00::5")
        );
    }

    #[test]
    fn headers_that_steer_the_broker_are_not_forwarded() {
        for name in ["CC", "bcc", "x-delay", "X-Match"] {
            assert!(steers_the_broker(name), "{name}");
        }
        for name in ["traceparent", "tenant", "Outbox-Event-Id", "ccx"] {
            assert!(!steers_the_broker(name), "{name}");
        }
    }
}
