package rpc

import (
	"context"

	"github.com/sluicehq/sluice/rpc/internal/security"
	"github.com/sluicehq/sluice/rpc/sluicev1"
)

// ClientAuth is how a node authenticates the callers of its public API
// (Check, Members, Envoy's RLS, reflection; gRPC and HTTP): one of the
// ClientAuth constants, "" for the default (see NodeConfig.ClientAuth).
type ClientAuth = security.ClientAuth

// The client authentication modes.
const (
	// ClientAuthNone authenticates nobody: the default without TLS and
	// without a token file (loopback, or --insecure).
	ClientAuthNone = security.ClientAuthNone
	// ClientAuthMTLS requires a client certificate signed by the CA (the
	// default with TLS).
	ClientAuthMTLS = security.ClientAuthMTLS
	// ClientAuthToken requires a bearer token from the token file (the
	// default without TLS but with a token file: loopback only).
	ClientAuthToken = security.ClientAuthToken
	// ClientAuthEither takes a client certificate or a token.
	ClientAuthEither = security.ClientAuthEither
)

// Token is one bearer token of a token file and the limit names it may
// check: a name is covered when it starts with one of Prefixes ("*"
// covers every name). Its fields: Name (a label for logs), Token (the
// secret) and Prefixes.
type Token = security.Token

// ParseTokens reads a token file: YAML (`tokens: [{name, token,
// prefixes: [...]}]`) when it starts with `tokens:`, else one token a
// line, `TOKEN PREFIX [PREFIX...]` separated by spaces ('#' starts a
// comment). Each token needs at least one prefix ("*" for all) and must be
// at least 16 bytes. Errors name the file and line. See
// security.ParseTokens.
func ParseTokens(file string, data []byte) ([]Token, error) { return security.ParseTokens(file, data) }

// gatewayServer is the Server as the HTTP gateway calls it: Check checks
// the token's prefixes (the authenticator's HTTP handler put the caller
// in the context).
type gatewayServer struct {
	*Server
	auth *security.Authenticator
}

// Check authorizes the checks' names for the caller's token, then checks.
func (g gatewayServer) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	if err := g.auth.AuthorizeGatewayCheck(ctx, req); err != nil {
		return nil, err
	}
	return g.Server.Check(ctx, req)
}
