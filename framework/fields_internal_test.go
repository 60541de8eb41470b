package framework

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// decoderValue is what the path leads to through encoding/json's document:
// the oracle for readFields.
func decoderValue(t *testing.T, payload []byte, segs []string) fieldValue {
	doc, err := decodePayload(payload)
	if err != nil {
		t.Fatalf("readFields read %q, the decoder refuses it: %v", payload, err)
	}
	var f fieldValue
	f.v, f.reason = descendJSON(doc, segs)
	return f
}

// checkFields asserts readFields's soundness on one input: where it reads
// the payload, the decoder accepts it too, and each path readFields found a
// scalar at gives exactly the decoder's key and event time (or the same
// error). It returns whether readFields read it, and how many paths led to
// a key.
func checkFields(t *testing.T, payload string, paths ...string) bool {
	read, _ := checkFieldsKeys(t, payload, paths...)
	return read
}

func checkFieldsKeys(t *testing.T, payload string, paths ...string) (read bool, keys int) {
	t.Helper()
	var segs [][]string
	for _, p := range paths {
		s, err := parsePath(p)
		if err != nil {
			return false, 0
		}
		segs = append(segs, s)
	}
	fp := newFieldPaths(segs...)
	out := make([]fieldValue, len(segs))
	found, ok := readFields([]byte(payload), fp, out)
	if !ok {
		return false, 0
	}
	for i, s := range segs {
		slow := decoderValue(t, []byte(payload), s)
		if found&(1<<i) == 0 {
			continue // payloadValues asks the decoder
		}
		fast := out[i]
		fk, ferr := keyValue(fast, "x")
		sk, serr := keyValue(slow, "x")
		if fk != sk || errText(ferr) != errText(serr) {
			t.Fatalf("payload %q path %q: readFields key %q (%v), decoder %q (%v)", payload, paths[i], fk, ferr, sk, serr)
		}
		if ferr == nil {
			keys++
		}
		ft, ferr := eventTimeValue(fast, "x")
		st, serr := eventTimeValue(slow, "x")
		if !ft.Equal(st) || errText(ferr) != errText(serr) {
			t.Fatalf("payload %q path %q: readFields time %v (%v), decoder %v (%v)", payload, paths[i], ft, ferr, st, serr)
		}
	}
	return true, keys
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestReadFields(t *testing.T) {
	for _, tc := range []struct {
		payload string
		paths   []string
		// read: readFields must read it (the fast path serves it); the
		// rest are left to the decoder, and checkFields only checks that
		// what readFields does read agrees with it.
		read bool
	}{
		{`{"order_id": 9912, "customer_id": 7, "lines": [{"sku": "a"}]}`, []string{"order_id"}, true},
		{`{"order_id": "A-17"}`, []string{"order_id"}, true},
		{` {"a": {"b": [1, {"c": "x\n\u00e9\ud83d\ude00\/"}]}} `, []string{"a.b.1.c", "a.b.0"}, true},
		{`{"n": 9.912e+03}`, []string{"n"}, true},
		{`{"n": -0.0}`, []string{"n"}, true},
		{`{"b": true, "f": false, "z": null}`, []string{"b", "f", "z"}, true},
		{`{"a": 1, "a": 2}`, []string{"a"}, true},                 // the last name counts
		{`{"a": {"b": 1}, "a": {"c": 2}}`, []string{"a.b"}, true}, // the second a has no b
		{`{"a": {"b": 1}, "a": 5}`, []string{"a.b"}, true},
		{`{"a": [10, 20]}`, []string{"a.+1", "a.01", "a.-0", "a.2", "a.x"}, true}, // Atoi's reading of an index
		{`[{"id": "p"}]`, []string{"0.id"}, true},
		{`"x"`, []string{"a"}, true},
		{`{"t": "2026-12-01T06:00:00Z", "u": 1764568800.5}`, []string{"t", "u"}, true},
		{`{"e": ""}`, []string{"e"}, true},
		{`{"n": 1e401}`, []string{"n"}, true},
		{`{"n": 0.` + strings.Repeat("7", 600) + `}`, []string{"n"}, true},
		{`{"a": 1, "d": ` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `}`, []string{"a"}, true}, // 64 levels with the object
		// Left to the decoder: refused, or not plain enough here.
		{`{"a": 1, "d": ` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`, []string{"a"}, false},
		{`{"order\u005fid": 1}`, []string{"order_id"}, false},
		{`{"a": 1}]`, []string{"a"}, false},
		{`{"a": 1} {}`, []string{"a"}, false},
		{`{"a": "\ud800"}`, []string{"a"}, false},
		{`{"a": "\udc00\ud800"}`, []string{"a"}, false},
		{"{\"a\": \"\xff\"}", []string{"a"}, false},
		{"{\"a\": \"\x01\"}", []string{"a"}, false},
		{`{"a": 01}`, []string{"a"}, false},
		{`{"a": 1.}`, []string{"a"}, false},
		{`{"a": .5}`, []string{"a"}, false},
		{`{"a": -}`, []string{"a"}, false},
		{`{"a": 1e}`, []string{"a"}, false},
		{`{"a": tru}`, []string{"a"}, false},
		{`{"a": truefalse}`, []string{"a"}, false},
		{`{"a": nul}`, []string{"a"}, false},
		{`{"a": 1,}`, []string{"a"}, false},
		{`{"a" 1}`, []string{"a"}, false},
		{`{'a': 1}`, []string{"a"}, false},
		{`{"a": "\x"}`, []string{"a"}, false},
		{``, []string{"a"}, false},
		{`   `, []string{"a"}, false},
		{`{"a": 1`, []string{"a"}, false},
		{`{"a": "b`, []string{"a"}, false},
	} {
		if got := checkFields(t, tc.payload, tc.paths...); got != tc.read {
			t.Errorf("readFields(%.60q, %q) read = %v, want %v", tc.payload, tc.paths, got, tc.read)
		}
	}
}

// A payload too large is left to the decoder, which refuses it.
func TestReadFieldsSizeLimit(t *testing.T) {
	big := `{"a": 1, "pad": "` + strings.Repeat("x", maxPayloadBytes) + `"}`
	if checkFields(t, big, "a") {
		t.Fatal("readFields read a payload over the size limit")
	}
}

// FuzzReadFields compares the fast path with the decoder on arbitrary
// payloads and paths (see checkFields).
func FuzzReadFields(f *testing.F) {
	for _, s := range []struct{ payload, p1, p2 string }{
		{`{"order_id": 9912, "lines": [{"sku": "a", "qty": 1}]}`, "order_id", "lines.0.sku"},
		{`{"a": {"b": [1, {"c": "x\n\u00e9\ud83d\ude00"}]}, "a": {"b": [2]}}`, "a.b.1.c", "a.b.0"},
		{`{"n": -1.5e-3, "t": "2026-12-01T06:00:00+01:00"}`, "n", "t"},
		{`[true, false, null, "", 0]`, "0", "4"},
		{`{"a\"b": 1, "a": {"": 2}}`, "a", "a.b"},
	} {
		f.Add(s.payload, s.p1, s.p2)
	}
	f.Fuzz(func(t *testing.T, payload, p1, p2 string) {
		checkFields(t, payload, p1, p2)
	})
}

// TestReadFieldsRandomDocuments builds random JSON documents, from parts
// chosen to meet the cases the fast path treats specially (repeated and
// escaped member names, index-like names, every number form, escapes and
// surrogate pairs, deep nesting, values of every type), and compares each
// path into them with the decoder. Random bytes (FuzzReadFields) rarely make
// a document whose paths lead anywhere; these always do.
func TestReadFieldsRandomDocuments(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "0", "1", "01", "+1", "id", "", `a\u0062`, `\"`, "é"}
	numbers := []string{"0", "-0", "7", "-12", "9912", "1.50", "0.0", "1e3", "1E-3", "-2.5e+2", "1e401", "123456789012345678901234567890", "1764568800.25"}
	stringsIn := []string{"", "x", "A-17", `a\nb`, `\u00e9`, `\ud83d\ude00`, `\/\\\"`, "2026-12-01T06:00:00Z", "2026-12-01T06:00:00.5+02:00", "not a time", `\u0000`}
	// gen returns a document and the paths to its values, as a consumer
	// would configure them (escaped names written unescaped).
	var gen func(depth int, at string, leaves *[]string) string
	gen = func(depth int, at string, leaves *[]string) string {
		if at != "" {
			*leaves = append(*leaves, at)
		}
		join := func(seg string) string {
			if at == "" {
				return seg
			}
			return at + "." + seg
		}
		k := rng.IntN(10)
		if depth > 4 {
			k = rng.IntN(6)
		}
		switch k {
		case 0, 1:
			return numbers[rng.IntN(len(numbers))]
		case 2, 3:
			return `"` + stringsIn[rng.IntN(len(stringsIn))] + `"`
		case 4:
			return []string{"true", "false", "null"}[rng.IntN(3)]
		case 5:
			return "[]"
		case 6, 7:
			var b strings.Builder
			b.WriteString("{")
			for i, n := 0, rng.IntN(4); i < n; i++ {
				if i > 0 {
					b.WriteString(",")
				}
				name := names[rng.IntN(len(names))]
				b.WriteString(` "` + name + `" : ` + gen(depth+1, join(strings.ReplaceAll(name, `b`, "b")), leaves))
			}
			b.WriteString("}")
			return b.String()
		default:
			var b strings.Builder
			b.WriteString("[")
			for i, n := 0, rng.IntN(4); i < n; i++ {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(gen(depth+1, join(strconv.Itoa(i)), leaves))
			}
			b.WriteString("]")
			return b.String()
		}
	}
	pathNames := []string{"a", "b", "0", "1", "01", "+1", "id", "2", "é"}
	path := func(leaves []string) string {
		if len(leaves) > 0 && rng.IntN(4) > 0 {
			return leaves[rng.IntN(len(leaves))]
		}
		segs := make([]string, 1+rng.IntN(3))
		for i := range segs {
			segs[i] = pathNames[rng.IntN(len(pathNames))]
		}
		return strings.Join(segs, ".")
	}
	read, keys := 0, 0
	const docs = 30000
	for range docs {
		var leaves []string
		doc := gen(0, "", &leaves)
		r, k := checkFieldsKeys(t, doc, path(leaves), path(leaves), path(leaves))
		if r {
			read++
		}
		keys += k
	}
	// Most documents are plain: the fast path must serve them, or it is
	// not a fast path.
	if read < docs/2 || keys < docs/10 {
		t.Fatalf("readFields read only %d of %d documents, %d paths led to a key", read, docs, keys)
	}
	t.Logf("readFields read %d of %d documents; %d of their paths led to a key", read, docs, keys)
}
