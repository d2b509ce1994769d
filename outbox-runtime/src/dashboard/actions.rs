//! The dashboard's three actions, each running the store's own operator statement (the ones
//! `outbox retry` and `outbox purge` run): retry one exhausted event, retry every exhausted
//! event of a type, purge delivered events older than a duration (an event's age counts from
//! its enqueue: a delivered event keeps no delivery time).
//!
//! An action is carried out only when all of these hold, checked in this order:
//! 1. the dashboard has a token (else it is read-only: 403);
//! 2. a browser's request comes from the dashboard's own page: its `Origin`, when present, names
//!    the host the request was sent to (else 403). A cross-site form cannot forge this, and
//!    cannot set the next header either;
//! 3. the request carries `Authorization: Bearer <token>` (else 401). The page keeps the token
//!    the operator pasted in memory only, never in a cookie, so no other site's request can
//!    carry it;
//! 4. the body is JSON (`Content-Type: application/json`, else 415).
//!
//! Every attempt, allowed or refused, is logged (target `outbox::dashboard::audit`) with what
//! was asked, the operator name the page sends (`X-Outbox-Operator`), the peer address and the
//! outcome.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{Extensions, HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{ApiError, Dashboard};
use crate::cli::{format_duration, parse_duration};
use crate::contract::shown;
use crate::store::Store;

/// Rows deleted per purge statement (as `outbox purge` does by default).
const PURGE_BATCH: i64 = 1000;

/// Who asked, for the audit line.
struct Caller {
    operator: String,
    peer: String,
}

fn caller(headers: &HeaderMap, extensions: &Extensions) -> Caller {
    let operator = headers
        .get("x-outbox-operator")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map_or_else(
            || "(unnamed)".to_owned(),
            |s| shown(&s.chars().take(64).collect::<String>()),
        );
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "(unknown)".to_owned(), |c| c.0.to_string());
    Caller { operator, peer }
}

fn audit(d: &Dashboard, caller: &Caller, action: &str, target: &str, outcome: &str) {
    tracing::warn!(
        target: "outbox::dashboard::audit",
        action,
        what = target,
        operator = %caller.operator,
        peer = %caller.peer,
        outcome,
        "dashboard action"
    );
    if d.config.audit_to_stderr {
        eprintln!(
            "audit: action={action} target={target} operator={} peer={} outcome={outcome}",
            caller.operator, caller.peer
        );
    }
}

/// Constant-time comparison of the presented token with the configured one (compared as
/// SHA-256 digests, so neither the length nor a matching prefix shows in the timing).
fn token_matches(presented: &str, expected: &str) -> bool {
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Steps 1 to 3 of the module's list.
fn authorize(d: &Dashboard, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = d.config.token.as_deref() else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "this dashboard is read-only: start it with --token (or OUTBOX_DASHBOARD_TOKEN) to enable actions",
        ));
    };
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        let origin = origin.to_str().unwrap_or_default();
        let same = !host.is_empty()
            && (origin == format!("http://{host}") || origin == format!("https://{host}"));
        if !same {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "cross-origin request refused: actions are accepted only from the dashboard's own page",
            ));
        }
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this action needs the dashboard token: paste it into the token field (sent as `Authorization: Bearer <token>`)",
        )),
        Some(p) if !token_matches(p, expected) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the token is wrong: use the one the dashboard was started with",
        )),
        Some(_) => Ok(()),
    }
}

/// Run `action` if the caller is allowed, logging the attempt and its outcome either way.
async fn guarded<F, Fut>(
    d: &Dashboard,
    headers: &HeaderMap,
    extensions: &Extensions,
    action: &str,
    target: &str,
    run: F,
) -> Result<Json<Value>, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Value, ApiError>>,
{
    let who = caller(headers, extensions);
    if let Err(refused) = authorize(d, headers) {
        audit(
            d,
            &who,
            action,
            target,
            &format!("refused: {}", refused.message),
        );
        return Err(refused);
    }
    match run().await {
        Ok(done) => {
            let message = done["message"].as_str().unwrap_or("done").to_owned();
            audit(d, &who, action, target, &format!("done: {message}"));
            Ok(Json(done))
        }
        Err(failed) => {
            audit(
                d,
                &who,
                action,
                target,
                &format!("failed: {}", failed.message),
            );
            Err(failed)
        }
    }
}

/// The body's JSON, or a 400/415 that says what is wrong.
fn body<T: serde::de::DeserializeOwned>(
    payload: Result<Json<T>, axum::extract::rejection::JsonRejection>,
) -> Result<T, ApiError> {
    payload
        .map(|Json(b)| b)
        .map_err(|e| ApiError::new(e.status(), e.body_text()))
}

#[derive(Debug, Deserialize)]
pub(super) struct RetryOne {
    table: Option<String>,
    event_id: Uuid,
}

/// `POST api/actions/retry` `{"event_id": "...", "table": "outbox"}`.
pub(super) async fn retry_one(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    extensions: Extensions,
    payload: Result<Json<RetryOne>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let request = body(payload);
    let target = match &request {
        Ok(r) => format!(
            "event {} in {}",
            r.event_id,
            r.table.as_deref().unwrap_or("(default)")
        ),
        Err(_) => "(unreadable request)".to_owned(),
    };
    guarded(&d, &headers, &extensions, "retry", &target, || async {
        let request = request?;
        let table = d.table(request.table.as_deref())?;
        let store = Store::for_table(d.pool.clone(), table)?;
        if store.retry_exhausted(request.event_id).await? {
            Ok(json!({
                "message": format!("event {} is pending again with fresh attempts", request.event_id),
                "count": 1,
            }))
        } else {
            Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "no exhausted event {} in table {table}: it does not exist, or it is not exhausted",
                    request.event_id
                ),
            ))
        }
    })
    .await
}

#[derive(Debug, Deserialize)]
pub(super) struct RetryType {
    table: Option<String>,
    event_type: String,
}

/// `POST api/actions/retry-type` `{"event_type": "...", "table": "outbox"}`.
pub(super) async fn retry_type(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    extensions: Extensions,
    payload: Result<Json<RetryType>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let request = body(payload);
    let target = match &request {
        Ok(r) => format!(
            "type {} in {}",
            shown(&r.event_type),
            r.table.as_deref().unwrap_or("(default)")
        ),
        Err(_) => "(unreadable request)".to_owned(),
    };
    guarded(&d, &headers, &extensions, "retry-type", &target, || async {
        let request = request?;
        let table = d.table(request.table.as_deref())?;
        let store = Store::for_table(d.pool.clone(), table)?;
        let n = store.retry_exhausted_of_type(&request.event_type).await?;
        Ok(json!({
            "message": format!(
                "{n} exhausted events of type {} are pending again with fresh attempts",
                shown(&request.event_type)
            ),
            "count": n,
        }))
    })
    .await
}

#[derive(Debug, Deserialize)]
pub(super) struct Purge {
    table: Option<String>,
    older_than: String,
}

/// `POST api/actions/purge` `{"older_than": "7d", "table": "outbox"}`.
pub(super) async fn purge(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    extensions: Extensions,
    payload: Result<Json<Purge>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let request = body(payload);
    let target = match &request {
        Ok(r) => format!(
            "delivered older than {} in {}",
            shown(&r.older_than),
            r.table.as_deref().unwrap_or("(default)")
        ),
        Err(_) => "(unreadable request)".to_owned(),
    };
    guarded(&d, &headers, &extensions, "purge", &target, || async {
        let request = request?;
        let table = d.table(request.table.as_deref())?;
        let older_than = parse_duration(&request.older_than)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("older_than: {e}")))?;
        let store = Store::for_table(d.pool.clone(), table)?;
        let mut total: u64 = 0;
        // Bounded batches, like `outbox purge`: each statement holds its locks briefly.
        loop {
            let deleted = store.purge_delivered(older_than, PURGE_BATCH).await?;
            total += deleted;
            if deleted < PURGE_BATCH.unsigned_abs() {
                break;
            }
        }
        Ok(json!({
            "message": format!(
                "deleted {total} delivered events older than {} from {table}",
                format_duration(older_than)
            ),
            "count": total,
        }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::token_matches;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3cre", "s3cret"));
        assert!(!token_matches("", "s3cret"));
        assert!(!token_matches("s3cret ", "s3cret"));
    }
}
