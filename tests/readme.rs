//! The README's quickstart is `examples/quickstart.rs`, verbatim: CI builds and runs the example,
//! and this test keeps the README's copy from drifting.

use outbox_runtime::testing::TestDatabase;

#[test]
fn readme_quickstart_is_the_quickstart_example() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/quickstart.rs");
    let code = &example[example
        .find("\nuse ")
        .expect("example starts its code with imports")
        + 1..];
    assert!(
        readme.contains(code),
        "README.md's quickstart block differs from examples/quickstart.rs; copy the example's code (from its first `use`) into the README"
    );
}

/// The quickstart example's binary, built with the test profile into this target directory.
fn quickstart_binary() -> std::path::PathBuf {
    // `cargo test` builds the examples next to the test binaries: <target>/<profile>/examples.
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in <target>/<profile>/deps");
    let quickstart = profile_dir.join("examples").join("quickstart");
    // A filtered run (`cargo test --test readme`) does not build examples, and may find none,
    // or one older than the example's source: build it from here with the same profile and
    // target directory, which reuses the outer build.
    let modified = |path: &std::path::Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart.rs");
    if modified(&quickstart).is_none() || modified(&quickstart) < modified(&source) {
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "--example",
                "quickstart",
                "--profile",
                "test",
            ])
            .args([
                "--manifest-path",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            ])
            .env(
                "CARGO_TARGET_DIR",
                profile_dir.parent().expect("target dir"),
            )
            .status()
            .expect("running cargo to build examples/quickstart.rs");
        assert!(status.success(), "building examples/quickstart.rs failed");
    }
    quickstart
}

/// The quickstart runs end to end against a real PostgreSQL, twice against one database: each
/// run waits for its own event, not for whatever an earlier run left delivered.
#[tokio::test]
async fn quickstart_example_runs_twice_against_one_database() {
    let quickstart = quickstart_binary();
    let db = TestDatabase::empty(1).await;
    for run in 1..=2 {
        let output = std::process::Command::new(&quickstart)
            .env("DATABASE_URL", db.url())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", quickstart.display()));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "run {run}: the quickstart failed: {}\n{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        let enqueued = stdout
            .lines()
            .find_map(|l| l.strip_prefix("enqueued "))
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_else(|| panic!("run {run}: no `enqueued <id>` line:\n{stdout}"));
        assert!(
            stdout.contains(&format!("handled {enqueued} (attempt 1)")),
            "run {run}: the handler did not get this run's event:\n{stdout}"
        );
        assert!(
            stdout.contains(&format!(
                "delivered {enqueued}; outbox now: 0 pending, {run} delivered, 0 exhausted"
            )),
            "run {run}: this run's event was not delivered:\n{stdout}"
        );
    }
}

/// Without DATABASE_URL the quickstart says what to set, on one line, and fails; with a
/// database that does not answer it gives up within seconds and says so.
#[test]
fn quickstart_says_what_is_missing() {
    let quickstart = quickstart_binary();
    let output = std::process::Command::new(&quickstart)
        .env_remove("DATABASE_URL")
        .output()
        .expect("running the quickstart");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.starts_with("error: set DATABASE_URL to a PostgreSQL database"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // A port nothing listens on: refused at once, retried until the 5 s timeout.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let started = std::time::Instant::now();
    let output = std::process::Command::new(&quickstart)
        .env(
            "DATABASE_URL",
            format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        )
        .output()
        .expect("running the quickstart");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.starts_with("error: cannot connect to DATABASE_URL within 5 s"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "gave up after {:?}",
        started.elapsed()
    );
}

/// Every metric the worker emits is named in the metric list of `docs/workers.md`, and every counter is in
/// `COUNTERS` (the list registered at zero when a worker starts): a new counter that skips
/// either fails here rather than surprising an operator whose alert has no series.
#[test]
fn metric_guide_lists_every_metric_and_every_counter_is_registered_at_zero() {
    use outbox_runtime::worker::metrics;
    let guide = include_str!("../docs/workers.md");
    let source = include_str!("../outbox-runtime/src/worker/metrics.rs");
    let declared: Vec<&str> = source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("outbox_") && !s.contains(' '))
        .collect();
    assert!(
        declared.len() >= 10,
        "expected the metric names of worker/metrics.rs, found {declared:?}"
    );
    for name in declared {
        assert!(
            guide.contains(&format!("`{name}`")),
            "the metric `{name}` (worker/metrics.rs) is missing from the metric list in docs/workers.md"
        );
        if name.ends_with("_total") {
            assert!(
                metrics::COUNTERS.contains(&name),
                "the counter `{name}` is not in worker::metrics::COUNTERS, so it is not registered at zero"
            );
        }
    }
    for gauge in [
        metrics::PENDING,
        metrics::PROCESSING,
        metrics::EXHAUSTED,
        metrics::OLDEST_PENDING_AGE_SECONDS,
    ] {
        assert!(
            guide.contains(&format!("`{gauge}`")),
            "gauge `{gauge}` missing from the metric list in docs/workers.md"
        );
    }
}
