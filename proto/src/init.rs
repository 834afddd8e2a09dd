//! What the daemon, the shim and `crishim-init` agree on about the init binary in a container.
//!
//! An OCI spec carries environment values as strings, and the CRI as bytes. A value that is not
//! UTF-8 reaches the process through `crishim-init`: the spec holds [`RAW_ENV`], whose value is
//! the hex of the `KEY=VALUE` entries joined by NUL bytes, and init sets them exactly before it
//! runs the program ([`EXEC_FLAG`] when it only does that, and execs in place).

/// Where the init binary appears inside the container.
pub const PATH: &str = "/.crishim/init";
/// The variable that carries the environment entries that are not UTF-8 (`crishim-init` names
/// it too; it has no dependencies).
pub const RAW_ENV: &str = "CRISHIM_RAW_ENV";
/// Init's flag: set the raw environment and exec the program in place, as no PID 1.
pub const EXEC_FLAG: &str = "--exec";

/// [`RAW_ENV`]'s value for `entries` (each `KEY=VALUE`, without NUL).
pub fn encode_raw_env(entries: &[Vec<u8>]) -> String {
    let joined = entries.join(&0u8);
    let mut out = String::with_capacity(joined.len() * 2);
    for b in joined {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn raw_entries_are_hex_of_nul_joined_entries() {
        let e = super::encode_raw_env(&[b"A=\xff".to_vec(), b"B=c".to_vec()]);
        assert_eq!(e, "413dff00423d63");
    }
}
