package framework_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/claimtx/claimtx/framework"
)

// A small alphabet full of the characters that matter (separators, the
// escape character, braces, a multi-byte character and one sharing its
// first byte) makes collisions likely if the rule had a hole.
var keyRunes = []rune{'a', 'b', ':', '\\', '/', '{', '}', 'é', 'è', '-'}

type genTemplate struct {
	spec    string
	lits    []string // lits[i] precedes placeholder i; lits[n] ends the key
	names   []string // placeholder i reads metadata names[i] or payload names[i]
	payload []bool
}

func drawTemplate(t *rapid.T) genTemplate {
	n := rapid.IntRange(1, 4).Draw(t, "placeholders")
	var g genTemplate
	var spec strings.Builder
	for i := 0; i <= n; i++ {
		lit := rapid.StringOfN(rapid.SampledFrom(keyRunes), 0, 3, -1).Draw(t, fmt.Sprintf("lit%d", i))
		if i > 0 && i < n {
			// Between placeholders: not empty, not starting with the
			// escape character (both refused at parse time).
			for lit == "" || lit[0] == '\\' {
				lit = rapid.StringOfN(rapid.SampledFrom(keyRunes), 1, 3, -1).Draw(t, fmt.Sprintf("lit%d'", i))
			}
		}
		g.lits = append(g.lits, lit)
		spec.WriteString(strings.NewReplacer("{", "{{", "}", "}}").Replace(lit))
		if i == n {
			break
		}
		name := fmt.Sprintf("f%d", i)
		g.names = append(g.names, name)
		isPayload := rapid.Bool().Draw(t, fmt.Sprintf("payload%d", i))
		g.payload = append(g.payload, isPayload)
		if isPayload {
			spec.WriteString("{payload." + name + "}")
		} else {
			spec.WriteString("{metadata." + name + "}")
		}
	}
	g.spec = "template:" + spec.String()
	return g
}

func drawTuple(t *rapid.T, n int, label string) []string {
	return rapid.SliceOfN(rapid.StringOfN(rapid.SampledFrom(keyRunes), 1, 4, -1), n, n).Draw(t, label)
}

func (g genTemplate) message(t *rapid.T, vals []string) (string, map[string]string) {
	md := map[string]string{}
	doc := map[string]string{}
	for i, v := range vals {
		if g.payload[i] {
			doc[g.names[i]] = v
		} else {
			md[g.names[i]] = v
		}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), md
}

// shift moves a boundary between two neighbouring values, the mutation that
// made (a:b, c) and (a, b:c) collide: the same characters, cut elsewhere.
func shift(t *rapid.T, vals []string, sep string) []string {
	out := slices.Clone(vals)
	if len(out) < 2 {
		return out
	}
	i := rapid.IntRange(0, len(out)-2).Draw(t, "boundary")
	joined := out[i] + sep + out[i+1]
	cut := rapid.IntRange(1, len(joined)-1).Draw(t, "cut")
	// Cut at a byte that starts a character so both halves stay UTF-8.
	for cut < len(joined) && joined[cut]&0xC0 == 0x80 {
		cut++
	}
	if cut >= len(joined) {
		return out
	}
	rest := strings.TrimPrefix(joined[cut:], sep)
	if rest == "" {
		return out
	}
	out[i], out[i+1] = joined[:cut], rest
	return out
}

func TestTemplateInjectiveProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		g := drawTemplate(t)
		kf, err := framework.ParseKeySpec(g.spec)
		if err != nil {
			t.Fatalf("%q: %v", g.spec, err)
		}
		key := func(vals []string) string {
			payload, md := g.message(t, vals)
			k, err := kf(msgWith(payload, md))
			if err != nil {
				t.Fatalf("%q %q: %v", g.spec, vals, err)
			}
			return k
		}
		n := len(g.names)
		a := drawTuple(t, n, "a")
		var b []string
		if n > 1 && rapid.Bool().Draw(t, "shifted") {
			b = shift(t, a, g.lits[1+rapid.IntRange(0, n-2).Draw(t, "lit")])
		} else {
			b = drawTuple(t, n, "b")
		}
		ka, kb := key(a), key(b)
		if !slices.Equal(a, b) && ka == kb {
			t.Fatalf("%q: %q and %q both give key %q", g.spec, a, b, ka)
		}
		// Stronger: the values can be read back from the key.
		if got := decodeTemplateKey(g, ka); !slices.Equal(got, a) {
			t.Fatalf("%q: key %q of %q reads back as %q", g.spec, ka, a, got)
		}
	})
}

// decodeTemplateKey reads the values back from a key by the documented
// rule, independently of the implementation: after the fixed prefix, a
// value that another placeholder follows ends at the first unescaped
// occurrence of the first character of the literal after it; '\' takes the
// next character as it is. The last value is what lies before the fixed
// suffix. It returns nil when the key does not parse.
func decodeTemplateKey(g genTemplate, key string) []string {
	rest, ok := strings.CutPrefix(key, g.lits[0])
	if !ok {
		return nil
	}
	var vals []string
	n := len(g.names)
	for i := 0; i < n-1; i++ {
		lit := g.lits[i+1]
		r := []rune(lit)[0]
		sep := string(r)
		var v strings.Builder
		j := 0
		for {
			if j >= len(rest) {
				return nil
			}
			if rest[j] == '\\' {
				switch {
				case strings.HasPrefix(rest[j+1:], `\`):
					v.WriteByte('\\')
					j += 2
				case strings.HasPrefix(rest[j+1:], sep):
					v.WriteString(sep)
					j += 1 + len(sep)
				default:
					return nil
				}
				continue
			}
			if strings.HasPrefix(rest[j:], sep) {
				break
			}
			v.WriteByte(rest[j])
			j++
		}
		vals = append(vals, v.String())
		if rest, ok = strings.CutPrefix(rest[j:], lit); !ok {
			return nil
		}
	}
	last, ok := strings.CutSuffix(rest, g.lits[n])
	if !ok {
		return nil
	}
	return append(vals, last)
}

// first:: distinct (source, value) pairs give distinct keys, and the
// first source's keys without the mark are unchanged.
func TestFirstNonEmptyInjectiveProperty(t *testing.T) {
	t.Parallel()
	first, err := framework.ParseKeySpec("first:metadata:s0|metadata:s1|metadata:s2")
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(t *rapid.T) {
		seen := map[string]string{}
		for j := 0; j < 20; j++ {
			src := rapid.IntRange(0, 2).Draw(t, "source")
			v := rapid.StringOfN(rapid.SampledFrom(append(slices.Clone(keyRunes), '0', '1', '2')), 1, 5, -1).Draw(t, "value")
			k, err := first(msgWith("", map[string]string{fmt.Sprintf("s%d", src): v}))
			if err != nil {
				t.Fatal(err)
			}
			if src == 0 && v[0] != '\\' && k != v {
				t.Fatalf("first source's %q keyed as %q", v, k)
			}
			id := fmt.Sprintf("%d/%s", src, v)
			if prev, dup := seen[k]; dup && prev != id {
				t.Fatalf("%s and %s both give key %q", prev, id, k)
			}
			seen[k] = id
		}
	})
}
