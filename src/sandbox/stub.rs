//! Stand-in for the launch until it is built: every launch fails with a named error.

use super::request::SandboxRequest;
use crate::knobs::Knobs;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("the sandbox launch is not part of this build")]
    NotBuilt,
}

impl SandboxError {
    /// A stable snake_case name for the failure.
    pub fn code(&self) -> &'static str {
        match self {
            SandboxError::NotBuilt => "not_built",
        }
    }
}

/// Run the request's command in a new sandbox of its project.
pub fn run(_req: &SandboxRequest, _knobs: &Knobs) -> Result<i32, SandboxError> {
    Err(SandboxError::NotBuilt)
}

/// Run the request's command in the project's live sandbox, or a new one.
pub fn exec(_req: &SandboxRequest, _knobs: &Knobs) -> Result<i32, SandboxError> {
    Err(SandboxError::NotBuilt)
}
