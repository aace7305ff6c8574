//! A mount session: mount the database at a directory and hand the connection to a server
//! (`crate::server`), which serves it until unmounted or signalled.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::knobs::Knobs;
use crate::server::{self, ServeOptions};
use crate::sys::{mount, signals};

pub use crate::server::{Ready, ServerError as SessionError};

/// Everything a session needs to start.
pub struct SessionConfig {
    pub db: PathBuf,
    pub mount_point: PathBuf,
    pub options: mount::MountOptions,
}

/// Mount and serve until unmounted or signalled. Returns after a clean shutdown, or with
/// [`SessionError::Lost`] when a failed commit lost acknowledged work. `log`: where a
/// background server's standard error goes (shown by `agentfs status`).
pub fn run(
    cfg: &SessionConfig,
    knobs: &Knobs,
    ready: &mut dyn Ready,
    log: Option<PathBuf>,
) -> Result<(), SessionError> {
    let mnt = mount::check_mount_point(&cfg.mount_point, cfg.options.nonempty)?;
    let prepared = server::prepare(&cfg.db, cfg.options.readonly, knobs)?;

    // Signals are blocked before any thread exists, so only the server's waiter receives them.
    signals::block_shutdown_signals();
    let fd = if mount::can_mount_directly() {
        mount::mount_direct(&mnt, &cfg.options)?
    } else {
        mount::mount_fusermount(&mnt, &cfg.options)?
    };
    let opts = ServeOptions {
        mount_point: mnt.clone(),
        register: true,
        log,
        unmount_on_signal: true,
        owner: None,
        guard: None,
        device: server::MountDevice::AtMountPoint,
    };
    let served = prepared.serve(fd, &opts, knobs, ready);
    if let Err(SessionError::Handshake(_)) = &served {
        let _ = mount::unmount(&mnt, true);
    }
    served
}

/// Writes one line to a pipe the launching parent reads: "ok" when live, or the error.
pub struct PipeReady(pub Option<std::fs::File>);

impl Ready for PipeReady {
    fn ready(&mut self, _: &Path) {
        if let Some(mut f) = self.0.take() {
            let _ = writeln!(f, "ok");
        }
    }
}
