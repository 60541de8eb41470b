package framework

import (
	"encoding/json"
	"math/bits"
	"strconv"
	"unicode/utf16"
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

// jsonScalar is the value found at a path, as a span of the payload.
type jsonScalar struct {
	kind byte // 0: nothing found; 's', 'n', 't', 'f'; 'x': null, an object or an array
	// esc reports whether a string has escapes to decode.
	esc bool
	// raw is a string's text between its quotes, or a number's literal.
	raw []byte
}

// value is v as the decoder gives it (a string, a json.Number or a bool),
// or !ok for a path that found nothing, null, an object or an array.
func (v jsonScalar) value() (any, bool) {
	switch v.kind {
	case 's':
		return v.text(), true
	case 'n':
		return json.Number(v.raw), true
	case 't':
		return true, true
	case 'f':
		return false, true
	}
	return nil, false
}

// fieldValue is what a path leads to: a value as descendJSON gives it, or
// the reason it leads nowhere.
type fieldValue struct {
	v      any
	reason string
}

// payloadValues fills out[i] with the value at fp.segs[i], or returns the
// reason the payload cannot be read (decodePayload's). One pass when
// readFields answers; the decoder otherwise.
func payloadValues(payload []byte, fp *fieldPaths, out []fieldValue) error {
	if fp.idx != nil {
		var buf [4]jsonScalar
		var found []jsonScalar
		if n := len(fp.segs); n > len(buf) {
			found = make([]jsonScalar, n)
		} else {
			found = buf[:n]
		}
		if readFields(payload, fp, found) && scalars(found, out) {
			return nil
		}
	}
	doc, err := decodePayload(payload)
	if err != nil {
		return err
	}
	for i := range out {
		out[i].v, out[i].reason = descendJSON(doc, fp.segs[i])
	}
	return nil
}

// scalars converts what readFields found into out, or reports a path that
// found no scalar (the decoder then says what it found).
func scalars(found []jsonScalar, out []fieldValue) bool {
	for i, f := range found {
		v, ok := f.value()
		if !ok {
			return false
		}
		out[i] = fieldValue{v: v}
	}
	return true
}

// text is a string's value, its escapes decoded as encoding/json decodes
// them. readFields accepted it, so every escape is well formed and every
// surrogate escape paired.
func (v jsonScalar) text() string {
	if !v.esc {
		return string(v.raw)
	}
	b := make([]byte, 0, len(v.raw))
	s := v.raw
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			b = append(b, s[i])
			i++
			continue
		}
		switch c := s[i+1]; c {
		case 'u':
			r, _ := hex4(s, i+2)
			i += 6
			if utf16.IsSurrogate(r) {
				lo, _ := hex4(s, i+2)
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			b = utf8.AppendRune(b, r)
		default:
			b = append(b, unescapeByte(c))
			i += 2
		}
	}
	return string(b)
}

func unescapeByte(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // '"', '\\', '/'
}

// readFields validates payload as one JSON value within decodePayload's
// limits and fills out[i] with the scalar at paths.segs[i]. Where a member
// name repeats, the last one counts, as in the decoder's map. ok is false
// when the payload is refused, or is not plain enough to read here.
func readFields(payload []byte, paths *fieldPaths, out []jsonScalar) bool {
	if paths.idx == nil || len(payload) > maxPayloadBytes || !utf8.Valid(payload) {
		return false
	}
	r := fieldReader{p: payload, paths: paths, out: out}
	r.space()
	if r.i == len(r.p) {
		return false
	}
	var all uint64
	for i := range paths.segs {
		all |= 1 << i
	}
	if !r.value(0, all) {
		return false
	}
	r.space()
	return r.i == len(r.p)
}

type fieldReader struct {
	p     []byte
	i     int
	depth int // containers open
	paths *fieldPaths
	out   []jsonScalar
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
	v := jsonScalar{kind: 'x'}
	switch c := r.p[r.i]; {
	case c == '{':
		if !r.object(level, mask) {
			return false
		}
	case c == '[':
		if !r.array(level, mask) {
			return false
		}
	case c == '"':
		s, e, esc, ok := r.str()
		if !ok {
			return false
		}
		v = jsonScalar{kind: 's', esc: esc, raw: r.p[s:e]}
	case c == '-' || (c >= '0' && c <= '9'):
		if !r.number() {
			return false
		}
		v = jsonScalar{kind: 'n', raw: r.p[start:r.i]}
	case c == 't':
		if !r.literal("true") {
			return false
		}
		v.kind = 't'
	case c == 'f':
		if !r.literal("false") {
			return false
		}
		v.kind = 'f'
	case c == 'n':
		if !r.literal("null") {
			return false
		}
	default:
		return false
	}
	for m := mask; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		if len(r.paths.segs[i]) == level {
			r.out[i] = v
		}
	}
	return true
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
		s, e, esc, ok := r.str()
		if !ok {
			return false
		}
		var sub uint64
		if mask != 0 {
			name := r.p[s:e]
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
					r.out[i] = jsonScalar{}
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

// str reads the string at r.i and returns the span between its quotes.
// Escapes must be well formed and surrogate escapes paired (scanPayload's
// rule: the decoder would turn a lone one into U+FFFD).
func (r *fieldReader) str() (start, end int, esc, ok bool) {
	p := r.p
	i := r.i + 1
	start = i
	for i < len(p) {
		c := p[i]
		switch {
		case c == '"':
			r.i = i + 1
			return start, i, esc, true
		case c < 0x20:
			return 0, 0, false, false
		case c != '\\':
			i++
			continue
		}
		esc = true
		if i+1 >= len(p) {
			return 0, 0, false, false
		}
		switch p[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			u, ok := hex4(p, i+2)
			if !ok {
				return 0, 0, false, false
			}
			switch {
			case u >= 0xD800 && u <= 0xDBFF:
				lo, ok := hex4(p, i+8)
				if !ok || p[i+6] != '\\' || p[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
					return 0, 0, false, false
				}
				i += 12
			case u >= 0xDC00 && u <= 0xDFFF:
				return 0, 0, false, false
			default:
				i += 6
			}
		default:
			return 0, 0, false, false
		}
	}
	return 0, 0, false, false
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
