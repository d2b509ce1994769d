//! Command-line arguments into the `outbox` command.

use std::ffi::OsString;

use crate::cli::{Exit, Outbox, parse_args};

/// Arguments from fuzzer bytes: split at NUL bytes (no argument can hold one). On Unix an
/// argument may be any other bytes, UTF-8 or not, as a shell can pass it.
pub fn args_from_bytes(data: &[u8]) -> Vec<OsString> {
    data.split(|b| *b == 0).map(os_string).collect()
}

#[cfg(unix)]
fn os_string(bytes: &[u8]) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    OsString::from_vec(bytes.to_vec())
}

#[cfg(not(unix))]
fn os_string(bytes: &[u8]) -> OsString {
    OsString::from(String::from_utf8_lossy(bytes).into_owned())
}

/// Run the `outbox` command's parser on `args` (after the program name), and the command
/// itself when it only prints (`grants`: no database, no files), and check:
///
/// - nothing panics;
/// - a usage error is [`Exit::Usage`] (exit code 2), with a message on stderr that shows the
///   usage or points to `--help`, and nothing on stdout;
/// - `--help` and `--version` are [`Exit::Ok`] with their text on stdout;
/// - a command that only prints ends in [`Exit::Ok`] with output and no diagnostics, or in
///   [`Exit::Usage`] with an `error:` line (a role or table name outside the rule).
///
/// # Panics
/// When one of those invariants does not hold.
pub fn check_cli_args(args: &[OsString]) {
    let argv: Vec<OsString> = std::iter::once(OsString::from("outbox"))
        .chain(args.iter().cloned())
        .collect();
    let mut out = Vec::new();
    let mut err = Vec::new();
    let cli = match parse_args(argv, &mut out, &mut err) {
        Ok(cli) => cli,
        Err(Exit::Usage) => {
            assert_eq!(Exit::Usage.code(), 2);
            assert!(out.is_empty(), "a usage error wrote to stdout");
            let message = String::from_utf8_lossy(&err);
            // clap's messages end with the usage, or with where to find it.
            assert!(
                message.contains("Usage: outbox") || message.contains("'--help'"),
                "{message}"
            );
            return;
        }
        Err(Exit::Ok) => {
            assert!(
                err.is_empty() && !out.is_empty(),
                "help or version without text"
            );
            return;
        }
        Err(other) => panic!("the parser ended with {other:?}"),
    };
    assert!(out.is_empty() && err.is_empty(), "the parser wrote");
    if !cli.is_offline() {
        return;
    }
    let outbox = Outbox::new().events(Vec::new());
    let exit = futures::executor::block_on(outbox.execute(cli, &mut out, &mut err));
    let diagnostics = String::from_utf8_lossy(&err);
    match exit {
        Exit::Ok => assert!(!out.is_empty() && err.is_empty(), "{diagnostics}"),
        Exit::Usage => assert!(diagnostics.starts_with("error: "), "{diagnostics}"),
        other => panic!("a command that only prints ended with {other:?}: {diagnostics}"),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Words the parser knows, values of every kind, and anything.
    fn arg() -> impl Strategy<Value = OsString> {
        let known = proptest::sample::select(vec![
            "migrate",
            "migrations",
            "generate",
            "check",
            "status",
            "retry",
            "purge",
            "grants",
            "help",
            "--json",
            "--table",
            "--limit",
            "--type",
            "--older-than",
            "--batch",
            "--enqueuer",
            "--worker",
            "--inbox-consumer",
            "--database-url",
            "--dir",
            "--help",
            "-h",
            "--version",
            "-V",
            "--",
            "-",
            "=",
            "outbox",
            "app_worker",
            "app_enqueuer",
            "public",
            "Robert'); DROP TABLE outbox; --",
            "7d",
            "12h",
            "0s",
            "99999999999999999999d",
            "-1",
            "9223372036854775808",
            "3f1c2a9e-5b3d-4c8f-9e07-d1a4b2c6e835",
            "--table=outbox",
            "--enqueuer=a",
            "--worker=a",
        ]);
        prop_oneof![
            4 => known.prop_map(OsString::from),
            2 => "\\PC{0,12}".prop_map(OsString::from),
            1 => proptest::collection::vec(1u8..=255, 0..8).prop_map(|b| os_string(&b)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_targets::proptest_cases()))]

        #[test]
        fn any_arguments_keep_the_contract(args in proptest::collection::vec(arg(), 0..6)) {
            check_cli_args(&args);
        }

        #[test]
        fn any_bytes_keep_the_contract(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            check_cli_args(&args_from_bytes(&data));
        }
    }

    #[test]
    fn every_outcome_is_reached() {
        let args = |words: &[&str]| words.iter().map(OsString::from).collect::<Vec<_>>();
        // Each of these reaches one branch of the target.
        for words in [
            &["--bogus"][..],
            &["--help"],
            &["--version"],
            &["status"],
            &[
                "grants",
                "--enqueuer",
                "app_enqueuer",
                "--worker",
                "app_worker",
            ],
            &["grants", "--enqueuer", "public", "--worker", "app_worker"],
        ] {
            check_cli_args(&args(words));
        }
        let mut out = Vec::new();
        let mut err = Vec::new();
        let parsed = parse_args(
            ["outbox", "purge", "--older-than", "7x"],
            &mut out,
            &mut err,
        );
        assert_eq!(parsed.err(), Some(Exit::Usage));
        assert!(String::from_utf8_lossy(&err).contains("is not a duration"));
    }
}
