//! Transports: how request bytes reach the dispatcher and replies reach the kernel.
//!
//! `session` mounts, negotiates INIT and runs the server; `devfuse` is the classic /dev/fuse
//! read/write loop served by several threads. Every transport hands whole requests to
//! [`crate::dispatch::Dispatcher::handle`] and writes the [`crate::protocol::Reply`] it returns.

pub mod devfuse;
pub mod session;
pub mod uring;
pub mod watch;
