//! An upstream manifest kept verbatim as a data file, which an addon's typed overlay edits: its
//! objects, and errors that name the file when it does not have what the overlay expects (a new
//! release with a different layout is an error, never a silently dropped setting).

use serde_json::Value;

/// The upstream file does not have what the overlay edits.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct UpstreamError {
    pub file: &'static str,
    pub message: String,
}

/// One upstream manifest: its path (relative to `spec-compiler/src/`) and its text.
#[derive(Debug, Clone, Copy)]
pub struct Upstream {
    pub file: &'static str,
    pub text: &'static str,
}

impl Upstream {
    pub fn error(&self, message: impl Into<String>) -> UpstreamError {
        UpstreamError { file: self.file, message: message.into() }
    }

    /// The file's objects, in its order (empty documents skipped).
    pub fn docs(&self) -> Result<Vec<Value>, UpstreamError> {
        let mut docs = Vec::new();
        for d in serde_yaml_ng::Deserializer::from_str(self.text) {
            let v = <Value as serde::Deserialize>::deserialize(d).map_err(|e| self.error(format!("not YAML: {e}")))?;
            if !v.is_null() {
                docs.push(v);
            }
        }
        Ok(docs)
    }

    /// The object of `kind` named `name`.
    pub fn find<'a>(&self, docs: &'a mut [Value], kind: &str, name: &str) -> Result<&'a mut Value, UpstreamError> {
        docs.iter_mut().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).ok_or_else(|| self.error(format!("no {kind} {name}")))
    }

    /// A kustomize base's objects as `kubectl kustomize` lists them (with no transformers): this
    /// file is the `kustomization.yaml`, `files` its resources; each resource named in
    /// `resources`, in that order, must be one of `files` (matched by file name).
    pub fn kustomize(&self, files: &[Upstream]) -> Result<Vec<Value>, UpstreamError> {
        let k = self.docs()?;
        let resources = k.first().and_then(|k| k["resources"].as_array()).ok_or_else(|| self.error("no resources list"))?;
        let mut out = Vec::new();
        for r in resources {
            let name = r.as_str().ok_or_else(|| self.error("a resource is not a string"))?.trim_start_matches("./");
            let file =
                files.iter().find(|f| f.file.rsplit('/').next() == Some(name)).ok_or_else(|| self.error(format!("resource {name} is not kept beside it")))?;
            out.extend(file.docs()?);
        }
        Ok(out)
    }

    /// The container `name` of a workload's pod template.
    pub fn container<'a>(&self, workload: &'a mut Value, name: &str) -> Result<&'a mut Value, UpstreamError> {
        let containers = workload["spec"]["template"]["spec"]["containers"].as_array_mut().ok_or_else(|| self.error("a pod template has no containers"))?;
        containers.iter_mut().find(|c| c["name"] == name).ok_or_else(|| self.error(format!("no {name} container")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_object_names_the_file() {
        let u = Upstream { file: "addons/x/y.yaml", text: "---\nkind: ConfigMap\nmetadata: {name: a}\n---\n" };
        let mut docs = u.docs().unwrap();
        assert_eq!(docs.len(), 1);
        assert!(u.find(&mut docs, "ConfigMap", "a").is_ok());
        assert_eq!(u.find(&mut docs, "Secret", "a").unwrap_err().to_string(), "addons/x/y.yaml: no Secret a");
        assert!(u.container(&mut docs[0], "c").unwrap_err().to_string().contains("no containers"));
        let k = Upstream { file: "addons/x/kustomization.yaml", text: "resources:\n- ./y.yaml\n- y.yaml\n" };
        assert_eq!(k.kustomize(&[u]).unwrap().len(), 2);
        let missing = Upstream { file: "addons/x/kustomization.yaml", text: "resources: [z.yaml]" };
        assert!(missing.kustomize(&[u]).unwrap_err().to_string().contains("z.yaml is not kept"));
        let bad = Upstream { file: "addons/x/z.yaml", text: "a: [" };
        assert!(bad.docs().unwrap_err().to_string().starts_with("addons/x/z.yaml: not YAML"));
    }
}
