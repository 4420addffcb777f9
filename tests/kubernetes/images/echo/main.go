// echo is the test workload of the keelson-local Kubernetes tests (image keelson-test/echo:1).
//
//	echo [serve [ADDR]]   listen on ADDR (default :8080) and answer every request with the pod's
//	                      name ($POD_NAME, else the hostname) and a newline
//	echo get URL          GET URL (5 s timeout), print the body to stdout; exit 1 on an error or a
//	                      non-2xx status
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	switch {
	case len(args) == 0:
		serve(":8080")
	case args[0] == "serve" && len(args) <= 2:
		addr := ":8080"
		if len(args) == 2 {
			addr = args[1]
		}
		serve(addr)
	case args[0] == "get" && len(args) == 2:
		if err := get(args[1]); err != nil {
			fmt.Fprintf(os.Stderr, "echo get: %v\n", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "usage: %s [serve [ADDR]] | get URL\n", os.Args[0])
		os.Exit(2)
	}
}

func podName() string {
	if name := os.Getenv("POD_NAME"); name != "" {
		return name
	}
	if name, err := os.Hostname(); err == nil && name != "" {
		return name
	}
	return "unknown"
}

func serve(addr string) {
	name := podName()
	srv := &http.Server{
		Addr:              addr,
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, name+"\n")
		}),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(os.Stderr, "echo: serving %q on %s\n", name, addr)
	select {
	case err := <-errc:
		fmt.Fprintf(os.Stderr, "echo: %v\n", err)
		os.Exit(1)
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "echo: shutdown: %v\n", err)
		}
	}
}

func get(url string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the body of %s: %w", url, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s: HTTP %s", url, resp.Status)
	}
	_, err = os.Stdout.Write(body)
	return err
}
