//! `--attach`: follow every container's CRI log file and print its lines to stderr (stdout is
//! kept for the result), prefixed by the container's name.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::result::parse_log_line;

const POLL: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Followed {
    offset: u64,
    /// Bytes after the last newline.
    rest: Vec<u8>,
    /// A partial (`P`) message waiting for its end.
    partial: String,
}

/// A task printing the logs of a run as they are written.
pub struct Follower {
    done: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    pub fn start(log_dir: PathBuf) -> Self {
        let (done, watch) = tokio::sync::watch::channel(false);
        Follower {
            done,
            task: tokio::spawn(follow(log_dir, watch)),
        }
    }

    /// Print what is left and stop (before the log files go).
    pub async fn finish(self) {
        let _ = self.done.send(true);
        let _ = self.task.await;
    }
}

/// Follow `log_dir` (`<name>/<attempt>.log`) until `done` turns true, then print what is left.
async fn follow(log_dir: PathBuf, mut done: tokio::sync::watch::Receiver<bool>) {
    let mut files: HashMap<PathBuf, Followed> = HashMap::new();
    loop {
        let finished = *done.borrow();
        scan(&log_dir, &mut files);
        if finished {
            return;
        }
        let _ = tokio::time::timeout(POLL, done.changed()).await;
    }
}

fn scan(log_dir: &Path, files: &mut HashMap<PathBuf, Followed>) {
    let Ok(names) = std::fs::read_dir(log_dir) else {
        return;
    };
    let mut paths: Vec<(String, PathBuf)> = Vec::new();
    for n in names.flatten() {
        let name = n.file_name().to_string_lossy().into_owned();
        if let Ok(attempts) = std::fs::read_dir(n.path()) {
            paths.extend(attempts.flatten().map(|a| (name.clone(), a.path())));
        }
    }
    paths.sort();
    let mut err = std::io::stderr().lock();
    for (name, path) in paths {
        let f = files.entry(path.clone()).or_default();
        let Ok(mut file) = std::fs::File::open(&path) else {
            continue;
        };
        if file.seek(SeekFrom::Start(f.offset)).is_err() {
            continue;
        }
        let mut buf = Vec::new();
        if file.read_to_end(&mut buf).is_err() {
            continue;
        }
        f.offset += buf.len() as u64;
        f.rest.extend_from_slice(&buf);
        let Some(end) = f.rest.iter().rposition(|b| *b == b'\n') else {
            continue;
        };
        let complete: Vec<u8> = f.rest.drain(..=end).collect();
        for line in String::from_utf8_lossy(&complete).lines() {
            let Some(l) = parse_log_line(line) else {
                continue;
            };
            f.partial.push_str(l.msg);
            if l.full {
                let _ = writeln!(err, "[{name}] {}", f.partial);
                f.partial.clear();
            }
        }
    }
}
