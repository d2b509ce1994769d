//! A [`Sink`] that `POST`s events to an HTTP receiver.
//!
//! # One event per request (the default)
//!
//! The body is the event's [`Envelope`] as JSON; the headers are `Idempotency-Key` (the event
//! id, the same on every attempt) and the metadata of [`super::metadata_headers`]. The answer
//! decides what happens to the event:
//!
//! | response | outcome |
//! | --- | --- |
//! | 2xx, or a status in [`HttpConfig::delivered_statuses`] (default `409 Conflict`, which receivers use for "this key was already processed") | delivered |
//! | 408, 425, 429, 5xx; a timeout; a refused or broken connection | retry, after `Retry-After` when the receiver sent one |
//! | any other 4xx | permanent: the event is exhausted, the start of the response body (at most [`HttpConfig::max_reason_bytes`]) is the reason |
//! | 1xx, 3xx (redirects are not followed: a `POST` must reach the configured URL) | permanent |
//!
//! `Retry-After` is read in both of its forms: delay-seconds, and an HTTP date, which is measured
//! against the response's own `Date` header (the receiver's clock; this process never reads its
//! own). A date without a `Date` header is ignored and the worker's backoff applies. Delays are
//! capped at [`HttpConfig::max_retry_after`].
//!
//! A timeout is not proof that the receiver did nothing: it may have applied the event and lost
//! the response. The retry carries the same `Idempotency-Key`, so a receiver that records keys
//! (for example with [`crate::inbox::apply_once`]) applies the event once.
//!
//! # Batch mode ([`HttpConfig::batch`])
//!
//! The body is a JSON array of envelopes (each one's `id` is its idempotency key), and the
//! receiver answers `2xx` with one result per item, matched by id:
//!
//! ```json
//! {"results": [
//!   {"id": "7c0e…", "status": 200},
//!   {"id": "9a41…", "status": 503, "retry_after": 30},
//!   {"id": "1f2d…", "status": 422, "error": "unknown sku"}
//! ]}
//! ```
//!
//! Each item's `status` is read like a single response's status (`retry_after` in seconds is
//! optional, `error` becomes the reason). Only the items with a delivered status count as
//! delivered: an item missing from the results, or a `2xx` body that is not such a document,
//! is retried. A non-2xx answer to the whole request applies to every item.
//!
//! # Credentials in the URL and in headers
//!
//! The URL's userinfo (user and password) and query values never appear in a failure reason,
//! a log line or this publisher's `Debug` output: reasons name the URL as
//! `scheme://host:port/path`, and every text the publisher does not write itself (a receiver's
//! body, an item's `error`, the HTTP client's error messages) goes through a
//! [`Redactor`] that replaces those values, raw, percent-decoded or
//! percent-encoded, with `[redacted]` before the text is cut to
//! [`HttpConfig::max_reason_bytes`]. A receiver's body is logged at DEBUG only.
//!
//! The same holds for credentials the request carries in headers, which a receiver may echo
//! (a debugging endpoint, an error page listing the request): the
//! `Authorization: Basic base64(user:password)` the client sends for a URL with userinfo, an
//! `Authorization`, `Proxy-Authorization` or `Cookie` header of [`HttpConfig::headers`], and
//! every header configured with [`RequestHeader::secret`]. Each is redacted as sent, as the
//! credential after its scheme, for `Basic` as the decoded `user:password` and its two parts,
//! and in every percent- and base64-encoding (see [`super::redact`]). Headers set on a client
//! of your own ([`HttpPublisher::with_client`], `default_headers`) are not seen by the
//! publisher: give credentials through [`HttpConfig::headers`] instead.

use std::time::Duration;

use chrono::DateTime;
use futures::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, DATE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::redact::{self, Redactor};
use super::{Envelope, IDEMPOTENCY_KEY, metadata_headers, unless_lease_lost};
use crate::delivery::{Delivery, HandlerError};
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::store::ClaimedEvent;

/// The largest batch response body read (a result per item is small; this bounds a receiver
/// that answers with something else).
const MAX_BATCH_RESPONSE_BYTES: usize = 1024 * 1024;

/// Settings of an [`HttpPublisher`]. The defaults suit a receiver on a local network.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The whole request's deadline, from connecting to the last byte of the response
    /// (default 10 s). Must be shorter than the worker's lease ([`HttpPublisher::check_lease`]).
    pub timeout: Duration,
    /// Statuses besides 2xx that mean delivered (default `[409]`: the receiver already
    /// processed this idempotency key).
    pub delivered_statuses: Vec<u16>,
    /// How much of an error body is kept as a permanent failure's reason (default 2 KiB).
    pub max_reason_bytes: usize,
    /// The longest `Retry-After` honoured (default 1 hour); longer requests are cut to it.
    pub max_retry_after: Duration,
    /// `Some(n)`: batch mode, up to `n` events per request (see the [module docs](self)).
    /// `None` (the default): one event per request.
    pub batch: Option<usize>,
    /// Headers sent with every request (default none): an API key, a bearer token, a tenant.
    /// They take precedence over an event's forwarded headers of the same name. The headers
    /// the publisher sets itself (`Idempotency-Key`, `Outbox-*`, `Content-*`, `Host`) cannot be
    /// given here.
    pub headers: Vec<RequestHeader>,
}

/// A header sent with every request ([`HttpConfig::headers`]).
#[derive(Clone, PartialEq, Eq)]
pub struct RequestHeader {
    name: String,
    value: String,
    secret: bool,
}

impl RequestHeader {
    /// A header whose value is no secret (a tenant id, an API version): shown in `Debug`
    /// output and left as it is in a receiver's text. `Authorization`, `Proxy-Authorization`
    /// and `Cookie` are treated as secret whichever constructor made them.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> RequestHeader {
        RequestHeader {
            name: name.into(),
            value: value.into(),
            secret: false,
        }
    }

    /// A header whose value is a credential (an API key, a signed token): never shown in
    /// `Debug` output, and redacted, in every encoding, from whatever a receiver answers.
    pub fn secret(name: impl Into<String>, value: impl Into<String>) -> RequestHeader {
        RequestHeader {
            name: name.into(),
            value: value.into(),
            secret: true,
        }
    }

    /// The header's name, as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the value is treated as a secret (see [`RequestHeader::new`]).
    pub fn is_secret(&self) -> bool {
        self.secret || is_credential_header(&self.name)
    }
}

impl std::fmt::Debug for RequestHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value: &dyn std::fmt::Debug = if self.is_secret() {
            &"[redacted]"
        } else {
            &self.value
        };
        f.debug_struct("RequestHeader")
            .field("name", &self.name)
            .field("value", value)
            .finish()
    }
}

/// Headers that carry credentials whoever configured them.
fn is_credential_header(name: &str) -> bool {
    ["authorization", "proxy-authorization", "cookie"]
        .iter()
        .any(|credential| name.eq_ignore_ascii_case(credential))
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout: Duration::from_secs(10),
            delivered_statuses: vec![StatusCode::CONFLICT.as_u16()],
            max_reason_bytes: 2048,
            max_retry_after: Duration::from_secs(3600),
            batch: None,
            headers: Vec::new(),
        }
    }
}

/// `POST`s claimed events to one URL; see the [module docs](self).
#[derive(Clone)]
pub struct HttpPublisher {
    client: reqwest::Client,
    url: reqwest::Url,
    /// The URL without credentials or query, safe to put in a stored failure reason.
    shown_url: String,
    /// Removes the URL's credentials and query values, and the credentials of the request's
    /// headers, from text the receiver or the client wrote.
    redactor: Redactor,
    /// [`HttpConfig::headers`], checked, secret values marked sensitive.
    extra_headers: HeaderMap,
    config: HttpConfig,
}

impl std::fmt::Debug for HttpPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL itself: it may carry a password or a token.
        f.debug_struct("HttpPublisher")
            .field("url", &self.shown_url)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One item of a batch receiver's answer (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItemResult {
    /// The event id of the item.
    pub id: Uuid,
    /// An HTTP status code for this item, read like a single response's status.
    pub status: u16,
    /// Seconds to wait before retrying this item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// Why the item was not accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A batch receiver's answer (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse {
    /// One result per item of the request.
    pub results: Vec<BatchItemResult>,
}

impl HttpPublisher {
    /// A publisher to `url` with a client of its own (no redirects followed).
    pub fn new(url: &str, config: HttpConfig) -> Result<HttpPublisher> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        HttpPublisher::with_client(client, url, config)
    }

    /// A publisher to `url` using `client` (for proxies, TLS or connection pool settings).
    /// [`HttpConfig::timeout`] is applied to every request whatever the client's own timeout.
    pub fn with_client(
        client: reqwest::Client,
        url: &str,
        config: HttpConfig,
    ) -> Result<HttpPublisher> {
        let parsed = reqwest::Url::parse(url).map_err(|e| {
            Error::Config(format!(
                "`{}` is not a valid receiver URL: {e}",
                redact::shown_url(url)
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(Error::Config(format!(
                "`{}` is not an http:// or https:// URL with a host",
                redact::shown_url(url)
            )));
        }
        if config.timeout.is_zero() {
            return Err(Error::Config(
                "HttpConfig::timeout must be greater than zero".into(),
            ));
        }
        if config.batch == Some(0) {
            return Err(Error::Config(
                "HttpConfig::batch must be at least 1 (or None for one event per request)".into(),
            ));
        }
        let shown_url = format!(
            "{}://{}{}",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default(),
            parsed.port().map(|p| format!(":{p}")).unwrap_or_default()
        ) + parsed.path();
        let extra_headers = extra_headers(&config.headers)?;
        // The parsed URL's own spellings too: it percent-encodes what the input wrote raw.
        let mut redactor = Redactor::for_url(url).merge(&Redactor::for_url(parsed.as_str()));
        // The credentials of the request as the client sends it: the `Authorization: Basic`
        // it derives from the URL's userinfo, and the configured headers.
        let probe = client
            .post(parsed.clone())
            .headers(extra_headers.clone())
            .build()
            .map_err(|e| {
                Error::Config(format!(
                    "cannot build a request to {shown_url}: {}",
                    redactor.redact(&error_causes(&e))
                ))
            })?;
        for (name, value) in probe.headers() {
            if value.is_sensitive() || is_credential_header(name.as_str()) {
                redactor = redactor.merge(&Redactor::for_header_value(&String::from_utf8_lossy(
                    value.as_bytes(),
                )));
            }
        }
        Ok(HttpPublisher {
            client,
            url: parsed,
            shown_url,
            redactor,
            extra_headers,
            config,
        })
    }

    /// The receiver URL, credentials and query included: never log it (the
    /// [`Debug`](std::fmt::Debug) output and failure reasons show it without them).
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// The settings of this publisher.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// Check at start-up that a request's deadline fits in the worker's lease. A request still
    /// running when the lease ends may be sent again by another worker meanwhile, and the
    /// late answer could not be recorded.
    pub fn check_lease(&self, lease: Duration) -> Result<()> {
        if self.config.timeout >= lease {
            return Err(Error::Config(format!(
                "the HTTP request timeout ({:?}) for {} must be shorter than the worker's lease ({lease:?}); \
                 lower HttpConfig::timeout or lengthen the lease",
                self.config.timeout, self.shown_url
            )));
        }
        Ok(())
    }

    async fn post_one(
        &self,
        event: &ClaimedEvent,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let mut headers = metadata_headers(event, delivery);
        headers.push((IDEMPOTENCY_KEY.to_owned(), delivery.idempotency_key()));
        let headers = to_header_map(headers);
        let mut response = self.send(headers, &Envelope::of(event)).await?;
        let status = response.status().as_u16();
        if self.is_delivered(status) {
            return Ok(());
        }
        let limit = self.config.max_reason_bytes;
        let (body, truncated) = read_bounded(&mut response, self.read_limit(limit)).await;
        self.single_outcome(event.event_id, status, response.headers(), &body, truncated)
    }

    /// The outcome of a receiver's answer to one event: its status, its headers (for
    /// `Retry-After`) and the start of its body (`truncated`: more was sent). Pure, so the
    /// fuzz targets feed it any answer (`crate::fuzz_targets`).
    pub(crate) fn single_outcome(
        &self,
        event_id: Uuid,
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
        truncated: bool,
    ) -> Result<(), HandlerError> {
        if self.is_delivered(status) {
            return Ok(());
        }
        let retry_after = retry_after(headers, self.config.max_retry_after);
        let body = self
            .redactor
            .bounded(body, self.config.max_reason_bytes, truncated);
        tracing::debug!(%event_id, status, url = %self.shown_url, %body,
            "the receiver did not accept the event");
        Err(self.failure(status, retry_after, &body))
    }

    async fn post_batch(
        &self,
        items: &[(&ClaimedEvent, &Delivery)],
    ) -> Vec<Result<(), HandlerError>> {
        let envelopes: Vec<Envelope> = items.iter().map(|(event, _)| Envelope::of(event)).collect();
        let every = |outcome: Result<(), HandlerError>| vec![outcome; items.len()];
        let mut response = match self.send(HeaderMap::new(), &envelopes).await {
            Ok(response) => response,
            Err(e) => return every(Err(e)),
        };
        let status = response.status().as_u16();
        let success = (200..300).contains(&status);
        let (body, truncated) = if success {
            read_bounded(&mut response, MAX_BATCH_RESPONSE_BYTES).await
        } else {
            read_bounded(&mut response, self.read_limit(self.config.max_reason_bytes)).await
        };
        let ids: Vec<Uuid> = items.iter().map(|(event, _)| event.event_id).collect();
        self.batch_outcomes(&ids, status, response.headers(), &body, truncated)
    }

    /// The outcome of a batch receiver's answer for each of `ids` (the events of the request,
    /// in order): its status, its headers (for `Retry-After`) and its body as read (`truncated`:
    /// more was sent). Pure, so the fuzz targets feed it any answer (`crate::fuzz_targets`).
    pub(crate) fn batch_outcomes(
        &self,
        ids: &[Uuid],
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
        truncated: bool,
    ) -> Vec<Result<(), HandlerError>> {
        let every = |outcome: Result<(), HandlerError>| vec![outcome; ids.len()];
        let retry_after = retry_after(headers, self.config.max_retry_after);
        if !(200..300).contains(&status) {
            if self.is_delivered(status) {
                return every(Ok(()));
            }
            let limit = self.config.max_reason_bytes;
            let body = self.redactor.bounded(body, limit, truncated);
            tracing::debug!(events = ids.len(), status, url = %self.shown_url, %body,
                "the batch receiver did not accept the request");
            return every(Err(self.failure(status, retry_after, &body)));
        }
        if truncated {
            return every(Err(HandlerError::retry(format!(
                "batch response from {} is over {MAX_BATCH_RESPONSE_BYTES} bytes; not read",
                self.shown_url
            ))));
        }
        let parsed: BatchResponse = match serde_json::from_slice(body) {
            Ok(parsed) => parsed,
            Err(e) => {
                // serde_json quotes pieces of the document it could not read.
                let detail = self.redactor.redact(&e.to_string());
                return every(Err(HandlerError::retry(format!(
                    "batch response from {} (HTTP {status}) is not a {{\"results\": [...]}} document: {detail}",
                    self.shown_url
                ))));
            }
        };
        ids.iter()
            .map(
                |event_id| match parsed.results.iter().find(|r| r.id == *event_id) {
                    None => Err(HandlerError::retry(format!(
                        "batch response from {} has no result for this event",
                        self.shown_url
                    ))),
                    Some(item) if self.is_delivered(item.status) => Ok(()),
                    Some(item) => {
                        let after = item
                            .retry_after
                            .map(|s| Duration::from_secs(s).min(self.config.max_retry_after))
                            .or(retry_after);
                        let reason = item.error.as_deref().unwrap_or("");
                        let reason = self.redactor.bounded(
                            reason.as_bytes(),
                            self.config.max_reason_bytes,
                            false,
                        );
                        tracing::debug!(%event_id, status = item.status, url = %self.shown_url,
                            error = %reason, "the batch receiver did not accept the item");
                        Err(self.failure(item.status, after, &reason))
                    }
                },
            )
            .collect()
    }

    async fn send<B: Serialize + ?Sized>(
        &self,
        mut headers: HeaderMap,
        body: &B,
    ) -> Result<reqwest::Response, HandlerError> {
        let body = serde_json::to_vec(body).map_err(|e| {
            HandlerError::permanent(format!("event cannot be encoded as JSON: {e}"))
        })?;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // The configured headers win over an event's forwarded header of the same name.
        for (name, value) in &self.extra_headers {
            headers.insert(name.clone(), value.clone());
        }
        self.client
            .post(self.url.clone())
            .timeout(self.config.timeout)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_failure(&e))
    }

    /// How much of an error body to read to keep `limit` bytes of it: a secret that crosses
    /// the limit is read whole, so it is redacted whole.
    fn read_limit(&self, limit: usize) -> usize {
        limit.saturating_add(self.redactor.longest())
    }

    fn is_delivered(&self, status: u16) -> bool {
        (200..300).contains(&status) || self.config.delivered_statuses.contains(&status)
    }

    /// The outcome of a status that is not delivered.
    fn failure(&self, status: u16, retry_after: Option<Duration>, body: &str) -> HandlerError {
        let shown = StatusCode::from_u16(status)
            .map(|s| s.to_string())
            .unwrap_or_else(|_| status.to_string());
        let reason = format!("HTTP {shown} from {}", self.shown_url);
        let failure = match status {
            408 | 425 | 429 | 500..=599 => match retry_after {
                Some(after) => HandlerError::retry_after(reason, after),
                None => HandlerError::retry(reason),
            },
            300..=399 => HandlerError::permanent(format!(
                "{reason} (redirects are not followed; configure the receiver's final URL)"
            )),
            _ => HandlerError::permanent(reason),
        };
        // The body is the receiver's text: kept in `last_error`, logged only at DEBUG.
        match body.trim() {
            "" => failure,
            body => failure.with_detail(body),
        }
    }

    fn transport_failure(&self, e: &reqwest::Error) -> HandlerError {
        let detail = self.redactor.redact(&error_causes(e));
        if e.is_timeout() {
            HandlerError::retry(format!(
                "no response from {} within {:?}; the receiver may have applied the event, \
                 and the retry sends the same Idempotency-Key ({detail})",
                self.shown_url, self.config.timeout
            ))
        } else if e.is_connect() {
            HandlerError::retry(format!("cannot connect to {}: {detail}", self.shown_url))
        } else {
            // The request may have been sent in full before the connection broke.
            HandlerError::retry(format!(
                "request to {} failed: {detail}; the receiver may have applied the event, \
                 and the retry sends the same Idempotency-Key",
                self.shown_url
            ))
        }
    }
}

impl Sink for HttpPublisher {
    fn check_lease(&self, lease: Duration) -> Result<()> {
        HttpPublisher::check_lease(self, lease)
    }

    fn deliver<'a>(
        &'a self,
        event: &'a ClaimedEvent,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(unless_lease_lost(delivery, async move {
            if self.config.batch.is_some() {
                // A batch receiver only understands arrays: send a batch of one.
                let mut results = self.post_batch(&[(event, delivery)]).await;
                results
                    .pop()
                    .unwrap_or_else(|| Err(HandlerError::retry("empty batch result")))
            } else {
                self.post_one(event, delivery).await
            }
        }))
    }

    fn max_batch(&self) -> usize {
        self.config.batch.unwrap_or(1)
    }

    fn deliver_batch<'a>(
        &'a self,
        items: &'a [(ClaimedEvent, Delivery)],
    ) -> BoxFuture<'a, Vec<Result<(), HandlerError>>> {
        Box::pin(async move {
            let refs: Vec<(&ClaimedEvent, &Delivery)> = items.iter().map(|(e, d)| (e, d)).collect();
            match self.config.batch {
                Some(max) => {
                    let mut results = Vec::with_capacity(items.len());
                    for chunk in refs.chunks(max) {
                        results.extend(self.post_batch(chunk).await);
                    }
                    results
                }
                None => {
                    let mut results = Vec::with_capacity(items.len());
                    for (event, delivery) in refs {
                        results.push(self.post_one(event, delivery).await);
                    }
                    results
                }
            }
        })
    }
}

/// [`HttpConfig::headers`] as a header map, secret values marked sensitive (the HTTP stack
/// leaves them out of its own debug output); a clear error for a name or value HTTP cannot
/// carry (never quoting a secret value) or a header the publisher sets itself.
fn extra_headers(configured: &[RequestHeader]) -> Result<HeaderMap> {
    let mut map = HeaderMap::with_capacity(configured.len());
    for header in configured {
        let shown = &header.name;
        let name = HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| {
            Error::Config(format!(
                "HttpConfig::headers: `{shown}` is not a valid header name (letters, digits and \
                 `!#$%&'*+-.^_`|~`)"
            ))
        })?;
        let lower = name.as_str();
        if lower.starts_with("outbox-")
            || lower.starts_with("content-")
            || lower == IDEMPOTENCY_KEY.to_ascii_lowercase()
            || lower == "host"
            || lower == "transfer-encoding"
        {
            return Err(Error::Config(format!(
                "HttpConfig::headers: `{shown}` is set by the publisher itself and cannot be configured"
            )));
        }
        let mut value = HeaderValue::from_str(&header.value).map_err(|_| {
            Error::Config(format!(
                "HttpConfig::headers: the value of `{shown}` is not a valid header value \
                 (visible ASCII and spaces, no line breaks)"
            ))
        })?;
        value.set_sensitive(header.is_secret());
        map.insert(name, value);
    }
    Ok(map)
}

fn to_header_map(headers: Vec<(String, String)>) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(headers.len() + 2);
    for (name, value) in headers {
        // `metadata_headers` only yields valid names and values; skip rather than fail if not.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            map.insert(name, value);
        }
    }
    map
}

/// The delay a `Retry-After` header asks for, capped at `max`.
fn retry_after(headers: &HeaderMap, max: Duration) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        // An HTTP date, measured against the receiver's own `Date` header.
        let until = DateTime::parse_from_rfc2822(value).ok()?;
        let date = headers.get(DATE)?.to_str().ok()?;
        let now = DateTime::parse_from_rfc2822(date.trim()).ok()?;
        (until - now).to_std().unwrap_or(Duration::ZERO)
    };
    Some(delay.min(max))
}

/// Read at most `limit` bytes of the body (a bit more from the last chunk is dropped); the flag
/// says whether more was left. A body that breaks off is kept as far as it came.
async fn read_bounded(response: &mut reqwest::Response, limit: usize) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() > limit {
            body.truncate(limit);
            return (body, true);
        }
    }
    (body, false)
}

/// The causes of `e`, joined: reqwest's own message ("error sending request for url (...)")
/// is left out, because it names the full URL, query string included, which may carry a token.
fn error_causes(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let part = s.to_string();
        if !parts.iter().any(|p| p.contains(&part)) {
            parts.push(part);
        }
        source = s.source();
    }
    if parts.is_empty() {
        let kind = if e.is_body() {
            "the response body broke off"
        } else if e.is_decode() {
            "the response could not be decoded"
        } else {
            "the request failed"
        };
        parts.push(kind.to_owned());
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::super::redact::tests_support::{oracle_base64, percent_encode_all};
    use super::*;

    fn publisher() -> HttpPublisher {
        HttpPublisher::new(
            "http://user:secret@127.0.0.1:9/hook?token=x",
            HttpConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn statuses_map_to_outcomes() {
        let p = publisher();
        assert!(p.is_delivered(200) && p.is_delivered(204) && p.is_delivered(409));
        assert!(!p.is_delivered(400) && !p.is_delivered(500));
        let e = p.failure(503, Some(Duration::from_secs(7)), "busy");
        assert_eq!(
            e.kind,
            crate::delivery::FailureKind::Retry {
                after: Some(Duration::from_secs(7))
            }
        );
        assert_eq!(
            e.message,
            "HTTP 503 Service Unavailable from http://127.0.0.1:9/hook"
        );
        // The receiver's body is the detail: stored after the message, logged only at DEBUG.
        assert_eq!(e.detail.as_deref(), Some("busy"));
        assert_eq!(
            e.stored_reason(),
            "HTTP 503 Service Unavailable from http://127.0.0.1:9/hook: busy"
        );
        assert!(!p.failure(429, None, "").is_permanent());
        assert!(!p.failure(408, None, "").is_permanent());
        assert!(p.failure(400, None, "bad").is_permanent());
        assert!(p.failure(422, None, "").is_permanent());
        assert!(p.failure(302, None, "").is_permanent());
    }

    #[test]
    fn reason_never_shows_credentials_or_query() {
        let e = publisher().failure(400, None, "no");
        assert!(
            !e.message.contains("secret") && !e.message.contains("token"),
            "{}",
            e.message
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_against_the_date_header() {
        let max = Duration::from_secs(3600);
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, max), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("120"));
        assert_eq!(retry_after(&h, max), Some(Duration::from_secs(120)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("999999"));
        assert_eq!(retry_after(&h, max), Some(max));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:30 GMT"),
        );
        assert_eq!(
            retry_after(&h, max),
            None,
            "a date needs the response's Date to measure against"
        );
        h.insert(
            DATE,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h, max), Some(Duration::from_secs(30)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, max), None);
    }

    #[test]
    fn lease_must_outlast_the_request_timeout() {
        let p = publisher();
        assert!(p.check_lease(Duration::from_secs(30)).is_ok());
        let err = p
            .check_lease(Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("must be shorter than the worker's lease"),
            "{err}"
        );
    }

    #[test]
    fn bad_configuration_is_rejected() {
        assert!(HttpPublisher::new("ftp://127.0.0.1/x", HttpConfig::default()).is_err());
        assert!(HttpPublisher::new("not a url", HttpConfig::default()).is_err());
        let batch0 = HttpConfig {
            batch: Some(0),
            ..HttpConfig::default()
        };
        assert!(HttpPublisher::new("http://127.0.0.1/x", batch0).is_err());
    }

    #[test]
    fn configured_headers_are_checked_and_secret_values_never_shown() {
        let config = HttpConfig {
            headers: vec![
                RequestHeader::secret("X-Api-Key", "k3y-0f-the-service"),
                RequestHeader::new("Authorization", "Bearer t0ken-of-the-service"),
                RequestHeader::new("X-Tenant", "acme-tenant"),
            ],
            ..HttpConfig::default()
        };
        let p = HttpPublisher::new("http://127.0.0.1:9/hook", config.clone()).unwrap();
        let shown = format!("{p:?} {config:?}");
        assert!(
            !shown.contains("k3y") && !shown.contains("t0ken"),
            "{shown}"
        );
        assert!(
            shown.contains("acme-tenant"),
            "plain values are shown: {shown}"
        );
        assert!(p.extra_headers["x-api-key"].is_sensitive());
        assert!(p.extra_headers["authorization"].is_sensitive());
        assert!(!p.extra_headers["x-tenant"].is_sensitive());
        let echoed = p
            .failure(
                400,
                None,
                &p.redactor
                    .redact("x-api-key: k3y-0f-the-service, tenant acme-tenant"),
            )
            .stored_reason();
        assert!(
            !echoed.contains("k3y") && echoed.contains("acme-tenant"),
            "{echoed}"
        );

        let with = |header: RequestHeader| {
            let config = HttpConfig {
                headers: vec![header],
                ..HttpConfig::default()
            };
            HttpPublisher::new("http://127.0.0.1:9/hook", config)
                .unwrap_err()
                .to_string()
        };
        let err = with(RequestHeader::secret("X-Api-Key", "line\nbreak-s3cret"));
        assert!(
            err.contains("the value of `X-Api-Key` is not a valid header value"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        assert!(with(RequestHeader::new("bad name", "x")).contains("not a valid header name"));
        for owned in ["Idempotency-Key", "Outbox-Event-Id", "content-type", "Host"] {
            let err = with(RequestHeader::new(owned, "x"));
            assert!(
                err.contains("set by the publisher itself"),
                "{owned}: {err}"
            );
        }
    }

    proptest::proptest! {
        /// Whatever user and password a URL carries and whatever API key is configured, a
        /// receiver that echoes the request's credentials (the `Authorization` header the HTTP
        /// client sends, built here by the client's own `basic_auth`, and the key), raw,
        /// percent-encoded or base64-encoded, gets none of them into the stored reason or the
        /// publisher's `Debug`.
        #[test]
        fn echoed_request_credentials_never_reach_the_reason(
            user in "[A-Za-z0-9._~-]{1,12}",
            password in "[ -~]{1,16}",
            key in "[!-~]{12,24}",
            noise in "[ -~]{0,12}",
        ) {
            let encoded: String = password
                .bytes()
                .map(|b| if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("%{b:02X}") })
                .collect();
            let config = HttpConfig {
                headers: vec![RequestHeader::secret("X-Api-Key", key.clone())],
                ..HttpConfig::default()
            };
            let p = HttpPublisher::new(&format!("http://{user}:{encoded}@127.0.0.1:9/hook"), config).unwrap();
            let sent = reqwest::Client::new()
                .post("http://127.0.0.1:9/")
                .basic_auth(&user, Some(&password))
                .build()
                .unwrap()
                .headers()["authorization"]
                .to_str()
                .unwrap()
                .to_owned();
            let token = sent["Basic ".len()..].to_owned();
            let credentials = format!("{user}:{password}");
            let dump = format!("authorization: {sent}\r\nx-api-key: {key}\r\n");
            let body = format!(
                "{noise}{dump}{noise}{}{noise}{}{noise}{}",
                percent_encode_all(&dump),
                oracle_base64(dump.as_bytes()),
                oracle_base64(format!("{noise}{dump}").as_bytes()),
            );
            let failure = p
                .single_outcome(Uuid::nil(), 400, &HeaderMap::new(), body.as_bytes(), false)
                .unwrap_err();
            proptest::prop_assert_eq!(&failure.message, "HTTP 400 Bad Request from http://127.0.0.1:9/hook");
            // The receiver's part (the message is the publisher's own and names no secret).
            let reason = failure.detail.unwrap_or_default();
            let shown = format!("{p:?}");
            for secret in [&sent, &token, &credentials, &password, &key] {
                proptest::prop_assert!(!reason.contains(secret.as_str()), "{:?} in {:?}", secret, reason);
            }
            // (Short secrets turn up in any `Debug` text by chance: the long ones.)
            for secret in [&sent, &key] {
                proptest::prop_assert!(!shown.contains(secret.as_str()), "{:?} in {:?}", secret, shown);
            }
            for encoded in [
                percent_encode_all(&sent),
                percent_encode_all(&key),
                oracle_base64(key.as_bytes()),
            ] {
                proptest::prop_assert!(!reason.contains(&encoded), "{:?} in {:?}", encoded, reason);
            }
        }

        /// Whatever a receiver puts in `Retry-After` and `Date` (seconds of any size, dates far
        /// apart or malformed, garbage), reading it never panics and never asks for more than
        /// the cap; plain seconds are honoured up to it.
        #[test]
        fn retry_after_is_bounded_for_any_answer(
            retry in "[0-9]{1,25}|[ -~]{0,40}|(Mon|Sun), [0-9]{1,2} (Jan|Dec) [0-9]{1,6} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT",
            date in proptest::option::of("[ -~]{0,40}|(Mon|Sun), [0-9]{1,2} (Jan|Dec) [0-9]{1,6} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"),
            max_secs in 0u64..100_000,
        ) {
            let max = Duration::from_secs(max_secs);
            let mut headers = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(&retry) {
                headers.insert(RETRY_AFTER, value);
            }
            if let Some(Ok(value)) = date.as_deref().map(HeaderValue::from_str) {
                headers.insert(DATE, value);
            }
            let delay = retry_after(&headers, max);
            proptest::prop_assert!(delay.is_none_or(|d| d <= max), "{:?} > {:?}", delay, max);
            if !retry.is_empty() && retry.bytes().all(|b| b.is_ascii_digit()) {
                let asked = retry.parse::<u64>().map_or(max, Duration::from_secs);
                proptest::prop_assert_eq!(delay, Some(asked.min(max)));
            }
        }
    }
}
