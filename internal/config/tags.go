package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A Config struct declares each setting once, in its field's tags:
//
//	URL string `yaml:"url" env:"AMQP_URL,secret" default:"amqp://guest:guest@127.0.0.1:5672/"`
//
// yaml is the key in a file (Decode), env the variable that overrides it
// (Settings), default the value a zero field takes (Defaults). Env options:
//
//	secret    may come from NAME_FILE, never quoted in errors, redacted by Format
//	positive  an integer above 0 (0 would silently mean the default)
//	nonzero   an integer other than 0
//	min=N     an integer, or a duration in nanoseconds, of at least N
//
// Every other check is the Config's own Validate.

// Settings returns a Setting for each env-tagged field of T, nested structs
// included ("kafka.sasl.password").
func Settings[T any]() []Setting[T] {
	var out []Setting[T]
	var walk func(t reflect.Type, index []int, prefix string)
	walk = func(t reflect.Type, index []int, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || key == "" || key == "-" {
				continue
			}
			idx := append(append([]int(nil), index...), i)
			path := prefix + key
			env, opts, _ := strings.Cut(f.Tag.Get("env"), ",")
			switch {
			case env != "":
				out = append(out, Setting[T]{Path: path, Env: env, Secret: hasOpt(opts, "secret"), Set: setter[T](idx, parser(f.Type, opts))})
			case f.Type.Kind() == reflect.Struct:
				walk(f.Type, idx, path+".")
			}
		}
	}
	walk(reflect.TypeFor[T](), nil, "")
	return out
}

func hasOpt(opts, name string) bool { return slices.Contains(strings.Split(opts, ","), name) }

// parser returns how a value is parsed into a field of type t by the env
// options opts; its errors are ApplyEnv's reasons.
func parser(t reflect.Type, opts string) func(dst reflect.Value, v string) error {
	positive, nonzero := hasOpt(opts, "positive"), hasOpt(opts, "nonzero")
	min, hasMin := int64(0), false
	for _, o := range strings.Split(opts, ",") {
		if m, ok := strings.CutPrefix(o, "min="); ok {
			n, err := strconv.ParseInt(m, 10, 64)
			if err != nil {
				panic("config: bad option " + o) // a mistake in a tag, found by any test
			}
			min, hasMin = n, true
		}
	}
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return func(dst reflect.Value, v string) error {
			d, err := time.ParseDuration(v)
			switch {
			case err != nil:
				return fmt.Errorf("must be a duration like 500ms or 2s, got %q", v)
			case hasMin && int64(d) < min && min > 0:
				return fmt.Errorf("must be positive, got %s", v)
			case hasMin && int64(d) < min:
				return fmt.Errorf("must not be negative, got %s", v)
			}
			dst.SetInt(int64(d))
			return nil
		}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		return func(dst reflect.Value, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case positive && (err != nil || n <= 0):
				return fmt.Errorf("must be a positive integer, got %q", v)
			case nonzero && (err != nil || n == 0):
				return fmt.Errorf("must be a non-zero integer, got %q", v)
			case hasMin && (err != nil || n < min):
				return fmt.Errorf("must be an integer of at least %d, got %q", min, v)
			case err != nil:
				return fmt.Errorf("must be an integer, got %q", v)
			}
			dst.SetInt(n)
			return nil
		}
	case t.Kind() == reflect.Bool:
		return func(dst reflect.Value, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("must be true or false, got %q", v)
			}
			dst.SetBool(b)
			return nil
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return func(dst reflect.Value, v string) error {
			var list []string
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					list = append(list, s)
				}
			}
			if len(list) == 0 {
				return errors.New("must list at least one value, comma separated")
			}
			dst.Set(reflect.ValueOf(list))
			return nil
		}
	case t.Kind() == reflect.String:
		return func(dst reflect.Value, v string) error { dst.SetString(v); return nil }
	}
	panic("config: no parser for a field of type " + t.String()) // a mistake in a tag, found by any test
}

// Bind completes the settings whose Set is nil, parsing into their Field by
// its type and Rule; it panics on a Field T lacks (found by any test).
func Bind[T any](settings []Setting[T]) []Setting[T] {
	for i := range settings {
		s := &settings[i]
		if s.Set != nil {
			continue
		}
		t, idx := reflect.TypeFor[T](), []int(nil)
		for _, name := range strings.Split(s.Field, ".") {
			f, ok := t.FieldByName(name)
			if !ok {
				panic(fmt.Sprintf("config: %s has no field %s", reflect.TypeFor[T](), s.Field))
			}
			idx, t = append(idx, f.Index...), f.Type
		}
		s.Set = setter[T](idx, parser(t, s.Rule))
	}
	return settings
}

func setter[T any](index []int, parse func(reflect.Value, string) error) func(*T, string) error {
	return func(c *T, v string) error { return parse(reflect.ValueOf(c).Elem().FieldByIndex(index), v) }
}

// Defaults returns v with each zero field set to its default tag, nested too.
func Defaults[T any](v T) T {
	setDefaults(reflect.ValueOf(&v).Elem())
	return v
}

func setDefaults(v reflect.Value) {
	for i := range v.NumField() {
		f, ft := v.Field(i), v.Type().Field(i)
		if !ft.IsExported() {
			continue
		}
		if def, ok := ft.Tag.Lookup("default"); ok && f.IsZero() {
			if err := parser(ft.Type, "")(f, def); err != nil {
				panic("config: default of " + ft.Name + ": " + err.Error()) // a mistake in a tag
			}
			continue
		}
		if ft.Type.Kind() == reflect.Struct {
			setDefaults(f)
		}
	}
}

// Format prints v, a Config struct, as %+v would, with strings quoted and
// secrets redacted; nested structs print through their String method.
func Format(v any) string {
	rv := reflect.ValueOf(v)
	var parts []string
	for i := range rv.NumField() {
		f, ft := rv.Field(i), rv.Type().Field(i)
		if !ft.IsExported() {
			continue
		}
		_, opts, _ := strings.Cut(ft.Tag.Get("env"), ",")
		var s string
		switch {
		case hasOpt(opts, "secret") && strings.Contains(f.String(), "://"):
			s = strconv.Quote(RedactURL(f.String()))
		case hasOpt(opts, "secret"):
			s = strconv.Quote(Redact(f.String()))
		case f.Kind() == reflect.String:
			s = strconv.Quote(f.String())
		case f.Kind() == reflect.Struct:
			s = Format(f.Interface())
			if str, ok := f.Interface().(fmt.Stringer); ok {
				s = str.String()
			}
		default:
			s = fmt.Sprint(f.Interface())
		}
		parts = append(parts, ft.Name+":"+s)
	}
	return "{" + strings.Join(parts, " ") + "}"
}
