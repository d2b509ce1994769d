//! Publishers: [`crate::Sink`]s that deliver events to brokers and HTTP receivers. OWNER: issue 6.
