//! The dashboard's JSON endpoints against a real PostgreSQL: each view's numbers against the
//! database's own count, the filters, payload hiding, the actions' guards (token, origin,
//! read-only) and what they change, and the headers that keep hostile text inert.

mod dashboard_support;

use dashboard_support::*;
use outbox_runtime::cli::{Exit, Outbox};
use outbox_runtime::dashboard::{self, DashboardConfig};
use outbox_runtime::testing::TestDatabase;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// An event this test binary compiles, for the contracts view.
#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, outbox_runtime::Event)]
#[outbox(name = "dashboard.sample", version = 1)]
pub struct DashboardSample {
    pub text: String,
}

async fn get(served: &Served, path: &str) -> (StatusCode, Value) {
    let response = reqwest::get(served.url(path)).await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

fn table<'a>(overview: &'a Value, name: &str) -> &'a Value {
    overview["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == name)
        .unwrap_or_else(|| panic!("no table {name} in {overview}"))
}

#[tokio::test]
async fn overview_counts_match_the_database() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, DashboardConfig::new()).await;

    let (status, overview) = get(&served, "api/overview").await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    assert_eq!(overview["read_only"], true);
    let outbox = table(&overview, "outbox");
    assert_eq!(outbox["pending"], count(pool, "pending").await);
    assert_eq!(outbox["processing"], count(pool, "processing").await);
    assert_eq!(outbox["exhausted"], count(pool, "exhausted").await);
    assert_eq!(
        outbox["delivered"],
        json!({"count": count(pool, "delivered").await, "exact": true, "at_least": 6})
    );
    // The "why": the failing and exhausted events, newest change first.
    let latest: Vec<&str> = outbox["latest_failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(latest.len(), 4, "{latest:?}");
    for id in [s.exhausted_note, s.exhausted_note_2, s.hostile, s.failing] {
        assert!(latest.contains(&id.to_string().as_str()), "{id} missing");
    }
    // The oldest pending event was written (and became claimable) 120 s ago.
    let age = outbox["oldest_pending_age_seconds"].as_f64().unwrap();
    assert!((119.0..200.0).contains(&age), "{age}");

    // The chart: 60 minutes of enqueues, and where those events stand now.
    let minutes = outbox["last_hour"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let charted = |field: &str| -> i64 { minutes.iter().map(|m| m[field].as_i64().unwrap()).sum() };
    let (enqueued, delivered, exhausted): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE q.id IS NULL),
                count(*) FILTER (WHERE q.status = 'exhausted')
         FROM outbox e LEFT JOIN outbox_queue q ON q.id = e.id
         WHERE e.created_at >= date_trunc('minute', now()) - interval '59 minutes'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (
            charted("enqueued"),
            charted("delivered"),
            charted("exhausted")
        ),
        (enqueued, delivered, exhausted)
    );
    assert_eq!((enqueued, delivered, exhausted), (15, 6, 3));
}

/// Where an event of the status-and-throughput test is written: minutes before the minute the
/// test started in, or more than an hour ago.
struct Placed {
    minutes_ago: i64,
    status: &'static str,
    event_type: &'static str,
}

/// The overview's counts and its last hour, and the types view, on a table where every number
/// is a different one and a wrong join or filter would change it: events in every state spread
/// over three minutes of the last hour, and delivered and exhausted ones enqueued before it.
#[tokio::test]
async fn status_counts_and_the_last_hour_are_right_on_every_state() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let placed = |minutes_ago, status, event_type| Placed {
        minutes_ago,
        status,
        event_type,
    };
    let events = [
        placed(20, "delivered", "alpha"),
        placed(20, "delivered", "alpha"),
        placed(20, "delivered", "alpha"),
        placed(20, "exhausted", "alpha"),
        placed(10, "delivered", "alpha"),
        placed(10, "pending", "beta"),
        placed(10, "processing", "beta"),
        placed(3, "pending", "beta"),
        placed(3, "pending", "beta"),
        // Before the last hour: counted by status, not in the chart.
        placed(90, "delivered", "alpha"),
        placed(90, "delivered", "alpha"),
        placed(90, "exhausted", "alpha"),
    ];
    // Each event 5 s into its minute, so that no minute boundary is near.
    let (start, now): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT date_trunc('minute', now()), now()")
            .fetch_one(pool)
            .await
            .unwrap();
    let minute_of = |ago: i64| start - chrono::Duration::minutes(ago);
    for e in &events {
        let mut seed = Seed::new(e.event_type, e.status);
        let at = minute_of(e.minutes_ago) + chrono::Duration::seconds(5);
        seed.created_ago_seconds = (now - at).as_seconds_f64();
        if e.status == "exhausted" {
            (seed.attempts, seed.handler_failures) = (3, 3);
            seed.last_error = Some("receiver answered 500".into());
        }
        if e.status == "pending" && e.minutes_ago == 3 {
            (seed.attempts, seed.lease_expiries) = (1, 1);
            seed.last_error = Some("lease expired".into());
        }
        insert(pool, &seed).await;
    }
    let served = serve(pool, DashboardConfig::new()).await;

    let (_, overview) = get(&served, "api/overview").await;
    let outbox = table(&overview, "outbox");
    let counts = [
        ("pending", 3),
        ("processing", 1),
        ("delivered", 6),
        ("exhausted", 2),
    ];
    for (status, expected) in counts {
        let shown = match status {
            "delivered" => {
                assert_eq!(outbox["delivered"]["exact"], true);
                outbox["delivered"]["count"].clone()
            }
            _ => outbox[status].clone(),
        };
        assert_eq!(shown, expected, "{status}: {outbox}");
        assert_eq!(
            count(pool, status).await,
            expected,
            "{status} in the database"
        );
    }
    // The minutes the events were enqueued in, and where their events stand now; every other
    // minute of the hour is empty (the events of 90 minutes ago are outside it).
    let expected: Vec<(chrono::DateTime<chrono::Utc>, [i64; 3])> = vec![
        (minute_of(20), [4, 3, 1]),
        (minute_of(10), [3, 1, 0]),
        (minute_of(3), [2, 0, 0]),
    ];
    let minutes = outbox["last_hour"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let mut charted = Vec::new();
    for m in minutes {
        let at: chrono::DateTime<chrono::Utc> =
            serde_json::from_value(m["minute"].clone()).unwrap();
        let numbers = ["enqueued", "delivered", "exhausted"].map(|f| m[f].as_i64().unwrap());
        let want = expected
            .iter()
            .find(|(minute, _)| *minute == at)
            .map_or([0, 0, 0], |(_, n)| *n);
        assert_eq!(numbers, want, "minute {at}: {m}");
        charted.push(at);
    }
    for (minute, _) in &expected {
        assert!(charted.contains(minute), "minute {minute} is charted");
    }

    let (_, types) = get(&served, "api/types").await;
    let row = |name: &str| {
        types
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["event_type"] == name)
            .unwrap_or_else(|| panic!("no {name} in {types}"))
            .clone()
    };
    let numbers = |t: &Value| {
        [
            "pending",
            "processing",
            "exhausted",
            "failures",
            "enqueued_last_hour",
            "delivered_of_last_hour",
        ]
        .map(|f| t[f].as_i64().unwrap())
    };
    assert_eq!(numbers(&row("alpha")), [0, 0, 2, 6, 5, 4]);
    assert_eq!(numbers(&row("beta")), [3, 1, 0, 2, 4, 0]);
}

#[tokio::test]
async fn delivered_beyond_the_exact_cap_is_an_estimate_said_to_be_one() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let n = dashboard::queries::DELIVERED_EXACT_UP_TO + 500;
    // Delivered: events without a queue row.
    sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                             payload, created_at)
         SELECT gen_random_uuid(), 'k-' || g, '\\x00', 'note', 1, '{}', now() - interval '3 hours'
         FROM generate_series(1, $1) AS g",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
    // The insert gave each event its queue row (the table's trigger); delivered has none.
    sqlx::query("DELETE FROM outbox_queue")
        .execute(pool)
        .await
        .unwrap();
    let served = serve(pool, DashboardConfig::new()).await;

    // Never analysed: no estimate, but never a wrong exact number.
    let (_, overview) = get(&served, "api/overview").await;
    let delivered = &table(&overview, "outbox")["delivered"];
    assert_eq!(delivered["exact"], false, "{delivered}");
    assert_eq!(
        delivered["at_least"],
        dashboard::queries::DELIVERED_EXACT_UP_TO
    );

    sqlx::query("ANALYZE outbox").execute(pool).await.unwrap();
    let (_, overview) = get(&served, "api/overview").await;
    let delivered = &table(&overview, "outbox")["delivered"];
    assert_eq!(delivered["exact"], false, "{delivered}");
    let estimate = delivered["count"].as_i64().unwrap();
    assert!(
        (estimate - n).abs() <= n / 20,
        "estimate {estimate} should be within 5% of {n}"
    );
    // Enqueued three hours ago: nothing in the last hour's chart.
    let minutes = table(&overview, "outbox")["last_hour"].as_array().unwrap();
    assert!(minutes.iter().all(|m| m["enqueued"] == 0));
}

#[tokio::test]
async fn event_types_count_each_status_and_keep_the_last_error() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    scenario(pool).await;
    let served = serve(pool, DashboardConfig::new()).await;

    let (status, types) = get(&served, "api/types").await;
    assert_eq!(status, StatusCode::OK, "{types}");
    let row = |name: &str| {
        types
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["event_type"] == name)
            .unwrap_or_else(|| panic!("no {name} in {types}"))
            .clone()
    };
    let order = row("order.confirmed");
    assert_eq!(order["pending"], 4);
    assert_eq!(order["processing"], 2);
    assert_eq!(order["exhausted"], 0);
    assert_eq!(order["failures"], 1);
    assert_eq!(order["enqueued_last_hour"], 11);
    assert_eq!(order["delivered_of_last_hour"], 5);
    assert_eq!(
        order["last_error"],
        "shipping answered 503 Service Unavailable"
    );
    let note = row("note");
    assert_eq!(note["exhausted"], 2);
    assert_eq!(note["failures"], 6);
    assert_eq!(
        (
            note["enqueued_last_hour"].as_i64(),
            note["delivered_of_last_hour"].as_i64()
        ),
        (Some(2), Some(0))
    );
    // A type whose events are all delivered: only the last hour's numbers, and no failure (a
    // delivered event keeps none).
    let registered = row("customer.registered");
    assert_eq!(
        (
            registered["enqueued_last_hour"].as_i64(),
            registered["delivered_of_last_hour"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(
        (registered["failures"].as_i64(), &registered["last_error"]),
        (Some(0), &Value::Null)
    );
    assert_eq!(row(HOSTILE_TYPE)["last_error"], HOSTILE_ERROR);
}

#[tokio::test]
async fn failures_filter_by_state_type_aggregate_time_and_error_text() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, DashboardConfig::new()).await;
    let ids = |v: &Value| -> Vec<String> {
        let mut ids: Vec<String> = v
            .as_array()
            .unwrap_or_else(|| panic!("not a list: {v}"))
            .iter()
            .map(|r| r["event_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    let sorted = |mut v: Vec<uuid::Uuid>| -> Vec<String> {
        v.sort();
        let mut v: Vec<String> = v.iter().map(ToString::to_string).collect();
        v.sort();
        v
    };

    let (_, all) = get(&served, "api/failures").await;
    assert_eq!(
        ids(&all),
        sorted(vec![
            s.exhausted_note,
            s.exhausted_note_2,
            s.hostile,
            s.failing
        ])
    );
    let failing = all
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["event_id"] == s.failing.to_string())
        .unwrap();
    assert_eq!(failing["status"], "pending");
    assert_eq!(failing["handler_failures"], 1);
    assert_eq!(failing["claimed_by"], "worker-b");

    let (_, exhausted) = get(&served, "api/failures?state=exhausted").await;
    assert_eq!(
        ids(&exhausted),
        sorted(vec![s.exhausted_note, s.exhausted_note_2, s.hostile])
    );
    let (_, only_failing) = get(&served, "api/failures?state=failing").await;
    assert_eq!(ids(&only_failing), sorted(vec![s.failing]));
    let (_, notes) = get(&served, "api/failures?type=note").await;
    assert_eq!(
        ids(&notes),
        sorted(vec![s.exhausted_note, s.exhausted_note_2])
    );
    let (_, by_aggregate) = get(&served, "api/failures?aggregate=order-77").await;
    assert_eq!(ids(&by_aggregate), sorted(vec![s.failing]));
    // Error text: case-insensitive, and % and _ are plain characters, not wildcards.
    let (_, by_error) = get(&served, "api/failures?error=UNKNOWN%20CUSTOMER").await;
    assert_eq!(
        ids(&by_error),
        sorted(vec![s.exhausted_note, s.exhausted_note_2])
    );
    let (_, percent) = get(&served, "api/failures?error=100%25%20_done_").await;
    assert_eq!(ids(&percent), sorted(vec![s.hostile]));
    let (_, wildcard) = get(&served, "api/failures?error=%25").await;
    assert_eq!(ids(&wildcard), sorted(vec![s.hostile]));
    // Time: changed within the last hour (all), or since a time in the future (none).
    let (_, recent) = get(&served, "api/failures?since=1h").await;
    assert_eq!(ids(&recent).len(), 4);
    let (_, future) = get(&served, "api/failures?since=2999-01-01T00:00:00Z").await;
    assert_eq!(ids(&future).len(), 0);

    let (status, bad) = get(&served, "api/failures?since=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        bad["error"].as_str().unwrap().contains("an age like 30m"),
        "{bad}"
    );
    let (status, bad) = get(&served, "api/failures?state=dead").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("`failing` or `exhausted`"),
        "{bad}"
    );
    // Hostile text comes back verbatim, as JSON data.
    let hostile = exhausted
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["event_id"] == s.hostile.to_string())
        .unwrap();
    assert_eq!(hostile["event_type"], HOSTILE_TYPE);
    assert_eq!(hostile["last_error"], HOSTILE_ERROR);
}

#[tokio::test]
async fn an_event_shows_its_row_and_hides_the_payload_unless_told() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let hidden = serve(pool, DashboardConfig::new()).await;
    let path = format!("api/events/{}", s.delivered_private);

    let response = reqwest::get(hidden.url(&path)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    assert!(
        !text.contains("jane.doe"),
        "the payload left the server: {text}"
    );
    let event: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(event["payload"], Value::Null);
    assert_eq!(event["payload_shown"], false);
    assert_eq!(event["status"], "delivered");
    assert_eq!(
        event["queue"],
        Value::Null,
        "a delivered event keeps no delivery state"
    );
    assert_eq!(event["headers"]["traceparent"], "00-abc-def-01");
    let history: Vec<&str> = event["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["what"].as_str().unwrap())
        .collect();
    assert_eq!(
        history,
        [
            "written (pending)",
            "delivered (a delivered event keeps no delivery time, attempts or errors)"
        ]
    );

    let shown = serve(pool, DashboardConfig::new().with_payloads_shown(true)).await;
    let (_, event) = get(&shown, &path).await;
    assert_eq!(event["payload"]["email"], "jane.doe@example.invalid");

    let (_, exhausted) = get(&hidden, &format!("api/events/{}", s.exhausted_note)).await;
    assert_eq!(exhausted["status"], "exhausted");
    assert_eq!(
        (
            &exhausted["queue"]["attempts"],
            &exhausted["queue"]["claimed_by"],
            &exhausted["queue"]["last_error"]
        ),
        (
            &json!(3),
            &json!("worker-c"),
            &json!("receiver refused: 422 unknown customer")
        )
    );
    let last = exhausted["history"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["what"], "exhausted after 3 of 3 attempts");
    assert!(
        exhausted["history"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| { h["what"] == "a lease expired 1 time(s) (worker crashed or stalled)" })
    );

    let (status, missing) = get(&hidden, &format!("api/events/{}", uuid::Uuid::nil())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(missing["error"].as_str().unwrap().contains("no event"));
    let (status, bad) = get(&hidden, "api/events/not-a-uuid").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(bad["error"].as_str().unwrap().contains("must be a UUID"));
}

#[tokio::test]
async fn live_claims_say_who_holds_what_and_for_how_long() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    scenario(pool).await;
    let served = serve(pool, DashboardConfig::new()).await;
    let (status, claims) = get(&served, "api/claims").await;
    assert_eq!(status, StatusCode::OK, "{claims}");
    let claims = claims.as_array().unwrap();
    assert_eq!(claims.len(), 2);
    for c in claims {
        assert_eq!(c["claimed_by"], "worker-a");
        let left = c["lease_remaining_seconds"].as_f64().unwrap();
        assert!((0.0..=25.0).contains(&left), "{c}");
    }
}

#[tokio::test]
async fn contracts_compare_the_registry_with_the_binary() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    // One compiled event: registered with its own fingerprint, and a registry row nobody
    // compiles.
    let compiled = outbox_runtime::generate::compiled_events();
    let first = compiled
        .iter()
        .find(|e| e.contract.name == "dashboard.sample")
        .expect("DashboardSample is linked into this test")
        .clone();
    sqlx::query(
        "INSERT INTO outbox_contracts (event_type, event_version, fingerprint, shape, type_name)
         VALUES ($1, $2, $3, '{}', 'T'), ('gone.event', 1, repeat('a', 64), '{}', 'Gone')",
    )
    .bind(first.contract.name)
    .bind(i32::try_from(first.contract.version).unwrap())
    .bind(first.contract.fingerprint())
    .execute(pool)
    .await
    .unwrap();
    let served = serve(
        pool,
        DashboardConfig::new().with_events(vec![first.clone()]),
    )
    .await;
    let (status, contracts) = get(&served, "api/contracts").await;
    assert_eq!(status, StatusCode::OK, "{contracts}");
    let states: Vec<(String, String)> = contracts
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["event_type"].as_str().unwrap().to_owned(),
                c["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        states.contains(&(first.contract.name.to_owned(), "ok".to_owned())),
        "{states:?}"
    );
    assert!(
        states.contains(&("gone.event".to_owned(), "not_compiled".to_owned())),
        "{states:?}"
    );
}

async fn post(
    served: &Served,
    path: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().post(served.url(path)).json(&body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn actions_need_a_token_and_the_dashboards_own_origin() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let retry = json!({"event_id": s.exhausted_note});

    // Read-only: refused, and says how to enable actions.
    let read_only = serve(pool, DashboardConfig::new()).await;
    let (status, body) = post(
        &read_only,
        "api/actions/retry",
        retry.clone(),
        &[("authorization", "Bearer anything")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("read-only"),
        "{body}"
    );

    let served = serve(pool, with_token(DashboardConfig::new())).await;
    let (status, body) = post(&served, "api/actions/retry", retry.clone(), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) = post(
        &served,
        "api/actions/retry",
        retry.clone(),
        &[("authorization", "Bearer wrong")],
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A page on another site, even holding the token, is refused.
    let (status, body) = post(
        &served,
        "api/actions/retry",
        retry.clone(),
        &[("authorization", BEARER), ("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"].as_str().unwrap().contains("cross-origin"));
    // A form post (not JSON) is refused before anything runs.
    let response = reqwest::Client::new()
        .post(served.url("api/actions/retry"))
        .header("authorization", BEARER)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("event_id={}", s.exhausted_note))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(status_of(pool, s.exhausted_note).await, "exhausted");

    // The dashboard's own origin with the token: done.
    let origin = format!("http://{}", served.address);
    let (status, body) = post(
        &served,
        "api/actions/retry",
        retry.clone(),
        &[
            ("authorization", BEARER),
            ("origin", &origin),
            ("x-outbox-operator", "ana"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["count"], 1);
    assert_eq!(status_of(pool, s.exhausted_note).await, "pending");
    let attempts: i32 = sqlx::query_scalar(
        "SELECT q.attempts FROM outbox_queue q JOIN outbox e ON e.id = q.id WHERE e.event_id = $1",
    )
    .bind(s.exhausted_note)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(attempts, 0);
    // Again: it is no longer exhausted.
    let (status, body) = post(
        &served,
        "api/actions/retry",
        retry,
        &[("authorization", BEARER)],
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"].as_str().unwrap().contains("not exhausted"));
}

#[tokio::test]
async fn retry_a_type_and_purge_change_only_what_they_name() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    // Enqueued nine days ago (the retention counts from the enqueue), and an exhausted event as
    // old, which the purge must keep: it is not delivered.
    let mut old = Seed::new("order.confirmed", "delivered");
    old.created_ago_seconds = 9.0 * 86_400.0;
    insert(pool, &old).await;
    let mut old_exhausted = Seed::new("order.confirmed", "exhausted");
    old_exhausted.created_ago_seconds = 9.0 * 86_400.0;
    let old_exhausted = insert(pool, &old_exhausted).await;
    let served = serve(pool, with_token(DashboardConfig::new())).await;
    let auth = [("authorization", BEARER)];

    let (status, body) = post(
        &served,
        "api/actions/retry-type",
        json!({"event_type": "note", "table": "outbox"}),
        &auth,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["count"], 2);
    assert_eq!(status_of(pool, s.exhausted_note_2).await, "pending");
    assert_eq!(status_of(pool, s.hostile).await, "exhausted");

    let delivered_before = count(pool, "delivered").await;
    let (status, body) = post(
        &served,
        "api/actions/purge",
        json!({"older_than": "7d"}),
        &auth,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["count"], 1);
    assert_eq!(count(pool, "delivered").await, delivered_before - 1);
    assert_eq!(status_of(pool, old_exhausted).await, "exhausted");

    let (status, body) = post(
        &served,
        "api/actions/purge",
        json!({"older_than": "soon"}),
        &auth,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = post(
        &served,
        "api/actions/purge",
        json!({"older_than": "7d", "table": "other_outbox"}),
        &auth,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("not shown by this dashboard")
    );
}

#[tokio::test]
async fn the_page_is_embedded_and_sent_with_strict_headers() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    // Mounted under a prefix, as a service would.
    let app = axum::Router::new().nest_service(
        "/ops/outbox",
        dashboard::router(pool.clone(), DashboardConfig::new()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    let page = client
        .get(format!("http://{address}/ops/outbox/"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let headers = page.headers().clone();
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["x-frame-options"], "DENY");
    let html = page.text().await.unwrap();
    assert!(html.contains("<script src=\"app.js\" defer></script>"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "the page loads nothing from elsewhere"
    );
    for asset in ["app.js", "app.css"] {
        let response = client
            .get(format!("http://{address}/ops/outbox/{asset}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{asset}");
        let text = response.text().await.unwrap();
        assert!(!text.contains("innerHTML"), "{asset} writes markup");
    }
    let api = client
        .get(format!("http://{address}/ops/outbox/api/overview"))
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), StatusCode::OK);
    assert_eq!(api.headers()["x-content-type-options"], "nosniff");
    assert!(
        api.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    // Without the trailing slash the relative links would miss: redirected.
    let bare = client
        .get(format!("http://{address}/ops/outbox"))
        .send()
        .await
        .unwrap();
    assert!(bare.status().is_redirection(), "{}", bare.status());
    assert_eq!(bare.headers()["location"], "outbox/");
}

#[tokio::test]
async fn tables_are_validated_and_unknown_tables_refused() {
    assert!(
        DashboardConfig::new()
            .with_tables(["Robert'); DROP TABLE outbox;--"])
            .is_err()
    );
    assert!(DashboardConfig::new().with_tables(["order"]).is_err());
    let db = TestDatabase::new().await;
    let served = serve(db.pool(), DashboardConfig::new()).await;
    let (status, body) = get(&served, "api/types?table=pg_class").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("not shown by this dashboard")
    );
}

#[tokio::test]
async fn the_command_refuses_a_public_address_without_a_token() {
    let cli = Outbox::new().events(Vec::new());
    let mut out = Vec::new();
    let mut err = Vec::new();
    let exit = cli
        .run_with(
            [
                "outbox",
                "dashboard",
                "--listen",
                "0.0.0.0:8089",
                "--database-url",
                "postgres://127.0.0.1:1/none",
            ],
            &mut out,
            &mut err,
        )
        .await;
    let err = String::from_utf8(err).unwrap();
    assert_eq!(exit, Exit::Usage, "{err}");
    assert!(
        err.contains("refusing to listen on 0.0.0.0:8089 without a token"),
        "{err}"
    );
}

/// A realistic table of `total` events enqueued evenly over the last seven days, in enqueue
/// order (the event table is insert-only, so `created_at` follows its pages): the newest 2 %
/// pending (a tenth of them failing), the 1,000 before them processing across four workers,
/// every 200th older one exhausted, the rest delivered (no queue row); twelve event types. Then
/// VACUUM ANALYZE.
async fn fill(pool: &sqlx::PgPool, total: i64) {
    let pending = total / 50;
    let processing = 1_000;
    sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version,
                             aggregate_type, aggregate_id, payload, created_at)
         SELECT gen_random_uuid(), 'k-' || g, '\\x00', 'type-' || (g % 12), 1,
                'order', 'order-' || (g % 50000), jsonb_build_object('n', g),
                now() - ($1::bigint - g) * (604800.0 / $1::bigint) * interval '1 second'
         FROM generate_series(1, $1::bigint) AS g
         ORDER BY g",
    )
    .bind(total)
    .execute(pool)
    .await
    .unwrap();
    // The insert gave every event a pending queue row (the table's trigger): replaced by the
    // states below, and none for the delivered ones.
    sqlx::query("DELETE FROM outbox_queue")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_queue (id, aggregate_type, aggregate_id, status, available_at,
                                   lease_until, claimed_by, claim_version, attempts,
                                   handler_failures, last_error, updated_at, exhausted_at)
         SELECT e.id, e.aggregate_type, e.aggregate_id, s.status, e.created_at,
                CASE WHEN s.status = 'processing' THEN now() + ((n.g % 60) - 10) * interval '1 second' END,
                CASE WHEN s.status IN ('processing', 'exhausted') OR n.g % 10 = 0 THEN 'worker-' || (n.g % 4) END,
                1, 1,
                CASE WHEN s.status = 'exhausted' OR (s.status = 'pending' AND n.g % 10 = 0) THEN 1 ELSE 0 END,
                CASE WHEN s.status = 'exhausted' OR (s.status = 'pending' AND n.g % 10 = 0)
                     THEN 'receiver answered 500 for ' || n.g END,
                e.created_at + interval '3 seconds',
                CASE WHEN s.status = 'exhausted' THEN e.created_at + interval '3 seconds' END
         FROM outbox AS e,
              LATERAL (SELECT (e.payload->>'n')::bigint AS g) AS n,
              LATERAL (SELECT CASE WHEN n.g > $1::bigint - $2 THEN 'pending'
                                   WHEN n.g > $1::bigint - $2 - $3 THEN 'processing'
                                   WHEN n.g % 200 = 0 THEN 'exhausted'
                                   ELSE 'delivered' END AS status) AS s
         WHERE s.status <> 'delivered'",
    )
    .bind(total)
    .bind(pending)
    .bind(processing)
    .execute(pool)
    .await
    .unwrap();
    // Vacuumed, as autovacuum does an insert-only table: the BRIN index on created_at only
    // summarizes the page ranges a vacuum has seen (an unsummarized range always matches).
    sqlx::query("VACUUM ANALYZE outbox, outbox_queue")
        .execute(pool)
        .await
        .unwrap();
}

/// Rows a plan read from the event table `outbox` (not its queue): every node on it, the rows
/// it returned and those its filters and rechecks removed, in every loop.
fn event_table_rows(plan: &Value) -> f64 {
    let own = if plan["Relation Name"] == "outbox" {
        let rows = [
            "Actual Rows",
            "Rows Removed by Filter",
            "Rows Removed by Index Recheck",
        ]
        .iter()
        .map(|k| plan[*k].as_f64().unwrap_or(0.0))
        .sum::<f64>();
        rows * plan["Actual Loops"].as_f64().unwrap_or(1.0)
    } else {
        0.0
    };
    own + plan["Plans"]
        .as_array()
        .map_or(0.0, |plans| plans.iter().map(event_table_rows).sum())
}

/// EXPLAIN every dashboard statement on the filled table of `total` events; returns the report
/// and what is wrong: a sequential scan of the event table anywhere, or a plan that reads more
/// than a fifth of it. The queue table holds the events not delivered only, so reading it whole
/// is allowed (the gauges do it every interval); the event table holds the whole retention.
async fn explain_dashboard(pool: &sqlx::PgPool, total: i64) -> (String, Vec<String>) {
    use outbox_runtime::store::sql::{TABLE_PLACEHOLDER, dashboard::STATEMENTS};
    use sqlx::Row;
    let mut report = String::new();
    let mut wrong = Vec::new();
    for &(name, template) in STATEMENTS {
        let mut plans = Vec::new();
        for format in ["TEXT", "JSON"] {
            let sql = format!(
                "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON, FORMAT {format}) {}",
                template.replace(TABLE_PLACEHOLDER, "outbox")
            );
            let q = sqlx::query(sqlx::AssertSqlSafe(sql));
            let q = match name {
                "dashboard/delivered_count" => q
                    .bind(dashboard::queries::DELIVERED_EXACT_UP_TO)
                    .bind("outbox"),
                "dashboard/throughput" | "dashboard/event_types" => q,
                "dashboard/failures" => q
                    .bind(None::<String>)
                    .bind(None::<String>)
                    .bind(None::<String>)
                    .bind(None::<chrono::DateTime<chrono::Utc>>)
                    .bind(Some("500"))
                    .bind(100_i64)
                    .bind(Some(3_600_000_000_i64)),
                "dashboard/event" => q.bind(uuid::Uuid::new_v4()).bind(false),
                "dashboard/claims" => q.bind(500_i64),
                other => panic!("no EXPLAIN arguments for {other}: add them"),
            };
            plans.push(q.fetch_all(pool).await.unwrap());
        }
        let text: String = plans[0]
            .iter()
            .map(|r| r.get::<String, _>(0) + "\n")
            .collect();
        let json: Value = plans[1][0].get(0);
        // "on outbox " (with the space) is the event table, not outbox_queue.
        if text.contains("Seq Scan on outbox ") {
            wrong.push(format!("{name} scans the event table"));
        }
        let read = event_table_rows(&json[0]["Plan"]);
        if read > total as f64 / 5.0 {
            wrong.push(format!(
                "{name} reads {read} rows of the event table's {total}"
            ));
        }
        report.push_str(&format!("--- {name} ({read} event rows read)\n{text}\n"));
    }
    (report, wrong)
}

#[tokio::test]
async fn no_view_scans_the_table() {
    let db = TestDatabase::new().await;
    fill(db.pool(), 100_000).await;
    let (report, wrong) = explain_dashboard(db.pool(), 100_000).await;
    assert!(wrong.is_empty(), "{wrong:?}\n\n{report}");
}

/// The 1,000,000-row measurement recorded in docs/explain.md and docs/dashboard.md:
/// `cargo test --test dashboard_api one_million -- --ignored --nocapture`
/// (`OUTBOX_DASHBOARD_ROWS` changes the size).
#[tokio::test]
#[ignore = "fills a 1,000,000-row table: run on purpose, see docs/dashboard.md"]
async fn one_million_rows_plans_and_load_time() {
    let total: i64 = std::env::var("OUTBOX_DASHBOARD_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let filled = std::time::Instant::now();
    fill(pool, total).await;
    println!("filled {total} rows in {:?}", filled.elapsed());
    let (report, wrong) = explain_dashboard(pool, total).await;
    println!("{report}");
    assert!(wrong.is_empty(), "{wrong:?}");

    let served = serve(pool, DashboardConfig::new()).await;
    let client = reqwest::Client::new();
    // What the browser fetches to show the overview: the page, its two assets, the
    // configuration and the overview.
    let page = ["", "app.js", "app.css", "api/config", "api/overview"];
    let views = ["api/types", "api/failures", "api/claims"];
    for round in 0..2 {
        for set in [&page[..], &views[..]] {
            for path in set {
                let started = std::time::Instant::now();
                let response = client.get(served.url(path)).send().await.unwrap();
                assert!(response.status().is_success(), "{path}");
                response.bytes().await.unwrap();
                if round == 1 {
                    println!("GET /{path}: {:?}", started.elapsed());
                }
            }
        }
    }
    let mut loads = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        for path in page {
            let response = client.get(served.url(path)).send().await.unwrap();
            response.bytes().await.unwrap();
        }
        loads.push(started.elapsed());
    }
    loads.sort();
    println!(
        "overview page load on {total} rows (page, assets, config, overview; 5 runs): median {:?}, max {:?}",
        loads[2], loads[4]
    );
}

#[tokio::test]
async fn the_command_serves_the_dashboard_until_stopped() {
    let db = TestDatabase::new().await;
    scenario(db.pool()).await;
    // A free port: bind one, read it, release it for the command.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args = vec![
        "outbox".to_owned(),
        "dashboard".to_owned(),
        "--listen".to_owned(),
        format!("127.0.0.1:{port}"),
        "--database-url".to_owned(),
        db.url(),
    ];
    let command = tokio::spawn(async move {
        let cli = Outbox::new().events(outbox_runtime::generate::compiled_events());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let exit = cli.run_with(args, &mut out, &mut err).await;
        (exit, String::from_utf8(err).unwrap())
    });
    let config_url = format!("http://127.0.0.1:{port}/api/config");
    let started = std::time::Instant::now();
    let config: Value = loop {
        if command.is_finished() {
            let (exit, err) = command.await.unwrap();
            panic!("`outbox dashboard` ended: {exit:?} {err}");
        }
        if let Ok(response) = reqwest::get(&config_url).await {
            break response.json().await.unwrap();
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "`outbox dashboard` did not answer on port {port} within 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // `outbox` and every table the linked events name (DashboardSample: `outbox`).
    assert_eq!(config["tables"], json!(["outbox"]));
    assert_eq!(config["read_only"], true);
    assert_eq!(config["show_payloads"], false);
    let overview: Value = reqwest::get(format!("http://127.0.0.1:{port}/api/overview"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        table(&overview, "outbox")["exhausted"],
        count(db.pool(), "exhausted").await
    );
    command.abort();
}

/// Log lines captured from the `tracing` subscriber of this test's thread.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn every_action_attempt_is_logged_with_who_and_what() {
    // The test runtime has one thread, where the server's tasks run too: a thread-local
    // subscriber sees their events.
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, with_token(DashboardConfig::new())).await;
    let retry = json!({"event_id": s.exhausted_note});
    let (status, _) = post(
        &served,
        "api/actions/retry",
        retry.clone(),
        &[("x-outbox-operator", "mallory")],
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = post(
        &served,
        "api/actions/retry",
        retry,
        &[("authorization", BEARER), ("x-outbox-operator", "ana")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    let log = captured.text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dashboard action"))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    let id = s.exhausted_note.to_string();
    assert!(
        lines[0].contains("mallory") && lines[0].contains("refused") && lines[0].contains(&id),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("operator=\"ana\"")
            && lines[1].contains("done: event")
            && lines[1].contains(&id)
            && lines[1].contains("peer=\"127.0.0.1:"),
        "{}",
        lines[1]
    );
    // The token itself is never logged.
    assert!(!log.contains(TOKEN), "{log}");
}

/// Every read route of the dashboard (the page and its two files are not among them).
fn read_routes(event_id: uuid::Uuid) -> Vec<String> {
    [
        "api/config",
        "api/overview",
        "api/types",
        "api/failures",
        "api/claims",
        "api/contracts",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([format!("api/events/{event_id}")])
    .collect()
}

async fn get_with(served: &Served, path: &str, bearer: Option<&str>) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().get(served.url(path));
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// With a token configured, every read needs it: the outbox's errors, aggregate ids, operation
/// keys, headers and (with `--show-payloads`) payloads are what an intruder would read.
#[tokio::test]
async fn with_a_token_every_read_needs_it_and_the_page_alone_is_open() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(
        pool,
        with_token(DashboardConfig::new()).with_payloads_shown(true),
    )
    .await;

    for path in read_routes(s.delivered_private) {
        let (status, body) = get_with(&served, &path, None).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{path} without the token: {body}"
        );
        assert!(
            body["error"].as_str().unwrap().contains("needs its token"),
            "{path}: {body}"
        );
        assert!(!body.to_string().contains("jane.doe"), "{path}: {body}");
        let (status, _) = get_with(&served, &path, Some("wrong")).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{path} with a wrong token"
        );
        let (status, body) = get_with(&served, &path, Some(TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{path} with the token: {body}");
    }
    let (_, event) = get_with(
        &served,
        &format!("api/events/{}", s.delivered_private),
        Some(TOKEN),
    )
    .await;
    assert_eq!(event["payload"]["email"], "jane.doe@example.invalid");
    let (_, config) = get_with(&served, "api/config", Some(TOKEN)).await;
    assert_eq!(
        (&config["read_only"], &config["token_required"]),
        (&json!(false), &json!(true))
    );
    // The page and its files hold no data, and the page is where the token is pasted.
    for path in ["", "app.js", "app.css"] {
        let response = reqwest::get(served.url(path)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "/{path}");
    }
}

#[tokio::test]
async fn the_viewer_token_reads_and_cannot_act() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, with_viewer_token(with_token(DashboardConfig::new()))).await;

    for path in read_routes(s.exhausted_note) {
        let (status, body) = get_with(&served, &path, Some(VIEWER_TOKEN)).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{path} with the viewer token: {body}"
        );
    }
    let (_, config) = get_with(&served, "api/config", Some(VIEWER_TOKEN)).await;
    assert_eq!(
        (&config["read_only"], &config["actions_enabled"]),
        (&json!(true), &json!(true))
    );
    let viewer = format!("Bearer {VIEWER_TOKEN}");
    let (status, body) = post(
        &served,
        "api/actions/retry",
        json!({"event_id": s.exhausted_note}),
        &[("authorization", &viewer)],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("viewer token"),
        "{body}"
    );
    assert_eq!(status_of(pool, s.exhausted_note).await, "exhausted");

    // A viewer token alone: reading needs it, and the dashboard is view-only.
    let view_only = serve(pool, with_viewer_token(DashboardConfig::new())).await;
    let (status, _) = get_with(&view_only, "api/overview", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = post(
        &view_only,
        "api/actions/retry",
        json!({"event_id": s.exhausted_note}),
        &[("authorization", &viewer)],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("view-only"),
        "{body}"
    );
    // The same token for both is refused.
    let same = with_token(DashboardConfig::new()).with_viewer_token(Some(TOKEN.to_owned()));
    assert!(
        same.unwrap_err()
            .to_string()
            .contains("viewer token equals the action token")
    );
}

/// A GET of `path` on `address` whose `Host` header says `host`.
async fn get_as(address: std::net::SocketAddr, path: &str, host: &str) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .get(format!("http://{address}/{path}"))
        .header("host", host)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// DNS rebinding: a page on `http://rebind.test:<port>/`, its name re-pointed at 127.0.0.1, is
/// same-origin with itself, and every request it sends names `rebind.test` in `Host`.
#[tokio::test]
async fn a_request_naming_another_host_is_refused() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, DashboardConfig::new().with_payloads_shown(true)).await;
    let port = served.address.port();
    let event = format!("api/events/{}", s.delivered_private);

    for path in ["", "app.js", "api/config", "api/overview", event.as_str()] {
        let (status, body) = get_as(served.address, path, &format!("rebind.test:{port}")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "/{path}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("does not answer to the host `rebind.test`")
                && error.contains("--allow-host rebind.test"),
            "{error}"
        );
    }
    let (status, body) = post(
        &served,
        "api/actions/retry",
        json!({"event_id": s.exhausted_note}),
        &[("host", "rebind.test")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // Another IP than the one it listens on, another name: refused. Its address, localhost
    // (it listens on loopback), case and a trailing dot aside: answered.
    for host in [
        "10.1.2.3",
        "[::1]",
        "127.0.0.1.rebind.test",
        "localhost.example",
    ] {
        let (status, _) = get_as(served.address, &event, &format!("{host}:{port}")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "Host {host}");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LOCALHOST.:{port}"),
        "127.0.0.1".to_owned(),
    ] {
        let (status, body) = get_as(served.address, &event, &host).await;
        assert_eq!(status, StatusCode::OK, "Host {host}: {body}");
        assert_eq!(body["payload"]["email"], "jane.doe@example.invalid");
    }

    // A name it is given is answered.
    let named = serve(
        pool,
        DashboardConfig::new()
            .with_allowed_hosts(["Ops.Example.Test"])
            .unwrap(),
    )
    .await;
    let (status, _) = get_as(named.address, "api/overview", "ops.example.test:443").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = get_as(named.address, "api/overview", "rebind.test").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for bad in ["", "http://ops.example.test", "ops.example.test/x", "a b"] {
        assert!(
            DashboardConfig::new().with_allowed_hosts([bad]).is_err(),
            "{bad:?}"
        );
    }

    // Mounted in a service's app, where the dashboard does not know its address: any IP
    // literal and localhost, never another name.
    let app = axum::Router::new().nest_service(
        "/ops",
        dashboard::router(pool.clone(), DashboardConfig::new()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for (host, expected) in [
        ("127.0.0.1", StatusCode::OK),
        ("localhost", StatusCode::OK),
        ("rebind.test", StatusCode::FORBIDDEN),
    ] {
        let (status, _) = get_as(address, "ops/api/overview", host).await;
        assert_eq!(status, expected, "mounted, Host {host}");
    }
}

#[tokio::test]
async fn weak_tokens_are_refused_with_advice() {
    let weak = [
        "a".to_owned(),
        " ".to_owned(),
        "s3cret".to_owned(),
        // 31 random characters: one too few.
        "9f2c4e7a1b8d3f6e0c5a2d9b7e4f1a3".to_owned(),
        "a".repeat(40),
        "hunter2!".repeat(5),
        "0123456789abcdef0123456789abcdef".to_owned(),
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ".to_owned(),
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbbbb".to_owned(),
        format!("{} ", TOKEN),
        format!("{}\n", TOKEN),
        "9f2c4e7a1b8d3f6e0c5a2d9b7é4f1a3c8b6d0e2f5a7c9e1b3d4f6".to_owned(),
    ];
    for token in &weak {
        for config in [
            DashboardConfig::new().with_token(Some(token.clone())),
            DashboardConfig::new().with_viewer_token(Some(token.clone())),
        ] {
            let error = config.expect_err(token).to_string();
            assert!(
                error.contains("too weak") && error.contains("openssl rand -hex 32"),
                "{token:?}: {error}"
            );
        }
    }
    // Generated tokens pass: 32 random hexadecimal digits (a UUID's) and longer ones.
    for _ in 0..200 {
        let token = uuid::Uuid::new_v4().simple().to_string();
        assert!(
            DashboardConfig::new()
                .with_token(Some(token.clone()))
                .is_ok(),
            "{token}"
        );
    }
    assert!(
        DashboardConfig::new()
            .with_token(Some(TOKEN.into()))
            .is_ok()
    );
    assert!(
        DashboardConfig::new()
            .with_token(Some("kQ3v_Zr8pX1mN6tB0yW4eH7sJ2cL9aF5".into()))
            .is_ok()
    );

    // The command refuses them before it connects (nothing listens on port 1).
    for flag in ["--token", "--viewer-token"] {
        for token in ["a", " ", "s3cret"] {
            let (exit, err) = command_refusal(&["--listen", "127.0.0.1:8089", flag, token]).await;
            assert_eq!(exit, Exit::Usage, "{flag} {token:?}: {err}");
            assert!(
                err.contains("too weak") && err.contains("openssl rand -hex 32"),
                "{flag} {token:?}: {err}"
            );
        }
    }
}

/// `outbox dashboard` with `args` against a database that is not there: how it ends and what
/// it said.
async fn command_refusal(args: &[&str]) -> (Exit, String) {
    let cli = Outbox::new().events(Vec::new());
    let mut out = Vec::new();
    let mut err = Vec::new();
    let all = ["outbox", "dashboard"]
        .iter()
        .chain(args)
        .chain(&["--database-url", "postgres://127.0.0.1:1/none"]);
    let exit = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        cli.run_with(all, &mut out, &mut err),
    )
    .await
    .expect("the command ended within 30 s");
    (exit, String::from_utf8(err).unwrap())
}

/// A free loopback port: bind one, read it, release it.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `outbox dashboard` with `args` on the test's database, running until the returned handle
/// is aborted; returns once `probe` answers (any status).
async fn start_command(
    db: &TestDatabase,
    args: &[String],
    probe: &str,
) -> tokio::task::JoinHandle<(Exit, String)> {
    let args: Vec<String> = ["outbox", "dashboard", "--database-url", &db.url()]
        .map(str::to_owned)
        .into_iter()
        .chain(args.iter().cloned())
        .collect();
    let command = tokio::spawn(async move {
        let cli = Outbox::new().events(outbox_runtime::generate::compiled_events());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let exit = cli.run_with(args, &mut out, &mut err).await;
        (exit, String::from_utf8(err).unwrap())
    });
    let started = std::time::Instant::now();
    loop {
        if command.is_finished() {
            let (exit, err) = command.await.unwrap();
            panic!("`outbox dashboard` ended: {exit:?} {err}");
        }
        if reqwest::get(probe).await.is_ok() {
            return command;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "`outbox dashboard` did not answer on {probe} within 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `--listen 0.0.0.0:<port> --token T`: anyone on the network reaches the address, so reading
/// needs the token too.
#[tokio::test]
async fn the_command_on_every_interface_needs_the_token_to_read() {
    let db = TestDatabase::new().await;
    scenario(db.pool()).await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let command = start_command(
        &db,
        &[
            "--listen".to_owned(),
            format!("0.0.0.0:{port}"),
            "--token".to_owned(),
            TOKEN.to_owned(),
        ],
        &format!("{base}/"),
    )
    .await;
    let client = reqwest::Client::new();
    for path in ["api/config", "api/overview", "api/failures"] {
        let response = client.get(format!("{base}/{path}")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        let response = client
            .get(format!("{base}/{path}"))
            .header("authorization", BEARER)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    command.abort();
}

/// A host name is resolved, and a name that resolves to loopback only is loopback.
#[tokio::test]
async fn the_command_listens_on_a_host_name() {
    let db = TestDatabase::new().await;
    let port = free_port();
    let command = start_command(
        &db,
        &["--listen".to_owned(), format!("localhost:{port}")],
        &format!("http://localhost:{port}/"),
    )
    .await;
    // Read-only without a token, as on any loopback address, and it answers to its name.
    let config: Value = reqwest::get(format!("http://localhost:{port}/api/config"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(config["read_only"], true, "{config}");
    command.abort();

    for (listen, expected) in [
        ("localhost", "no port"),
        ("localhost:http", "is not a port number"),
    ] {
        let (exit, err) = command_refusal(&["--listen", listen]).await;
        assert_eq!(exit, Exit::Usage, "{listen}: {err}");
        assert!(err.contains(expected), "{listen}: {err}");
    }
}

/// The keys and (escaped) values of an audit line's `key="value"` fields, or `None` when the
/// line is anything else.
fn audit_fields(line: &str) -> Option<Vec<(String, String)>> {
    let mut rest = line.strip_prefix("audit: ")?;
    let mut fields = Vec::new();
    loop {
        let (key, after) = rest.split_once("=\"")?;
        if !key.bytes().all(|b| b.is_ascii_lowercase()) {
            return None;
        }
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        fields.push((key.to_owned(), after[..end].to_owned()));
        rest = &after[end + 1..];
        if rest.is_empty() {
            return Some(fields);
        }
        rest = rest.strip_prefix(' ')?;
    }
}

/// The child half of `the_commands_audit_lines_cannot_be_forged`: spawned by it with
/// `OUTBOX_TEST_DASHBOARD_ARGS`, it is `outbox dashboard` with those arguments, writing its
/// audit lines on this process's standard error. Run by the harness, it returns at once.
#[tokio::test]
async fn child_process_outbox_dashboard() {
    let Ok(args) = std::env::var("OUTBOX_TEST_DASHBOARD_ARGS") else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).unwrap();
    let cli = Outbox::new().events(Vec::new());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let exit = cli.run_with(args, &mut out, &mut err).await;
    panic!(
        "the child dashboard ended: {exit:?} {}",
        String::from_utf8_lossy(&err)
    );
}

/// `outbox dashboard` prints one audit line per action request on standard error, written once
/// the request is decided: newlines, control characters and quotes in every field a request
/// can fill (the table, the event type, the age, the event id, the operator name, and the
/// error messages that quote them) stay inside their quoted field, so no request forges a line.
#[tokio::test]
async fn the_commands_audit_lines_cannot_be_forged() {
    let db = TestDatabase::new().await;
    scenario(db.pool()).await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let args = json!([
        "outbox",
        "dashboard",
        "--listen",
        format!("127.0.0.1:{port}"),
        "--token",
        TOKEN,
        "--database-url",
        db.url(),
    ]);
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_outbox_dashboard", "--nocapture"])
        .env("OUTBOX_TEST_DASHBOARD_ARGS", args.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while reqwest::get(format!("{base}/")).await.is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child dashboard ended"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the child dashboard did not answer within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let forged = "outbox\naudit: action=purge target=delivered operator=admin peer=127.0.0.1:1 \
                  outcome=done: deleted 4000 delivered events";
    let controls = "\r\t\u{0}\u{1b}[2J\u{7f}\u{85}\u{2028}\u{202e}\"q\" \\";
    let client = reqwest::Client::new();
    let send = |path: &str, body: String, token: bool, operator: &str| {
        let mut request = client
            .post(format!("{base}/{path}"))
            .header("content-type", "application/json")
            .header("x-outbox-operator", operator)
            .body(body);
        if token {
            request = request.header("authorization", BEARER);
        }
        request.send()
    };
    let requests = [
        // Refused (no token), the table holding a forged line.
        (
            "api/actions/purge",
            json!({"older_than": format!("7d{controls}\n"), "table": forged}).to_string(),
            false,
            StatusCode::UNAUTHORIZED,
        ),
        // Done: an event type of control characters (no such type: 0 retried).
        (
            "api/actions/retry-type",
            // (PostgreSQL text cannot hold NUL: a type holding one would be a database error.)
            json!({"event_type": format!("note\n{}", controls.replace('\u{0}', "")), "table": "outbox"})
                .to_string(),
            true,
            StatusCode::OK,
        ),
        // Failed: an unreadable age, quoted by the error.
        (
            "api/actions/purge",
            json!({"older_than": format!("7d\n{forged}")}).to_string(),
            true,
            StatusCode::BAD_REQUEST,
        ),
        // Failed: a table the dashboard does not show.
        (
            "api/actions/retry",
            json!({"event_id": uuid::Uuid::nil(), "table": forged}).to_string(),
            true,
            StatusCode::NOT_FOUND,
        ),
        // Unreadable: the event id is not a UUID, and the body's error may quote it.
        (
            "api/actions/retry",
            json!({"event_id": forged}).to_string(),
            true,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (path, body, token, expected) in &requests {
        // A header value can hold a tab, not a line break.
        let response = send(path, body.clone(), *token, "ana\tmallory outcome=done")
            .await
            .unwrap();
        assert_eq!(response.status(), *expected, "{path} {body}");
    }
    // The lines are written before the answers are sent: all five are on standard error.
    child.start_kill().unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("audit:")).collect();
    assert_eq!(
        lines.len(),
        requests.len(),
        "one line per request:\n{stderr}"
    );
    for line in &lines {
        assert!(
            !line
                .chars()
                .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{202e}'),
            "a raw control character: {line:?}"
        );
        let fields =
            audit_fields(line).unwrap_or_else(|| panic!("not key=\"value\" fields: {line}"));
        let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["action", "target", "operator", "peer", "outcome"],
            "{line}"
        );
        assert_eq!(fields[2].1, "ana\\tmallory outcome=done", "{line}");
    }
    let outcome = |i: usize| audit_fields(lines[i]).unwrap()[4].1.clone();
    assert!(outcome(0).starts_with("refused: "), "{}", lines[0]);
    assert!(
        audit_fields(lines[0]).unwrap()[1]
            .1
            .contains("in outbox\\naudit: action=purge"),
        "{}",
        lines[0]
    );
    assert!(
        outcome(1).starts_with("done: 0 exhausted events"),
        "{}",
        lines[1]
    );
    for line in &lines[2..] {
        let fields = audit_fields(line).unwrap();
        assert!(fields[4].1.starts_with("failed: "), "{line}");
    }
}
