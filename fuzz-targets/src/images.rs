//! The image side: references from CRI requests and pod specs, and what a registry sends.

use crishim_images::{fuzzing, unpack, Digest, Reference};

use crate::input::split_at_byte;

/// A layer blob (plain, gzip or zstd tar), unpacked into a fresh temporary directory.
pub fn tar_unpack(data: &[u8]) {
    let dir = tempfile::Builder::new()
        .prefix("crishim-fuzz-layer-")
        .tempdir()
        .expect("a temporary directory");
    let _ = unpack::unpack(data, dir.path(), "sha256:fuzz");
}

/// An image reference or ID as a `PullImage`, `ImageStatus` or container config names it.
pub fn image_reference(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Digest::parse(s);
    if let Ok(r) = Reference::parse(s) {
        let _ = (r.name(), r.tagged(), r.manifest_ref());
        if let Some(d) = &r.digest {
            let _ = r.with_digest(d);
        }
    }
}

/// A manifest, index or config: the first line is the `Content-Type` the registry sent.
pub fn registry_reply(data: &[u8]) {
    let (media_type, body) = split_at_byte(data, b'\n');
    fuzzing::registry_reply(&String::from_utf8_lossy(media_type), body);
}

/// A `hosts.toml` of a `[registry] config_path` directory (containerd's certs.d format). Its
/// relative certificate paths point into a directory that does not exist.
pub fn hosts_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crishim_images::registry::hosts::parse(
        text,
        "docker.io",
        std::path::Path::new("/nonexistent/crishim-fuzz"),
    );
}

/// A `WWW-Authenticate` header (the first line) and the token endpoint's JSON answer.
pub fn www_authenticate(data: &[u8]) {
    let (header, body) = split_at_byte(data, b'\n');
    fuzzing::auth_reply(&String::from_utf8_lossy(header), body);
}
