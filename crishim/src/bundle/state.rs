//! `crishim bundle state`: the OCI runtime state, shaped as `runc state` prints it.

use std::path::PathBuf;

use crishim_proto::shim::{ContainerState, Status};
use serde::Serialize;

use super::store::BundleRecord;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OciState {
    pub oci_version: String,
    pub id: String,
    /// 0 once stopped.
    pub pid: i32,
    /// `created`, `running` or `stopped`.
    pub status: &'static str,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    /// RFC 3339, UTC.
    pub created: String,
    pub owner: String,
}

impl OciState {
    /// From the record and what the shim reports (or last recorded); `None`: nothing is known,
    /// so nothing runs.
    pub fn new(record: &BundleRecord, shim: Option<&ContainerState>) -> OciState {
        let (status, pid) = match shim {
            Some(s) => match s.status {
                Status::Created => ("created", s.pid),
                Status::Running => ("running", s.pid),
                Status::Exited | Status::Unknown => ("stopped", 0),
            },
            None => ("stopped", 0),
        };
        let created = shim
            .map(|s| s.created_at)
            .filter(|&t| t > 0)
            .unwrap_or(record.created);
        OciState {
            oci_version: record.oci_version.clone(),
            id: record.id.clone(),
            pid,
            status,
            bundle: record.bundle.clone(),
            rootfs: record.rootfs.clone(),
            created: rfc3339(created),
            owner: String::new(),
        }
    }
}

/// Unix nanoseconds as `2006-01-02T15:04:05.999999999Z`.
pub fn rfc3339(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let frac = nanos.rem_euclid(1_000_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339(951_782_400_123_456_789),
            "2000-02-29T00:00:00.123456789Z"
        );
        assert_eq!(
            rfc3339(1_700_000_000_000_000_000),
            "2023-11-14T22:13:20.000000000Z"
        );
    }

    #[test]
    fn statuses_as_runc_names_them() {
        let record = BundleRecord {
            id: "a".into(),
            bundle: "/b".into(),
            rootfs: "/b/rootfs".into(),
            oci_version: "1.0.2".into(),
            created: 5,
            log: None,
        };
        let mut s = ContainerState::new("a", Status::Running, 42, 0);
        let st = OciState::new(&record, Some(&s));
        assert_eq!((st.status, st.pid), ("running", 42));
        assert_eq!(st.created, rfc3339(5));
        s.status = Status::Exited;
        assert_eq!(OciState::new(&record, Some(&s)).pid, 0);
        let json = serde_json::to_value(OciState::new(&record, None)).unwrap();
        assert_eq!(json["status"], "stopped");
        assert_eq!(json["ociVersion"], "1.0.2");
        assert_eq!(json["bundle"], "/b");
    }
}
