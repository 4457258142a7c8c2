// Package nginxtest starts a real nginx for tests, configured from a
// template in testdata/nginx: the upstream whose limit_req, redirects and
// access log fetch and cmd/auditd test against. Without nginx installed
// the test is skipped, except in CI (CI=true), where .ci/run installs
// nginx-light and its absence is a failure.
package nginxtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"
)

// Config chooses a template in testdata/nginx and the limits it fills in.
type Config struct {
	// Template is the template's file name in testdata/nginx, or its path
	// from the module's root when it holds a slash
	// ("testdata/proxy/services.conf.tmpl"); "" is nginx.conf.tmpl.
	Template string
	Rate     int // limit_req's requests a second
	Burst    int // limit_req's burst
	Status   int // the status limit_req refuses with
}

// templateData is what a template sees.
type templateData struct {
	Dir    string // the prefix: config, logs, temp files
	Root   string // testdata/nginx, whose ok.json is the body served
	Port   int
	Rate   int
	Burst  int
	Status int
}

// Server is a running nginx, stopped by Stop or at cleanup.
type Server struct {
	URL string // http://127.0.0.1:port
	Dir string // nginx's prefix, a fresh temporary directory; templates may serve files from it

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
	once   sync.Once
}

// Start starts nginx with cfg on a free port of 127.0.0.1 and waits until
// it answers GET /healthz.
func Start(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/nginx")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("nginx is not installed (.ci/run installs nginx-light): %v", err)
		}
		tb.Skipf("nginx is not installed: %v", err)
	}
	root := filepath.Join(moduleRoot(tb), "testdata", "nginx")
	if cfg.Template == "" {
		cfg.Template = "nginx.conf.tmpl"
	}
	path := filepath.Join(root, cfg.Template)
	if strings.Contains(cfg.Template, "/") {
		path = filepath.Join(moduleRoot(tb), filepath.FromSlash(cfg.Template))
	}
	tmpl, err := template.ParseFiles(path)
	if err != nil {
		tb.Fatal(err)
	}
	data := templateData{Dir: tb.TempDir(), Root: root, Rate: cfg.Rate, Burst: cfg.Burst, Status: cfg.Status}
	// The port is free when picked, but another process may take it before
	// nginx binds: then pick again.
	for try := 0; ; try++ {
		data.Port = freePort(tb)
		s, err := run(tb, bin, tmpl, data)
		if err == nil {
			return s
		}
		if try == 2 || !strings.Contains(err.Error(), "Address already in use") {
			tb.Fatal(err)
		}
	}
}

// moduleRoot is the directory holding go.mod, above the working directory:
// a test runs in its package's directory, at any depth.
func moduleRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func run(tb testing.TB, bin string, tmpl *template.Template, data templateData) (*Server, error) {
	tb.Helper()
	var conf bytes.Buffer
	if err := tmpl.Execute(&conf, data); err != nil {
		return nil, err
	}
	confPath := filepath.Join(data.Dir, "nginx.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(data.Dir, "error.log")
	os.Remove(logPath) // a failed try's errors are not this one's
	out, err := os.Create(filepath.Join(data.Dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(bin, "-p", data.Dir, "-e", logPath, "-c", confPath,
		"-g", "daemon off; master_process off; pid "+filepath.Join(data.Dir, "nginx.pid")+";")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	s := &Server{URL: "http://127.0.0.1:" + strconv.Itoa(data.Port), Dir: data.Dir, cmd: cmd, exited: make(chan struct{})}
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(s.exited) }()
	tb.Cleanup(func() { s.Stop(tb) })

	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-s.exited:
			return nil, fmt.Errorf("nginx exited at start (%v): %s", waitErr, s.Logs())
		default:
		}
		resp, err := client.Get(s.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.Stop(tb)
			return nil, fmt.Errorf("nginx did not answer in 10s (last: %v): %s", err, s.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the nginx process's id, for reading its /proc entries.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop stops nginx and waits for it; it may be called more than once.
// Call it before reading the access log in full.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.once.Do(func() {
		// A graceful stop (SIGQUIT): nginx writes a request's access log
		// line after its response has gone, so a kill just after the last
		// response can lose the line the counts compare against.
		if err := s.cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
			tb.Errorf("stop nginx: %v", err)
		}
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	})
}

// AccessLog is the access log so far, one line per request in the
// template's log_format; nil before nginx has created it. While nginx
// runs, the last responses' lines may still be missing (see Stop).
func (s *Server) AccessLog(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(s.Dir, "access.log"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		tb.Fatal(err)
	}
	return b
}

// Requests counts the requests nginx logged.
func (s *Server) Requests(tb testing.TB) int {
	tb.Helper()
	return bytes.Count(s.AccessLog(tb), []byte("\n"))
}

// Logs is nginx's error log and output, for a failure's message.
func (s *Server) Logs() string {
	var b strings.Builder
	for _, name := range []string{"error.log", "stderr.log"} {
		text, _ := os.ReadFile(filepath.Join(s.Dir, name))
		b.Write(bytes.TrimSpace(text))
		b.WriteString("\n")
	}
	return strings.TrimSpace(b.String())
}
