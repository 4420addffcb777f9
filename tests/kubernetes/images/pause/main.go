// pause is the pod sandbox's placeholder process, like the pause of Kubernetes (build/pause/linux/pause.c):
// it does nothing until SIGINT or SIGTERM, then exits 0, and as the pod's PID 1 it reaps the zombies
// of processes re-parented to it. `pause -v` prints its version.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "unknown"

func main() {
	if len(os.Args) > 1 {
		if os.Args[1] == "-v" || os.Args[1] == "--version" {
			fmt.Printf("pause.go (keelson) version %s\n", version)
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "usage: %s [-v]\n", os.Args[0])
		os.Exit(1)
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}

	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	reap() // children that exited before we subscribed
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
		os.Exit(0)
	}
}

// reap collects every exited child without blocking (signals coalesce, so one SIGCHLD may stand for many).
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
