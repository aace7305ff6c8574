//! `config.toml` (one per project) and `defaults.toml` (the user's defaults): typed, every
//! unknown key refused, every error one line naming the file, the line and the key.

use super::Code;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Error;
use crate::sandbox::request::{HomeMode, Net, PolicyMode};

/// How the home appears in the view (`[home] mode`, `--home`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HomeName {
    Full,
    FullRo,
    Empty,
}

impl From<HomeName> for HomeMode {
    fn from(h: HomeName) -> Self {
        match h {
            HomeName::Full => HomeMode::Full,
            HomeName::FullRo => HomeMode::FullRo,
            HomeName::Empty => HomeMode::Empty,
        }
    }
}

/// The network the command sees (`[sandbox] net`, `--net`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum NetName {
    Host,
    None,
}

impl From<NetName> for Net {
    fn from(n: NetName) -> Self {
        match n {
            NetName::Host => Net::Host,
            NetName::None => Net::None,
        }
    }
}

/// The filesystem policy mode (`[policy] mode`, `--policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    ReadOnly,
    WorkspaceWrite,
}

impl From<PolicyName> for PolicyMode {
    fn from(p: PolicyName) -> Self {
        match p {
            PolicyName::ReadOnly => PolicyMode::ReadOnly,
            PolicyName::WorkspaceWrite => PolicyMode::WorkspaceWrite,
        }
    }
}

/// Which symlinks the project takes (`[policy] symlinks`, `--symlinks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SymlinkName {
    /// Every symlink (the default: virtualenvs make absolute ones).
    Allow,
    /// Refuse (EPERM, logged) a symlink whose target resolves outside the project.
    RefuseEscaping,
}

/// What serves the project's view (`[project] backend`), chosen at its first launch and kept:
/// our FUSE server, or kernel overlayfs (docs/sandbox.md, Mount backends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Fuse,
    Overlayfs,
}

impl From<Backend> for crate::sandbox::request::MountBackend {
    fn from(b: Backend) -> Self {
        match b {
            Backend::Fuse => Self::Fuse,
            Backend::Overlayfs => Self::Overlayfs,
        }
    }
}

/// What `--mount-backend` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// The first of FUSE and overlayfs that mounts in a throwaway namespace.
    Auto,
    Fuse,
    Overlayfs,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectSection {
    /// The directory the project overlays (canonical); absent until attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
    /// Absent until the first launch chooses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// Glob patterns the history skips at snapshot time (absent: the defaults in
    /// docs/history.md); the sandbox still shows and writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HomeSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<HomeName>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    /// Extra masked paths (absolute, or `~/...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masks: Vec<String>,
    /// Read-write binds, `SRC[:DST]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binds: Vec<String>,
    /// Read-only binds, `SRC[:DST]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ro_binds: Vec<String>,
    /// `K=V` (set) or `K` (passed through from the caller's environment).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetName>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PolicyName>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable_roots: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlinks: Option<SymlinkName>,
}

/// The launch settings: `defaults.toml` is exactly this; a project's config.toml and the
/// command line supply the same keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub home: HomeSection,
    #[serde(default)]
    pub sandbox: SandboxSection,
    #[serde(default)]
    pub policy: PolicySection,
}

impl Settings {
    /// Lay `over` on top of these settings: its single values win, its lists are appended.
    pub fn merge(&mut self, over: Settings) {
        self.home.mode = over.home.mode.or(self.home.mode);
        self.sandbox.net = over.sandbox.net.or(self.sandbox.net);
        self.policy.mode = over.policy.mode.or(self.policy.mode);
        self.policy.symlinks = over.policy.symlinks.or(self.policy.symlinks);
        self.sandbox.masks.extend(over.sandbox.masks);
        self.sandbox.binds.extend(over.sandbox.binds);
        self.sandbox.ro_binds.extend(over.sandbox.ro_binds);
        self.sandbox.env.extend(over.sandbox.env);
        self.policy
            .writable_roots
            .extend(over.policy.writable_roots);
    }
}

/// `[replicate]` of a project's config.toml: every sandbox of the project (`run`, `quick`, an
/// `exec` that starts its own) replicates its databases to `url`; `--replicate` overrides it.
/// Not a launch setting of defaults.toml: two projects replicated to one URL would overwrite
/// each other's replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicateSection {
    pub url: String,
}

/// A project's config.toml.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectConfig {
    #[serde(default)]
    pub project: ProjectSection,
    #[serde(default)]
    pub home: HomeSection,
    #[serde(default)]
    pub sandbox: SandboxSection,
    #[serde(default)]
    pub policy: PolicySection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<ReplicateSection>,
}

impl ProjectConfig {
    /// The launch keys of this config.
    pub fn settings(&self) -> Settings {
        Settings {
            home: self.home.clone(),
            sandbox: self.sandbox.clone(),
            policy: self.policy.clone(),
        }
    }
}

/// Parse `text` (the content of `file`) as `T`; a failure names the file, the line and its
/// text (which holds the key).
pub fn parse<T: serde::de::DeserializeOwned>(file: &Path, text: &str) -> Result<T, Error> {
    toml::from_str(text).map_err(|e| {
        let message = e.message().trim().replace('\n', " ");
        let place = e.span().map(|span| {
            let start = span.start.min(text.len());
            let line_no = text[..start].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!(" line {line_no} (`{line}`)")
        });
        Error::new(
            Code::BadConfig,
            format!("{}{}: {message}", file.display(), place.unwrap_or_default()),
        )
    })
}

/// Read and parse `file`; an absent file gives the default.
pub fn load<T: serde::de::DeserializeOwned + Default>(file: &Path) -> Result<T, Error> {
    match std::fs::read_to_string(file) {
        Ok(text) => parse(file, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(Error::new(
            Code::ConfigUnreadable,
            format!("{}: {e}", file.display()),
        )),
    }
}

/// The text written to a new project's config.toml: the values, then the keys it may hold.
pub fn render(cfg: &ProjectConfig) -> Result<String, Error> {
    let body = toml::to_string(cfg).map_err(|e| Error::new(Code::ConfigInvalid, e.to_string()))?;
    Ok(format!(
        "# agentfs project configuration. Keys (all optional apart from [project] source):\n\
         # [project] source, backend = \"fuse\" | \"overlayfs\" (chosen at the first launch)\n\
         # [home] mode = \"full\" | \"full-ro\" | \"empty\"\n\
         # [sandbox] masks, binds, ro_binds (\"SRC[:DST]\"), env (\"K=V\" or \"K\"), net = \"host\" | \"none\"\n\
         # [policy] mode = \"read-only\" | \"workspace-write\", writable_roots,\n\
         #          symlinks = \"allow\" | \"refuse-escaping\"\n\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_config_round_trips() {
        let text = r#"
[project]
source = "/srv/api"
backend = "fuse"
[home]
mode = "full-ro"
[sandbox]
masks = ["~/.secret"]
binds = ["/var/cache/x:/cache"]
ro_binds = ["/opt/data"]
env = ["A=1", "TERM"]
net = "none"
[policy]
mode = "workspace-write"
writable_roots = ["/srv/api/src"]
"#;
        let cfg: ProjectConfig = parse(Path::new("config.toml"), text).unwrap();
        assert_eq!(cfg.project.source.as_deref(), Some(Path::new("/srv/api")));
        assert_eq!(cfg.home.mode, Some(HomeName::FullRo));
        assert_eq!(cfg.sandbox.net, Some(NetName::None));
        assert_eq!(cfg.policy.mode, Some(PolicyName::WorkspaceWrite));
        let again: ProjectConfig = parse(Path::new("x"), &render(&cfg).unwrap()).unwrap();
        assert_eq!(again, cfg);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_key() {
        let e = parse::<Settings>(Path::new("/d/defaults.toml"), "[home]\nmoed = \"full\"\n")
            .unwrap_err();
        assert_eq!(e.code, Code::BadConfig);
        let m = e.to_string();
        assert!(
            m.contains("/d/defaults.toml line 2 (`moed = \"full\"`)"),
            "{m}"
        );
        assert!(!m.contains('\n'), "{m}");
        let e = parse::<Settings>(Path::new("d"), "[home]\nmode = \"half\"\n").unwrap_err();
        assert!(e.to_string().contains("mode = \"half\""), "{e}");
        // defaults.toml has no [project] section.
        assert!(parse::<Settings>(Path::new("d"), "[project]\nsource = \"/x\"\n").is_err());
    }

    #[test]
    fn later_settings_win_and_lists_merge() {
        let mut a: Settings = parse(
            Path::new("a"),
            "[home]\nmode = \"full\"\n[sandbox]\nmasks = [\"/a\"]\n",
        )
        .unwrap();
        let b: Settings = parse(
            Path::new("b"),
            "[home]\nmode = \"empty\"\n[sandbox]\nmasks = [\"/b\"]\n",
        )
        .unwrap();
        a.merge(b);
        a.merge(Settings::default());
        assert_eq!(a.home.mode, Some(HomeName::Empty));
        assert_eq!(a.sandbox.masks, vec!["/a", "/b"]);
    }
}
