// TEMPORARY placeholder until the real module lands.
use crate::api;
use std::collections::HashMap;
pub struct ContainerMeta<'a> {
    pub id: &'a str,
    pub pod_sandbox_id: &'a str,
    pub name: &'a str,
    pub labels: &'a HashMap<String, String>,
    pub annotations: &'a HashMap<String, String>,
    pub created_at: i64,
}
pub fn container(_s: &oci_spec::runtime::Spec, m: &ContainerMeta<'_>) -> api::Container {
    api::Container {
        id: m.id.into(),
        ..Default::default()
    }
}
#[derive(Debug, Default)]
pub struct Applied {
    pub cdi_devices: Vec<String>,
}
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ApplyError(pub String);
pub fn apply(
    _s: &mut oci_spec::runtime::Spec,
    _a: &api::ContainerAdjustment,
) -> Result<Applied, ApplyError> {
    Ok(Applied::default())
}
