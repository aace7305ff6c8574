//! AgentFS: a POSIX filesystem kept in one SQLite database and served over FUSE.
//!
//! A request travels: `transport` (read from /dev/fuse) → `protocol` (bytes to a typed
//! operation) → `dispatch` (one match, calls the filesystem) → `store` (SQLite, the authority)
//! and back through `protocol` (reply encoding) to the transport.

pub mod abi;
pub mod cache;
pub mod cli;
pub mod delta;
pub mod dispatch;
pub mod errno;
pub mod errors;
pub mod history;
pub mod knobs;
pub mod memory;
pub mod overlay;
pub mod project;
pub mod protocol;
pub mod replica;
pub mod sandbox;
pub mod server;
pub mod store;
pub mod sys;
pub mod transport;
