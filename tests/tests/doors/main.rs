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

use crishim_tests::pods::PodEnv;

/// ExecSync of a shell script in container `id`: (exit code, stdout then stderr).
async fn sh_in(env: &PodEnv, id: &str, script: &str) -> (i32, String) {
    let r = env
        .d
        .exec_sync(id, &["/bin/sh", "-c", script], 60)
        .await
        .unwrap_or_else(|e| panic!("ExecSync {script:?}: {e:?}"));
    (
        r.exit_code,
        format!(
            "{}{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        ),
    )
}
