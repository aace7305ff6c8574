//! From a project, the merged settings (defaults.toml, config.toml, the command line) and a
//! command to the launch request: paths resolved, masks listed, binds checked, the policy
//! decided, the environment scrubbed, the shell's prompt marked.

use super::Code;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use super::config::{HomeName, Settings, SymlinkName};
use super::{Error, Project};
use crate::sandbox::policy::{self, AllowedRoot};
use crate::sandbox::request::{Bind, HomeMode, Net, SandboxRequest};

/// Paths under the home masked in every launch: credentials, tokens and histories.
pub const DEFAULT_MASKS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker/config.json",
    ".netrc",
    ".git-credentials",
    ".config/gh",
    ".npmrc",
    ".pypirc",
    ".bash_history",
    ".zsh_history",
    ".zhistory",
    ".sh_history",
    ".history",
    ".local/share/fish/fish_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".irb_history",
    ".rediscli_history",
    ".lesshst",
];

/// Variables the command inherits from the caller (plus every `LC_*`); all others are dropped.
const BASELINE_ENV: &[&str] = &[
    "HOME", "USER", "LOGNAME", "PATH", "SHELL", "TERM", "LANG", "TZ",
];

pub use crate::sandbox::request::SANDBOX_ENV;

/// `~` and `~/...` against `home`, then a relative path against the working directory.
pub fn expand(s: &str, home: &Path) -> PathBuf {
    let p = match s.strip_prefix('~') {
        Some("") => home.to_path_buf(),
        Some(rest) if rest.starts_with('/') => home.join(rest.trim_start_matches('/')),
        _ => PathBuf::from(s),
    };
    std::path::absolute(&p).unwrap_or(p)
}

/// One `SRC[:DST]` bind: the source must exist (it is canonicalised), the destination is the
/// source unless given and has no `..`.
pub fn parse_bind(spec: &str, writable: bool, home: &Path) -> Result<Bind, Error> {
    let (src, dst) = match spec.split_once(':') {
        Some((s, d)) => (s, Some(d)),
        None => (spec, None),
    };
    let flag = if writable { "--bind" } else { "--ro-bind" };
    let src_path = expand(src, home);
    let src = std::fs::canonicalize(&src_path).map_err(|e| {
        Error::new(
            Code::BindMissing,
            format!("{flag} {spec}: {}: {e}", src_path.display()),
        )
    })?;
    let dst = match dst {
        None => src.clone(),
        Some(d) => {
            let d = expand(d, home);
            if d.components().any(|c| c == Component::ParentDir) {
                return Err(Error::new(
                    Code::BadBind,
                    format!("{flag} {spec}: the destination may not contain `..`"),
                ));
            }
            d
        }
    };
    Ok(Bind { src, dst, writable })
}

/// The command's environment: the baseline taken from `caller`, then every `K=V` (set) or `K`
/// (passed through when the caller has it) in order, then `AGENTFS_SANDBOX=<project>`.
pub fn environment(
    project: &str,
    extra: &[String],
    caller: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Vec<(OsString, OsString)>, Error> {
    let caller: Vec<(OsString, OsString)> = caller.into_iter().collect();
    let lookup = |k: &str| {
        caller
            .iter()
            .find(|(ck, _)| ck == k)
            .map(|(_, v)| v.clone())
    };
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    let set = |env: &mut Vec<(OsString, OsString)>, k: OsString, v: OsString| match env
        .iter_mut()
        .find(|(ek, _)| *ek == k)
    {
        Some(slot) => slot.1 = v,
        None => env.push((k, v)),
    };
    for (k, v) in &caller {
        let name = k.to_string_lossy();
        if BASELINE_ENV.contains(&name.as_ref()) || name.starts_with("LC_") {
            set(&mut env, k.clone(), v.clone());
        }
    }
    if lookup("PATH").is_none() {
        set(
            &mut env,
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin".into(),
        );
    }
    for item in extra {
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k, Some(OsString::from(v))),
            None => (item.as_str(), lookup(item)),
        };
        if k.is_empty() || k == SANDBOX_ENV {
            return Err(Error::new(
                Code::BadEnv,
                format!("--env {item}: give K=V or the name K of a variable to pass through ({SANDBOX_ENV} is set by agentfs)"),
            ));
        }
        if let Some(v) = v {
            set(&mut env, k.into(), v);
        }
    }
    set(&mut env, SANDBOX_ENV.into(), project.into());
    Ok(env)
}

/// The command that starts `shell` interactively with its prompt prefixed `[project] `, and
/// variables it needs. bash and zsh get a generated rc (in the sandbox's private /tmp) that
/// sources the user's own first; other shells get `PS1`.
pub fn shell_command(project: &str, shell: &Path) -> (Vec<OsString>, Vec<(OsString, OsString)>) {
    let kind = shell.file_name().and_then(|n| n.to_str()).unwrap_or("");
    // The name is [A-Za-z0-9._-]*, safe inside double quotes.
    let script = match kind {
        "bash" => format!(
            "rc=$(mktemp \"${{TMPDIR:-/tmp}}/agentfs-rc.XXXXXX\") || exit 125\n\
             cat > \"$rc\" <<'RC_END'\n\
             if [ -f \"$HOME/.bashrc\" ]; then . \"$HOME/.bashrc\"; fi\n\
             PS1=\"[{project}] $PS1\"\n\
             RC_END\n\
             exec \"$0\" --rcfile \"$rc\" -i\n"
        ),
        "zsh" => format!(
            "d=$(mktemp -d \"${{TMPDIR:-/tmp}}/agentfs-rc.XXXXXX\") || exit 125\n\
             cat > \"$d/.zshrc\" <<'RC_END'\n\
             ZDOTDIR=\"$HOME\"\n\
             if [ -f \"$HOME/.zshrc\" ]; then . \"$HOME/.zshrc\"; fi\n\
             PROMPT=\"[{project}] $PROMPT\"\n\
             RC_END\n\
             ZDOTDIR=\"$d\" exec \"$0\" -i\n"
        ),
        _ => {
            let ps1 = format!("[{project}] $ ");
            return (
                vec![shell.into(), "-i".into()],
                vec![("PS1".into(), ps1.into())],
            );
        }
    };
    (
        vec![shell.into(), "-c".into(), script.into(), shell.into()],
        Vec::new(),
    )
}

/// The delta must open (not corrupt, not of an old schema) and overlay `source`: a config.toml
/// edited to point elsewhere would serve the delta over a tree it was not made from.
fn check_delta(db: &Path, source: &Path) -> Result<(), Error> {
    let unusable = |e: String| {
        Error::new(
            Code::DeltaUnusable,
            format!(
                "{}: {e} (agentfs integrity, agentfs fsck or agentfs migrate)",
                db.display()
            ),
        )
    };
    let store = crate::store::Store::open(db, true).map_err(|e| unusable(e.to_string()))?;
    let base = store
        .overlay_config()
        .map_err(unusable)?
        .map(|c| c.base_path);
    if base.as_deref() != Some(source) {
        return Err(Error::new(
            Code::SourceMismatch,
            format!(
                "{} overlays {}, but config.toml names {} as the source",
                db.display(),
                base.as_deref()
                    .unwrap_or(Path::new("no directory"))
                    .display(),
                source.display()
            ),
        ));
    }
    Ok(())
}

/// The launch request for `project` with the merged `settings`; an empty `command` runs the
/// user's shell. `root` is the projects root (masked in the view).
pub fn request(
    project: &Project,
    root: &Path,
    settings: Settings,
    command: Vec<OsString>,
) -> Result<SandboxRequest, Error> {
    let name = &project.name;
    let source = project.source().ok_or_else(|| {
        Error::new(
            Code::NoSource,
            format!("project {name} overlays no directory yet: agentfs mount {name} DIR"),
        )
    })?;
    if !source.is_dir() {
        return Err(Error::new(
            Code::SourceMissing,
            format!(
                "project {name}: its directory {} is missing",
                source.display()
            ),
        ));
    }
    let db = project.db();
    check_delta(&db, source)?;
    let home_dir = super::home()?;
    let home: HomeMode = settings.home.mode.unwrap_or(HomeName::Full).into();
    let sb = &settings.sandbox;

    let mut masks: Vec<PathBuf> = DEFAULT_MASKS.iter().map(|m| home_dir.join(m)).collect();
    masks.push(root.to_path_buf());
    masks.extend(sb.masks.iter().map(|m| expand(m, &home_dir)));

    let mut binds = Vec::new();
    for spec in &sb.binds {
        binds.push(parse_bind(spec, true, &home_dir)?);
    }
    for spec in &sb.ro_binds {
        binds.push(parse_bind(spec, false, &home_dir)?);
    }

    let mut allowed = vec![AllowedRoot::same(source.to_path_buf())];
    allowed.extend(binds.iter().filter(|b| b.writable).map(|b| AllowedRoot {
        view: b.dst.clone(),
        host: b.src.clone(),
    }));
    if home == HomeMode::Full {
        allowed.push(AllowedRoot::same(home_dir.clone()));
    }
    let policy = policy::decide(
        settings.policy.mode.map(Into::into),
        &settings.policy.writable_roots,
        &allowed,
    )?;

    let cwd = std::env::current_dir()
        .ok()
        .and_then(|c| std::fs::canonicalize(c).ok())
        .filter(|c| c.starts_with(source))
        .unwrap_or_else(|| source.to_path_buf());

    let mut env = environment(name, &sb.env, std::env::vars_os())?;
    let command = if command.is_empty() {
        let shell = env
            .iter()
            .find(|(k, _)| k == "SHELL")
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| PathBuf::from("/bin/sh"));
        let (cmd, extra) = shell_command(name, &shell);
        env.extend(extra);
        cmd
    } else {
        command
    };

    Ok(SandboxRequest {
        project: name.clone(),
        project_dir: project.dir.clone(),
        source: source.to_path_buf(),
        db,
        command,
        cwd,
        home_dir,
        home,
        masks,
        binds,
        policy,
        refuse_escaping_symlinks: settings.policy.symlinks == Some(SymlinkName::RefuseEscaping),
        net: sb.net.map(Net::from).unwrap_or(Net::Host),
        env,
        replicate: None,
        backend: Default::default(),
        backend_reason: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn the_environment_is_scrubbed_and_marked() {
        let caller = os(&[
            ("HOME", "/h"),
            ("PATH", "/bin"),
            ("LC_ALL", "C"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("EDITOR", "vi"),
        ]);
        let env = environment(
            "api",
            &[
                "EDITOR".into(),
                "X=1".into(),
                "PATH=/p".into(),
                "MISSING".into(),
            ],
            caller,
        )
        .unwrap();
        assert_eq!(
            env,
            os(&[
                ("HOME", "/h"),
                ("PATH", "/p"),
                ("LC_ALL", "C"),
                ("EDITOR", "vi"),
                ("X", "1"),
                ("AGENTFS_SANDBOX", "api"),
            ])
        );
        let e = environment("api", &["=v".into()], Vec::new()).unwrap_err();
        assert_eq!(e.code, Code::BadEnv);
        let e = environment("api", &["AGENTFS_SANDBOX=x".into()], Vec::new()).unwrap_err();
        assert_eq!(e.code, Code::BadEnv);
    }

    #[test]
    fn binds_and_paths() {
        let d = tempfile::tempdir().unwrap();
        let canon = std::fs::canonicalize(d.path()).unwrap();
        let spec = format!("{}:/cache", d.path().display());
        let b = parse_bind(&spec, true, Path::new("/h")).unwrap();
        assert_eq!(
            (b.src, b.dst, b.writable),
            (canon.clone(), PathBuf::from("/cache"), true)
        );
        let b = parse_bind(d.path().to_str().unwrap(), false, Path::new("/h")).unwrap();
        assert_eq!(b.dst, canon);
        let e = parse_bind("/no/such/dir", false, Path::new("/h")).unwrap_err();
        assert_eq!(e.code, Code::BindMissing);
        let e = parse_bind(
            &format!("{}:/a/../b", d.path().display()),
            true,
            Path::new("/h"),
        )
        .unwrap_err();
        assert_eq!(e.code, Code::BadBind);
        assert_eq!(expand("~/.ssh", Path::new("/h")), PathBuf::from("/h/.ssh"));
        assert_eq!(expand("~", Path::new("/h")), PathBuf::from("/h"));
    }

    /// The generated rc sources the user's own and prefixes the prompt (bash run for real).
    #[test]
    fn the_bash_prompt_is_prefixed_after_the_users_rc() {
        let bash = Path::new("/bin/bash");
        if !bash.exists() {
            eprintln!("SKIP: no /bin/bash");
            return;
        }
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join(".bashrc"),
            "PS1='mine$ '\nexport FROM_RC=1\n",
        )
        .unwrap();
        let (cmd, extra) = shell_command("api", bash);
        assert!(extra.is_empty());
        let mut child = std::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .env_clear()
            .env("HOME", home.path())
            .env("TMPDIR", home.path())
            .env("PATH", "/usr/bin:/bin")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"echo \"P=$PS1 R=$FROM_RC\"\nexit 3\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("P=[api] mine$  R=1"), "{text}");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn other_shells_get_ps1() {
        let (cmd, extra) = shell_command("api", Path::new("/bin/dash"));
        assert_eq!(cmd, vec![OsString::from("/bin/dash"), "-i".into()]);
        assert_eq!(extra, os(&[("PS1", "[api] $ ")]));
    }
}
