//! Entry points for the fuzz targets (`fuzz-targets/`): the parsers a pull runs on registry
//! replies, which are otherwise private to it. Not an API; nothing else calls these.

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};

use crate::digest::{chain_ids, Digest};
use crate::pull::{choose_platform, digest_of, is_index};
use crate::registry::auth::{parse_challenge, TokenResponse};

/// What a pull does with a manifest-or-index reply (`media_type` as the registry labelled it)
/// and, as an image config, with the same bytes; errors are fine, panics are not.
pub fn registry_reply(media_type: &str, bytes: &[u8]) {
    let top = Digest::of(bytes);
    if is_index(media_type, bytes) {
        if let Ok(index) = ImageIndex::from_reader(bytes) {
            let _ = choose_platform(&index, &top);
        }
    } else if let Ok(m) = ImageManifest::from_reader(bytes) {
        let _ = digest_of(m.config());
        for l in m.layers() {
            let _ = digest_of(l);
        }
    }
    if let Ok(config) = ImageConfiguration::from_reader(bytes) {
        let diff_ids: Result<Vec<Digest>, _> = config
            .rootfs()
            .diff_ids()
            .iter()
            .map(|d| Digest::parse(d))
            .collect();
        if let Ok(d) = diff_ids {
            let _ = chain_ids(&d);
        }
    }
}

/// A `WWW-Authenticate` header, and a token endpoint's JSON answer.
pub fn auth_reply(header: &str, token_body: &[u8]) {
    let _ = parse_challenge(header);
    if let Ok(t) = serde_json::from_slice::<TokenResponse>(token_body) {
        let _ = t.into_token();
    }
}
