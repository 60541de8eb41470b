package framework

import (
	"bytes"
	"encoding/json"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// Payload fields in one pass, without building the document: in a
// duplicate storm (committed-key cache) decoding with encoding/json was most
// of a message's work. payloadValues answers as the decoder would, and asks
// the decoder itself (decodePayload, descendJSON) whenever readFields cannot
// answer exactly: a refused payload (for the decoder's reason), an escaped
// member name on a path, a path that leads to no scalar. FuzzReadFields and
// TestReadFieldsRandomDocuments check that the two agree. Why not gjson or
// jsonparser: docs/benchmarks.md, "Key derivation per payload byte".

// fieldPaths are the payload paths one KeyFunc or TimeFunc reads.
type fieldPaths struct {
	segs [][]string
	// idx is each segment as an array index (strconv.Atoi, as descendJSON
	// reads it), -1 for none; nil when there are more paths than the one
	// bit each readFields has (the decoder reads them).
	idx [][]int
}

func newFieldPaths(paths ...[]string) *fieldPaths {
	fp := &fieldPaths{segs: paths}
	if len(paths) > 64 {
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

// fieldValue is what a path leads to: a string, json.Number or bool, or the
// reason it leads nowhere (the payload's own when it is refused).
type fieldValue struct {
	v      any
	reason string
}

// payloadValues fills out[i] with the value at fp.segs[i].
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

// readFields validates payload as strictly as decodePayload and sets bit i
// of found where out[i] holds a scalar. A repeated member name replaces what
// the earlier one led to, as in the decoder's map. !ok: refused, or left to
// the decoder.
func readFields(payload []byte, paths *fieldPaths, out []fieldValue) (found uint64, ok bool) {
	if paths.idx == nil || len(payload) > maxPayloadBytes || !utf8.Valid(payload) {
		return 0, false
	}
	r := fieldReader{p: payload, paths: paths, raw: make([][]byte, len(out))}
	if r.space(); !r.value(0, 1<<len(paths.segs)-1) {
		return 0, false
	}
	if r.space(); r.i != len(r.p) {
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
	depth int
	paths *fieldPaths
	raw   [][]byte // the text of each path's value
	found uint64   // paths whose raw holds their value
}

func (r *fieldReader) space() {
	for r.i < len(r.p) && (r.p[r.i] == ' ' || r.p[r.i] == '\t' || r.p[r.i] == '\n' || r.p[r.i] == '\r') {
		r.i++
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
	case c == '{' || c == '[':
		ok = r.container(level, mask)
	case c == '"':
		_, ok = r.str()
	case c == '-' || (c >= '0' && c <= '9'):
		ok = r.number()
	default:
		for _, w := range [...]string{"true", "false", "null"} {
			if ok = bytes.HasPrefix(r.p[r.i:], []byte(w)); ok {
				r.i += len(w)
				break
			}
		}
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

// scalar is raw, a value readFields accepted, as the decoder gives it; !ok
// for null, an object or an array (the decoder names what it found).
func scalar(raw []byte) (v any, ok bool) {
	switch raw[0] {
	case '"':
		if bytes.IndexByte(raw, '\\') < 0 {
			return string(raw[1 : len(raw)-1]), true
		}
		// Escapes are rare in keys: the decoder decodes them, so that the
		// two cannot disagree.
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

// container reads the object or array at r.i.
func (r *fieldReader) container(level int, mask uint64) bool {
	end := r.p[r.i] + 2 // '{' + 2 is '}', '[' + 2 is ']'
	r.i++
	if r.depth++; r.depth > maxPayloadDepth {
		return false
	}
	r.space()
	if r.i < len(r.p) && r.p[r.i] == end {
		r.i++
		r.depth--
		return true
	}
	for n := 0; ; n++ {
		var sub uint64
		if end == ']' {
			for m := mask; m != 0; m &= m - 1 {
				i := bits.TrailingZeros64(m)
				if idx := r.paths.idx[i]; len(idx) > level && idx[level] == n {
					sub |= 1 << i
				}
			}
		} else {
			if r.i >= len(r.p) || r.p[r.i] != '"' {
				return false
			}
			start := r.i + 1
			esc, ok := r.str()
			if !ok {
				return false
			}
			for m := mask; m != 0; m &= m - 1 {
				i := bits.TrailingZeros64(m)
				segs := r.paths.segs[i]
				if len(segs) <= level {
					continue
				}
				if esc {
					return false // "order\u005fid" is order_id: the decoder's job
				}
				if string(r.p[start:r.i-1]) == segs[level] {
					sub |= 1 << i
					r.found &^= 1 << i
				}
			}
			r.space()
			if r.i >= len(r.p) || r.p[r.i] != ':' {
				return false
			}
			r.i++
			r.space()
		}
		if !r.value(level+1, sub) {
			return false
		}
		r.space()
		switch {
		case r.i >= len(r.p):
			return false
		case r.p[r.i] == ',':
			r.i++
			r.space()
		case r.p[r.i] == end:
			r.i++
			r.depth--
			return true
		default:
			return false
		}
	}
}

// str reads the string at r.i; esc reports escapes in it, which must be
// well formed, surrogates paired (scanPayload's rule).
func (r *fieldReader) str() (esc, ok bool) {
	for i := r.i + 1; i < len(r.p); {
		switch c := r.p[i]; {
		case c == '"':
			r.i = i + 1
			return esc, true
		case c < 0x20:
			return false, false
		case c != '\\':
			i++
		default:
			n, _ := escapeLen(r.p, i)
			if n == 0 {
				return false, false
			}
			esc = true
			i += n
		}
	}
	return false, false
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? (RFC 8259).
func (r *fieldReader) number() bool {
	p, i := r.p, r.i
	if p[i] == '-' {
		i++
	}
	j := digits(p, i)
	if j == i || (p[i] == '0' && j > i+1) {
		return false
	}
	if i = j; i < len(p) && p[i] == '.' {
		if j = digits(p, i+1); j == i+1 {
			return false
		}
		i = j
	}
	if i < len(p) && (p[i] == 'e' || p[i] == 'E') {
		if i++; i < len(p) && (p[i] == '+' || p[i] == '-') {
			i++
		}
		if j = digits(p, i); j == i {
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
