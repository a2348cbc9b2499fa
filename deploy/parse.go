package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"sigs.k8s.io/yaml"
	yaml3 "sigs.k8s.io/yaml/goyaml.v3"
)

// ErrInvalid is wrapped by every error Parse returns.
var ErrInvalid = errors.New("invalid DAG file")

// ParseError lists every problem found in a DAG file. Parse checks the
// whole file, so a file with several mistakes reports all of them at once
// (after a YAML syntax error nothing else can be checked).
type ParseError struct {
	Problems []string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s: %s", ErrInvalid, strings.Join(e.Problems, "; "))
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *ParseError) Unwrap() error { return ErrInvalid }

// Task is one validated task of a Plan.
type Task struct {
	Name string
	// Line is the line of the task's name in the file, 0 when unknown.
	Line   int
	Type   string
	Action string
	Method *Method
	// Request is the decoded args. The runner sends it as is; it must not
	// be modified while a Plan runs.
	Request proto.Message
	// DependsOn names the tasks that must finish first, without
	// duplicates, in file order.
	DependsOn   []string
	IgnoreError bool
}

// Plan is a validated DAG: every type and action resolved, every args
// decoded, every dependency present, no cycle.
type Plan struct {
	// Tasks are in a topological order (dependencies first); ties keep
	// the file's order.
	Tasks  []*Task
	byName map[string]*Task
}

// Task returns the task called name, or nil.
func (p *Plan) Task(name string) *Task { return p.byName[name] }

// taskKeys are the keys a task may have, in the order error messages
// list them.
var taskKeys = []string{"type", "action", "args", "depends_on", "ignore_error"}

// Parse decodes and validates a DAG file with DefaultRegistry.
func Parse(data []byte) (*Plan, error) { return DefaultRegistry().Parse(data) }

// Parse decodes and validates a DAG file in n0cli's format: a YAML map of
// task name to {type, action, args, depends_on, ignore_error}. Unknown
// keys, at task level and at any depth inside args, are errors; args are
// converted YAML → JSON and decoded with protojson into the request of the
// RPC, so field names are the proto (or JSON) names. Every problem is
// reported in one *ParseError; nothing is returned half-valid.
func (r *Registry) Parse(data []byte) (*Plan, error) {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, &ParseError{Problems: []string{"invalid YAML: " + strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")}}
	}
	if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
		return nil, &ParseError{Problems: []string{"no tasks in file"}}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(j, &top); err != nil {
		return nil, &ParseError{Problems: []string{"the file must be a map of task name to task {type, action, args, depends_on, ignore_error}"}}
	}
	if len(top) == 0 {
		return nil, &ParseError{Problems: []string{"no tasks in file"}}
	}

	lines := taskLines(data)
	names := make([]string, 0, len(top))
	for name := range top {
		names = append(names, name)
	}
	// File order when the lines are known, name order otherwise.
	sort.Slice(names, func(a, b int) bool {
		la, lb := lines[names[a]], lines[names[b]]
		if la != lb {
			return la < lb
		}
		return names[a] < names[b]
	})

	var problems []string
	plan := &Plan{byName: map[string]*Task{}}
	var order []*Task
	for _, name := range names {
		t := &Task{Name: name, Line: lines[name]}
		for _, p := range r.decodeTask(t, top[name]) {
			problems = append(problems, t.label()+": "+p)
		}
		plan.byName[name] = t
		order = append(order, t)
	}
	for _, t := range order {
		for _, d := range t.DependsOn {
			if _, ok := plan.byName[d]; !ok {
				problems = append(problems, fmt.Sprintf("%s: depends_on %q: no such task%s", t.label(), d, suggest(d, names)))
			}
		}
	}
	problems = append(problems, cycles(order, plan.byName)...)
	if len(problems) > 0 {
		return nil, &ParseError{Problems: problems}
	}
	plan.Tasks = topoSort(order)
	return plan, nil
}

func (t *Task) label() string {
	if t.Line > 0 {
		return fmt.Sprintf("task %q (line %d)", t.Name, t.Line)
	}
	return fmt.Sprintf("task %q", t.Name)
}

// taskLines maps top-level keys to their line, best effort: the YAML was
// already accepted by the strict converter, and a file this parser reads
// differently only loses line numbers.
func taskLines(data []byte) map[string]int {
	lines := map[string]int{}
	var doc yaml3.Node
	if err := yaml3.Unmarshal(data, &doc); err != nil || doc.Kind != yaml3.DocumentNode || len(doc.Content) == 0 {
		return lines
	}
	m := doc.Content[0]
	if m.Kind != yaml3.MappingNode {
		return lines
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if k.Kind == yaml3.ScalarNode {
			if _, dup := lines[k.Value]; !dup {
				lines[k.Value] = k.Line
			}
		}
	}
	return lines
}

// decodeTask fills t from its JSON object and returns its problems.
func (r *Registry) decodeTask(t *Task, raw json.RawMessage) []string {
	if t.Name == "" {
		return []string{"task name is empty"}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return []string{"must be a mapping with keys " + strings.Join(taskKeys, ", ")}
	}
	var problems []string
	for _, k := range sortedKeys(fields) {
		if !slices.Contains(taskKeys, k) {
			problems = append(problems, fmt.Sprintf("unknown key %q (valid: %s)%s", k, strings.Join(taskKeys, ", "), suggest(k, taskKeys)))
		}
	}
	if v, ok := fields["type"]; ok && json.Unmarshal(v, &t.Type) != nil {
		problems = append(problems, "type must be a string")
	}
	if v, ok := fields["action"]; ok && json.Unmarshal(v, &t.Action) != nil {
		problems = append(problems, "action must be a string")
	}
	if v, ok := fields["ignore_error"]; ok && !isNull(v) && json.Unmarshal(v, &t.IgnoreError) != nil {
		problems = append(problems, "ignore_error must be true or false")
	}
	if v, ok := fields["depends_on"]; ok && !isNull(v) {
		var deps []string
		if json.Unmarshal(v, &deps) != nil {
			problems = append(problems, "depends_on must be a list of task names (quote names YAML reads as booleans or numbers, such as y, no or 1.0)")
			deps = nil
		}
		seen := map[string]bool{}
		for _, d := range deps {
			if !seen[d] {
				seen[d] = true
				t.DependsOn = append(t.DependsOn, d)
			}
		}
	}

	m, err := r.Lookup(t.Type, t.Action)
	if err != nil {
		return append(problems, err.Error())
	}
	t.Method = m
	req, err := decodeArgs(fields["args"], m.Input)
	if err != nil {
		return append(problems, fmt.Sprintf("args of %s.%s: %v", m.Type, t.Action, err))
	}
	t.Request = req
	return problems
}

func isNull(v json.RawMessage) bool {
	t := bytes.TrimSpace(v)
	return len(t) == 0 || string(t) == "null"
}

// decodeArgs decodes a task's args into a new request of type mt. Absent
// or null args are the empty request.
func decodeArgs(raw json.RawMessage, mt protoreflect.MessageType) (proto.Message, error) {
	if isNull(raw) {
		return mt.New().Interface(), nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be a mapping of %s fields", mt.Descriptor().Name())
	}
	return decodeRequest(obj, mt, DecodeOptions{})
}

// cycles finds dependency cycles by depth-first search in file order and
// names each as "A -> B -> A". Edges to missing tasks are ignored (they are
// reported separately).
func cycles(order []*Task, byName map[string]*Task) []string {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var found []string
	seen := map[string]bool{}
	var visit func(t *Task)
	visit = func(t *Task) {
		color[t.Name] = grey
		stack = append(stack, t.Name)
		for _, d := range t.DependsOn {
			dt, ok := byName[d]
			if !ok {
				continue
			}
			switch color[d] {
			case white:
				visit(dt)
			case grey:
				i := len(stack) - 1
				for stack[i] != d {
					i--
				}
				// stack[i:] is d ... t: each depends on the next, and t
				// depends on d.
				cyc := append(append([]string(nil), stack[i:]...), d)
				key := canonicalCycle(cyc[:len(cyc)-1])
				if !seen[key] {
					seen[key] = true
					quoted := make([]string, len(cyc))
					for k := range cyc {
						quoted[k] = fmt.Sprintf("%q", cyc[k])
					}
					found = append(found, "dependency cycle: "+strings.Join(quoted, " -> ")+" (each task depends on the next)")
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[t.Name] = black
	}
	for _, t := range order {
		if color[t.Name] == white {
			visit(t)
		}
	}
	const maxReported = 10
	if len(found) > maxReported {
		found = append(found[:maxReported], fmt.Sprintf("and %d more dependency cycles", len(found)-maxReported))
	}
	return found
}

// canonicalCycle is a rotation-independent key of a cycle.
func canonicalCycle(c []string) string {
	first := 0
	for i := range c {
		if c[i] < c[first] {
			first = i
		}
	}
	return strings.Join(append(append([]string(nil), c[first:]...), c[:first]...), "\x00")
}

// topoSort orders an acyclic task list dependencies first (Kahn), taking
// ready tasks in file order.
func topoSort(order []*Task) []*Task {
	pos := map[string]int{}
	for i, t := range order {
		pos[t.Name] = i
	}
	indeg := map[string]int{}
	children := map[string][]string{}
	for _, t := range order {
		indeg[t.Name] = len(t.DependsOn)
		for _, d := range t.DependsOn {
			children[d] = append(children[d], t.Name)
		}
	}
	var ready []int
	for i, t := range order {
		if indeg[t.Name] == 0 {
			ready = append(ready, i)
		}
	}
	out := make([]*Task, 0, len(order))
	for len(ready) > 0 {
		sort.Ints(ready)
		i := ready[0]
		ready = ready[1:]
		t := order[i]
		out = append(out, t)
		for _, ch := range children[t.Name] {
			indeg[ch]--
			if indeg[ch] == 0 {
				ready = append(ready, pos[ch])
			}
		}
	}
	return out
}

// suggest returns ` (did you mean "x"?)` when one of valid is a near miss
// of s (case, '_' and '-' folded, or one edit away), else "".
func suggest(s string, valid []string) string {
	for _, v := range valid {
		if v != s && (foldName(v) == foldName(s) || oneEdit(s, v)) {
			return fmt.Sprintf(" (did you mean %q?)", v)
		}
	}
	return ""
}

// oneEdit reports whether a and b differ by one inserted, deleted or
// replaced byte.
func oneEdit(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	if len(b)-len(a) > 1 || len(a) < 3 {
		return false
	}
	i := 0
	for i < len(a) && a[i] == b[i] {
		i++
	}
	if len(a) == len(b) {
		return a[i+1:] == b[i+1:]
	}
	return a[i:] == b[i+1:]
}
