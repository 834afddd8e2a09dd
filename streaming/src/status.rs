//! The `metav1.Status` JSON that protocol v4 and later write on the error stream.

use serde_json::json;

use crate::backend::Outcome;

/// The error stream's content for `outcome`: v4+ always write a Status (Success included);
/// older protocols write only an error's text.
pub fn error_stream_bytes(outcome: &Outcome, json_status: bool) -> Option<Vec<u8>> {
    let v = match (outcome, json_status) {
        (Ok(None) | Ok(Some(0)), false) => return None,
        (Ok(Some(code)), false) => {
            return Some(format!("command terminated with non-zero exit code: {code}").into_bytes())
        }
        (Err(e), false) => return Some(e.clone().into_bytes()),
        (Ok(None) | Ok(Some(0)), true) => json!({"metadata": {}, "status": "Success"}),
        (Ok(Some(code)), true) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit code {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        (Err(e), true) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("Internal error occurred: {e}"),
            "reason": "InternalError",
            "details": {"causes": [{"message": e}]},
            "code": 500,
        }),
    };
    Some(v.to_string().into_bytes())
}

/// The exit code a client reads back from a v4 status (0 for Success); None if unreadable.
pub fn exit_code_of(status: &[u8]) -> Option<i32> {
    let v: serde_json::Value = serde_json::from_slice(status).ok()?;
    match v["status"].as_str()? {
        "Success" => Some(0),
        _ => v["details"]["causes"]
            .as_array()?
            .iter()
            .find(|c| c["reason"] == "ExitCode")?["message"]
            .as_str()?
            .parse()
            .ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_the_exit_code() {
        let s = error_stream_bytes(&Ok(Some(3)), true).unwrap();
        assert_eq!(exit_code_of(&s), Some(3));
        let s = error_stream_bytes(&Ok(Some(0)), true).unwrap();
        assert_eq!(exit_code_of(&s), Some(0));
        assert!(error_stream_bytes(&Ok(Some(0)), false).is_none());
        let s = error_stream_bytes(&Err("no such container".into()), true).unwrap();
        assert!(String::from_utf8(s).unwrap().contains("no such container"));
    }
}
