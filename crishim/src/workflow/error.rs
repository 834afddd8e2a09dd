//! The run's error, in its own module so that the parts of the run can use it without importing
//! `workflow` itself, which imports them all.

#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error("{0} is not supported by crishim run")]
    Unsupported(String),
    #[error("invalid manifest: {0}")]
    Invalid(String),
    #[error("{0}")]
    Setup(String),
}
