// echo is the test workload of the keelson-local Kubernetes tests (image keelson-test/echo:1).
//
//	echo [serve [ADDR]]   listen on ADDR (default :8080) and answer every request with the pod's
//	                      name ($POD_NAME, else the hostname) and a newline
//	echo get URL [NAME:VALUE...]
//	                      GET URL (5 s timeout) with those headers, print the body to stdout; exit 1
//	                      on an error or a non-2xx status
//	echo token-get TOKEN_URL URL
//	                      what a workload that steals its node's identity does: GET TOKEN_URL with
//	                      Metadata-Flavor: Google (a GCE metadata server's token answer), then GET
//	                      URL with its access_token as a bearer; exit 1 if either fails
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
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
	case args[0] == "get" && len(args) >= 2:
		headers := map[string]string{}
		for _, h := range args[2:] {
			name, value, ok := strings.Cut(h, ":")
			if !ok {
				fmt.Fprintf(os.Stderr, "echo get: header %q is not NAME:VALUE\n", h)
				os.Exit(2)
			}
			headers[name] = value
		}
		body, err := get(args[1], headers)
		if err == nil {
			_, err = os.Stdout.Write(body)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "echo get: %v\n", err)
			os.Exit(1)
		}
	case args[0] == "token-get" && len(args) == 3:
		if err := tokenGet(args[1], args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "echo token-get: %v\n", err)
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

func get(url string, headers map[string]string) ([]byte, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the body of %s: %w", url, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("%s: HTTP %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

func tokenGet(tokenURL, url string) error {
	answer, err := get(tokenURL, map[string]string{"Metadata-Flavor": "Google"})
	if err != nil {
		return fmt.Errorf("the token: %w", err)
	}
	var token struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(answer, &token); err != nil || token.AccessToken == "" {
		return fmt.Errorf("%s: not a token answer", tokenURL)
	}
	fmt.Fprintf(os.Stderr, "echo token-get: got a token from %s\n", tokenURL)
	body, err := get(url, map[string]string{"Authorization": "Bearer " + token.AccessToken})
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(body)
	return err
}
