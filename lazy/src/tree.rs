//! A lazy layer's tree, built from its checked TOC: what its FUSE mount shows, entry for entry
//! as the unpacker would have written the layer (Docker whiteouts become overlayfs whiteouts,
//! hard links share an inode, parents the TOC leaves out are made as the unpacker makes them).

use std::collections::{BTreeMap, HashMap};

use crate::toc::{Chunk, Kind, Toc};

/// The root's inode number, as FUSE numbers it.
pub const ROOT: u64 = 1;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
pub const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Dir {
        children: BTreeMap<String, u64>,
    },
    /// A regular file whose bytes are the chunks `chunks` of [`Tree::chunks`].
    File {
        size: u64,
        chunks: std::ops::Range<usize>,
    },
    /// A regular file whose bytes are held here (the eStargz TOC, which a full pull unpacks as
    /// `stargz.index.json` but the TOC does not list).
    Inline {
        data: Vec<u8>,
    },
    Symlink {
        target: String,
    },
    Char {
        rdev: u32,
    },
    Block {
        rdev: u32,
    },
    Fifo,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub parent: u64,
    /// The path of its first name in the layer (`""` for the root).
    pub path: String,
    pub kind: NodeKind,
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub nlink: u32,
    pub xattrs: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, Clone)]
pub struct Tree {
    /// Inode `n` is `nodes[n - 1]`.
    pub nodes: Vec<Node>,
    pub chunks: Vec<Chunk>,
}

/// `makedev` as the kernel's `new_encode_dev` packs it for `st_rdev`.
fn rdev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

impl Tree {
    /// The tree of `toc`; `inline` adds one file at the root with these bytes (name, mode).
    pub fn build(toc: &Toc, inline: Option<(&str, Vec<u8>)>) -> Tree {
        let mut t = Tree {
            nodes: vec![Node {
                parent: ROOT,
                path: String::new(),
                kind: NodeKind::Dir {
                    children: BTreeMap::new(),
                },
                mode: 0o755,
                uid: 0,
                gid: 0,
                mtime: 0,
                nlink: 2,
                xattrs: Vec::new(),
            }],
            chunks: Vec::new(),
        };
        let mut by_path: HashMap<String, u64> = HashMap::from([(String::new(), ROOT)]);
        for e in &toc.entries {
            let (parent_path, name) = match e.path.rsplit_once('/') {
                Some((p, n)) => (p, n),
                None => ("", e.path.as_str()),
            };
            if name.is_empty() {
                // The root's own entry ("./"): its attributes.
                if matches!(e.kind, Kind::Dir) {
                    let root = &mut t.nodes[0];
                    (root.mode, root.uid, root.gid) = (e.mode, e.uid, e.gid);
                    root.mtime = e.mtime.unwrap_or(0);
                    root.xattrs = e.xattrs.clone();
                }
                continue;
            }
            let parent = t.ensure_dir(parent_path, &mut by_path);
            if name == OPAQUE_MARKER {
                let xattrs = &mut t.nodes[(parent - 1) as usize].xattrs;
                if !xattrs.iter().any(|(k, _)| k == OPAQUE_XATTR) {
                    xattrs.push((OPAQUE_XATTR.into(), b"y".to_vec()));
                }
                continue;
            }
            if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
                let path = join(parent_path, hidden);
                let ino = t.add(
                    parent,
                    &path,
                    NodeKind::Char { rdev: 0 },
                    0,
                    (0, 0),
                    0,
                    vec![],
                );
                t.link(parent, hidden, ino, &mut by_path, path);
                continue;
            }
            let mtime = e.mtime.unwrap_or(0);
            if let Kind::Hardlink { target } = &e.kind {
                if let Some(&ino) = by_path.get(target) {
                    t.nodes[(ino - 1) as usize].nlink += 1;
                    t.link(parent, name, ino, &mut by_path, e.path.clone());
                }
                continue;
            }
            if let (Kind::Dir, Some(&ino)) = (&e.kind, by_path.get(&e.path)) {
                // A directory made earlier as a parent (or listed twice) takes these attributes.
                let n = &mut t.nodes[(ino - 1) as usize];
                if matches!(n.kind, NodeKind::Dir { .. }) {
                    (n.mode, n.uid, n.gid, n.mtime) = (e.mode, e.uid, e.gid, mtime);
                    let opaque: Vec<_> = n
                        .xattrs
                        .iter()
                        .filter(|(k, _)| k == OPAQUE_XATTR)
                        .cloned()
                        .collect();
                    n.xattrs = e.xattrs.clone();
                    n.xattrs.extend(opaque);
                    continue;
                }
            }
            let kind = match &e.kind {
                Kind::Dir => NodeKind::Dir {
                    children: BTreeMap::new(),
                },
                Kind::File { size, chunks, .. } => {
                    let start = t.chunks.len();
                    t.chunks.extend(chunks.iter().cloned());
                    NodeKind::File {
                        size: *size,
                        chunks: start..t.chunks.len(),
                    }
                }
                Kind::Symlink { target } => NodeKind::Symlink {
                    target: target.clone(),
                },
                Kind::Char { major, minor } => NodeKind::Char {
                    rdev: rdev(*major, *minor),
                },
                Kind::Block { major, minor } => NodeKind::Block {
                    rdev: rdev(*major, *minor),
                },
                Kind::Fifo => NodeKind::Fifo,
                Kind::Hardlink { .. } => unreachable!("handled above"),
            };
            let ino = t.add(
                parent,
                &e.path,
                kind,
                e.mode,
                (e.uid, e.gid),
                mtime,
                e.xattrs.clone(),
            );
            t.link(parent, name, ino, &mut by_path, e.path.clone());
        }
        if let Some((name, data)) = inline {
            let ino = t.add(
                ROOT,
                name,
                NodeKind::Inline { data },
                0o444,
                (0, 0),
                0,
                vec![],
            );
            t.link(ROOT, name, ino, &mut by_path, name.to_string());
        }
        t
    }

    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        parent: u64,
        path: &str,
        kind: NodeKind,
        mode: u32,
        (uid, gid): (u32, u32),
        mtime: i64,
        xattrs: Vec<(String, Vec<u8>)>,
    ) -> u64 {
        let nlink = if matches!(kind, NodeKind::Dir { .. }) {
            2
        } else {
            1
        };
        self.nodes.push(Node {
            parent,
            path: path.to_string(),
            kind,
            mode,
            uid,
            gid,
            mtime,
            nlink,
            xattrs,
        });
        self.nodes.len() as u64
    }

    /// Name `ino` `name` in the directory `parent`, in place of what held that name.
    fn link(
        &mut self,
        parent: u64,
        name: &str,
        ino: u64,
        by_path: &mut HashMap<String, u64>,
        path: String,
    ) {
        let is_dir = matches!(self.nodes[(ino - 1) as usize].kind, NodeKind::Dir { .. });
        let old = match &mut self.nodes[(parent - 1) as usize].kind {
            NodeKind::Dir { children } => children.insert(name.to_string(), ino),
            _ => return,
        };
        let old_dir = old.is_some_and(|o| matches!(self.node(o).kind, NodeKind::Dir { .. }));
        if is_dir && !old_dir {
            self.nodes[(parent - 1) as usize].nlink += 1;
        } else if !is_dir && old_dir {
            self.nodes[(parent - 1) as usize].nlink -= 1;
        }
        by_path.insert(path, ino);
    }

    /// The directory at `path`, made (0755, root's) with its parents where the TOC has none.
    fn ensure_dir(&mut self, path: &str, by_path: &mut HashMap<String, u64>) -> u64 {
        if let Some(&ino) = by_path.get(path) {
            if matches!(self.node(ino).kind, NodeKind::Dir { .. }) {
                return ino;
            }
        }
        let (parent_path, name) = path.rsplit_once('/').unwrap_or(("", path));
        let parent = self.ensure_dir(parent_path, by_path);
        let kind = NodeKind::Dir {
            children: BTreeMap::new(),
        };
        let ino = self.add(parent, path, kind, 0o755, (0, 0), 0, Vec::new());
        self.link(parent, name, ino, by_path, path.to_string());
        ino
    }

    pub fn node(&self, ino: u64) -> &Node {
        &self.nodes[(ino - 1) as usize]
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        ino.checked_sub(1).and_then(|i| self.nodes.get(i as usize))
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Option<u64> {
        match &self.get(parent)?.kind {
            NodeKind::Dir { children } => children.get(name).copied(),
            _ => None,
        }
    }

    /// Which regular file owns each chunk (its inode), for the chunk cache.
    pub fn chunk_owners(&self) -> Vec<u64> {
        let mut owners = vec![0; self.chunks.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            if let NodeKind::File { chunks, .. } = &n.kind {
                for c in chunks.clone() {
                    owners[c] = i as u64 + 1;
                }
            }
        }
        owners
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toc::{Entry, Toc};

    fn entry(path: &str, kind: Kind) -> Entry {
        Entry {
            path: path.into(),
            kind,
            mode: 0o640,
            uid: 7,
            gid: 8,
            mtime: Some(5),
            xattrs: vec![],
        }
    }

    /// Whiteouts become 0/0 character devices, the opaque marker an xattr, hard links one inode
    /// with two names, and parents the TOC leaves out directories of root's.
    #[test]
    fn the_tree_is_what_the_unpacker_would_write() {
        let file = Kind::File {
            size: 0,
            digest: None,
            chunks: vec![],
        };
        let toc = Toc {
            entries: vec![
                entry("a/b/f", file.clone()),
                entry(
                    "a/link",
                    Kind::Hardlink {
                        target: "a/b/f".into(),
                    },
                ),
                entry("a/.wh.gone", file.clone()),
                entry("a/b/.wh..wh..opq", file),
                entry("a", Kind::Dir),
            ],
            prefetch_before: None,
            dropped_xattrs: 0,
        };
        let t = Tree::build(&toc, Some(("stargz.index.json", b"{}".to_vec())));
        let a = t.lookup(ROOT, "a").unwrap();
        assert_eq!(
            (t.node(a).mode, t.node(a).uid),
            (0o640, 7),
            "a later entry sets a made parent"
        );
        let b = t.lookup(a, "b").unwrap();
        assert_eq!(t.node(b).mode, 0o755);
        assert_eq!(t.node(b).xattrs, vec![(OPAQUE_XATTR.into(), b"y".to_vec())]);
        assert!(t.lookup(b, ".wh..wh..opq").is_none());
        let f = t.lookup(b, "f").unwrap();
        assert_eq!(t.lookup(a, "link"), Some(f));
        assert_eq!(t.node(f).nlink, 2);
        let gone = t.lookup(a, "gone").unwrap();
        assert_eq!(t.node(gone).kind, NodeKind::Char { rdev: 0 });
        assert_eq!(t.node(gone).mode, 0);
        assert_eq!(t.node(a).nlink, 3, "a has one subdirectory");
        let toc_file = t.lookup(ROOT, "stargz.index.json").unwrap();
        assert_eq!(t.node(toc_file).mode, 0o444);
    }
}
