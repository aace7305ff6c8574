//! The changes as a patch, byte for byte what `git diff --full-index` (with [`Binary::Patch`]:
//! `--binary`) prints for the same change in a repository of the base: text files as git's
//! hunks ([`super::hunks`]), binary files (a NUL in the first 8000 bytes of either side)
//! mentioned or as `GIT binary patch` hunks in both directions, each git's choice of
//! `literal` or `delta` ([`super::gitdelta`]), symlinks as mode 120000 with the target as
//! content, a change of type as a deletion then a creation. A patch carries what git tracks:
//! content, symlinks and the executable bit. Directories (so empty ones), other permission
//! bits and special files are not representable; `agentfs apply` handles the first two.

use std::io::Write;

use sha1::{Digest, Sha1};

use super::{Change, Entry, Kind, Overlay, Side};

/// git's object id of the null blob side.
const NULL_OID: &str = "0000000000000000000000000000000000000000";

/// How many leading bytes git inspects for a NUL to call a file binary.
const BINARY_PROBE: usize = 8000;

/// git's blob id (sha1 of "blob <len>\0" + data) as hex.
pub fn git_blob_id(data: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The mode git records: 120000 for symlinks, 100755 when the owner may execute, else 100644.
fn git_mode(side: &Side) -> &'static str {
    match side.kind {
        Kind::Symlink => "120000",
        _ if side.mode & 0o100 != 0 => "100755",
        _ => "100644",
    }
}

/// Whether git treats `data` as binary: a NUL in the first 8000 bytes.
fn is_binary(data: &[u8]) -> bool {
    data[..data.len().min(BINARY_PROBE)].contains(&0)
}

/// `prefix` + path as git writes it: in double quotes with C escapes when the path has control
/// characters, quotes, backslashes or non-ASCII bytes.
fn quote(prefix: &str, path: &[u8]) -> Vec<u8> {
    let needs = path
        .iter()
        .any(|&b| !(0x20..0x7f).contains(&b) || b == b'"' || b == b'\\');
    let mut out = Vec::new();
    if !needs {
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(path);
        return out;
    }
    out.push(b'"');
    out.extend_from_slice(prefix.as_bytes());
    for &b in path {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0x07 => out.extend_from_slice(b"\\a"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0b => out.extend_from_slice(b"\\v"),
            0x0c => out.extend_from_slice(b"\\f"),
            b if !(0x20..0x7f).contains(&b) => {
                out.extend_from_slice(format!("\\{b:03o}").as_bytes())
            }
            b => out.push(b),
        }
    }
    out.push(b'"');
    out
}

/// git's base85 alphabet.
const EN85: &[u8; 85] =
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// Encode `data` as git does: each 4 bytes (the last group zero-padded) as 5 digits.
fn encode85(data: &[u8], out: &mut Vec<u8>) {
    for group in data.chunks(4) {
        let mut acc: u32 = 0;
        for (i, b) in group.iter().enumerate() {
            acc |= u32::from(*b) << (24 - 8 * i);
        }
        let mut digits = [0u8; 5];
        for d in digits.iter_mut().rev() {
            *d = EN85[(acc % 85) as usize];
            acc /= 85;
        }
        out.extend_from_slice(&digits);
    }
}

/// git's zlib level for patches (`core.compression` unset: best speed).
const ZLIB_LEVEL: u32 = 1;

/// `data` as one zlib stream, compressed in a single call as git does.
fn deflate(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut z = flate2::Compress::new(flate2::Compression::new(ZLIB_LEVEL), true);
    let mut out = Vec::with_capacity(data.len() + data.len() / 8 + 64);
    loop {
        let consumed = usize::try_from(z.total_in()).unwrap_or(usize::MAX);
        let status = z
            .compress_vec(
                data.get(consumed..).unwrap_or_default(),
                &mut out,
                flate2::FlushCompress::Finish,
            )
            .map_err(std::io::Error::other)?;
        if status == flate2::Status::StreamEnd {
            return Ok(out);
        }
        out.reserve(out.capacity().max(64));
    }
}

/// One direction of a binary patch, `from` to `to`: git's `delta` when both sides have
/// content and the deflated delta is smaller than the deflated content, else `literal`.
fn binary_hunk(from: &[u8], to: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    let literal = deflate(to)?;
    let delta = match super::gitdelta::delta(from, to, literal.len()) {
        Some(d) => Some((d.len(), deflate(&d)?)),
        None => None,
    };
    let packed = match delta {
        Some((raw, packed)) if packed.len() < literal.len() => {
            writeln!(out, "delta {raw}")?;
            packed
        }
        _ => {
            writeln!(out, "literal {}", to.len())?;
            literal
        }
    };
    for line in packed.chunks(52) {
        let n = line.len() as u8;
        out.push(if n <= 26 { b'A' + n - 1 } else { b'a' + n - 27 });
        encode85(line, out);
        out.push(b'\n');
    }
    out.push(b'\n');
    Ok(())
}

/// How binary files appear in a patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// "Binary files a/x and b/x differ", as `git diff`.
    Mention,
    /// Both directions as `GIT binary patch` hunks, as `git diff --binary`.
    Patch,
}

/// One file's section (empty when git cannot tell the two sides apart: a permission change
/// other than the executable bit).
fn section(
    path: &[u8],
    old: Option<(&Side, &[u8])>,
    new: Option<(&Side, &[u8])>,
    binary: Binary,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    let rel = super::rel(path);
    let a = quote("a/", rel);
    let b = quote("b/", rel);
    let same_content = match (old, new) {
        (Some((_, o)), Some((_, n))) => o == n,
        _ => false,
    };
    let mode_change = match (old, new) {
        (Some((o, _)), Some((n, _))) => git_mode(o) != git_mode(n),
        _ => false,
    };
    if old.is_some() && new.is_some() && same_content && !mode_change {
        return Ok(());
    }
    let mut head = b"diff --git ".to_vec();
    head.extend_from_slice(&a);
    head.push(b' ');
    head.extend_from_slice(&b);
    head.push(b'\n');
    out.extend_from_slice(&head);
    match (old, new) {
        (None, Some((n, _))) => writeln!(out, "new file mode {}", git_mode(n))?,
        (Some((o, _)), None) => writeln!(out, "deleted file mode {}", git_mode(o))?,
        (Some((o, _)), Some((n, _))) if mode_change => {
            writeln!(out, "old mode {}", git_mode(o))?;
            writeln!(out, "new mode {}", git_mode(n))?;
        }
        _ => {}
    }
    if same_content {
        return Ok(());
    }
    let old_bytes = old.map_or(&[][..], |(_, d)| d);
    let new_bytes = new.map_or(&[][..], |(_, d)| d);
    let old_id = old.map_or_else(|| NULL_OID.to_string(), |_| git_blob_id(old_bytes));
    let new_id = new.map_or_else(|| NULL_OID.to_string(), |_| git_blob_id(new_bytes));
    write!(out, "index {old_id}..{new_id}")?;
    match (old, new) {
        (Some((o, _)), Some(_)) if !mode_change => writeln!(out, " {}", git_mode(o))?,
        _ => writeln!(out)?,
    }
    let old_label = old.map_or(&b"/dev/null"[..], |_| &a);
    let new_label = new.map_or(&b"/dev/null"[..], |_| &b);
    if is_binary(old_bytes) || is_binary(new_bytes) {
        match binary {
            Binary::Mention => {
                out.extend_from_slice(b"Binary files ");
                out.extend_from_slice(old_label);
                out.extend_from_slice(b" and ");
                out.extend_from_slice(new_label);
                out.extend_from_slice(b" differ\n");
            }
            Binary::Patch => {
                out.extend_from_slice(b"GIT binary patch\n");
                binary_hunk(old_bytes, new_bytes, out)?;
                binary_hunk(new_bytes, old_bytes, out)?;
            }
        }
        return Ok(());
    }
    if old_bytes.is_empty() && new_bytes.is_empty() {
        return Ok(());
    }
    for (sign, label) in [(&b"--- "[..], old_label), (b"+++ ", new_label)] {
        out.extend_from_slice(sign);
        out.extend_from_slice(label);
        if label.contains(&b' ') {
            out.push(b'\t');
        }
        out.push(b'\n');
    }
    super::hunks::unified(old_bytes, new_bytes, out);
    Ok(())
}

impl Overlay {
    /// The patch of `changes` (from [`Overlay::changes`]). Special files are refused.
    pub fn patch(
        &self,
        changes: &[Entry],
        binary: Binary,
        progress: &dyn crate::store::progress::Progress,
    ) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let io = |e: std::io::Error| format!("writing the patch: {e}");
        progress.start("diff", changes.len() as u64);
        for e in changes {
            progress.advance(1);
            if e.kind() == Kind::Special {
                return Err(format!(
                    "{} is a special file, which a patch cannot carry",
                    String::from_utf8_lossy(&e.path)
                ));
            }
            let side = |s: &Option<Side>| -> Result<Option<(Side, Vec<u8>)>, String> {
                match s {
                    Some(s) if s.kind != Kind::Dir => {
                        Ok(Some((s.clone(), self.content(&e.path, s)?)))
                    }
                    _ => Ok(None),
                }
            };
            let (old, new) = match e.change {
                Change::Added => (None, side(&e.new)?),
                Change::Deleted => (side(&e.old)?, None),
                Change::Modified => (side(&e.old)?, side(&e.new)?),
            };
            if old.is_none() && new.is_none() {
                continue; // a directory
            }
            section(
                &e.path,
                old.as_ref().map(|(s, d)| (s, d.as_slice())),
                new.as_ref().map(|(s, d)| (s, d.as_slice())),
                binary,
                &mut out,
            )
            .map_err(io)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_is_a_nul_in_the_first_8000_bytes() {
        assert!(!is_binary(b"dos\r\nlines\r\n"));
        assert!(!is_binary(b"old mac\rlines"));
        let mut late = vec![b'x'; BINARY_PROBE];
        late.push(0);
        assert!(!is_binary(&late));
        assert!(is_binary(b"nul\0"));
        assert!(!is_binary("caf\u{e9}\n".as_bytes()));
    }

    #[test]
    fn blob_ids_and_base85_match_git() {
        // `git hash-object /dev/null` and of "hello\n".
        assert_eq!(git_blob_id(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
        assert_eq!(
            git_blob_id(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        let mut out = Vec::new();
        encode85(&[0, 0, 0, 0], &mut out);
        assert_eq!(out, b"00000");
        out.clear();
        encode85(&[0xff, 0xff, 0xff, 0xff], &mut out);
        assert_eq!(out, b"|NsC0");
    }

    #[test]
    fn quoting_follows_git() {
        assert_eq!(quote("a/", b"x y"), b"a/x y");
        assert_eq!(quote("a/", b"t\"q"), b"\"a/t\\\"q\"");
        assert_eq!(quote("b/", "é".as_bytes()), b"\"b/\\303\\251\"");
    }
}
