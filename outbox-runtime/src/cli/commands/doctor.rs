//! `outbox doctor`: whether the database keeps each table's invariants, and the rows that break
//! them anyway (`store::integrity`), with `--repair` and `--requeue` to mend them.

use super::{Context, Exit, Failure, Outcome, connect, known_tables, table_failure, terminal_safe};
use crate::store::Store;
use crate::store::integrity::{IntegrityReport, RuleState};

/// What the operator asked the doctor to mend besides reporting.
pub(super) struct Actions {
    /// Delete orphan queue rows and validate the foreign key.
    pub repair: bool,
    /// Queue the events that were never claimed.
    pub requeue: bool,
}

pub(super) async fn doctor(
    cx: &mut Context<'_>,
    url: Option<String>,
    tables: &[String],
    limit: i64,
    actions: Actions,
    json: bool,
) -> Outcome {
    let tables: Vec<String> = super::tables_or_default(cx, tables)
        .into_iter()
        .map(str::to_owned)
        .collect();
    for table in &tables {
        crate::store::validate_table_name(table)?;
    }
    let pool = connect(url).await?;
    let known = known_tables(cx);
    let mut reports = Vec::new();
    let mut mended = Vec::new();
    for table in &tables {
        let store = Store::for_table(pool.clone(), table)?;
        let failed = |e| table_failure(table, &known, e);
        if actions.repair {
            let deleted = store.delete_orphan_queue_rows().await.map_err(failed)?;
            mended.push(format!(
                "table {table}: deleted {} queue rows without an event",
                deleted.len()
            ));
        }
        if actions.requeue {
            let queued = store.requeue_unqueued_events().await.map_err(failed)?;
            mended.push(format!(
                "table {table}: queued {} events that were never claimed",
                queued.len()
            ));
        }
        reports.push(store.check_integrity(limit).await.map_err(failed)?);
    }
    if json {
        let value = serde_json::json!({
            "tables": reports.iter().map(IntegrityReport::to_json).collect::<Vec<_>>(),
            "mended": mended,
        });
        let _ = writeln!(cx.out, "{value:#}");
    } else {
        for line in &mended {
            let _ = writeln!(cx.out, "{line}");
        }
        for report in &reports {
            let _ = write!(cx.out, "{}", report_text(report));
        }
    }
    if reports.iter().all(IntegrityReport::is_healthy) {
        Ok(Exit::Ok)
    } else {
        Err(Failure::new(
            Exit::Failed,
            "the database does not keep every invariant (above); `outbox doctor --help` says how to mend each",
        ))
    }
}

fn rule_text(rule: &RuleState, name: &str, fix: &str) -> String {
    match rule {
        RuleState::On => format!("  ok       {name}\n"),
        RuleState::Missing => format!("  MISSING  {name}: {fix}\n"),
        RuleState::Off(why) => format!("  OFF      {name}: {why}\n"),
    }
}

fn report_text(report: &IntegrityReport) -> String {
    let migrate =
        "run `outbox migrations generate` and `outbox migrate` (the base table: `outbox migrate`)";
    let mut s = format!("table {}\n", report.table);
    s.push_str(&rule_text(
        &report.queue_row_trigger,
        "every inserted event gets its queue row (trigger)",
        migrate,
    ));
    s.push_str(&rule_text(
        &report.queue_row_key,
        "a queue row cannot outlive its event (foreign key)",
        migrate,
    ));
    if report.orphan_queue_rows == 0 {
        s.push_str("  ok       no queue row without its event\n");
    } else {
        s.push_str(&format!(
            "  FOUND    {} queue rows without their event (deleted by SQL): claimed and charged for nothing; \
             `outbox doctor --repair` deletes them\n",
            report.orphan_queue_rows
        ));
        for o in &report.orphan_sample {
            s.push_str(&format!(
                "             id {:>12}  {:<10}  attempts {:>3}  {}\n",
                o.id,
                o.status,
                o.attempts,
                terminal_safe(o.last_error.as_deref().unwrap_or("-"))
            ));
        }
    }
    if report.unqueued_events == 0 {
        s.push_str("  ok       no event reads as delivered without having been queued\n");
    } else {
        s.push_str(&format!(
            "  FOUND    {} events that read as delivered but were inserted without their queue row (not by the \
             library): no worker ever claimed them; `outbox doctor --requeue` queues them for delivery\n",
            report.unqueued_events
        ));
        for e in &report.unqueued_sample {
            s.push_str(&format!(
                "             id {:>12}  {}  {} v{}  key {}  inserted {}\n",
                e.id,
                e.event_id,
                terminal_safe(&e.event_type),
                e.event_version,
                terminal_safe(&e.operation_key),
                e.created_at.format("%Y-%m-%d %H:%M:%S UTC")
            ));
        }
    }
    s
}
