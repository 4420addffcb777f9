//! The task engine: each task finds the actual state, diffs it against the desired state and
//! applies only the difference. Tasks run as soon as their dependencies are done, independent
//! ones concurrently. Whether changes are applied or only reported is the *target*'s business
//! ([`Target::Direct`] or [`Target::DryRun`]), not each task's.
//!
//! The engine is a leaf: it knows nothing of nodeup's tasks, their context `C` (the host and the
//! asset fetcher: `nodetasks::Ctx`) or their errors, which it carries as a boxed source
//! ([`TaskError::Failed`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Condvar, Mutex};

/// A task's own error, whatever its type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a task failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The task failed (a file, an asset, a certificate, a command, the join …): shown as its
    /// own error, which is the source.
    #[error("{source}")]
    Failed {
        #[source]
        source: BoxError,
    },
    #[error("dependency {0} failed")]
    Dependency(String),
}

impl TaskError {
    /// A task's own error as a task failure (what `?` does through each error's `From`).
    pub fn failed(e: impl std::error::Error + Send + Sync + 'static) -> TaskError {
        TaskError::Failed { source: Box::new(e) }
    }
}

/// Where changes go: applied to the host, only reported, or rendered: the tasks that only write
/// files from what the model holds are applied (under a root that is not `/`), the others
/// (downloads, installs from the cache, the network join) only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Direct,
    DryRun,
    Render,
}

/// One unit of desired state, checked and applied with the context `C` (everything a task may use).
pub trait Task<C: ?Sized>: Send + Sync {
    /// Unique name, e.g. `file:/etc/containerd/config.toml`; dependencies refer to it.
    fn name(&self) -> String;
    /// Names of tasks that must finish first; a change in one of them is passed as `deps_changed`.
    fn deps(&self) -> Vec<String> {
        Vec::new()
    }
    /// The differences between actual and desired state, one line each; empty when converged.
    fn check(&self, ctx: &C, deps_changed: bool) -> Result<Vec<String>, TaskError>;
    /// Make the actual state the desired state (called only when `check` found differences).
    fn apply(&self, ctx: &C, deps_changed: bool) -> Result<(), TaskError>;
    /// Host paths this task writes (their directories are swept for stale temp files).
    fn paths(&self) -> Vec<String> {
        Vec::new()
    }
    /// Whether [`Target::Render`] applies this task: it writes only what the model holds (no
    /// download, no network, no process; commands are recorded under a root other than `/`).
    fn renders(&self) -> bool {
        true
    }
}

/// What one task did.
#[derive(Debug, Clone)]
pub struct TaskResult {
    pub name: String,
    pub changes: Vec<String>,
    pub error: Option<String>,
    /// The changes were applied (not only reported).
    pub applied: bool,
}

/// The result of a run.
#[derive(Debug, Default)]
pub struct Report {
    pub results: Vec<TaskResult>,
}

impl Report {
    pub fn changed(&self) -> usize {
        self.results.iter().filter(|r| !r.changes.is_empty()).count()
    }
    pub fn failed(&self) -> Vec<&TaskResult> {
        self.results.iter().filter(|r| r.error.is_some()).collect()
    }
}

/// The task graph is malformed.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("task {task}: unknown dependency {dep}")]
    UnknownDependency { task: String, dep: String },
    #[error("task {0}: defined twice")]
    Duplicate(String),
    #[error("dependency cycle through {0}")]
    Cycle(String),
}

#[derive(Clone)]
enum State {
    Pending,
    Done { changed: bool },
    Failed,
}

/// Check that names are unique, dependencies exist and there is no cycle.
pub fn validate<C: ?Sized, T: Task<C> + ?Sized>(tasks: &[Box<T>]) -> Result<Vec<Vec<usize>>, GraphError> {
    let mut index = BTreeMap::new();
    for (i, t) in tasks.iter().enumerate() {
        if index.insert(t.name(), i).is_some() {
            return Err(GraphError::Duplicate(t.name()));
        }
    }
    let mut deps = Vec::with_capacity(tasks.len());
    for t in tasks {
        let mut d = Vec::new();
        for dep in t.deps() {
            let j = *index.get(&dep).ok_or_else(|| GraphError::UnknownDependency { task: t.name(), dep: dep.clone() })?;
            d.push(j);
        }
        deps.push(d);
    }
    // Kahn's algorithm: every task must become ready within tasks.len() rounds.
    let mut done = BTreeSet::new();
    for _ in 0..=tasks.len() {
        let before = done.len();
        for (i, d) in deps.iter().enumerate() {
            if !done.contains(&i) && d.iter().all(|j| done.contains(j)) {
                done.insert(i);
            }
        }
        if done.len() == tasks.len() {
            return Ok(deps);
        }
        if done.len() == before {
            break;
        }
    }
    let stuck = (0..tasks.len()).find(|i| !done.contains(i)).map(|i| tasks[i].name()).unwrap_or_default();
    Err(GraphError::Cycle(stuck))
}

/// Run every task: each as soon as its dependencies are done, independent ones concurrently.
pub fn run<C: Sync + ?Sized, T: Task<C> + ?Sized>(tasks: &[Box<T>], ctx: &C, target: Target) -> Result<Report, GraphError> {
    let deps = validate::<C, T>(tasks)?;
    let states = Mutex::new(vec![State::Pending; tasks.len()]);
    let wake = Condvar::new();
    let results: Mutex<Vec<Option<TaskResult>>> = Mutex::new(vec![None; tasks.len()]);
    std::thread::scope(|s| {
        for (i, task) in tasks.iter().enumerate() {
            let (states, wake, results, deps) = (&states, &wake, &results, &deps[i]);
            s.spawn(move || {
                // Wait for the dependencies (the graph is acyclic, so this ends).
                let dep_states: Vec<State> = {
                    let mut guard = states.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        let ds: Vec<State> = deps.iter().map(|&j| guard[j].clone()).collect();
                        if ds.iter().all(|d| !matches!(d, State::Pending)) {
                            break ds;
                        }
                        guard = wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                    }
                };
                let name = task.name();
                let outcome = if let Some(k) = dep_states.iter().position(|d| matches!(d, State::Failed)) {
                    Err(TaskError::Dependency(tasks[deps[k]].name()))
                } else {
                    let deps_changed = dep_states.iter().any(|d| matches!(d, State::Done { changed: true }));
                    run_one(task.as_ref(), ctx, target, deps_changed)
                };
                let (state, result) = match outcome {
                    Ok((changes, applied)) => {
                        for c in &changes {
                            tracing::info!("{name}: {c}");
                        }
                        (State::Done { changed: !changes.is_empty() }, TaskResult { name, changes, error: None, applied })
                    }
                    Err(e) => (State::Failed, TaskResult { name, changes: Vec::new(), error: Some(error_chain(&e)), applied: false }),
                };
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
                states.lock().unwrap_or_else(|e| e.into_inner())[i] = state;
                wake.notify_all();
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(Report { results: results.into_iter().flatten().collect() })
}

/// The changes found, and whether they were applied.
fn run_one<C: ?Sized, T: Task<C> + ?Sized>(task: &T, ctx: &C, target: Target, deps_changed: bool) -> Result<(Vec<String>, bool), TaskError> {
    let changes = task.check(ctx, deps_changed)?;
    if changes.is_empty() {
        return Ok((changes, false));
    }
    let apply = match target {
        Target::DryRun => false,
        Target::Direct => true,
        Target::Render => task.renders(),
    };
    if apply {
        task.apply(ctx, deps_changed)?;
    }
    Ok((changes, apply))
}

/// `error: cause: cause` on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    let mut depth = 0;
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
        depth += 1;
        if depth > 16 {
            break;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct T {
        name: &'static str,
        deps: Vec<&'static str>,
        dirty: bool,
        fail: bool,
        log: Arc<Mutex<Vec<String>>>,
        applied: Arc<AtomicUsize>,
    }
    impl Task<()> for T {
        fn name(&self) -> String {
            self.name.into()
        }
        fn deps(&self) -> Vec<String> {
            self.deps.iter().map(|s| s.to_string()).collect()
        }
        fn check(&self, _: &(), deps_changed: bool) -> Result<Vec<String>, TaskError> {
            if self.fail {
                return Err(TaskError::failed(std::io::Error::other("boom")));
            }
            self.log.lock().expect("lock").push(self.name.to_string());
            Ok(if self.dirty || deps_changed { vec![format!("{} differs", self.name)] } else { vec![] })
        }
        fn apply(&self, _: &(), _: bool) -> Result<(), TaskError> {
            self.applied.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    type Built = (Vec<Box<dyn Task<()>>>, Arc<Mutex<Vec<String>>>, Arc<AtomicUsize>);

    fn mk(spec: &[(&'static str, &[&'static str], bool, bool)]) -> Built {
        let log = Arc::new(Mutex::new(Vec::new()));
        let applied = Arc::new(AtomicUsize::new(0));
        let tasks = spec
            .iter()
            .map(|(n, d, dirty, fail)| {
                Box::new(T { name: n, deps: d.to_vec(), dirty: *dirty, fail: *fail, log: log.clone(), applied: applied.clone() }) as Box<dyn Task<()>>
            })
            .collect();
        (tasks, log, applied)
    }

    fn ctx_run(tasks: &[Box<dyn Task<()>>], target: Target) -> Report {
        run(tasks, &(), target).expect("graph")
    }

    #[test]
    fn order_propagation_and_dry_run() {
        let (tasks, log, applied) = mk(&[("c", &["b"], false, false), ("b", &["a"], false, false), ("a", &[], true, false), ("z", &[], false, false)]);
        let r = ctx_run(&tasks, Target::Direct);
        assert_eq!(r.changed(), 3, "a changed, so b and c see deps_changed");
        assert_eq!(applied.load(Ordering::SeqCst), 3);
        let order = log.lock().expect("lock").clone();
        let pos = |n: &str| order.iter().position(|x| x == n).expect("ran");
        assert!(pos("a") < pos("b") && pos("b") < pos("c"));
        let (tasks, _, applied) = mk(&[("a", &[], true, false)]);
        let r = ctx_run(&tasks, Target::DryRun);
        assert_eq!(r.changed(), 1);
        assert_eq!(applied.load(Ordering::SeqCst), 0, "dry run applies nothing");
    }

    #[test]
    fn render_applies_only_the_tasks_that_render() {
        struct Remote(Arc<AtomicUsize>);
        impl Task<()> for Remote {
            fn name(&self) -> String {
                "remote".into()
            }
            fn check(&self, _: &(), _: bool) -> Result<Vec<String>, TaskError> {
                Ok(vec!["download".into()])
            }
            fn apply(&self, _: &(), _: bool) -> Result<(), TaskError> {
                self.0.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            fn renders(&self) -> bool {
                false
            }
        }
        let (mut tasks, _, applied) = mk(&[("file", &["remote"], true, false)]);
        let remote = Arc::new(AtomicUsize::new(0));
        tasks.push(Box::new(Remote(remote.clone())));
        let r = ctx_run(&tasks, Target::Render);
        assert_eq!(applied.load(Ordering::SeqCst), 1, "the file task is written");
        assert_eq!(remote.load(Ordering::SeqCst), 0, "the download is only reported");
        let applied: Vec<_> = r.results.iter().map(|t| (t.name.as_str(), t.applied)).collect();
        assert_eq!(applied, [("file", true), ("remote", false)]);
    }

    #[test]
    fn failure_skips_dependents() {
        let (tasks, _, _) = mk(&[("a", &[], false, true), ("b", &["a"], false, false), ("c", &[], false, false)]);
        let r = ctx_run(&tasks, Target::Direct);
        let failed: Vec<_> = r.failed().iter().map(|t| t.name.clone()).collect();
        assert_eq!(failed, ["a", "b"]);
        let errors: Vec<_> = r.failed().iter().map(|t| t.error.clone().unwrap_or_default()).collect();
        assert_eq!(errors, ["boom", "dependency a failed"], "a task's error reads as its own, once");
    }

    #[test]
    fn graph_errors() {
        let (tasks, _, _) = mk(&[("a", &["b"], false, false), ("b", &["a"], false, false)]);
        assert!(matches!(validate(&tasks), Err(GraphError::Cycle(_))));
        let (tasks, _, _) = mk(&[("a", &["nope"], false, false)]);
        assert!(matches!(validate(&tasks), Err(GraphError::UnknownDependency { .. })));
        let (tasks, _, _) = mk(&[("a", &[], false, false), ("a", &[], false, false)]);
        assert!(matches!(validate(&tasks), Err(GraphError::Duplicate(_))));
    }
}
