package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// nginxConf holds one server per case, each with a limit_req zone of its
// own, and logs every request with its port.
const nginxConf = `error_log {{.Dir}}/error.log warn;
worker_processes 1;
events { worker_connections 1024; }
http {
    default_type application/json;
    log_format bench '$server_port $status';
    access_log {{.Dir}}/access.log bench;
    open_file_cache off;
    client_body_temp_path {{.Dir}}/body;
    proxy_temp_path       {{.Dir}}/proxy;
    fastcgi_temp_path     {{.Dir}}/fastcgi;
    uwsgi_temp_path       {{.Dir}}/uwsgi;
    scgi_temp_path        {{.Dir}}/scgi;
    limit_req_log_level warn;
{{range .Cases}}
    limit_req_zone $server_port zone=z{{.Port}}:1m rate={{.Rate}};
    server {
        listen 127.0.0.1:{{.Port}};
        limit_req_status {{.Status}};
        {{range .Headers}}add_header {{.}} always;
        {{end}}
        location /api/ {
            # Maintenance: a plain 503 in the rewrite phase, before limit_req.
            if (-f {{.Flag}}) { return 503; }
            limit_req zone=z{{.Port}} burst={{.Burst}} nodelay;
            {{if .RetryAfter}}error_page {{.Status}} = @refused;{{end}}
            # Not "return 200": return ends the request in the rewrite
            # phase, before limit_req ever sees it; try_files runs after.
            root {{$.Dir}};
            try_files /ok.json =500;
        }
        {{if .RetryAfter}}location @refused {
            add_header Retry-After {{.RetryAfter}} always;
            {{range .Headers}}add_header {{.}} always;
            {{end}}
            return {{.Status}};
        }{{end}}
        location = /healthz { access_log off; return 200 '{"ok":true}'; }
    }
{{end}}
}
`

// nginx is a running nginx with the cases' servers.
type nginx struct {
	cmd *exec.Cmd
	dir string
}

func startNginx(bin, dir string, cases []*bcase) (*nginx, error) {
	ndir := filepath.Join(dir, "nginx")
	for _, d := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(ndir, d), 0o755); err != nil {
			return nil, err
		}
	}
	type server struct {
		Port, Burst, Status int
		Rate, Flag          string
		RetryAfter          string
		Headers             []string
	}
	var servers []server
	for _, c := range cases {
		s := server{Port: c.port, Burst: c.shape.Burst, Status: c.shape.Status, Flag: c.flag, RetryAfter: c.shape.RetryAfter}
		// limit_req's rate is whole requests per second or per minute.
		if c.shape.Rate >= 1 && c.shape.Rate == float64(int(c.shape.Rate)) {
			s.Rate = fmt.Sprintf("%dr/s", int(c.shape.Rate))
		} else {
			s.Rate = fmt.Sprintf("%dr/m", int(c.shape.Rate*60))
		}
		for k, v := range c.shape.Headers {
			s.Headers = append(s.Headers, k+" "+v)
		}
		servers = append(servers, s)
	}
	var conf bytes.Buffer
	if err := template.Must(template.New("nginx").Parse(nginxConf)).Execute(&conf, map[string]any{"Dir": ndir, "Cases": servers}); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(ndir, "ok.json"), []byte(`{"ok":true}`+"\n"), 0o644); err != nil {
		return nil, err
	}
	confPath := filepath.Join(ndir, "nginx.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o644); err != nil {
		return nil, err
	}
	n := &nginx{dir: ndir}
	n.cmd = exec.Command(bin, "-p", ndir, "-e", filepath.Join(ndir, "error.log"), "-c", confPath,
		"-g", "daemon off; master_process off; pid "+filepath.Join(ndir, "nginx.pid")+";")
	var stderr bytes.Buffer
	n.cmd.Stderr = &stderr
	if err := n.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	for _, c := range cases {
		for i := 0; ; i++ {
			resp, err := http.Get(c.base() + "/healthz")
			if err == nil {
				resp.Body.Close()
				break
			}
			if i == 200 {
				n.stop()
				errLog, _ := os.ReadFile(filepath.Join(ndir, "error.log"))
				return nil, fmt.Errorf("nginx did not come up on %d: %v\n%s%s", c.port, err, stderr.String(), errLog)
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	return n, nil
}

func (n *nginx) stop() {
	n.cmd.Process.Signal(os.Interrupt)
	n.cmd.Wait()
}

// count reads the access log into each case's received.
func (n *nginx) count(cases []*bcase) error {
	f, err := os.Open(filepath.Join(n.dir, "access.log"))
	if err != nil {
		return err
	}
	defer f.Close()
	byPort := map[int]*bcase{}
	for _, c := range cases {
		byPort[c.port] = c
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		port, _, _ := strings.Cut(sc.Text(), " ")
		p, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("access log line %q", sc.Text())
		}
		if c := byPort[p]; c != nil {
			c.received++
		}
	}
	return sc.Err()
}
