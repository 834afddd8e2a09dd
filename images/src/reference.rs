//! Image references, normalised the way Docker and containerd do:
//! `busybox` is `docker.io/library/busybox:latest`.

use std::fmt;

use crate::digest::Digest;
use crate::error::{ImageError, Result};

pub const DEFAULT_REGISTRY: &str = "docker.io";
const DEFAULT_TAG: &str = "latest";

/// A fully qualified reference: registry host, repository path, and a tag and/or digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    pub fn parse(input: &str) -> Result<Self> {
        let bad = |reason: &str| ImageError::InvalidReference {
            reference: input.to_string(),
            reason: reason.into(),
        };
        if input.is_empty() {
            return Err(bad("empty reference"));
        }
        if input.len() > 4096 || input.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(
                "contains whitespace or control characters, or is too long",
            ));
        }
        let (name_tag, digest) = match input.split_once('@') {
            Some((n, d)) => (
                n,
                Some(Digest::parse(d).map_err(|_| bad("digest must be sha256:<64 hex digits>"))?),
            ),
            None => (input, None),
        };
        // A tag is after the last ':' that follows the last '/', so "host:5000/repo" has no tag.
        let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_tag[last_slash..].rfind(':') {
            Some(i) => (
                &name_tag[..last_slash + i],
                Some(&name_tag[last_slash + i + 1..]),
            ),
            None => (name_tag, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(bad(
                    "tag must be 1-128 characters of [A-Za-z0-9_.-], not starting with '.' or '-'",
                ));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            Some(_) => (DEFAULT_REGISTRY.to_string(), name.to_string()),
            None => (DEFAULT_REGISTRY.to_string(), format!("library/{name}")),
        };
        if !valid_host(&registry) {
            return Err(bad("registry host is not a valid host[:port]"));
        }
        if repository.is_empty() || !repository.split('/').all(valid_path_component) {
            return Err(bad(
                "repository path components must be lowercase letters and digits, separated by '.', '_', '__' or '-'",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_TAG.to_string()),
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `registry/repository`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The repo tag (`docker.io/library/busybox:latest`), when the reference has a tag.
    pub fn tagged(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// The repo digest (`docker.io/library/busybox@sha256:…`) for a manifest digest.
    pub fn with_digest(&self, digest: &Digest) -> String {
        format!("{}@{digest}", self.name())
    }

    /// What to ask the registry for: the digest when pinned, else the tag.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => DEFAULT_TAG.to_string(),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

fn valid_tag(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && !t.starts_with(['.', '-'])
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

fn valid_host(h: &str) -> bool {
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || h.starts_with('[') => (host, Some(port)),
        _ => (h, None),
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let host_ok = !host.is_empty()
        && (host.starts_with('[') && host.ends_with(']')
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'));
    port_ok && host_ok
}

fn valid_path_component(c: &str) -> bool {
    // [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*
    let b = c.as_bytes();
    if b.is_empty() || !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !is_alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Reference {
        Reference::parse(s).unwrap()
    }

    #[test]
    fn normalises_docker_hub_names() {
        assert_eq!(p("busybox").to_string(), "docker.io/library/busybox:latest");
        assert_eq!(
            p("library/busybox:1.36").to_string(),
            "docker.io/library/busybox:1.36"
        );
        assert_eq!(p("user/app").to_string(), "docker.io/user/app:latest");
        assert_eq!(
            p("docker.io/library/busybox").tagged().unwrap(),
            "docker.io/library/busybox:latest"
        );
    }

    #[test]
    fn keeps_hosts_ports_tags_and_digests() {
        let r = p("127.0.0.1:5000/a/b:v1");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "a/b", Some("v1"))
        );
        let d = format!("sha256:{}", "a".repeat(64));
        let r = p(&format!("localhost/x@{d}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_ref(), d);
        let r = p(&format!("registry.k8s.io/pause:3.9@{d}"));
        assert_eq!(r.tag.as_deref(), Some("3.9"));
        assert_eq!(r.manifest_ref(), d);
        assert_eq!(p("localhost:5000/x").tag.as_deref(), Some("latest"));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "UPPER",
            "a//b",
            "a:",
            "a@sha256:xyz",
            "a b",
            "-a",
            "a:-tag",
            "host:port/x",
            "a/.b",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
