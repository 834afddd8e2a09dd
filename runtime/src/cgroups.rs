//! Pod cgroup parents. The kubelet creates (and removes) the parents it names; when a pod names one
//! that does not exist yet, or none at all, libcontainer creates it for the first container, and then
//! it is ours to remove with the pod. We record which directories we created and remove only those.

use std::path::PathBuf;

/// Mount points of every cgroup hierarchy (each v1 controller, and the v2 unified one).
pub fn roots() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let mountpoint = pre.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mountpoint))
        })
        .collect()
}

/// The prefixes of `parent` (`/a`, `/a/b`, …) that exist in no hierarchy yet: the ones we will own.
pub fn missing_prefixes(parent: &str) -> Vec<String> {
    let roots = roots();
    let mut prefix = String::new();
    let mut missing = Vec::new();
    for comp in parent
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
    {
        prefix.push('/');
        prefix.push_str(comp);
        if !roots.iter().any(|r| r.join(&prefix[1..]).exists()) {
            missing.push(prefix.clone());
        }
    }
    missing
}

/// Remove the directories we created, deepest first, in every hierarchy. A directory still in use
/// (another pod under a shared parent) stays.
pub fn remove(owned: &[String]) {
    let roots = roots();
    let mut owned: Vec<&String> = owned.iter().collect();
    owned.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    for prefix in owned {
        for root in &roots {
            let dir = root.join(prefix.trim_start_matches('/'));
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT) | Some(libc::ENOTEMPTY) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "removing pod cgroup")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_that_exist_are_not_ours() {
        if roots().is_empty() {
            return; // no cgroups mounted where the tests run
        }
        let missing = missing_prefixes("/crishim-unit-test-none/x");
        assert_eq!(
            missing,
            ["/crishim-unit-test-none", "/crishim-unit-test-none/x"]
        );
        assert!(missing_prefixes("/").is_empty());
    }
}
