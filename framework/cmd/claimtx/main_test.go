package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// envArgs holds the command line, as a JSON array, of the test binary
// run as claimtx.
const envArgs = "CLAIMTX_MAIN_TEST_ARGS"

// TestMain runs main itself when the test re-executes its binary.
func TestMain(m *testing.M) {
	if a := os.Getenv(envArgs); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			os.Exit(3) // the parent reports the status and output
		}
		os.Args = append([]string{"claimtx"}, args...)
		main()
	}
	os.Exit(m.Run())
}

// The claimtx binary resolves the built-in extractors only: a spec naming
// another is bad input (exit 2), named with the flag and the known ones.
func TestStockBinaryRefusesOwnExtractor(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "sample.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(`{"id": "a", "payload": "{}"}`+"\n"), 0o600))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	args, err := json.Marshal([]string{"keys", "check", "--key-spec", "tenant_idem:order_id", "--file", file})
	require.NoError(t, err)
	cmd.Env = append(os.Environ(), envArgs+"="+string(args))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 2, exit.ExitCode(), "%s", out)
	require.Equal(t, `claimtx: keys check: --key-spec "tenant_idem:order_id": config field "key": unknown key extractor "tenant_idem" in spec "tenant_idem:order_id" (known: first, json, metadata, template)
run `+"`claimtx keys check -h`"+` for its flags
`, string(out))
}
