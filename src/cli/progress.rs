//! Progress bars for long commands: drawn on stderr only when it is a terminal, so scripts and
//! logs see nothing.

use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressStyle};

use crate::store::progress::Progress;

/// A bar (or nothing, when stderr is not a terminal).
pub struct Bar(Option<ProgressBar>);

impl Bar {
    pub fn new() -> Bar {
        if !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let pb = ProgressBar::new(0);
        let style = ProgressStyle::with_template("{msg:20} [{bar:40}] {percent:>3}% {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        pb.set_style(style);
        Bar(Some(pb))
    }

    /// A spinner for work of unknown length (e.g. the integrity check).
    pub fn spinner(msg: &str) -> Bar {
        if !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let pb = ProgressBar::new_spinner();
        pb.set_message(msg.to_string());
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        Bar(Some(pb))
    }
}

impl Progress for Bar {
    fn start(&self, what: &str, total: u64) {
        if let Some(pb) = &self.0 {
            pb.set_message(what.to_string());
            pb.set_length(total);
            pb.set_position(0);
        }
    }

    fn advance(&self, n: u64) {
        if let Some(pb) = &self.0 {
            pb.inc(n);
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}
