//! The doors: one attack per row of `docs/security.md`'s table of trust boundaries, each tried
//! as the party that controls the input, against the real daemon. A module per boundary.

mod cri_logs;
mod gpu_request;
mod host_reads;
mod pidfd;
mod pod_files;
mod seccomp;
mod selinux;
mod userns;
