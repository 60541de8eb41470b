package consumer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/internal/config"
)

// moduleRoot is the repository, from this package's directory.
const moduleRoot = "../.."

// notVariables are the ALL_CAPS words the documentation uses that are not
// configuration variables, so the check below does not take them for one.
var notVariables = map[string]string{
	// PostgreSQL's SQL keywords and isolation level, in the privileges,
	// partitioning and retention sections.
	"ALTER": "SQL", "ATTACH": "SQL", "CLUSTER": "SQL", "COMMIT": "SQL", "CONCURRENTLY": "SQL",
	"CREATE": "SQL", "DELETE": "SQL", "DROP": "SQL", "FINALIZE": "SQL", "GREATEST": "SQL",
	"INSERT": "SQL", "RETURNING": "SQL", "SELECT": "SQL", "SERIALIZABLE": "SQL", "TRUNCATE": "SQL",
	"UPDATE": "SQL", "USAGE": "SQL", "SAVEPOINT": "SQL", "RELEASE": "SQL",
	// Error codes of the brokers' protocols (RabbitMQ, Kafka), quoted from
	// the errors an operator sees.
	"ACCESS_REFUSED": "AMQP reply code", "FRAME_ERROR": "AMQP reply code",
	"SASL_AUTHENTICATION_FAILED": "Kafka error code", "MESSAGE_TOO_LARGE": "Kafka error code",
	// A SASL mechanism, the value of KAFKA_SASL_MECHANISM.
	"PLAIN": "SASL mechanism",
	// Words claimtx prints: column headers of the console and a stats line.
	"ATTEMPTS": "output", "WARNING": "output", "FAILURES": "output",
	// A placeholder: an extractor's name in a key spec, a consumer's in
	// --metrics NAME=URL.
	"NAME": "placeholder",
	// A user-registered kind's variables, named after the kind ("my-bus"):
	// the loader derives them from the kind (see brokers' Options), and
	// MY_BUS_REGOIN is the typo adapters.md shows it refusing.
	"MY_BUS_REGION": "registered kind", "MY_BUS_REGOIN": "registered kind",
}

// TestDocumentedVariablesExist: every environment variable and YAML key
// the documentation (docs/*.md, the READMEs) names is one something reads,
// so a reader never sets a name that is silently ignored (docs/design.md
// once named CLAIM_WAIT for CLAIM_MAX_CLAIM_WAIT); and every variable the
// loaders read is in docs/configuration.md's reference.
func TestDocumentedVariablesExist(t *testing.T) {
	loaders := loaderVariables()
	known := sourceVariables(t)
	for v := range loaders {
		known[v] = true
	}
	paths := map[string]bool{}
	for _, s := range settings {
		paths[s.Path] = true
	}
	for _, p := range yamlPaths(reflect.TypeFor[brokers.Config](), "") {
		paths[p], paths[brokerKey+"."+p] = true, true
	}
	envPath := map[string]string{} // variable -> its YAML path
	for _, s := range settings {
		envPath[s.Env] = s.Path
	}
	for _, s := range config.Settings[brokers.Config]() {
		envPath[s.Env] = s.Path
	}

	docs := documentation(t)
	require.NotEmpty(t, docs)
	for _, file := range docs {
		data, err := os.ReadFile(filepath.Join(moduleRoot, file))
		require.NoError(t, err)
		text := string(data)
		for _, v := range docVariables(text) {
			if _, ok := notVariables[v]; !known[v] && !ok {
				t.Errorf("%s names %s, which nothing reads (a typo, or a word to add to notVariables)", file, v)
			}
		}
		for _, m := range yamlKeyPattern.FindAllStringSubmatch(text, -1) {
			if p := m[1]; !paths[p] && !strings.HasSuffix(p, ".go") && !strings.HasPrefix(p, "options.") {
				t.Errorf("%s names the YAML key %s, which no loader reads", file, p)
			}
		}
		// "`claim.mode` / `CLAIM_MODE`" and "| `NATS_URL` (`url`) |": the
		// key and the variable are one setting.
		for _, m := range pathThenVar.FindAllStringSubmatch(text, -1) {
			if p, ok := envPath[m[2]]; ok && p != m[1] {
				t.Errorf("%s pairs %s with %s, whose key is %s", file, m[1], m[2], p)
			}
		}
		for _, m := range varThenKey.FindAllStringSubmatch(text, -1) {
			if p, ok := envPath[m[1]]; ok && p != m[2] && !strings.HasSuffix(p, "."+m[2]) {
				t.Errorf("%s pairs %s with %s, whose key is %s", file, m[1], m[2], p)
			}
		}
	}

	ref, err := os.ReadFile(filepath.Join(moduleRoot, "docs/configuration.md"))
	require.NoError(t, err)
	inRef := map[string]bool{}
	for _, v := range docVariables(string(ref)) {
		inRef[v] = true
	}
	for v, base := range loaders {
		if !inRef[v] && base {
			t.Errorf("docs/configuration.md does not list %s", v)
		}
	}
}

var (
	// capsWord is a word in capitals with an underscore, which only a
	// variable or a code is; capsSingle a capitals word without one
	// where a variable stands: alone in code quotes, before "=" or
	// after "$".
	capsWord   = regexp.MustCompile(`(?:^|[^A-Za-z0-9_.-])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:$|[^A-Za-z0-9_-])`)
	capsSingle = regexp.MustCompile("`([A-Z][A-Z0-9]+)`|(?:^|[^A-Za-z0-9_])([A-Z][A-Z0-9]+)=|\\$\\{?([A-Z][A-Z0-9_]+)")
	// yamlKeyPattern is a dotted YAML path in code quotes under a section
	// of a consumer's or a broker's file.
	yamlKeyPattern = regexp.MustCompile("`((?:broker\\.)?(?:amqp|kafka|nats|gochannel|options|claim|store|handler)\\.[a-z0-9_.]+)[`:]")
	// pathThenVar and varThenKey are a table's cells naming a setting
	// both ways.
	pathThenVar = regexp.MustCompile("`([a-z][a-z0-9_.]*)` / `([A-Z][A-Z0-9_]+)`")
	varThenKey  = regexp.MustCompile("\\| `([A-Z][A-Z0-9_]+)` \\(`([a-z][a-z0-9_.]*)`\\) \\|")
)

// docVariables returns the words of text that stand for variables, sorted,
// each once.
func docVariables(text string) []string {
	set := map[string]bool{}
	for _, m := range capsWord.FindAllStringSubmatch(text, -1) {
		set[m[1]] = true
	}
	for _, m := range capsSingle.FindAllStringSubmatch(text, -1) {
		set[m[1]+m[2]+m[3]] = true
	}
	return sortedKeys(set)
}

// documentation lists docs/*.md and the READMEs, relative to the module.
func documentation(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{"docs/*.md", "README.md", "examples/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(moduleRoot, pattern))
		require.NoError(t, err)
		for _, f := range m {
			rel, err := filepath.Rel(moduleRoot, f)
			require.NoError(t, err)
			out = append(out, rel)
		}
	}
	sort.Strings(out)
	return out
}

// loaderVariables are the variables brokers.LoadConfig and LoadConfig
// read, each true, and the _FILE variables of their secrets, false (one
// rule in the reference covers those).
func loaderVariables() map[string]bool {
	out := map[string]bool{}
	add := func(env string, secret bool) {
		out[env] = true
		if secret {
			out[env+config.FileSuffix] = false
		}
	}
	for _, s := range settings {
		add(s.Env, s.Secret)
	}
	for _, s := range config.Settings[brokers.Config]() {
		add(s.Env, s.Secret)
	}
	return out
}

// sourceVariables are the variables the module's programs, tests and
// Makefile read: the string literal passed to a function reading the
// environment (os.Getenv, LookupEnv, a getenv or envOr of its own), every
// capitals literal of a function that looks variables up from a table
// (loyalty's BATCH_SIZE and BATCH_WORKERS), and the Makefile's variables
// (CHAOS_FLAGS). Build tags are ignored: a benchmark's variables count.
func sourceVariables(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	caps := regexp.MustCompile(`^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$`)
	literal := func(e ast.Expr) (string, bool) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(lit.Value)
		return s, err == nil && caps.MatchString(s)
	}
	readsEnv := func(call *ast.CallExpr) bool {
		var name string
		switch f := call.Fun.(type) {
		case *ast.Ident:
			name = f.Name
		case *ast.SelectorExpr:
			name = f.Sel.Name
		}
		name = strings.ToLower(name)
		return strings.Contains(name, "env") && !strings.Contains(name, "setenv") && len(call.Args) > 0
	}
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			var table bool // reads a variable whose name is not a literal
			var lits []string
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					if readsEnv(n) {
						if s, ok := literal(n.Args[0]); ok {
							out[s] = true
						} else if _, isLit := n.Args[0].(*ast.BasicLit); !isLit {
							table = true
						}
					}
				case *ast.BasicLit:
					if s, ok := literal(n); ok {
						lits = append(lits, s)
					}
				}
				return true
			})
			if table {
				for _, s := range lits {
					out[s] = true
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	mk, err := os.ReadFile(filepath.Join(moduleRoot, "Makefile"))
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`(?m)^([A-Z][A-Z0-9_]*)\s*\??=`).FindAllStringSubmatch(string(mk), -1) {
		out[m[1]] = true
	}
	return out
}
