//! Checks made before anything is forked: each failure is a named error that says how to fix
//! it. What only the kernel can answer (a mount, a bind, a read-only flag) is checked by doing
//! it, before the command runs.

use std::path::Path;

use super::request::SandboxRequest;
use super::SandboxError;

/// Where the kernel shows its sysctls.
const SYSCTL_ROOT: &str = "/proc/sys";

/// A sysctl's value under `root` (`/proc/sys`, or a directory that stands in for it in tests).
fn sysctl(root: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(root.join(name))
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
        return Err(SandboxError::SourceMissing(req.source.clone()));
    }
    if !req.db.is_file() {
        return Err(SandboxError::DbCorrupt(format!(
            "{}: the project's delta database is missing; run `agentfs init` for the project again",
            req.db.display()
        )));
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| "/usr/local/bin/agentfs".into());
    check_userns(Path::new(SYSCTL_ROOT), crate::sys::ids::is_root(), &exe)?;
    if req.backend == super::request::MountBackend::Overlayfs {
        return Ok(());
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

/// Whether the sysctls under `sysctl_root` let this user create the sandbox's user namespace;
/// `exe` is the binary an AppArmor profile would name.
fn check_userns(sysctl_root: &Path, root: bool, exe: &Path) -> Result<(), SandboxError> {
    if sysctl(sysctl_root, "user/max_user_namespaces").as_deref() == Some("0") {
        return Err(SandboxError::UsernsDisabled);
    }
    if !root
        && sysctl(sysctl_root, "kernel/apparmor_restrict_unprivileged_userns").as_deref()
            == Some("1")
    {
        return Err(SandboxError::UsernsApparmor(format!(
            "AppArmor forbids unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1): save this profile as /etc/apparmor.d/agentfs and run `sudo apparmor_parser -r /etc/apparmor.d/agentfs`:\n{}",
            apparmor_profile(exe)
        )));
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
        ServerError::Lock(l) => SandboxError::DbBusy(format!(
            "the project is busy: {l}; join its live sandbox with `agentfs exec`, or wait until it ends"
        )),
        other => SandboxError::Server(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for /proc/sys holding the two sysctls the preflight reads.
    fn sysctls(max_userns: &str, apparmor: Option<&str>) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(d.path().join("user")).expect("mkdir");
        std::fs::create_dir_all(d.path().join("kernel")).expect("mkdir");
        std::fs::write(d.path().join("user/max_user_namespaces"), max_userns).expect("write");
        if let Some(v) = apparmor {
            std::fs::write(
                d.path()
                    .join("kernel/apparmor_restrict_unprivileged_userns"),
                v,
            )
            .expect("write");
        }
        d
    }

    const EXE: &str = "/opt/tools/bin/agentfs";

    #[test]
    fn apparmor_restriction_is_named_and_prints_the_profile_for_the_binary() {
        let d = sysctls("15000\n", Some("1\n"));
        let e = check_userns(d.path(), false, Path::new(EXE)).expect_err("refused");
        assert_eq!(e.code(), "userns_apparmor");
        let text = e.to_string();
        assert!(
            text.contains("kernel.apparmor_restrict_unprivileged_userns=1"),
            "{text}"
        );
        assert!(
            text.contains(&apparmor_profile(Path::new(EXE))),
            "the profile is printed: {text}"
        );
        assert!(text.contains(&format!("profile agentfs {EXE} ")), "{text}");
        assert!(text.contains("userns,"), "{text}");
        // Root is not subject to the restriction, and an unrestricted system passes.
        assert!(check_userns(d.path(), true, Path::new(EXE)).is_ok());
        let open = sysctls("15000\n", Some("0\n"));
        assert!(check_userns(open.path(), false, Path::new(EXE)).is_ok());
        let absent = sysctls("15000\n", None);
        assert!(check_userns(absent.path(), false, Path::new(EXE)).is_ok());
    }

    #[test]
    fn user_namespaces_switched_off_are_named_for_root_and_users() {
        let d = sysctls("0\n", None);
        for root in [false, true] {
            let e = check_userns(d.path(), root, Path::new(EXE)).expect_err("refused");
            assert_eq!(e.code(), "userns_disabled");
            assert!(e.to_string().contains("user.max_user_namespaces=0"), "{e}");
        }
    }
}
