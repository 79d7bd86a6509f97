package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The README's "Environment variables" table is the one place a user
// learns which variables change forge's behaviour. These tests keep it
// true: every variable the library and CLI code reads is in it, and it
// names nothing that no code reads. Test files are left out: their
// variables (FORGE_BIG_MODEL, …) only steer tests.

// TestEnvironmentTable compares the variables read by the repository's
// non-test Go files with the README's table.
func TestEnvironmentTable(t *testing.T) {
	root := filepath.Join("..", "..")
	reads, err := scanEnvReads(root, "github.com/forge-llm/forge")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	table, err := readmeEnvTable(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedKeys(reads) {
		if !table[name] {
			t.Errorf("%s is read (%s) but missing from the README's \"Environment variables\" table", name, strings.Join(reads[name], ", "))
		}
	}
	for _, name := range sortedKeys(table) {
		if _, ok := reads[name]; !ok {
			t.Errorf("the README's \"Environment variables\" table names %s, which no non-test code reads", name)
		}
	}
}

// TestEnvScanner checks the scanner itself on a small module that reads
// variables every way the repository does, so that TestEnvironmentTable's
// agreement is not the agreement of two empty lists.
func TestEnvScanner(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a/a.go": `package a
import (
	"os"
	"syscall"
)
const EnvDir = "X_DIR"
const envLocal = "X_LOCAL"
func f() {
	_ = os.Getenv("X_LITERAL")
	_, _ = os.LookupEnv(EnvDir)
	_ = os.Getenv(envLocal)
	_, _ = syscall.Getenv("X_SYSCALL")
	_ = open(EnvLib, "lib.so")
	_ = open("X_PASSED", "other.so")
	os.Setenv("X_WRITTEN_ONLY", "1")
}
const EnvLib = "X_LIB"
var global = os.Getenv("X_PACKAGE_LEVEL")
func open(env string, names ...string) string {
	var tried []string
	_ = tried
	return os.Getenv(env)
}
`,
		"b/b.go": `package b
import (
	"os"
	alias "example.com/m/a"
	cli "github.com/urfave/cli/v2"
)
var flags = []cli.Flag{&cli.StringFlag{Name: "key", EnvVars: []string{"X_FLAG", "X_FLAG2"}}}
func g() string { return os.Getenv(alias.EnvDir) }
`,
		"b/b_test.go": `package b
import "os"
func h() string { return os.Getenv("X_TEST_ONLY") }
`,
		"c/testdata/t.go": `package t
import "os"
func h() string { return os.Getenv("X_TESTDATA") }
`,
	}
	for name, src := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reads, err := scanEnvReads(dir, "example.com/m")
	if err != nil {
		t.Fatal(err)
	}
	got := sortedKeys(reads)
	want := []string{"X_DIR", "X_FLAG", "X_FLAG2", "X_LIB", "X_LITERAL", "X_LOCAL", "X_PACKAGE_LEVEL", "X_PASSED", "X_SYSCALL"}
	if !slices.Equal(got, want) {
		t.Fatalf("variables found: %v, want %v", got, want)
	}

	// A read whose name the scanner cannot work out is an error, not a
	// silent gap in the table.
	bad := filepath.Join(dir, "d", "d.go")
	if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	src := "package d\nimport \"os\"\nfunc k(s string) string { return os.Getenv(s + \"_X\") }\n"
	if err := os.WriteFile(bad, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := scanEnvReads(dir, "example.com/m"); err == nil || !strings.Contains(err.Error(), "d.go") {
		t.Fatalf("an unresolvable read: error %v, want one naming d.go", err)
	}
}

func TestReadmeEnvTable(t *testing.T) {
	doc := "# x\n\n## Environment variables\n\ntext `NOT_A_ROW`\n\n| variable | what | default |\n| --- | --- | --- |\n" +
		"| `A_ONE` | a | b |\n| `B_TWO` | c `C_IN_TEXT` | d |\n\n## Next\n\n| `D_LATER` | x | y |\n"
	got, err := readmeEnvTable(doc)
	if err != nil {
		t.Fatal(err)
	}
	if keys := sortedKeys(got); !slices.Equal(keys, []string{"A_ONE", "B_TWO"}) {
		t.Fatalf("table rows %v, want [A_ONE B_TWO]", keys)
	}
	if _, err := readmeEnvTable("# x\n"); err == nil {
		t.Fatal("a README without the section: no error")
	}
}

// envPkg is one package directory of the scan.
type envPkg struct {
	files  []*ast.File
	consts map[string]string // string constants by name
	funcs  map[string]*ast.FuncDecl
}

// envRead is a call that reads the environment with a non-constant name:
// the name is then the enclosing function's parameter, resolved at the
// function's call sites.
type envRead struct {
	pkg   string
	fn    *ast.FuncDecl
	param int
	where string
}

// scanEnvReads returns the environment variables read by the non-test Go
// files under root (module is its module path), each with where it is
// read. A read is os.Getenv, os.LookupEnv or syscall.Getenv of a string
// literal, of a string constant (of its own or an imported package of
// the module), or of a parameter of the enclosing function, followed to
// every call of that function in its package; or a name in an
// `EnvVars: []string{…}` CLI flag field. Any other argument is an error.
func scanEnvReads(root, module string) (map[string][]string, error) {
	fset := token.NewFileSet()
	pkgs := map[string]*envPkg{} // by import path
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("envlist: %w", err)
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return fmt.Errorf("envlist: %w", err)
		}
		ip := path.Join(module, filepath.ToSlash(rel))
		pk := pkgs[ip]
		if pk == nil {
			pk = &envPkg{consts: map[string]string{}, funcs: map[string]*ast.FuncDecl{}}
			pkgs[ip] = pk
		}
		pk.files = append(pk.files, f)
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.GenDecl:
				if decl.Tok != token.CONST {
					continue
				}
				for _, spec := range decl.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								pk.consts[n.Name] = s
							}
						}
					}
				}
			case *ast.FuncDecl:
				if decl.Recv == nil {
					pk.funcs[decl.Name.Name] = decl
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	reads := map[string][]string{}
	add := func(name, where string) {
		if !slices.Contains(reads[name], where) {
			reads[name] = append(reads[name], where)
		}
	}
	var pending []envRead
	var bad []string
	for ip, pk := range pkgs {
		for _, f := range pk.files {
			imports := fileImports(f)
			// resolve gives the string an expression stands for, if it is
			// a literal or a known constant.
			resolve := func(e ast.Expr) (string, bool) {
				if s, ok := stringLit(e); ok {
					return s, true
				}
				switch e := e.(type) {
				case *ast.Ident:
					s, ok := pk.consts[e.Name]
					return s, ok
				case *ast.SelectorExpr:
					if x, ok := e.X.(*ast.Ident); ok {
						if other := pkgs[imports[x.Name]]; other != nil {
							s, ok := other.consts[e.Sel.Name]
							return s, ok
						}
					}
				}
				return "", false
			}
			var fn *ast.FuncDecl // the declaration being visited, if a function
			visit := func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.KeyValueExpr:
					if k, ok := n.Key.(*ast.Ident); ok && k.Name == "EnvVars" {
						if cl, ok := n.Value.(*ast.CompositeLit); ok {
							for _, el := range cl.Elts {
								if s, ok := resolve(el); ok {
									add(s, fset.Position(el.Pos()).String())
								} else {
									bad = append(bad, fset.Position(el.Pos()).String())
								}
							}
						}
					}
				case *ast.CallExpr:
					if !isEnvRead(n.Fun, imports) || len(n.Args) != 1 {
						return true
					}
					where := fset.Position(n.Pos()).String()
					if s, ok := resolve(n.Args[0]); ok {
						add(s, where)
					} else if i := paramIndex(fn, n.Args[0]); i >= 0 {
						pending = append(pending, envRead{pkg: ip, fn: fn, param: i, where: where})
					} else {
						bad = append(bad, where)
					}
				}
				return true
			}
			for _, decl := range f.Decls {
				fn, _ = decl.(*ast.FuncDecl) // nil for package-level declarations
				ast.Inspect(decl, visit)
			}
		}
	}
	// Follow each parameter read to the calls of its function.
	for _, r := range pending {
		pk := pkgs[r.pkg]
		calls := 0
		for _, f := range pk.files {
			ast.Inspect(f, func(n ast.Node) bool {
				c, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				id, ok := c.Fun.(*ast.Ident)
				if !ok || id.Name != r.fn.Name.Name || r.param >= len(c.Args) {
					return true
				}
				calls++
				arg := c.Args[r.param]
				where := fset.Position(c.Pos()).String()
				if s, ok := stringLit(arg); ok {
					add(s, where)
				} else if id, ok := arg.(*ast.Ident); ok && pk.consts[id.Name] != "" {
					add(pk.consts[id.Name], where)
				} else {
					bad = append(bad, where+" (through "+r.where+")")
				}
				return true
			})
		}
		if calls == 0 {
			bad = append(bad, r.where+" (its function is never called)")
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return nil, fmt.Errorf("envlist: environment reads whose variable name is not a constant: %s", strings.Join(bad, "; "))
	}
	return reads, nil
}

// isEnvRead says whether fun is os.Getenv, os.LookupEnv or syscall.Getenv
// under the file's import names.
func isEnvRead(fun ast.Expr, imports map[string]string) bool {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok {
		return false
	}
	switch imports[x.Name] {
	case "os":
		return sel.Sel.Name == "Getenv" || sel.Sel.Name == "LookupEnv"
	case "syscall":
		return sel.Sel.Name == "Getenv"
	}
	return false
}

// paramIndex is the position of the parameter e names in fn, or -1.
func paramIndex(fn *ast.FuncDecl, e ast.Expr) int {
	id, ok := e.(*ast.Ident)
	if !ok || fn == nil {
		return -1
	}
	i := 0
	for _, field := range fn.Type.Params.List {
		for _, n := range field.Names {
			if n.Name == id.Name {
				return i
			}
			i++
		}
		if len(field.Names) == 0 {
			i++
		}
	}
	return -1
}

// majorVersion is the last element of a module path's major-version
// suffix ("…/cli/v2"), which is not the package's name.
var majorVersion = regexp.MustCompile(`^v[0-9]+$`)

// fileImports maps the names a file's imports are known by to their paths.
func fileImports(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			continue
		}
		name := path.Base(p)
		if majorVersion.MatchString(name) {
			name = path.Base(path.Dir(p))
		}
		if imp.Name != nil {
			name = imp.Name.Name
		}
		m[name] = p
	}
	return m
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

// readmeEnvTable returns the variables named in the first column of the
// table under the README's "## Environment variables" heading.
func readmeEnvTable(readme string) (map[string]bool, error) {
	_, after, ok := strings.Cut(readme, "\n## Environment variables\n")
	if !ok {
		return nil, fmt.Errorf("envlist: README has no \"## Environment variables\" section")
	}
	if i := strings.Index(after, "\n## "); i >= 0 {
		after = after[:i]
	}
	row := regexp.MustCompile("^\\| `([A-Za-z_][A-Za-z0-9_]*)` \\|")
	names := map[string]bool{}
	for _, line := range strings.Split(after, "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			names[m[1]] = true
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("envlist: the \"Environment variables\" section has no table rows")
	}
	return names, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
