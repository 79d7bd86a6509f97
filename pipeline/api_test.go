package pipeline

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestAPINamesNoActorsType: no exported name of package pipeline is an
// alias of a type, or a constant or variable spelt, from package actors
// (issue 24: a newcomer reads pipeline's API without opening actors). The
// progress events are aliases of package actors/progress, the leaf both
// import; Strategy, Memory, Hooks, Future and UnitState are pipeline's
// own and are converted where Open hands them to the actors.
func TestAPINamesNoActorsType(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range g.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						checked++
						if s.Assign.IsValid() && fromActors(s.Type) {
							t.Errorf("%s: type %s is an alias of package actors' %s", fset.Position(s.Pos()), s.Name, types(s.Type))
						}
					}
				case *ast.ValueSpec:
					for i, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						checked++
						if s.Type != nil && fromActors(s.Type) {
							t.Errorf("%s: %s has package actors' type %s", fset.Position(n.Pos()), n, types(s.Type))
						}
						if i < len(s.Values) && fromActors(s.Values[i]) {
							t.Errorf("%s: %s is spelt from package actors", fset.Position(n.Pos()), n)
						}
					}
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d exported names checked: the test no longer reads the package", checked)
	}
}

// fromActors reports whether e names anything of package actors.
func fromActors(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "actors" {
				found = true
			}
		}
		return !found
	})
	return found
}

func types(e ast.Expr) string {
	if sel, ok := e.(*ast.SelectorExpr); ok {
		return sel.Sel.Name
	}
	return "expression"
}

// TestOwnTypesMatchActors: pipeline's Strategy and UnitState map onto
// package actors' one for one, by name, in both directions.
func TestOwnTypesMatchActors(t *testing.T) {
	var names []string
	for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
		names = append(names, s.String())
		if s.toActors().String() != s.String() {
			t.Errorf("%v runs as actors' %v", s, s.toActors())
		}
		if got, err := ParseStrategy(s.String()); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v; want %v", s.String(), got, err, s)
		}
	}
	if want := []string{"prefetch", "eager", "lazy", "host-f32"}; !slices.Equal(names, want) {
		t.Errorf("strategies %v, want %v", names, want)
	}
	if s, err := ParseStrategy(""); err != nil || s != Prefetch {
		t.Errorf(`ParseStrategy("") = %v, %v; want prefetch`, s, err)
	}
	if _, err := ParseStrategy("fast"); err == nil {
		t.Error(`ParseStrategy("fast") accepted`)
	}
	names = nil
	for _, s := range []UnitState{UnitPending, UnitEnqueued, UnitResident, UnitFailed} {
		names = append(names, s.String())
		if got := unitState(actorsStates[s]); got != s {
			t.Errorf("%v comes back from actors as %v", s, got)
		}
	}
	if want := []string{"pending", "enqueued", "resident", "failed"}; !slices.Equal(names, want) {
		t.Errorf("unit states %v, want %v", names, want)
	}
}
