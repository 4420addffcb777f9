//! The user-data script that boots nodeup on an instance: pick the architecture, download the
//! nodeup binary from its mirrors with bounded retries, verify its sha256, write the BootConfig,
//! run nodeup. It carries no secrets and must fit the 16 KB EC2 user-data limit.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::versions::Arch;

/// EC2's user-data limit.
pub const MAX_USER_DATA_BYTES: usize = 16 * 1024;
/// Where the boot files live on the instance.
pub use keelson_api::host_paths::INSTALL_DIR;
/// Attempts over the whole mirror list before giving up (the instance then reports failure).
pub const DOWNLOAD_ROUNDS: u32 = 5;

/// The nodeup binary for one architecture: its sha256 and mirror URLs, first preferred.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeupAsset {
    pub sha256: String,
    pub urls: Vec<String>,
}

impl NodeupAsset {
    /// Parse `<sha256>@<url>[,<url>…]` ([`base::AssetRef`]); the URLs must be `http(s)://` and safe to
    /// write into a shell script unquoted.
    pub fn parse(text: &str) -> Result<NodeupAsset, String> {
        let asset: base::AssetRef = text.parse().map_err(|e: base::AssetRefError| e.to_string())?;
        for u in &asset.urls {
            let ok = (u.starts_with("https://") || u.starts_with("http://"))
                && u.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'\'' | b'"' | b'`' | b'$' | b'\\' | b','));
            if !ok {
                return Err(format!("{u:?}: expected an http(s) URL without quotes, '$', '`' or '\\\\'"));
            }
        }
        Ok(NodeupAsset { sha256: asset.sha256, urls: asset.urls })
    }
}

/// Why user-data could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum UserDataError {
    #[error("InstanceGroup/{group}: user-data is {size} bytes, over the {MAX_USER_DATA_BYTES}-byte limit")]
    TooLarge { group: String, size: usize },
    #[error("InstanceGroup/{group}: the boot config contains the heredoc terminator")]
    Terminator { group: String },
    #[error("InstanceGroup/{group}: spec.additionalUserData[{index}].{field}: {message}")]
    Part { group: String, index: usize, field: &'static str, message: String },
}

/// The MIME boundary between user-data parts (kOps uses the same).
pub const MIME_BOUNDARY: &str = "MIMEBOUNDARY";

/// Part types cloud-init understands.
const PART_TYPES: &[&str] = &[
    "text/x-shellscript",
    "text/cloud-config",
    "text/cloud-boothook",
    "text/x-include-url",
    "text/x-include-once-url",
    "text/part-handler",
    "text/upstart-job",
    "text/jinja2",
    "text/cloud-config-archive",
];

/// The user-data an instance gets: the boot script alone, or — with `additionalUserData` — a
/// MIME multipart message (the boot script first, then each part, as cloud-init expects); gzip
/// compressed with `compressUserData` (cloud-init unpacks it). Checked against the 16 KB limit.
pub fn package(group: &str, script: String, additional: &[keelson_api::UserData], compress: bool) -> Result<Vec<u8>, UserDataError> {
    let mut bytes = if additional.is_empty() {
        script.into_bytes()
    } else {
        let part_err = |index: usize, field: &'static str, message: String| UserDataError::Part { group: group.to_string(), index, field, message };
        let mut m = String::new();
        let _ = write!(m, "Content-Type: multipart/mixed; boundary=\"{MIME_BOUNDARY}\"\r\nMIME-Version: 1.0\r\n\r\n");
        let mut part = |ctype: &str, name: &str, content: &str| {
            let _ = write!(
                m,
                "--{MIME_BOUNDARY}\r\nContent-Disposition: attachment; filename=\"{name}\"\r\nContent-Transfer-Encoding: 7bit\r\nContent-Type: {ctype}\r\nMime-Version: 1.0\r\n\r\n{content}\r\n"
            );
        };
        part("text/x-shellscript", "nodeup.sh", &script);
        for (i, p) in additional.iter().enumerate() {
            let name = p.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| part_err(i, "name", "required".into()))?;
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
                return Err(part_err(i, "name", format!("{name:?}: letters, digits, '.', '_' and '-' only")));
            }
            let ctype = p.type_.clone().unwrap_or_default();
            if !PART_TYPES.contains(&ctype.as_str()) {
                return Err(part_err(i, "type", format!("{ctype:?}: expected one of {}", PART_TYPES.join(", "))));
            }
            let content = p.content.clone().unwrap_or_default();
            if content.contains(&format!("--{MIME_BOUNDARY}")) {
                return Err(part_err(i, "content", format!("must not contain the MIME boundary --{MIME_BOUNDARY}")));
            }
            part(&ctype, &name, &content);
        }
        let _ = write!(m, "--{MIME_BOUNDARY}--\r\n");
        m.into_bytes()
    };
    if compress {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        // Writing to a Vec cannot fail.
        let _ = std::io::Write::write_all(&mut gz, &bytes);
        bytes = gz.finish().unwrap_or_default();
    }
    if bytes.len() > MAX_USER_DATA_BYTES {
        return Err(UserDataError::TooLarge { group: group.to_string(), size: bytes.len() });
    }
    Ok(bytes)
}

const TERMINATOR: &str = "__KEELSON_BOOTCONFIG_EOF__";

/// Render the script for one instance group.
pub fn render(
    group: &str,
    cluster: &str,
    boot_config_yaml: &str,
    nodeup: &BTreeMap<Arch, NodeupAsset>,
    environment: &BTreeMap<String, String>,
) -> Result<String, UserDataError> {
    if boot_config_yaml.lines().any(|l| l == TERMINATOR) {
        return Err(UserDataError::Terminator { group: group.to_string() });
    }
    let mut s = String::new();
    let w = &mut s;
    // Writing to a String cannot fail.
    let _ = writeln!(w, "#!/bin/bash");
    let _ = writeln!(w, "# Keelson boot script for instance group {group} of cluster {cluster}.");
    let _ = writeln!(w, "# Generated by `keelson compile`; it downloads and verifies nodeup, then runs it.");
    let _ = writeln!(w, "set -o errexit -o nounset -o pipefail");
    let _ = writeln!(w);
    for arch in Arch::ALL {
        let upper = arch.as_str().to_ascii_uppercase();
        match nodeup.get(&arch) {
            Some(a) => {
                let _ = writeln!(w, "NODEUP_URLS_{upper}='{}'", a.urls.join(" "));
                let _ = writeln!(w, "NODEUP_SHA256_{upper}='{}'", a.sha256);
            }
            None => {
                let _ = writeln!(w, "NODEUP_URLS_{upper}=''");
                let _ = writeln!(w, "NODEUP_SHA256_{upper}=''");
            }
        }
    }
    let _ = writeln!(w, "INSTALL_DIR='{INSTALL_DIR}'");
    for (k, v) in environment {
        let _ = writeln!(w, "export {k}='{}'", v.replace('\'', "'\\''"));
    }
    let _ = write!(
        w,
        r#"
log() {{ echo "keelson-boot: $*" >&2; }}

case "$(uname -m)" in
  x86_64 | amd64) urls="${{NODEUP_URLS_AMD64}}"; want="${{NODEUP_SHA256_AMD64}}" ;;
  aarch64 | arm64) urls="${{NODEUP_URLS_ARM64}}"; want="${{NODEUP_SHA256_ARM64}}" ;;
  *) log "unsupported architecture $(uname -m)"; exit 1 ;;
esac
if [ -z "${{urls}}" ]; then
  log "no nodeup build for $(uname -m) in this cluster's user-data"
  exit 1
fi

sha256_of() {{ sha256sum "$1" | cut -d' ' -f1; }}

# Download $1 to $2 from the first mirror that serves a file with sha256 $3.
# Bounded: {DOWNLOAD_ROUNDS} rounds over all mirrors, backing off between rounds.
download_verified() {{
  local mirrors="$1" dest="$2" expected="$3" round url
  if [ -f "${{dest}}" ] && [ "$(sha256_of "${{dest}}")" = "${{expected}}" ]; then
    return 0
  fi
  for round in $(seq 1 {DOWNLOAD_ROUNDS}); do
    for url in ${{mirrors}}; do
      rm -f "${{dest}}.part"
      if curl -fsSL --connect-timeout 10 --max-time 300 -o "${{dest}}.part" "${{url}}"; then
        if [ "$(sha256_of "${{dest}}.part")" = "${{expected}}" ]; then
          mv -f "${{dest}}.part" "${{dest}}"
          return 0
        fi
        log "sha256 mismatch for ${{url}}: refusing it"
      else
        log "download failed: ${{url}}"
      fi
    done
    rm -f "${{dest}}.part"
    log "round ${{round}}/{DOWNLOAD_ROUNDS} failed; retrying in $((round * 5))s"
    sleep $((round * 5))
  done
  return 1
}}

mkdir -p "${{INSTALL_DIR}}/bin" "${{INSTALL_DIR}}/conf"
umask 077
cat > "${{INSTALL_DIR}}/conf/bootconfig.yaml" << '{TERMINATOR}'
{boot_config_yaml}{TERMINATOR}

if ! download_verified "${{urls}}" "${{INSTALL_DIR}}/bin/nodeup" "${{want}}"; then
  log "could not download a verified nodeup from: ${{urls}}"
  exit 1
fi
chmod 0755 "${{INSTALL_DIR}}/bin/nodeup"
log "nodeup verified (${{want}}); starting"
exec "${{INSTALL_DIR}}/bin/nodeup" --conf "${{INSTALL_DIR}}/conf/bootconfig.yaml"
"#
    );
    if s.len() > MAX_USER_DATA_BYTES {
        return Err(UserDataError::TooLarge { group: group.to_string(), size: s.len() });
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_assets() {
        let h = "a".repeat(64);
        let a = NodeupAsset::parse(&format!("{h}@https://a/nodeup,http://b/nodeup")).unwrap();
        assert_eq!(a.urls.len(), 2);
        assert!(NodeupAsset::parse("abc@https://a").is_err());
        assert!(NodeupAsset::parse(&format!("{h}@https://a/$(reboot)")).is_err());
        assert!(NodeupAsset::parse(&format!("{h}@")).is_err());
    }

    fn part(name: &str, ty: &str, content: &str) -> keelson_api::UserData {
        keelson_api::UserData { name: Some(name.into()), type_: Some(ty.into()), content: Some(content.into()) }
    }

    #[test]
    fn additional_parts_make_a_multipart_message_boot_script_first() {
        let script = "#!/bin/bash\necho boot\n".to_string();
        assert_eq!(package("g", script.clone(), &[], false).unwrap(), script.as_bytes());
        let out = package("g", script.clone(), &[part("extra.cfg", "text/cloud-config", "packages: [jq]")], false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("Content-Type: multipart/mixed; boundary=\"MIMEBOUNDARY\""), "{text}");
        let boot = text.find("filename=\"nodeup.sh\"").unwrap();
        let extra = text.find("filename=\"extra.cfg\"").unwrap();
        assert!(boot < extra);
        assert!(text.contains("Content-Type: text/cloud-config\r\nMime-Version: 1.0\r\n\r\npackages: [jq]\r\n"));
        assert!(text.ends_with("--MIMEBOUNDARY--\r\n"));
    }

    #[test]
    fn bad_parts_name_their_field() {
        let e = package("g", String::new(), &[part("x", "text/html", "")], false).unwrap_err().to_string();
        assert!(e.contains("InstanceGroup/g: spec.additionalUserData[0].type: \"text/html\""), "{e}");
        let e = package("g", String::new(), &[part("x", "text/x-shellscript", "--MIMEBOUNDARY")], false).unwrap_err().to_string();
        assert!(e.contains("additionalUserData[0].content"), "{e}");
    }

    #[test]
    fn compressed_user_data_is_gzip_of_the_message() {
        let script = "#!/bin/bash\n".repeat(2000);
        let gz = package("g", script.clone(), &[], true).unwrap();
        assert!(gz.starts_with(&[0x1f, 0x8b]) && gz.len() < script.len() / 10);
        let mut back = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut back).unwrap();
        assert_eq!(back, script);
    }

    #[test]
    fn refuses_oversized_scripts() {
        let big = "x: y\n".repeat(4000);
        let err = render("nodes", "c", &big, &BTreeMap::new(), &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("InstanceGroup/nodes: user-data is"), "{err}");
    }
}
