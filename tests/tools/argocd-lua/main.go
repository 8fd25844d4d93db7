// Command argocd-lua runs Argo CD resource health scripts (health.lua) the way Argo CD's
// controller runs a resource.customizations script: in gopher-lua (Lua 5.1), with the
// standard libraries off except package, base, table and an os table that has only time,
// a one-second deadline, the object as the global obj, and the returned table decoded
// through layeh.com/gopher-json into {status, message}. A status that is not one of
// Argo CD's health codes reads as Unknown, as it does in Argo CD.
//
//	argocd-lua test DIR            run every <group>/<Kind>/health_test.yaml under DIR
//	argocd-lua health health.lua   objects as JSON on stdin (one, an array, or a List); one JSON line each
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/yaml"
)

type health struct {
	Status  string `json:"status"`
	Message string `json:"message,omitempty"`
}

var codes = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true, "Degraded": true, "Missing": true,
}

func osTime(L *lua.LState) int {
	L.Push(lua.LNumber(time.Now().Unix()))
	return 1
}

func openSafeOs(L *lua.LState) int {
	mod := L.RegisterModule(lua.OsLibName, map[string]lua.LGFunction{"time": osTime})
	L.Push(mod)
	return 1
}

func value(L *lua.LState, v interface{}) lua.LValue {
	switch x := v.(type) {
	case bool:
		return lua.LBool(x)
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return lua.LString(x.String())
		}
		return lua.LNumber(f)
	case float64:
		return lua.LNumber(x)
	case string:
		return lua.LString(x)
	case []interface{}:
		t := L.CreateTable(len(x), 0)
		for _, item := range x {
			t.Append(value(L, item))
		}
		return t
	case map[string]interface{}:
		t := L.CreateTable(0, len(x))
		for k, item := range x {
			t.RawSetH(lua.LString(k), value(L, item))
		}
		return t
	}
	return lua.LNil
}

func run(script string, obj map[string]interface{}) (health, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.fn), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return health{}, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	L.SetGlobal("obj", value(L, obj))
	if err := L.DoString(script); err != nil {
		return health{}, err
	}
	ret := L.Get(-1)
	if ret.Type() != lua.LTTable {
		return health{}, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	data, err := luajson.Encode(ret)
	if err != nil {
		return health{}, err
	}
	var h health
	if err := json.Unmarshal(data, &h); err != nil {
		return health{}, err
	}
	if !codes[h.Status] {
		return health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return h, nil
}

func decode(data []byte) (interface{}, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v interface{}
	err = dec.Decode(&v)
	return v, err
}

func objects(v interface{}) ([]map[string]interface{}, error) {
	switch x := v.(type) {
	case []interface{}:
		var out []map[string]interface{}
		for _, item := range x {
			more, err := objects(item)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		}
		return out, nil
	case map[string]interface{}:
		if items, ok := x["items"].([]interface{}); ok {
			return objects(items)
		}
		return []map[string]interface{}{x}, nil
	}
	return nil, fmt.Errorf("not an object or a list of objects")
}

type testCase struct {
	HealthStatus health `json:"healthStatus"`
	InputPath    string `json:"inputPath"`
}

func runTests(root string) int {
	tests, _ := filepath.Glob(filepath.Join(root, "*", "*", "health_test.yaml"))
	sort.Strings(tests)
	if len(tests) == 0 {
		fmt.Fprintf(os.Stderr, "argocd-lua: no */*/health_test.yaml under %s\n", root)
		return 2
	}
	failed, ran := 0, 0
	for _, path := range tests {
		dir := filepath.Dir(path)
		script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", dir, err)
			failed++
			continue
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", path, err)
			failed++
			continue
		}
		var spec struct {
			Tests []testCase `json:"tests"`
		}
		if err := yaml.Unmarshal(raw, &spec); err != nil || len(spec.Tests) == 0 {
			fmt.Printf("FAIL %s: no tests (%v)\n", path, err)
			failed++
			continue
		}
		for _, tc := range spec.Tests {
			ran++
			name := filepath.Join(filepath.Base(filepath.Dir(dir)), filepath.Base(dir), tc.InputPath)
			data, err := os.ReadFile(filepath.Join(dir, tc.InputPath))
			if err != nil {
				fmt.Printf("FAIL %s: %v\n", name, err)
				failed++
				continue
			}
			v, err := decode(data)
			obj, ok := v.(map[string]interface{})
			if err != nil || !ok {
				fmt.Printf("FAIL %s: not a YAML object (%v)\n", name, err)
				failed++
				continue
			}
			got, err := run(string(script), obj)
			if err != nil {
				fmt.Printf("FAIL %s: %v\n", name, err)
				failed++
				continue
			}
			if got != tc.HealthStatus {
				fmt.Printf("FAIL %s: got %s %q, want %s %q\n", name, got.Status, got.Message, tc.HealthStatus.Status, tc.HealthStatus.Message)
				failed++
				continue
			}
			fmt.Printf("ok   %s: %s %q\n", name, got.Status, got.Message)
		}
	}
	fmt.Printf("%d of %d health tests passed\n", ran-failed, ran)
	if failed > 0 {
		return 1
	}
	return 0
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "test" {
		os.Exit(runTests(os.Args[2]))
	}
	if len(os.Args) != 3 || os.Args[1] != "health" {
		fmt.Fprintln(os.Stderr, "usage: argocd-lua test DIR | argocd-lua health health.lua < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-lua:", err)
		os.Exit(2)
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-lua: reading stdin:", err)
		os.Exit(2)
	}
	v, err := decode(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-lua: stdin is not JSON or YAML:", err)
		os.Exit(2)
	}
	objs, err := objects(v)
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-lua: stdin:", err)
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, obj := range objs {
		h, err := run(string(script), obj)
		meta, _ := obj["metadata"].(map[string]interface{})
		name, _ := meta["name"].(string)
		if err != nil {
			fmt.Fprintf(os.Stderr, "argocd-lua: %s: %v\n", name, err)
			os.Exit(1)
		}
		if err := enc.Encode(map[string]string{"name": name, "status": h.Status, "message": h.Message}); err != nil {
			os.Exit(1)
		}
	}
}
