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
    let status = std::process::Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--example", "quickstart"])
        .status()
        .expect("running cargo");
    assert!(status.success(), "cargo run --example quickstart failed");
}
