package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// ContentSecurityPolicy is sent with every response of Handler. Scripts,
// styles and API calls come from the same origin only; nothing inline runs.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"img-src 'self' data:; connect-src 'self'; font-src 'self'; manifest-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// contentTypes maps the extensions shipped in static/ to their types, so the
// answer does not depend on the host's mime.types.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
	".txt":  "text/plain; charset=utf-8",
}

type file struct {
	body  []byte
	ctype string
	etag  string
}

// handler serves an immutable set of files read once from the embedded FS.
type handler struct {
	files map[string]file // by URL path: "/", "/app.css", "/js/app.js"
}

// Handler returns the UI's handler: the embedded files of static/ at their
// paths, index.html at "/". Anything else is a 404; methods other than GET
// and HEAD are a 405.
func Handler() http.Handler {
	h := &handler{files: make(map[string]file)}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ctype, ok := contentTypes[path.Ext(p)]
		if !ok {
			return nil // not shipped: unknown types are never served
		}
		body, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		urlPath := strings.TrimPrefix(p, "static")
		h.files[urlPath] = file{body: body, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
		return nil
	})
	if err != nil {
		// The FS is compiled in; failing to read it is a broken build.
		panic("web: read embedded files: " + err.Error())
	}
	h.files["/"] = h.files["/index.html"]
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")

	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	f, ok := h.files[r.URL.Path]
	if !ok {
		hdr.Set("Cache-Control", "no-store")
		http.NotFound(w, r)
		return
	}
	// No file name carries a version, so every load revalidates; an
	// unchanged file costs a 304.
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", f.etag)
	hdr.Set("Content-Type", f.ctype)
	// ServeContent answers If-None-Match against the ETag set above, HEAD
	// and ranges.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}
