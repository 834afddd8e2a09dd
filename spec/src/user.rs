//! The process's uid, gid and supplementary groups, resolved against the image's own
//! /etc/passwd and /etc/group as containerd's `WithUser` / `WithAdditionalGIDs` do.
//!
//! Both files come from an untrusted image, so they are read with the bounded reader
//! (`crishim_sys::confined`, `RESOLVE_IN_ROOT`): the kernel resolves every symlink and `..` as
//! if the rootfs were `/`, so `etc/passwd -> /etc/shadow` names the image's shadow file, never
//! the host's; only a regular file of at most 10 MiB is read.

use std::collections::BTreeSet;
use std::num::IntErrorKind;
use std::path::Path;

use crishim_proto::cri;
use oci_spec::runtime::User;

use super::SpecError;

/// As containerd (following runc): ids above `i32::MAX` are refused.
const MAX_ID: i64 = i32::MAX as i64;

/// Real passwd/group files are far smaller; the cap keeps a hostile image from making us read
/// gigabytes.
const MAX_USER_FILE_BYTES: u64 = 10 << 20;

pub(super) fn resolve(
    rootfs: &Path,
    sc: Option<&cri::LinuxContainerSecurityContext>,
    image_user: Option<&str>,
) -> Result<User, SpecError> {
    let db = UserDb { root: rootfs };
    let user_spec = match cri_user_string(sc)? {
        Some(spec) => Some(spec),
        None => image_user.filter(|u| !u.is_empty()).map(str::to_string),
    };
    let (uid, gid) = match &user_spec {
        Some(spec) => db.uid_gid(spec)?,
        None => (0, 0),
    };

    let mut gids = BTreeSet::from([gid]);
    let policy = sc.map_or(0, |sc| sc.supplemental_groups_policy);
    match cri::SupplementalGroupsPolicy::try_from(policy) {
        // Merge: the groups /etc/group lists the user in, plus the requested ones.
        Ok(cri::SupplementalGroupsPolicy::Merge) => {
            gids.extend(db.member_groups(&group_member_name(sc, user_spec.as_deref()))?)
        }
        // Strict: only the requested ones.
        Ok(cri::SupplementalGroupsPolicy::Strict) => {}
        Err(_) => {
            return Err(SpecError::Invalid(format!(
                "unknown supplemental_groups_policy {policy}"
            )))
        }
    }
    for &group in sc
        .map(|sc| sc.supplemental_groups.as_slice())
        .unwrap_or_default()
    {
        gids.insert(checked_id(group, "supplemental group")?);
    }

    let mut user = User::default();
    user.set_uid(uid)
        .set_gid(gid)
        .set_additional_gids(Some(gids.into_iter().collect()));
    Ok(user)
}

/// `run_as_username` or `run_as_user`, then `:run_as_group`: containerd's `GenerateUserString`.
fn cri_user_string(
    sc: Option<&cri::LinuxContainerSecurityContext>,
) -> Result<Option<String>, SpecError> {
    let Some(sc) = sc else { return Ok(None) };
    let user = if !sc.run_as_username.is_empty() {
        Some(sc.run_as_username.clone())
    } else {
        sc.run_as_user.map(|u| u.value.to_string())
    };
    match (user, sc.run_as_group) {
        (None, None) => Ok(None),
        (None, Some(group)) => Err(SpecError::Invalid(format!(
            "run_as_group {} is specified without run_as_user or run_as_username",
            group.value
        ))),
        (Some(user), None) => Ok(Some(user)),
        (Some(user), Some(group)) => Ok(Some(format!("{user}:{}", group.value))),
    }
}

/// Whose memberships in /etc/group count: the CRI user, else the image's (its user part),
/// else root, as containerd's `containerSpecOpts`.
fn group_member_name(
    sc: Option<&cri::LinuxContainerSecurityContext>,
    user_spec: Option<&str>,
) -> String {
    if let Some(sc) = sc {
        if !sc.run_as_username.is_empty() {
            return sc.run_as_username.clone();
        }
        if let Some(uid) = sc.run_as_user {
            return uid.value.to_string();
        }
    }
    match user_spec {
        Some(spec) => spec.split(':').next().unwrap_or_default().to_string(),
        None => "0".to_string(),
    }
}

fn checked_id(id: i64, what: &str) -> Result<u32, SpecError> {
    if (0..=MAX_ID).contains(&id) {
        Ok(id as u32)
    } else {
        Err(SpecError::Invalid(format!("{what} {id} is out of range")))
    }
}

/// An id read from the image's /etc/passwd or /etc/group. Up to `u32::MAX` parses there, but
/// `4294967295` is `-1` to `setresuid`/`setresgid`, which then change nothing and leave the process
/// root; ids above `i32::MAX` are refused as for requests.
fn image_id(id: u32, what: &str, spec: &str) -> Result<u32, SpecError> {
    checked_id(i64::from(id), what).map_err(|_| {
        SpecError::Invalid(format!(
            "invalid user {spec:?}: the image's {what} {id} is out of range (at most {MAX_ID})"
        ))
    })
}

/// A numeric id, or `None` for a name. Numbers too large for any id are errors, not names.
fn parse_id(s: &str, what: &str, spec: &str) -> Result<Option<u32>, SpecError> {
    match s.parse::<i64>() {
        Ok(id) => checked_id(id, what)
            .map(Some)
            .map_err(|_| SpecError::Invalid(format!("invalid user {spec:?}: {what} out of range"))),
        Err(e)
            if matches!(
                e.kind(),
                IntErrorKind::PosOverflow | IntErrorKind::NegOverflow
            ) =>
        {
            Err(SpecError::Invalid(format!(
                "invalid user {spec:?}: {what} out of range"
            )))
        }
        Err(_) => Ok(None),
    }
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// The image's user database, read on demand.
struct UserDb<'a> {
    root: &'a Path,
}

impl UserDb<'_> {
    /// `uid`, `name`, `uid:gid`, `name:group`, ... as containerd's `WithUser`.
    fn uid_gid(&self, spec: &str) -> Result<(u32, u32), SpecError> {
        match spec.split(':').collect::<Vec<_>>()[..] {
            [user] => match parse_id(user, "uid", spec)? {
                // A uid needs no passwd entry; its primary group is then root's.
                Some(uid) => {
                    let gid = match self.passwd()?.iter().find(|p| p.uid == uid) {
                        Some(p) => image_id(p.gid, "gid", spec)?,
                        None => 0,
                    };
                    Ok((uid, gid))
                }
                None => {
                    let entry = self.user_named(user, spec)?;
                    Ok((entry.uid, entry.gid))
                }
            },
            [user, group] => {
                let uid = match parse_id(user, "uid", spec)? {
                    Some(uid) => uid,
                    // An empty user part (":1000") means uid 0, as in containerd.
                    None if user.is_empty() => 0,
                    None => self.user_named(user, spec)?.uid,
                };
                let gid = match parse_id(group, "gid", spec)? {
                    Some(gid) => gid,
                    None if group.is_empty() => 0,
                    None => self.group_named(group, spec)?,
                };
                Ok((uid, gid))
            }
            _ => Err(SpecError::Invalid(format!("invalid user {spec:?}"))),
        }
    }

    fn user_named(&self, name: &str, spec: &str) -> Result<PasswdEntry, SpecError> {
        let entry = self
            .passwd()?
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                SpecError::Invalid(format!(
                    "user {name:?} (from {spec:?}) not found in the image's /etc/passwd"
                ))
            })?;
        image_id(entry.uid, "uid", spec)?;
        image_id(entry.gid, "gid", spec)?;
        Ok(entry)
    }

    fn group_named(&self, name: &str, spec: &str) -> Result<u32, SpecError> {
        let gid = self
            .group()?
            .into_iter()
            .find(|g| g.name == name)
            .map(|g| g.gid)
            .ok_or_else(|| {
                SpecError::Invalid(format!(
                    "group {name:?} (from {spec:?}) not found in the image's /etc/group"
                ))
            })?;
        image_id(gid, "gid", spec)
    }

    /// The gids of the groups that list `user` (a name, or a uid looked up in passwd) as a
    /// member, its own same-named group excepted. Missing files or users mean none.
    fn member_groups(&self, user: &str) -> Result<Vec<u32>, SpecError> {
        let name = match user.parse::<u32>() {
            Ok(uid) => match self.passwd()?.into_iter().find(|p| p.uid == uid) {
                Some(entry) => entry.name,
                None => return Ok(Vec::new()),
            },
            Err(_) => user.to_string(),
        };
        self.group()?
            .into_iter()
            .filter(|g| g.name != name && g.members.contains(&name))
            .map(|g| image_id(g.gid, "supplemental gid", &name))
            .collect()
    }

    /// Entries of etc/passwd; none if the image has no such file.
    fn passwd(&self) -> Result<Vec<PasswdEntry>, SpecError> {
        let text = read_in_root(self.root, "etc/passwd")?.unwrap_or_default();
        Ok(records(&text)
            .filter_map(|f| match f[..] {
                [name, _, uid, gid, ..] => Some(PasswdEntry {
                    name: name.to_string(),
                    uid: uid.parse().ok()?,
                    gid: gid.parse().ok()?,
                }),
                _ => None,
            })
            .collect())
    }

    /// Entries of etc/group; none if the image has no such file.
    fn group(&self) -> Result<Vec<GroupEntry>, SpecError> {
        let text = read_in_root(self.root, "etc/group")?.unwrap_or_default();
        Ok(records(&text)
            .filter_map(|f| match f[..] {
                [name, _, gid, ..] => Some(GroupEntry {
                    name: name.to_string(),
                    gid: gid.parse().ok()?,
                    members: f
                        .get(3)
                        .map(|m| {
                            m.split(',')
                                .filter(|m| !m.is_empty())
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default(),
                }),
                _ => None,
            })
            .collect())
    }
}

/// The colon-separated fields of each non-blank, non-comment line; malformed lines are skipped
/// by the callers, as libc's getpwent does.
fn records(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split(':').collect())
}

/// Reads `rel` as if `root` were `/`, through the bounded reader. `Ok(None)` if it does not
/// exist; a non-regular file (a FIFO that would block us, a device that never ends) or one over
/// `MAX_USER_FILE_BYTES` is refused without being read.
pub(super) fn read_in_root(root: &Path, rel: &str) -> Result<Option<String>, SpecError> {
    use crishim_sys::confined::{self, Limits};
    confined::read_text(root, rel, Limits::in_root(MAX_USER_FILE_BYTES)).map_err(|e| {
        if e.is_refusal() {
            SpecError::Invalid(format!("the container rootfs's {e}"))
        } else {
            SpecError::internal(format!("reading {rel} in the container rootfs"), e)
        }
    })
}
