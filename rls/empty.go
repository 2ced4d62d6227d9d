package rls

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Bounds of the look below a rule directory for rule files it does not
// read (see [LoadOptions.Load]).
const (
	// maxScanDepth is how many directory levels below the rule
	// directory are looked at (envoyproxy/ratelimit's runtime root is 2:
	// root/subdirectory/config/*.yaml).
	maxScanDepth = 6
	// maxScanEntries is how many directory entries are looked at, in all.
	maxScanEntries = 10000
	// maxNamed is how many files an error names; it counts the others.
	maxNamed = 10
)

// peerAppDirectory is the directory of rule files envoyproxy/ratelimit
// reads below its RUNTIME_ROOT/RUNTIME_SUBDIRECTORY (RUNTIME_APPDIRECTORY's
// default).
const peerAppDirectory = "config"

// checkNotEmpty returns the *ConfigError of a load of path that gave cfg
// when it would switch every limit off unnoticed, or read other files than
// envoyproxy/ratelimit would (see [LoadOptions.Load]); nil otherwise.
func checkNotEmpty(path string, cfg *Config) error {
	st, err := os.Stat(path)
	if err != nil {
		return &ConfigError{File: path, Msg: errMsg(err)}
	}
	if !st.IsDir() {
		if len(cfg.rules) == 0 {
			return &ConfigError{File: path, Msg: "no rules: the file gives no rate_limit, so every request would be OK (give a descriptor a rate_limit; for no limits at all give --rls-config an empty directory)"}
		}
		return nil
	}
	unread := rulesBelow(path)
	if len(cfg.rules) > 0 {
		var inConfig []string
		for _, f := range unread {
			if filepath.Dir(f) == peerAppDirectory {
				inConfig = append(inConfig, f)
			}
		}
		if len(inConfig) == 0 {
			return nil
		}
		return &ConfigError{File: path, Msg: fmt.Sprintf("its %s/ directory holds %s that %s not read (%s): this is envoyproxy/ratelimit's layout, which reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/%s/*.yaml and not the files beside %s/; pass --rls-config %s (or move %s/ out of %s)",
			peerAppDirectory, plural(len(inConfig), "rule file"), isAre(len(inConfig)), named(path, inConfig), peerAppDirectory, peerAppDirectory,
			filepath.Join(path, peerAppDirectory), peerAppDirectory, path)}
	}
	switch {
	case len(unread) > 0:
		return &ConfigError{File: path, Msg: fmt.Sprintf("no rules: %s below it %s not read (%s; --rls-config reads the *.yaml and *.yml files directly in its directory, not in subdirectories), so every request would be OK; %s",
			plural(len(unread), "rule file"), isAre(len(unread)), named(path, unread), suggest(path, unread))}
	case len(cfg.files) > 0:
		return &ConfigError{File: path, Msg: fmt.Sprintf("no rules: its %s give%s no rate_limit (%s), so every request would be OK (give a descriptor a rate_limit; for no limits at all leave the directory empty)",
			plural(len(cfg.files), "rule file"), sIf(len(cfg.files) == 1), named(path, relAll(path, cfg.files)))}
	}
	return nil // an empty directory: rules may come while the node runs
}

// rulesBelow returns the rule files (IsRuleFile names) in the
// subdirectories of dir, as paths relative to dir, sorted: up to
// maxScanDepth levels down and maxScanEntries entries looked at.
// Directories whose names start with "." are skipped (a Kubernetes
// ConfigMap volume's ..data, and envoyproxy/ratelimit's
// RUNTIME_IGNOREDOTFILES); symbolic links are followed (a runtime root's
// "current" is often one), the depth bounding any loop.
func rulesBelow(dir string) []string {
	var out []string
	budget := maxScanEntries
	var walk func(rel string, depth int)
	walk = func(rel string, depth int) {
		entries, err := os.ReadDir(filepath.Join(dir, rel))
		if err != nil {
			return
		}
		for _, e := range entries {
			if budget--; budget < 0 {
				return
			}
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			r := filepath.Join(rel, name)
			fi, err := os.Stat(filepath.Join(dir, r)) // follows symlinks
			if err != nil {
				continue
			}
			switch {
			case fi.IsDir() && depth < maxScanDepth:
				walk(r, depth+1)
			case !fi.IsDir() && rel != "" && IsRuleFile(name):
				out = append(out, r)
			}
		}
	}
	walk("", 0)
	sort.Strings(out)
	return out
}

// suggest says which directory to pass for the rule files rel (relative
// to root, in subdirectories): the one config/ directory among theirs
// (envoyproxy/ratelimit's layout), or the one directory that holds them.
func suggest(root string, rel []string) string {
	var dirs, configs []string
	seen := map[string]bool{}
	for _, f := range rel {
		d := filepath.Dir(f)
		if seen[d] {
			continue
		}
		seen[d] = true
		dirs = append(dirs, d)
		if filepath.Base(d) == peerAppDirectory {
			configs = append(configs, d)
		}
	}
	join := func(ds []string) string {
		out := make([]string, len(ds))
		for i, d := range ds {
			out[i] = filepath.Join(root, d)
		}
		return strings.Join(out, " or ")
	}
	peer := "envoyproxy/ratelimit reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/" + peerAppDirectory + "/*.yaml: "
	switch {
	case len(configs) == 1:
		return peer + "pass --rls-config " + join(configs)
	case len(configs) > 1:
		return peer + "pass the " + peerAppDirectory + "/ directory of the peer's RUNTIME_SUBDIRECTORY as --rls-config: " + join(configs)
	case len(dirs) == 1:
		return "pass --rls-config " + join(dirs) + " to read them"
	}
	return "pass the directory of the rules to read as --rls-config: " + join(dirs)
}

// named lists the files rel (relative to root) as paths under root: the
// first maxNamed, then how many more.
func named(root string, rel []string) string {
	n := min(len(rel), maxNamed)
	out := make([]string, 0, n+1)
	for _, f := range rel[:n] {
		out = append(out, filepath.Join(root, f))
	}
	if len(rel) > n {
		out = append(out, fmt.Sprintf("and %d more", len(rel)-n))
	}
	return strings.Join(out, ", ")
}

// relAll returns files relative to root (unchanged when they are not
// below it).
func relAll(root string, files []string) []string {
	out := make([]string, len(files))
	for i, f := range files {
		if r, err := filepath.Rel(root, f); err == nil && !strings.HasPrefix(r, "..") {
			out[i] = r
		} else {
			out[i] = f
		}
	}
	return out
}

// plural returns "1 thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// isAre returns "is" for 1, else "are".
func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// sIf returns "s" when b: the verb of a singular subject.
func sIf(b bool) string {
	if b {
		return "s"
	}
	return ""
}
