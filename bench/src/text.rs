//! Text helpers for messages.

/// The last `max` bytes of `s` (at a character boundary).
pub fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
