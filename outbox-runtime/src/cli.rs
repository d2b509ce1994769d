//! The `outbox` operator command, embedded in a service's own binary (so it links the
//! service's events: `migrations generate` reads them).
//!
//! `src/bin/outbox.rs` of a package `my-service` whose events are in its library (`src/lib.rs`):
//!
//! ```ignore
//! // Links the library, and with it every `#[derive(Event)]` type: a binary in src/bin/ links
//! // its package's library only when it names it.
//! use my_service as _;
//!
//! fn main() {
//!     outbox_runtime::cli::run()
//! }
//! ```
//!
//! Without the `use` line the binary compiles but holds no events, and `migrations generate`
//! and `migrations check` refuse to run (exit 2), saying so. Events in `src/main.rs` are
//! invisible to every other binary: move them into `src/lib.rs`.
//!
//! Commands: `migrate`, `migrations generate`, `migrations check`, `status [--json]`,
//! `doctor [--repair] [--requeue]`,
//! `retry <event-id>` / `retry --type <name>`, `purge --older-than <7d|12h|30m>`,
//! `grants --enqueuer <role> --worker <role>`. `DATABASE_URL` (or `--database-url`) names
//! the database. The commands that read or change events (`status`, `retry`, `purge`, and
//! `grants`) act on every outbox table of the binary (`outbox` and every table its events
//! name) unless `--table` names some.
//!
//! Exit codes are stable for scripts; [`Exit`] is their one table ([`Exit::meaning`]), which
//! `outbox --help` prints.
//!
//! [`Outbox::run_with`] is the testable core: arguments in, output into two writers, an
//! [`Exit`] back.

mod args;
mod commands;
mod duration;

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;

pub use duration::{format_duration, parse_duration};

use crate::generate::CompiledEvent;

/// How the command ended; [`Exit::code`] is the process exit code and [`Exit::meaning`] says
/// when each is used. This is the one table of exit codes: `outbox --help` prints it
/// ([`exit_codes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Ok,
    /// 1: a check failed, contracts drifted, or nothing matched.
    Failed,
    /// 2: the command line, a name in it, or the binary's setup is wrong.
    Usage,
    /// 3: the database refused or could not be reached.
    Database,
    /// 4: the migrations folder cannot be read or written.
    Files,
}

impl Exit {
    /// Every exit, in the order of its code.
    pub const ALL: [Exit; 5] = [
        Exit::Ok,
        Exit::Failed,
        Exit::Usage,
        Exit::Database,
        Exit::Files,
    ];

    /// When the command ends with this code.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "done",
            Exit::Failed => {
                "a check failed: stale migrations, contract drift, a registry mismatch, or `retry <id>` found no \
                 exhausted event with that id in the tables it searched (`retry --type` exits 0 and prints the \
                 counts, 0 included)"
            }
            Exit::Usage => {
                "usage: bad arguments, an invalid table or role name, no database URL or one that is not \
                 PostgreSQL's, or no events linked into the binary (`migrations generate` and `check`)"
            }
            Exit::Database => {
                "database: cannot connect, a table does not exist, or a statement failed"
            }
            Exit::Files => "the migrations folder or its lock cannot be read or written",
        }
    }

    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Database => 3,
            Exit::Files => 4,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}

/// The command, configured for one service.
#[derive(Debug, Clone)]
pub struct Outbox {
    migrations_dir: PathBuf,
    events: Option<Vec<CompiledEvent>>,
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox::new()
    }
}

impl Outbox {
    /// The defaults: migrations in `migrations` (relative to the package's directory when run
    /// by `cargo run`, which sets `CARGO_MANIFEST_DIR`; to the current directory otherwise), and
    /// the events linked into this binary.
    pub fn new() -> Outbox {
        Outbox {
            migrations_dir: PathBuf::from("migrations"),
            events: None,
        }
    }

    /// The service's migrations folder when `--dir` is not given. A relative path is resolved
    /// like the default's.
    pub fn migrations_dir(mut self, dir: impl Into<PathBuf>) -> Outbox {
        self.migrations_dir = dir.into();
        self
    }

    /// Use these events instead of those linked into the binary (for tests and tools).
    pub fn events(mut self, events: Vec<CompiledEvent>) -> Outbox {
        self.events = Some(events);
        self
    }

    /// Parse the process arguments, run, and exit with the command's [`Exit::code`].
    pub fn run(self) -> ! {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build();
        let exit = match runtime {
            Ok(runtime) => runtime.block_on(async {
                let mut out = std::io::stdout();
                let mut err = std::io::stderr();
                self.run_with(std::env::args_os(), &mut out, &mut err).await
            }),
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                Exit::Failed
            }
        };
        let _ = std::io::stdout().flush();
        std::process::exit(i32::from(exit.code()))
    }

    /// Run with `args` (the first is the program name), writing results to `out` and
    /// diagnostics to `err`.
    pub async fn run_with<I, T>(
        &self,
        args: I,
        out: &mut (dyn Write + Send),
        err: &mut (dyn Write + Send),
    ) -> Exit
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = match parse_args(args, out, err) {
            Ok(cli) => cli,
            Err(exit) => return exit,
        };
        self.execute(cli, out, err).await
    }

    /// Run a parsed command line.
    pub(crate) async fn execute(
        &self,
        cli: args::Cli,
        out: &mut (dyn Write + Send),
        err: &mut (dyn Write + Send),
    ) -> Exit {
        let events = self
            .events
            .clone()
            .unwrap_or_else(crate::generate::compiled_events);
        let context = commands::Context {
            default_dir: &self.migrations_dir,
            events: &events,
            out,
            err,
        };
        commands::execute(cli, context).await
    }
}

/// Read the command line. A usage error is written to `err` ([`Exit::Usage`]); `--help` and
/// `--version` are not errors: their text goes to `out` ([`Exit::Ok`]). Separate from running,
/// so the fuzz targets feed it any arguments without running a command (`crate::fuzz_targets`).
pub(crate) fn parse_args<I, T>(
    args: I,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<args::Cli, Exit>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    args::Cli::try_parse_from(args).map_err(|e| {
        let text = e.render().to_string();
        if e.use_stderr() {
            let _ = write!(err, "{text}");
            Exit::Usage
        } else {
            let _ = write!(out, "{text}");
            Exit::Ok
        }
    })
}

/// The exit code table ([`Exit::meaning`] of every code), as `outbox --help` ends.
pub fn exit_codes() -> String {
    let mut text = String::from("Exit codes:\n");
    for exit in Exit::ALL {
        text.push_str(&format!("  {}  {}\n", exit.code(), exit.meaning()));
    }
    text
}

/// `Outbox::new().run()`: the whole `main` of a service's `outbox` binary.
pub fn run() -> ! {
    Outbox::new().run()
}
