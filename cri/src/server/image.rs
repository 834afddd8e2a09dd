//! Conversions shared by the image RPCs.

use crishim_images::ImageRecord;
use crishim_proto::cri;

use super::ImageService;

impl ImageService {
    pub(super) fn to_cri(&self, rec: &ImageRecord) -> cri::Image {
        let (uid, username) = user_of(&rec.user);
        let pinned = rec
            .repo_tags
            .iter()
            .chain(rec.repo_digests.iter())
            .any(|n| self.pinned.contains(n));
        cri::Image {
            id: rec.id.to_string(),
            repo_tags: rec.repo_tags.clone(),
            repo_digests: rec.repo_digests.clone(),
            size: rec.size,
            uid: uid.map(|value| cri::Int64Value { value }),
            username,
            spec: Some(cri::ImageSpec {
                image: rec.id.to_string(),
                ..Default::default()
            }),
            pinned,
        }
    }
}

/// The image config's `User` (`uid`, `uid:gid`, `name` or `name:group`) as the CRI reports it:
/// a numeric uid, or else a user name. Empty means the image does not say.
pub(crate) fn user_of(user: &str) -> (Option<i64>, String) {
    let name = user.split(':').next().unwrap_or_default();
    match name.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::user_of;

    #[test]
    fn users() {
        assert_eq!(user_of("1000:1000"), (Some(1000), String::new()));
        assert_eq!(user_of("app"), (None, "app".into()));
        assert_eq!(user_of(""), (None, String::new()));
        assert_eq!(user_of("0"), (Some(0), String::new()));
    }
}
