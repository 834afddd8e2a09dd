//! Splitting a fuzzer's input into the parts a target needs.

/// Split `data` at the first `sep`: (before, after); all of it before when there is none.
pub(crate) fn split_at_byte(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}
