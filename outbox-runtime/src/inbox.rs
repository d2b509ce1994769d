//! The consumer-side inbox: apply a received event at most once. OWNER: issue 6.
