//! Progress reporting for long store operations (migrate --copy, backup, materialize, integrity).
//! The store only counts work; the command line decides whether anything is drawn (a bar on a
//! terminal, nothing otherwise).

/// Receives the size of a phase and how much of it is done.
pub trait Progress {
    /// A new phase named `what` with `total` units (bytes, pages or rows).
    fn start(&self, what: &str, total: u64);
    /// `n` more units of the current phase are done.
    fn advance(&self, n: u64);
}

/// Reports nothing.
pub struct Quiet;

impl Progress for Quiet {
    fn start(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
}
