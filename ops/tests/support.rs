//! What the ops moto tests share.

use std::time::Duration;

use ops::rolling::RollingOptions;

/// Rolling options with fast waits for moto (whose state changes are instantaneous).
pub fn fast() -> RollingOptions {
    RollingOptions {
        control_plane_interval: Duration::ZERO,
        node_interval: Duration::ZERO,
        bastion_interval: Duration::ZERO,
        post_drain_delay: Duration::ZERO,
        poll: Duration::from_millis(50),
        validate_tick: Duration::from_millis(50),
        validate_success_pause: Duration::ZERO,
        validation_timeout: Duration::from_secs(20),
        eviction_retry: Duration::from_millis(20),
        ..Default::default()
    }
}
