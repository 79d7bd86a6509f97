package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/store"
)

// modelPolicy decides what a client may load. By default: the models named
// at start with -m (under their ids or their names), and models found in
// the stores by name. A file path only with --allow-paths, and then only
// a regular file under one of those directories once symlinks are
// resolved. Everything else is "not found", whatever the reason, so that a
// client learns nothing about the host's files.
type modelPolicy struct {
	// pinned are the -m names: resolved as the operator wrote them.
	pinned map[string]bool
	// resolve turns a pinned name into a path (files allowed); lookup a
	// client's name (store names only).
	resolve, lookup func(string) (string, error)
	// dirs are the --allow-paths directories, absolute, symlinks resolved.
	dirs []string
}

// errNotAllowed is why a path outside --allow-paths is not found.
var errNotAllowed = errors.New("paths are not served (see --allow-paths)")

func newModelPolicy(models []modelArg, allowPaths []string, custom func(string) (string, error)) (*modelPolicy, error) {
	p := &modelPolicy{pinned: map[string]bool{}}
	if custom != nil {
		p.resolve, p.lookup = custom, custom
	} else {
		st := store.Default()
		p.resolve, p.lookup = st.Resolve, st.Lookup
	}
	for _, m := range models {
		p.pinned[m.name] = true
	}
	for _, d := range allowPaths {
		abs, err := filepath.Abs(d)
		if err == nil {
			abs, err = filepath.EvalSymlinks(abs)
		}
		if err != nil {
			return nil, fmt.Errorf("--allow-paths %q: %w", d, err)
		}
		if st, err := os.Stat(abs); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("--allow-paths %q: not a directory", d)
		}
		p.dirs = append(p.dirs, abs)
	}
	return p, nil
}

// isPath says whether a model name is meant as a file path: absolute, or
// relative from . or ..; anything else is a store name.
func isPath(name string) bool {
	return filepath.IsAbs(name) || strings.HasPrefix(name, "./") || strings.HasPrefix(name, "../") ||
		strings.HasPrefix(name, "~") || strings.Contains(name, `\`)
}

// Resolve is the engine's resolver.
func (p *modelPolicy) Resolve(name string) (string, error) {
	if p.pinned[name] {
		return p.resolve(name)
	}
	if !isPath(name) {
		return p.lookup(name)
	}
	if len(p.dirs) == 0 || !filepath.IsAbs(name) {
		return "", errNotAllowed
	}
	real, err := filepath.EvalSymlinks(name)
	if err != nil {
		return "", err
	}
	for _, d := range p.dirs {
		rel, err := filepath.Rel(d, real)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
			continue
		}
		st, err := os.Stat(real)
		if err != nil {
			return "", err
		}
		if !st.Mode().IsRegular() {
			return "", fmt.Errorf("%s: not a regular file", st.Name())
		}
		return real, nil
	}
	return "", errNotAllowed
}

// hostPaths finds absolute paths in a message.
var hostPaths = regexp.MustCompile(`(^|[\s"'(=\[])(/[^\s"'():,\]]+)`)

// redactPaths replaces every absolute path in s by its last element: an
// error or a status shown to a client says which file, not where the
// host keeps it.
func redactPaths(s string) string {
	return hostPaths.ReplaceAllStringFunc(s, func(m string) string {
		sub := hostPaths.FindStringSubmatch(m)
		return sub[1] + filepath.Base(sub[2])
	})
}

// access is the checks every request passes before its handler.
type access struct {
	key []byte // sha256 of --api-key; nil: no key
	// hosts are the Host names allowed (lowercase, no port); nil: any.
	hosts map[string]bool
	// origins are the allowed Origin values (scheme://host[:port]) beyond
	// those whose host is in hosts; "*" allows any.
	origins map[string]bool
}

func newAccess(addr, key string, allowOrigins []string) *access {
	a := &access{origins: map[string]bool{}}
	if key != "" {
		h := sha256.Sum256([]byte(key))
		a.key = h[:]
	}
	for _, o := range allowOrigins {
		a.origins[strings.TrimSuffix(strings.ToLower(o), "/")] = true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		// Listening everywhere: the names it is reached by are not
		// known, so Host is not checked (a key is what protects it).
		return a
	}
	a.hosts = map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true, strings.ToLower(host): true}
	return a
}

// hostAllowed checks a Host header or an Origin's host.
func (a *access) hostAllowed(hostport string) bool {
	if a.hosts == nil {
		return true
	}
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		h = hostport
	}
	h = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	return a.hosts[h] || strings.HasSuffix(h, ".localhost")
}

// originAllowed checks an Origin header: a listed one, or one on an
// allowed host. Browsers send Origin with every cross-site request and
// with same-origin POSTs, so a page on another site (or one that rebound
// its DNS name to 127.0.0.1) is refused.
func (a *access) originAllowed(origin string) bool {
	o := strings.TrimSuffix(strings.ToLower(origin), "/")
	if a.origins["*"] || a.origins[o] {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return a.hosts != nil && a.hostAllowed(u.Host)
}

// keyOK compares a bearer token in constant time.
func (a *access) keyOK(r *http.Request) bool {
	if a.key == nil {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(h[:], a.key) == 1
}

// wrap applies the checks, in order: Host (403), Origin (403; preflights
// of allowed origins answered), key (401, except /health), and a JSON
// Content-Type on POST (415). Every response gets per-write deadlines.
func (s *server) wrap(a *access, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw, r, done := s.observe(w, r) // metrics and the access log
		defer done()
		w = &deadlineWriter{ResponseWriter: sw, rc: http.NewResponseController(sw), d: s.writeTimeout}
		if !a.hostAllowed(r.Host) {
			writeError(w, http.StatusForbidden, "forbidden_host", "Host not allowed (forge serve answers its --addr host and loopback names)")
			return
		}
		if o := r.Header.Get("Origin"); o != "" {
			if !a.originAllowed(o) {
				writeError(w, http.StatusForbidden, "forbidden_origin", "Origin not allowed (see --allow-origin)")
				return
			}
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", o)
			h.Add("Vary", "Origin")
			if r.Method == http.MethodOptions {
				h.Set("Access-Control-Allow-Methods", "GET, POST")
				h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
				h.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		if r.URL.Path != "/health" && !a.keyOK(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="forge"`)
			writeError(w, http.StatusUnauthorized, "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)")
			return
		}
		if r.Method == http.MethodPost {
			mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || mt != "application/json" {
				writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "POST bodies must be Content-Type: application/json")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// counted is the outermost handler: it counts running handlers for
// shutdown (which closes the connections once none is left) and sends
// each answer out of the server's buffer before it counts as done, so an
// answer written just before shutdown's close is not lost. It sits outside
// every wrapper that rewrites answers (ollamaShape), whose last writes
// happen when the handler inside returns.
func (s *server) counted(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inflight.Add(1)
		defer s.inflight.Done()
		next.ServeHTTP(w, r)
		rc := http.NewResponseController(w)
		if s.writeTimeout > 0 {
			rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
		}
		rc.Flush()
	})
}

// deadlineWriter gives every write its own deadline, so a client that
// stops reading is cut off while a long stream that keeps flowing is not.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	if w.d > 0 {
		w.rc.SetWriteDeadline(time.Now().Add(w.d))
	}
	return w.ResponseWriter.Write(b)
}

func (w *deadlineWriter) Flush() { w.FlushError() }

// FlushError is what http.ResponseController.Flush calls.
func (w *deadlineWriter) FlushError() error {
	if w.d > 0 {
		w.rc.SetWriteDeadline(time.Now().Add(w.d))
	}
	return w.rc.Flush()
}

func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// publicStatus is a model status as a client sees it: no host path.
func publicStatus(st pipeline.ModelStatus) pipeline.ModelStatus {
	st.Path = ""
	st.Err = redactPaths(st.Err)
	return st
}
