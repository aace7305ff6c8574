//! The mount(8) helper, so `mount -t fuse.agentfs DB MNT -o OPTS` and an /etc/fstab line
//! (`DB MNT fuse.agentfs OPTS 0 0`) mount a database. mount(8) runs
//! `/sbin/mount.fuse.agentfs DB MNT [-sfnv] [-o OPTS]`; `agentfs install-mount-helper` puts a
//! symlink of that name to this executable there, and the executable run under that name is
//! the helper: it translates the options and runs `agentfs mount`, which checks, starts the
//! server in the background and returns once the mount is live.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{CliError, Code};

/// The name mount(8) looks for (`mount.<type>` for type `fuse.agentfs`).
pub const NAME: &str = "mount.fuse.agentfs";

#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    /// Install into PREFIX/sbin (mount(8) looks in /sbin: the default prefix is /).
    #[arg(long, default_value = "/")]
    pub prefix: PathBuf,
}

/// `agentfs install-mount-helper`: PREFIX/sbin/mount.fuse.agentfs, a symlink to this
/// executable (an older link of that name is replaced, anything else is refused).
pub fn install(a: InstallArgs) -> super::CliResult {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(Code::Io, format!("cannot find own executable: {e}")))?;
    let dir = a.prefix.join("sbin");
    let link = dir.join(NAME);
    let io =
        |e: std::io::Error| CliError::new(Code::Io, format!("{}: {e}", link.display())).at(&link);
    std::fs::create_dir_all(&dir).map_err(io)?;
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link).map_err(io)?,
        Ok(_) => {
            return Err(CliError::new(
                Code::Exists,
                format!(
                    "{} exists and is not a symlink: remove it first",
                    link.display()
                ),
            )
            .at(&link))
        }
        Err(_) => {}
    }
    std::os::unix::fs::symlink(&exe, &link).map_err(io)?;
    super::say(format_args!("{} -> {}", link.display(), exe.display()));
    Ok(0)
}

/// What the helper's options become.
#[derive(Debug, Default, PartialEq, Eq)]
struct Translated {
    /// Options for `agentfs mount -o`.
    mount: Vec<String>,
    /// `transport=`: Some(true) for the ring, Some(false) for /dev/fuse (AGENTFS_FUSE_URING).
    uring: Option<bool>,
}

/// Options mount(8) itself acts on, or that every agentfs mount already has (nosuid, nodev):
/// accepted and not passed on.
fn ignored(o: &str) -> bool {
    matches!(
        o,
        "defaults"
            | "auto"
            | "noauto"
            | "nofail"
            | "_netdev"
            | "user"
            | "users"
            | "nouser"
            | "owner"
            | "nosuid"
            | "nodev"
    ) || o.starts_with("x-")
        || o.starts_with("comment=")
}

/// The helper's `-o` list as `agentfs mount` options; an unknown one is refused
/// (`bad_mount_option`) unless `sloppy` (mount -s), which drops it.
fn translate(opts: &str, sloppy: bool) -> Result<Translated, CliError> {
    let mut t = Translated::default();
    for o in opts.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        match o {
            "ro" | "rw" | "allow_other" | "noallow_other" | "nonempty" | "default_permissions" => {
                t.mount.push(o.to_string())
            }
            "transport=uring" => t.uring = Some(true),
            "transport=devfuse" => t.uring = Some(false),
            o if ignored(o) => {}
            _ if sloppy => {}
            other => {
                return Err(CliError::new(
                    Code::BadMountOption,
                    format!("mount option {other} is not one agentfs knows: ro, rw, allow_other, noallow_other, nonempty, default_permissions, transport=uring|devfuse (mount's own: defaults, noauto, nofail, _netdev, x-*)"),
                ))
            }
        }
    }
    Ok(t)
}

/// mount(8)'s command line: the source, the mount point, `-o OPTS`, and flags.
struct Call {
    db: PathBuf,
    mnt: PathBuf,
    opts: String,
    sloppy: bool,
    fake: bool,
}

fn parse(args: &[OsString]) -> Result<Call, CliError> {
    let usage = |why: String| {
        CliError::new(
            Code::Usage,
            format!("{why}; usage: {NAME} DB MOUNTPOINT [-sfnv] [-o OPTIONS]"),
        )
    };
    let mut positional = Vec::new();
    let mut opts = Vec::new();
    let (mut sloppy, mut fake) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" | "-t" | "-N" => {
                let v = it
                    .next()
                    .ok_or_else(|| usage(format!("{s} needs a value")))?;
                if s == "-o" {
                    opts.push(v.to_string_lossy().into_owned());
                }
            }
            f if f.starts_with("-o") => opts.push(f[2..].to_string()),
            f if f.starts_with('-') && f.len() > 1 => {
                for c in f[1..].chars() {
                    match c {
                        's' => sloppy = true,
                        'f' => fake = true,
                        'n' | 'v' => {}
                        other => return Err(usage(format!("unknown flag -{other}"))),
                    }
                }
            }
            _ => positional.push(PathBuf::from(a)),
        }
    }
    let [db, mnt]: [PathBuf; 2] = positional.try_into().map_err(|p: Vec<PathBuf>| {
        usage(format!("{} arguments where DB and MOUNTPOINT go", p.len()))
    })?;
    Ok(Call {
        db,
        mnt,
        opts: opts.join(","),
        sloppy,
        fake,
    })
}

/// The executable run as `mount.fuse.agentfs` with `args` (argv without argv[0]).
pub fn main(args: &[OsString]) -> i32 {
    match helper(args) {
        Ok(code) => code,
        Err(e) => super::error::report(&e),
    }
}

fn helper(args: &[OsString]) -> super::CliResult {
    let call = parse(args)?;
    let t = translate(&call.opts, call.sloppy)?;
    if call.fake {
        return Ok(0);
    }
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(Code::Io, format!("cannot find own executable: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg(db_arg(&call.db)).arg(&call.mnt);
    if !t.mount.is_empty() {
        cmd.arg("-o").arg(t.mount.join(","));
    }
    if let Some(u) = t.uring {
        cmd.env("AGENTFS_FUSE_URING", if u { "1" } else { "0" });
    }
    let status = cmd
        .status()
        .map_err(|e| CliError::new(Code::Io, format!("cannot run agentfs mount: {e}")))?;
    Ok(status.code().unwrap_or(1))
}

/// mount(8) passes the source as written: a bare file name stays a database path (not a
/// project name) by becoming `./NAME`.
fn db_arg(db: &Path) -> PathBuf {
    if db.components().count() == 1 && db.is_relative() && db.exists() {
        Path::new(".").join(db)
    } else {
        db.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_translate_and_unknown_ones_are_refused() {
        let t = translate(
            "rw,defaults,noauto,x-systemd.automount,nodev,allow_other,transport=devfuse",
            false,
        )
        .unwrap();
        assert_eq!(t.mount, vec!["rw", "allow_other"]);
        assert_eq!(t.uring, Some(false));
        let e = translate("ro,bogus", false).unwrap_err();
        assert_eq!(e.code, Code::BadMountOption);
        assert_eq!(translate("ro,bogus", true).unwrap().mount, vec!["ro"]);
    }

    #[test]
    fn mounts_command_line() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let c = parse(&os(&[
            "a.db",
            "/mnt",
            "-n",
            "-o",
            "ro",
            "-t",
            "fuse.agentfs",
        ]))
        .unwrap();
        assert_eq!(
            (c.db, c.mnt, c.opts),
            ("a.db".into(), "/mnt".into(), "ro".to_string())
        );
        assert!(parse(&os(&["a.db"])).is_err());
        assert!(parse(&os(&["-sfv", "a", "b"])).is_ok_and(|c| c.sloppy && c.fake));
    }
}
