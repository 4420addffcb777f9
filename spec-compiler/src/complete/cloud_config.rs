//! `spec.cloudConfig` defaults (kOps `pkg/model/components/cloudconfiguration.go` and
//! `awsebscsidriver.go`): whether the cluster's StorageClasses are managed, and on AWS the EBS CSI
//! driver's version.
//!
//! Like kOps' completed specs, `awsEBSCSIDriver` shows only its `version`: an unset `enabled` means
//! enabled (kOps' documented default; its validation forbids `false`).

use keelson_api::ClusterSpec;

use super::{default, Cloud, Context, Derived};
use crate::versions::AWS_EBS_CSI_DRIVER_VERSION;

pub fn build(ctx: &Context, _d: &Derived, spec: &mut ClusterSpec) {
    let c = spec.cloud_config.get_or_insert_with(Default::default);
    // A user's OpenStack `createStorageClass` is adopted so the two settings cannot disagree.
    let openstack = c.openstack.as_ref().and_then(|o| o.block_storage.as_ref()).and_then(|b| b.create_storage_class);
    default(&mut c.manage_storage_classes, openstack.unwrap_or(true));
    if ctx.cloud == Cloud::Aws {
        let ebs = c.aws_ebscsi_driver.get_or_insert_with(Default::default);
        default(&mut ebs.version, AWS_EBS_CSI_DRIVER_VERSION.to_string());
    }
}
