//! Content digests (`sha256:<hex>`) and a hasher that produces them.

use std::fmt;

use sha2::{Digest as _, Sha256};

use crate::error::{ImageError, Result};

/// A validated `sha256:<64 lowercase hex>` digest.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    pub fn parse(s: &str) -> Result<Self> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| ImageError::InvalidDigest(s.into()))?;
        if is_hex64(hex) {
            Ok(Digest(s.to_string()))
        } else {
            Err(ImageError::InvalidDigest(s.into()))
        }
    }

    pub fn of(data: &[u8]) -> Self {
        let mut h = Hasher::default();
        h.update(data);
        h.finish()
    }

    /// The hex part, used as a file name.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub(crate) fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = ImageError;
    fn try_from(s: String) -> Result<Self> {
        Digest::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// Incremental sha256 that yields a [`Digest`].
#[derive(Default, Clone)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    pub fn finish(self) -> Digest {
        Digest(format!("sha256:{}", hex::encode(self.0.finalize())))
    }
}

/// The chain ID of a layer stack, as the OCI image spec defines it:
/// `ChainID(L0) = DiffID(L0)`, `ChainID(L0..n) = sha256(ChainID(L0..n-1) + " " + DiffID(Ln))`.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.clone(),
            Some(parent) => Digest::of(format!("{parent} {diff}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(Digest::parse(d.as_str()).is_ok());
        assert!(Digest::parse("sha256:ABC").is_err());
        assert!(Digest::parse(
            "md5:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        )
        .is_err());
        assert!(Digest::parse(&format!("sha256:{}", "G".repeat(64))).is_err());
    }

    #[test]
    fn chain_ids_follow_the_spec() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let ids = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(ids[0], a);
        assert_eq!(ids[1], Digest::of(format!("{a} {b}").as_bytes()));
    }
}
