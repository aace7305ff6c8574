//! A command's failure: a code from the closed set (src/errors.rs), one line of message and
//! the path it concerns. Printed once, by [`report`]: `agentfs: CODE: MESSAGE` on stderr, or
//! with `--json` one object `{"error":{"code","detail","message","path"}}`.

use std::path::{Path, PathBuf};

pub(crate) use crate::errors::set_json;
pub use crate::errors::Code;

/// A failed command.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub code: Code,
    pub message: String,
    pub path: Option<PathBuf>,
    /// The exit status when it is not the code's (a refused sandbox launch exits 125).
    pub exit: Option<i32>,
}

impl CliError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
            path: None,
            exit: None,
        }
    }

    pub fn at(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_path_buf());
        self
    }

    pub fn exit_with(mut self, status: i32) -> Self {
        self.exit = Some(status);
        self
    }

    pub fn status(&self) -> i32 {
        self.exit.unwrap_or_else(|| self.code.exit_status())
    }

    /// The JSON error object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"error": crate::errors::object(self.code, &self.message, self.path.as_deref())})
    }
}

/// Print `e` the way the command line asked and return its exit status.
pub fn report(e: &CliError) -> i32 {
    use std::io::Write as _;
    let line = crate::errors::line("error", e.code, &e.message, e.path.as_deref());
    let _ = writeln!(std::io::stderr(), "{line}");
    e.status()
}

/// A failure known only by its message: `CODE: MESSAGE` when the message starts with a code's
/// name (as errors carried through code that passes strings are written), else code `other`.
impl From<String> for CliError {
    fn from(message: String) -> Self {
        match crate::errors::split(&message) {
            Some((code, rest)) => CliError::new(code, rest),
            None => CliError::new(Code::Other, message),
        }
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        CliError::from(message.to_string())
    }
}

/// A knob with a value that does not parse or lies outside its range, on any verb.
impl From<crate::knobs::KnobError> for CliError {
    fn from(e: crate::knobs::KnobError) -> Self {
        CliError::new(Code::BadKnob, e.to_string())
    }
}

impl From<crate::project::Error> for CliError {
    fn from(e: crate::project::Error) -> Self {
        CliError::new(e.code, e.message)
    }
}

impl From<crate::sandbox::SandboxError> for CliError {
    fn from(e: crate::sandbox::SandboxError) -> Self {
        let path = match &e {
            crate::sandbox::SandboxError::SourceMissing(p) => Some(p.clone()),
            _ => None,
        };
        CliError {
            code: e.kind(),
            message: e.to_string(),
            path,
            exit: None,
        }
    }
}

impl From<crate::store::StoreError> for CliError {
    fn from(e: crate::store::StoreError) -> Self {
        CliError::new(e.code(), e.to_string()).at(e.path())
    }
}

impl From<crate::delta::journal::JournalError> for CliError {
    fn from(e: crate::delta::journal::JournalError) -> Self {
        use crate::delta::journal::JournalError as J;
        match &e {
            J::Running { db, .. } => CliError::new(Code::Busy, e.to_string()).at(db),
            J::Io { path, source } => CliError::new(Code::of_io(source), e.to_string()).at(path),
            J::Unreadable { path, .. } => CliError::new(Code::Io, e.to_string()).at(path),
            J::Delta(m) => CliError::from(m.clone()),
        }
    }
}

impl From<crate::sys::lock::LockError> for CliError {
    fn from(e: crate::sys::lock::LockError) -> Self {
        CliError::new(e.code(), e.to_string()).at(e.path())
    }
}

impl From<crate::sys::mount::MountError> for CliError {
    fn from(e: crate::sys::mount::MountError) -> Self {
        use crate::sys::mount::MountError as M;
        let (code, path) = match &e {
            M::NoDevFuse | M::DevFuseDenied | M::NoFusermount => (Code::FuseUnavailable, None),
            M::MissingMountPoint(p) => (Code::NotFound, Some(p)),
            M::NotADirectory(p) | M::AlreadyMounted(p) | M::NotEmpty(p) => {
                (Code::MountPointConflict, Some(p))
            }
            M::Os { source, .. } => (Code::of_io(source), None),
            M::Fusermount(_) => (Code::MountFailed, None),
        };
        let mut out = CliError::new(code, e.to_string());
        out.path = path.cloned();
        out
    }
}

impl From<crate::server::ServerError> for CliError {
    fn from(e: crate::server::ServerError) -> Self {
        use crate::server::ServerError as S;
        match e {
            S::Mount(e) => e.into(),
            S::Lock(e) => e.into(),
            S::Store(e) => e.into(),
            S::Handshake(m) => {
                CliError::new(Code::MountFailed, format!("FUSE handshake failed: {m}"))
            }
            S::Lost(m) => CliError::new(Code::ServerFailed, m),
            S::Other(m) => CliError::new(Code::Other, m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let e = CliError::new(Code::PolicyDotdot, "bad root").at("/a/b");
        assert_eq!(
            e.json(),
            serde_json::json!({"error": {"code": "policy_invalid", "detail": "policy_dotdot",
                "message": "bad root", "path": "/a/b"}})
        );
        assert_eq!(e.status(), 2);
        let e = CliError::from("sandbox_live: it runs".to_string());
        assert_eq!(
            (e.code, e.message.as_str(), e.status()),
            (Code::SandboxLive, "it runs", 4)
        );
        let e = CliError::from("plain: text".to_string());
        assert_eq!(e.message, "plain: text");
        assert_eq!(e.json()["error"]["path"], serde_json::Value::Null);
        assert_eq!(e.json()["error"]["detail"], serde_json::Value::Null);
        assert_eq!(e.status(), 1);
    }
}
