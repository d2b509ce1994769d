//! Unpublished package owning the examples and integration tests of the outbox workspace.
