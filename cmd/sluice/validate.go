package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v3"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limits"
	"github.com/sluicehq/sluice/rls"
)

// validateCommand checks a named limits file (serve --limits) or RLS rules
// (serve --rls-config: a rule file or a directory of them) as a node would
// load them, without starting one.
func validateCommand() *cli.Command {
	return &cli.Command{
		Name:      "validate",
		Usage:     "check a limits file or RLS rules (a file or a directory) before deploying it",
		ArgsUsage: "FILE",
		Description: "Loads FILE as a node would (serve --limits, or serve --rls-config for a rule file or a directory\n" +
			"of them). Which it is comes from its content (a top-level limits: key, or domain:; a directory is\n" +
			"RLS rules) unless --kind says. Exit status: 0 when valid, 2 when not: the message names the file,\n" +
			"the line and the field. RLS rules that put no rule in force (an empty directory, which serve\n" +
			"takes as every request OK) exit 2 unless --allow-empty says an empty set is intended; rule files\n" +
			"that give no rule, or sit in a subdirectory that is not read (envoyproxy/ratelimit's config/),\n" +
			"exit 2 always, naming them and the directory to pass, as serve refuses to start on them.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kind", Usage: "limits or rls (default: from the content)"},
			&cli.BoolFlag{Name: "rls-merge-domain-config", Usage: "RLS: let several rule files hold one domain, as serve --rls-merge-domain-config"},
			&cli.BoolFlag{Name: "allow-empty", Usage: "RLS: exit 0 for an empty rule directory (no rules: every Envoy request OK) instead of 2"},
		},
		Action: func(_ context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() != 1 {
				return usageError{errors.New("validate takes one FILE (a limits file, or an RLS rule file or directory)")}
			}
			path := cmd.Args().First()
			kind := cmd.String("kind")
			switch kind {
			case "", "limits", "rls":
			default:
				return usagef("kind", "want limits or rls, got %q", kind)
			}
			st, err := os.Stat(path)
			if err != nil {
				return usageError{err}
			}
			if kind == "" {
				if kind, err = kindOf(path, st.IsDir()); err != nil {
					return usageError{err}
				}
			}
			out := cmd.Root().Writer
			if kind == "rls" {
				return validateRLS(out, path, rls.LoadOptions{MergeDomains: cmd.Bool("rls-merge-domain-config")}, cmd.Bool("allow-empty"))
			}
			if st.IsDir() {
				return usageError{fmt.Errorf("%s: a directory; a limits file is one file (RLS rules may be a directory: --kind rls)", path)}
			}
			return validateLimits(out, path)
		},
	}
}

// kindOf tells a limits file from an RLS rule file by its top-level keys:
// limits: or domain:. A directory holds RLS rules.
func kindOf(path string, dir bool) (string, error) {
	if dir {
		return "rls", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("%s: %v (give --kind limits or --kind rls for the loader's own message)", path, err)
	}
	if len(doc.Content) > 0 && doc.Content[0].Kind == yaml.MappingNode {
		m := doc.Content[0].Content
		for i := 0; i+1 < len(m); i += 2 {
			switch m[i].Value {
			case "limits":
				return "limits", nil
			case "domain":
				return "rls", nil
			}
		}
	}
	return "", fmt.Errorf("%s: neither a limits file (a top-level limits: key) nor an RLS rule file (domain:): give --kind limits or --kind rls", path)
}

// validateLimits loads a limits file as serve --limits does, and refuses
// one without a limits: key as a node's reload does.
func validateLimits(w io.Writer, path string) error {
	set, err := limits.Load(path)
	if err != nil {
		return usageError{err}
	}
	if k, _ := kindOf(path, false); k != "limits" {
		// Parse takes an empty file as no limits, but a running node
		// refuses it on a reload (an empty or half-written file).
		return usageError{fmt.Errorf("%s: no limits: key (an empty file is refused on a reload); write `limits: {}` for none", path)}
	}
	names := set.Names()
	fmt.Fprintf(w, "%s: a valid limits file: %d limits", path, len(names))
	if len(names) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(names, ", "))
	}
	fmt.Fprintln(w)
	return nil
}

// validateRLS loads RLS rules as serve --rls-config does, and refuses
// rules that put none in force (a node would answer every request OK)
// unless allowEmpty.
func validateRLS(w io.Writer, path string, opts rls.LoadOptions, allowEmpty bool) error {
	cfg, err := opts.Load(path)
	if err != nil {
		return usageError{err}
	}
	if len(cfg.Rules()) == 0 && !allowEmpty {
		return usageError{fmt.Errorf("%s: no RLS rules: no rule file in it or below it, so a node would answer every Envoy request OK; give --allow-empty if an empty set is intended", path)}
	}
	fmt.Fprintf(w, "%s: valid RLS rules: %d rules in %d domains", path, len(cfg.Rules()), len(cfg.Domains()))
	if ds := cfg.Domains(); len(ds) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(ds, ", "))
	}
	fmt.Fprintf(w, ", %d files\n", len(cfg.Files()))
	return nil
}
