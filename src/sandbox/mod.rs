//! The sandbox: a command runs in new user, mount and pid namespaces where its project is served
//! by our filesystem at its real path, everything else is read-only, and secrets are masked.
//!
//! `request` is what the command line and the project's configuration decide; the rest of this
//! module turns it into a view and runs the command in it.

pub mod policy;
pub mod request;
mod stub;

pub use stub::{exec, run, SandboxError};
