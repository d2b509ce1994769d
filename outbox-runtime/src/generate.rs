//! Migrations and the contract lock generated from the event definitions. OWNER: issue 5.
