//! What a run reports: the phase, each container's exit, the declared outputs and the tail of each
//! container's stdout.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use base64::Engine;
use serde::Serialize;

use super::manifest::Role;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Phase {
    Succeeded,
    Failed,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    pub phase: Phase,
    /// Why the run failed: `Error` (a container), `DeadlineExceeded` or `Interrupted`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The process exit code: 0 on success, else the failing container's code (1 if none).
    pub exit_code: i32,
    pub started_at: String,
    pub finished_at: String,
    pub containers: Vec<ContainerResult>,
    pub outputs: BTreeMap<String, OutputResult>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerResult {
    pub name: String,
    pub role: Role,
    /// None when the container never ran to an exit (not started, or still running when the run
    /// was cut short and could not be stopped).
    pub exit_code: Option<i32>,
    /// `Completed`, `Error`, `OOMKilled`, or `NotStarted`.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    pub restart_count: u32,
    /// The tail of the last attempt's stdout.
    pub stdout: String,
    pub stdout_truncated: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputResult {
    pub container: String,
    pub path: String,
    /// The file's content: UTF-8 text, or base64 when `encoding` says so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl OutputResult {
    pub fn new(container: &str, path: &str, read: Result<Vec<u8>, String>) -> Self {
        let (value, encoding, error) = match read {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => (Some(s), None, None),
                Err(e) => (
                    Some(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
                    Some("base64"),
                    None,
                ),
            },
            Err(e) => (None, None, Some(e)),
        };
        OutputResult {
            container: container.to_string(),
            path: path.to_string(),
            value,
            encoding,
            error,
        }
    }
}

/// RFC 3339 in UTC, from Unix nanoseconds; None for 0 (not happened).
pub fn timestamp(nanos: i64) -> Option<String> {
    (nanos > 0).then(|| {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(nanos as u64);
        humantime::format_rfc3339_millis(t).to_string()
    })
}

/// One parsed line of a CRI log file.
pub struct LogLine<'a> {
    pub stream: &'a str,
    /// False for a partial line (`P`): the next one continues it.
    pub full: bool,
    pub msg: &'a str,
}

/// Parse `<timestamp> <stream> <P|F> <message>`.
pub fn parse_log_line(line: &str) -> Option<LogLine<'_>> {
    let mut parts = line.splitn(4, ' ');
    let _ts = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let msg = parts.next().unwrap_or("");
    Some(LogLine {
        stream,
        full: !tag.starts_with('P'),
        msg,
    })
}

/// What of a CRI log file is read besides four times the tail kept: room for stderr lines
/// between the stdout ones.
const LOG_WINDOW: u64 = 4 << 20;

/// The last `max` bytes of the stdout recorded in a CRI log file, and whether it was cut.
/// The container's output sets the log's size, so only its last `LOG_WINDOW + 4 × max` bytes
/// are read (a log cut there counts as cut).
pub fn stdout_tail(path: &Path, max: usize) -> (String, bool) {
    use std::io::{Seek, SeekFrom};
    let window = LOG_WINDOW.saturating_add(4 * max as u64);
    let Ok(mut f) = std::fs::File::open(path) else {
        return (String::new(), false);
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(window);
    let mut raw = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.take(window).read_to_end(&mut raw).is_err() {
        return (String::new(), false);
    }
    let mut skipped = false;
    if from > 0 {
        // The first line is a part of one.
        let nl = raw
            .iter()
            .position(|&b| b == b'\n')
            .map_or(raw.len(), |i| i + 1);
        raw.drain(..nl);
        skipped = true;
    }
    let text = String::from_utf8_lossy(&raw);
    let mut out = String::new();
    for l in text.lines().filter_map(parse_log_line) {
        if l.stream == "stdout" {
            out.push_str(l.msg);
            if l.full {
                out.push('\n');
            }
        }
    }
    if out.len() <= max {
        return (out, skipped);
    }
    let mut cut = out.len() - max;
    while !out.is_char_boundary(cut) {
        cut += 1;
    }
    (out[cut..].to_string(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_tail_joins_partial_lines_and_skips_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.log");
        std::fs::write(
            &p,
            "2026-01-01T00:00:00Z stdout P hel\n2026-01-01T00:00:00Z stdout F lo\n\
             2026-01-01T00:00:00Z stderr F oops\n2026-01-01T00:00:00Z stdout F world\n",
        )
        .unwrap();
        assert_eq!(stdout_tail(&p, 100), ("hello\nworld\n".to_string(), false));
        assert_eq!(stdout_tail(&p, 6), ("world\n".to_string(), true));
    }

    #[test]
    fn outputs_that_are_not_text_are_base64() {
        let o = OutputResult::new("c", "/p", Ok(vec![0xff, 0]));
        assert_eq!(o.encoding, Some("base64"));
        assert_eq!(o.value.as_deref(), Some("/wA="));
        let o = OutputResult::new("c", "/p", Ok(b"3\n".to_vec()));
        assert_eq!((o.value.as_deref(), o.encoding), (Some("3\n"), None));
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(
            timestamp(1_700_000_000_123_000_000).as_deref(),
            Some("2023-11-14T22:13:20.123Z")
        );
        assert_eq!(timestamp(0), None);
    }
}
