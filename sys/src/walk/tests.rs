use super::*;
use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// (dev, ino) of every entry under `p`, `p` included (std's walk, for what the test built).
fn inodes_under(p: &Path) -> HashSet<(u64, u64)> {
    let mut out = HashSet::new();
    let mut stack = vec![p.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).unwrap();
        out.insert((m.dev(), m.ino()));
        if m.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

/// The entries a walk visits, as (dev, ino) from the walk's stat and, separately, from an
/// `lstat` of the entry's `fd_path` at visit time (what a path-taking setter would reach).
fn visited(root: &Path, limits: &Limits) -> (Walked, Vec<PathBuf>, HashSet<(u64, u64)>) {
    let mut paths = Vec::new();
    let mut inodes = HashSet::new();
    let w = walk(root, limits, |e| {
        paths.push(e.path());
        inodes.insert((e.stat().dev, e.stat().ino));
        if let Ok(m) = fs::symlink_metadata(e.fd_path()) {
            inodes.insert((m.dev(), m.ino()));
        }
        Ok(())
    })
    .unwrap();
    (w, paths, inodes)
}

/// An outside directory with a file and a subdirectory in it.
fn outside(base: &Path) -> PathBuf {
    let o = base.join("outside");
    fs::create_dir_all(o.join("sub")).unwrap();
    fs::write(o.join("secret"), "x").unwrap();
    fs::write(o.join("sub/deeper"), "x").unwrap();
    o
}

#[test]
fn every_entry_is_visited_once_links_as_themselves() {
    let t = tempfile::tempdir().unwrap();
    let out = outside(t.path());
    let r = t.path().join("root");
    fs::create_dir_all(r.join("a/b/c")).unwrap();
    fs::write(r.join("a/f"), "1").unwrap();
    fs::write(r.join("a/b/c/g"), "2").unwrap();
    symlink(&out, r.join("a/link")).unwrap();
    symlink(&out, r.join("l")).unwrap();
    let (w, paths, inodes) = visited(&r, &Limits::entries(100));
    assert_eq!(w.stopped, None);
    assert_eq!(w.entries, 8, "{paths:?}");
    assert_eq!(inodes, inodes_under(&r));
    let mut names: Vec<_> = paths.iter().map(|p| p.strip_prefix(&r).unwrap()).collect();
    names.sort();
    let want = ["", "a", "a/b", "a/b/c", "a/b/c/g", "a/f", "a/link", "l"];
    assert_eq!(names, want.iter().map(Path::new).collect::<Vec<_>>());
    assert!(inodes.is_disjoint(&inodes_under(&out)));
}

#[test]
fn a_root_that_is_a_file_or_a_link_is_visited_alone() {
    let t = tempfile::tempdir().unwrap();
    let out = outside(t.path());
    fs::write(t.path().join("f"), "1").unwrap();
    symlink(&out, t.path().join("l")).unwrap();
    for name in ["f", "l"] {
        let (w, _, inodes) = visited(&t.path().join(name), &Limits::entries(100));
        assert_eq!(w.entries, 1, "{name}");
        assert!(inodes.is_disjoint(&inodes_under(&out)), "{name}");
    }
    assert!(walk(&t.path().join("none"), &Limits::entries(10), |_| Ok(())).is_err());
}

#[test]
fn fd_path_reaches_the_entry_through_its_directory() {
    let t = tempfile::tempdir().unwrap();
    fs::create_dir(t.path().join("d")).unwrap();
    fs::write(t.path().join("d/f"), "1").unwrap();
    let mut n = 0;
    walk(t.path(), &Limits::entries(10), |e| {
        assert!(e.fd_path().starts_with("/proc/self/fd/"));
        let m = fs::symlink_metadata(e.fd_path())?;
        assert_eq!(
            (m.dev(), m.ino()),
            (e.stat().dev, e.stat().ino),
            "{:?}",
            e.path()
        );
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 3);
}

#[test]
fn a_visitors_error_ends_the_walk_with_the_entrys_path() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), "1").unwrap();
    let e = walk(t.path(), &Limits::entries(10), |e| {
        if e.depth() == 1 {
            Err(io::Error::other("refused"))
        } else {
            Ok(())
        }
    })
    .unwrap_err();
    assert_eq!(e.path, t.path().join("f"));
}

/// A directory of more entries than the cap: the walk stops at the cap, having visited exactly
/// that many and read one 4 KiB buffer of records at a time (nothing collected per entry).
#[test]
fn the_entry_cap_stops_the_walk_while_it_reads() {
    let t = tempfile::tempdir().unwrap();
    for i in 0..3000 {
        fs::write(t.path().join(format!("f{i}")), "").unwrap();
    }
    let mut n = 0u64;
    let w = walk(t.path(), &Limits::entries(1000), |_| {
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(w.stopped, Some(Stop::Entries(1000)));
    assert_eq!((w.entries, n), (1000, 1000));
    let (w, _, _) = visited(t.path(), &Limits::entries(3001));
    assert_eq!((w.entries, w.stopped), (3001, None));
}

#[test]
fn the_depth_cap_and_the_deadline_stop_the_walk() {
    let t = tempfile::tempdir().unwrap();
    let mut p = t.path().to_path_buf();
    for _ in 0..10 {
        p.push("d");
    }
    fs::create_dir_all(&p).unwrap();
    let limits = Limits {
        max_depth: 5,
        ..Limits::entries(100)
    };
    let (w, paths, _) = visited(t.path(), &limits);
    assert_eq!(w.stopped, Some(Stop::Depth(5)));
    assert_eq!(w.entries, 6, "{paths:?}");
    let (w, _, _) = visited(t.path(), &Limits::entries(100));
    assert_eq!((w.entries, w.stopped), (11, None));
    let past = Limits {
        deadline: Some(Instant::now()),
        ..Limits::entries(100)
    };
    assert_eq!(visited(t.path(), &past).0.stopped, Some(Stop::Deadline));
}

/// Bind mounts (of the same filesystem and of a file) and another filesystem inside the tree
/// are left out, mount points included; done in a mount namespace of its own.
#[test]
fn other_mounts_inside_are_left_out() {
    let t = tempfile::tempdir().unwrap();
    let out = outside(t.path());
    let r = t.path().join("root");
    for d in ["bind", "tmpfs", "keep"] {
        fs::create_dir_all(r.join(d)).unwrap();
    }
    fs::write(r.join("file"), "").unwrap();
    fs::write(r.join("keep/k"), "").unwrap();
    let outside_inodes = inodes_under(&out);
    let seen = crate::testing::in_child_mount_ns(|| {
        let mount = |src: &Path, dst: &Path, fstype: Option<&CStr>, flags| {
            let src = cstr_path(src).unwrap();
            let dst = cstr_path(dst).unwrap();
            // SAFETY: mount with C strings, in the child's own mount namespace.
            unsafe {
                libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    fstype.map_or(std::ptr::null(), |f| f.as_ptr()),
                    flags,
                    std::ptr::null(),
                ) == 0
            }
        };
        let mounted = mount(&out, &r.join("bind"), None, libc::MS_BIND)
            && mount(&out.join("secret"), &r.join("file"), None, libc::MS_BIND)
            && mount(Path::new("tmpfs"), &r.join("tmpfs"), Some(c"tmpfs"), 0)
            && fs::write(r.join("tmpfs/t"), "").is_ok();
        if !mounted {
            return None;
        }
        let (w, paths, inodes) = visited(&r, &Limits::entries(100));
        let names: HashSet<_> = paths.iter().map(|p| p.strip_prefix(&r).unwrap()).collect();
        Some(vec![
            w.other_mounts == 3,
            w.entries == 3,
            names.contains(Path::new("keep/k")),
            !names
                .iter()
                .any(|n| n.starts_with("bind") || n.starts_with("tmpfs")),
            !names.contains(Path::new("file")),
            inodes.is_disjoint(&outside_inodes),
        ])
    });
    let Some(seen) = seen else {
        eprintln!("skipped: no mount namespace of our own here");
        return;
    };
    assert_eq!(seen, vec![true; 6]);
}

/// `RENAME_EXCHANGE` of `a` and `b`.
fn exchange(a: &CStr, b: &CStr) {
    // SAFETY: renameat2 with C strings.
    unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
}

/// While a thread swaps a directory of the tree with a symlink to an outside directory as fast
/// as it can, 200 walks never reach the outside directory or anything in it.
#[test]
fn a_directory_swapped_for_a_link_mid_walk_never_leads_outside() {
    let t = tempfile::tempdir().unwrap();
    let out = outside(t.path());
    let r = t.path().join("root");
    for i in 0..20 {
        fs::create_dir_all(r.join(format!("d/sub{i}/deep"))).unwrap();
        fs::write(r.join(format!("d/sub{i}/deep/f")), "").unwrap();
    }
    symlink(&out, r.join("l")).unwrap();
    let outside_inodes = inodes_under(&out);
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let (d, l) = (
            cstr_path(&r.join("d")).unwrap(),
            cstr_path(&r.join("l")).unwrap(),
        );
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                exchange(&d, &l);
                swaps += 1;
            }
            swaps
        })
    };
    let mut reached_d = 0;
    for _ in 0..200 {
        let (_, paths, inodes) = visited(&r, &Limits::entries(10_000));
        assert!(inodes.is_disjoint(&outside_inodes), "{paths:?}");
        reached_d += paths.iter().any(|p| p.ends_with("deep/f")) as u32;
    }
    stop.store(true, Ordering::Relaxed);
    assert!(swapper.join().unwrap() > 0);
    // The walks did go into the swapped directory while it was one.
    assert!(reached_d > 0);
}
