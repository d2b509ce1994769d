//! Compile-time misuse of the macros and of enqueue, with committed `.stderr` snapshots: one
//! misuse per file, named after it. Regenerate with `TRYBUILD=overwrite cargo test --test ui`
//! and read the diff: each message must point at the offending token and say what to write.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/event/*.rs");
    t.compile_fail("tests/ui/handler/*.rs");
    t.compile_fail("tests/ui/catalogue/*.rs");
    t.compile_fail("tests/ui/enqueue/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
