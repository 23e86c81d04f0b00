// Command lincheck checks recorded tsoracle histories for linearizability with Porcupine.
//
//	lincheck [-timeout 120s] [-html violation.html] [-run ID] [-window START,END] history.jsonl...
//
// Each history file holds JSON lines written by the Python workload: first a "run" line naming
// the run, then a "call" line when an operation starts and a "ret" line when it ends. Files from
// different runs, or (with -window) clock readings outside the run, are refused: their times are
// not comparable and would produce false violations. An operation without a successful return is
// ambiguous: a read, peek or write that failed changed nothing a later operation can rely on
// (gaps are allowed) and is dropped; an apply, reset or flip may have taken effect at any time
// after its call, so it is given an open-ended return (a failed reset then changes nothing: the
// worker that tried it serves nothing).
//
// Exit status: 0 linearizable, 1 violation, 2 checker timeout, 3 bad input.
package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type line struct {
	Kind     string      `json:"k"`
	ID       string      `json:"id"`
	Client   int         `json:"client"`
	Timeline string      `json:"timeline"`
	Op       string      `json:"op"`
	Arg      json.Number `json:"arg"`
	Value    json.Number `json:"value"`
	OK       bool        `json:"ok"`
	T        int64       `json:"t"`
	Run      string      `json:"run"`
}

// window bounds every clock reading of one run (CLOCK_MONOTONIC nanoseconds).
type window struct {
	set        bool
	start, end int64
}

func parseWindow(text string) (window, error) {
	if text == "" {
		return window{}, nil
	}
	parts := strings.Split(text, ",")
	if len(parts) != 2 {
		return window{}, fmt.Errorf("-window wants START,END, got %q", text)
	}
	start, err1 := strconv.ParseInt(parts[0], 10, 64)
	end, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || end < start {
		return window{}, fmt.Errorf("-window wants START,END in nanoseconds, got %q", text)
	}
	return window{true, start, end}, nil
}

type input struct {
	Timeline string
	Op       string
	Arg      uint64
}

type output struct {
	Value   uint64
	Unknown bool
}

// state is the oracle's per-timeline state: the applied frontier (what read_ts returns) and a
// lower bound on write_ts (the largest write timestamp known to be allocated or applied).
type state struct {
	Read uint64
	WLB  uint64
}

func step(s0 interface{}, in interface{}, out interface{}) (bool, interface{}) {
	s := s0.(state)
	i := in.(input)
	o := out.(output)
	switch i.Op {
	case "write":
		if o.Value > s.Read && o.Value > s.WLB {
			return true, state{s.Read, o.Value}
		}
		return false, s
	case "read":
		return o.Value == s.Read, s
	case "stale-read":
		// Recorded only while fencing is Disabled, for a legacy leader: it may answer from a
		// superseded memory, so the value may lag, but it never passes the read frontier.
		return o.Value <= s.Read, s
	case "peek":
		if o.Value >= s.WLB && o.Value >= s.Read {
			return true, state{s.Read, o.Value}
		}
		return false, s
	case "apply":
		return true, state{max(s.Read, i.Arg), max(s.WLB, i.Arg)}
	case "reset", "flip":
		// A new legacy leader resumes writes above its predecessor's reserved upper; a flip
		// starts the target's writes above everything handed out. Either must cover all that
		// came before. Neither moves the read frontier: reads resume at the last applied
		// timestamp, so a write allocated but not yet applied stays invisible.
		if o.Unknown {
			// An unknown take-over or flip changes nothing a later operation relies on: the
			// worker that tried it serves nothing, and the next one carries the real value.
			return true, s
		}
		if o.Value >= s.Read && o.Value >= s.WLB {
			return true, state{s.Read, o.Value}
		}
		return false, s
	}
	return false, s
}

var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byTimeline := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			tl := op.Input.(input).Timeline
			if _, seen := byTimeline[tl]; !seen {
				names = append(names, tl)
			}
			byTimeline[tl] = append(byTimeline[tl], op)
		}
		sort.Strings(names)
		parts := make([][]porcupine.Operation, 0, len(names))
		for _, n := range names {
			parts = append(parts, byTimeline[n])
		}
		return parts
	},
	Init:  func() interface{} { return state{} },
	Step:  step,
	Equal: func(a, b interface{}) bool { return a.(state) == b.(state) },
	Hash: func(s interface{}) uint64 {
		st := s.(state)
		return st.Read*1000003 ^ st.WLB
	},
	DescribeOperation: func(in interface{}, out interface{}) string {
		i, o := in.(input), out.(output)
		result := strconv.FormatUint(o.Value, 10)
		if o.Unknown {
			result = "?"
		}
		if i.Op == "apply" {
			return fmt.Sprintf("%s apply(%d)", i.Timeline, i.Arg)
		}
		return fmt.Sprintf("%s %s -> %s", i.Timeline, i.Op, result)
	},
	DescribeState: func(s interface{}) string {
		st := s.(state)
		return fmt.Sprintf("read=%d write>=%d", st.Read, st.WLB)
	},
}

func parseUint(n json.Number) (uint64, error) {
	if n == "" {
		return 0, nil
	}
	return strconv.ParseUint(string(n), 10, 64)
}

func load(paths []string, runID string, win window) ([]porcupine.Operation, int, error) {
	calls := map[string]line{}
	rets := map[string]line{}
	var order []string
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return nil, 0, err
		}
		var r io.Reader = f
		if strings.HasSuffix(path, ".gz") { // the regression corpus is stored compressed
			if r, err = gzip.NewReader(f); err != nil {
				return nil, 0, err
			}
		}
		scanner := bufio.NewScanner(r)
		scanner.Buffer(make([]byte, 1<<20), 1<<20)
		fileRun := ""
		for scanner.Scan() {
			if len(scanner.Bytes()) == 0 {
				continue
			}
			var l line
			dec := json.NewDecoder(bytes.NewReader(scanner.Bytes()))
			dec.UseNumber()
			if err := dec.Decode(&l); err != nil {
				continue // a line cut short by SIGKILL: the op stays without a return
			}
			if l.Kind == "run" {
				if fileRun != "" || l.Run == "" {
					return nil, 0, fmt.Errorf("%s: a bad or second run line", path)
				}
				fileRun = l.Run
				if runID == "" {
					runID = l.Run
				} else if l.Run != runID {
					return nil, 0, fmt.Errorf("%s comes from run %s, not %s: "+
						"histories of different runs cannot be checked together", path, l.Run, runID)
				}
				continue
			}
			if fileRun == "" {
				return nil, 0, fmt.Errorf("%s does not start with a run line", path)
			}
			if win.set && (l.T < win.start || l.T > win.end) {
				return nil, 0, fmt.Errorf("%s: op %s read the clock at %d, outside the run "+
					"[%d, %d]: a leftover from another run?", path, l.ID, l.T, win.start, win.end)
			}
			if l.Kind == "call" {
				if _, seen := calls[l.ID]; seen {
					return nil, 0, fmt.Errorf("%s: operation id %s appears twice", path, l.ID)
				}
				calls[l.ID] = l
				order = append(order, l.ID)
			} else {
				rets[l.ID] = l
			}
		}
		f.Close()
	}
	var ops []porcupine.Operation
	dropped := 0
	for _, id := range order {
		c := calls[id]
		arg, err := parseUint(c.Arg)
		if err != nil {
			return nil, 0, fmt.Errorf("op %s: bad arg: %v", id, err)
		}
		in := input{Timeline: c.Timeline, Op: c.Op, Arg: arg}
		r, done := rets[id]
		if done && r.OK {
			v, err := parseUint(r.Value)
			if err != nil {
				return nil, 0, fmt.Errorf("op %s: bad value: %v", id, err)
			}
			ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: in, Call: c.T,
				Output: output{Value: v}, Return: r.T})
			continue
		}
		switch c.Op {
		case "apply", "reset", "flip":
			ops = append(ops, porcupine.Operation{ClientId: c.Client, Input: in, Call: c.T,
				Output: output{Unknown: true}, Return: math.MaxInt64})
		default:
			dropped++
		}
	}
	return ops, dropped, nil
}

func main() {
	timeout := flag.Duration("timeout", 120*time.Second, "give up (and fail) after this long")
	html := flag.String("html", "", "write porcupine's visualization here on a violation")
	runID := flag.String("run", "", "every file must belong to this run")
	windowText := flag.String("window", "", "START,END: every clock reading must lie within")
	flag.Parse()
	win, err := parseWindow(*windowText)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lincheck:", err)
		os.Exit(3)
	}
	ops, dropped, err := load(flag.Args(), *runID, win)
	if err != nil || len(flag.Args()) == 0 {
		fmt.Fprintln(os.Stderr, "lincheck: cannot read histories:", err)
		os.Exit(3)
	}
	start := time.Now()
	result, info := porcupine.CheckOperationsVerbose(model, ops, *timeout)
	verdict := map[porcupine.CheckResult]string{porcupine.Ok: "linearizable",
		porcupine.Illegal: "violation", porcupine.Unknown: "timeout"}[result]
	summary, _ := json.Marshal(map[string]interface{}{"ops": len(ops), "dropped": dropped,
		"verdict": verdict, "seconds": time.Since(start).Seconds()})
	fmt.Println(string(summary))
	if result == porcupine.Illegal && *html != "" {
		if err := porcupine.VisualizePath(model, info, *html); err != nil {
			fmt.Fprintln(os.Stderr, "lincheck: visualization failed:", err)
		}
	}
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		os.Exit(1)
	default:
		os.Exit(2)
	}
}
