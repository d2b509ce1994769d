//! Rebuild the crate when a base migration changes: `sqlx::migrate!` embeds the files of
//! `migrations/` at compile time, and cargo does not know it reads them (sqlx's documented
//! remedy).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
