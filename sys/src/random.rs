//! Random bytes for ids and one-time tokens, from `getrandom(2)`. A failure is an error: falling
//! back to zeros (as reading `/dev/urandom` and ignoring its errors did) would make every id and
//! streaming URL token the same, and guessable.

use std::io;

/// Fill `buf` from the kernel's CSPRNG, blocking only until it is seeded at boot.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`, which the kernel writes at most.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io::Error::new(e.kind(), format!("getrandom(2): {e}")));
        }
        done += n as usize;
    }
    Ok(())
}

/// `n` random bytes as lowercase hex.
pub fn hex(n: usize) -> io::Result<String> {
    let mut buf = vec![0u8; n];
    fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_random_hex() {
        let (a, b) = (super::hex(32).unwrap(), super::hex(32).unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert_ne!(a, "0".repeat(64));
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
