//! Signals as `kill` takes them: `TERM`, `SIGTERM`, `term` or `15`.

use std::str::FromStr;

use nix::sys::signal::Signal;

use super::error::BundleError;

pub fn parse(s: &str) -> Result<i32, BundleError> {
    let unknown = || BundleError::UnknownSignal(s.to_string());
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n)
            .map(|sig| sig as i32)
            .map_err(|_| unknown());
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&name)
        .map(|sig| sig as i32)
        .map_err(|_| unknown())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        for s in ["TERM", "SIGTERM", "term", "15"] {
            assert_eq!(parse(s).unwrap(), libc::SIGTERM, "{s}");
        }
        assert_eq!(parse("KILL").unwrap(), libc::SIGKILL);
        assert_eq!(parse("usr1").unwrap(), libc::SIGUSR1);
        for bad in ["", "SIG", "TERMS", "0", "-1", "999", "SIGFOO"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
