// Command walk measures how a request's path reads across the files of
// idem's root package: the figures of issue 29's "request's walk".
//
//	cd bench/walk && GOWORK=off go run . ../..
//
// It follows a request from (*Transport).RoundTrip: a depth-first walk over
// the static calls of each function of the package, in source order, each
// function expanded once; a call through the caller interface goes to
// *operation (the keyed request's caller). It prints:
//
//   - functions and files reached;
//   - entries: calls that cross into another file; re-entries: those into a
//     file entered before;
//   - returns: cross-file calls after which the caller goes on calling, so
//     that a reader goes back to the caller's file;
//   - climbs: entries into a file the walk first entered earlier than the
//     one it is in;
//   - calls against the file order: cross-file calls between files that
//     call each other (directly or through others), so that no order of
//     the files has every call going down; when there are none, such an
//     order.
//
// With a second argument it also prints every cross-file call in order;
// with CLIMBS=1 or CYC=1 in the environment, the climbs or the calls
// against the file order.
//
// It is a module of its own, outside the workspace, so that the library's
// and bench's modules do not depend on golang.org/x/tools.
package main

import (
	"fmt"
	"go/ast"
	"go/types"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/tools/go/packages"
)

func main() {
	dir := os.Args[1]
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo, Dir: dir}
	pkgs, err := packages.Load(cfg, ".")
	if err != nil {
		panic(err)
	}
	p := pkgs[0]
	if len(p.Errors) > 0 {
		panic(fmt.Sprint(p.Errors))
	}
	decls := map[*types.Func]*ast.FuncDecl{}
	for _, f := range p.Syntax {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if obj, ok := p.TypesInfo.Defs[fd.Name].(*types.Func); ok {
					decls[obj] = fd
				}
			}
		}
	}
	fileOf := func(n ast.Node) string { return filepath.Base(p.Fset.Position(n.Pos()).Filename) }
	var opType types.Type
	if o := p.Types.Scope().Lookup("operation"); o != nil {
		opType = types.NewPointer(o.Type())
	}
	resolve := func(fn *types.Func) *types.Func {
		if _, ok := decls[fn]; ok {
			return fn
		}
		sig := fn.Type().(*types.Signature)
		if sig.Recv() != nil && types.IsInterface(sig.Recv().Type()) && opType != nil {
			ms := types.NewMethodSet(opType)
			if sel := ms.Lookup(p.Types, fn.Name()); sel != nil {
				if m, ok := sel.Obj().(*types.Func); ok {
					if _, ok := decls[m]; ok {
						return m
					}
				}
			}
		}
		return nil
	}
	var root *types.Func
	for fn, d := range decls {
		if d.Name.Name == "RoundTrip" && d.Recv != nil {
			if named, ok := types.Unalias(fn.Type().(*types.Signature).Recv().Type()).(*types.Pointer); ok && named.Elem().(*types.Named).Obj().Name() == "Transport" {
				root = fn
			}
		}
	}
	seen := map[*types.Func]bool{}
	first := map[string]int{}
	var seq []string
	entries, reentries, returns, climbs := 0, 0, 0, 0
	perFile := map[string]int{}
	var edges [][2]string
	var edgeFn []string
	var walk func(fn *types.Func)
	walk = func(fn *types.Func) {
		seen[fn] = true
		d := decls[fn]
		here := fileOf(d)
		if _, ok := first[here]; !ok {
			first[here] = len(first)
		}
		var calls []*types.Func
		ast.Inspect(d.Body, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var id *ast.Ident
			switch f := ast.Unparen(c.Fun).(type) {
			case *ast.Ident:
				id = f
			case *ast.SelectorExpr:
				id = f.Sel
			case *ast.IndexExpr:
				if x, ok := f.X.(*ast.Ident); ok {
					id = x
				}
			}
			if id == nil {
				return true
			}
			if callee, ok := p.TypesInfo.Uses[id].(*types.Func); ok {
				if r := resolve(callee); r != nil {
					calls = append(calls, r)
				}
			}
			return true
		})
		for i, c := range calls {
			if seen[c] {
				continue
			}
			there := fileOf(decls[c])
			if there != here {
				entries++
				perFile[there]++
				if _, ok := first[there]; ok {
					reentries++
					if first[there] < first[here] {
						climbs++
						if os.Getenv("CLIMBS") != "" {
							fmt.Println("climb:", here, "->", there, decls[c].Name.Name)
						}
					}
				}
				seq = append(seq, here+"→"+there)
				edges = append(edges, [2]string{here, there})
				edgeFn = append(edgeFn, decls[c].Name.Name)
			}
			walk(c)
			if there != here {
				more := false
				for _, c2 := range calls[i+1:] {
					if !seen[c2] {
						more = true
						break
					}
				}
				if more {
					returns++
				}
			}
		}
	}
	walk(root)
	// file graph SCCs (Tarjan)
	adj := map[string]map[string]bool{}
	for _, e := range edges {
		if adj[e[0]] == nil {
			adj[e[0]] = map[string]bool{}
		}
		adj[e[0]][e[1]] = true
	}
	index, low, comp := map[string]int{}, map[string]int{}, map[string]int{}
	on := map[string]bool{}
	var stack []string
	n, nc := 0, 0
	var strong func(v string)
	strong = func(v string) {
		index[v], low[v] = n, n
		n++
		stack = append(stack, v)
		on[v] = true
		ws := []string{}
		for w := range adj[v] {
			ws = append(ws, w)
		}
		sort.Strings(ws)
		for _, w := range ws {
			if _, ok := index[w]; !ok {
				strong(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				comp[w] = nc
				if w == v {
					break
				}
			}
			nc++
		}
	}
	fs := []string{}
	for f := range first {
		fs = append(fs, f)
	}
	sort.Strings(fs)
	for _, f := range fs {
		if _, ok := index[f]; !ok {
			strong(f)
		}
	}
	groups := map[int][]string{}
	for _, f := range fs {
		groups[comp[f]] = append(groups[comp[f]], f)
	}
	cyc := 0
	for i, e := range edges {
		if comp[e[0]] == comp[e[1]] {
			cyc++
			if os.Getenv("CYC") != "" {
				fmt.Println("cycle call:", e[0], "->", e[1], edgeFn[i])
			}
		}
	}
	for _, g := range groups {
		if len(g) > 1 {
			fmt.Println("files calling each other:", g)
		}
	}
	fmt.Printf("calls against the file order (within a cycle of files): %d\n", cyc)
	if cyc == 0 {
		indeg := map[string]int{}
		for _, f := range fs {
			indeg[f] += 0
			for w := range adj[f] {
				indeg[w]++
			}
		}
		var topo []string
		for len(topo) < len(fs) {
			var ready []string
			for _, f := range fs {
				if indeg[f] == 0 {
					ready = append(ready, f)
				}
			}
			sort.Slice(ready, func(i, j int) bool { return first[ready[i]] < first[ready[j]] })
			f := ready[0]
			indeg[f] = -1
			topo = append(topo, f)
			for w := range adj[f] {
				indeg[w]--
			}
		}
		fmt.Println("a file order every call goes down:", topo)
	}
	fmt.Printf("functions %d, files %d, entries %d, re-entries %d, returns %d, climbs %d\n", len(seen), len(first), entries, reentries, returns, climbs)
	type kv struct {
		f string
		n int
	}
	var kvs []kv
	for f, n := range perFile {
		kvs = append(kvs, kv{f, n})
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].n > kvs[j].n || kvs[i].n == kvs[j].n && kvs[i].f < kvs[j].f })
	fmt.Println("entered per file:", kvs)
	order := make([]string, len(first))
	for f, i := range first {
		order[i] = f
	}
	fmt.Println("first-entry order:", order)
	if len(os.Args) > 2 {
		for _, s := range seq {
			fmt.Println(" ", s)
		}
	}
}
