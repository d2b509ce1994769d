//! The worker: claimer, renewer, completer, maintenance and listener. OWNER: issue 4.
