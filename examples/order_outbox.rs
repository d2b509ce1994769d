//! The `outbox` command of the order service example: the operator tool a service embeds in its
//! own binary (in a service of your own this is `src/bin/outbox.rs`).
//!
//! ```text
//! cargo run --example order_outbox -- migrations generate   # after changing an event
//! cargo run --example order_outbox -- migrations check      # what CI runs
//! DATABASE_URL=postgres://... cargo run --example order_outbox -- migrate
//! DATABASE_URL=postgres://... cargo run --example order_outbox -- status --json
//! ```
//!
//! The events are included from the service's own source, so `migrations generate` sees exactly
//! the types the service compiles; the derive registers them, the command reads the registry.

#[path = "order_service/events.rs"]
#[allow(
    dead_code,
    reason = "linked for the registrations `#[derive(Event)]` submits; the command reads those, not the types"
)]
mod events;

fn main() {
    // In a service of your own, `outbox_runtime::cli::run()` is the whole `main` (migrations in
    // `./migrations`). This example lives in a workspace whose `./migrations` is the outbox base
    // schema, so it names the example service's folder instead.
    outbox_runtime::cli::Outbox::new()
        .migrations_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/order_service/migrations"
        ))
        .run()
}
