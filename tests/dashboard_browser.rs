//! The dashboard as an operator sees it: headless Chromium, driven through chromedriver
//! (WebDriver) by fantoccini, against a real PostgreSQL.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without
//! chromedriver the tests fail with a message saying so: they never pass by skipping.
//!
//! `OUTBOX_DASHBOARD_SCREENSHOTS=<dir>` saves the overview and the failures view as PNG files
//! there (the README's pictures come from `docs/img/`).

mod dashboard_support;

// The order service example, for the test of what a newcomer sees after
// `cargo run --example order_service -- --dashboard`.
#[path = "../examples/order_service/app.rs"]
#[allow(
    dead_code,
    reason = "the example's choice of a NATS URL is not used here"
)]
mod app;
#[path = "../examples/order_service/billing.rs"]
mod billing;
#[path = "../examples/order_service/dashboard.rs"]
#[allow(
    dead_code,
    reason = "serve_until_ctrl_c is the example's; the test serves its own"
)]
mod dashboard;
#[path = "../examples/order_service/events.rs"]
mod events;
#[path = "../examples/order_service/orders.rs"]
mod orders;
#[path = "../examples/order_service/receiver.rs"]
mod receiver;

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use dashboard_support::*;
use fantoccini::{Client, ClientBuilder, Locator};
use outbox_runtime::dashboard::DashboardConfig;
use outbox_runtime::testing::TestDatabase;
use sqlx::PgPool;

/// Every wait of these tests ends by this deadline.
const DEADLINE: Duration = Duration::from_secs(30);

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    url: String,
    _child: tokio::process::Child,
}

async fn chromedriver() -> Driver {
    let binary = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_owned());
    // A free port: bind one, read it, release it for chromedriver.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = tokio::process::Command::new(&binary)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start `{binary}` ({e}): the browser tests need Chromium and chromedriver. \
                 Install them with `apt-get install -y chromium chromium-driver` (.ci/run does), \
                 or set CHROMEDRIVER to the driver's path"
            )
        });
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    loop {
        let ready = reqwest::get(format!("{url}/status"))
            .await
            .ok()
            .filter(|r| r.status().is_success());
        if ready.is_some() {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "chromedriver did not answer on {url} within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Driver { url, _child: child }
}

/// The name the DNS-rebinding test re-points at 127.0.0.1 (Chromium's own resolver rule, so no
/// DNS is involved): a page there is same-origin with itself, not with the dashboard.
const REBIND_HOST: &str = "rebind.test";

async fn browser(driver: &Driver) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--lang=en-US",
                     format!("--host-resolver-rules=MAP {REBIND_HOST} 127.0.0.1")],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    tokio::time::timeout(
        DEADLINE,
        ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&driver.url),
    )
    .await
    .expect("chromedriver did not open a browser session in time")
    .expect("chromedriver opens a headless Chromium session (is `chromium` installed?)")
}

/// Poll the text of the first element matching `css` until `done` holds; returns that text.
async fn wait_text(client: &Client, css: &str, done: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    let mut last = String::from("(no such element)");
    while started.elapsed() < DEADLINE {
        if let Ok(element) = client.find(Locator::Css(css)).await {
            if let Ok(text) = element.text().await {
                if done(&text) {
                    return text;
                }
                last = text;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("`{css}` still reads {last:?} after {DEADLINE:?}")
}

/// Click the first element matching `css`. The page re-renders its tables on every refresh, so
/// an element found a moment ago can be gone by the click (a stale element reference): find it
/// again and retry until [`DEADLINE`].
async fn click(client: &Client, css: &str) {
    let started = Instant::now();
    loop {
        let clicked = match client.find(Locator::Css(css)).await {
            Ok(element) => element.click().await,
            Err(e) => Err(e),
        };
        match clicked {
            Ok(()) => return,
            Err(_) if started.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("could not click `{css}` within {DEADLINE:?}: {e}"),
        }
    }
}

/// Poll the database until the event has `status`.
async fn wait_status(pool: &PgPool, event_id: uuid::Uuid, status: &str) {
    let started = Instant::now();
    loop {
        let now = status_of(pool, event_id).await;
        if now == status {
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "event {event_id} is still {now}, not {status}, after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn screenshot(client: &Client, name: &str) {
    if let Ok(dir) = std::env::var("OUTBOX_DASHBOARD_SCREENSHOTS") {
        let png = client.screenshot().await.expect("a screenshot");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(name), png).unwrap();
    }
}

fn fmt_count(n: i64) -> String {
    // The page writes counts with thousands separators (en-US).
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[tokio::test]
async fn the_overview_and_failures_show_the_database_and_hostile_text_stays_text() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, DashboardConfig::new()).await;
    let driver = chromedriver().await;
    let client = browser(&driver).await;

    client.goto(&served.url("/")).await.unwrap();
    for status in ["pending", "processing", "delivered", "exhausted"] {
        let expected = fmt_count(count(pool, status).await);
        let css = format!("[data-table=\"outbox\"] [data-field=\"{status}\"]");
        wait_text(&client, &css, |t| t == expected).await;
    }
    wait_text(&client, "#mode", |t| t.contains("read-only")).await;
    // Read-only: neither the token field nor an (empty) confirmation bar shows.
    for hidden in ["#auth", "#confirm"] {
        let shown = client
            .find(Locator::Css(hidden))
            .await
            .unwrap()
            .is_displayed()
            .await
            .unwrap();
        assert!(!shown, "{hidden} shows on a read-only dashboard");
    }
    // The last hour: every event of the scenario was enqueued in it; the chart splits each
    // minute's bar by where its events stand now.
    for (field, expected) in [
        ("enqueued-last-hour", "15"),
        ("delivered-of-last-hour", "6"),
    ] {
        let css = format!("[data-table=\"outbox\"] [data-field=\"{field}\"]");
        wait_text(&client, &css, |t| t == expected).await;
    }
    for part in ["delivered", "open", "exhausted"] {
        let bars = client
            .find_all(Locator::Css(&format!(
                "[data-chart=\"enqueued\"] rect.bar[data-part=\"{part}\"]"
            )))
            .await
            .unwrap();
        assert!(
            !bars.is_empty(),
            "the enqueued-per-minute chart shows {part} events"
        );
    }
    // The overview's latest failures hold the hostile text too: as text.
    let error = wait_text(
        &client,
        &format!(
            "[data-table=\"outbox\"] tr[data-event-id=\"{}\"] [data-field=\"last-error\"]",
            s.hostile
        ),
        |t| !t.is_empty(),
    )
    .await;
    assert_eq!(error, HOSTILE_ERROR);
    let injected = client
        .find_all(Locator::Css("main script, main img, main b, main i"))
        .await
        .unwrap();
    assert!(
        injected.is_empty(),
        "database text became markup on the overview"
    );
    screenshot(&client, "dashboard-overview.png").await;

    // The page refreshes by itself: a new pending row shows up without reloading.
    let before = count(pool, "pending").await;
    insert(pool, &Seed::new("order.confirmed", "pending")).await;
    let expected = fmt_count(before + 1);
    wait_text(
        &client,
        "[data-table=\"outbox\"] [data-field=\"pending\"]",
        |t| t == expected,
    )
    .await;

    client.goto(&served.url("/#failures")).await.unwrap();
    let row = format!("#failures-table tr[data-event-id=\"{}\"]", s.hostile);
    let error = wait_text(
        &client,
        &format!("{row} [data-field=\"last-error\"]"),
        |t| !t.is_empty(),
    )
    .await;
    assert_eq!(error, HOSTILE_ERROR, "the error renders as its characters");
    let kind = wait_text(&client, &format!("{row} [data-field=\"type\"]"), |t| {
        !t.is_empty()
    })
    .await;
    assert_eq!(kind, format!("{HOSTILE_TYPE} v1"));
    let injected = client
        .find_all(Locator::Css("main script, main img, main b, main i"))
        .await
        .unwrap();
    assert!(injected.is_empty(), "database text became markup");
    let pwned = client
        .execute("return window.pwned === undefined;", vec![])
        .await
        .unwrap();
    assert_eq!(
        pwned,
        serde_json::Value::Bool(true),
        "hostile text ran as script"
    );
    // Read-only: no action buttons anywhere.
    let buttons = client
        .find_all(Locator::Css("button.action:not([hidden])"))
        .await
        .unwrap();
    for b in buttons {
        assert!(
            !b.is_displayed().await.unwrap(),
            "an action button shows on a read-only dashboard"
        );
    }
    screenshot(&client, "dashboard-failures.png").await;

    // The event view: payload hidden.
    client
        .goto(&served.url(&format!("/#event/{}", s.delivered_private)))
        .await
        .unwrap();
    let payload = wait_text(&client, "#event-body [data-field=\"payload\"]", |t| {
        !t.is_empty()
    })
    .await;
    assert!(payload.contains("payload hidden"), "{payload}");
    let state = wait_text(
        &client,
        "#event-body [data-field=\"delivery state\"]",
        |t| !t.is_empty(),
    )
    .await;
    assert!(state.starts_with("none kept"), "{state}");
    let body = client.source().await.unwrap();
    assert!(!body.contains("jane.doe"));
    client.close().await.unwrap();
}

/// Type `token` into the token field and press Use.
async fn paste_token(client: &Client, token: &str) {
    let field = client.find(Locator::Css("#token")).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(token).await.unwrap();
    click(client, "#use-token").await;
}

/// How many rows the failures table shows now.
async fn failure_rows(client: &Client) -> usize {
    client
        .find_all(Locator::Css("#failures-table tbody tr"))
        .await
        .unwrap()
        .len()
}

#[tokio::test]
async fn the_page_asks_for_the_token_and_a_retry_needs_the_action_token() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, with_viewer_token(with_token(DashboardConfig::new()))).await;
    let driver = chromedriver().await;
    let client = browser(&driver).await;

    // Nothing shows before a token is pasted: the page says what it needs.
    client.goto(&served.url("/#failures")).await.unwrap();
    wait_text(&client, "#mode", |t| t.contains("locked")).await;
    let asked = wait_text(&client, "#notice", |t| !t.is_empty()).await;
    assert!(asked.contains("needs its token"), "{asked}");
    assert_eq!(failure_rows(&client).await, 0, "rows shown without a token");

    paste_token(&client, "not-the-token").await;
    wait_text(&client, "#notice", |t| t.contains("the token is wrong")).await;
    assert_eq!(
        failure_rows(&client).await,
        0,
        "rows shown for a wrong token"
    );

    // The viewer token: every row, no action.
    paste_token(&client, VIEWER_TOKEN).await;
    wait_text(&client, "#mode", |t| t.contains("view-only")).await;
    let row = format!("#failures-table tr[data-event-id=\"{}\"]", s.exhausted_note);
    wait_text(&client, &format!("{row} [data-field=\"status\"]"), |t| {
        t == "exhausted"
    })
    .await;
    for b in client
        .find_all(Locator::Css("button.action"))
        .await
        .unwrap()
    {
        assert!(
            !b.is_displayed().await.unwrap(),
            "an action button shows for the viewer token"
        );
    }

    // The action token: a retry is confirmed in the page; cancelled, nothing is sent.
    paste_token(&client, TOKEN).await;
    wait_text(&client, "#mode", |t| t.contains("actions enabled")).await;
    let retry = format!("{row} button.action");
    wait_text(&client, &retry, |t| t == "Retry").await;
    click(&client, &retry).await;
    let question = wait_text(&client, "#confirm-text", |t| !t.is_empty()).await;
    assert!(
        question.contains(&s.exhausted_note.to_string()),
        "{question}"
    );
    click(&client, "#confirm-no").await;
    assert_eq!(status_of(pool, s.exhausted_note).await, "exhausted");

    // Kept for the tab: after a reload the page reads and acts without asking again.
    client.refresh().await.unwrap();
    wait_text(&client, "#mode", |t| t.contains("actions enabled")).await;
    client
        .find(Locator::Css("#operator"))
        .await
        .unwrap()
        .send_keys("browser-test")
        .await
        .unwrap();
    click(&client, &retry).await;
    click(&client, "#confirm-yes").await;
    wait_text(&client, "#notice", |t| t.contains("pending again")).await;
    wait_status(pool, s.exhausted_note, "pending").await;
    client.close().await.unwrap();
}

/// Run `fetch(path)` in the page the browser shows; returns the answer's status and text (or
/// status 0 and the error, when the fetch itself fails).
async fn fetch_in_page(client: &Client, path: &str) -> (u64, String) {
    let answer = client
        .execute_async(
            "const [path, done] = arguments;
             fetch(path).then(async (r) => done([r.status, await r.text()]))
                        .catch((e) => done([0, String(e)]));",
            vec![serde_json::json!(path)],
        )
        .await
        .unwrap();
    (
        answer[0].as_u64().unwrap(),
        answer[1].as_str().unwrap().to_owned(),
    )
}

/// DNS rebinding: a page served from `http://rebind.test:<port>/`, the name re-pointed at the
/// dashboard's 127.0.0.1, can neither load the dashboard nor read its endpoints, payloads
/// shown or not; the same browser reads them at the dashboard's own address.
#[tokio::test]
async fn a_page_on_a_rebound_name_cannot_read_the_dashboard() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let s = scenario(pool).await;
    let served = serve(pool, DashboardConfig::new().with_payloads_shown(true)).await;
    let driver = chromedriver().await;
    let client = browser(&driver).await;
    let event = format!("api/events/{}", s.delivered_private);

    let rebound = format!("http://{REBIND_HOST}:{}/", served.address.port());
    client.goto(&rebound).await.unwrap();
    assert_eq!(client.current_url().await.unwrap().as_str(), rebound);
    let page = client.source().await.unwrap();
    assert!(page.contains("does not answer to the host"), "{page}");
    for path in ["api/overview", "api/failures", event.as_str()] {
        let (status, text) = fetch_in_page(&client, &format!("/{path}")).await;
        assert_eq!(status, 403, "{path} from the rebound page: {text}");
        assert!(
            !text.contains("jane.doe") && !text.contains("order.confirmed"),
            "{text}"
        );
    }

    // The same browser at the dashboard's own address reads it.
    client.goto(&served.url("/")).await.unwrap();
    wait_text(&client, "#mode", |t| t.contains("read-only")).await;
    let (status, text) = fetch_in_page(&client, &event).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("jane.doe"), "{text}");
    client.close().await.unwrap();
}

/// A dashboard on every interface (`0.0.0.0`, with a token) shows nothing to a browser that
/// has not pasted the token, and its endpoints answer that browser 401.
#[tokio::test]
async fn on_a_public_bind_the_page_reads_nothing_without_the_token() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    scenario(pool).await;
    let served = serve_on(pool, with_token(DashboardConfig::new()), "0.0.0.0:0").await;
    let driver = chromedriver().await;
    let client = browser(&driver).await;

    client.goto(&served.url("/")).await.unwrap();
    wait_text(&client, "#mode", |t| t.contains("locked")).await;
    let cards = client
        .find_all(Locator::Css("article[data-table]"))
        .await
        .unwrap();
    assert!(cards.is_empty(), "the overview shows without the token");
    for path in ["api/config", "api/overview", "api/types", "api/claims"] {
        let (status, text) = fetch_in_page(&client, path).await;
        assert_eq!(status, 401, "{path}: {text}");
    }

    paste_token(&client, TOKEN).await;
    let expected = fmt_count(count(pool, "exhausted").await);
    wait_text(
        &client,
        "[data-table=\"outbox\"] [data-field=\"exhausted\"]",
        |t| t == expected,
    )
    .await;
    client.close().await.unwrap();
}

/// A link in an overview card opens the event in that card's table, whatever table the picker
/// shows.
#[tokio::test]
async fn an_overview_link_opens_the_event_in_its_own_table() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        outbox_runtime::store::create_table_sql("notify_outbox").unwrap(),
    ))
    .execute(pool)
    .await
    .unwrap();
    let mut failed = Seed::new("notify.sent", "exhausted");
    failed.attempts = 3;
    failed.last_error = Some("mail server said 550".into());
    let notify = insert_into(pool, "notify_outbox", &failed).await;
    let served = serve(
        pool,
        DashboardConfig::new()
            .with_tables(["outbox", "notify_outbox"])
            .unwrap(),
    )
    .await;
    let driver = chromedriver().await;
    let client = browser(&driver).await;

    client.goto(&served.url("/")).await.unwrap();
    let link = format!("[data-table=\"notify_outbox\"] a[data-event-id=\"{notify}\"]");
    wait_text(&client, &link, |t| t == notify.to_string()).await;
    // The picker shows `outbox`, the first table.
    let picked = client
        .find(Locator::Css("#table"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap();
    assert_eq!(picked.as_deref(), Some("outbox"));
    click(&client, &link).await;
    let error = wait_text(&client, "#event-body [data-field=\"last-error\"]", |t| {
        !t.is_empty()
    })
    .await;
    assert_eq!(error, "mail server said 550");
    let updated = wait_text(&client, "#updated", |t| !t.starts_with("loading")).await;
    assert!(!updated.contains("no event"), "{updated}");
    client.close().await.unwrap();
}

/// What `cargo run --example order_service -- --dashboard` shows: the example's orders
/// delivered (some after lost responses were retried), and the two exhausted while the
/// shipping service was down, with their error.
#[tokio::test]
async fn the_example_service_shows_its_delivered_retried_and_exhausted_events() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let options = app::Options {
        orders: 5,
        nats: app::NatsChoice::Off,
        lose_responses: 2,
        keep_stream: false,
    };
    let report = tokio::time::timeout(Duration::from_secs(120), app::run(pool, &options))
        .await
        .expect("the order service run finished within two minutes")
        .unwrap();
    assert!(report.ok(), "{report}");
    tokio::time::timeout(
        Duration::from_secs(90),
        dashboard::exhaust_while_shipping_is_down(pool),
    )
    .await
    .expect("the shipping-down phase finished within 90 s")
    .unwrap();
    let served = serve(pool, DashboardConfig::new()).await;
    let driver = chromedriver().await;
    let client = browser(&driver).await;

    client.goto(&served.url("/")).await.unwrap();
    wait_text(
        &client,
        "[data-table=\"outbox\"] [data-field=\"delivered\"]",
        |t| t == "5",
    )
    .await;
    wait_text(
        &client,
        "[data-table=\"outbox\"] [data-field=\"exhausted\"]",
        |t| t == "2",
    )
    .await;
    let bars = client
        .find_all(Locator::Css(
            "[data-chart=\"enqueued\"] rect.bar[data-part=\"delivered\"]",
        ))
        .await
        .unwrap();
    assert!(!bars.is_empty(), "the example's deliveries are charted");
    screenshot(&client, "dashboard-example.png").await;

    // Event types: the exhausted events' failed attempts. The retried deliveries' failures went
    // with their queue rows when they were delivered (a delivered event keeps no delivery state).
    client.goto(&served.url("/#types")).await.unwrap();
    let row = "#types-table tr[data-type=\"order.confirmed\"]";
    wait_text(&client, &format!("{row} [data-field=\"exhausted\"]"), |t| {
        t == "2"
    })
    .await;
    let failed: i64 = sqlx::query_scalar(
        "SELECT sum(q.handler_failures + q.lease_expiries)
         FROM outbox_queue q JOIN outbox e ON e.id = q.id
         WHERE e.event_type = 'order.confirmed'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(failed >= 2 * 3, "two events failed three times: {failed}");
    let expected = fmt_count(failed);
    wait_text(&client, &format!("{row} [data-field=\"failures\"]"), |t| {
        t == expected
    })
    .await;

    client.goto(&served.url("/#failures")).await.unwrap();
    wait_text(&client, "#failures-table tbody", |t| {
        t.matches("exhausted").count() == 2
    })
    .await;
    let errors = client
        .find_all(Locator::Css("#failures-table [data-field=\"last-error\"]"))
        .await
        .unwrap();
    assert_eq!(errors.len(), 2);
    for e in errors {
        let text = e.text().await.unwrap();
        assert!(text.contains("cannot connect"), "{text}");
    }
    client.close().await.unwrap();
}

/// The Integrity view shows what `outbox doctor` finds (issue: rows that break the queue
/// invariants must be visible on the dashboard): with the trigger off, an event inserted by SQL
/// reads as delivered and is listed as never queued; an event deleted from under its queue row
/// leaves an orphan, listed with its last error; the rules read OFF. Fixed and checked again,
/// the view reads clean.
#[tokio::test]
async fn the_integrity_view_shows_rows_that_break_the_invariants() {
    let db = TestDatabase::new().await;
    let pool = db.pool();
    let mut doomed = Seed::new("note", "pending");
    doomed.last_error = Some("receiver said 503".into());
    doomed.attempts = 2;
    let doomed = insert(pool, &doomed).await;
    for statement in [
        "ALTER TABLE outbox DISABLE TRIGGER ALL",
        "ALTER TABLE outbox_queue DISABLE TRIGGER ALL",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type, event_version, payload)
         VALUES (gen_random_uuid(), 'written-by-psql', '\\x00', 'note', 1, '{}')",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM outbox WHERE event_id = $1")
        .bind(doomed)
        .execute(pool)
        .await
        .unwrap();
    let served = serve(pool, DashboardConfig::new()).await;
    let driver = chromedriver().await;
    let client = browser(&driver).await;

    client.goto(&served.url("/#integrity")).await.unwrap();
    let trigger = wait_text(
        &client,
        "[data-rule=\"every inserted event gets its queue row\"] [data-field=\"state\"]",
        |t| !t.is_empty(),
    )
    .await;
    assert!(trigger.starts_with("OFF: it is disabled"), "{trigger}");
    let orphans = wait_text(&client, "#integrity-orphans tbody", |t| !t.is_empty()).await;
    assert!(orphans.contains("receiver said 503"), "{orphans}");
    let unqueued = wait_text(&client, "#integrity-unqueued tbody", |t| !t.is_empty()).await;
    assert!(unqueued.contains("written-by-psql"), "{unqueued}");
    assert_eq!(
        wait_text(&client, "#integrity-unqueued-count", |t| !t.is_empty()).await,
        "1 found"
    );
    screenshot(&client, "dashboard-integrity").await;

    // Mended (the doctor's repair and requeue), and checked again from the page.
    for statement in [
        "ALTER TABLE outbox ENABLE TRIGGER ALL",
        "ALTER TABLE outbox_queue ENABLE TRIGGER ALL",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
    let store = outbox_runtime::Store::new(pool.clone());
    assert_eq!(store.delete_orphan_queue_rows().await.unwrap().len(), 1);
    assert_eq!(store.requeue_unqueued_events().await.unwrap().len(), 1);
    click(&client, "#integrity-check").await;
    assert_eq!(
        wait_text(&client, "#integrity-unqueued-count", |t| t == "none").await,
        "none"
    );
    assert_eq!(
        wait_text(&client, "#integrity-orphans-count", |t| t == "none").await,
        "none"
    );
    client.close().await.unwrap();
}
