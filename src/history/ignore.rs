//! Ignore patterns: names a snapshot leaves out (build outputs and caches). A pattern is one
//! path component with `*` (any run of bytes) and `?` (one byte); it matches an entry by its
//! name at any depth, and everything beneath a matching directory is left out with it.

/// The patterns used when a project's config.toml names none.
pub const DEFAULT_IGNORE: &[&str] = &[
    "target",
    "node_modules",
    "dist",
    "build",
    "__pycache__",
    ".venv",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
    ".gradle",
    ".next",
    ".cache",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignore {
    patterns: Vec<Vec<u8>>,
}

impl Default for Ignore {
    fn default() -> Self {
        Ignore {
            patterns: DEFAULT_IGNORE
                .iter()
                .map(|p| p.as_bytes().to_vec())
                .collect(),
        }
    }
}

impl Ignore {
    /// Nothing is ignored.
    pub fn none() -> Ignore {
        Ignore {
            patterns: Vec::new(),
        }
    }

    /// Patterns from a configuration; each must be a non-empty single component.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Ignore, String> {
        let mut out = Vec::new();
        for p in patterns {
            let p = p.as_ref();
            if p.is_empty() || p.contains('/') || p == "." || p == ".." {
                return Err(format!(
                    "bad_ignore_pattern: {p:?} (a pattern is one name, with * and ?, no /)"
                ));
            }
            out.push(p.as_bytes().to_vec());
        }
        Ok(Ignore { patterns: out })
    }

    /// A configuration's `ignore` array, or the defaults when it names none.
    pub fn configured(patterns: Option<&[String]>) -> Result<Ignore, String> {
        patterns.map_or_else(|| Ok(Ignore::default()), Ignore::new)
    }

    /// Whether an entry named `name` is left out.
    pub fn name(&self, name: &[u8]) -> bool {
        self.patterns.iter().any(|p| glob(p, name))
    }

    /// Whether absolute `path` is at or beneath a left-out name.
    pub fn path(&self, path: &[u8]) -> bool {
        path.split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .any(|c| self.name(c))
    }
}

/// `*` matches any run of bytes, `?` one byte, everything else itself.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, si));
                pi += 1;
            }
            Some(c) if *c == b'?' || *c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    pi = sp + 1;
                    si = ss + 1;
                    star = Some((sp, ss + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_paths() {
        assert!(glob(b"target", b"target"));
        assert!(!glob(b"target", b"targets"));
        assert!(glob(b"*.log", b"a.log"));
        assert!(!glob(b"*.log", b"a.logx"));
        assert!(glob(b"a?c*", b"abcdef"));
        assert!(glob(b"*", b""));
        let i = Ignore::default();
        assert!(i.path(b"/src/node_modules/x/y"));
        assert!(!i.path(b"/src/main.rs"));
        assert!(!i.path(b"/"));
        assert!(Ignore::new(&["a/b"]).is_err());
        assert!(Ignore::new(&[""]).is_err());
    }
}
