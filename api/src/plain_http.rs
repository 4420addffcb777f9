//! Plain `http://` for what carries the cluster's secrets or decides whom to trust — the state
//! store, the cloud APIs' endpoints, a Google credentials file's `token_uri` — is refused unless its
//! host is loopback (`127.0.0.0/8`, `::1`, `localhost`) or explicitly allowed: [`ALLOW_ENV`] lists
//! the hosts (IP addresses, CIDR blocks or names, comma-separated; `*` for any) that may be
//! reached without TLS, e.g. a local cloud's gateway in a test network. `https://` is always
//! accepted. (The instance metadata servers, link-local and plain HTTP by design, are not such
//! endpoints.)

use std::net::IpAddr;

/// The variable naming the hosts plain `http://` may reach besides loopback.
pub const ALLOW_ENV: &str = "KEELSON_ALLOW_PLAIN_HTTP";

/// A plain `http://` URL to a host neither loopback nor allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {url}: plain http:// is refused off loopback (use https://, or allow host {host} in {ALLOW_ENV})")]
pub struct PlainHttpRefused {
    pub what: String,
    pub url: String,
    pub host: String,
}

/// [`check_with`] the allow list in [`ALLOW_ENV`].
pub fn check(what: &str, url: &str) -> Result<(), PlainHttpRefused> {
    check_with(what, url, std::env::var(ALLOW_ENV).ok().as_deref())
}

/// `Ok` unless `url` is `http://` to a host that is neither loopback nor in `allow` (see the
/// module documentation); `what` names the setting in the error.
pub fn check_with(what: &str, url: &str, allow: Option<&str>) -> Result<(), PlainHttpRefused> {
    let trimmed = url.trim();
    let Some(rest) = trimmed.get(..7).filter(|s| s.eq_ignore_ascii_case("http://")).map(|_| &trimmed[7..]) else {
        return Ok(());
    };
    let host = host_of(rest);
    if is_loopback(&host) || allow.is_some_and(|a| allowed(&host, a)) {
        return Ok(());
    }
    Err(PlainHttpRefused { what: what.to_string(), url: url.to_string(), host })
}

/// The host of `authority[/path…]`: no user info, no port, no IPv6 brackets, lower case.
fn host_of(rest: &str) -> String {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let host =
        if let Some(v6) = authority.strip_prefix('[') { v6.split(']').next().unwrap_or_default() } else { authority.split(':').next().unwrap_or_default() };
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn allowed(host: &str, allow: &str) -> bool {
    let ip = host.parse::<IpAddr>().ok();
    allow.split(',').map(str::trim).filter(|e| !e.is_empty()).any(|entry| {
        if entry == "*" {
            return true;
        }
        if let (Some(ip), Some((net, bits))) = (ip, entry.split_once('/')) {
            return in_block(ip, net, bits);
        }
        entry.trim_end_matches('.').eq_ignore_ascii_case(host)
    })
}

fn in_block(ip: IpAddr, net: &str, bits: &str) -> bool {
    let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u32>()) else { return false };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if bits <= 32 => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if bits <= 128 => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_and_loopback_pass_anything_else_needs_the_allow_list() {
        for ok in [
            "https://bucket.example.com/c",
            "http://127.0.0.1:4566",
            "http://127.9.9.9/x",
            "http://localhost:8080/",
            "HTTP://LOCALHOST",
            "http://[::1]:9000/p",
            "http://user:pw@127.0.0.1:1/",
            "s3://bucket/c",
        ] {
            assert_eq!(check_with("x", ok, None), Ok(()), "{ok}");
        }
        for refused in
            ["http://10.80.0.1:4000", "http://state.example.com/c", "http://[fd00::1]:80/", "http://127.0.0.1.evil.example/", "http://localhost.evil/"]
        {
            let e = check_with("state store", refused, None).expect_err(refused);
            assert!(e.to_string().contains(ALLOW_ENV) && e.to_string().contains("state store") && e.to_string().contains(refused), "{e}");
        }
        let allow = Some("10.80.0.1, 172.20.0.0/16,mirror.test,fd00::/8");
        for ok in ["http://10.80.0.1:4000/compute", "http://172.20.255.254:4566", "http://MIRROR.test/x", "http://[fd00::5]/"] {
            assert_eq!(check_with("x", ok, allow), Ok(()), "{ok}");
        }
        for refused in ["http://10.80.0.2:4000", "http://172.21.0.1/", "http://other.test/", "http://[fe80::1]/"] {
            assert!(check_with("x", refused, allow).is_err(), "{refused}");
        }
        assert_eq!(check_with("x", "http://anything.example", Some("*")), Ok(()));
        assert!(check_with("x", "http://10.0.0.1", Some("10.0.0.0/abc,")).is_err(), "a bad entry allows nothing");
    }
}
