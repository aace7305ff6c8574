//! The sandbox: a command runs in new user, mount and pid namespaces where its project is served
//! by our filesystem at its real path, everything else is read-only, and secrets are masked.
//!
//! `request` is what the command line and the project's configuration decide; `plan` turns it
//! into an ordered list of mount operations; `view` applies them inside the namespaces;
//! `launch` runs the processes (supervisor and server outside, a small pid 1 and the command
//! inside); `record` keeps the live marker and what each run enforced. docs/sandbox.md states
//! the view and the policy.

pub mod audit;
mod history;
mod launch;
pub mod plan;
pub mod policy;
pub mod preflight;
pub mod probe;
pub mod record;
pub mod request;
mod upperdir;
mod view;

pub use launch::{exec, run};
pub use record::{latest_record, live, LiveMarker, RunRecord};
pub use upperdir::{
    left_over as upper_left_over, settle as settle_upper, upper_dir,
    waiting_beside as upper_waiting, Imported,
};

/// Why a sandbox did not start (or its server lost work); one line that says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("user namespaces are disabled (user.max_user_namespaces=0): enable them with `sysctl -w user.max_user_namespaces=15000`")]
    UsernsDisabled,
    #[error("{0}")]
    UsernsApparmor(String),
    #[error("cannot create the sandbox's namespaces: {0} (unprivileged user namespaces must be allowed; in a container run with --security-opt seccomp=unconfined or use the host)")]
    UsernsDenied(String),
    #[error("{0}")]
    FuseUnavailable(String),
    #[error(
        "project directory {0} is missing: create it or point the project at an existing directory"
    )]
    SourceMissing(std::path::PathBuf),
    #[error("{0}")]
    DbCorrupt(String),
    #[error("{0}")]
    DbOldSchema(String),
    #[error("{0}")]
    DbBusy(String),
    #[error("{op} {path}: {err} (the view cannot be built; nothing was run)")]
    MountFailed {
        op: &'static str,
        path: String,
        err: String,
    },
    #[error("{op} {path}: {err} (check that the source exists and is readable; nothing was run)")]
    BindFailed {
        op: &'static str,
        path: String,
        err: String,
    },
    #[error("the policy cannot be enforced: {0}; nothing was run")]
    PolicyUnenforceable(String),
    #[error("cannot run {0}")]
    CommandFailed(String),
    #[error("the sandbox's server failed: {0}")]
    Server(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Config(String),
    /// Replication refused or failed to start (`litestream_missing`, `litestream_failed`,
    /// `replicating`, `replicate_mismatch`, ...): nothing was run.
    #[error("{}", .0.message)]
    Replication(crate::project::Error),
    /// The overlayfs backend could not export the delta into its upper directory or import
    /// that directory back (the directory then stays for the next launch or `agentfs recover`).
    #[error("{0}")]
    Upper(String),
    /// The overlayfs backend's upper directory could not be imported for lack of space in the
    /// database: the directory stays the project's truth, and the project is marked full.
    #[error("{0}")]
    UpperFull(String),
    /// `--mount-backend auto` found no backend: both attempts' failures.
    #[error("no mount backend works here ({0}): give this user /dev/fuse (`chmod 0666 /dev/fuse`; in a container --device /dev/fuse --cap-add SYS_ADMIN) or a kernel with overlayfs in user namespaces (5.11 or later)")]
    NoMountBackend(String),
    #[error("no cgroup can be made to freeze the sandbox for checkpoints ({0}); AGENTFS_CHECKPOINT_FREEZE=auto runs with unfrozen checkpoints, =off never freezes")]
    FreezerUnavailable(String),
}

impl SandboxError {
    /// A stable name for scripts and the run record.
    pub fn code(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The error code (src/errors.rs).
    pub fn kind(&self) -> crate::errors::Code {
        use crate::errors::Code;
        match self {
            SandboxError::UsernsDisabled => Code::UsernsDisabled,
            SandboxError::UsernsApparmor(_) => Code::UsernsApparmor,
            SandboxError::UsernsDenied(_) => Code::UsernsDenied,
            SandboxError::FuseUnavailable(_) => Code::FuseUnavailable,
            SandboxError::SourceMissing(_) => Code::SourceMissing,
            SandboxError::DbCorrupt(_) => Code::DbCorrupt,
            SandboxError::DbOldSchema(_) => Code::DbOldSchema,
            SandboxError::DbBusy(_) => Code::DbBusy,
            SandboxError::MountFailed { .. } => Code::MountFailed,
            SandboxError::BindFailed { .. } => Code::BindFailed,
            SandboxError::PolicyUnenforceable(_) => Code::PolicyUnenforceable,
            SandboxError::CommandFailed(_) => Code::CommandFailed,
            SandboxError::Server(_) => Code::ServerFailed,
            SandboxError::Io(_) => Code::Io,
            // A configuration error carried as `CODE: MESSAGE` (`bad_knob`, `bad_ignore_pattern`)
            // keeps its code.
            SandboxError::Config(m) => crate::errors::split(m).map_or(Code::BadConfig, |(c, _)| c),
            SandboxError::FreezerUnavailable(_) => Code::FreezerUnavailable,
            SandboxError::Upper(_) => Code::UpperFailed,
            SandboxError::UpperFull(_) => Code::CapacityExhausted,
            SandboxError::NoMountBackend(_) => Code::NoMountBackend,
            SandboxError::Replication(e) => e.code,
        }
    }

    /// Rebuild an error a process inside the sandbox reported as `code\tmessage`.
    fn from_wire(line: &str) -> SandboxError {
        let (code, msg) = line.split_once('\t').unwrap_or(("io", line));
        let text = msg.replace('\t', " ");
        let (op, rest) = msg.split_once('\t').unwrap_or(("", msg));
        let (path, err) = rest.split_once('\t').unwrap_or(("", rest));
        let op = plan::op_name(op);
        match code {
            "mount_failed" => SandboxError::MountFailed {
                op,
                path: path.into(),
                err: err.into(),
            },
            "bind_failed" => SandboxError::BindFailed {
                op,
                path: path.into(),
                err: err.into(),
            },
            "policy_unenforceable" => {
                SandboxError::PolicyUnenforceable(format!("{op} {path}: {err}"))
            }
            "userns_denied" => SandboxError::UsernsDenied(text),
            "command_failed" => SandboxError::CommandFailed(text),
            "freezer_unavailable" => SandboxError::FreezerUnavailable(text),
            _ => SandboxError::Io(text),
        }
    }
}
