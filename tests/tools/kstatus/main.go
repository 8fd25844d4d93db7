// Command kstatus reads Kubernetes objects as JSON on stdin (one object, a JSON array of
// objects, or a List) and prints, for each, what sigs.k8s.io/cli-utils/pkg/kstatus computes:
// one JSON line {"name", "status", "message", "conditions"}. It is the library Flux and
// kpt use to decide whether an object is Current, InProgress, Failed or Terminating; the
// Polymorph tests feed it live ModelDeployments and CompileJobs.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type output struct {
	Name       string             `json:"name"`
	Status     string             `json:"status"`
	Message    string             `json:"message"`
	Conditions []status.Condition `json:"conditions"`
}

func objects(data []byte) ([]map[string]interface{}, error) {
	var any interface{}
	if err := json.Unmarshal(data, &any); err != nil {
		return nil, fmt.Errorf("stdin is not JSON: %w", err)
	}
	switch v := any.(type) {
	case []interface{}:
		out := make([]map[string]interface{}, 0, len(v))
		for i, item := range v {
			obj, ok := item.(map[string]interface{})
			if !ok {
				return nil, fmt.Errorf("item %d is not an object", i)
			}
			out = append(out, obj)
		}
		return out, nil
	case map[string]interface{}:
		if items, ok := v["items"].([]interface{}); ok {
			return objects(mustJSON(items))
		}
		return []map[string]interface{}{v}, nil
	}
	return nil, fmt.Errorf("stdin holds neither an object nor a list")
}

func mustJSON(v interface{}) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading stdin:", err)
		os.Exit(2)
	}
	objs, err := objects(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, obj := range objs {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(mustJSON(obj)); err != nil {
			fmt.Fprintln(os.Stderr, "kstatus: not a Kubernetes object:", err)
			os.Exit(2)
		}
		res, err := status.Compute(u)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: %s: %v\n", u.GetName(), err)
			os.Exit(1)
		}
		conds := res.Conditions
		if conds == nil {
			conds = []status.Condition{}
		}
		if err := enc.Encode(output{u.GetName(), string(res.Status), res.Message, conds}); err != nil {
			fmt.Fprintln(os.Stderr, "kstatus:", err)
			os.Exit(1)
		}
	}
}
