//! The operator dashboard (feature `dashboard`): one web page that answers "is anything stuck,
//! and why", served by the `outbox dashboard` command or mounted in a service's own axum app.
//!
//! ```no_run
//! # async fn mount(pool: sqlx::PgPool) -> Result<(), outbox_runtime::Error> {
//! use outbox_runtime::dashboard::{self, DashboardConfig};
//!
//! let config = DashboardConfig::new().with_tables(["outbox", "billing_outbox"])?;
//! // `nest_service`, not `nest`: it serves both `/ops/outbox` (redirected) and `/ops/outbox/`.
//! let app: axum::Router =
//!     axum::Router::new().nest_service("/ops/outbox", dashboard::router(pool, config));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! Every view is a JSON endpoint under `api/` (documented in `docs/dashboard.md`); the page,
//! its script and its style sheet are embedded in the binary and fetch nothing from elsewhere.
//! Values from the database reach the page as JSON and are written into it as text, never as
//! markup, under a Content-Security-Policy that allows no inline script.
//!
//! Every request must name the dashboard in its `Host` (the defence against DNS rebinding), and
//! with a token configured every route but the page and its static files needs a token (see the
//! `access` module). Without an action token the dashboard is read-only. With one, it offers
//! three actions (retry one exhausted event, retry all exhausted events of a type, purge
//! delivered events enqueued more than a duration ago), each refused unless the request carries
//! the action token in its `Authorization` header and, when it comes from a browser, an `Origin`
//! of the dashboard itself (see the `actions` module). A viewer token reads and cannot act.

mod access;
mod actions;
mod command;
pub mod queries;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, OriginalUri, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use sqlx::PgPool;
use uuid::Uuid;

pub use access::MIN_TOKEN_CHARS;
use access::{Access, check_token_strength};
pub(crate) use command::{DashboardArgs, run_command};

use crate::error::{Error, Result};
use crate::generate::CompiledEvent;
use crate::store::{DEFAULT_TABLE, validate_table_name};

/// The address `outbox dashboard` listens on unless told otherwise (loopback only).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8089";

/// The environment variable `outbox dashboard` reads its action token from.
pub const TOKEN_ENV: &str = "OUTBOX_DASHBOARD_TOKEN";

/// The environment variable `outbox dashboard` reads its viewer (read-only) token from.
pub const VIEWER_TOKEN_ENV: &str = "OUTBOX_DASHBOARD_VIEWER_TOKEN";

/// What the dashboard shows and allows.
#[derive(Clone)]
pub struct DashboardConfig {
    tables: Vec<String>,
    token: Option<Arc<str>>,
    viewer_token: Option<Arc<str>>,
    allowed_hosts: Vec<String>,
    /// The address the dashboard listens on, when [`serve`] serves it (the `Host` check knows
    /// then which IP names it).
    bound: Option<IpAddr>,
    show_payloads: bool,
    events: Option<Vec<CompiledEvent>>,
    refresh: Duration,
    audit_to_stderr: bool,
}

impl std::fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("DashboardConfig")
            .field("tables", &self.tables)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("viewer_token", &self.viewer_token.as_ref().map(|_| "<set>"))
            .field("allowed_hosts", &self.allowed_hosts)
            .field("show_payloads", &self.show_payloads)
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig::new()
    }
}

impl DashboardConfig {
    /// Read-only, the default table `outbox`, payloads hidden, the page refreshing every
    /// 5 seconds, the contracts compared with the events linked into this binary.
    pub fn new() -> DashboardConfig {
        DashboardConfig {
            tables: vec![DEFAULT_TABLE.to_owned()],
            token: None,
            viewer_token: None,
            allowed_hosts: Vec::new(),
            bound: None,
            show_payloads: false,
            events: None,
            refresh: Duration::from_secs(5),
            audit_to_stderr: false,
        }
    }

    /// Show these outbox tables (the first is the page's default). Each must be a valid table
    /// name; an empty list keeps `outbox`.
    pub fn with_tables<I, T>(mut self, tables: I) -> Result<DashboardConfig>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let tables: Vec<String> = tables.into_iter().map(Into::into).collect();
        for table in &tables {
            validate_table_name(table)?;
        }
        if !tables.is_empty() {
            self.tables = tables;
        }
        Ok(self)
    }

    /// Enable the actions, guarded by this token (`None` or an empty token leaves the dashboard
    /// read-only). With a token set, reading needs it too (or the viewer token). Operators paste
    /// it into the page, which sends it in a header on every request.
    ///
    /// Refused ([`Error::Config`], saying why and how to make one) unless it is at least
    /// [`MIN_TOKEN_CHARS`] printable ASCII characters without spaces that do not look typed
    /// (one piece repeated, a run like `abcd`, few distinct characters): generate it, for
    /// example with `openssl rand -hex 32`.
    pub fn with_token(mut self, token: Option<String>) -> Result<DashboardConfig> {
        self.token = strong_token(token)?;
        self.check_tokens_differ()?;
        Ok(self)
    }

    /// A second, read-only token: it shows every view and runs no action (checked like
    /// [`DashboardConfig::with_token`]'s, and it must differ from the action token). With
    /// only a viewer token the dashboard is read-only and reading needs the token.
    pub fn with_viewer_token(mut self, token: Option<String>) -> Result<DashboardConfig> {
        self.viewer_token = strong_token(token)?;
        self.check_tokens_differ()?;
        Ok(self)
    }

    fn check_tokens_differ(&self) -> Result<()> {
        match (&self.token, &self.viewer_token) {
            (Some(a), Some(v)) if a == v => Err(Error::Config(
                "the viewer token equals the action token: give the viewers a token of their own \
                 (for example `openssl rand -hex 32`)"
                    .to_owned(),
            )),
            _ => Ok(()),
        }
    }

    /// Host names the dashboard answers to besides its own address and `localhost`: the names
    /// operators reach it by (a DNS name, or the address a proxy or port mapping shows). A
    /// request naming any other host in its `Host` header is refused, which is what defeats DNS
    /// rebinding (see `docs/dashboard.md`). Names without scheme or port, like
    /// `ops.example.com`.
    pub fn with_allowed_hosts<I, T>(mut self, names: I) -> Result<DashboardConfig>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        for name in names {
            let name = access::allowed_host_name(name.as_ref()).map_err(Error::Config)?;
            if !self.allowed_hosts.contains(&name) {
                self.allowed_hosts.push(name);
            }
        }
        Ok(self)
    }

    /// Show event payloads in the event view (off by default: payloads can hold personal data).
    pub fn with_payloads_shown(mut self, show: bool) -> DashboardConfig {
        self.show_payloads = show;
        self
    }

    /// Compare the contract registry with these events instead of those linked into the binary.
    pub fn with_events(mut self, events: Vec<CompiledEvent>) -> DashboardConfig {
        self.events = Some(events);
        self
    }

    /// How often the page refreshes itself (at least one second).
    pub fn with_refresh(mut self, every: Duration) -> DashboardConfig {
        self.refresh = every.max(Duration::from_secs(1));
        self
    }

    /// Also print each action's audit line on standard error (the `outbox dashboard` command
    /// does; a service mounting the router has its own `tracing` subscriber).
    /// One line per action request, every field quoted and escaped.
    pub fn with_audit_on_stderr(mut self, on: bool) -> DashboardConfig {
        self.audit_to_stderr = on;
        self
    }

    /// Whether actions are enabled (an action token is set).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether reading needs a token (an action or a viewer token is set).
    pub fn needs_token_to_read(&self) -> bool {
        self.token.is_some() || self.viewer_token.is_some()
    }
}

/// `token` if it is strong enough, `None` for none or an empty one.
fn strong_token(token: Option<String>) -> Result<Option<Arc<str>>> {
    match token.filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => {
            check_token_strength(&t).map_err(Error::Config)?;
            Ok(Some(Arc::from(t)))
        }
    }
}

/// What every handler shares.
struct Dashboard {
    pool: PgPool,
    config: DashboardConfig,
    events: Vec<CompiledEvent>,
}

type Shared = State<Arc<Dashboard>>;

/// The dashboard as an axum [`Router`]: the page at `/`, its JSON endpoints under `/api/`.
/// Mount it under any path with [`Router::nest_service`] (which, unlike `nest`, also routes the
/// path with a trailing slash, where the page lives); the page finds its endpoints relative to
/// its own address.
pub fn router(pool: PgPool, config: DashboardConfig) -> Router {
    let events = config
        .events
        .clone()
        .unwrap_or_else(crate::generate::compiled_events);
    let state = Arc::new(Dashboard {
        pool,
        config,
        events,
    });
    // The reads need a token when one is configured; the actions check theirs themselves
    // (the action token only, and the caller's origin), and the page and its two files are
    // open: they hold no data, and the page is where the token is pasted.
    let reads = Router::new()
        .route("/api/config", get(api_config))
        .route("/api/overview", get(api_overview))
        .route("/api/types", get(api_types))
        .route("/api/failures", get(api_failures))
        .route("/api/events/{event_id}", get(api_event))
        .route("/api/claims", get(api_claims))
        .route("/api/contracts", get(api_contracts))
        .route("/api/integrity", get(api_integrity))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            access::require_token,
        ));
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(script))
        .route("/app.css", get(style))
        .merge(reads)
        .route("/api/actions/retry", post(actions::retry_one))
        .route("/api/actions/retry-type", post(actions::retry_type))
        .route("/api/actions/purge", post(actions::purge))
        .fallback(not_found)
        // The Host check comes first, for every route and the fallback alike.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            access::check_host,
        ))
        .layer(middleware::from_fn(security_headers))
        .with_state(state)
}

/// Serve the dashboard on `listener` until `shutdown` completes. Requests must name the
/// listener's address (or `localhost` on loopback, or an allowed name) in their `Host`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    pool: PgPool,
    config: DashboardConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let config = DashboardConfig {
        bound: Some(listener.local_addr()?.ip()),
        ..config
    };
    let app = router(pool, config);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Headers on every response: no inline or foreign script, style or connection; no framing;
/// no sniffing a JSON answer into markup; nothing cached (the numbers are live).
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An error answered as `{"error": "..."}`.
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = match &e {
            Error::InvalidTableName(_) | Error::ReservedTableName(_) | Error::Config(_) => {
                StatusCode::BAD_REQUEST
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::warn!(target: "outbox::dashboard", error = %e, "dashboard query failed");
        }
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

type ApiResult<T> = std::result::Result<axum::Json<T>, ApiError>;

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such page or endpoint")
}

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The page. Its links are relative, so under a prefix the address must end with `/`:
/// `/ops/outbox` redirects to `/ops/outbox/`.
async fn index(OriginalUri(uri): OriginalUri) -> Response {
    let path = uri.path();
    if !path.ends_with('/') {
        let last = path.rsplit('/').next().unwrap_or_default();
        return Redirect::to(&format!("{last}/")).into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        INDEX_HTML,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

impl Dashboard {
    /// The table a request names, which must be one of the configured ones (the default: the
    /// first). Nothing else reaches a statement's text.
    fn table(&self, asked: Option<&str>) -> std::result::Result<&str, ApiError> {
        match asked.filter(|t| !t.is_empty()) {
            None => Ok(self.config.tables[0].as_str()),
            Some(t) => self
                .config
                .tables
                .iter()
                .find(|known| known.as_str() == t)
                .map(String::as_str)
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!(
                            "table `{}` is not shown by this dashboard (it shows: {})",
                            crate::contract::shown(t),
                            self.config.tables.join(", ")
                        ),
                    )
                }),
        }
    }
}

#[derive(Debug, Deserialize)]
struct TableParam {
    table: Option<String>,
}

/// `read_only`: whether this caller can act (only with the action token).
async fn api_config(
    State(d): Shared,
    Extension(access): Extension<Access>,
) -> ApiResult<serde_json::Value> {
    Ok(axum::Json(serde_json::json!({
        "tables": d.config.tables,
        "read_only": access != Access::Actions,
        "actions_enabled": d.config.has_token(),
        "token_required": d.config.needs_token_to_read(),
        "show_payloads": d.config.show_payloads,
        "refresh_seconds": d.config.refresh.as_secs(),
        "delivered_exact_up_to": queries::DELIVERED_EXACT_UP_TO,
        "version": env!("CARGO_PKG_VERSION"),
    })))
}

async fn api_overview(
    State(d): Shared,
    Extension(access): Extension<Access>,
) -> ApiResult<serde_json::Value> {
    let mut tables = Vec::with_capacity(d.config.tables.len());
    for table in &d.config.tables {
        tables.push(queries::overview(&d.pool, table).await?);
    }
    Ok(axum::Json(serde_json::json!({
        "read_only": access != Access::Actions,
        "tables": tables,
    })))
}

async fn api_types(
    State(d): Shared,
    Query(q): Query<TableParam>,
) -> ApiResult<Vec<queries::EventTypeRow>> {
    let table = d.table(q.table.as_deref())?;
    Ok(axum::Json(queries::event_types(&d.pool, table).await?))
}

#[derive(Debug, Deserialize)]
struct FailuresParams {
    table: Option<String>,
    state: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    aggregate: Option<String>,
    since: Option<String>,
    error: Option<String>,
    limit: Option<String>,
}

async fn api_failures(
    State(d): Shared,
    Query(q): Query<FailuresParams>,
) -> ApiResult<Vec<queries::FailureRow>> {
    let table = d.table(q.table.as_deref())?;
    let (since, within) = match q.since.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => (None, None),
        Some(s) => parse_since(s)?,
    };
    let limit = match q.limit.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(s.parse::<i64>().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "limit must be a whole number of rows",
            )
        })?),
    };
    let filter = queries::FailureFilter {
        state: q.state,
        event_type: q.event_type,
        aggregate: q.aggregate,
        since,
        within,
        error: q.error,
        limit,
    };
    Ok(axum::Json(
        queries::failures(&d.pool, table, &filter).await?,
    ))
}

/// `since` is a time (RFC 3339, or the browser's `YYYY-MM-DDTHH:MM` taken as UTC) or an age
/// (`30m`, `2h`, `7d`: changed within it, by the database's clock).
type Since = (
    Option<chrono::DateTime<chrono::Utc>>,
    Option<std::time::Duration>,
);

fn parse_since(s: &str) -> std::result::Result<Since, ApiError> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok((Some(t.with_timezone(&chrono::Utc)), None));
    }
    if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M") {
        return Ok((Some(t.and_utc()), None));
    }
    if let Ok(age) = crate::cli::parse_duration(s) {
        return Ok((None, Some(age)));
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "since must be a time like 2026-12-03T18:00:00Z or an age like 30m, 2h, 7d",
    ))
}

async fn api_event(
    State(d): Shared,
    Path(event_id): Path<String>,
    Query(q): Query<TableParam>,
) -> ApiResult<queries::EventDetail> {
    let table = d.table(q.table.as_deref())?;
    let event_id = Uuid::parse_str(&event_id).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "the event id must be a UUID like 6be25b8a-f769-4180-9ef9-101b587089f8",
        )
    })?;
    match queries::event(&d.pool, table, event_id, d.config.show_payloads).await? {
        Some(detail) => Ok(axum::Json(detail)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no event {event_id} in table {table} (it may have been purged)"),
        )),
    }
}

async fn api_claims(
    State(d): Shared,
    Query(q): Query<TableParam>,
) -> ApiResult<Vec<queries::ClaimRow>> {
    let table = d.table(q.table.as_deref())?;
    Ok(axum::Json(queries::claims(&d.pool, table, 500).await?))
}

/// `outbox doctor` for one table (`store::integrity`): whether the database keeps its
/// invariants, and the rows that break them. It reads the table whole, so the page asks for it
/// only when the Integrity view is opened or checked again, never on the refresh timer.
async fn api_integrity(
    State(d): Shared,
    Query(q): Query<TableParam>,
) -> ApiResult<serde_json::Value> {
    let table = d.table(q.table.as_deref())?;
    let store = crate::store::Store::for_table(d.pool.clone(), table)?;
    let report = store.check_integrity(INTEGRITY_SAMPLE).await?;
    Ok(axum::Json(report.to_json()))
}

/// How many rows of each kind the Integrity view lists.
const INTEGRITY_SAMPLE: i64 = 50;

async fn api_contracts(State(d): Shared) -> ApiResult<Vec<queries::ContractRow>> {
    Ok(axum::Json(queries::contracts(&d.pool, &d.events).await?))
}
