//! The objects of the history store and their canonical byte encodings (docs/history.md,
//! "Objects"). An object's key is the BLAKE3 hash of its encoding, so equal states encode and
//! hash equally: tree entries are sorted by name bytes, attributes by name, whiteouts by path.

/// An object key: BLAKE3 of the object's raw bytes.
pub type Hash = [u8; 32];

/// BLAKE3 of `raw`.
pub fn hash_of(raw: &[u8]) -> Hash {
    *blake3::hash(raw).as_bytes()
}

/// Lowercase hex of a hash (or of any key as stored, which may not be 32 bytes).
pub fn hex(h: &[u8]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// What an object row holds (the `kind` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjKind {
    /// A file's bytes.
    Blob = 1,
    Tree = 2,
    Commit = 3,
    /// The sorted whiteout paths of a state.
    Whiteouts = 4,
}

impl ObjKind {
    pub fn from_i64(k: i64) -> Option<ObjKind> {
        Some(match k {
            1 => ObjKind::Blob,
            2 => ObjKind::Tree,
            3 => ObjKind::Commit,
            4 => ObjKind::Whiteouts,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ObjKind::Blob => "blob",
            ObjKind::Tree => "tree",
            ObjKind::Commit => "commit",
            ObjKind::Whiteouts => "whiteouts",
        }
    }
}

const TREE_MAGIC: &[u8] = b"agentfs-tree 1\n";
const COMMIT_MAGIC: &[u8] = b"agentfs-commit 1\n";
const WHITEOUTS_MAGIC: &[u8] = b"agentfs-whiteouts 1\n";

/// What a tree entry points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A regular file: its blob and size.
    File { blob: Hash, size: u64 },
    /// A directory: its tree.
    Dir { tree: Hash },
    /// A symlink: its target bytes.
    Symlink { target: Vec<u8> },
    /// FIFO, socket or device (type in the mode, device in rdev).
    Special,
    /// Another name of the regular file recorded at `path` (absolute in the upper layer, the
    /// first of its names in byte order): a hard link.
    Link { path: Vec<u8> },
}

/// One named object of a directory (or, with an empty name, the root in a commit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    /// st_mode: type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    /// The base inode number a copy-up keeps (a directory with one merges with the base).
    pub origin: Option<u64>,
    /// Extended attributes (name, value), sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub target: Target,
}

impl Entry {
    /// The object this entry refers to (a blob or a tree).
    pub fn child(&self) -> Option<Hash> {
        match &self.target {
            Target::File { blob, .. } => Some(*blob),
            Target::Dir { tree } => Some(*tree),
            _ => None,
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self.target {
            Target::File { .. } => "file",
            Target::Dir { .. } => "dir",
            Target::Symlink { .. } => "symlink",
            Target::Special => "special",
            // A second name of a regular file is a file to whoever reads the diff.
            Target::Link { .. } => "file",
        }
    }

    /// Equal apart from what a directory contains.
    pub fn same_attrs(&self, o: &Entry) -> bool {
        let strip = |e: &Entry| match e.target {
            Target::Dir { .. } => Entry {
                target: Target::Dir { tree: [0; 32] },
                ..e.clone()
            },
            _ => e.clone(),
        };
        strip(self) == strip(o)
    }
}

/// How a commit came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitKind {
    Manual = 1,
    Exit = 2,
    Checkpoint = 3,
    Restore = 4,
}

impl CommitKind {
    pub fn name(self) -> &'static str {
        match self {
            CommitKind::Manual => "manual",
            CommitKind::Exit => "exit",
            CommitKind::Checkpoint => "checkpoint",
            CommitKind::Restore => "restore",
        }
    }

    fn from_u8(k: u8) -> Option<CommitKind> {
        Some(match k {
            1 => CommitKind::Manual,
            2 => CommitKind::Exit,
            3 => CommitKind::Checkpoint,
            4 => CommitKind::Restore,
            _ => return None,
        })
    }
}

/// A state of the upper layer: the root directory (its tree in `target`) and the whiteouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub root: Entry,
    pub whiteouts: Option<Hash>,
}

impl State {
    pub fn tree(&self) -> Hash {
        match self.root.target {
            Target::Dir { tree } => tree,
            _ => [0; 32],
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub state: State,
    pub parent: Option<Hash>,
    pub kind: CommitKind,
    /// Seconds and nanoseconds since the epoch.
    pub time_sec: i64,
    pub time_nsec: u32,
    pub message: String,
}

impl Commit {
    /// The objects this commit refers to.
    pub fn children(&self) -> Vec<Hash> {
        let mut v = vec![self.state.tree()];
        v.extend(self.state.whiteouts);
        v.extend(self.parent);
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding: integers little-endian, byte strings as u32 length + bytes.
// ---------------------------------------------------------------------------------------------

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn hash(&mut self, h: &Hash) {
        self.0.extend_from_slice(h);
    }
    fn opt_hash(&mut self, h: &Option<Hash>) {
        match h {
            Some(h) => {
                self.u8(1);
                self.hash(h);
            }
            None => self.u8(0),
        }
    }
}

struct Dec<'a> {
    b: &'a [u8],
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.b.len() < n {
            return Err("truncated object".into());
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn hash(&mut self) -> Result<Hash, String> {
        let mut h = [0; 32];
        h.copy_from_slice(self.take(32)?);
        Ok(h)
    }
    fn opt_hash(&mut self) -> Result<Option<Hash>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.hash()?)),
            t => Err(format!("bad presence byte {t}")),
        }
    }
    fn magic(&mut self, m: &[u8]) -> Result<(), String> {
        if self.take(m.len())? != m {
            return Err("not an object of the expected kind".into());
        }
        Ok(())
    }
    fn end(&self) -> Result<(), String> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err("trailing bytes in object".into())
        }
    }
}

fn enc_entry(e: &mut Enc, x: &Entry) {
    e.bytes(&x.name);
    e.u32(x.mode);
    e.u32(x.uid);
    e.u32(x.gid);
    e.u32(x.rdev);
    e.u64(x.mtime_sec as u64);
    e.u32(x.mtime_nsec);
    match x.origin {
        Some(o) => {
            e.u8(1);
            e.u64(o);
        }
        None => e.u8(0),
    }
    e.u32(x.xattrs.len() as u32);
    for (n, v) in &x.xattrs {
        e.bytes(n);
        e.bytes(v);
    }
    match &x.target {
        Target::File { blob, size } => {
            e.u8(1);
            e.hash(blob);
            e.u64(*size);
        }
        Target::Dir { tree } => {
            e.u8(2);
            e.hash(tree);
        }
        Target::Symlink { target } => {
            e.u8(3);
            e.bytes(target);
        }
        Target::Special => e.u8(4),
        Target::Link { path } => {
            e.u8(5);
            e.bytes(path);
        }
    }
}

fn dec_entry(d: &mut Dec<'_>) -> Result<Entry, String> {
    let name = d.bytes()?;
    let mode = d.u32()?;
    let uid = d.u32()?;
    let gid = d.u32()?;
    let rdev = d.u32()?;
    let mtime_sec = d.u64()? as i64;
    let mtime_nsec = d.u32()?;
    let origin = match d.u8()? {
        0 => None,
        1 => Some(d.u64()?),
        t => return Err(format!("bad origin byte {t}")),
    };
    let n = d.u32()? as usize;
    let mut xattrs = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        xattrs.push((d.bytes()?, d.bytes()?));
    }
    let target = match d.u8()? {
        1 => Target::File {
            blob: d.hash()?,
            size: d.u64()?,
        },
        2 => Target::Dir { tree: d.hash()? },
        3 => Target::Symlink { target: d.bytes()? },
        4 => Target::Special,
        5 => Target::Link { path: d.bytes()? },
        t => return Err(format!("bad entry type {t}")),
    };
    Ok(Entry {
        name,
        mode,
        uid,
        gid,
        rdev,
        mtime_sec,
        mtime_nsec,
        origin,
        xattrs,
        target,
    })
}

/// The canonical encoding of a directory: entries sorted by name (sorted here).
pub fn encode_tree(entries: &mut [Entry]) -> Vec<u8> {
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut e = Enc(TREE_MAGIC.to_vec());
    e.u32(entries.len() as u32);
    for x in entries.iter() {
        enc_entry(&mut e, x);
    }
    e.0
}

pub fn decode_tree(raw: &[u8]) -> Result<Vec<Entry>, String> {
    let mut d = Dec { b: raw };
    d.magic(TREE_MAGIC)?;
    let n = d.u32()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        out.push(dec_entry(&mut d)?);
    }
    d.end()?;
    if out.windows(2).any(|w| w[0].name >= w[1].name) {
        return Err("tree entries not sorted".into());
    }
    Ok(out)
}

pub fn encode_commit(c: &Commit) -> Vec<u8> {
    let mut e = Enc(COMMIT_MAGIC.to_vec());
    enc_entry(&mut e, &c.state.root);
    e.opt_hash(&c.state.whiteouts);
    e.opt_hash(&c.parent);
    e.u8(c.kind as u8);
    e.u64(c.time_sec as u64);
    e.u32(c.time_nsec);
    e.bytes(c.message.as_bytes());
    e.0
}

pub fn decode_commit(raw: &[u8]) -> Result<Commit, String> {
    let mut d = Dec { b: raw };
    d.magic(COMMIT_MAGIC)?;
    let root = dec_entry(&mut d)?;
    if !matches!(root.target, Target::Dir { .. }) {
        return Err("commit root is not a directory".into());
    }
    let whiteouts = d.opt_hash()?;
    let parent = d.opt_hash()?;
    let kind = CommitKind::from_u8(d.u8()?).ok_or("bad commit kind")?;
    let time_sec = d.u64()? as i64;
    let time_nsec = d.u32()?;
    let message = String::from_utf8(d.bytes()?).map_err(|_| "commit message is not UTF-8")?;
    d.end()?;
    Ok(Commit {
        state: State { root, whiteouts },
        parent,
        kind,
        time_sec,
        time_nsec,
        message,
    })
}

/// The canonical encoding of a set of whiteout paths (sorted here, duplicates dropped).
pub fn encode_whiteouts(paths: &mut Vec<Vec<u8>>) -> Vec<u8> {
    paths.sort();
    paths.dedup();
    let mut e = Enc(WHITEOUTS_MAGIC.to_vec());
    e.u32(paths.len() as u32);
    for p in paths.iter() {
        e.bytes(p);
    }
    e.0
}

pub fn decode_whiteouts(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut d = Dec { b: raw };
    d.magic(WHITEOUTS_MAGIC)?;
    let n = d.u32()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        out.push(d.bytes()?);
    }
    d.end()?;
    Ok(out)
}

/// The objects an object of `kind` with bytes `raw` refers to.
pub fn children_of(kind: ObjKind, raw: &[u8]) -> Result<Vec<Hash>, String> {
    Ok(match kind {
        ObjKind::Blob | ObjKind::Whiteouts => Vec::new(),
        ObjKind::Tree => decode_tree(raw)?.iter().filter_map(Entry::child).collect(),
        ObjKind::Commit => decode_commit(raw)?.children(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, blob: u8) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            mode: 0o100644,
            uid: 1,
            gid: 2,
            rdev: 0,
            mtime_sec: 5,
            mtime_nsec: 6,
            origin: Some(9),
            xattrs: vec![(b"user.a".to_vec(), b"v".to_vec())],
            target: Target::File {
                blob: [blob; 32],
                size: 3,
            },
        }
    }

    #[test]
    fn trees_are_canonical_and_round_trip() {
        let mut a = vec![file("b", 1), file("a", 2)];
        let mut b = vec![file("a", 2), file("b", 1)];
        let ra = encode_tree(&mut a);
        assert_eq!(ra, encode_tree(&mut b));
        assert_eq!(decode_tree(&ra).unwrap(), a);
        assert_eq!(
            children_of(ObjKind::Tree, &ra).unwrap(),
            vec![[2; 32], [1; 32]]
        );
    }

    #[test]
    fn commits_round_trip_and_reject_garbage() {
        let mut root = file("", 0);
        root.mode = 0o40755;
        root.target = Target::Dir { tree: [7; 32] };
        let c = Commit {
            state: State {
                root,
                whiteouts: Some([8; 32]),
            },
            parent: None,
            kind: CommitKind::Restore,
            time_sec: 1,
            time_nsec: 2,
            message: "m".into(),
        };
        let raw = encode_commit(&c);
        assert_eq!(decode_commit(&raw).unwrap(), c);
        assert!(decode_commit(&raw[..raw.len() - 1]).is_err());
        assert!(decode_tree(&raw).is_err());
    }
}
