package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
)

// probeVerdict is what a probe of one node found.
type probeVerdict int

const (
	probeOK          probeVerdict = iota // the node answered with the proxy's credentials
	probeUnreachable                     // no answer: connection refused, timeout, node down
	probeRefused                         // the node's security cannot be met: TLS, certificates, token
)

// probeResult is a probe of the whole cluster: per node, then summed up.
type probeResult struct {
	ok          int
	refused     []error  // a usageError naming the flag, per node that refused
	unreachable []string // "ADDR: why", per node out of reach
	notes       []string // answered, with something to say (an unconfigured limit name)
}

// verdict is the cluster's: ok when a node answered, else refused when a
// node refused the proxy's credentials, else unreachable.
func (r probeResult) verdict() probeVerdict {
	switch {
	case r.ok > 0:
		return probeOK
	case len(r.refused) > 0:
		return probeRefused
	}
	return probeUnreachable
}

// reason says why the cluster is not ready ("" when it is).
func (r probeResult) reason() string {
	switch r.verdict() {
	case probeRefused:
		return "the cluster refuses the proxy's credentials: " + r.refused[0].Error()
	case probeUnreachable:
		return "no node of --cluster answered: " + strings.Join(r.unreachable, "; ")
	}
	return ""
}

// probeCluster probes every node of c (client.Probe: Members, and with a
// token a peek of each of names, so that a token that may not check a
// rule's limit is found) and classifies each answer by classifyProbe.
func probeCluster(ctx context.Context, c *client.Client, addrs []string, auth clientAuth, names []string) probeResult {
	if auth.token == "" {
		names = nil // only tokens are limited to names
	}
	var r probeResult
	for i, err := range c.Probe(ctx, names...) {
		v, msg := classifyProbe(addrs[i], err, auth)
		if v == probeUnreachable && connected(err) {
			// A refusal can look like a broken connection (see
			// secondLook): look again before calling it unreachable.
			if e := secondLook(ctx, addrs[i], auth); e != nil {
				v, msg = classifyProbe(addrs[i], status.Error(codes.Unavailable, e.Error()), auth)
			}
		}
		switch v {
		case probeOK:
			r.ok++
			if msg != nil {
				r.notes = append(r.notes, msg.Error())
			}
		case probeRefused:
			r.refused = append(r.refused, msg)
		default:
			r.unreachable = append(r.unreachable, msg.Error())
		}
	}
	return r
}

// classifyProbe sorts the probe error err of the node at addr (nil: it
// answered) and says why in terms of the flags of auth: probeRefused with
// a usageError naming the flag (and its file) that cannot meet the node's
// security; probeUnreachable with an error saying why; probeOK with nil,
// or a note for a node that answered but refused a peek as invalid.
func classifyProbe(addr string, err error, auth clientAuth) (probeVerdict, error) {
	if err == nil {
		return probeOK, nil
	}
	st := status.Convert(err)
	msg := st.Message()
	// refused names setting: a flag ("tls-ca": --tls-ca) or SLUICE_TOKEN.
	refused := func(setting, format string, a ...any) (probeVerdict, error) {
		if !strings.HasPrefix(setting, "SLUICE_") {
			setting = "--" + setting
		}
		return probeRefused, usageError{fmt.Errorf("invalid %s: node %s: %s", setting, addr, fmt.Sprintf(format, a...))}
	}
	switch st.Code() {
	case codes.OK:
		return probeOK, nil
	case codes.Unimplemented:
		// A gRPC server that speaks with these credentials but has no
		// Members: the security is met; its checks will tell the rest.
		return probeOK, nil
	case codes.InvalidArgument:
		return probeOK, fmt.Errorf("node %s answered, but: %s", addr, msg)
	case codes.Unauthenticated:
		switch {
		case auth.token != "":
			return refused(tokenFlag(auth), "refused the token of %s: %s", auth.tokenFrom, msg)
		case auth.cert != "":
			return refused("token-file", "refused the client certificate %s: %s (the node wants a token: give --token-file)", auth.cert, msg)
		}
		return refused("tls-cert", "demands client authentication: %s (give --tls-cert and --tls-key, or --token-file)", msg)
	case codes.PermissionDenied:
		if auth.token != "" {
			return refused(tokenFlag(auth), "the token of %s may not check a rule's limit: %s", auth.tokenFrom, msg)
		}
		return refused("tls-cert", "refused the proxy's calls: %s", msg)
	}
	switch {
	case strings.Contains(msg, "per-RPC creds failed"), strings.Contains(msg, "not sending a token"):
		return refused("tls-ca", "%s (a token goes over TLS only, or to loopback: give --tls-ca)", msg)
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return refused("tls-ca", "does not serve TLS (%s): leave out --tls-ca %s, or give the node a certificate", msg, auth.ca)
	case strings.Contains(msg, "x509:"), strings.Contains(msg, "failed to verify certificate"):
		return refused("tls-ca", "its certificate does not verify against --tls-ca %s for the address %s: %s", auth.ca, addr, msg)
	case strings.Contains(msg, "tls: certificate required"), strings.Contains(msg, "tls: bad certificate"),
		strings.Contains(msg, "tls: unknown certificate authority"), strings.Contains(msg, "tls: certificate expired"),
		strings.Contains(msg, "tls: handshake failure") && auth.cert != "":
		if auth.cert == "" {
			return refused("tls-cert", "demands a client certificate (%s): give --tls-cert and --tls-key", msg)
		}
		return refused("tls-cert", "refused the client certificate %s (%s)%s", auth.cert, msg, certHint(auth))
	case strings.Contains(msg, "remote error: tls:"), strings.Contains(msg, "authentication handshake failed"):
		flag := "tls-ca"
		if auth.cert != "" {
			flag = "tls-cert"
		}
		return refused(flag, "the TLS handshake failed: %s", msg)
	case auth.ca == "" && strings.Contains(msg, "error reading server preface"):
		// A plaintext call to a TLS port: the node hangs up on it.
		return refused("tls-ca", "hung up on a plaintext call (%s): does it serve TLS? give --tls-ca, and --tls-cert and --tls-key for mutual TLS", msg)
	}
	return probeUnreachable, fmt.Errorf("%s: %s: %s", addr, st.Code(), msg)
}

// connected reports whether the probe error err came after a connection
// was made: not a failure to dial (connection refused, no route) and not
// a timeout, which say the node is out of reach.
func connected(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.Unavailable && !strings.Contains(st.Message(), "Error while dialing")
}

// secondLookWait bounds secondLook's wait for the node's first bytes.
const secondLookWait = 2 * time.Second

// secondLook connects to addr again, below gRPC, to tell a refusal of the
// proxy's security from a connection broken for another reason: with TLS
// 1.3 a node that refuses the client certificate does so after the
// client's handshake is done, and gRPC may see its first write fail
// (broken pipe, reset) before it reads the node's alert. With auth's TLS
// it completes a handshake and waits for the node's first bytes without
// writing (a gRPC server speaks first, its SETTINGS; a refusing one sends
// its alert): it returns the handshake's or the alert's error. Without
// TLS it tries a TLS handshake: it returns an error saying so when the
// node completes it (it serves TLS). It returns nil when it learns
// nothing of the security (the node is down, or answers).
func secondLook(ctx context.Context, addr string, auth clientAuth) error {
	ctx, cancel := context.WithTimeout(ctx, secondLookWait)
	defer cancel()
	if auth.ca == "" {
		d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}} //nolint:gosec // only to learn whether the node speaks TLS
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil
		}
		conn.Close()
		return errors.New("error reading server preface: the node completed a TLS handshake")
	}
	cfg, err := client.TLSConfig(auth.ca, auth.cert, auth.key)
	if err != nil {
		return nil // dialOptions loaded them already
	}
	cfg.NextProtos = []string{"h2"}
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
	if err != nil {
		if isTLSError(err) {
			return fmt.Errorf("transport: authentication handshake failed: %w", err)
		}
		return nil
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	if _, err := conn.Read(make([]byte, 1)); err != nil && isTLSError(err) {
		return fmt.Errorf("error reading server preface: %w", err)
	}
	return nil
}

// isTLSError reports whether err is the TLS layer's: an alert from the
// node, or a certificate that does not verify.
func isTLSError(err error) bool {
	var ae tls.AlertError
	var ve *tls.CertificateVerificationError
	var re tls.RecordHeaderError
	return errors.As(err, &ae) || errors.As(err, &ve) || errors.As(err, &re) || strings.Contains(err.Error(), "tls:")
}

// tokenFlag is the setting to name for the token of auth: token-file
// (the flag), or the environment variable SLUICE_TOKEN.
func tokenFlag(auth clientAuth) string {
	if strings.HasPrefix(auth.tokenFrom, "--token-file") {
		return "token-file"
	}
	return auth.tokenFrom
}

// certHint says whether the client certificate of auth is signed by the
// CA of --tls-ca (a node's CA signs its clients' certificates as well as
// its own, when it is sluice's development CA): "" when it is, or when
// that cannot be read.
func certHint(auth clientAuth) string {
	pair, err := tls.LoadX509KeyPair(auth.cert, auth.key)
	if err != nil || len(pair.Certificate) == 0 {
		return ""
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return ""
	}
	b, err := os.ReadFile(auth.ca)
	if err != nil {
		return ""
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return ""
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err == nil {
		return ""
	}
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		return fmt.Sprintf(": it is not signed by the CA of --tls-ca %s; the node takes client certificates from its own CA only", auth.ca)
	}
	return fmt.Sprintf(": it does not verify against --tls-ca %s: %v", auth.ca, err)
}
