//! Placeholder: filled in by this boundary's tests.
