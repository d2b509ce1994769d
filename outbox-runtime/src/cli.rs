//! The `outbox` operator command, embedded in a service's binary. OWNER: issue 5.
