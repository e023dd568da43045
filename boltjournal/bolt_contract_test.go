package boltjournal_test

import (
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestBoltStoreUsesOnlyThePublicContract type-checks the root package and
// fails if the bbolt journal (the bolt*.go files) uses an unexported name
// declared outside them: it must see the KeyStore contract as a
// third-party store does (what it shares with the journal is exported in
// keystore.go, as CheckKey, TrimQuery and Lease.BlockedBy are).
func TestBoltStoreUsesOnlyThePublicContract(t *testing.T) {
	bp, err := build.ImportDir(".", 0) // the files this build compiles, tests excluded
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check("github.com/idemgo/idem", fset, files, info)
	if err != nil {
		t.Fatal(err)
	}
	bolt := func(pos token.Pos) bool { return strings.HasPrefix(filepath.Base(fset.Position(pos).Filename), "bolt") }
	found := map[string]bool{}
	for id, obj := range info.Uses {
		if !bolt(id.Pos()) || obj.Pkg() != pkg || obj.Exported() || bolt(obj.Pos()) {
			continue
		}
		if v, ok := obj.(*types.Var); ok && !v.IsField() && v.Parent() != pkg.Scope() {
			continue // a local variable
		}
		if obj.Parent() != nil && obj.Parent() != pkg.Scope() {
			continue
		}
		p := fset.Position(id.Pos())
		found[obj.Name()+" ("+filepath.Base(fset.Position(obj.Pos()).Filename)+") used at "+filepath.Base(p.Filename)+":"+strconv.Itoa(p.Line)] = true
	}
	if len(found) > 0 {
		var list []string
		for k := range found {
			list = append(list, k)
		}
		sort.Strings(list)
		t.Fatalf("the bbolt journal uses unexported names of the root package:\n\t%s", strings.Join(list, "\n\t"))
	}
}
