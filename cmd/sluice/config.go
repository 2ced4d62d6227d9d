package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v3"
	"go.yaml.in/yaml/v3"
)

// applyConfigFile sets, from the YAML file at path, every flag of cmd that
// neither the command line nor the environment set: the file is the last
// of serve's three sources. The file is a mapping of flag names to values,
// e.g. `grpc-addr: 10.0.0.5:7070` or `join: [10.0.0.6:7946, 10.0.0.7:7946]`
// (a list is joined with commas). An unreadable file, a name that is not a
// flag of cmd, or a value the flag refuses is an error naming the file's
// line.
//
// (urfave/cli-altsrc would read such a file as a value source, but it
// ignores a file it cannot read or parse, and a node must not start on a
// config it did not read.)
func applyConfigFile(cmd *cli.Command, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // empty file
		}
		return fmt.Errorf("%s: %v", path, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return fmt.Errorf("%s:%d: a second YAML document (---): one file holds one", path, extra.Line)
	}
	if len(doc.Content) == 0 {
		return nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: want a mapping of flag names to values", path, root.Line)
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		name := k.Value
		if line, dup := seen[name]; dup {
			return fmt.Errorf("%s:%d: %s is given twice (also on line %d)", path, k.Line, name, line)
		}
		seen[name] = k.Line
		if name == "config" || !slices.ContainsFunc(cmd.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), name) }) {
			return fmt.Errorf("%s:%d: unknown setting %q (want a flag of %q, e.g. grpc-addr)", path, k.Line, name, cmd.Name)
		}
		var value string
		switch v.Kind {
		case yaml.ScalarNode:
			if v.Tag != "!!null" { // `http-addr: ~` or nothing: empty
				value = v.Value
			}
		case yaml.SequenceNode:
			parts := make([]string, 0, len(v.Content))
			for _, e := range v.Content {
				if e.Kind != yaml.ScalarNode {
					return fmt.Errorf("%s:%d: %s: want a list of values", path, e.Line, name)
				}
				parts = append(parts, e.Value)
			}
			value = strings.Join(parts, ",")
		default:
			return fmt.Errorf("%s:%d: %s: want a value or a list", path, v.Line, name)
		}
		if cmd.IsSet(name) {
			continue // the command line or the environment said it first
		}
		if err := cmd.Set(name, value); err != nil {
			return fmt.Errorf("%s:%d: %s: %v", path, v.Line, name, err)
		}
	}
	return nil
}
