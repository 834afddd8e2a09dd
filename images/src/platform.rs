//! This host's platform, as image indexes name platforms.

/// The Go-style name of the host architecture, as image platforms spell it.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}
