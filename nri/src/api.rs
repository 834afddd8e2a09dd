//! NRI's messages (generated from `proto/nri.proto`), and the event mask plugins subscribe with.

include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));

/// The ttrpc service the plugin serves (the runtime calls it).
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The ttrpc service the runtime serves (the plugin calls it).
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// The NRI API level crishim speaks (the messages of `proto/nri.proto`), as both sides tell
/// each other.
pub const NRI_VERSION: &str = "v0.12.2";
/// The environment of a plugin the runtime launches: its name, its index, and the number of
/// the descriptor of its end of the connection.
pub const PLUGIN_NAME_ENV: &str = "NRI_PLUGIN_NAME";
pub const PLUGIN_IDX_ENV: &str = "NRI_PLUGIN_IDX";
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";
/// Longest plugin name crishim accepts (NRI sets none).
pub const MAX_PLUGIN_NAME: usize = 64;

/// A plugin's name as NRI allows it: `[a-zA-Z0-9_.+-]`, not empty; here also bounded.
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_PLUGIN_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid plugin name {:?}: 1 to {MAX_PLUGIN_NAME} of [a-zA-Z0-9_.+-]",
            crishim_sys::shown::shown(name)
        ))
    }
}

/// A plugin's index: two digits, as NRI requires.
pub fn check_plugin_index(idx: &str) -> Result<(), String> {
    if idx.len() == 2 && idx.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(format!(
            "invalid plugin index {:?}: two digits",
            crishim_sys::shown::shown(idx)
        ))
    }
}

/// The events a plugin subscribed to: bit `event - 1` for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventMask(pub i32);

impl EventMask {
    /// Every event a plugin may subscribe to.
    pub const VALID: EventMask = EventMask((1 << (Event::Last as i32 - 1)) - 1);

    pub fn of(events: &[Event]) -> EventMask {
        EventMask(events.iter().fold(0, |m, e| m | Self::bit(*e)))
    }

    fn bit(e: Event) -> i32 {
        match e as i32 {
            n @ 1..=31 => 1 << (n - 1),
            _ => 0,
        }
    }

    pub fn is_set(self, e: Event) -> bool {
        let b = Self::bit(e);
        b != 0 && self.0 & b == b
    }

    /// The bits that name no event.
    pub fn invalid(self) -> i32 {
        self.0 & !Self::VALID.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_and_indexes_are_nris_and_bounded() {
        for ok in ["a", "logger", "topology-aware_1.2+x"] {
            assert!(check_plugin_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(check_plugin_name(bad).is_err(), "{bad}");
        }
        assert!(check_plugin_index("07").is_ok());
        for bad in ["7", "007", "a1", ""] {
            assert!(check_plugin_index(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn masks_follow_nri_bit_numbering() {
        assert_eq!(EventMask::of(&[Event::RunPodSandbox]).0, 1);
        assert_eq!(EventMask::of(&[Event::CreateContainer]).0, 1 << 3);
        assert_eq!(EventMask::VALID.0, (1 << 14) - 1);
        assert!(EventMask::VALID.is_set(Event::ValidateContainerAdjustment));
        assert!(!EventMask::VALID.is_set(Event::Last));
        assert!(!EventMask::VALID.is_set(Event::Unknown));
        assert_eq!(EventMask(1 << 20).invalid(), 1 << 20);
        assert_eq!(EventMask::VALID.invalid(), 0);
    }
}
