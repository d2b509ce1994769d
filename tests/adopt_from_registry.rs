//! A new user adopts the library from the package registry with only what the README and
//! `docs/getting-started.md` say.
//!
//! The crates are packaged as they would be published (`cargo package`), unpacked, and a new
//! crate outside the workspace depends on them by version (`outbox-runtime = "0.1"`), with a
//! `[patch.crates-io]` pointing at the unpacked sources in place of the registry. Its
//! `Cargo.toml`, `src/lib.rs`, `src/main.rs` and `src/bin/outbox.rs` are the code blocks of
//! `docs/getting-started.md`, and its `examples/quickstart.rs` is the README's quickstart block,
//! all taken verbatim. Then, against a real PostgreSQL:
//!
//! - the quickstart runs twice against one database and delivers its own event each time;
//! - the documented `outbox` binary, run from another directory, generates the migration for the
//!   new crate's events into the crate's own `migrations/`; without the documented `use` line it
//!   refuses, saying how to link the events;
//! - `outbox migrate` applies it and the service delivers;
//! - another program enqueues from SQL (`outbox_enqueue`, and a plain `INSERT`), as
//!   `docs/sql-enqueue.md` says: `outbox doctor` finds every invariant kept and `status` counts
//!   both events pending;
//! - the event changed without a version bump: the service refuses before it enqueues, and
//!   `migrations check` names the drift.
//!
//! Builds are offline (this machine's registry cache) in a target directory of their own under
//! this workspace's target directory, kept between runs: the new crate's dependencies build
//! once; later runs rebuild only the two packaged crates when their sources changed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outbox_runtime::testing::TestDatabase;

const WORKSPACE: &str = env!("CARGO_MANIFEST_DIR");
const README: &str = include_str!("../README.md");
const GETTING_STARTED: &str = include_str!("../docs/getting-started.md");

/// The first build compiles every dependency from source (5 minutes on a loaded 2-core machine).
const BUILD_LIMIT: Duration = Duration::from_secs(30 * 60);
/// A run of an already built binary (through `cargo run`, which only checks freshness).
const RUN_LIMIT: Duration = Duration::from_secs(5 * 60);

/// What a finished process left.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn expect_success(self, what: &str) -> Finished {
        assert_eq!(
            self.code,
            Some(0),
            "{what} failed:\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Run `command` to its end, or kill it and fail the test after `limit`.
fn run(mut command: Command, limit: Duration, what: &str) -> Finished {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let mut stdout_pipe = child.stdout.take().expect("piped stdout");
    let mut stderr_pipe = child.stderr.take().expect("piped stderr");
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout_pipe.read_to_string(&mut text);
        text
    });
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr_pipe.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for a child process") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {limit:?}; stderr so far:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Finished {
        code: status.code(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// This test's own folder in the workspace's target directory (next to `debug/`).
fn work_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe
        .parent()
        .and_then(|deps| deps.parent())
        .and_then(|profile| profile.parent())
        .expect("the test binary lives in <target>/<profile>/deps");
    target.join("adopt-from-registry")
}

/// A `cargo` command for the new crate: offline, into this test's target directory, with
/// nothing of the outer `cargo test` or of the machine's outbox settings leaking in.
fn cargo(work: &Path, current_dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(current_dir)
        .env("CARGO_TARGET_DIR", work.join("target"))
        // Build speed only: the new crate's files stay what the docs say.
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env("CARGO_TERM_COLOR", "never")
        .env_remove("DATABASE_URL")
        .env_remove("OUTBOX_MIGRATIONS_DIR")
        .env_remove("CARGO_MANIFEST_DIR")
        .env_remove("CARGO_PKG_NAME")
        .env_remove("RUSTFLAGS");
    command
}

/// Write `text` to `path` unless it already holds it, so an unchanged file keeps its
/// modification time and Cargo rebuilds nothing for it.
fn write_if_changed(path: &Path, text: &[u8]) {
    if std::fs::read(path).is_ok_and(|old| old == text) {
        return;
    }
    std::fs::create_dir_all(path.parent().expect("a file in a folder")).expect("creating a folder");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Make `to` hold exactly the files of `from`, touching only what differs.
fn sync_tree(from: &Path, to: &Path) {
    let mut wanted = Vec::new();
    collect_files(from, Path::new(""), &mut wanted);
    for relative in &wanted {
        let text = std::fs::read(from.join(relative)).expect("reading an unpacked file");
        write_if_changed(&to.join(relative), &text);
    }
    let mut present = Vec::new();
    if to.is_dir() {
        collect_files(to, Path::new(""), &mut present);
    }
    for stale in present.iter().filter(|p| !wanted.contains(p)) {
        std::fs::remove_file(to.join(stale)).expect("removing a file the package no longer has");
    }
}

fn collect_files(root: &Path, relative: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(root.join(relative))
        .unwrap_or_else(|e| panic!("reading {}: {e}", root.join(relative).display()));
    for entry in entries {
        let entry = entry.expect("a folder entry");
        let path = relative.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            collect_files(root, &path, out);
        } else {
            out.push(path);
        }
    }
}

/// `cargo package` both crates and unpack them; returns the folder holding
/// `outbox-runtime-<version>/` and `outbox-macros-<version>/`.
fn package_crates(work: &Path) -> PathBuf {
    let package_target = work.join("package-target");
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(WORKSPACE)
        .env("CARGO_TARGET_DIR", &package_target)
        .args([
            "package",
            "--offline",
            "--no-verify",
            "--allow-dirty",
            "-p",
            "outbox-macros",
            "-p",
            "outbox-runtime",
        ]);
    run(command, RUN_LIMIT, "cargo package").expect_success("cargo package");
    let staging = work.join("unpacked-staging");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).expect("creating the staging folder");
    let version = env!("CARGO_PKG_VERSION");
    let crates = work.join("crates");
    for name in ["outbox-macros", "outbox-runtime"] {
        let file = package_target
            .join("package")
            .join(format!("{name}-{version}.crate"));
        let mut tar = Command::new("tar");
        tar.arg("-xzf").arg(&file).arg("-C").arg(&staging);
        run(tar, RUN_LIMIT, "tar").expect_success(&format!("unpacking {}", file.display()));
        let unpacked = format!("{name}-{version}");
        sync_tree(&staging.join(&unpacked), &crates.join(&unpacked));
    }
    let _ = std::fs::remove_dir_all(&staging);
    crates
}

/// The body of the first fenced block of `lang` whose first line is `first_line`.
fn block_starting_with(text: &str, lang: &str, first_line: &str) -> String {
    let fence = format!("```{lang}\n");
    let mut rest = text;
    while let Some(start) = rest.find(&fence) {
        let body_start = start + fence.len();
        let body_len = rest[body_start..]
            .find("```\n")
            .expect("a closed fenced block");
        let body = &rest[body_start..body_start + body_len];
        if body.lines().next() == Some(first_line) {
            return body.to_owned();
        }
        rest = &rest[body_start + body_len..];
    }
    panic!("no ```{lang} block starting with `{first_line}`");
}

/// The body of the first fenced block of `lang` after `heading`.
fn block_after(text: &str, heading: &str, lang: &str) -> String {
    let section = &text[text
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}`"))..];
    let fence = format!("```{lang}\n");
    let start = section
        .find(&fence)
        .unwrap_or_else(|| panic!("no ```{lang} block after `{heading}`"))
        + fence.len();
    let len = section[start..]
        .find("```\n")
        .expect("a closed fenced block");
    section[start..start + len].to_owned()
}

/// The new crate, written from the docs; returns its folder.
fn scaffold(work: &Path, crates: &Path) -> PathBuf {
    let shop = work.join("shop");
    let version = env!("CARGO_PKG_VERSION");
    let manifest = block_starting_with(GETTING_STARTED, "toml", "# Cargo.toml");
    let readme_dependencies = block_after(README, "## Quickstart", "toml");
    assert!(
        manifest.contains(&readme_dependencies),
        "the README's quickstart dependencies differ from docs/getting-started.md's Cargo.toml:\n{readme_dependencies}"
    );
    // The registry stand-in, and no part of the workspace this folder happens to sit in.
    let manifest = format!(
        "{manifest}\n[patch.crates-io]\noutbox-runtime = {{ path = {:?} }}\noutbox-macros = {{ path = {:?} }}\n\n[workspace]\n",
        crates.join(format!("outbox-runtime-{version}")),
        crates.join(format!("outbox-macros-{version}")),
    );
    write_if_changed(&shop.join("Cargo.toml"), manifest.as_bytes());
    for file in ["src/lib.rs", "src/main.rs", "src/bin/outbox.rs"] {
        let code = block_starting_with(GETTING_STARTED, "rust", &format!("// {file}"));
        write_if_changed(&shop.join(file), code.as_bytes());
    }
    // The documented command without its `use` line: what a user who skipped it builds.
    let documented = block_starting_with(GETTING_STARTED, "rust", "// src/bin/outbox.rs");
    assert!(documented.contains("use shop as _;\n"), "{documented}");
    write_if_changed(
        &shop.join("src/bin/outbox_unlinked.rs"),
        documented.replace("use shop as _;\n", "").as_bytes(),
    );
    let quickstart = block_after(README, "## Quickstart", "rust,ignore");
    write_if_changed(&shop.join("examples/quickstart.rs"), quickstart.as_bytes());
    // Offline resolution picks the versions this workspace locked (and this machine cached).
    if !shop.join("Cargo.lock").exists() {
        std::fs::copy(
            Path::new(WORKSPACE).join("Cargo.lock"),
            shop.join("Cargo.lock"),
        )
        .expect("copying Cargo.lock");
    }
    // Left by an earlier run: this run generates them anew.
    let _ = std::fs::remove_dir_all(shop.join("migrations"));
    shop
}

fn enqueued_id(stdout: &str, what: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("enqueued "))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{what}: no `enqueued <id>` line:\n{stdout}"))
        .to_owned()
}

#[tokio::test]
async fn a_new_crate_adopts_the_packaged_crates_as_the_docs_say() {
    let work = work_dir();
    std::fs::create_dir_all(&work).expect("creating the work folder");
    let started = Instant::now();
    let crates = package_crates(&work);
    let shop = scaffold(&work, &crates);

    let mut build = cargo(&work, &shop);
    build.args(["build", "--offline", "--bins", "--example", "quickstart"]);
    run(build, BUILD_LIMIT, "building the new crate").expect_success("cargo build");
    eprintln!(
        "adopt_from_registry: packaged and built in {:.0?}",
        started.elapsed()
    );

    // The quickstart, twice against one database: each run delivers its own event.
    let db = TestDatabase::empty(1).await;
    let quickstart = work.join("target/debug/examples/quickstart");
    for round in 1..=2 {
        let mut command = Command::new(&quickstart);
        command.env("DATABASE_URL", db.url());
        let out = run(command, RUN_LIMIT, "the quickstart")
            .expect_success(&format!("quickstart run {round}"));
        let id = enqueued_id(&out.stdout, "the quickstart");
        assert!(
            out.stdout.contains(&format!(
                "delivered {id}; outbox now: 0 pending, {round} delivered"
            )),
            "run {round}: {}",
            out.stdout
        );
    }

    // The documented `outbox` binary, run from another directory, writes into the crate's folder.
    let elsewhere = work.join("elsewhere");
    let _ = std::fs::remove_dir_all(&elsewhere);
    std::fs::create_dir_all(&elsewhere).expect("creating a folder");
    let manifest = shop.join("Cargo.toml");
    let outbox = |args: &[&str], database: Option<&str>| {
        let mut command = cargo(&work, &elsewhere);
        command
            .args(["run", "--quiet", "--offline", "--manifest-path"])
            .arg(&manifest)
            .args(["--bin", "outbox", "--"])
            .args(args);
        if let Some(url) = database {
            command.env("DATABASE_URL", url);
        }
        run(command, BUILD_LIMIT, "the outbox command")
    };
    let generated = outbox(&["migrations", "generate"], None).expect_success("migrations generate");
    let migration = shop.join("migrations/0001_outbox_events.sql");
    assert!(
        generated
            .stdout
            .contains(&format!("wrote {}", migration.display())),
        "{}",
        generated.stdout
    );
    let sql = std::fs::read_to_string(&migration).expect("the generated migration");
    assert!(sql.contains("invoice.issued"), "{sql}");
    let lock = std::fs::read_to_string(shop.join("migrations/outbox.lock")).expect("the lock");
    assert!(lock.contains("\"invoice.issued\""), "{lock}");
    assert!(
        !elsewhere.join("migrations").exists(),
        "nothing is written where the command happened to run"
    );
    outbox(&["migrations", "check"], None).expect_success("migrations check");

    // Without the documented `use` line: a refusal that says why and how, never an empty lock.
    let mut unlinked = cargo(&work, &shop);
    unlinked.args([
        "run",
        "--quiet",
        "--offline",
        "--bin",
        "outbox_unlinked",
        "--",
        "migrations",
        "check",
    ]);
    let refused = run(unlinked, BUILD_LIMIT, "the unlinked command");
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("0 events are linked into this binary")
            && refused
                .stderr
                .contains("add `use shop as _;` to src/bin/outbox.rs"),
        "{}",
        refused.stderr
    );

    // Apply the schema and the generated migration; plain `cargo run` is the service.
    let service_db = TestDatabase::empty(2).await;
    let url = service_db.url();
    outbox(&["migrate"], Some(&url)).expect_success("outbox migrate");
    let service = || {
        let mut command = cargo(&work, &shop);
        command
            .args(["run", "--quiet", "--offline"])
            .env("DATABASE_URL", &url);
        run(command, BUILD_LIMIT, "the service")
    };
    let served = service().expect_success("the service");
    let id = enqueued_id(&served.stdout, "the service");
    assert!(
        served.stdout.contains(&format!("delivered {id}")),
        "{}",
        served.stdout
    );

    // Another program enqueues into the same table from SQL, as docs/sql-enqueue.md says (its
    // functions come with the packaged crate's base schema), and a plain INSERT by hand gets its
    // queue row too: `outbox doctor` finds every invariant kept, and `status` counts both as
    // pending, not delivered.
    let mut psql = Command::new("psql");
    // Without the URL's sqlx-only options (psql refuses them).
    psql.arg(url.split('?').next().unwrap_or(&url))
        .args(["-v", "ON_ERROR_STOP=1", "-qAtc"])
        .arg(
            "SELECT outbox_enqueue('outbox', 'billing-sql/1', 'invoice.issued', 1,              '{\"invoice_id\": \"6be25b8a-f769-4180-9ef9-101b587089f8\", \"total_cents\": 7}',              aggregate_id => '6be25b8a-f769-4180-9ef9-101b587089f8');              INSERT INTO outbox (event_id, operation_key, payload_fingerprint, event_type,              event_version, payload) VALUES (gen_random_uuid(), 'by-hand/1', '\\x00',              'invoice.issued', 1, '{\"invoice_id\": \"6be25b8a-f769-4180-9ef9-101b587089f8\",              \"total_cents\": 8}');",
        );
    run(psql, RUN_LIMIT, "psql").expect_success("psql");
    let doctor = outbox(&["doctor"], Some(&url)).expect_success("outbox doctor");
    assert!(
        doctor
            .stdout
            .contains("ok       every inserted event gets its queue row")
            && doctor
                .stdout
                .contains("ok       no event reads as delivered without having been queued"),
        "{}",
        doctor.stdout
    );
    let status = outbox(&["status"], Some(&url)).expect_success("outbox status");
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("pending")
                && l.split_whitespace().nth(1) == Some("2")),
        "{}",
        status.stdout
    );

    // The event changes shape without a version bump: the service refuses before it writes.
    let lib = shop.join("src/lib.rs");
    let documented = std::fs::read_to_string(&lib).expect("src/lib.rs");
    assert!(documented.contains("pub total_cents: i64,"), "{documented}");
    std::fs::write(
        &lib,
        documented.replace("pub total_cents: i64,", "pub total_cents: u64,"),
    )
    .expect("changing the event");
    let drifted = service();
    let check = outbox(&["migrations", "check"], None);
    std::fs::write(&lib, &documented).expect("restoring the documented event");
    assert_eq!(drifted.code, Some(1), "{}", drifted.stderr);
    assert!(
        drifted
            .stderr
            .contains("refusing to enqueue event `invoice.issued` version 1")
            && drifted.stderr.contains("Nothing was written"),
        "{}",
        drifted.stderr
    );
    assert!(!drifted.stdout.contains("enqueued "), "{}", drifted.stdout);
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE event_type = 'invoice.issued'
             AND operation_key NOT IN ('billing-sql/1', 'by-hand/1')",
    )
    .fetch_one(service_db.pool())
    .await
    .expect("counting events");
    assert_eq!(rows, 1, "only the event of the run before the change");
    assert_eq!(check.code, Some(1), "{}", check.stderr);
    assert!(
        check
            .stderr
            .contains("event `invoice.issued` version 1 changed shape without a version bump"),
        "{}",
        check.stderr
    );
    eprintln!("adopt_from_registry: done in {:.0?}", started.elapsed());
}
