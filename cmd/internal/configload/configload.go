// Package configload reads a server's typed configuration once at start-up:
// defaults from the struct, then the YAML file, then GYMFLEET_* environment
// variables. Unknown keys fail start-up with their names. Only cmd/ uses
// viper; packages receive the typed struct.
package configload

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/spf13/viper"
)

// EnvPrefix prefixes every environment override: checkpoint.enabled is
// GYMFLEET_CHECKPOINT_ENABLED.
const EnvPrefix = "GYMFLEET"

// Flags are the command-line flags every server takes.
type Flags struct {
	// Config is the YAML file; empty means defaults and environment only.
	Config string
	// Listen overrides the listen address from the file.
	Listen string
	// AddrFile, when set, receives "<name> <addr>" lines once the servers
	// listen, so a launcher can start servers on port 0.
	AddrFile string
	// Version asks for the build's version instead of a run.
	Version bool
}

// ParseFlags parses args with the common flags. It returns flag.ErrHelp for -h.
func ParseFlags(name string, args []string, stderr io.Writer) (Flags, error) {
	var f Flags
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.Config, "config", "", "YAML configuration file")
	fs.StringVar(&f.Listen, "listen", "", "listen address host:port (overrides the file's listen; single-instance servers only)")
	fs.StringVar(&f.AddrFile, "addr-file", "", "write the bound address to this file once listening")
	fs.BoolVar(&f.Version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return f, nil
}

// Load fills cfg (a pointer to a struct with mapstructure tags, holding its
// defaults) from the file at path (optional) and the environment.
func Load(path string, getenv func(string) string, cfg any) error {
	v := viper.New()
	v.SetConfigType("yaml")
	keys := leafKeys(reflect.TypeOf(cfg).Elem(), "")
	fromEnv := map[string]string{} // key → the variable that set it
	// Every key gets a default and an environment binding: viper ignores
	// environment variables for keys it does not know (spf13/viper#761).
	defaults := reflect.ValueOf(cfg).Elem()
	for _, k := range keys {
		v.SetDefault(k.name, fieldByPath(defaults, k.path).Interface())
		env := envName(k.name)
		// Set outranks the file, so the environment wins over it.
		if val := getenv(env); val != "" {
			v.Set(k.name, val)
			fromEnv[k.name] = env
		}
	}
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		defer f.Close()
		if err := v.MergeConfig(f); err != nil {
			return fmt.Errorf("config %s: %w", filepath.Base(path), err)
		}
	}
	if err := v.UnmarshalExact(cfg); err != nil {
		if e := describeEnv(err, fromEnv, getenv); e != nil {
			return e
		}
		return fmt.Errorf("config %s: %w", path, describe(err))
	}
	return nil
}

// describeEnv names the environment variables whose values did not decode
// ("'<key>' cannot parse value ..." lines), so the error points at the
// variable rather than at a file that never held the value; nil when no
// failing key came from the environment.
func describeEnv(err error, fromEnv map[string]string, getenv func(string) string) error {
	var parts []string
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "'") {
			continue
		}
		end := strings.Index(line[1:], "'")
		if end < 0 {
			continue
		}
		key := line[1 : end+1]
		if env, ok := fromEnv[key]; ok {
			parts = append(parts, fmt.Sprintf("%s=%q (%s):%s", env, getenv(env), key, line[end+2:]))
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return errors.New("environment: " + strings.Join(parts, "; "))
}

// Misspelled lists the GYMFLEET_* variables of environ (KEY=VALUE lines)
// that are no setting of cfg but are within two edits of one: most likely
// a typo that would otherwise be ignored. Variables far from every setting
// (another server's, a test harness's) are left alone.
func Misspelled(environ []string, cfg any) []string {
	known := map[string]bool{}
	for _, k := range leafKeys(reflect.TypeOf(cfg).Elem(), "") {
		known[EnvPrefix+"_"+strings.ToUpper(strings.ReplaceAll(k.name, ".", "_"))] = true
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix+"_") || known[name] {
			continue
		}
		best, dist := "", 3
		for k := range known {
			// Capped at 3: a distance of 3 or more is "far" whatever it is.
			if d := editDistance(name, k, 3); d < dist || (d == dist && d < 3 && k < best) {
				best, dist = k, d
			}
		}
		if best != "" && dist <= 2 {
			out = append(out, fmt.Sprintf("%s is not a setting (did you mean %s?)", name, best))
		}
	}
	slices.Sort(out)
	return out
}

// editDistance is the Levenshtein distance of a and b, or limit when it
// is at least limit.
func editDistance(a, b string, limit int) int {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return limit
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}

// describe turns viper's "'<block>' has invalid keys: x, y" lines (one per
// block) into one "unknown keys: block.x, block.y" naming every key in full,
// and drops mapstructure's noise around them.
func describe(err error) error {
	const marker = "' has invalid keys: "
	var keys []string
	for _, line := range strings.Split(err.Error(), "\n") {
		i := strings.Index(line, marker)
		if i < 0 || !strings.HasPrefix(line, "'") {
			continue
		}
		block := line[1:i]
		for _, k := range strings.Split(line[i+len(marker):], ", ") {
			if block != "" {
				k = block + "." + k
			}
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return err
	}
	slices.Sort(keys)
	return errors.New("unknown keys: " + strings.Join(keys, ", "))
}

// EnvNames lists the environment variables Load reads for cfg (a pointer to
// a struct with mapstructure tags), sorted. A variable not among them is
// ignored by Load, so manifests check theirs against this list: a misspelt
// override would otherwise pass silently.
func EnvNames(cfg any) []string {
	var out []string
	for _, k := range leafKeys(reflect.TypeOf(cfg).Elem(), "") {
		out = append(out, envName(k.name))
	}
	slices.Sort(out)
	return out
}

func envName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

type leafKey struct {
	name string
	path []int
}

// leafKeys lists the dotted mapstructure keys of every non-struct field.
// Slices and maps are leaves: they come from the file.
func leafKeys(t reflect.Type, prefix string) []leafKey {
	var out []leafKey
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := strings.Split(f.Tag.Get("mapstructure"), ",")[0]
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		name := tag
		if prefix != "" {
			name = prefix + "." + tag
		}
		if f.Type.Kind() == reflect.Struct && f.Type.String() != "time.Time" {
			for _, k := range leafKeys(f.Type, name) {
				out = append(out, leafKey{name: k.name, path: append([]int{i}, k.path...)})
			}
			continue
		}
		out = append(out, leafKey{name: name, path: []int{i}})
	}
	return out
}

func fieldByPath(v reflect.Value, path []int) reflect.Value {
	for _, i := range path {
		v = v.Field(i)
	}
	return v
}
