//! The README's quickstart is `examples/quickstart.rs`, verbatim: CI builds and runs the example,
//! and this test keeps the README's copy from drifting.

#[test]
fn readme_quickstart_is_the_quickstart_example() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/quickstart.rs");
    let code = &example[example
        .find("use std::time::Duration;")
        .expect("example starts its code with imports")..];
    assert!(
        readme.contains(code),
        "README.md's quickstart block differs from examples/quickstart.rs; copy the example's code (from its first `use`) into the README"
    );
}

/// The quickstart runs end to end against a real PostgreSQL (found like every other test).
#[test]
fn quickstart_example_runs() {
    // `cargo test` builds the examples next to the test binaries: <target>/<profile>/examples.
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in <target>/<profile>/deps");
    let quickstart = profile_dir.join("examples").join("quickstart");
    if !quickstart.is_file() {
        // A filtered run (`cargo test --test readme`) may not have built it; building it from
        // here with the same profile and target directory reuses the outer build.
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
    let output = std::process::Command::new(&quickstart)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", quickstart.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the quickstart failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("handled "),
        "the handler did not run:\n{stdout}"
    );
    assert!(
        stdout.contains("0 pending, 1 delivered, 0 exhausted"),
        "the event was not delivered:\n{stdout}"
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
