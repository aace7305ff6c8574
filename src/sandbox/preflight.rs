//! Checks made before anything is forked: each failure is a named error that says how to fix
//! it. What only the kernel can answer (a mount, a bind, a read-only flag) is checked by doing
//! it, before the command runs.

use std::path::Path;

use super::request::SandboxRequest;
use super::SandboxError;

fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The AppArmor profile that lets `exe` create user namespaces on Ubuntu.
pub fn apparmor_profile(exe: &Path) -> String {
    format!(
        "abi <abi/4.0>,\ninclude <tunables/global>\nprofile agentfs {} flags=(unconfined) {{\n  userns,\n  include if exists <local/agentfs>\n}}\n",
        exe.display()
    )
}

/// Everything that can be known before launch.
pub fn check(req: &SandboxRequest) -> Result<(), SandboxError> {
    if !req.source.is_dir() {
        return Err(SandboxError::ProjectMissing(req.source.clone()));
    }
    if !req.db.is_file() {
        return Err(SandboxError::DbCorrupt(format!(
            "{}: the project's delta database is missing; run `agentfs init` for the project again",
            req.db.display()
        )));
    }
    if sysctl("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return Err(SandboxError::UsernsDisabled);
    }
    let root = crate::sys::ids::is_root();
    if !root
        && sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1")
    {
        let exe = std::env::current_exe().unwrap_or_else(|_| "/usr/local/bin/agentfs".into());
        return Err(SandboxError::UsernsApparmor(format!(
            "AppArmor forbids unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1): save this profile as /etc/apparmor.d/agentfs and run `sudo apparmor_parser -r /etc/apparmor.d/agentfs`:\n{}",
            apparmor_profile(&exe)
        )));
    }
    let fuse = Path::new("/dev/fuse");
    if !fuse.exists() {
        return Err(SandboxError::FuseUnavailable(
            "/dev/fuse is missing: load the module (modprobe fuse); in a container run with --device /dev/fuse --cap-add SYS_ADMIN".into(),
        ));
    }
    if nix::unistd::access(
        fuse,
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    )
    .is_err()
    {
        return Err(SandboxError::FuseUnavailable(
            "/dev/fuse is not readable and writable by you: `chmod 0666 /dev/fuse` (the distribution default); in a container run with --device /dev/fuse --cap-add SYS_ADMIN".into(),
        ));
    }
    Ok(())
}

/// The named error for a database the server could not open.
pub fn store_error(e: crate::server::ServerError) -> SandboxError {
    use crate::server::ServerError;
    use crate::store::StoreError;
    match e {
        ServerError::Store(s @ StoreError::OldSchema { .. }) => {
            SandboxError::DbOldSchema(s.to_string())
        }
        ServerError::Store(
            s @ (StoreError::Corrupt { .. }
            | StoreError::NotSqlite { .. }
            | StoreError::UnknownSchema { .. }),
        ) => SandboxError::DbCorrupt(s.to_string()),
        ServerError::Lock(l) => SandboxError::DbBusy(l.to_string()),
        other => SandboxError::Server(other.to_string()),
    }
}
