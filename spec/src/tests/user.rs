//! The user: uid, gid and groups from the security context and the image's /etc/passwd and
//! /etc/group, read inside the rootfs only.

use super::*;
use std::os::unix::fs::symlink;

#[test]
fn no_user_anywhere_is_root_with_roots_groups_from_etc_group() {
    let f = Fixture::new();
    assert_eq!(uid_gid_groups(&f.spec()), (0, 0, vec![0, 10, 50]));
}

#[test]
fn image_user_name_resolves_uid_gid_and_member_groups() {
    let mut f = Fixture::new();
    f.image.set_user(Some("app".to_string()));
    // The primary group plus wheel, audio and video, where "app" is listed; its own "app" group
    // is the primary one.
    assert_eq!(
        uid_gid_groups(&f.spec()),
        (1000, 1000, vec![10, 29, 44, 1000])
    );
}

#[test]
fn image_user_uid_finds_its_passwd_entry() {
    let mut f = Fixture::new();
    f.image.set_user(Some("1001".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (1001, 1001, vec![44, 1001]));
}

#[test]
fn image_user_uid_without_passwd_entry_has_gid_0() {
    let mut f = Fixture::new();
    f.image.set_user(Some("4242".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (4242, 0, vec![0]));
}

#[test]
fn image_user_with_group_forms() {
    let mut f = Fixture::new();
    f.image.set_user(Some("1000:video".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
    assert_eq!(uid_gid_groups(&f.spec()).1, 44);
    f.image.set_user(Some("app:5".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
    assert_eq!(uid_gid_groups(&f.spec()).1, 5);
    f.image.set_user(Some("other:audio".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1001);
    assert_eq!(uid_gid_groups(&f.spec()).1, 29);
    f.image.set_user(Some("7:8".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (7, 8, vec![8]));
}

#[test]
fn run_as_user_overrides_the_image_user() {
    let mut f = Fixture::new();
    f.image.set_user(Some("app".to_string()));
    f.sc().run_as_user = Some(cri::Int64Value { value: 1001 });
    assert_eq!(uid_gid_groups(&f.spec()), (1001, 1001, vec![44, 1001]));
}

#[test]
fn run_as_username_is_resolved_in_the_image() {
    let mut f = Fixture::new();
    f.sc().run_as_username = "app".to_string();
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
}

#[test]
fn run_as_group_sets_the_primary_gid() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 1000 });
    f.sc().run_as_group = Some(cri::Int64Value { value: 3000 });
    assert_eq!(
        uid_gid_groups(&f.spec()),
        (1000, 3000, vec![10, 29, 44, 3000])
    );
}

#[test]
fn run_as_group_without_a_user_is_invalid() {
    let mut f = Fixture::new();
    f.sc().run_as_group = Some(cri::Int64Value { value: 3000 });
    assert!(f.invalid().contains("run_as_group"));
}

#[test]
fn supplemental_groups_are_added_sorted_and_deduplicated() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 1000 });
    f.sc().supplemental_groups = vec![2000, 44, 1000];
    assert_eq!(uid_gid_groups(&f.spec()).2, vec![10, 29, 44, 1000, 2000]);
}

#[test]
fn strict_supplemental_groups_policy_ignores_etc_group() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 1000 });
    f.sc().supplemental_groups = vec![2000];
    f.sc().supplemental_groups_policy = cri::SupplementalGroupsPolicy::Strict as i32;
    assert_eq!(uid_gid_groups(&f.spec()), (1000, 1000, vec![1000, 2000]));
}

#[test]
fn unknown_user_or_group_name_is_invalid_and_named() {
    let mut f = Fixture::new();
    f.image.set_user(Some("nobody".to_string()));
    assert!(f.invalid().contains("\"nobody\""));
    f.image.set_user(Some("app:nogroup".to_string()));
    assert!(f.invalid().contains("\"nogroup\""));
}

#[test]
fn out_of_range_uid_is_invalid() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: -1 });
    assert!(f.invalid().contains("out of range"));
    f.sc().run_as_user = Some(cri::Int64Value { value: 1 << 40 });
    assert!(f.invalid().contains("out of range"));
}

/// 4294967295 is -1 to setresuid/setresgid, which then leave the process root: an image's
/// passwd or group entry with such an id is refused wherever it would be used.
#[test]
fn image_ids_of_u32_max_are_invalid() {
    let mut f = Fixture::new();
    let etc = f.rootfs.path().join("etc");
    let mut passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
    passwd.push_str("ghost:x:4294967295:1000::/:/bin/sh\nshade:x:3000:4294967295::/:/bin/sh\n");
    passwd.push_str("numb:x:3001:4294967294::/:/bin/sh\n");
    std::fs::write(etc.join("passwd"), passwd).unwrap();
    let mut group = std::fs::read_to_string(etc.join("group")).unwrap();
    group.push_str("ghosts:x:4294967295:app\n");
    std::fs::write(etc.join("group"), group).unwrap();
    for user in [
        "ghost",
        "shade",
        "3000",
        "numb",
        "ghost:1000",
        "1000:ghosts",
    ] {
        f.image.set_user(Some(user.to_string()));
        let msg = f.invalid();
        assert!(msg.contains("out of range"), "{user}: {msg}");
    }
    // As a supplementary group (app is a member of ghosts).
    f.image.set_user(Some("app".to_string()));
    assert!(f.invalid().contains("4294967295"));
    f.image.set_user(None);
    f.sc().run_as_username = "ghost".to_string();
    assert!(f.invalid().contains("4294967295"));
    f.sc().run_as_username = String::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 4294967295 });
    assert!(f.invalid().contains("out of range"));
}

#[test]
fn missing_passwd_is_fine_for_a_numeric_uid() {
    let mut f = Fixture::new();
    std::fs::remove_dir_all(f.rootfs.path().join("etc")).unwrap();
    f.image.set_user(Some("1000".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (1000, 0, vec![0]));
    f.image.set_user(Some("app".to_string()));
    assert!(f.invalid().contains("\"app\""));
}

/// A host file the image's symlinks try to reach: it has a user "escapee".
fn host_passwd() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "passwd", "escapee:x:4321:4321::/:/bin/sh\n");
    dir
}

#[test]
fn absolute_passwd_symlink_cannot_reach_a_host_file() {
    let outside = host_passwd();
    let mut f = Fixture::new();
    let passwd = f.rootfs.path().join("etc/passwd");
    std::fs::remove_file(&passwd).unwrap();
    // Resolved on the host, this names `outside`'s file; in the rootfs it names nothing.
    symlink(outside.path().join("passwd"), &passwd).unwrap();
    f.image.set_user(Some("escapee".to_string()));
    assert!(f.invalid().contains("\"escapee\""));
    // And a numeric uid gets no gid from it either.
    f.image.set_user(Some("4321".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).1, 0);
}

#[test]
fn relative_passwd_symlink_cannot_climb_out_of_the_rootfs() {
    let outside = host_passwd();
    let mut f = Fixture::new();
    let passwd = f.rootfs.path().join("etc/passwd");
    std::fs::remove_file(&passwd).unwrap();
    let climb = "../".repeat(f.rootfs.path().components().count() + 2);
    let target = format!("{climb}{}", outside.path().join("passwd").display());
    symlink(target, &passwd).unwrap();
    f.image.set_user(Some("escapee".to_string()));
    assert!(f.invalid().contains("\"escapee\""));
}

#[test]
fn passwd_symlink_inside_the_rootfs_is_followed_there() {
    let mut f = Fixture::new();
    let etc = f.rootfs.path().join("etc");
    std::fs::rename(etc.join("passwd"), etc.join("passwd.real")).unwrap();
    // Absolute, as images have them: relative to the rootfs, not the host.
    symlink("/etc/passwd.real", etc.join("passwd")).unwrap();
    f.image.set_user(Some("app".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
}

#[test]
fn passwd_that_is_not_a_regular_file_is_refused() {
    let mut f = Fixture::new();
    let passwd = f.rootfs.path().join("etc/passwd");
    std::fs::remove_file(&passwd).unwrap();
    // A FIFO would block a plain open forever.
    nix::unistd::mkfifo(&passwd, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    f.image.set_user(Some("app".to_string()));
    assert!(f.invalid().contains("not a regular file"));
}
