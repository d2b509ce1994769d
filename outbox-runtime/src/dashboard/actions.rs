//! The dashboard's three actions, each running the store's own operator statement (the ones
//! `outbox retry` and `outbox purge` run): retry one exhausted event, retry every exhausted
//! event of a type, purge delivered events older than a duration (an event's age counts from
//! its enqueue: a delivered event keeps no delivery time).
//!
//! An action is carried out only when all of these hold, checked in this order (after the
//! `Host` check every request passes, see the `access` module):
//! 1. the dashboard has an action token (else it is read-only: 403);
//! 2. a browser's request comes from the dashboard's own page: its `Origin`, when present, names
//!    the host the request was sent to (else 403). A cross-site form cannot forge this, and
//!    cannot set the next header either;
//! 3. the request carries `Authorization: Bearer <action token>` (else 401; the viewer token
//!    gets 403). The page keeps the token the operator pasted in the tab's session storage,
//!    never in a cookie, so no other site's request can carry it;
//! 4. the body is JSON (`Content-Type: application/json`, else 415).
//!
//! Every attempt, allowed or refused, is logged once, after it is decided (target
//! `outbox::dashboard::audit`), with what was asked, the operator name the page sends
//! (`X-Outbox-Operator`), the peer address and the outcome. Each field is quoted and escaped
//! (control characters, line breaks, quotes), so no request can write a line of its own or a
//! field that is not its own.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{Extensions, HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::access::{Access, access_of, presented_token};
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
            |s| s.chars().take(64).collect::<String>(),
        );
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "(unknown)".to_owned(), |c| c.0.to_string());
    Caller { operator, peer }
}

/// One field of an audit line: quoted, with backslashes, quotes, line breaks and every other
/// control or invisible formatting character escaped (Rust's `escape_debug`, which escapes
/// U+2028 and the bidirectional overrides too), and cut at 200 characters.
fn field(value: &str) -> String {
    let escaped: String = value
        .chars()
        .take(200)
        .flat_map(char::escape_debug)
        .collect();
    let cut = if value.chars().nth(200).is_some() {
        "..."
    } else {
        ""
    };
    format!("\"{escaped}{cut}\"")
}

/// The audit line of one request (without its line break).
fn audit_line(caller: &Caller, action: &str, target: &str, outcome: &str) -> String {
    format!(
        "audit: action={} target={} operator={} peer={} outcome={}",
        field(action),
        field(target),
        field(&caller.operator),
        field(&caller.peer),
        field(outcome)
    )
}

/// Write the one audit line of a request, through `tracing` (whose formatter escapes the
/// fields its own way) and, for `outbox dashboard`, on standard error.
fn audit(d: &Dashboard, caller: &Caller, action: &str, target: &str, outcome: &str) {
    tracing::warn!(
        target: "outbox::dashboard::audit",
        action,
        what = target,
        operator = caller.operator.as_str(),
        peer = caller.peer.as_str(),
        outcome,
        "dashboard action"
    );
    if d.config.audit_to_stderr {
        // `eprintln!` holds standard error's lock for the whole line: lines of concurrent
        // requests do not interleave.
        eprintln!("{}", audit_line(caller, action, target, outcome));
    }
}

/// Steps 1 to 3 of the module's list.
fn authorize(d: &Dashboard, headers: &HeaderMap) -> Result<(), ApiError> {
    if d.config.token.is_none() {
        let how = if d.config.viewer_token.is_some() {
            "this dashboard is view-only (it has a viewer token, no action token)"
        } else {
            "this dashboard is read-only"
        };
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{how}: start it with --token (or OUTBOX_DASHBOARD_TOKEN) to enable actions"),
        ));
    }
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
    let presented = presented_token(headers);
    match (presented, access_of(d, presented)) {
        (None, _) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this action needs the dashboard token: paste it into the token field (sent as `Authorization: Bearer <token>`)",
        )),
        (Some(_), Some(Access::Actions)) => Ok(()),
        (Some(_), Some(_)) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "this is the viewer token, which only reads: actions need the action token",
        )),
        (Some(_), None) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the token is wrong: use the one the dashboard was started with",
        )),
    }
}

/// Decide whether the caller may act, run `action` if so, then write the request's one audit
/// line: what was asked (`target`, described from the request), who asked, and the outcome.
async fn guarded<F, Fut>(
    d: &Dashboard,
    headers: &HeaderMap,
    extensions: &Extensions,
    action: &str,
    target: String,
    run: F,
) -> Result<Json<Value>, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Value, ApiError>>,
{
    let outcome = match authorize(d, headers) {
        Err(refused) => Err(("refused", refused)),
        Ok(()) => run().await.map_err(|failed| ("failed", failed)),
    };
    let who = caller(headers, extensions);
    match outcome {
        Ok(done) => {
            let message = done["message"].as_str().unwrap_or("done").to_owned();
            audit(d, &who, action, &target, &format!("done: {message}"));
            Ok(Json(done))
        }
        Err((how, error)) => {
            audit(
                d,
                &who,
                action,
                &target,
                &format!("{how}: {}", error.message),
            );
            Err(error)
        }
    }
}

/// The table a request names, for its audit line.
fn asked_table(table: Option<&str>) -> &str {
    table.unwrap_or("(default)")
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
            asked_table(r.table.as_deref())
        ),
        Err(_) => "(unreadable request)".to_owned(),
    };
    guarded(&d, &headers, &extensions, "retry", target, || async {
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
            r.event_type,
            asked_table(r.table.as_deref())
        ),
        Err(_) => "(unreadable request)".to_owned(),
    };
    guarded(&d, &headers, &extensions, "retry-type", target, || async {
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
            r.older_than,
            asked_table(r.table.as_deref())
        ),
        Err(_) => "(unreadable request)".to_owned(),
    };
    guarded(&d, &headers, &extensions, "purge", target, || async {
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
    use super::{Caller, audit_line};

    #[test]
    fn an_audit_line_stays_one_line_whatever_its_fields_hold() {
        let hostile = "x\n audit: action=purge outcome=done\r\t\u{1b}[2J\u{2028}\u{202e}\"q\" \\";
        let caller = Caller {
            operator: hostile.to_owned(),
            peer: hostile.to_owned(),
        };
        let line = audit_line(&caller, hostile, hostile, hostile);
        assert!(!line.chars().any(char::is_control), "{line}");
        assert!(
            !line.contains('\u{2028}') && !line.contains('\u{202e}'),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        // The quotes inside the fields are escaped: only the five fields' own are bare.
        assert_eq!(
            line.replace("\\\\", "")
                .replace("\\\"", "")
                .matches('"')
                .count(),
            10
        );
    }
}
