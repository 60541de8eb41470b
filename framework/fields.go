package framework

import (
	"bytes"
	"encoding/json"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// Payload fields without encoding/json. decodePayload builds the whole
// document (a map or slice per container, an interface per value) to read
// one or two fields; in a duplicate storm, when the claim itself costs
// nothing (committed-key cache), that decoding was most of a message's
// work. readFields makes one pass over the payload instead, validating it
// as strictly and keeping only the scalars the paths name.
//
// payloadValues is the one entry point: it gives the values the decoder
// would, taking the decoder's path itself whenever readFields cannot answer
// exactly (a refused payload, to give the decoder's reason; a member name
// written with escapes on a path; a path that leads to no scalar). So
// readFields must agree with the decoder only where it answers;
// FuzzReadFields and TestReadFieldsRandomDocuments check that.
//
// Not a library: github.com/tidwall/gjson and github.com/buger/jsonparser
// check neither UTF-8, nesting depth nor surrogate escapes, and take the
// first of repeated member names where the decoder takes the last, so each
// needs passes of its own around it; gjson so wrapped took twice this
// reader's time (docs/benchmarks.md, "Key derivation per payload byte").

// fieldPaths are the payload paths one KeyFunc or TimeFunc reads.
type fieldPaths struct {
	segs [][]string
	// idx is each segment read as an array index the way descendJSON
	// reads it (strconv.Atoi), or -1 where it names no element; nil when
	// there are more paths than one pass follows (the decoder reads them).
	idx [][]int
}

// maxFieldPaths is how many paths one pass follows (one bit each).
const maxFieldPaths = 64

func newFieldPaths(paths ...[]string) *fieldPaths {
	fp := &fieldPaths{segs: paths}
	if len(paths) > maxFieldPaths {
		return fp
	}
	fp.idx = make([][]int, len(paths))
	for i, segs := range paths {
		fp.idx[i] = make([]int, len(segs))
		for j, s := range segs {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				n = -1
			}
			fp.idx[i][j] = n
		}
	}
	return fp
}

// fieldValue is what a path leads to: a value as descendJSON gives it (a
// string, a json.Number or a bool when readFields found it), or the reason
// it leads nowhere, the payload's own when it cannot be read.
type fieldValue struct {
	v      any
	reason string
}

// payloadValues fills out[i] with the value at fp.segs[i], or with the
// reason the payload cannot be read (decodePayload's). One pass when
// readFields finds a scalar at every path; the decoder otherwise.
func payloadValues(payload []byte, fp *fieldPaths, out []fieldValue) {
	if found, ok := readFields(payload, fp, out); ok && found == 1<<len(fp.segs)-1 {
		return
	}
	doc, err := decodePayload(payload)
	for i := range out {
		if err != nil {
			out[i] = fieldValue{reason: err.Error()}
		} else {
			out[i].v, out[i].reason = descendJSON(doc, fp.segs[i])
		}
	}
}

// readFields validates payload as one JSON value within decodePayload's
// limits and fills out[i] with the scalar at paths.segs[i], setting bit i
// of found. Where a member name repeats, the last one counts, as in the
// decoder's map. ok is false when the payload is refused, or is not plain
// enough to read here.
func readFields(payload []byte, paths *fieldPaths, out []fieldValue) (found uint64, ok bool) {
	if paths.idx == nil || len(payload) > maxPayloadBytes || !utf8.Valid(payload) {
		return 0, false
	}
	// The text of each path's value, decoded once the pass is over: a
	// repeated member name replaces it, and only the last counts.
	var buf [4][]byte
	r := fieldReader{p: payload, paths: paths, raw: buf[:]}
	if len(out) > len(buf) {
		r.raw = make([][]byte, len(out))
	}
	r.space()
	if !r.value(0, 1<<len(paths.segs)-1) {
		return 0, false
	}
	r.space()
	if r.i != len(r.p) {
		return 0, false
	}
	for m := r.found; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		if v, ok := scalar(r.raw[i]); ok {
			out[i] = fieldValue{v: v}
		} else {
			r.found &^= 1 << i
		}
	}
	return r.found, true
}

type fieldReader struct {
	p     []byte
	i     int
	depth int // containers open
	paths *fieldPaths
	raw   [][]byte // the value at each path, as text
	found uint64   // paths whose raw holds their value
}

func (r *fieldReader) space() {
	for r.i < len(r.p) {
		switch r.p[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// value reads the value at r.i, at path level `level`; mask holds the
// paths whose first `level` segments lead here.
func (r *fieldReader) value(level int, mask uint64) bool {
	if r.i >= len(r.p) {
		return false
	}
	start := r.i
	ok := false
	switch c := r.p[r.i]; {
	case c == '{':
		ok = r.object(level, mask)
	case c == '[':
		ok = r.array(level, mask)
	case c == '"':
		_, ok = r.str()
	case c == '-' || (c >= '0' && c <= '9'):
		ok = r.number()
	case c == 't':
		ok = r.literal("true")
	case c == 'f':
		ok = r.literal("false")
	case c == 'n':
		ok = r.literal("null")
	}
	if !ok {
		return false
	}
	for m := mask; m != 0; m &= m - 1 {
		if i := bits.TrailingZeros64(m); len(r.paths.segs[i]) == level {
			r.raw[i] = r.p[start:r.i]
			r.found |= 1 << i
		}
	}
	return true
}

// scalar is the value raw, a value readFields accepted, as the decoder
// gives it; !ok for null, an object or an array (the decoder names what
// it found).
func scalar(raw []byte) (v any, ok bool) {
	switch raw[0] {
	case '"':
		if bytes.IndexByte(raw, '\\') < 0 {
			return string(raw[1 : len(raw)-1]), true
		}
		// Escapes are rare in keys: let the decoder itself decode them,
		// so that the two cannot disagree.
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err == nil
	case 't':
		return true, true
	case 'f':
		return false, true
	case 'n', '{', '[':
		return nil, false
	}
	return json.Number(raw), true
}

// open enters the container at r.i; empty reports one that close ends at
// once.
func (r *fieldReader) open(close byte) (empty, ok bool) {
	r.depth++
	r.i++
	if r.depth > maxPayloadDepth {
		return false, false
	}
	r.space()
	if r.i < len(r.p) && r.p[r.i] == close {
		r.i++
		r.depth--
		return true, true
	}
	return false, true
}

// next reads what follows a member or an element: a comma (more) or close.
func (r *fieldReader) next(close byte) (more, ok bool) {
	r.space()
	if r.i >= len(r.p) {
		return false, false
	}
	switch r.p[r.i] {
	case ',':
		r.i++
		r.space()
		return true, true
	case close:
		r.i++
		r.depth--
		return false, true
	}
	return false, false
}

func (r *fieldReader) object(level int, mask uint64) bool {
	if empty, ok := r.open('}'); empty || !ok {
		return ok
	}
	for {
		if r.i >= len(r.p) || r.p[r.i] != '"' {
			return false
		}
		start := r.i + 1
		esc, ok := r.str()
		if !ok {
			return false
		}
		var sub uint64
		if mask != 0 {
			name := r.p[start : r.i-1]
			for m := mask; m != 0; m &= m - 1 {
				i := bits.TrailingZeros64(m)
				segs := r.paths.segs[i]
				if len(segs) <= level {
					continue
				}
				if esc {
					// "order\u005fid" is order_id to the decoder;
					// leave such payloads to it.
					return false
				}
				if string(name) == segs[level] {
					sub |= 1 << i
					// A repeated name replaces what the earlier one led to.
					r.found &^= 1 << i
				}
			}
		}
		r.space()
		if r.i >= len(r.p) || r.p[r.i] != ':' {
			return false
		}
		r.i++
		r.space()
		if !r.value(level+1, sub) {
			return false
		}
		if more, ok := r.next('}'); !more {
			return ok
		}
	}
}

func (r *fieldReader) array(level int, mask uint64) bool {
	if empty, ok := r.open(']'); empty || !ok {
		return ok
	}
	for n := 0; ; n++ {
		var sub uint64
		for m := mask; m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m)
			if idx := r.paths.idx[i]; len(idx) > level && idx[level] == n {
				sub |= 1 << i
			}
		}
		if !r.value(level+1, sub) {
			return false
		}
		if more, ok := r.next(']'); !more {
			return ok
		}
	}
}

// str reads the string at r.i; esc reports escapes in it. Escapes must be
// well formed and surrogate escapes paired (scanPayload's rule: the
// decoder would turn a lone one into U+FFFD).
func (r *fieldReader) str() (esc, ok bool) {
	p := r.p
	for i := r.i + 1; i < len(p); {
		switch c := p[i]; {
		case c == '"':
			r.i = i + 1
			return esc, true
		case c < 0x20:
			return false, false
		case c != '\\':
			i++
		default:
			n, _ := escapeLen(p, i)
			if n == 0 {
				return false, false
			}
			esc = true
			i += n
		}
	}
	return false, false
}

// number reads an RFC 8259 number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (r *fieldReader) number() bool {
	p, i := r.p, r.i
	if p[i] == '-' {
		i++
	}
	switch {
	case i < len(p) && p[i] == '0':
		i++
	case i < len(p) && p[i] >= '1' && p[i] <= '9':
		i = digits(p, i)
	default:
		return false
	}
	if i < len(p) && p[i] == '.' {
		j := digits(p, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(p) && (p[i] == 'e' || p[i] == 'E') {
		i++
		if i < len(p) && (p[i] == '+' || p[i] == '-') {
			i++
		}
		j := digits(p, i)
		if j == i {
			return false
		}
		i = j
	}
	r.i = i
	return true
}

func digits(p []byte, i int) int {
	for i < len(p) && p[i] >= '0' && p[i] <= '9' {
		i++
	}
	return i
}

func (r *fieldReader) literal(word string) bool {
	if len(r.p)-r.i < len(word) || string(r.p[r.i:r.i+len(word)]) != word {
		return false
	}
	r.i += len(word)
	return true
}
