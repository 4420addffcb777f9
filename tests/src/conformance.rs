//! `keelson-local conformance`: the upstream Kubernetes end-to-end suite's `[Conformance]` tests
//! against the local cluster (docs/conformance.md).
//!
//! The suite (`e2e.test`), the ginkgo CLI and agnhost are built from the cluster's Kubernetes
//! version by `tests/kubernetes/build-e2e.sh`; the images its tests run are built and pushed into
//! the local registry by `images.sh conformance-images`, and `images.sh conformance-repo-list`
//! points the suite at them (`KUBE_TEST_REPO_LIST`). By default a named focused set
//! ([`FOCUSED`]) runs: the `[Conformance]` tests of what Keelson sets up. `--full` runs every
//! `[Conformance]` test.
//!
//! The pure parts — the focus expression ([`focus_regex`]), the JUnit summary ([`Summary::parse`])
//! and the progress count ([`progress`]) — are separate from the run ([`run`]).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster;
use crate::kubernetes;

/// The focused set: the `[Conformance]` tests of what Keelson sets up — API machinery basics, DNS
/// for services and pods, Service ClusterIP/NodePort reachability, pod networking across nodes,
/// Secret/ConfigMap volumes, the kubelet's exec and logs, service-account tokens and access
/// reviews, DaemonSet and Deployment rollouts. Exactly the names of upstream's
/// `test/conformance/testdata/conformance.yaml` (1.34).
pub const FOCUSED: &[&str] = &[
    // API machinery
    "[sig-api-machinery] Discovery should validate PreferredVersion for each APIGroup [Conformance]",
    "[sig-api-machinery] Watchers should observe add, update, and delete watch notifications on configmaps [Conformance]",
    "[sig-api-machinery] Watchers should be able to start watching from a specific resource version [Conformance]",
    "[sig-node] ConfigMap should run through a ConfigMap lifecycle [Conformance]",
    // DNS
    "[sig-network] DNS should provide DNS for the cluster [Conformance]",
    "[sig-network] DNS should provide DNS for services [Conformance]",
    "[sig-network] DNS should provide DNS for pods for Hostname [Conformance]",
    "[sig-network] DNS should resolve DNS of partial qualified names for services [LinuxOnly] [Conformance]",
    // Services
    "[sig-network] Services should provide secure master service [Conformance]",
    "[sig-network] Services should serve a basic endpoint from pods [Conformance]",
    "[sig-network] Services should serve multiport endpoints from pods [Conformance]",
    "[sig-network] Services should be able to create a functioning NodePort service [Conformance]",
    "[sig-network] Services should be able to change the type from ExternalName to ClusterIP [Conformance]",
    // pod networking
    "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http [NodeConformance] [Conformance]",
    "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: udp [NodeConformance] [Conformance]",
    "[sig-network] Networking Granular Checks: Pods should function for node-pod communication: http [LinuxOnly] [NodeConformance] [Conformance]",
    // Secret and ConfigMap volumes
    "[sig-storage] Secrets should be consumable from pods in volume [NodeConformance] [Conformance]",
    "[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance] [Conformance]",
    "[sig-storage] ConfigMap updates should be reflected in volume [NodeConformance] [Conformance]",
    "[sig-node] Secrets should be consumable from pods in env vars [NodeConformance] [Conformance]",
    // kubelet: pods, exec, logs
    "[sig-node] Pods should get a host IP [NodeConformance] [Conformance]",
    "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
    "[sig-node] Pods should support remote command execution over websockets [NodeConformance] [Conformance]",
    "[sig-node] Pods should support retrieving logs from the container over websockets [NodeConformance] [Conformance]",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs [NodeConformance] [Conformance]",
    // RBAC and service accounts
    "[sig-auth] ServiceAccounts should mount an API token into pods [Conformance]",
    "[sig-auth] ServiceAccounts should guarantee kube-root-ca.crt exist in any namespace [Conformance]",
    "[sig-auth] SubjectReview should support SubjectReview API operations [Conformance]",
    // DaemonSet and Deployment
    "[sig-apps] Daemon set [Serial] should run and stop simple daemon [Conformance]",
    "[sig-apps] Daemon set [Serial] should update pod when spec was updated and update strategy is RollingUpdate [Conformance]",
    "[sig-apps] Deployment RollingUpdateDeployment should delete old pods and create new ones [Conformance]",
    "[sig-apps] Deployment deployment should support rollover [Conformance]",
];

/// What every run leaves out: tests of features a local cluster does not have, whatever the focus.
pub const DEFAULT_SKIP: &str = r"\[Disruptive\]|\[Flaky\]|\[Feature:";

/// The suite-wide timeout when none is given: the focused set on 2 loaded cores takes tens of minutes.
pub const DEFAULT_TIMEOUT_SECS: u64 = 2700;

/// A Go (RE2) regular expression matching these test names (metacharacters escaped), each to the
/// end. Not anchored at the start: ginkgo matches the focus against the suite's description, a
/// space, then the test's text.
pub fn focus_regex(names: &[&str]) -> String {
    names.iter().map(|n| format!(" {}$", escape(n))).collect::<Vec<_>>().join("|")
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One failed test (or suite node) of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub name: String,
    /// The first non-empty line of the failure (its message, else its text).
    pub first_line: String,
}

/// A JUnit report as the summary line counts it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    /// Selected but skipped while running (a `Skip(reason)`: "skipped - REASON").
    pub skipped: usize,
    /// `[Conformance]` tests in the suite that the focus did not select.
    pub not_selected: usize,
    /// Failed `[Conformance]` tests, in report order.
    pub failures: Vec<Failure>,
    /// Failed suite nodes (`[SynchronizedBeforeSuite]`, `[ReportAfterSuite]`, …): no test ran right.
    pub suite_failures: Vec<Failure>,
    /// Every `[Conformance]` test name the report holds (to check the focused names exist).
    pub names: BTreeSet<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a JUnit report: {message}")]
    Parse { path: PathBuf, message: String },
}

#[derive(serde::Deserialize)]
struct XmlSuites {
    #[serde(rename = "testsuite", default)]
    suites: Vec<XmlSuite>,
}

#[derive(serde::Deserialize)]
struct XmlSuite {
    #[serde(rename = "testcase", default)]
    cases: Vec<XmlCase>,
}

#[derive(serde::Deserialize)]
struct XmlCase {
    #[serde(rename = "@name")]
    name: String,
    #[serde(rename = "@status", default)]
    status: String,
    #[serde(default)]
    failure: Option<XmlDetail>,
    #[serde(default)]
    error: Option<XmlDetail>,
    #[serde(default)]
    skipped: Option<XmlDetail>,
}

#[derive(serde::Deserialize)]
struct XmlDetail {
    #[serde(rename = "@message", default)]
    message: String,
    #[serde(rename = "$text", default)]
    text: String,
}

impl Summary {
    /// Count a ginkgo JUnit report (`junit_01.xml` of the suite's `--report-dir`). A test case's
    /// name is `[It] FULL TEXT`; only names with `[Conformance]` count. Ginkgo reports every test
    /// of the suite: one the focus left out is `skipped` with the bare message "skipped".
    pub fn parse(xml: &str) -> Result<Summary, String> {
        let doc: XmlSuites = quick_xml::de::from_str(xml).map_err(|e| e.to_string())?;
        let mut s = Summary::default();
        for case in doc.suites.iter().flat_map(|suite| suite.cases.iter()) {
            let name = case.name.strip_prefix("[It] ").unwrap_or(&case.name).to_string();
            let failed_detail = case.failure.as_ref().or(case.error.as_ref());
            let state = if case.status.is_empty() {
                // Reports without a status attribute (other JUnit writers) say it by element.
                match (failed_detail, &case.skipped) {
                    (Some(_), _) => "failed",
                    (None, Some(_)) => "skipped",
                    (None, None) => "passed",
                }
            } else {
                case.status.as_str()
            };
            let failed = !matches!(state, "passed" | "skipped" | "pending");
            if !name.contains("[Conformance]") {
                if failed {
                    s.suite_failures.push(Failure { name, first_line: first_line(failed_detail) });
                }
                continue;
            }
            s.names.insert(name.clone());
            match state {
                "passed" => s.passed += 1,
                "skipped" | "pending" => {
                    let message = case.skipped.as_ref().map(|d| d.message.trim()).unwrap_or("");
                    if message == "skipped" || message == "pending" || state == "pending" {
                        s.not_selected += 1;
                    } else {
                        s.skipped += 1;
                    }
                }
                _ => {
                    s.failed += 1;
                    s.failures.push(Failure { name, first_line: first_line(failed_detail) });
                }
            }
        }
        Ok(s)
    }

    pub fn read(path: &Path) -> Result<Summary, ReportError> {
        let text = fs::read_to_string(path).map_err(|source| ReportError::Read { path: path.to_path_buf(), source })?;
        Summary::parse(&text).map_err(|message| ReportError::Parse { path: path.to_path_buf(), message })
    }

    /// Tests that ran (or were skipped while running): the T of the summary line.
    pub fn total(&self) -> usize {
        self.passed + self.failed + self.skipped
    }

    /// `conformance: P passed, F failed, S skipped of T [Conformance] tests (focus …)`.
    pub fn line(&self, focus: &str) -> String {
        format!("conformance: {} passed, {} failed, {} skipped of {} [Conformance] tests ({focus})", self.passed, self.failed, self.skipped, self.total())
    }

    /// Whether the run counts as a pass: something ran and nothing failed.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.suite_failures.is_empty() && self.passed > 0
    }
}

fn first_line(detail: Option<&XmlDetail>) -> String {
    let Some(d) = detail else { return String::new() };
    [d.message.as_str(), d.text.as_str()].iter().flat_map(|t| t.lines()).map(str::trim).find(|l| !l.is_empty()).unwrap_or("").to_string()
}

/// Ginkgo's console output so far, as (specs finished, specs failed): each finished spec prints
/// one `•` (a failed one `•` followed by a `[FAIL]`/`[FAILED]` block); skipped specs print `S`
/// only in verbose runs, so they are not counted.
pub fn progress(log: &str) -> (usize, usize) {
    let done = log.matches('•').count();
    let failed = log
        .lines()
        .filter(|l| l.trim_start().starts_with("• [FAILED]") || l.trim_start().starts_with("• [PANICKED]") || l.trim_start().starts_with("• [TIMEDOUT]"))
        .count();
    (done, failed)
}

/// The options of one run (the command line's).
#[derive(Debug, Clone)]
pub struct Options {
    /// Bring this spec up first (and down after, unless `keep_up`); else use the running cluster.
    pub spec: Option<PathBuf>,
    pub focus: Option<String>,
    pub skip: Option<String>,
    pub full: bool,
    pub nodes: u32,
    pub timeout: Duration,
    pub up_timeout: Duration,
    pub report_dir: Option<PathBuf>,
    pub keep_up: bool,
    /// Run `[Disruptive]` tests too (they taint nodes and evict pods: a cluster made for the run).
    pub disruptive: bool,
}

/// The ginkgo skip: [`DEFAULT_SKIP`] (without `[Disruptive]` when those are asked for) and the user's.
pub fn skip_regex(user: Option<&str>, disruptive: bool) -> String {
    let default = if disruptive { DEFAULT_SKIP.replace(r"\[Disruptive\]|", "") } else { DEFAULT_SKIP.to_string() };
    match user {
        Some(s) => format!("{default}|{s}"),
        None => default,
    }
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub summary: Summary,
    pub focus_label: String,
    /// Focused names the suite does not have (a renamed test: the list needs updating).
    pub missing: Vec<String>,
    pub elapsed: Duration,
    pub report: PathBuf,
}

/// `keelson-local conformance`: build (cached) what the suite needs, run it against the local
/// cluster, summarise its JUnit report.
pub fn run(opts: &Options) -> anyhow::Result<Outcome> {
    let result = match &opts.spec {
        Some(spec) => {
            let t0 = Instant::now();
            cluster::up(spec, opts.up_timeout).and_then(|()| {
                eprintln!("keelson-local: conformance: {} up in {:.0} s", spec.display(), t0.elapsed().as_secs_f64());
                run_suite(opts)
            })
        }
        None => run_suite(opts),
    };
    if opts.spec.is_some() && !opts.keep_up {
        match cluster::down() {
            Ok(_) => eprintln!("keelson-local: conformance: cluster down"),
            Err(e) => eprintln!("keelson-local: conformance: down failed: {e:#}"),
        }
    }
    result
}

fn run_suite(opts: &Options) -> anyhow::Result<Outcome> {
    let cs = cluster::commands::running_cluster()?;
    let st = cluster::commands::state();
    let version = cluster::ClusterVersions::read(&st.compiled_dir().join("cluster-completed.yaml"))?.kubernetes;
    eprintln!("keelson-local: conformance: building the e2e suite of Kubernetes v{version} (cached after the first run)");
    let bin = kubernetes::e2e_suite(&version)?;
    eprintln!("keelson-local: conformance: the suite's images into the registry at {}", cs.registry);
    kubernetes::conformance_images(&version, &cs.registry)?;
    let report_dir = match &opts.report_dir {
        Some(d) => d.clone(),
        None => st.root.join("conformance"),
    };
    // A report left by an earlier run must not be read as this one's.
    if report_dir.exists() {
        fs::remove_dir_all(&report_dir).with_context(|| format!("clearing {}", report_dir.display()))?;
    }
    fs::create_dir_all(&report_dir).with_context(|| format!("creating {}", report_dir.display()))?;
    let repo_list = kubernetes::conformance_repo_list(&cs.registry, &report_dir.join("repo-list.yaml"))?;

    let (focus, focus_label) = match (&opts.focus, opts.full) {
        (Some(f), _) => (f.clone(), format!("focus {f}")),
        (None, true) => (r"\[Conformance\]".to_string(), "focus: every [Conformance] test".to_string()),
        (None, false) => (focus_regex(FOCUSED), format!("focus: the focused set of {}", FOCUSED.len())),
    };
    let skip = skip_regex(opts.skip.as_deref(), opts.disruptive);
    let log_path = report_dir.join("ginkgo.log");
    let log = fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut command = Command::new(bin.join("ginkgo"));
    command
        .arg(format!("--nodes={}", opts.nodes.max(1)))
        .arg(format!("--focus={focus}"))
        .arg(format!("--skip={skip}"))
        .arg(format!("--timeout={}s", opts.timeout.as_secs()))
        .arg("--no-color")
        .arg(bin.join("e2e.test"))
        .arg("--")
        .arg(format!("--kubeconfig={}", cs.kubeconfig))
        .arg(format!("--kubectl-path={}", cs.kubectl))
        .arg("--provider=skeleton")
        .arg(format!("--report-dir={}", report_dir.display()))
        .env("KUBE_TEST_REPO_LIST", &repo_list)
        .env("KUBECONFIG", &cs.kubeconfig)
        .current_dir(&report_dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    eprintln!(
        "keelson-local: conformance: running the suite ({focus_label}, {} parallel nodes, timeout {} s); log {}",
        opts.nodes.max(1),
        opts.timeout.as_secs(),
        log_path.display()
    );
    let t0 = Instant::now();
    let mut child = command.spawn().with_context(|| format!("starting {}", bin.join("ginkgo").display()))?;
    // Ginkgo stops the suite at --timeout; the hard limit is for a ginkgo that does not.
    let hard_limit = opts.timeout + Duration::from_secs(300);
    let mut last = (usize::MAX, usize::MAX);
    let mut last_print = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if t0.elapsed() > hard_limit {
            crate::cmd::kill(-(child.id() as i64), "KILL");
            let _ = child.wait();
            bail!("the suite ran past its timeout ({} s) and 300 s more; killed (log {})", opts.timeout.as_secs(), log_path.display());
        }
        let now = progress(&fs::read_to_string(&log_path).unwrap_or_default());
        if now != last || last_print.elapsed() > Duration::from_secs(120) {
            eprintln!("keelson-local: conformance: {} tests finished ({} failed) after {:.0} s", now.0, now.1, t0.elapsed().as_secs_f64());
            last = now;
            last_print = Instant::now();
        }
        std::thread::sleep(Duration::from_secs(5));
    };
    let elapsed = t0.elapsed();
    let report = report_dir.join("junit_01.xml");
    let summary = Summary::read(&report).with_context(|| format!("ginkgo exited {status}; its output is in {}", log_path.display()))?;
    let missing =
        if opts.focus.is_none() && !opts.full { FOCUSED.iter().filter(|n| !summary.names.contains(**n)).map(|n| n.to_string()).collect() } else { Vec::new() };
    Ok(Outcome { summary, focus_label, missing, elapsed, report })
}

/// What `keelson-local conformance` prints (the summary line last but for the failures).
pub fn render(o: &Outcome) -> String {
    let mut out = String::new();
    for n in &o.missing {
        out.push_str(&format!("conformance: the focused test {n:?} is not in this suite (renamed upstream?)\n"));
    }
    out.push_str(&o.summary.line(&o.focus_label));
    out.push_str(&format!(" in {:.0} s; report {}\n", o.elapsed.as_secs_f64(), o.report.display()));
    for f in o.summary.suite_failures.iter().chain(o.summary.failures.iter()) {
        out.push_str(&format!("FAILED {}\n  {}\n", f.name, f.first_line));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skip_keeps_disruptive_tests_out_unless_asked() {
        assert_eq!(skip_regex(None, false), DEFAULT_SKIP);
        assert_eq!(skip_regex(Some("Slow"), false), format!("{DEFAULT_SKIP}|Slow"));
        let with = skip_regex(None, true);
        assert!(!with.contains("Disruptive") && with.contains(r"\[Flaky\]") && with.contains(r"\[Feature:"), "{with}");
    }

    const REPORT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
  <testsuites tests="6" disabled="3" errors="0" failures="1" time="12.5">
      <testsuite name="Kubernetes e2e suite" package="/tmp" tests="6" disabled="0" skipped="3" errors="0" failures="1" time="12.5" timestamp="2026-12-02T19:00:00">
          <properties>
              <property name="SuiteSucceeded" value="false"></property>
          </properties>
          <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.0"></testcase>
          <testcase name="[It] [sig-network] DNS should provide DNS for services [Conformance]" classname="Kubernetes e2e suite" status="passed" time="3.0"></testcase>
          <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" classname="Kubernetes e2e suite" status="failed" time="5.0">
              <failure type="failed">[FAILED] timed out waiting for the condition &lt;endpoints&gt;&#xA;In [It] at: service.go:123 @ 12/02/26 19:00:05.000&#xA;</failure>
              <system-err>some log</system-err>
          </testcase>
          <testcase name="[It] [sig-node] Pods should get a host IP [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
          <testcase name="[It] [sig-storage] Secrets should be consumable from pods in volume [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0.1">
              <skipped message="skipped - only on providers [gce]"></skipped>
          </testcase>
          <testcase name="[It] [sig-storage] something else [Slow]" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
      </testsuite>
  </testsuites>"#;

    #[test]
    fn a_report_is_counted_by_state() {
        let s = Summary::parse(REPORT).unwrap();
        assert_eq!((s.passed, s.failed, s.skipped, s.not_selected), (1, 1, 1, 1));
        assert_eq!(s.total(), 3);
        assert_eq!(s.names.len(), 4, "every [Conformance] name, selected or not");
        assert!(s.suite_failures.is_empty());
        assert_eq!(
            s.failures,
            vec![Failure {
                name: "[sig-network] Services should serve a basic endpoint from pods [Conformance]".into(),
                first_line: "[FAILED] timed out waiting for the condition <endpoints>".into()
            }]
        );
        assert!(!s.ok());
        assert_eq!(s.line("focus: x"), "conformance: 1 passed, 1 failed, 1 skipped of 3 [Conformance] tests (focus: x)");
    }

    /// The shape `e2e.test --ginkgo.dry-run --report-dir` (1.34.4, ginkgo 2.21.0) writes: suite nodes,
    /// a focused test, and a test the focus left out (a name with an escaped quote).
    #[test]
    fn the_suites_own_report_shape_is_read() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
  <testsuites tests="7148" disabled="7112" errors="0" failures="0" time="1.041261182">
      <testsuite name="Kubernetes e2e suite" package="/tmp/dry" tests="7148" disabled="0" skipped="7112" errors="0" failures="0" time="1.041261182" timestamp="2026-12-02T19:38:21">
          <properties>
              <property name="SuiteSucceeded" value="true"></property>
          </properties>
          <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
          <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="passed" time="8.721e-05"></testcase>
          <testcase name="[It] [sig-api-machinery] API Streaming (aka. WatchList) [FeatureGate:WatchList] [Beta] [Serial] reflector doesn&#39;t support receiving resources as Tables [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
          <testcase name="[It] [sig-api-machinery] Discovery should validate PreferredVersion for each APIGroup [Conformance]" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
      </testsuite>
  </testsuites>"#;
        let s = Summary::parse(xml).unwrap();
        assert_eq!((s.passed, s.failed, s.skipped, s.not_selected), (1, 0, 0, 1));
        assert!(s.names.contains("[sig-api-machinery] Discovery should validate PreferredVersion for each APIGroup [Conformance]"));
        assert!(s.names.iter().any(|n| n.contains("doesn't support")), "entities unescaped: {:?}", s.names);
        assert!(s.ok());
    }

    #[test]
    fn a_failed_suite_node_is_a_failure_of_the_run() {
        let xml = r#"<testsuites><testsuite name="s">
            <testcase name="[SynchronizedBeforeSuite]" status="failed"><failure message="no nodes are Ready" type="failed">long text</failure></testcase>
            <testcase name="[It] a [Conformance]" status="passed"></testcase>
        </testsuite></testsuites>"#;
        let s = Summary::parse(xml).unwrap();
        assert_eq!(s.suite_failures, vec![Failure { name: "[SynchronizedBeforeSuite]".into(), first_line: "no nodes are Ready".into() }]);
        assert_eq!(s.passed, 1);
        assert!(!s.ok(), "a failed BeforeSuite fails the run even when a test passed");
    }

    #[test]
    fn elements_count_when_there_is_no_status_attribute() {
        let xml = r#"<testsuites><testsuite name="s">
            <testcase name="a [Conformance]"></testcase>
            <testcase name="b [Conformance]"><failure message="boom"/></testcase>
            <testcase name="c [Conformance]"><skipped message="skipped - no"/></testcase>
        </testsuite></testsuites>"#;
        let s = Summary::parse(xml).unwrap();
        assert_eq!((s.passed, s.failed, s.skipped), (1, 1, 1));
        assert_eq!(s.failures[0].first_line, "boom");
    }

    #[test]
    fn nothing_passed_is_not_a_pass() {
        let s = Summary::parse(r#"<testsuites><testsuite name="s"></testsuite></testsuites>"#).unwrap();
        assert_eq!(s.total(), 0);
        assert!(!s.ok(), "an empty run (a focus matching nothing) must not count as passing");
    }

    #[test]
    fn what_is_not_a_junit_report_is_refused() {
        assert!(Summary::parse("not xml at all <").is_err());
        assert!(
            Summary::parse("<testsuites><testsuite><testcase status=\"passed\"></testcase></testsuite></testsuites>").is_err(),
            "a test case without a name"
        );
    }

    #[test]
    fn the_focus_matches_exactly_the_named_tests() {
        let re = focus_regex(&["[sig-x] A (b) c.d [Conformance]", "e *f* [Serial]"]);
        assert_eq!(re, r" \[sig-x\] A \(b\) c\.d \[Conformance\]$| e \*f\* \[Serial\]$");
    }

    #[test]
    fn the_focused_set_is_conformance_tests_named_once() {
        let set: BTreeSet<&str> = FOCUSED.iter().copied().collect();
        assert_eq!(set.len(), FOCUSED.len(), "a name is listed twice");
        assert!((20..=40).contains(&FOCUSED.len()), "the focused set is ~20–40 tests, not {}", FOCUSED.len());
        for n in FOCUSED {
            assert!(n.ends_with("[Conformance]") && n.starts_with("[sig-"), "{n:?} is not a [Conformance] test name");
            assert!(!n.contains("  "), "{n:?} has a double space");
        }
    }

    #[test]
    fn progress_counts_finished_and_failed_specs() {
        let log = "Running Suite\n••\n• [FAILED] [12.3 seconds]\n[sig-x] y\n•\nS\n";
        assert_eq!(progress(log), (4, 1));
        assert_eq!(progress(""), (0, 0));
    }
}
