//! What each command does. Every failure becomes a message on `err` and an [`Exit`].

mod doctor;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};

use super::Exit;
use super::args::{Cli, Command, Folder, Migrations};
use super::duration::format_duration;
use crate::contract::shown;
use crate::generate::{self, CompiledEvent, GenerateError, LOCK_FILE};
use crate::store::{DEFAULT_TABLE, ExhaustedEvent, Stats, Store, UnhandledEvents};

/// What a command runs with.
pub(crate) struct Context<'a> {
    pub default_dir: &'a Path,
    pub events: &'a [CompiledEvent],
    pub out: &'a mut (dyn Write + Send),
    pub err: &'a mut (dyn Write + Send),
}

/// A failed command: its exit code and what to tell the operator.
struct Failure {
    exit: Exit,
    message: String,
}

impl Failure {
    fn new(exit: Exit, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            message: message.into(),
        }
    }
}

impl From<crate::Error> for Failure {
    fn from(e: crate::Error) -> Failure {
        use crate::Error as E;
        let exit = match &e {
            E::InvalidTableName(_) | E::ReservedTableName(_) | E::Config(_) => Exit::Usage,
            E::ContractMismatch(_) => Exit::Failed,
            _ => Exit::Database,
        };
        let mut message = e.to_string();
        if let E::Database(sqlx::Error::Database(db)) = &e {
            if db.code().as_deref() == Some("42P01") {
                message.push_str(" (run `outbox migrate` first)");
            }
        }
        Failure::new(exit, message)
    }
}

impl From<GenerateError> for Failure {
    fn from(e: GenerateError) -> Failure {
        let exit = match &e {
            GenerateError::Io { .. } | GenerateError::LockUnreadable { .. } => Exit::Files,
            _ => Exit::Failed,
        };
        Failure::new(exit, e.to_string())
    }
}

type Outcome = Result<Exit, Failure>;

pub(crate) async fn execute(cli: Cli, mut cx: Context<'_>) -> Exit {
    let url = cli.database_url.clone();
    let result = match cli.command {
        Command::Migrate { folder } => migrate(&mut cx, url, &folder).await,
        Command::Migrations(Migrations::Generate { folder }) => {
            generate_migrations(&mut cx, &folder)
        }
        Command::Migrations(Migrations::Check { folder }) => check_migrations(&mut cx, &folder),
        Command::Status {
            json,
            tables,
            limit,
        } => status(&mut cx, url, &tables, limit, json).await,
        Command::Doctor {
            tables,
            limit,
            repair,
            requeue,
            json,
        } => {
            let actions = doctor::Actions { repair, requeue };
            doctor::doctor(&mut cx, url, &tables, limit, actions, json).await
        }
        Command::Retry {
            event_id,
            event_type,
            tables,
        } => retry(&mut cx, url, event_id, event_type, &tables).await,
        Command::Purge {
            older_than,
            tables,
            batch,
        } => purge(&mut cx, url, older_than, &tables, batch).await,
        Command::Grants {
            enqueuer,
            worker,
            tables,
            inbox_consumers,
        } => grants(&mut cx, &enqueuer, &worker, &tables, &inbox_consumers),
        #[cfg(feature = "dashboard")]
        Command::Dashboard(args) => dashboard(&mut cx, url, &args).await,
    };
    match result {
        Ok(exit) => exit,
        Err(failure) => {
            let _ = writeln!(cx.err, "error: {}", failure.message);
            failure.exit
        }
    }
}

/// The migrations folder: `--dir` (or `OUTBOX_MIGRATIONS_DIR`) as given, relative to the
/// current directory like any path typed on a command line; else the binary's default, which,
/// when relative, is relative to the package's directory when run by Cargo (`cargo run` sets
/// `CARGO_MANIFEST_DIR`), so the command finds the same folder from any directory, and to the
/// current directory otherwise (a deployed binary).
fn dir(cx: &Context<'_>, folder: &Folder) -> PathBuf {
    if let Some(given) = &folder.dir {
        return given.clone();
    }
    if cx.default_dir.is_relative() {
        if let Some(package) = std::env::var_os("CARGO_MANIFEST_DIR").filter(|d| !d.is_empty()) {
            return Path::new(&package).join(cx.default_dir);
        }
    }
    cx.default_dir.to_path_buf()
}

/// Why `migrations generate` and `check` refuse to run without events, and how to link them.
fn no_events_linked() -> Failure {
    // `cargo run` tells the binary its package; the library of a package `my-service` is the
    // crate `my_service`.
    let krate = std::env::var("CARGO_PKG_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .map(|name| name.replace('-', "_"))
        .unwrap_or_else(|| "your_service".to_owned());
    Failure::new(
        Exit::Usage,
        format!(
            "0 events are linked into this binary, so there is nothing to generate or check from. The `outbox` \
             command sees only the `#[derive(Event)]` types compiled into its own binary: a binary in src/bin/ does \
             not see src/main.rs, and links the package's library only when it names it. Put the events in \
             src/lib.rs and add `use {krate} as _;` to src/bin/outbox.rs (see docs/getting-started.md)"
        ),
    )
}

async fn connect(url: Option<String>) -> Result<PgPool, Failure> {
    let url = url.filter(|u| !u.is_empty()).ok_or_else(|| {
        Failure::new(
            Exit::Usage,
            "no database given: set DATABASE_URL or pass --database-url postgres://user@host/db",
        )
    })?;
    // sqlx reads any URL as connection options; another database's URL would be tried as
    // PostgreSQL and fail with a confusing message. Only the scheme is shown: the rest may hold
    // a password.
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "the database URL is not a PostgreSQL URL (it starts with `{}`): the outbox runs on PostgreSQL only; \
                 use postgres://user@host/db",
                scheme.map_or_else(|| "no scheme".to_owned(), |s| format!("{}://", shown(s)))
            ),
        ));
    }
    let options: PgConnectOptions = url.parse().map_err(|e| {
        Failure::new(
            Exit::Usage,
            format!("the database URL is not a PostgreSQL URL: {e}"),
        )
    })?;
    // Named for pg_stat_activity, unless the URL names the session itself.
    let options = if options.get_application_name().is_none() {
        options.application_name("outbox-cli")
    } else {
        options
    };
    // One direct connection first: a pool retries a refused connection until its acquire
    // timeout, and an operator should hear at once that the database is not there. The URL may
    // hold a password: it is never echoed.
    let probe = options.connect().await.map_err(|e| {
        Failure::new(
            Exit::Database,
            format!("cannot connect to the database: {e}"),
        )
    })?;
    let _ = probe.close().await;
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options))
}

/// The outbox tables this binary knows: `outbox` and every table its events name.
fn known_tables(cx: &Context<'_>) -> Vec<String> {
    tables_or_default(cx, &[])
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// A statement on `table` failed. A missing table is told apart: a name that no linked event
/// writes to is most likely mistyped; a known one has not been created yet.
fn table_failure(table: &str, known: &[String], error: crate::Error) -> Failure {
    let missing = matches!(
        &error,
        crate::Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01")
    );
    if !missing {
        return Failure::from(error);
    }
    let message = if known.iter().any(|k| k == table) {
        format!(
            "the outbox table `{table}` does not exist in this database: run `outbox migrate` to create the base \
             schema and apply the service's migrations"
        )
    } else {
        format!(
            "there is no table `{table}` in this database, and none of this binary's events writes to one of that \
             name: check --table (the outbox tables of this binary: {})",
            known.join(", ")
        )
    };
    Failure::new(Exit::Database, message)
}

/// The tables a command reads or changes ([`tables_or_default`]), each name checked: a bad name
/// is the caller's mistake whether or not the database is reachable, so it is refused before
/// connecting.
fn chosen_tables(cx: &Context<'_>, given: &[String]) -> Result<Vec<String>, Failure> {
    let tables: Vec<String> = tables_or_default(cx, given)
        .into_iter()
        .map(str::to_owned)
        .collect();
    for table in &tables {
        crate::store::validate_table_name(table)?;
    }
    Ok(tables)
}

/// The outbox tables of this binary, the one place every command learns them from: `outbox`
/// plus every table the events name, sorted, unless `--table` was given.
fn tables_or_default<'a>(cx: &'a Context<'_>, given: &'a [String]) -> Vec<&'a str> {
    if !given.is_empty() {
        return given.iter().map(String::as_str).collect();
    }
    let mut tables: BTreeSet<&str> = cx.events.iter().map(|e| e.table.as_str()).collect();
    tables.insert(DEFAULT_TABLE);
    tables.into_iter().collect()
}

async fn migrate(cx: &mut Context<'_>, url: Option<String>, folder: &Folder) -> Outcome {
    let dir = dir(cx, folder);
    let pool = connect(url).await?;
    crate::migrate(&pool).await?;
    let _ = writeln!(
        cx.out,
        "base schema: up to date ({})",
        crate::migrate::MIGRATIONS_TABLE
    );
    if dir.is_dir() {
        let migrator = sqlx::migrate::Migrator::new(dir.as_path())
            .await
            .map_err(|e| Failure::new(Exit::Files, format!("{}: {e}", dir.display())))?;
        migrator.run(&pool).await.map_err(crate::Error::from)?;
        let _ = writeln!(
            cx.out,
            "service migrations: {} up to date ({} files)",
            dir.display(),
            migrator.iter().count()
        );
    } else {
        let _ = writeln!(
            cx.out,
            "service migrations: {} does not exist, skipped",
            dir.display()
        );
    }
    if cx.events.is_empty() {
        let _ = writeln!(
            cx.err,
            "warning: 0 events are linked into this binary, so the contract check compares nothing \
             (`outbox migrations check` says how to link them)"
        );
    }
    let compiled: Vec<_> = cx.events.iter().map(|e| e.contract.clone()).collect();
    let comparison = generate::verify_contracts(&pool, &compiled).await?;
    let _ = writeln!(
        cx.out,
        "contract registry: agrees with this binary ({} compiled, {} not registered)",
        compiled.len(),
        comparison.unregistered.len()
    );
    Ok(Exit::Ok)
}

fn warn_removed(cx: &mut Context<'_>, removed: &[generate::RemovedContract]) {
    for r in removed {
        let _ = writeln!(cx.err, "warning: {}", r.warning());
    }
}

fn generate_migrations(cx: &mut Context<'_>, folder: &Folder) -> Outcome {
    if cx.events.is_empty() {
        return Err(no_events_linked());
    }
    let dir = dir(cx, folder);
    let outcome = generate::generate_migrations(&dir, cx.events)?;
    warn_removed(cx, &outcome.removed);
    match (&outcome.written_migration, outcome.lock_written) {
        (None, false) => {
            let _ = writeln!(cx.out, "{} is up to date: nothing written", dir.display());
        }
        (migration, lock) => {
            if let Some(file) = migration {
                let _ = writeln!(cx.out, "wrote {}", dir.join(file).display());
            }
            if lock {
                let _ = writeln!(cx.out, "wrote {}", dir.join(LOCK_FILE).display());
            }
            let _ = writeln!(cx.out, "review and commit them with the event change");
        }
    }
    Ok(Exit::Ok)
}

fn check_migrations(cx: &mut Context<'_>, folder: &Folder) -> Outcome {
    if cx.events.is_empty() {
        return Err(no_events_linked());
    }
    let dir = dir(cx, folder);
    let outcome = generate::check_migrations(&dir, cx.events)?;
    warn_removed(cx, &outcome.removed);
    if outcome.is_up_to_date() {
        let _ = writeln!(
            cx.out,
            "{} is up to date ({} event versions)",
            dir.display(),
            cx.events.len()
        );
        return Ok(Exit::Ok);
    }
    for reason in &outcome.stale {
        let _ = writeln!(cx.err, "stale: {reason}");
    }
    if !dir.exists() {
        return Err(Failure::new(
            Exit::Failed,
            format!(
                "the migrations folder {} does not exist: pass the service's folder with --dir (or \
                 OUTBOX_MIGRATIONS_DIR), or run `outbox migrations generate --dir {}` to create it",
                dir.display(),
                dir.display()
            ),
        ));
    }
    Err(Failure::new(
        Exit::Failed,
        format!(
            "{} is out of date with the event definitions: run `outbox migrations generate --dir {}` and commit the result",
            dir.display(),
            dir.display()
        ),
    ))
}

async fn status(
    cx: &mut Context<'_>,
    url: Option<String>,
    tables: &[String],
    limit: i64,
    json: bool,
) -> Outcome {
    let tables = chosen_tables(cx, tables)?;
    let pool = connect(url).await?;
    let known = known_tables(cx);
    let mut reports = Vec::new();
    for table in &tables {
        let store = Store::for_table(pool.clone(), table)?;
        let failed = |e| table_failure(table, &known, e);
        let stats = store.stats().await.map_err(failed)?;
        let exhausted = store.exhausted_events(limit).await.map_err(failed)?;
        // Shown when it can be read: a base schema older than outbox_workers has no list of
        // live workers, which leaves the rest of the status as it was.
        let unhandled = store
            .unhandled_events(UNHANDLED_LOOKED_AT)
            .await
            .unwrap_or_default();
        reports.push((table.as_str(), stats, exhausted, unhandled));
    }
    if json {
        let value = serde_json::json!({
            "tables": reports.iter().map(|(t, s, e, u)| status_json(t, s, e, u)).collect::<Vec<_>>()
        });
        let _ = writeln!(
            cx.out,
            "{}",
            serde_json::to_string_pretty(&value).expect("JSON serializes")
        );
    } else {
        for (i, (table, stats, exhausted, unhandled)) in reports.iter().enumerate() {
            if i > 0 {
                let _ = writeln!(cx.out);
            }
            let _ = write!(cx.out, "{}", status_table(table, stats, exhausted));
            let _ = write!(cx.out, "{}", unhandled_lines(unhandled));
        }
    }
    Ok(Exit::Ok)
}

/// The oldest ready pending events `status` looks at for events no worker handles.
const UNHANDLED_LOOKED_AT: i64 = 10_000;

fn status_json(
    table: &str,
    stats: &Stats,
    exhausted: &[ExhaustedEvent],
    unhandled: &[UnhandledEvents],
) -> serde_json::Value {
    serde_json::json!({
        "unhandled": unhandled.iter().map(|u| serde_json::json!({
            "event_type": u.event_type,
            "event_version": u.event_version,
            "waiting": u.waiting,
            "since": u.since,
            "live_workers": u.live_workers,
        })).collect::<Vec<_>>(),
        "table": table,
        "pending": stats.pending,
        "processing": stats.processing,
        "delivered": stats.delivered,
        "exhausted": stats.exhausted,
        "oldest_pending_age_seconds": stats.oldest_pending_age.map(|d| d.as_secs_f64()),
        "exhausted_events": exhausted.iter().map(|e| serde_json::json!({
            "event_id": e.event_id,
            "event_type": e.event_type,
            "event_version": e.event_version,
            "attempts": e.attempts,
            "lease_expiries": e.lease_expiries,
            "handler_failures": e.handler_failures,
            "last_error": e.last_error,
            "exhausted_at": e.updated_at,
        })).collect::<Vec<_>>(),
    })
}

/// The events that wait because no running worker handles them, one line per type and
/// version ("no worker handles order.confirmed v3 since ..."), or nothing.
fn unhandled_lines(unhandled: &[UnhandledEvents]) -> String {
    let mut s = String::new();
    for u in unhandled {
        let workers = if u.live_workers == 0 {
            " (no live worker is listed in outbox_workers)"
        } else {
            ""
        };
        s.push_str(&format!(
            "  no worker handles {} v{} since {} ({} ago): {} waiting, not failed; deploy a worker that handles it{workers}\n",
            terminal_safe(&u.event_type),
            u.event_version,
            u.since.format("%Y-%m-%d %H:%M:%S UTC"),
            format_duration(u.age),
            u.waiting,
        ));
    }
    s
}

/// The people's view of one table.
fn status_table(table: &str, stats: &Stats, exhausted: &[ExhaustedEvent]) -> String {
    let mut s = format!("table {table}\n");
    let oldest = stats
        .oldest_pending_age
        .map(|d| format!("   oldest {}", format_duration(d)))
        .unwrap_or_default();
    s.push_str(&format!("  pending     {:>10}{oldest}\n", stats.pending));
    s.push_str(&format!("  processing  {:>10}\n", stats.processing));
    s.push_str(&format!("  delivered   {:>10}\n", stats.delivered));
    s.push_str(&format!("  exhausted   {:>10}\n", stats.exhausted));
    if exhausted.is_empty() {
        return s;
    }
    let type_width = exhausted
        .iter()
        .map(|e| terminal_safe(&e.event_type).chars().count())
        .max()
        .unwrap_or(0)
        .max("TYPE".len());
    s.push_str(&format!(
        "\n  exhausted events (newest first, {} shown):\n",
        exhausted.len()
    ));
    s.push_str(&format!(
        "  {:<36}  {:<type_width$}  {:>7}  {:>8}  {:>7}  {:>8}  LAST ERROR\n",
        "EVENT ID", "TYPE", "VERSION", "ATTEMPTS", "EXPIRED", "FAILURES"
    ));
    for e in exhausted {
        let error = e
            .last_error
            .as_deref()
            .unwrap_or("-")
            .replace(['\n', '\r'], " ");
        let error = terminal_safe(&error);
        let error: String = if error.chars().count() > 120 {
            error.chars().take(117).chain("...".chars()).collect()
        } else {
            error
        };
        s.push_str(&format!(
            "  {:<36}  {:<type_width$}  {:>7}  {:>8}  {:>7}  {:>8}  {error}\n",
            e.event_id.to_string(),
            terminal_safe(&e.event_type),
            e.event_version,
            e.attempts,
            e.lease_expiries,
            e.handler_failures
        ));
    }
    s
}

/// Text from the database as it may reach a terminal: control characters (ANSI escapes, bells,
/// C1 codes) are printed as `\u{..}` escapes instead of being obeyed. A receiver's body lands
/// in `last_error`, and raw SQL can write any event type, so both are attacker-controlled.
fn terminal_safe(text: &str) -> String {
    let mut safe = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            safe.extend(c.escape_unicode());
        } else {
            safe.push(c);
        }
    }
    safe
}

/// `retry <id>` looks for the event in every table chosen (an event id is derived from its
/// table, so it is in one at most) and says which table it acted on; `retry --type` acts on
/// every table chosen and reports each.
async fn retry(
    cx: &mut Context<'_>,
    url: Option<String>,
    event_id: Option<uuid::Uuid>,
    event_type: Option<String>,
    given: &[String],
) -> Outcome {
    let tables = chosen_tables(cx, given)?;
    let pool = connect(url).await?;
    let known = known_tables(cx);
    let mut stores = Vec::with_capacity(tables.len());
    for table in &tables {
        stores.push(Store::for_table(pool.clone(), table)?);
    }
    match (event_id, event_type) {
        (Some(id), _) => retry_event(cx, &stores, &known, id, given.is_empty()).await,
        (None, Some(name)) => retry_type(cx, &stores, &known, &name).await,
        (None, None) => Err(Failure::new(
            Exit::Usage,
            "give an event id or --type <name>",
        )),
    }
}

async fn retry_event(
    cx: &mut Context<'_>,
    stores: &[Store],
    known: &[String],
    id: uuid::Uuid,
    every_table: bool,
) -> Outcome {
    for store in stores {
        let table = store.table();
        if store
            .retry_exhausted(id)
            .await
            .map_err(|e| table_failure(table, known, e))?
        {
            let _ = writeln!(
                cx.out,
                "event {id} in table {table} is pending again with fresh attempts"
            );
            return Ok(Exit::Ok);
        }
    }
    let searched: Vec<&str> = stores.iter().map(Store::table).collect();
    let searched = if searched.len() == 1 {
        format!("table {}", searched[0])
    } else {
        format!("tables {}", searched.join(", "))
    };
    // Not exhausted: say where it is and what it is doing, so the operator need not look.
    for store in stores {
        let table = store.table();
        let status = store
            .event_status(id)
            .await
            .map_err(|e| table_failure(table, known, e))?;
        if let Some(status) = status {
            return Err(Failure::new(
                Exit::Failed,
                format!(
                    "no exhausted event {id} in {searched}: it is {} in table {table}, so there is nothing to retry \
                     (see `outbox status`)",
                    status_word(status)
                ),
            ));
        }
    }
    let hint = if every_table {
        "every outbox table of this binary; for a table it does not know, pass --table <name>"
    } else {
        "only the tables given with --table; without --table every outbox table of this binary is searched"
    };
    Err(Failure::new(
        Exit::Failed,
        format!(
            "no exhausted event {id} in {searched}: no event has that id there (never enqueued there, or purged \
             after delivery). Searched {hint}"
        ),
    ))
}

fn status_word(status: crate::store::EventStatus) -> &'static str {
    use crate::store::EventStatus as S;
    match status {
        S::Pending => "pending",
        S::Processing => "processing",
        S::Delivered => "delivered",
        S::Exhausted => "exhausted",
    }
}

async fn retry_type(
    cx: &mut Context<'_>,
    stores: &[Store],
    known: &[String],
    name: &str,
) -> Outcome {
    let mut total: u64 = 0;
    for store in stores {
        let table = store.table();
        let n = store
            .retry_exhausted_of_type(name)
            .await
            .map_err(|e| table_failure(table, known, e))?;
        total += n;
        let _ = writeln!(
            cx.out,
            "{n} exhausted events of type {name} in table {table} are pending again with fresh attempts"
        );
    }
    if stores.len() > 1 {
        let _ = writeln!(cx.out, "{total} in all, in {} tables", stores.len());
    }
    Ok(Exit::Ok)
}

/// Purges every table chosen in turn, one line each.
async fn purge(
    cx: &mut Context<'_>,
    url: Option<String>,
    older_than: Duration,
    given: &[String],
    batch: i64,
) -> Outcome {
    if batch < 1 {
        return Err(Failure::new(
            Exit::Usage,
            format!("--batch must be at least 1, not {batch}"),
        ));
    }
    let tables = chosen_tables(cx, given)?;
    let pool = connect(url).await?;
    let known = known_tables(cx);
    let mut all: u64 = 0;
    for table in &tables {
        let store = Store::for_table(pool.clone(), table)?;
        let mut total: u64 = 0;
        // Bounded batches: each statement holds its locks briefly, however much history there is.
        loop {
            let deleted = store
                .purge_delivered(older_than, batch)
                .await
                .map_err(|e| table_failure(table, &known, e))?;
            total += deleted;
            if deleted < batch.unsigned_abs() {
                break;
            }
        }
        all += total;
        let _ = writeln!(
            cx.out,
            "deleted {total} delivered events older than {} from {table}",
            format_duration(older_than)
        );
    }
    if tables.len() > 1 {
        let _ = writeln!(cx.out, "deleted {all} in all, from {} tables", tables.len());
    }
    Ok(Exit::Ok)
}

fn grants(
    cx: &mut Context<'_>,
    enqueuer: &str,
    worker: &str,
    tables: &[String],
    inbox_consumers: &[String],
) -> Outcome {
    let tables = tables_or_default(cx, tables);
    let sql = generate::grants_sql(&tables, enqueuer, worker)?;
    let _ = write!(cx.out, "{sql}");
    if !inbox_consumers.is_empty() {
        let consumers: Vec<&str> = inbox_consumers.iter().map(String::as_str).collect();
        let _ = write!(cx.out, "\n{}", generate::inbox_grants_sql(&consumers)?);
    }
    Ok(Exit::Ok)
}

#[cfg(feature = "dashboard")]
async fn dashboard(
    cx: &mut Context<'_>,
    url: Option<String>,
    args: &crate::dashboard::DashboardArgs,
) -> Outcome {
    let tables = tables_or_default(cx, &args.tables)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let (config, listen) = args
        .config(tables, cx.events)
        .map_err(|e| Failure::new(Exit::Usage, e))?;
    let pool = connect(url).await?;
    crate::dashboard::run_command(pool, &listen, config, cx.out)
        .await
        .map_err(|e| Failure::new(Exit::Failed, e.to_string()))?;
    Ok(Exit::Ok)
}
