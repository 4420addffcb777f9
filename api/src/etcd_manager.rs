//! The etcd-manager settings protokube honours beyond the typed fields: kOps' documented way to
//! set backup retention through the manager's environment (`manager.env`,
//! `ETCD_MANAGER_HOURLY_BACKUPS_RETENTION` and `ETCD_MANAGER_DAILY_BACKUPS_RETENTION`, read as
//! etcd-manager reads them). One reader for `keelson validate` and the compiler.

use std::time::Duration;

use crate::EtcdManagerSpec;

/// How long every hourly backup is kept: etcd-manager's default, and protokube's.
pub const DEFAULT_HOURLY_RETENTION: Duration = Duration::from_secs(7 * 86_400);
/// etcd-manager's variable for how long hourly backups are kept.
pub const HOURLY_ENV: &str = "ETCD_MANAGER_HOURLY_BACKUPS_RETENTION";
/// etcd-manager's variable for how long daily backups are kept (kOps sets it from
/// `backupRetentionDays`; a value in `env` comes later in the container and wins).
pub const DAILY_ENV: &str = "ETCD_MANAGER_DAILY_BACKUPS_RETENTION";

/// etcd-manager's `ParseHumanDuration`: `Ny` (a year is 365 days), `Nd` (24 hours), or a Go
/// duration (`36h`, `90m`). `None` when it is none of these or negative.
pub fn parse_human_duration(s: &str) -> Option<Duration> {
    let days = |n: &str, per: u64| n.parse::<u64>().ok().and_then(|n| n.checked_mul(per * 86_400)).map(Duration::from_secs);
    if let Some(n) = s.strip_suffix('y') {
        return days(n, 365);
    }
    if let Some(n) = s.strip_suffix('d') {
        return days(n, 1);
    }
    let go: crate::Duration = s.parse().ok()?;
    u64::try_from(go.as_nanos()).ok().map(Duration::from_nanos)
}

/// The retention `manager.env` asks for; `None`: not set there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnvRetention {
    pub hourly: Option<Duration>,
    /// Whole days (protokube keeps daily backups by the day).
    pub daily_days: Option<u64>,
}

/// Read `manager.env`. An error names the entry (`env[NAME]`, relative to the manager) and what
/// was expected: a variable protokube has no use for is refused, never passed over silently.
pub fn env_retention(manager: &EtcdManagerSpec) -> Result<EnvRetention, (String, String)> {
    let mut out = EnvRetention::default();
    for (i, var) in manager.env.iter().flatten().enumerate() {
        let name = var.name.as_deref().unwrap_or_default();
        let at = if name.is_empty() { format!("env[{i}]") } else { format!("env[{name}]") };
        let value = var.value.as_deref().unwrap_or_default();
        let parsed = || {
            parse_human_duration(value).ok_or_else(|| (format!("{at}.value"), format!("{value:?}: expected a duration as etcd-manager reads it (7d, 1y, 36h)")))
        };
        match name {
            HOURLY_ENV => out.hourly = Some(parsed()?),
            DAILY_ENV => {
                let d = parsed()?;
                if d.as_secs() % 86_400 != 0 || d.subsec_nanos() != 0 {
                    return Err((format!("{at}.value"), format!("{value:?}: protokube keeps daily backups by the day; expected whole days (7d, 1y, 48h)")));
                }
                out.daily_days = Some(d.as_secs() / 86_400);
            }
            _ => {
                return Err((
                    at,
                    format!("Keelson runs etcd from protokube, not etcd-manager: of etcd-manager's environment it honours {HOURLY_ENV} and {DAILY_ENV} only"),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EnvVar;

    fn manager(env: &[(&str, &str)]) -> EtcdManagerSpec {
        EtcdManagerSpec { env: Some(env.iter().map(|(n, v)| EnvVar { name: Some(n.to_string()), value: Some(v.to_string()) }).collect()), ..Default::default() }
    }

    #[test]
    fn human_durations_read_as_etcd_manager_reads_them() {
        assert_eq!(parse_human_duration("1y"), Some(Duration::from_secs(365 * 86_400)));
        assert_eq!(parse_human_duration("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_human_duration("36h"), Some(Duration::from_secs(36 * 3600)));
        assert_eq!(parse_human_duration("1h30m"), Some(Duration::from_secs(5400)));
        for bad in ["", "d", "1.5d", "-1d", "seven days", "-3h", "1w"] {
            assert_eq!(parse_human_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_two_retention_variables_are_read_and_every_other_is_refused_by_name() {
        assert_eq!(env_retention(&manager(&[])), Ok(EnvRetention::default()));
        assert_eq!(
            env_retention(&manager(&[(HOURLY_ENV, "1d"), (DAILY_ENV, "1y")])),
            Ok(EnvRetention { hourly: Some(Duration::from_secs(86_400)), daily_days: Some(365) })
        );
        assert_eq!(env_retention(&manager(&[(DAILY_ENV, "48h")])).map(|r| r.daily_days), Ok(Some(2)));
        let (path, message) = env_retention(&manager(&[(DAILY_ENV, "36h")])).unwrap_err();
        assert_eq!(path, format!("env[{DAILY_ENV}].value"));
        assert!(message.contains("whole days"), "{message}");
        let (path, _) = env_retention(&manager(&[(HOURLY_ENV, "soon")])).unwrap_err();
        assert_eq!(path, format!("env[{HOURLY_ENV}].value"));
        let (path, message) = env_retention(&manager(&[("ETCD_LISTEN_METRICS_URLS", "http://0.0.0.0:8081")])).unwrap_err();
        assert_eq!(path, "env[ETCD_LISTEN_METRICS_URLS]");
        assert!(message.contains(HOURLY_ENV) && message.contains(DAILY_ENV), "{message}");
    }
}
