//! A [`Sink`] that publishes events to NATS JetStream.
//!
//! Each event goes to `<prefix>.<event name>` (see [`subject_for`]) with the event id as
//! `Nats-Msg-Id`. Within the stream's duplicate window, JetStream stores a message id once and
//! answers a repeated publish with a *duplicate* acknowledgement; the publisher counts that as
//! delivered, since the stream has the event. The duplicate window must therefore be longer than
//! the longest time between two attempts of one event (the worker's backoff cap), or a late
//! redelivery is stored a second time: consumers should deduplicate too ([`crate::inbox`]).
//!
//! An event counts as delivered only once the stream acknowledged it. A missing acknowledgement
//! (timeout, broken connection, no stream for the subject) is a retry; a message larger than the
//! server accepts is permanent.
//!
//! The client reconnects by itself after a broken connection, one attempt at a time for all
//! deliveries; a publisher that [`NatsPublisher::connect`]s spaces those attempts with
//! [`NatsConfig::reconnect`] (capped exponential backoff with jitter, see
//! [`super::reconnect`]). Publishes made meanwhile wait in the client until the ack timeout and
//! are retried by the worker; the `Nats-Msg-Id` drops what reached the stream twice.
//!
//! A server URL can carry credentials (`nats://user:password@host`, `nats://token@host`): they
//! never appear in an error, a failure reason or this publisher's `Debug` output (see
//! [`Redactor`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishErrorKind};
use futures::future::BoxFuture;

use super::reconnect::ReconnectBackoff;
use super::redact::{self, Redactor};
use super::{Envelope, metadata_headers, unless_lease_lost};
use crate::delivery::{Delivery, HandlerError};
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::store::ClaimedEvent;

/// Settings of a [`NatsPublisher`].
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// First token(s) of every subject (default `outbox`): `order.confirmed` goes to
    /// `outbox.order.confirmed`. Dot-separated tokens of letters, digits, `-` and `_`.
    pub subject_prefix: String,
    /// How long to wait for the stream's acknowledgement of one publish (default 5 s). Must be
    /// shorter than the worker's lease ([`NatsPublisher::check_lease`]).
    pub ack_timeout: Duration,
    /// How the client's attempts to reconnect to a server that went away are spaced (default:
    /// at once after a healthy connection broke, then 100 ms doubling up to 5 s, with
    /// jitter). Applies to [`NatsPublisher::connect`]; a client given to [`NatsPublisher::new`]
    /// keeps its own (`ConnectOptions::reconnect_delay_callback`).
    pub reconnect: ReconnectBackoff,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            subject_prefix: "outbox".to_owned(),
            ack_timeout: Duration::from_secs(5),
            reconnect: ReconnectBackoff::default(),
        }
    }
}

/// Counts of what a [`NatsPublisher`] was told by the stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NatsStats {
    /// Publishes the stream stored as new messages.
    pub stored: u64,
    /// Publishes the stream recognised as duplicates of a stored message id (and dropped).
    pub duplicates: u64,
}

/// Publishes claimed events to JetStream; see the [module docs](self).
#[derive(Clone)]
pub struct NatsPublisher {
    jetstream: jetstream::Context,
    config: NatsConfig,
    counts: Arc<Counts>,
    /// The server URL without credentials, when this publisher connected itself.
    shown_server: Option<String>,
    /// Removes the server URL's credentials from error texts of the client.
    redactor: Redactor,
}

impl std::fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the client: only what is safe to log.
        f.debug_struct("NatsPublisher")
            .field("server", &self.shown_server)
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Counts {
    stored: AtomicU64,
    duplicates: AtomicU64,
}

impl NatsPublisher {
    /// A publisher over an existing connection.
    pub fn new(client: async_nats::Client, config: NatsConfig) -> Result<NatsPublisher> {
        validate_prefix(&config.subject_prefix)?;
        config.reconnect.validate("NatsConfig::reconnect")?;
        if config.ack_timeout.is_zero() {
            return Err(Error::Config(
                "NatsConfig::ack_timeout must be greater than zero".into(),
            ));
        }
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(config.ack_timeout);
        Ok(NatsPublisher {
            jetstream,
            config,
            counts: Arc::default(),
            shown_server: None,
            redactor: Redactor::default(),
        })
    }

    /// Connect to `url` (for example `nats://127.0.0.1:4222`, or `nats://user:password@host`)
    /// and build a publisher. Fails when no server answers within the ack timeout.
    pub async fn connect(url: &str, config: NatsConfig) -> Result<NatsPublisher> {
        let redactor = Redactor::for_url(url);
        let shown = redact::shown_url(url);
        // The client logs the server address it connects to (at DEBUG): give it the address
        // without credentials, and the credentials as options.
        config.reconnect.validate("NatsConfig::reconnect")?;
        // The client counts the attempt it is about to make (1 for the first after a break).
        let backoff = config.reconnect;
        let mut options = async_nats::ConnectOptions::new()
            .connection_timeout(config.ack_timeout)
            .reconnect_delay_callback(move |attempt| {
                backoff.delay_for(u32::try_from(attempt.saturating_sub(1)).unwrap_or(u32::MAX))
            });
        match redact::userinfo(url) {
            Some((user, Some(password))) => options = options.user_and_password(user, password),
            Some((token, None)) => options = options.token(token),
            None => {}
        }
        let client = options
            .connect(shown.as_str())
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "cannot connect to NATS at {shown}: {}; start a JetStream-enabled server (`nats-server -js`) or fix the URL",
                    redactor.redact(&e.to_string())
                ))
            })?;
        let mut publisher = NatsPublisher::new(client, config)?;
        publisher.shown_server = Some(shown);
        publisher.redactor = redactor;
        Ok(publisher)
    }

    /// The JetStream context, for managing streams.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// The settings of this publisher.
    pub fn config(&self) -> &NatsConfig {
        &self.config
    }

    /// The subject an event of this name is published to.
    pub fn subject_for(&self, event_type: &str) -> String {
        subject_for(&self.config.subject_prefix, event_type)
    }

    /// The subject filter that matches every subject of this publisher (`<prefix>.>`).
    pub fn subject_filter(&self) -> String {
        format!("{}.>", self.config.subject_prefix)
    }

    /// What the stream answered so far.
    pub fn stats(&self) -> NatsStats {
        NatsStats {
            stored: self.counts.stored.load(Ordering::Relaxed),
            duplicates: self.counts.duplicates.load(Ordering::Relaxed),
        }
    }

    /// Create the stream `name` capturing [`Self::subject_filter`] with the given duplicate
    /// window, unless a stream of that name exists (which is then used as it is).
    pub async fn ensure_stream(&self, name: &str, duplicate_window: Duration) -> Result<()> {
        self.jetstream
            .get_or_create_stream(jetstream::stream::Config {
                name: name.to_owned(),
                subjects: vec![self.subject_filter()],
                duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "cannot create or find JetStream stream `{name}`: {}",
                    self.redactor.redact(&e.to_string())
                ))
            })?;
        Ok(())
    }

    /// Check at start-up that an acknowledgement wait fits in the worker's lease: a publish
    /// still waiting when the lease ends may be delivered again by another worker meanwhile.
    pub fn check_lease(&self, lease: Duration) -> Result<()> {
        if self.config.ack_timeout >= lease {
            return Err(Error::Config(format!(
                "the NATS ack timeout ({:?}) must be shorter than the worker's lease ({lease:?}); \
                 lower NatsConfig::ack_timeout or lengthen the lease",
                self.config.ack_timeout
            )));
        }
        Ok(())
    }

    async fn publish(&self, event: &ClaimedEvent, delivery: &Delivery) -> Result<(), HandlerError> {
        let subject = self.subject_for(&event.event_type);
        let body = serde_json::to_vec(&Envelope::of(event)).map_err(|e| {
            HandlerError::permanent(format!("event cannot be encoded as JSON: {e}"))
        })?;
        let mut headers = HeaderMap::new();
        for (name, value) in metadata_headers(event, delivery) {
            headers.insert(name, value);
        }
        let message = jetstream::message::PublishMessage::build()
            .payload(body.into())
            .headers(headers)
            .message_id(delivery.idempotency_key());

        let timeout = self.config.ack_timeout;
        let publish_and_ack = async {
            let ack = self
                .jetstream
                .send_publish(subject.clone(), message)
                .await?;
            ack.await
        };
        let ack = match tokio::time::timeout(timeout, publish_and_ack).await {
            Err(_elapsed) => return Err(no_ack(&subject, timeout)),
            Ok(Err(e)) => return Err(publish_error(&subject, timeout, &e, &self.redactor)),
            Ok(Ok(ack)) => ack,
        };
        if ack.duplicate {
            // The stream already stored this message id: the event is there, which is all
            // delivery promises. A previous attempt's acknowledgement was lost.
            self.counts.duplicates.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(event_id = %event.event_id, %subject, stream = %ack.stream, seq = ack.sequence,
                "JetStream dropped a duplicate publish; counted as delivered");
        } else {
            self.counts.stored.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Sink for NatsPublisher {
    fn check_lease(&self, lease: Duration) -> Result<()> {
        NatsPublisher::check_lease(self, lease)
    }

    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(unless_lease_lost(delivery, self.publish(event, delivery)))
    }
}

fn no_ack(subject: &str, timeout: Duration) -> HandlerError {
    HandlerError::retry(format!(
        "no JetStream acknowledgement for `{subject}` within {timeout:?}; the stream may have stored it, \
         and the retry's Nats-Msg-Id lets the duplicate window drop it"
    ))
}

fn publish_error(
    subject: &str,
    timeout: Duration,
    e: &jetstream::context::PublishError,
    redactor: &Redactor,
) -> HandlerError {
    let text = redactor.redact(&e.to_string());
    match e.kind() {
        PublishErrorKind::TimedOut => no_ack(subject, timeout),
        PublishErrorKind::StreamNotFound => HandlerError::retry(format!(
            "no JetStream stream captures subject `{subject}`; create one (for example \
             `nats stream add OUTBOX --subjects '{}.>' --dupe-window 2h`)",
            subject.split('.').next().unwrap_or(subject)
        )),
        // No retry makes the message smaller.
        PublishErrorKind::MaxPayloadExceeded => {
            HandlerError::permanent(format!("NATS refused the message for `{subject}`: {text}"))
        }
        _ => HandlerError::retry(format!("publishing to `{subject}` failed: {text}")),
    }
}

/// The subject for an event name under `prefix`: each dot-separated part of the name becomes a
/// token, with every character other than letters, digits, `-` and `_` replaced by `_` (so
/// wildcards, spaces and control characters never reach the subject), and empty parts as `_`.
pub fn subject_for(prefix: &str, event_type: &str) -> String {
    let mut subject = String::with_capacity(prefix.len() + 1 + event_type.len());
    subject.push_str(prefix);
    for token in event_type.split('.') {
        subject.push('.');
        if token.is_empty() {
            subject.push('_');
        }
        subject.extend(
            token
                .chars()
                .map(|c| if is_token_char(c) { c } else { '_' }),
        );
    }
    subject
}

/// `url` without a `user:password@` or `token@` part, nor a query, for messages.
pub fn without_credentials(url: &str) -> String {
    redact::shown_url(url)
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

fn validate_prefix(prefix: &str) -> Result<()> {
    let valid = !prefix.is_empty()
        && prefix
            .split('.')
            .all(|token| !token.is_empty() && token.chars().all(is_token_char));
    if valid {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "`{prefix}` is not a valid NATS subject prefix: use dot-separated tokens of letters, digits, `-` and `_` (for example `outbox` or `acme.orders`)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_made_of_safe_tokens() {
        assert_eq!(
            subject_for("outbox", "order.confirmed"),
            "outbox.order.confirmed"
        );
        assert_eq!(
            subject_for("acme.orders", "OrderConfirmed"),
            "acme.orders.OrderConfirmed"
        );
        assert_eq!(subject_for("outbox", "a b.*.>..x"), "outbox.a_b._._._.x");
        assert_eq!(subject_for("outbox", ""), "outbox._");
    }

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            without_credentials("nats://user:pw@127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
        assert_eq!(without_credentials("tok@127.0.0.1:4222"), "127.0.0.1:4222");
        assert_eq!(
            without_credentials("nats://127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
    }

    #[test]
    fn prefixes_are_validated() {
        assert!(validate_prefix("outbox").is_ok());
        assert!(validate_prefix("acme.orders-v2").is_ok());
        for bad in ["", "a..b", "a.*", "a b", "a.>", ".a"] {
            assert!(validate_prefix(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
