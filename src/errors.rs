//! The closed set of error codes a failing command reports (docs/harness.md lists them).
//!
//! Each code is declared once, in the table below, with the class a harness branches on and
//! the exit status of that class. A fine code (`userns_disabled`, `policy_dotdot`) names the
//! exact reason; its class (`unsupported_platform`, `policy_invalid`) is the code of the JSON
//! error object, the fine code its `detail`. A class is its own class.

macro_rules! codes {
    ($( $variant:ident = $name:literal, $class:ident; )*) => {
        /// One error code. [`Code::as_str`] is its stable name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $( $variant, )*
        }

        impl Code {
            /// Every code, in table order.
            pub const ALL: &'static [Code] = &[$(Code::$variant),*];

            /// The stable snake_case name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Code::$variant => $name, )*
                }
            }

            /// The class: the code a harness branches on.
            pub fn class(self) -> Code {
                match self {
                    $( Code::$variant => Code::$class, )*
                }
            }
        }
    };
}

codes! {
    // Classes: the codes of the JSON error object.
    Usage = "usage", Usage;
    NotFound = "not_found", NotFound;
    NotADatabase = "not_a_database", NotADatabase;
    DbOldSchema = "db_old_schema", DbOldSchema;
    DbCorrupt = "db_corrupt", DbCorrupt;
    ConfigInvalid = "config_invalid", ConfigInvalid;
    PolicyInvalid = "policy_invalid", PolicyInvalid;
    UnsupportedPlatform = "unsupported_platform", UnsupportedPlatform;
    FuseUnavailable = "fuse_unavailable", FuseUnavailable;
    FreezerUnavailable = "freezer_unavailable", FreezerUnavailable;
    PolicyUnenforceable = "policy_unenforceable", PolicyUnenforceable;
    MountPointConflict = "mount_point_conflict", MountPointConflict;
    AlreadyMounted = "already_mounted", AlreadyMounted;
    Busy = "busy", Busy;
    SandboxLive = "sandbox_live", SandboxLive;
    Exists = "exists", Exists;
    ApplyConflict = "apply_conflict", ApplyConflict;
    UnappliedChanges = "unapplied_changes", UnappliedChanges;
    BaseMissing = "base_missing", BaseMissing;
    EscapeAttempt = "escape_attempt", EscapeAttempt;
    CapacityExhausted = "capacity_exhausted", CapacityExhausted;
    MountFailed = "mount_failed", MountFailed;
    CommandFailed = "command_failed", CommandFailed;
    ServerFailed = "server_failed", ServerFailed;
    Io = "io", Io;
    Other = "other", Other;
    // Fine codes, each under its class.
    BadName = "bad_name", Usage;
    AmbiguousName = "ambiguous_name", Usage;
    NoProject = "no_project", NotFound;
    DbUnknownSchema = "db_unknown_schema", NotADatabase;
    NoHome = "no_home", ConfigInvalid;
    BadConfig = "bad_config", ConfigInvalid;
    BadEnv = "bad_env", ConfigInvalid;
    BadBind = "bad_bind", ConfigInvalid;
    BindMissing = "bind_missing", ConfigInvalid;
    PolicyNotAbsolute = "policy_not_absolute", PolicyInvalid;
    PolicyDotdot = "policy_dotdot", PolicyInvalid;
    PolicyOutsideRoots = "policy_outside_roots", PolicyInvalid;
    PolicySymlinkEscape = "policy_symlink_escape", PolicyInvalid;
    PolicyUnresolvable = "policy_unresolvable", PolicyInvalid;
    PolicyEmpty = "policy_empty", PolicyInvalid;
    PolicyContradiction = "policy_contradiction", PolicyInvalid;
    UsernsDisabled = "userns_disabled", UnsupportedPlatform;
    UsernsApparmor = "userns_apparmor", UnsupportedPlatform;
    UsernsDenied = "userns_denied", UnsupportedPlatform;
    DbBusy = "db_busy", Busy;
    NameTaken = "name_taken", Exists;
    SourceMissing = "source_missing", BaseMissing;
    BindFailed = "bind_failed", MountFailed;
    DeltaCreate = "delta_create", Io;
    DeltaUnusable = "delta_unusable", DbCorrupt;
    ConfigUnreadable = "config_unreadable", ConfigInvalid;
    NoSource = "no_source", BaseMissing;
    SourceMismatch = "source_mismatch", ConfigInvalid;
    ProjectExists = "project_exists", Exists;
    MountInsideSource = "mount_inside_source", MountPointConflict;
    UnknownRef = "unknown_ref", NotFound;
    NothingToUndo = "nothing_to_undo", NotFound;
    Pruned = "pruned", NotFound;
    AmbiguousRef = "ambiguous_ref", Usage;
    BadTag = "bad_tag", Usage;
    TagExists = "tag_exists", Exists;
    BadIgnorePattern = "bad_ignore_pattern", ConfigInvalid;
    BadKnob = "bad_knob", ConfigInvalid;
    CheckpointUnavailable = "checkpoint_unavailable", Io;
    CheckpointFailed = "checkpoint_failed", ServerFailed;
    CorruptObject = "corrupt_object", DbCorrupt;
    MissingObject = "missing_object", DbCorrupt;
    BadObject = "bad_object", DbCorrupt;
    BadLink = "bad_link", DbCorrupt;
    MissingLink = "missing_link", DbCorrupt;
    BadReplicaUrl = "bad_replica_url", Usage;
    ReplicateReadonly = "replicate_readonly", Usage;
    NoDatabase = "no_database", NotFound;
    NotAProject = "not_a_project", NotFound;
    ReplicaEmpty = "replica_empty", NotFound;
    LitestreamMissing = "litestream_missing", UnsupportedPlatform;
    LitestreamVersion = "litestream_version", UnsupportedPlatform;
    Replicating = "replicating", Busy;
    RestoreTargetExists = "restore_target_exists", Exists;
    RestoreDamaged = "restore_damaged", DbCorrupt;
    BadMountOption = "bad_mount_option", Usage;
    LitestreamFailed = "litestream_failed", CommandFailed;
    ReplicaBehind = "replica_behind", Io;
    ReplicateMismatch = "replicate_mismatch", SandboxLive;
    UpperFailed = "upper_failed", ServerFailed;
    NoMountBackend = "no_mount_backend", UnsupportedPlatform;
    BackendMismatch = "backend_mismatch", ConfigInvalid;
}

impl Code {
    /// The exit status of a command that fails with this code (a sandbox launch that refuses
    /// exits 125 instead, whatever the code): 2 the input is wrong, 3 this system cannot do
    /// it, 4 it conflicts with the present state, 1 it failed.
    pub fn exit_status(self) -> i32 {
        match self.class() {
            Code::Usage
            | Code::NotFound
            | Code::NotADatabase
            | Code::DbOldSchema
            | Code::ConfigInvalid
            | Code::PolicyInvalid => 2,
            Code::UnsupportedPlatform
            | Code::FuseUnavailable
            | Code::FreezerUnavailable
            | Code::PolicyUnenforceable => 3,
            Code::MountPointConflict
            | Code::AlreadyMounted
            | Code::Busy
            | Code::SandboxLive
            | Code::Exists
            | Code::ApplyConflict
            | Code::UnappliedChanges => 4,
            _ => 1,
        }
    }

    /// The code called `name`.
    pub fn named(name: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == name)
    }

    /// The code of an OS error: the kinds a harness can act on, else `io`.
    pub fn of_io(e: &std::io::Error) -> Code {
        e.raw_os_error().map_or(Code::Io, Code::of_errno)
    }

    /// The code of an errno value.
    pub fn of_errno(errno: i32) -> Code {
        match errno {
            libc::ENOENT => Code::NotFound,
            libc::ENOSPC | libc::EDQUOT => Code::CapacityExhausted,
            libc::EBUSY => Code::Busy,
            _ => Code::Io,
        }
    }

    /// The code of an SQLite error.
    pub fn of_sqlite(e: &rusqlite::Error) -> Code {
        use rusqlite::ErrorCode as C;
        match e.sqlite_error_code() {
            Some(C::NotADatabase) => Code::NotADatabase,
            Some(C::DatabaseCorrupt) => Code::DbCorrupt,
            Some(C::DiskFull) => Code::CapacityExhausted,
            Some(C::DatabaseBusy | C::DatabaseLocked) => Code::DbBusy,
            Some(C::CannotOpen) => Code::NotFound,
            _ => Code::Io,
        }
    }
}

/// Whether failures and warnings are printed as JSON objects (`--json` on the command line)
/// rather than `agentfs: CODE: MESSAGE` lines.
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Print failures and warnings as JSON objects from now on (or as lines again).
pub fn set_json(on: bool) {
    JSON.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether failures and warnings are printed as JSON objects.
pub fn json() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// The body of an error or warning object: `{"code", "detail", "message", "path"}`, the code
/// being `code`'s class and the detail `code` itself when it is finer (docs/harness.md).
pub fn object(code: Code, message: &str, path: Option<&std::path::Path>) -> serde_json::Value {
    let class = code.class();
    let path = path.map(|p| crate::delta::escaped(p.as_os_str().as_encoded_bytes()));
    serde_json::json!({
        "code": class.as_str(),
        "detail": (class != code).then(|| code.as_str()),
        "message": message,
        "path": path,
    })
}

/// The line a failure (`kind` "error") or a warning ("warning") is printed as: with `--json`
/// the object `{KIND: {"code", "detail", "message", "path"}}`, else `agentfs: CODE: MESSAGE`
/// (`agentfs: MESSAGE` for code `other`).
pub fn line(kind: &str, code: Code, message: &str, path: Option<&std::path::Path>) -> String {
    if json() {
        serde_json::json!({ kind: object(code, message, path) }).to_string()
    } else if code == Code::Other {
        format!("agentfs: {message}")
    } else {
        format!("agentfs: {code}: {message}")
    }
}

/// Say on standard error that something went wrong without failing the command: one line,
/// a JSON warning object under `--json`.
pub fn warn(code: Code, message: &str, path: Option<&std::path::Path>) {
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "{}",
        line("warning", code, message, path)
    );
}

/// The code a message carried as `CODE: MESSAGE` starts with (how code that passes strings
/// keeps a failure's code), and the rest; `None` when it names no code.
pub fn split(message: &str) -> Option<(Code, &str)> {
    let (name, rest) = message.split_once(": ")?;
    Some((Code::named(name)?, rest))
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Code;

    #[test]
    fn names_are_unique_and_classes_are_classes() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()), "{c} twice");
            assert_eq!(
                c.class().class(),
                c.class(),
                "{c}: its class is not a class"
            );
        }
    }

    #[test]
    fn every_code_is_documented() {
        let doc = include_str!("../docs/harness.md");
        for c in Code::ALL {
            assert!(
                doc.contains(&format!("`{c}`")),
                "docs/harness.md lacks `{c}`"
            );
        }
    }
}
