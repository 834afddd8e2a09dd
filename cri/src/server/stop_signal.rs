//! The stop signal: the container's own (`ContainerConfig.stop_signal`, Kubernetes 1.33 and
//! later), else the image's `STOPSIGNAL`, else SIGTERM; reported back in `ContainerStatus`.

use super::errors::Error;
use crishim_proto::cri::Signal;

/// The signal number a CRI `Signal` names; `None` for `RUNTIME_DEFAULT`.
pub(super) fn from_cri(value: i32) -> Result<Option<i32>, Error> {
    let signal = Signal::try_from(value).map_err(|_| {
        Error::invalid_argument(format!(
            "CreateContainer: stop_signal {value} is not a signal"
        ))
    })?;
    if signal == Signal::RuntimeDefault {
        return Ok(None);
    }
    // cri-api v0.37 prefixes every value with the enum's name (`SIGNAL_SIGTERM`).
    let name = signal.as_str_name();
    let name = name.strip_prefix(SIGNAL_PREFIX).unwrap_or(name);
    let number = if let Some(n) = name.strip_prefix("SIGRTMINPLUS") {
        n.parse::<i32>().ok().map(|n| libc::SIGRTMIN() + n)
    } else if let Some(n) = name.strip_prefix("SIGRTMAXMINUS") {
        n.parse::<i32>().ok().map(|n| libc::SIGRTMAX() - n)
    } else {
        match name {
            "SIGRTMIN" => Some(libc::SIGRTMIN()),
            "SIGRTMAX" => Some(libc::SIGRTMAX()),
            // Aliases nix does not name.
            "SIGCLD" => Some(libc::SIGCHLD),
            "SIGPOLL" => Some(libc::SIGIO),
            "SIGIOT" => Some(libc::SIGABRT),
            other => parse_signal(other),
        }
    };
    number.map(Some).ok_or_else(|| {
        Error::invalid_argument(format!(
            "CreateContainer: stop_signal {name} does not exist on Linux"
        ))
    })
}

/// The CRI `Signal` for a signal number, for `ContainerStatus.stop_signal`.
pub(super) fn to_cri(number: i32) -> Signal {
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    let name = if number == min {
        "SIGRTMIN".to_string()
    } else if number == max {
        "SIGRTMAX".to_string()
    } else if number > min && number <= min + 15 {
        format!("SIGRTMINPLUS{}", number - min)
    } else if number < max && number >= max - 14 {
        format!("SIGRTMAXMINUS{}", max - number)
    } else {
        match nix::sys::signal::Signal::try_from(number) {
            Ok(s) => s.as_str().to_string(),
            Err(_) => return Signal::RuntimeDefault,
        }
    };
    Signal::from_str_name(&format!("{SIGNAL_PREFIX}{name}")).unwrap_or(Signal::RuntimeDefault)
}

/// What cri-api v0.37 puts before each `Signal` value's name.
const SIGNAL_PREFIX: &str = "SIGNAL_";

/// `SIGQUIT`, `QUIT` or `3`.
pub(super) fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return Some(n);
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .ok()
        .map(|s| s as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("SIGQUIT"), Some(libc::SIGQUIT));
        assert_eq!(parse_signal("quit"), Some(libc::SIGQUIT));
        assert_eq!(parse_signal("9"), Some(9));
        assert_eq!(parse_signal("SIGNOPE"), None);
    }

    #[test]
    fn every_cri_signal_maps_to_a_linux_signal_and_back() {
        assert_eq!(from_cri(Signal::RuntimeDefault as i32).unwrap(), None);
        assert_eq!(
            from_cri(Signal::Sigusr1 as i32).unwrap(),
            Some(libc::SIGUSR1)
        );
        assert_eq!(
            from_cri(Signal::Sigterm as i32).unwrap(),
            Some(libc::SIGTERM)
        );
        assert_eq!(
            from_cri(Signal::Sigrtminplus3 as i32).unwrap(),
            Some(libc::SIGRTMIN() + 3)
        );
        assert_eq!(
            from_cri(Signal::Sigrtmaxminus2 as i32).unwrap(),
            Some(libc::SIGRTMAX() - 2)
        );
        assert_eq!(
            from_cri(999).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        for v in 1..=65 {
            let n = from_cri(v).unwrap_or_else(|e| panic!("{v}: {e}")).unwrap();
            let back = to_cri(n);
            // Aliases come back as the signal's own name.
            let same = back as i32 == v
                || matches!(
                    Signal::try_from(v).unwrap(),
                    Signal::Sigcld | Signal::Sigpoll | Signal::Sigiot
                );
            assert!(same, "{v} -> {n} -> {back:?}");
        }
        assert_eq!(to_cri(libc::SIGQUIT), Signal::Sigquit);
    }
}
