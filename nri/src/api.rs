//! NRI's messages (generated from `proto/nri.proto`), and the event mask plugins subscribe with.

include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));

/// The ttrpc service the plugin serves (the runtime calls it).
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The ttrpc service the runtime serves (the plugin calls it).
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

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
