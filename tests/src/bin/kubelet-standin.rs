//! Installed as `/usr/local/bin/kubelet` in local-cloud machines: runs static pods' host commands
//! (see `keelson_local::staticpods`). Accepts and ignores the real kubelet's other flags.

use std::time::Duration;

use keelson_local::staticpods::{exec_pod, manifest_dir_from_args, Runner};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("__exec-pod") {
        let err = exec_pod(&args[1..]);
        eprintln!("kubelet-standin: exec failed: {err}");
        std::process::exit(127);
    }
    if args.iter().any(|a| a == "--version") {
        println!("Kubernetes v0.0.0-keelson-local-standin (static-pod runner only; the real kubelet is not available offline)");
        return;
    }
    let dir = manifest_dir_from_args(&args);
    let self_exe = std::env::current_exe().unwrap_or_else(|_| "/usr/local/bin/kubelet".into());
    eprintln!(
        "kubelet-standin: running static pods from {} (host binaries only; images cannot be pulled offline)",
        dir.display()
    );
    let mut runner = Runner::new(dir, self_exe);
    loop {
        runner.sync();
        std::thread::sleep(Duration::from_millis(500));
    }
}
