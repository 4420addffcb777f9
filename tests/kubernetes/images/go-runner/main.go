// go-runner runs a command and sends its output to a log file, like the go-runner of
// k8s.io/release that wraps the control-plane binaries in the upstream images.
//
// Usage:
//
//	/go-runner [--log-file=PATH] [--also-stdout] [--redirect-stderr=BOOL] COMMAND [ARG...]
//
// With --log-file=PATH, the command's stdout (and stderr, see --redirect-stderr) is appended to
// PATH, created with its directory if needed; without it, the output goes to go-runner's stdout.
// With --also-stdout, output written to the log file is copied to go-runner's stdout as well.
// --redirect-stderr (default true) sends the command's stderr where its stdout goes; when false,
// the command's stderr is go-runner's stderr.
//
// Flag parsing stops at the first non-flag argument (or after "--"); the rest is the command.
// SIGINT and SIGTERM are forwarded to the command; go-runner exits with the command's exit code
// (128+N if the command was killed by signal N).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

var (
	logFile        = flag.String("log-file", "", "if non-empty, append the command's output to this file")
	alsoStdout     = flag.Bool("also-stdout", false, "with --log-file, copy the command's output to standard output as well")
	redirectStderr = flag.Bool("redirect-stderr", true, "send the command's stderr where its stdout goes")
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [--log-file=PATH] [--also-stdout] [--redirect-stderr=BOOL] COMMAND [ARG...]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	code, err := run(flag.Args())
	if err != nil {
		fmt.Fprintf(os.Stderr, "go-runner: %v\n", err)
	}
	os.Exit(code)
}

func run(argv []string) (int, error) {
	var out io.Writer = os.Stdout
	if *logFile != "" {
		if dir := filepath.Dir(*logFile); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return 1, fmt.Errorf("creating the directory of the log file: %w", err)
			}
		}
		f, err := os.OpenFile(*logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return 1, fmt.Errorf("opening the log file: %w", err)
		}
		defer f.Close()
		out = f
		if *alsoStdout {
			out = io.MultiWriter(f, os.Stdout)
		}
	}

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stdout = out
	if *redirectStderr {
		cmd.Stderr = out // the same writer: exec.Cmd serialises writes to it
	} else {
		cmd.Stderr = os.Stderr
	}
	// If the command exits but a descendant keeps the output pipes open, stop copying after a while.
	cmd.WaitDelay = 10 * time.Second

	// Subscribe before starting so a signal that arrives in between is not lost.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	go func() {
		for sig := range sigs {
			_ = cmd.Process.Signal(sig)
		}
	}()

	err := cmd.Wait()
	signal.Stop(sigs)
	if err == nil {
		return 0, nil
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exitErr.ExitCode(), nil
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		return cmd.ProcessState.ExitCode(), nil
	}
	return 1, err
}
