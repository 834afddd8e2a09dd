//! Names that come from images or requests (references, tar entry names, digests, registry error
//! bodies) are attacker-sized. Every error message and log line shows them through [`shown`], cut to
//! [`MAX_SHOWN`] bytes, so a 2 GiB entry name costs a log line of a few hundred bytes.

use std::borrow::Cow;

/// The most bytes of one name that a message or log line carries.
pub const MAX_SHOWN: usize = 256;

/// `s` cut to at most [`MAX_SHOWN`] bytes on a character boundary, ending in `…[N bytes]` when cut.
pub fn shown(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_SHOWN {
        return Cow::Borrowed(s);
    }
    let suffix = format!("…[{} bytes]", s.len());
    let mut end = MAX_SHOWN - suffix.len();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{suffix}", &s[..end]))
}

/// Raw bytes (a tar path) as printable text: at most [`MAX_SHOWN`] bytes, control characters and
/// invalid UTF-8 escaped. Only a bounded prefix is ever converted, whatever the input's size.
pub fn shown_bytes(raw: &[u8]) -> String {
    let head = &raw[..raw.len().min(MAX_SHOWN)];
    let text: String = String::from_utf8_lossy(head).escape_debug().collect();
    if raw.len() <= MAX_SHOWN && text.len() <= MAX_SHOWN {
        return text;
    }
    let suffix = format!("…[{} bytes]", raw.len());
    let mut end = MAX_SHOWN.saturating_sub(suffix.len()).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_untouched() {
        assert_eq!(shown("busybox:latest"), "busybox:latest");
        assert_eq!(shown_bytes(b"usr/bin/sh"), "usr/bin/sh");
    }

    #[test]
    fn long_names_are_cut_to_the_cap_on_a_char_boundary() {
        let long = "é".repeat(10_000);
        let s = shown(&long);
        assert!(s.len() <= MAX_SHOWN, "{}", s.len());
        assert!(s.ends_with("…[20000 bytes]"), "{s}");
        let b = shown_bytes(&vec![b'a'; 64 << 20]);
        assert!(
            b.len() <= MAX_SHOWN && b.ends_with("[67108864 bytes]"),
            "{b}"
        );
    }

    #[test]
    fn control_bytes_are_escaped_and_still_capped() {
        let s = shown_bytes(&[0u8; 200]);
        assert!(s.starts_with("\\0\\0") && s.len() <= MAX_SHOWN, "{s}");
        assert_eq!(shown_bytes(b"a\nb"), "a\\nb");
    }
}
