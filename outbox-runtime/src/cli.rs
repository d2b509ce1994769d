//! The `outbox` operator command, embedded in a service's own binary (so it links the
//! service's events: `migrations generate` reads them).
//!
//! `src/bin/outbox.rs` is one line in `fn main() { .. }`:
//!
//! ```no_run
//! outbox_runtime::cli::run()
//! ```
//!
//! Commands: `migrate`, `migrations generate`, `migrations check`, `status [--json]`,
//! `retry <event-id>` / `retry --type <name>`, `purge --older-than <7d|12h|30m>`,
//! `grants --enqueuer <role> --worker <role>`. `DATABASE_URL` (or `--database-url`) names
//! the database.
//!
//! Exit codes ([`Exit`]), stable for scripts: 0 ok; 1 a check failed, contract drift, or
//! nothing matched (`retry <id>` of an event that is not exhausted); 2 usage error (bad
//! arguments, invalid table or role name, no database URL); 3 database error (cannot connect,
//! a statement failed); 4 the migrations folder cannot be read or written.
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

/// How the command ended; [`Exit::code`] is the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Ok,
    /// 1: a check failed, contracts drifted, or nothing matched.
    Failed,
    /// 2: the command line or a name in it is wrong.
    Usage,
    /// 3: the database refused or could not be reached.
    Database,
    /// 4: the migrations folder cannot be read or written.
    Files,
}

impl Exit {
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
    /// The defaults: migrations in `./migrations`, the events linked into this binary.
    pub fn new() -> Outbox {
        Outbox {
            migrations_dir: PathBuf::from("migrations"),
            events: None,
        }
    }

    /// The service's migrations folder when `--dir` is not given.
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

/// `Outbox::new().run()`: the whole `main` of a service's `outbox` binary.
pub fn run() -> ! {
    Outbox::new().run()
}
