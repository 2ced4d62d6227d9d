package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/certs"
)

// tlsCommand makes development certificates: a CA, and peer and client
// certificates signed by it (internal/certs).
func tlsCommand() *cli.Command {
	return &cli.Command{
		Name:  "tls",
		Usage: "make development certificates: tls ca create, tls cert create (--peer, --client or --admin)",
		Commands: []*cli.Command{
			{
				Name:  "ca",
				Usage: "certificate authorities",
				Commands: []*cli.Command{{
					Name:  "create",
					Usage: "write a new CA to --out: ca.pem (certificate) and ca-key.pem (key, mode 0600); never overwrites",
					Flags: []cli.Flag{
						&cli.StringFlag{Name: "out", Usage: "directory to write to (created if missing)"},
						&cli.DurationFlag{Name: "validity", Value: 365 * 24 * time.Hour, Usage: "how long the CA is valid"},
						&cli.StringFlag{Name: "common-name", Value: "sluice development CA", Usage: "the CA's subject common name"},
					},
					Action: func(_ context.Context, cmd *cli.Command) error {
						if err := noArgs(cmd); err != nil {
							return err
						}
						out := cmd.String("out")
						if out == "" {
							return usagef("out", "required (a directory)")
						}
						if cmd.Duration("validity") <= 0 {
							return usagef("validity", "must be > 0, got %s", cmd.Duration("validity"))
						}
						c, k, err := certs.NewCA(cmd.String("common-name"), cmd.Duration("validity"))
						if err != nil {
							return err
						}
						return writePair(cmd, out, "ca", c, k)
					},
				}},
			},
			{
				Name:  "cert",
				Usage: "peer, client and admin certificates",
				Commands: []*cli.Command{{
					Name: "create",
					Usage: "write NAME.pem and NAME-key.pem (mode 0600) to --out, signed by the CA in --ca: " +
						"a node's certificate (--peer NAME, URI SAN spiffe://sluice/peer/NAME), a client's (--client NAME) " +
						"or an operator's for the admin API (--admin NAME, spiffe://sluice/admin/NAME: it may also check)",
					Flags: []cli.Flag{
						&cli.StringFlag{Name: "ca", Usage: "directory holding ca.pem and ca-key.pem (tls ca create)"},
						&cli.StringFlag{Name: "peer", Usage: "member name of the node (its serve --name)"},
						&cli.StringFlag{Name: "client", Usage: "name of the client"},
						&cli.StringFlag{Name: "admin", Usage: "name of the operator: a client certificate the admin API takes (sluice key get/reset, sluice limits show)"},
						&cli.StringSliceFlag{Name: "host", Usage: "DNS name or IP clients and peers dial this node at (repeat, or comma-separated)"},
						&cli.StringFlag{Name: "out", Usage: "directory to write to (created if missing)"},
						&cli.DurationFlag{Name: "validity", Value: 90 * 24 * time.Hour, Usage: "how long the certificate is valid"},
					},
					Action: func(_ context.Context, cmd *cli.Command) error {
						if err := noArgs(cmd); err != nil {
							return err
						}
						var kind certs.Kind
						var name string
						for _, k := range []certs.Kind{certs.Peer, certs.Client, certs.Admin} {
							if n := cmd.String(string(k)); n != "" {
								if name != "" {
									return usagef(string(k), "give one of --peer, --client or --admin")
								}
								kind, name = k, n
							}
						}
						if name == "" {
							return usagef("peer", "give --peer NAME (a node), --client NAME or --admin NAME (an operator)")
						}
						for _, f := range []string{"ca", "out"} {
							if cmd.String(f) == "" {
								return usagef(f, "required (a directory)")
							}
						}
						if cmd.Duration("validity") <= 0 {
							return usagef("validity", "must be > 0, got %s", cmd.Duration("validity"))
						}
						caCert, err := os.ReadFile(filepath.Join(cmd.String("ca"), "ca.pem"))
						if err != nil {
							return usagef("ca", "%v", err)
						}
						caKey, err := os.ReadFile(filepath.Join(cmd.String("ca"), "ca-key.pem"))
						if err != nil {
							return usagef("ca", "%v", err)
						}
						var hosts []string
						for _, h := range cmd.StringSlice("host") {
							hosts = append(hosts, splitList(h)...)
						}
						c, k, err := certs.Issue(caCert, caKey, kind, name, hosts, cmd.Duration("validity"))
						if err != nil {
							flag := string(kind)
							if errors.Is(err, certs.ErrBadCA) {
								flag = "ca"
							}
							return usagef(flag, "%v", err)
						}
						return writePair(cmd, cmd.String("out"), name, c, k)
					},
				}},
			},
		},
	}
}

// writePair writes BASE.pem (0644) and BASE-key.pem (0600) to dir,
// creating dir (0700) if missing; it refuses to overwrite either file.
func writePair(cmd *cli.Command, dir, base string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return usagef("out", "%v", err)
	}
	certFile, keyFile := filepath.Join(dir, base+".pem"), filepath.Join(dir, base+"-key.pem")
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Lstat(f); err == nil {
			return usagef("out", "%s exists; not overwriting it", f)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return usagef("out", "%v", err)
		}
	}
	if err := writeNew(keyFile, keyPEM, 0o600); err != nil {
		return usagef("out", "%v", err)
	}
	if err := writeNew(certFile, certPEM, 0o644); err != nil {
		_ = os.Remove(keyFile)
		return usagef("out", "%v", err)
	}
	fmt.Fprintf(cmd.Root().Writer, "wrote %s\nwrote %s\n", certFile, keyFile)
	return nil
}

// writeNew creates path (failing if it exists) with mode and writes b.
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// clientAuthFlags are the flags of a client command that talks to a
// secured node.
func clientAuthFlags(e env) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "tls-ca", Usage: "PEM CA bundle that signs the nodes' certificates: connect with TLS (the address must be in the node's certificate)", Sources: e.of("tls-ca")},
		&cli.StringFlag{Name: "tls-cert", Usage: "PEM client certificate to present (mTLS; with --tls-key)", Sources: e.of("tls-cert")},
		&cli.StringFlag{Name: "tls-key", Usage: "PEM key of --tls-cert", Sources: e.of("tls-key")},
		&cli.StringFlag{Name: "token-file", Usage: "file whose first line is a bearer token to send (serve --token-file); SLUICE_TOKEN gives the token itself. Sent over TLS, or in plaintext to loopback only", Sources: e.of("token-file")},
		// SLUICE_TOKEN only: a token on the command line shows in ps.
		&cli.StringFlag{Name: "token", Hidden: true, Sources: e.of("token")},
	}
}

// clientAuth is what a client command's auth flags ask for: the files as
// given (empty when not given) and the token, with where it came from.
type clientAuth struct {
	ca, cert, key string
	token         string
	tokenFrom     string // "--token-file FILE" or "SLUICE_TOKEN"; empty: no token
}

// clientAuthOf reads cmd's client auth flags (clientAuthFlags): it reads
// the token file and checks that the flags go together, not the TLS
// files (dialOptions loads them). The error is a usageError naming the
// flag.
func clientAuthOf(cmd *cli.Command) (clientAuth, error) {
	a := clientAuth{ca: cmd.String("tls-ca"), cert: cmd.String("tls-cert"), key: cmd.String("tls-key")}
	if a.ca == "" && (a.cert != "" || a.key != "") {
		return a, usagef("tls-ca", "required with --tls-cert and --tls-key")
	}
	if f := cmd.String("token-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return a, usagef("token-file", "%v", err)
		}
		a.token, _, _ = strings.Cut(strings.TrimSpace(string(b)), "\n")
		if a.token = strings.TrimSpace(a.token); a.token == "" {
			return a, usagef("token-file", "%s: empty", f)
		}
		a.tokenFrom = "--token-file " + f
	} else if a.token = strings.TrimSpace(cmd.String("token")); a.token != "" {
		a.tokenFrom = EnvName("token")
	}
	return a, nil
}

// dialOptions returns the transport (and token) options of a: plaintext
// without a CA. The error is a usageError naming the flag and the file
// that cannot be read or used: --tls-ca for the CA, --tls-cert for the
// certificate and its key (not a pair, not PEM).
func (a clientAuth) dialOptions() ([]grpc.DialOption, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if a.ca != "" {
		if _, err := client.TLSConfig(a.ca, "", ""); err != nil {
			return nil, usagef("tls-ca", "%v", err)
		}
		if (a.cert == "") != (a.key == "") {
			return nil, usagef("tls-cert", "give --tls-cert and --tls-key together, or neither")
		}
		o, err := client.TLS(a.ca, a.cert, a.key)
		if err != nil {
			return nil, usagef("tls-cert", "%s with the key %s (--tls-key): %v", a.cert, a.key, err)
		}
		opts[0] = o
	}
	if a.token != "" {
		opts = append(opts, client.Token(a.token))
	}
	return opts, nil
}

// dialOptions returns the transport (and token) options of cmd's client
// auth flags: plaintext without --tls-ca.
func dialOptions(cmd *cli.Command) ([]grpc.DialOption, error) {
	a, err := clientAuthOf(cmd)
	if err != nil {
		return nil, err
	}
	return a.dialOptions()
}
