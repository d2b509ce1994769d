//! A witness for every guard: each predicate of each WHERE clause of each statement that writes
//! rows has a row state in which it alone decides. The witness runs the statement as written
//! and the statement with that predicate replaced by `TRUE` (edited at test time) on the same
//! rows, and the two must change different rows. So a guard nobody defends (removing it breaks
//! no test) cannot exist: removing it from the SQL file leaves its witness without a predicate,
//! and a new predicate without a witness fails `every_predicate_has_a_witness`.
//!
//! The predicates are read from the SQL files (`outbox_runtime::store::sql::STATEMENTS`,
//! rendered for the table `outbox`) by `guards_support/parse.rs`: the top-level AND-ed conjuncts
//! of every WHERE, nested ones included (a CTE's, a `NOT EXISTS` subquery's); a parenthesised
//! conjunct is one predicate. A statement of a shape the reader does not know fails loudly.
//! SET lists and RETURNING clauses are not read, so changing them needs no new witness. A guard
//! that is a clause rather than a predicate (the enqueue's `ON CONFLICT (event_id) DO NOTHING`)
//! has clause witnesses, which replace the clause by a weaker spelling; every statement with an
//! `ON CONFLICT` must have them.
//!
//! # Adding a witness (a new guard, or a changed one)
//!
//! `every_predicate_has_a_witness` prints the statement and the predicate text that lack one.
//! Add an entry to [`witnesses`]:
//!
//! ```text
//! witness("complete", "lease_until > now()")      // statement name, predicate as printed
//!     .row("a", EXPIRED)                          // rows: a label and a SET list on a default
//!                                                 //   pending event and its queue row (either
//!                                                 //   table's columns); ids ascend
//!     .params([Id("a"), Int(1)])                  // $1, $2, ... (Id/Ids/EventId name rows)
//!     .without([Dequeued("a")]),                  // what changes once the predicate is TRUE
//! ```
//!
//! `.delivered("b", set)` sets up a delivered event (no queue row). The changes are per event:
//! `Updated` (the event or its queue row changed), `Dequeued` (the queue row deleted, the event
//! kept: delivered), `Deleted` (the event deleted), and `Added` for rows no witness set up.
//! `.real([...])` says what the statement as written changes (default: nothing), for predicates
//! that restrict a blocker (inside `NOT EXISTS`) and so let more rows through when they hold;
//! `.real_fails(sqlstate)` / `.without_fails(sqlstate)` expect an error instead.
//! `.forbidden_by_schema()` marks a state the queue's status CHECK refuses (the runner proves it
//! does, then drops it inside the rolled-back transaction). `.implied("why")` marks a predicate
//! no row state can make decide (kept for an index); the runner checks removing it changes
//! nothing. `.clause(replacement)` makes a clause witness; `.setup(sql)` runs DDL first.
//! A statement that only reads goes in [`READ_ONLY`] (the test checks it writes nothing).
//! Every witness runs in its own rolled-back transaction on one test database, so `now()` is
//! one instant for the setup and both runs.

mod guards_support;

use std::collections::BTreeMap;

use guards_support::Change::{Deleted, Dequeued, Updated};
use guards_support::Param::{
    Bool, Bytes, EventId, Id, Ids, Int, Int4, Int4s, Ints, Json, NoEventId, NullText, Text, Texts,
};
use guards_support::parse::{Predicate, predicates, strip_comments, without, writes};
use guards_support::{Change, Param, Witness, play, witness};
use outbox_runtime::store::sql::{STATEMENTS, TABLE_PLACEHOLDER};
use outbox_runtime::testing::TestDatabase;

/// Statements that change no row: their filters decide what is read, not what is written.
const READ_ONLY: &[&str] = &[
    "existing_by_key",
    "completed_earlier",
    "lock_free_rows",
    "count_delivered",
    "gauges",
    "exhausted_events",
    "event_status",
    "unhandled_events",
];

/// Claimed by someone (claim 1) whose lease is live.
const LIVE: &str = "status = 'processing', claim_version = 1, attempts = 1, lease_until = now() + interval '1 hour'";
/// Claimed by someone (claim 1) whose lease ran out.
const EXPIRED: &str = "status = 'processing', claim_version = 1, attempts = 1, lease_until = now() - interval '1 minute'";
/// Not claimed any more, though a lease time is still written (the schema allows it).
const PENDING_WITH_LEASE: &str =
    "claim_version = 1, attempts = 1, lease_until = now() + interval '1 hour'";
/// Pending, not available for an hour (a backoff).
const LATER: &str = "available_at = now() + interval '1 hour'";
const EXHAUSTED: &str = "status = 'exhausted', exhausted_at = now(), attempts = 3";
/// Enqueued a month ago (the purge's retention counts from the enqueue).
const MONTH_OLD: &str = "created_at = now() - interval '30 days'";

const ONE_MINUTE_US: i64 = 60_000_000;
const ONE_HOUR_US: i64 = 3_600_000_000;

/// `text` as a `&'static str` (predicate texts are built from a statement's alias).
fn leak(text: String) -> &'static str {
    text.leak()
}

/// The four fences of a statement that acts on one claim (id, claim_version, status
/// processing, live lease), with its parameters for row `a` claimed as claim 1. `batched`
/// names the alias of the queue table in a batched statement (its pairs are `c`).
fn fenced(
    statement: &'static str,
    batched: Option<&'static str>,
    params: fn(ids: &'static [&'static str], versions: &'static [i64]) -> Vec<Param>,
    effect: fn(&'static str) -> Change,
) -> Vec<Witness> {
    let version = match batched {
        Some(q) => leak(format!("{q}.claim_version = c.claim_version")),
        None => "claim_version = $2",
    };
    let mut all = vec![
        // An earlier claim of the row: only the version decides.
        witness(statement, version)
            .row("a", LIVE)
            .params(params(&["a"], &[0]))
            .without([effect("a")]),
    ];
    if let Some(q) = batched {
        all.extend([
            // The status and lease fence, as one predicate the planner cannot estimate: `a`
            // is no longer claimed (though a lease time is still written), `b`'s lease ran out.
            // Each is kept out by one branch; without the predicate both change.
            witness(statement, batched_fence(q))
                .row("a", PENDING_WITH_LEASE)
                .row("b", EXPIRED)
                .params(params(&["a", "b"], &[1, 1]))
                .without([effect("a"), effect("b")]),
            // The pairing: both rows are in the batch (so `q.id = ANY($1)` holds for each), but
            // only `b`'s pair carries its claim. Without the join on id, `a` would be taken by
            // `b`'s claim version.
            witness(statement, leak(format!("{q}.id = c.id")))
                .row("a", LIVE)
                .row("b", LIVE)
                .params(params(&["a", "b"], &[0, 1]))
                .real([effect("b")])
                .without([effect("a"), effect("b")]),
            witness(statement, leak(format!("{q}.id = ANY($1::bigint[])")))
                .row("a", LIVE)
                .params(params(&["a"], &[1]))
                .real([effect("a")])
                .without([effect("a")])
                .implied(
                    "`id = c.id` already keeps the ids to the batch's; this spelling lets the \
                     planner probe the primary key once per id whatever the statistics say",
                ),
        ]);
    } else {
        all.extend([
            // Another row's id (none): only the id decides.
            witness(statement, "id = $1")
                .row("a", LIVE)
                .params(params(&["nothing"], &[1]))
                .without([effect("a")]),
            witness(statement, "status = 'processing'")
                .row("a", PENDING_WITH_LEASE)
                .params(params(&["a"], &[1]))
                .without([effect("a")]),
            witness(statement, "lease_until > now()")
                .row("a", EXPIRED)
                .params(params(&["a"], &[1]))
                .without([effect("a")]),
        ]);
    }
    all
}

/// The batched statements' fence: status processing and a live lease, in a CASE so that stale
/// statistics cannot mislead the planner (see complete_many.sql).
fn batched_fence(q: &str) -> &'static str {
    leak(format!(
        "(CASE WHEN {q}.status = 'processing' THEN {q}.lease_until > now() ELSE false END)"
    ))
}

/// `id` of the first row named, or an id no row has.
fn one_id(ids: &'static [&'static str]) -> Param {
    if ids == ["nothing"] {
        Int(-1)
    } else {
        Id(ids[0])
    }
}

fn many_ids(ids: &'static [&'static str]) -> Param {
    Ids(ids)
}

/// The enqueue's parameters for event id `event_id` of an event of aggregate `order`/`A` (with
/// `aggregate`) or of none, and, for the notifying enqueue, its channel.
fn enqueue_params(statement: &str, event_id: Param, aggregate: bool) -> Vec<Param> {
    let (aggregate_type, aggregate_id) = if aggregate {
        (Text("order"), Text("A"))
    } else {
        (NullText, NullText)
    };
    let mut params = vec![
        event_id,
        Text("witness-key"),
        Bytes(b"\x00"),
        Text("witness.event"),
        Int4(1),
        aggregate_type,
        aggregate_id,
        Int(1),
        Json("{}"),
        Json("{}"),
        Int4(3),
        Int(0),
    ];
    if statement == "enqueue_notify" {
        params.push(Text("outbox"));
    }
    params
}

fn witnesses() -> Vec<Witness> {
    let mut all = Vec::new();
    // Completion deletes the queue row (the event stays, delivered); retention zero deletes
    // both.
    all.extend(fenced(
        "complete",
        None,
        |ids, v| vec![one_id(ids), Int(v[0])],
        Dequeued,
    ));
    all.extend(fenced(
        "complete_many",
        Some("q"),
        |ids, v| vec![many_ids(ids), Ints(v)],
        Dequeued,
    ));
    all.extend(fenced(
        "complete_many_delete",
        Some("q"),
        |ids, v| vec![many_ids(ids), Ints(v)],
        Deleted,
    ));
    // Retention zero deletes the events of the claims it completed, never another event: not
    // the event of a lost claim of its batch (`b`, whose lease ran out), nor a delivered one
    // (`c`) or an open one (`d`) outside the batch.
    all.push(
        witness(
            "complete_many_delete",
            "id = ANY (ARRAY(SELECT id FROM completed))",
        )
        .row("a", LIVE)
        .row("b", EXPIRED)
        .delivered("c", "")
        .row("d", "")
        .params([Ids(&["a", "b"]), Ints(&[1, 1])])
        .real([Deleted("a")])
        .without([Deleted("a"), Deleted("b"), Deleted("c"), Deleted("d")]),
    );
    all.extend(fenced(
        "renew",
        None,
        |ids, v| vec![one_id(ids), Int(v[0]), Int(ONE_MINUTE_US)],
        Updated,
    ));
    all.extend(fenced(
        "renew_many",
        Some("o"),
        |ids, v| vec![many_ids(ids), Ints(v), Int(ONE_MINUTE_US)],
        Updated,
    ));
    all.extend(fenced(
        "fail",
        None,
        |ids, v| {
            vec![
                one_id(ids),
                Int(v[0]),
                Text("receiver said no"),
                Int(ONE_MINUTE_US),
                Bool(false),
            ]
        },
        Updated,
    ));
    all.extend(fenced(
        "release",
        None,
        |ids, v| vec![one_id(ids), Int(v[0])],
        Updated,
    ));
    all.extend(fenced(
        "exhaust_undecodable",
        None,
        |ids, v| vec![one_id(ids), Int(v[0]), Text("payload nested too deep")],
        Updated,
    ));

    let plain_claim = || vec![Int(10), Int(ONE_MINUTE_US), Text("worker-w")];
    // A worker whose sink handles the witnesses' events (`witness.event` v1).
    let handled_claim = || {
        vec![
            Int(10),
            Int(ONE_MINUTE_US),
            Text("worker-w"),
            Texts(&["witness.event"]),
            Int4s(&[1]),
        ]
    };
    for (statement, prefix, claim) in [
        ("claim_batch", "", plain_claim as fn() -> Vec<Param>),
        ("claim_batch_ordered", "o.", plain_claim),
        ("claim_batch_handled", "q.", handled_claim),
        ("claim_batch_ordered_handled", "o.", handled_claim),
    ] {
        let p = |pred: &str| -> &'static str { leak(format!("{prefix}{pred}")) };
        all.extend([
            witness(statement, "q.id = ANY (ARRAY(SELECT id FROM candidates))")
                .row("a", LATER)
                .params(claim())
                .without([Updated("a")]),
            witness(statement, p("exhausted_at IS NULL"))
                .row("a", "exhausted_at = now()")
                .forbidden_by_schema()
                .params(claim())
                .without([Updated("a")]),
            witness(statement, p("available_at <= now()"))
                .row("a", LATER)
                .params(claim())
                .without([Updated("a")]),
            // A live claim is not claimed again: the double-delivery guard.
            witness(statement, p("status = 'pending'"))
                .row("a", LIVE)
                .params(claim())
                .without([Updated("a")]),
        ]);
    }

    // The claim of a sink that names its events: an event of a type or version it does not
    // handle is left alone (pending, uncharged), for the worker that handles it.
    let other_handler = || {
        vec![
            Int(10),
            Int(ONE_MINUTE_US),
            Text("worker-w"),
            Texts(&["witness.event"]),
            Int4s(&[2]),
        ]
    };
    for (statement, alias) in [
        ("claim_batch_handled", "e"),
        ("claim_batch_ordered_handled", "ev"),
    ] {
        all.push(
            witness(
                statement,
                leak(format!(
                    "({alias}.event_type, {alias}.event_version) IN ( SELECT h.event_type, \
                     h.event_version FROM unnest($4::text[], $5::integer[]) AS h(event_type, \
                     event_version))"
                )),
            )
            .row("a", "")
            .params(other_handler())
            .without([Updated("a")]),
        );
    }

    // The ordered claim's aggregate rule. `b` waits while an earlier event of its aggregate is
    // open (has a queue row that is not exhausted); the NOT EXISTS predicates narrow what
    // blocks `b`, so without one of them `b` (or `a` itself) is blocked where it should not be.
    // A delivered earlier event has no queue row, so nothing in the check can see it.
    const ORDER_A: &str = "aggregate_type = 'order', aggregate_id = 'A'";
    for (ordered, claim) in [
        ("claim_batch_ordered", plain_claim as fn() -> Vec<Param>),
        ("claim_batch_ordered_handled", handled_claim),
    ] {
        all.extend([
            witness(
                ordered,
                "(o.aggregate_id IS NULL OR NOT EXISTS ( SELECT 1 FROM outbox_queue AS e WHERE \
                 e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id AND e.id < \
                 o.id AND e.exhausted_at IS NULL))",
            )
            .row("a", "aggregate_type = 'order', aggregate_id = 'A', status = 'processing', claim_version = 1, lease_until = now() + interval '1 hour'")
            .row("b", ORDER_A)
            .params(claim())
            .without([Updated("b")]),
            witness(ordered, "e.aggregate_type = o.aggregate_type")
                .row("a", "aggregate_type = 'invoice', aggregate_id = 'A', status = 'processing', claim_version = 1, lease_until = now() + interval '1 hour'")
                .row("b", ORDER_A)
                .params(claim())
                .real([Updated("b")]),
            witness(ordered, "e.aggregate_id = o.aggregate_id")
                .row("a", "aggregate_type = 'order', aggregate_id = 'Z', status = 'processing', claim_version = 1, lease_until = now() + interval '1 hour'")
                .row("b", ORDER_A)
                .params(claim())
                .real([Updated("b")]),
            // Without `e.id < o.id` an open event blocks itself.
            witness(ordered, "e.id < o.id")
                .row("a", ORDER_A)
                .params(claim())
                .real([Updated("a")]),
            // An exhausted event does not hold its aggregate back (see claim_batch_ordered.sql).
            witness(ordered, "e.exhausted_at IS NULL")
                .row("a", "aggregate_type = 'order', aggregate_id = 'A', status = 'exhausted', exhausted_at = now(), attempts = 3")
                .row("b", ORDER_A)
                .params(claim())
                .real([Updated("b")]),
        ]);
    }

    // limit, backoff base, backoff cap, jitter.
    let recover = || [Int(10), Int(ONE_MINUTE_US), Int(ONE_HOUR_US), Bool(false)];
    let recover_name = "recover_expired";
    all.extend([
        witness(recover_name, "o.id = ANY (ARRAY(SELECT id FROM expired))")
            .row("a", LIVE)
            .params(recover())
            .without([Updated("a")]),
        witness(recover_name, "exhausted_at IS NULL")
            .row("a", "status = 'processing', claim_version = 1, lease_until = now() - interval '1 minute', exhausted_at = now()")
            .forbidden_by_schema()
            .params(recover())
            .without([Updated("a")]),
        witness(recover_name, "status = 'processing'")
            .row("a", "claim_version = 1, lease_until = now() - interval '1 minute'")
            .params(recover())
            .without([Updated("a")]),
        // A live lease is never taken away: the guard against recovering a working claim.
        witness(recover_name, "lease_until <= now()")
            .row("a", LIVE)
            .params(recover())
            .without([Updated("a")]),
    ]);

    // The purge: delivered events (no queue row) enqueued before the retention.
    let purge = "purge_delivered";
    let retention_an_hour = || [Int(ONE_HOUR_US), Int(10)];
    all.extend([
        witness(
            purge,
            "id = ANY (ARRAY( SELECT e.id FROM outbox AS e WHERE e.created_at < now() - \
             $1::bigint * interval '1 microsecond' AND NOT EXISTS (SELECT 1 FROM outbox_queue AS \
             q WHERE q.id = e.id) LIMIT $2 FOR UPDATE SKIP LOCKED ))",
        )
        .delivered("a", "")
        .params(retention_an_hour())
        .without([Deleted("a")]),
        // Retention is honoured: an event delivered and enqueued just now stays for the hour.
        witness(
            purge,
            "e.created_at < now() - $1::bigint * interval '1 microsecond'",
        )
        .delivered("a", "")
        .params(retention_an_hour())
        .without([Deleted("a")]),
        // An event that still has its queue row is never purged, however old: pending,
        // processing (its worker would complete a claim whose event is gone) or exhausted (an
        // operator's retry would find no event).
        witness(
            purge,
            "NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = e.id)",
        )
        .row("a", MONTH_OLD)
        .row("b", leak(format!("{MONTH_OLD}, {LIVE}")))
        .row("c", leak(format!("{MONTH_OLD}, {EXHAUSTED}")))
        .delivered("d", MONTH_OLD)
        .params(retention_an_hour())
        .real([Deleted("d")])
        .without([Deleted("a"), Deleted("b"), Deleted("c"), Deleted("d")]),
        // Only the event's own queue row keeps it: without the pairing, any queue row (`b`'s)
        // would keep every delivered event (`a`) forever.
        witness(purge, "q.id = e.id")
            .delivered("a", MONTH_OLD)
            .row("b", MONTH_OLD)
            .params(retention_an_hour())
            .real([Deleted("a")]),
    ]);

    all.extend([
        // The event's own queue row, not another exhausted one.
        witness(
            "retry_exhausted",
            "id = (SELECT id FROM outbox WHERE event_id = $1)",
        )
        .row("a", EXHAUSTED)
        .row("b", EXHAUSTED)
        .params([EventId("b")])
        .real([Updated("b")])
        .without([Updated("a"), Updated("b")]),
        witness("retry_exhausted", "event_id = $1")
            .row("a", EXHAUSTED)
            .params([NoEventId])
            .without([Updated("a")]),
        // Only exhausted rows are retried: a pending or claimed row keeps its attempts.
        witness("retry_exhausted", "exhausted_at IS NOT NULL")
            .row("a", "attempts = 2")
            .params([EventId("a")])
            .without([Updated("a")]),
        witness("retry_exhausted_of_type", "e.event_type = $1")
            .row("a", EXHAUSTED)
            .params([Text("another.event")])
            .without([Updated("a")]),
        // The type is the queue row's own event's: `a` is exhausted but of another type than
        // the one retried; without the join it would match `b`'s event.
        witness("retry_exhausted_of_type", "e.id = q.id")
            .row("a", EXHAUSTED)
            .row("b", "event_type = 'another.event'")
            .params([Text("another.event")])
            .without([Updated("a")]),
        witness("retry_exhausted_of_type", "q.exhausted_at IS NOT NULL")
            .row("a", "attempts = 2")
            .params([Text("witness.event")])
            .without([Updated("a")]),
    ]);

    // The test kit's `include_delayed`: only pending rows scheduled for later are brought
    // forward; a claimed, finished or already due row keeps its schedule.
    let due = "make_delayed_due";
    all.extend([
        witness(due, "exhausted_at IS NULL")
            .row("a", "available_at = now() + interval '1 hour', exhausted_at = now()")
            .forbidden_by_schema()
            .params([])
            .without([Updated("a")]),
        witness(due, "status = 'pending'")
            .row("a", "status = 'processing', claim_version = 1, attempts = 1, lease_until = now() + interval '1 hour', available_at = now() + interval '1 hour'")
            .params([])
            .without([Updated("a")]),
        witness(due, "available_at > now()")
            .row("a", "available_at = now() - interval '1 minute'")
            .params([])
            .without([Updated("a")]),
    ]);

    // The enqueue's conflict clause (not a WHERE predicate: a clause witness replaces it).
    for statement in ["enqueue", "enqueue_notify"] {
        all.extend([
            // A taken key writes neither row, and the caller's transaction goes on: without the
            // clause the insert raises a unique violation that aborts it.
            witness(statement, "ON CONFLICT (event_id) DO NOTHING")
                .clause("")
                .row("a", "")
                .params(enqueue_params(statement, EventId("a"), false))
                .without_fails("23505"),
            // Only the key is a duplicate: a conflict on another unique index (one an
            // application added) raises its violation instead of writing nothing under a free
            // key, which a conflict clause without its target would do.
            witness(statement, "ON CONFLICT (event_id)")
                .clause("ON CONFLICT")
                .setup(
                    "CREATE UNIQUE INDEX witness_one_event_per_aggregate ON outbox (aggregate_id)",
                )
                .row("a", ORDER_A)
                .params(enqueue_params(statement, NoEventId, true))
                .real_fails("23505")
                .without([]),
        ]);
    }
    all
}

/// A statement's comment-free text, rendered for the table `outbox`.
fn rendered(name: &str, template: &str) -> String {
    strip_comments(&template.replace(TABLE_PLACEHOLDER, "outbox"))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `text #n` for the n-th occurrence (n > 1) of a predicate text in its statement.
fn key(predicate: &Predicate) -> String {
    match predicate.occurrence {
        1 => predicate.text.clone(),
        n => format!("{} #{n}", predicate.text),
    }
}

/// `text` with whitespace runs collapsed to one space (how clause witnesses name a clause).
fn collapsed(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The statement and the mutant a witness plays: the predicate replaced by `TRUE`, or, for a
/// clause witness, the clause (found exactly once) replaced by its replacement.
fn mutant_of(w: &Witness, text: &str, found: &[Predicate]) -> Result<(String, String), String> {
    if let Some(replacement) = w.replacement {
        let text = collapsed(text);
        return match text.matches(w.predicate).count() {
            1 => {
                let mutant = text.replacen(w.predicate, replacement, 1);
                Ok((text, mutant))
            }
            n => Err(format!(
                "the clause occurs {n} times in the statement, not once"
            )),
        };
    }
    let predicate = found
        .iter()
        .find(|p| key(p) == w.predicate)
        .ok_or("no such predicate (was the guard removed or reworded?)")?;
    Ok((text.to_owned(), without(text, predicate)))
}

/// The predicates of every statement that writes, by statement name.
fn guarded_statements() -> BTreeMap<&'static str, (String, Vec<Predicate>)> {
    let mut out = BTreeMap::new();
    for (name, template) in STATEMENTS {
        let text = rendered(name, template);
        if READ_ONLY.contains(name) {
            assert!(
                !writes(&text).unwrap_or_else(|e| panic!("{name}: {e}")),
                "{name} is listed as read-only but writes rows: give its predicates witnesses"
            );
            continue;
        }
        let found = predicates(name, &text).unwrap_or_else(|e| panic!("{e}"));
        out.insert(*name, (text, found));
    }
    out
}

#[test]
fn every_predicate_has_a_witness_and_every_witness_a_predicate() {
    let statements = guarded_statements();
    let witnesses = witnesses();
    let mut problems = Vec::new();
    for (name, (text, found)) in &statements {
        for predicate in found {
            let key = key(predicate);
            let count = witnesses
                .iter()
                .filter(|w| w.replacement.is_none() && w.statement == *name && w.predicate == key)
                .count();
            if count == 0 {
                problems.push(format!(
                    "predicate `{key}` of {name}.sql has no witness (add one to witnesses() in tests/store_guards.rs)"
                ));
            } else if count > 1 {
                problems.push(format!(
                    "predicate `{key}` of {name}.sql has {count} witnesses"
                ));
            }
        }
        // A conflict clause is a guard too (which duplicates write nothing): it needs clause
        // witnesses.
        let conflict_clauses = collapsed(text).matches("ON CONFLICT").count();
        let clause_witnesses = witnesses
            .iter()
            .filter(|w| w.statement == *name && w.predicate.starts_with("ON CONFLICT"))
            .count();
        if conflict_clauses > 0 && clause_witnesses == 0 {
            problems.push(format!(
                "the ON CONFLICT clause of {name}.sql has no clause witness"
            ));
        }
    }
    for w in &witnesses {
        let known = statements
            .get(w.statement)
            .ok_or_else(|| "no such writing statement".to_owned())
            .and_then(|(text, found)| mutant_of(w, text, found));
        if let Err(e) = known {
            problems.push(format!(
                "the witness `{}` of {}.sql: {e}",
                w.predicate, w.statement
            ));
        }
    }
    let counted: usize = statements.values().map(|(_, found)| found.len()).sum();
    println!(
        "{counted} predicates in {} writing statements, {} witnesses",
        statements.len(),
        witnesses.len()
    );
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    // The statements the issue names are all read and guarded.
    for name in [
        "claim_batch",
        "claim_batch_ordered",
        "complete",
        "complete_many",
        "complete_many_delete",
        "renew",
        "renew_many",
        "fail",
        "release",
        "recover_expired",
        "purge_delivered",
        "retry_exhausted",
        "retry_exhausted_of_type",
        "make_delayed_due",
    ] {
        assert!(
            statements
                .get(name)
                .is_some_and(|(_, found)| !found.is_empty()),
            "{name} has no predicates"
        );
    }
}

#[tokio::test]
async fn every_witness_shows_its_predicate_decides() {
    let statements = guarded_statements();
    let db = TestDatabase::with_pool_size(2).await;
    let mut conn = db.connect().await;
    let mut failures = Vec::new();
    let witnesses = witnesses();
    for w in &witnesses {
        let Some((text, found)) = statements.get(w.statement) else {
            failures.push(format!("{}: no such writing statement", w.name()));
            continue;
        };
        let (statement, mutant) = match mutant_of(w, text, found) {
            Ok(pair) => pair,
            Err(e) => {
                failures.push(format!("{}: {e}", w.name()));
                continue;
            }
        };
        if let Err(e) = play(&mut conn, w, &statement, &mutant).await {
            failures.push(format!("{}: {e}", w.name()));
        }
    }
    println!("{} witnesses played", witnesses.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// docs/protocol-model.md maps each guarded statement to the model's guard; a statement with a
/// WHERE clause that the table does not name is a guard the model may not know.
#[test]
fn every_guarded_statement_is_in_the_model_table() {
    let doc = include_str!("../docs/protocol-model.md");
    let missing: Vec<&str> = guarded_statements()
        .into_iter()
        .filter(|(_, (_, found))| !found.is_empty())
        .map(|(name, _)| name)
        .filter(|name| !doc.contains(&format!("`{name}.sql`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/protocol-model.md does not map these statements to a model guard: {missing:?}"
    );
}
